//! The kernels' parameter structs, field for field as `kernels/*.cu`
//! declare them (each kernel takes one struct by value). Only u64, u32 and
//! f32 fields, u64s first, so `repr(C)` lays them out as the CUDA compiler
//! does; the sizes are asserted here and by `static_assert` in the sources.
//! The numbers they share with the kernels are in `constants`.

use super::constants::{KEY_TILE, MAX_COPY_PAIRS, MAX_JOBS, MAX_ROPE_HALF, Q_TILE};

/// Dynamic shared memory of `attention` for `head_dim`: a query tile, a
/// padded key tile and a value tile, f32.
pub fn attention_shared_bytes(head_dim: u32) -> u32 {
    (Q_TILE * head_dim + KEY_TILE * (head_dim + 1) + KEY_TILE * head_dim) * 4
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Weight {
    pub data: u64,
    pub scales: u64,
    pub format: u32,
    pub global: f32,
    pub rows: u32,
    pub cols: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NormParams {
    pub x: u64,
    pub delta: u64,
    pub weight: u64,
    pub out: u64,
    pub weight_bf16: u32,
    pub width: u32,
    pub eps: f32,
    pub rows: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RopeTableParams {
    pub meta: u64,
    pub out: u64,
    pub max_tokens: u32,
    pub max_seqs: u32,
    pub num_seqs: u32,
    pub rows: u32,
    pub half: u32,
    pub attention_factor: f32,
    pub inv_freq: [f32; MAX_ROPE_HALF],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QkRopeParams {
    pub q: u64,
    pub k: u64,
    pub q_norm: u64,
    pub k_norm: u64,
    pub rope: u64,
    pub q_norm_bf16: u32,
    pub k_norm_bf16: u32,
    pub rows: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub eps: f32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EmbedParams {
    pub table: Weight,
    pub meta: u64,
    pub out: u64,
    pub rows: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PairParams {
    pub a: u64,
    pub b: u64,
    pub n: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CompactParams {
    pub buf: u64,
    pub meta: u64,
    pub max_tokens: u32,
    pub count: u32,
    pub width: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulJob {
    pub w: Weight,
    pub x: u64,
    pub out: u64,
    pub bias: u64,
    pub bias_bf16: u32,
    pub rows: u32,
    pub first_block: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulParams {
    pub jobs: [MatmulJob; MAX_JOBS],
    pub count: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RouteParams {
    pub logits: u64,
    pub topk_ids: u64,
    pub topk_weights: u64,
    pub offsets: u64,
    pub sorted_rows: u64,
    pub counter: u64,
    pub rows: u32,
    pub num_experts: u32,
    pub top_k: u32,
    pub kind: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExpertWeights {
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
    pub gate_up_bias: u64,
    pub down_bias: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GateUpParams {
    pub experts: u64,
    pub x: u64,
    pub sorted_rows: u64,
    pub offsets: u64,
    pub act: u64,
    pub num_experts: u32,
    pub top_k: u32,
    pub hidden: u32,
    pub inter: u32,
    pub interleaved: u32,
    pub bias_bf16: u32,
    pub limit: f32,
    pub alpha: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DownParams {
    pub experts: u64,
    pub act: u64,
    pub offsets: u64,
    pub down_out: u64,
    pub num_experts: u32,
    pub hidden: u32,
    pub inter: u32,
    pub bias_bf16: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CombineParams {
    pub down_out: u64,
    pub positions: u64,
    pub weights: u64,
    pub out: u64,
    pub rows: u32,
    pub top_k: u32,
    pub hidden: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub meta: u64,
    pub sinks: u64,
    pub out: u64,
    pub partial: u64,
    pub max_tokens: u32,
    pub max_seqs: u32,
    pub num_seqs: u32,
    pub rows: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub kv_bf16: u32,
    pub sinks_bf16: u32,
    pub block_size: u32,
    /// The sequence field of the layer's table: `SEQ_TABLE` or `SEQ_SLIDING`
    /// (`constants`).
    pub table: u32,
    pub window: u32,
    pub splits: u32,
    pub split_len: u32,
    pub scale: f32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AppendParams {
    pub k: u64,
    pub v: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub meta: u64,
    pub max_tokens: u32,
    pub max_seqs: u32,
    pub num_seqs: u32,
    pub rows: u32,
    pub kv_width: u32,
    pub kv_bf16: u32,
    pub block_size: u32,
    pub table: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CopyParams {
    pub cache: u64,
    pub half_bytes: u64,
    pub block_units: u32,
    pub pairs: u32,
    pub from: [u32; MAX_COPY_PAIRS],
    pub to: [u32; MAX_COPY_PAIRS],
}

// The same sizes the sources assert.
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<Weight>() == 32);
    assert!(size_of::<NormParams>() == 48);
    assert!(size_of::<RopeTableParams>() == 40 + 4 * MAX_ROPE_HALF);
    assert!(size_of::<QkRopeParams>() == 72);
    assert!(size_of::<EmbedParams>() == 56);
    assert!(size_of::<PairParams>() == 24);
    assert!(size_of::<CompactParams>() == 32);
    assert!(size_of::<MatmulJob>() == 72);
    assert!(size_of::<MatmulParams>() == 72 * MAX_JOBS + 8);
    assert!(size_of::<RouteParams>() == 64);
    // The plan sizes the expert tables with this (plan::memory).
    assert!(
        size_of::<ExpertWeights>() as u64 == crate::plan::memory::CUDA_EXPERT_TABLE_ENTRY_BYTES
    );
    assert!(size_of::<GateUpParams>() == 72);
    assert!(size_of::<DownParams>() == 48);
    assert!(size_of::<CombineParams>() == 48);
    assert!(size_of::<AttnParams>() == 136);
    assert!(size_of::<AppendParams>() == 72);
    assert!(size_of::<CopyParams>() == 24 + 8 * MAX_COPY_PAIRS);
};
