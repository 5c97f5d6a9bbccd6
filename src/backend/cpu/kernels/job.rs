//! What the dispatcher (`matmul.rs`) hands an instruction set's kernels: one
//! problem, how to compute it, and where its outputs go. A kernel computes
//! whole output rows of a job (`run_rows(job, rows)`).

use super::quantize::QuantizedX;
use crate::checkpoint::linear::LinearWeight;

/// How a problem is computed on a SIMD instruction set (only AVX2 has a
/// panel path so far; the others always run as GEMV).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub enum Path {
    /// Few tokens: stream each weight row once, dot it with every token.
    Gemv,
    /// Many tokens: decode a few rows into a cache-resident f32 panel and run a
    /// register-blocked microkernel over token groups.
    Panel,
}

/// Raw output pointer shared by the workers of one call.
#[derive(Clone, Copy)]
pub struct OutPtr(pub *mut f32);
// SAFETY: each work unit writes only the outputs of its own rows of its own
// problem (`out[t·rows + r]` for r in its range), so writes never overlap, and
// the pointee outlives the parallel region (it is borrowed by the caller).
unsafe impl Send for OutPtr {}
// SAFETY: shared by reference for the same disjoint writes as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the Sync wrapper, not the field).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn get(self) -> *mut f32 {
        self.0
    }
}

/// One problem of a call, as an instruction set's kernels see it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct Job<'a> {
    pub weight: LinearWeight<'a>,
    pub tokens: usize,
    pub path: Path,
    /// The activations, `[tokens, cols]`.
    pub x: &'a [f32],
    /// The same, quantized, where the instruction set multiplies this
    /// format with quantized activations.
    pub quantized: Option<QuantizedX<'a>>,
    pub out: OutPtr,
}
