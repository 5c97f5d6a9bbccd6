//! aarch64 kernels: NEON, entered only through `Isa::Neon`.

pub(super) mod neon;
pub(super) mod neon_mxfp4;
