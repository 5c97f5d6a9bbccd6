//! Host side of the attention kernels: bounds checks, the choice of splits
//! along the sequence, and the KV append.

use std::sync::atomic::Ordering;

use super::memory::{CudaKvCache, check};
use super::params as p;
use super::{CudaBackend, CudaBuffer, CudaStep, CudaVector, CudaWorkspace, Kernel, u32_of};
use crate::backend::{AttentionShape, BackendError};

impl CudaBackend {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_attention(
        &self,
        q: &CudaBuffer,
        k: &CudaBuffer,
        v: &CudaBuffer,
        kv: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        shape: &AttentionShape,
        sinks: Option<&CudaVector<'_>>,
        ws: &mut CudaWorkspace,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        let (heads, kv_heads, hd) = (shape.heads, shape.kv_heads, shape.head_dim);
        if hd == 0 || hd > p::MAX_HEAD_DIM || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(BackendError::Shape(format!(
                "unsupported attention shape: {heads} heads, {kv_heads} KV heads, head_dim {hd}"
            )));
        }
        if kv_heads * hd != kv.width {
            return Err(BackendError::Shape(format!(
                "KV rows of {} values, the layer has {kv_heads} × {hd}",
                kv.width
            )));
        }
        let rows = step.rows;
        check("q", rows * heads * hd, q.len().min(out.len()))?;
        check("k", rows * kv.width, k.len().min(v.len()))?;
        if let Some(s) = sinks {
            check("sinks", heads, s.len)?;
        }
        let store = *kv
            .layers
            .get(layer)
            .ok_or_else(|| BackendError::Shape(format!("no KV layer {layer}")))?;
        kv.check_step(&store, step)?;
        if rows == 0 {
            return Ok(());
        }
        let shared = p::attention_shared_bytes(hd as u32);
        if shared > self.attention_shared {
            return Err(BackendError::Shape(format!(
                "head_dim {hd} needs {shared} bytes of shared memory, the device allows {}",
                self.attention_shared
            )));
        }

        let (splits, split_len) = self.splits(step, shape, heads, ws.gathered_input.elements);
        let mut params = p::AttnParams {
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            k_cache: store.k,
            v_cache: store.v,
            meta: step.meta(),
            sinks: sinks.map_or(0, |s| s.ptr),
            out: out.ptr(),
            partial: ws.gathered_input.ptr(),
            max_tokens: u32_of("tokens", step.max_tokens)?,
            max_seqs: u32_of("sequences", step.max_seqs)?,
            num_seqs: u32_of("sequences", step.num_seqs)?,
            rows: u32_of("rows", rows)?,
            heads: u32_of("heads", heads)?,
            kv_heads: u32_of("kv heads", kv_heads)?,
            head_dim: hd as u32,
            kv_bf16: kv.bf16.into(),
            sinks_bf16: sinks.is_some_and(|s| s.bf16).into(),
            block_size: u32_of("block size", kv.block_size)?,
            ring: store.ring.into(),
            ring_window: u32_of("window", kv.ring_window)?,
            window: u32_of("window", shape.window.unwrap_or(0))?,
            splits,
            split_len,
            append: (!store.ring).into(),
            scale: shape.scale,
            pad: 0,
        };
        if store.ring {
            params.append = 0;
        }
        let grid = (step.tiles, params.heads, splits);
        self.launch(Kernel::Attention, grid, p::ATTN_THREADS, shared, &params)?;
        if params.append == 1 {
            kv.appended
                .store(CudaKvCache::marker(layer, step.serial), Ordering::Release);
        }
        if splits > 1 {
            self.launch(
                Kernel::AttentionCombine,
                (params.rows, params.heads, 1),
                32,
                0,
                &params,
            )?;
        }
        Ok(())
    }

    /// Splits of the keys and keys per split. A decode step (one row per
    /// sequence) with a long context splits it so that about two blocks per
    /// multiprocessor run; a prefill has enough query tiles. The partials
    /// live in the workspace's `gathered_input`, which bounds the splits.
    fn splits(
        &self,
        step: &CudaStep,
        shape: &AttentionShape,
        heads: usize,
        scratch: usize,
    ) -> (u32, u32) {
        // Keys a tile can see: its context, at most a window and a tile.
        let span = match shape.window {
            Some(w) => step.max_context.min(w + p::Q_TILE as usize),
            None => step.max_context,
        }
        .max(1);
        let key_tile = p::KEY_TILE as usize;
        let round = |n: usize| n.div_ceil(key_tile) * key_tile;
        let forced = self.split_len.load(Ordering::Relaxed) as usize;
        let (mut splits, mut len) = if forced > 0 {
            (span.div_ceil(forced), forced)
        } else if step.decode_only && span > 2 * key_tile {
            let base = (step.tiles as usize * heads).max(1);
            let wanted = (2 * self.device.multiprocessors as usize).div_ceil(base);
            let splits = wanted.min(span.div_ceil(key_tile)).max(1);
            (splits, round(span.div_ceil(splits)))
        } else {
            (1, span)
        };
        let capacity = scratch / (step.rows * heads * (shape.head_dim + 2)).max(1);
        if splits > capacity {
            splits = capacity;
            len = round(span.div_ceil(splits.max(1)));
        }
        // Every key of the span is in a split: ⌈span / len⌉ ≤ splits.
        let splits = if splits <= 1 { 1 } else { span.div_ceil(len) };
        if splits <= 1 {
            return (1, u32::MAX);
        }
        (splits as u32, len as u32)
    }

    pub(super) fn run_kv_append(
        &self,
        k: &CudaBuffer,
        v: &CudaBuffer,
        kv: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
    ) -> Result<(), BackendError> {
        let store = *kv
            .layers
            .get(layer)
            .ok_or_else(|| BackendError::Shape(format!("no KV layer {layer}")))?;
        kv.check_step(&store, step)?;
        check("k", step.rows * kv.width, k.len().min(v.len()))?;
        // The attention kernel of this step already wrote a paged layer.
        if !store.ring
            && kv.appended.load(Ordering::Acquire) == CudaKvCache::marker(layer, step.serial)
        {
            return Ok(());
        }
        let params = p::AppendParams {
            k: k.ptr(),
            v: v.ptr(),
            k_cache: store.k,
            v_cache: store.v,
            meta: step.meta(),
            max_tokens: u32_of("tokens", step.max_tokens)?,
            max_seqs: u32_of("sequences", step.max_seqs)?,
            num_seqs: u32_of("sequences", step.num_seqs)?,
            rows: u32_of("rows", step.rows)?,
            kv_width: u32_of("kv width", kv.width)?,
            kv_bf16: kv.bf16.into(),
            block_size: u32_of("block size", kv.block_size)?,
            ring: store.ring.into(),
            ring_window: u32_of("window", kv.ring_window)?,
            pad: 0,
        };
        self.launch(Kernel::KvAppend, (params.rows, 1, 1), 128, 0, &params)
    }
}
