//! Causal attention over the paged KV cache, in blocks.
//!
//! A task takes the queries that share one KV head: up to `MAX_QUERIES`
//! (tokens × heads of the group) of one sequence. It walks that sequence's
//! keys in blocks of `KEY_BLOCK`, aligned to absolute positions: copy the
//! block's keys and values (from the cache, or the step's own rows, which
//! are first rounded to the cache's precision so that a chunked prefill sees
//! exactly what a one-token decode sees), score every query against every
//! key, mask what a query may not see, and fold the block into each query's
//! online softmax (running maximum, denominator and weighted sum of values).
//! Optional per-head sink logits (gpt_oss) join the denominator at the end.
//!
//! Batch invariance: a query's result does not depend on the other queries
//! of its task or on how the prompt was cut into steps. Blocks start at
//! multiples of `KEY_BLOCK` whatever the task; keys a query may not see
//! (later positions, outside the window, or not written yet) score −∞ and
//! weigh exactly 0; and every reduction runs over the whole block in an
//! order fixed by the block and head sizes.

use rayon::prelude::*;

use super::kernels::ops;
use super::kv::{CpuKvCache, KvData};
use crate::backend::error::BackendError;
use crate::backend::shapes::AttentionShape;
use crate::checkpoint::kv_scales::KvScale;
use crate::checkpoint::linear::VectorWeight;
use crate::step::StepBatch;

/// Largest head dimension the stack buffers hold.
const MAX_HEAD_DIM: usize = 512;
/// Keys per block.
const KEY_BLOCK: usize = 32;
/// Queries per task (tokens × heads of one KV group).
const MAX_QUERIES: usize = 64;

/// The queries of one task: tokens `row0..row1` of sequence `seq` (rows of
/// the step), query heads `head0..head1`, all reading KV head `kv_head`.
struct Task {
    seq: usize,
    row0: usize,
    row1: usize,
    kv_head: usize,
    head0: usize,
    head1: usize,
}

/// The output buffer, written by the tasks at disjoint (row, head) places.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes only the head slices of its own (row, head)
// queries, which no other task has, and the buffer outlives the parallel
// region (it is borrowed by `attention`).
unsafe impl Send for OutPtr {}
// SAFETY: shared by reference for the same disjoint writes as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Everything a task reads.
struct Inputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    kv: &'a CpuKvCache,
    k_cache: &'a KvData,
    v_cache: &'a KvData,
    /// The layer's FP8 scales.
    scale: KvScale,
    /// Whether the layer reads the sliding-window tables.
    sliding: bool,
    batch: &'a StepBatch,
    shape: &'a AttentionShape,
    sinks: Option<&'a VectorWeight<'a>>,
}

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
    if hd == 0 || hd > MAX_HEAD_DIM || kv_heads == 0 || heads % kv_heads != 0 {
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
    let (store, sliding) = kv.layer(layer)?;
    let (k_cache, v_cache) = (&store.k, &store.v);
    let scale = kv.scale(layer);
    kv.round_in_place(&mut k[..rows * kv_width], scale.k);
    kv.round_in_place(&mut v[..rows * kv_width], scale.v);

    let group = heads / kv_heads;
    let heads_per_task = group.min(MAX_QUERIES);
    let tokens_per_task = (MAX_QUERIES / heads_per_task).max(1);
    let mut tasks = Vec::new();
    for (seq, chunk) in batch.seqs.iter().enumerate() {
        let rows = chunk.rows();
        let mut row0 = rows.start;
        while row0 < rows.end {
            let row1 = (row0 + tokens_per_task).min(rows.end);
            for kv_head in 0..kv_heads {
                let mut head0 = kv_head * group;
                while head0 < (kv_head + 1) * group {
                    let head1 = (head0 + heads_per_task).min((kv_head + 1) * group);
                    tasks.push(Task {
                        seq,
                        row0,
                        row1,
                        kv_head,
                        head0,
                        head1,
                    });
                    head0 = head1;
                }
            }
            row0 = row1;
        }
    }
    let inputs = Inputs {
        q,
        k,
        v,
        kv,
        k_cache,
        v_cache,
        scale,
        sliding,
        batch,
        shape,
        sinks,
    };
    let out = OutPtr(out.as_mut_ptr());
    tasks
        .par_iter()
        .for_each(|task| run_task(&inputs, task, out));
    Ok(())
}

// Never inlined: its scratch arrays (~400 KiB) must live in this frame
// only. Inlined into rayon's splitting helper (thin LTO did), every level of
// the split reserved them, and with a few hundred prompt tokens the nested
// levels of a worker that steals while it waits overflowed its 2 MiB stack.
#[inline(never)]
fn run_task(inputs: &Inputs, task: &Task, out: OutPtr) {
    let shape = inputs.shape;
    let hd = shape.head_dim;
    let (q_width, kv_width) = (shape.heads * hd, shape.kv_heads * hd);
    let chunk = &inputs.batch.seqs[task.seq];
    let past = chunk.past as usize;
    let start = chunk.start as usize;
    let (n_tokens, n_heads) = (task.row1 - task.row0, task.head1 - task.head0);
    let nq = n_tokens * n_heads;
    // Query i is token i / n_heads, head i % n_heads of the task.
    let position = |i: usize| past + task.row0 + i / n_heads - start;
    let first = |i: usize| {
        shape
            .window
            .map_or(0, |w| (position(i) + 1).saturating_sub(w))
    };

    let mut queries = [0.0f32; MAX_QUERIES * MAX_HEAD_DIM];
    for (i, dst) in queries.chunks_exact_mut(hd).take(nq).enumerate() {
        let row = task.row0 + i / n_heads;
        let head = task.head0 + i % n_heads;
        dst.copy_from_slice(&inputs.q[row * q_width + head * hd..][..hd]);
    }
    let mut acc = [0.0f32; MAX_QUERIES * MAX_HEAD_DIM];
    let mut max = [f32::NEG_INFINITY; MAX_QUERIES];
    let mut denom = [0.0f32; MAX_QUERIES];
    let mut keys = [0.0f32; KEY_BLOCK * MAX_HEAD_DIM];
    let mut values = [0.0f32; KEY_BLOCK * MAX_HEAD_DIM];
    let mut scores = [0.0f32; MAX_QUERIES * KEY_BLOCK];
    let (queries, acc) = (&queries[..nq * hd], &mut acc[..nq * hd]);
    let (keys, values) = (&mut keys[..KEY_BLOCK * hd], &mut values[..KEY_BLOCK * hd]);
    let scores = &mut scores[..nq * KEY_BLOCK];

    // Positions are ascending in the task: the first query sees the
    // earliest key, the last one the latest.
    let last = position(nq - 1);
    let offset = task.kv_head * hd;
    let mut block = first(0) / KEY_BLOCK * KEY_BLOCK;
    while block <= last {
        let present = (last + 1 - block).min(KEY_BLOCK);
        for j in 0..KEY_BLOCK {
            let (kd, vd) = (&mut keys[j * hd..][..hd], &mut values[j * hd..][..hd]);
            if j >= present {
                // Not written yet: masked below; zeros keep the sums finite.
                kd.fill(0.0);
                vd.fill(0.0);
            } else if block + j < past {
                match inputs
                    .kv
                    .slot(inputs.batch, task.seq, inputs.sliding, block + j)
                {
                    Some(slot) => {
                        let at = slot * kv_width + offset;
                        inputs.k_cache.read_row(at, inputs.scale.k, kd);
                        inputs.v_cache.read_row(at, inputs.scale.v, vd);
                    }
                    // Out of the window (its block released): masked below.
                    None => {
                        debug_assert!(block + j < first(0), "a visible key has no block");
                        kd.fill(0.0);
                        vd.fill(0.0);
                    }
                }
            } else {
                let row = start + (block + j - past);
                kd.copy_from_slice(&inputs.k[row * kv_width + offset..][..hd]);
                vd.copy_from_slice(&inputs.v[row * kv_width + offset..][..hd]);
            }
        }
        ops::attention_scores(queries, keys, hd, shape.scale, scores);
        for (i, row) in scores.chunks_exact_mut(KEY_BLOCK).enumerate() {
            let (lo, hi) = (first(i), position(i));
            let mut block_max = f32::NEG_INFINITY;
            for (j, s) in row.iter_mut().enumerate() {
                if block + j < lo || block + j > hi {
                    *s = f32::NEG_INFINITY;
                } else {
                    block_max = block_max.max(*s);
                }
            }
            if block_max == f32::NEG_INFINITY {
                // Nothing visible in this block: weights 0, state untouched.
                row.fill(0.0);
                continue;
            }
            let new_max = max[i].max(block_max);
            if max[i] != f32::NEG_INFINITY && new_max != max[i] {
                // Rescale what was summed under the old maximum.
                let correction = ops::exp(max[i] - new_max);
                denom[i] *= correction;
                acc[i * hd..][..hd]
                    .iter_mut()
                    .for_each(|a| *a *= correction);
            }
            max[i] = new_max;
            denom[i] += ops::exp_block(row, new_max);
        }
        ops::attention_values(scores, values, hd, acc);
        block += KEY_BLOCK;
    }

    for i in 0..nq {
        let row = task.row0 + i / n_heads;
        let head = task.head0 + i % n_heads;
        let o = &mut acc[i * hd..][..hd];
        if let Some(sinks) = inputs.sinks {
            let sink = sinks.get(head);
            if sink > max[i] {
                let correction = ops::exp(max[i] - sink);
                denom[i] *= correction;
                o.iter_mut().for_each(|a| *a *= correction);
                max[i] = sink;
            }
            denom[i] += ops::exp(sink - max[i]);
        }
        let inv = 1.0 / denom[i];
        // SAFETY: (row, head) is this task's query; no other task writes
        // its slice, which lies inside the output (checked in `attention`).
        let dst =
            unsafe { std::slice::from_raw_parts_mut(out.get().add(row * q_width + head * hd), hd) };
        for (d, &a) in dst.iter_mut().zip(o.iter()) {
            *d = a * inv;
        }
    }
}
