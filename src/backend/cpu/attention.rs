//! Causal attention over the paged / ring KV cache, one (token, head) per
//! task: keys before the step come from the cache, the step's own keys from
//! its k/v rows, rounded first to the cache's precision so that a chunked
//! prefill sees exactly what a one-token decode sees. Online softmax in f32;
//! optional per-head sink logits (gpt_oss) join the denominator.

use rayon::prelude::*;

use super::BackendError;
use super::kernels::ops;
use super::kv::{CpuKvCache, KvData, LayerStore};
use crate::backend::AttentionShape;
use crate::checkpoint::linear::VectorWeight;
use crate::engine::batch::StepBatch;

/// Largest head dimension the stack buffers hold.
const MAX_HEAD_DIM: usize = 512;

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    q: &[f32],
    k: &mut [f32],
    v: &mut [f32],
    kv: &CpuKvCache,
    layer: usize,
    batch: &StepBatch,
    shape: &AttentionShape,
    sinks: Option<&VectorWeight<'_>>,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let (heads, kv_heads, hd) = (shape.heads, shape.kv_heads, shape.head_dim);
    if hd > MAX_HEAD_DIM || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(BackendError::Shape(format!(
            "unsupported attention shape: {heads} heads, {kv_heads} KV heads, head_dim {hd}"
        )));
    }
    let rows = batch.rows();
    let (q_width, kv_width) = (heads * hd, kv_heads * hd);
    if q.len() < rows * q_width
        || out.len() < rows * q_width
        || k.len() < rows * kv_width
        || v.len() < rows * kv_width
    {
        return Err(BackendError::Shape(
            "attention buffers too small".to_string(),
        ));
    }
    let store = kv
        .layers
        .get(layer)
        .ok_or_else(|| BackendError::Shape(format!("no KV layer {layer}")))?;
    let (k_cache, v_cache) = match store {
        LayerStore::Paged { k, v } | LayerStore::Ring { k, v, .. } => (k, v),
    };
    kv.round_in_place(&mut k[..rows * kv_width]);
    kv.round_in_place(&mut v[..rows * kv_width]);
    let (k, v) = (&*k, &*v);
    let group = heads / kv_heads;

    out[..rows * q_width]
        .par_chunks_mut(hd)
        .enumerate()
        .for_each(|(task, o)| {
            let (row, head) = (task / heads, task % heads);
            let s = batch.seqs.partition_point(|c| c.start as usize <= row) - 1;
            let chunk = &batch.seqs[s];
            let past = chunk.past as usize;
            let position = past + (row - chunk.start as usize);
            let first = shape.window.map_or(0, |w| (position + 1).saturating_sub(w));
            let offset = (head / group) * hd;
            let qv = &q[row * q_width + head * hd..][..hd];

            let mut max = f32::NEG_INFINITY;
            let mut denom = 0.0f32;
            o.fill(0.0);
            let mut key_buf = [0.0f32; MAX_HEAD_DIM];
            let mut value_buf = [0.0f32; MAX_HEAD_DIM];
            for j in first..=position {
                let (key, value): (&[f32], &[f32]) = if j < past {
                    let at = kv.slot(layer, batch, s, j) * kv_width + offset;
                    (
                        cache_row(k_cache, at, &mut key_buf[..hd]),
                        cache_row(v_cache, at, &mut value_buf[..hd]),
                    )
                } else {
                    let at = (chunk.start as usize + (j - past)) * kv_width + offset;
                    (&k[at..at + hd], &v[at..at + hd])
                };
                let score = shape.scale * ops::dot(qv, key);
                if score > max {
                    // Rescale what was summed under the old maximum.
                    let correction = (max - score).exp();
                    denom *= correction;
                    o.iter_mut().for_each(|a| *a *= correction);
                    max = score;
                }
                let weight = (score - max).exp();
                denom += weight;
                ops::axpy(weight, value, o);
            }
            if let Some(sinks) = sinks {
                let sink = sinks.get(head);
                if sink > max {
                    let correction = (max - sink).exp();
                    denom *= correction;
                    o.iter_mut().for_each(|a| *a *= correction);
                    max = sink;
                }
                denom += (sink - max).exp();
            }
            let inv = 1.0 / denom;
            o.iter_mut().for_each(|a| *a *= inv);
        });
    Ok(())
}

/// A cached row as f32: borrowed from an f32 cache, widened from bf16 into `buf`.
#[inline]
fn cache_row<'a>(data: &'a KvData, at: usize, buf: &'a mut [f32]) -> &'a [f32] {
    match data {
        KvData::F32(d) => &d[at..at + buf.len()],
        KvData::Bf16(d) => {
            ops::bf16_to_f32_row(&d[at..at + buf.len()], buf);
            buf
        }
    }
}
