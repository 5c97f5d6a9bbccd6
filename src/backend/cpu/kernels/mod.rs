//! Compute kernels of the CPU backend.
//!
//! - [`matmul`] / [`matmul_grouped`]: `out = x · Wᵀ` over weights in F32, BF16,
//!   NVFP4 or MXFP4, decoded inside the kernel straight from the (possibly
//!   misaligned) mapped bytes. A grouped call runs many independent problems
//!   (the experts of one MoE layer) in one parallel region.
//! - [`quantize`]: activations as int16 blocks, which the AVX2 and NEON
//!   MXFP4 kernels multiply with the FP4 codes as integers.
//! - [`ops`]: RMSNorm, SiLU·mul, softmax, dot, axpy, bf16 rows, argmax.
//! - [`measure_read_bandwidth`] / [`measure_read_bandwidth_of`]: the
//!   machine's memory read bandwidth, over a fresh buffer or mapped memory.
//!
//! Instruction sets are picked at run time ([`Isa::best`]): AVX2+FMA on
//! x86-64, NEON on aarch64, portable scalar code elsewhere. [`reference`]
//! holds the scalar definitions the tests compare every kernel with.
//!
//! Threads: every call runs on the current rayon pool (`pool.install` to pick
//! one). Memory: a call allocates nothing; the kernels read the weights and
//! the activations where they are (decoded weight panels live on the stack),
//! except that MXFP4 on AVX2 and NEON quantizes the activations into a
//! scratch first: the caller's ([`matmul_grouped_in`]) or a per-thread one.
//!
//! Batch invariance: on each instruction set, every output element is summed
//! in one order that depends only on the number of input columns and the
//! weight format, never on how many tokens share the call, which path or
//! tile computes it, or how rows are split between threads. A token's
//! outputs are therefore bitwise the same alone or in any batch, which the
//! engine relies on: a batch of requests gives exactly the tokens each gets
//! alone, and a prompt cut into chunks gives the logits of one full pass
//! (last-bit differences would otherwise be amplified by a bf16 KV cache).
//! The instruction sets may differ from each other.

mod bandwidth;
pub mod formats;
mod matmul;
pub mod ops;
mod portable;
pub mod quantize;
pub mod reference;

#[cfg(target_arch = "aarch64")]
mod arm;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use bandwidth::{measure_read_bandwidth, measure_read_bandwidth_of};
pub use matmul::{
    GroupedProblem, add_bias_bf16, matmul, matmul_grouped, matmul_grouped_in, matmul_grouped_on,
    quantizes_activations,
};
pub use quantize::ActivationScratch;

use std::sync::OnceLock;

/// Errors of the matmul entry points: shapes that do not fit together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    #[error("{format} weight [{rows}, {cols}]: {part} has {got} bytes, expected {expected}")]
    WeightBytes {
        format: &'static str,
        part: &'static str,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("{format} weight needs cols to be a multiple of {multiple}, got {cols}")]
    ColsNotBlockMultiple {
        format: &'static str,
        multiple: usize,
        cols: usize,
    },
    #[error("weight shape [{rows}, {cols}] overflows usize")]
    ShapeOverflow { rows: usize, cols: usize },
    #[error("{what} has {got} values, expected {tokens} tokens × {width} = {expected}")]
    Length {
        what: &'static str,
        tokens: usize,
        width: usize,
        expected: usize,
        got: usize,
    },
    #[error("quantized activations need room for {needed} values, the scratch holds {capacity}")]
    ScratchTooSmall { needed: usize, capacity: usize },
    #[error("instruction set {0:?} is not available on this CPU")]
    IsaUnavailable(Isa),
}

/// An instruction set the kernels can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust, no explicit SIMD.
    Scalar,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// aarch64 Advanced SIMD.
    Neon,
}

impl Isa {
    /// The fastest instruction set this CPU supports (detected once).
    pub fn best() -> Isa {
        *Isa::detected().last().unwrap_or(&Isa::Scalar)
    }

    /// Every instruction set usable here, slowest first (always has `Scalar`).
    pub fn available() -> Vec<Isa> {
        Isa::detected().to_vec()
    }

    /// Whether this CPU can run it.
    pub fn is_available(self) -> bool {
        Isa::detected().contains(&self)
    }

    fn detected() -> &'static [Isa] {
        static DETECTED: OnceLock<Vec<Isa>> = OnceLock::new();
        DETECTED.get_or_init(|| {
            let mut isas = vec![Isa::Scalar];
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                isas.push(Isa::Avx2);
            }
            #[cfg(target_arch = "aarch64")]
            if std::arch::is_aarch64_feature_detected!("neon") {
                isas.push(Isa::Neon);
            }
            isas
        })
    }
}
