//! Compute kernels of the CPU backend.
//!
//! - [`matmul`] / [`matmul_grouped`]: `out = x · Wᵀ` over weights in F32, BF16,
//!   NVFP4 or MXFP4, decoded inside the kernel straight from the (possibly
//!   misaligned) mapped bytes. A grouped call runs many independent problems
//!   (the experts of one MoE layer) in one parallel region.
//! - [`quantize`]: activations as int16 blocks, which the MXFP4 kernels
//!   (AVX2, NEON) and the NVFP4 kernels (the x86 tiers) multiply with the
//!   FP4 codes as integers.
//! - [`ops`]: RMSNorm, SiLU·mul, softmax, dot, axpy, bf16 rows, argmax.
//! - [`measure_read_bandwidth`] / [`measure_read_bandwidth_of`]: the
//!   machine's memory read bandwidth, over a fresh buffer or mapped memory.
//!
//! Instruction sets are picked at run time ([`Isa::best`]): AVX2+FMA on
//! x86-64, NEON on aarch64, portable scalar code elsewhere. [`reference`]
//! holds the f64 oracles of the operations the tests compare every kernel
//! with; the number formats themselves are defined in `crate::formats`.
//!
//! Threads: every call runs on the current rayon pool (`pool.install` to pick
//! one). Memory: a call allocates nothing; the kernels read the weights and
//! the activations where they are (decoded weight panels live on the stack),
//! except that MXFP4 (AVX2, NEON) and NVFP4 (the x86 tiers) quantize the
//! activations into a scratch first: the caller's ([`matmul_grouped_in`],
//! the planned workspace's) or a per-thread one;
//! and BF16 on the AMX tier (a choice, never the default) packs up to 256
//! tokens' activations per work unit into a per-thread buffer that grows to
//! `512 · cols` bytes.
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

//!
//! The folder is a tree. Leaves, which import no other kernel file but
//! leaves: `isa`, `error`, `job` (what the dispatcher hands an
//! instruction set), [`weights`] (weight shapes and the element-by-element
//! definition, over `crate::formats`), [`quantize`] (the activation codes and
//! their layout), `math` (the `exp` polynomial), `prefetch` (the
//! software prefetch hint). One folder or file per
//! instruction set, importing only leaves: `x86/` (AVX2, AVX-512, AMX), `arm/` (NEON),
//! `portable.rs`. Only the dispatchers pick an instruction set: `matmul.rs`
//! for the matmuls and the activation quantizer, [`ops`] for the small ops.

mod bandwidth;
mod error;
mod isa;
mod job;
mod math;
mod matmul;
pub mod ops;
mod portable;
mod prefetch;
pub mod quantize;
pub mod reference;
pub mod weights;

#[cfg(target_arch = "aarch64")]
mod arm;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use bandwidth::{measure_read_bandwidth, measure_read_bandwidth_of};
pub use error::KernelError;
pub use isa::Isa;
pub use matmul::{
    GroupedProblem, add_bias_bf16, matmul, matmul_grouped, matmul_grouped_in, matmul_grouped_on,
    quantize_rows, quantizes_activations, rounds_activations_to_bf16,
};
pub use quantize::ActivationScratch;
