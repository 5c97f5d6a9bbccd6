//! How the CUDA backend is started, and which kernels compute its matmuls.

use std::path::PathBuf;

use super::constants::TOKEN_TILE;

/// Which kernels compute the linear layers and experts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulPath {
    /// By the crossover ([`TENSOR_CORE_MIN_ROWS`]).
    #[default]
    Auto,
    /// The warp-per-row FP32 kernels (`matmul`, `expert_gate_up`, `expert_down`).
    WarpPerRow,
    /// The tensor-core kernels wherever the device and the weights allow
    /// (sm_80 and newer; not F32 weights).
    TensorCores,
}

/// The crossover: steps of at least this many rows (tokens) run the
/// tensor-core kernels (`matmul_mma`, `expert_gate_up_mma`,
/// `expert_down_mma`); fewer run the warp-per-row GEMV.
///
/// The model: the GEMV reads each weight once per `TOKEN_TILE` (8) rows,
/// so up to 8 rows (batch-1..8 decode) it streams the weights exactly once,
/// is bound by memory bandwidth (≤ 16 FLOPs per weight element, within the
/// CUDA cores' f32 rate at any DRAM bandwidth the weights can stream at),
/// and keeps the activations f32. A tensor-core tile holds 8 rows, so below
/// 8 it computes padding and reads the weights no less. From 9 rows on the
/// GEMV makes another pass over the weights per 8 rows (traffic ∝ ⌈rows/8⌉)
/// and its FMAs become the limit, while `matmul_mma` reads them once per 64
/// rows on the tensor cores. An expert gets at most one row per token, so
/// the same rule on the step's tokens keeps every expert at ≤ 8 rows on the
/// GEMV side. docs/ARCHITECTURE.md ("CUDA matmuls") has the whole argument.
pub const TENSOR_CORE_MIN_ROWS: usize = TOKEN_TILE + 1;

/// How to start the backend.
#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    /// Device ordinal.
    pub ordinal: i32,
    /// CUBIN cache directory (see [`cache::cache_dir`](super::cache::cache_dir)).
    pub cache_dir: Option<PathBuf>,
}
