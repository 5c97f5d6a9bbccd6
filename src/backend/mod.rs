//! Compute backends. `cpu` runs everywhere (SIMD with runtime detection, rayon).
pub mod cpu;
