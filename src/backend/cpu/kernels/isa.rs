//! The instruction sets the kernels run on, detected once at run time.

use std::sync::OnceLock;

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
