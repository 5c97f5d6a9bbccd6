//! Host side of the attention kernels: bounds checks, the choice of splits
//! along the sequence, the KV append and the copy of whole KV blocks.

use std::sync::atomic::Ordering;

use super::backend::{CudaBackend, u32_of};
use super::constants::{
    APPEND_THREADS, ATTN_WARPS, BLOCK_THREADS, KEY_TILE, MAX_COPY_PAIRS, MAX_HEAD_DIM, Q_TILE,
    SEQ_SLIDING, SEQ_TABLE, WARP,
};
use super::handles::CudaVector;
use super::kernels::Kernel;
use super::memory::{CudaBuffer, CudaStep, CudaWorkspace};
use super::memory::{CudaKvCache, KvLayer, check};
use super::params as p;
use crate::backend::error::BackendError;
use crate::backend::shapes::AttentionShape;

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
        if hd == 0 || hd > MAX_HEAD_DIM || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
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

        let (splits, split_len) = self.splits(step, shape, heads, ws.attention_partials.elements);
        let params = p::AttnParams {
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            k_cache: store.k,
            v_cache: store.v,
            meta: step.meta(),
            sinks: sinks.map_or(0, |s| s.ptr),
            out: out.ptr(),
            partial: ws.attention_partials.ptr(),
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
            table: table_field(&store),
            window: u32_of("window", shape.window.unwrap_or(0))?,
            splits,
            split_len,
            scale: shape.scale,
            pad: 0,
        };
        let grid = (step.tiles, params.heads, splits);
        self.launch(Kernel::Attention, grid, ATTN_WARPS * WARP, shared, &params)?;
        // The kernel also wrote the step's keys and values.
        kv.appended
            .store(CudaKvCache::marker(layer, step.serial), Ordering::Release);
        if splits > 1 {
            self.launch(
                Kernel::AttentionCombine,
                (params.rows, params.heads, 1),
                WARP,
                0,
                &params,
            )?;
        }
        Ok(())
    }

    /// Splits of the keys and keys per split. A decode step (one row per
    /// sequence) with a long context splits it so that about two blocks per
    /// multiprocessor run; a prefill has enough query tiles. The partials
    /// live in the workspace's `attention_partials`, which bounds the splits.
    fn splits(
        &self,
        step: &CudaStep,
        shape: &AttentionShape,
        heads: usize,
        scratch: usize,
    ) -> (u32, u32) {
        // Keys a tile can see: its context, at most a window and a tile.
        let span = match shape.window {
            Some(w) => step.max_context.min(w + Q_TILE as usize),
            None => step.max_context,
        }
        .max(1);
        let key_tile = KEY_TILE as usize;
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
        // The attention kernel of this step already wrote the layer.
        if kv.appended.load(Ordering::Acquire) == CudaKvCache::marker(layer, step.serial) {
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
            table: table_field(&store),
        };
        self.launch(
            Kernel::KvAppend,
            (params.rows, 1, 1),
            APPEND_THREADS,
            0,
            &params,
        )
    }

    /// Copies block `from` onto block `to` of every array, for each pair,
    /// in launches of up to `MAX_COPY_PAIRS` pairs. Every id is checked
    /// first (nothing is copied otherwise), and, since a launch copies its
    /// pairs at once, that no block is the `to` of two pairs or both a
    /// `from` and a `to` (the order-free contract of `kv_copy_blocks`).
    pub(super) fn run_kv_copy_blocks(
        &self,
        kv: &CudaKvCache,
        pairs: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        let blocks = kv.blocks;
        for (i, &(from, to)) in pairs.iter().enumerate() {
            if from as usize >= blocks || to as usize >= blocks || from == to {
                return Err(BackendError::Shape(format!(
                    "cannot copy KV block {from} onto block {to} of {blocks}"
                )));
            }
            if pairs[..i]
                .iter()
                .any(|&(f, t)| t == to || t == from || f == to)
            {
                return Err(BackendError::Shape(format!(
                    "KV block copies overlap at {from} → {to}: a block is the target of one copy \
                     and the source or target of another"
                )));
            }
        }
        let element_bytes = if kv.bf16 { 2 } else { 4 };
        let block_bytes = kv.block_size * kv.width * element_bytes;
        let params = |chunk: &[(u32, u32)]| -> Result<p::CopyParams, BackendError> {
            let mut params = p::CopyParams {
                cache: kv.base(),
                half_bytes: kv.array_bytes / 2,
                block_units: u32_of("KV block", block_bytes / 2)?,
                pairs: chunk.len() as u32,
                from: [0; MAX_COPY_PAIRS],
                to: [0; MAX_COPY_PAIRS],
            };
            for (i, &(from, to)) in chunk.iter().enumerate() {
                params.from[i] = from;
                params.to[i] = to;
            }
            Ok(params)
        };
        let halves = u32_of("KV arrays", 2 * kv.arrays)?;
        for chunk in pairs.chunks(MAX_COPY_PAIRS) {
            let params = params(chunk)?;
            self.launch(
                Kernel::KvCopyBlocks,
                (params.pairs, halves, 1),
                BLOCK_THREADS,
                0,
                &params,
            )?;
        }
        Ok(())
    }
}

/// The step metadata field of the table `layer` reads.
fn table_field(layer: &KvLayer) -> u32 {
    if layer.sliding {
        SEQ_SLIDING as u32
    } else {
        SEQ_TABLE as u32
    }
}
