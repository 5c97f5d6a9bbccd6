//! x86-64 kernels: AVX2 + FMA, entered only through `Isa::Avx2`.

pub(super) mod avx2;
pub(super) mod avx2_mxfp4;
pub(super) mod avx2_ops;
