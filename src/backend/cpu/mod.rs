//! The CPU backend: SIMD kernels with runtime dispatch, threads via rayon.
pub mod kernels;
