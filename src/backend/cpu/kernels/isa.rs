//! The instruction sets the kernels run on, detected once at run time, and
//! `SPARKRT_ISA`, which forces one (tests and A/B runs).

use std::sync::OnceLock;

/// The variable that forces a tier.
pub const ISA_VARIABLE: &str = "SPARKRT_ISA";

/// An instruction set the kernels can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust, no explicit SIMD.
    Scalar,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// x86-64 with AVX2, FMA and AVX-512F/VL/DQ/BW: the AVX2 kernels with
    /// the integer FP4 kernels in zmm registers (`x86/avx2_fp4.rs`), NVFP4
    /// decoded by table permutes (`x86/avx512_nvfp4.rs`), INT4 16 rows a
    /// vector (`x86/avx512_int4.rs`) and the panel path over row pairs in
    /// zmm registers (`x86/avx512_panel.rs`), bitwise the
    /// AVX2 tier's results, so the default wherever the CPU has it.
    Avx512,
    /// x86-64 with AVX2, FMA, AVX-512F/BW/VL and AVX-512 BF16: BF16 weights
    /// by `vdpbf16ps` (activations rounded to bf16, `x86/avx512_bf16.rs`),
    /// every other format as `Avx512`. Never the default (see
    /// [`Isa::rounds_activations`]): `SPARKRT_ISA=avx512bf16` chooses it.
    Avx512Bf16,
    /// `Avx512Bf16` plus AMX-TILE and AMX-BF16 (Sapphire Rapids and later):
    /// BF16 weights by `tdpbf16ps` tiles (`x86/amx_bf16.rs`), activations
    /// rounded to bf16 as on `Avx512Bf16`, every other format as `Avx512`.
    /// Never the default: `SPARKRT_ISA=amx` chooses it.
    Amx,
    /// aarch64 Advanced SIMD.
    Neon,
}

/// Why `SPARKRT_ISA` cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsaChoiceError {
    #[error(
        "{ISA_VARIABLE}={0:?} is not an instruction set sparkrt has kernels for (scalar, avx2, avx512, avx512bf16, amx, neon)"
    )]
    Unknown(String),
    #[error("{ISA_VARIABLE}={name}: this CPU lacks {missing}")]
    Missing { name: &'static str, missing: String },
}

impl Isa {
    /// Every tier, slowest first within an architecture.
    const ALL: [Isa; 6] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx512Bf16,
        Isa::Amx,
        Isa::Neon,
    ];

    /// The name `SPARKRT_ISA` and `sparkrt bench` use.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512bf16",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
        }
    }

    /// The instruction set the kernels use: `SPARKRT_ISA`'s when it names
    /// one this CPU has, else the fastest detected that keeps the
    /// activations in f32. A value that cannot be honoured is
    /// [`Isa::choice`]'s error, which start-up reports (exit 2).
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            Isa::choice().ok().flatten().unwrap_or_else(|| {
                let mut exact = Isa::detected()
                    .iter()
                    .filter(|isa| !isa.rounds_activations());
                exact.next_back().copied().unwrap_or(Isa::Scalar)
            })
        })
    }

    /// Whether the tier rounds activations to bf16 for some format (BF16
    /// weights on `Avx512Bf16`): faster (1.4–2.4× BF16 prefill on a Zen 4
    /// EPYC, `benches/kernels.rs`), but the tiny fixtures' logits then move
    /// by up to 0.65 against transformers' f32 reference, where every other
    /// tier stays within 2e-3, so it is a choice, never the default.
    pub fn rounds_activations(self) -> bool {
        matches!(self, Isa::Avx512Bf16 | Isa::Amx)
    }

    /// The tier `SPARKRT_ISA` forces, `None` when it is unset or empty.
    pub fn choice() -> Result<Option<Isa>, IsaChoiceError> {
        match std::env::var(ISA_VARIABLE) {
            Ok(value) if !value.trim().is_empty() => Isa::named(value.trim()).map(Some),
            _ => Ok(None),
        }
    }

    /// The tier named `name`, if this CPU has it.
    pub fn named(name: &str) -> Result<Isa, IsaChoiceError> {
        let wanted = name.to_ascii_lowercase();
        let isa = Isa::ALL
            .into_iter()
            .find(|isa| isa.name() == wanted)
            .ok_or_else(|| IsaChoiceError::Unknown(name.to_string()))?;
        let missing = isa.missing_features();
        if missing.is_empty() {
            Ok(isa)
        } else {
            Err(IsaChoiceError::Missing {
                name: isa.name(),
                missing: missing.join(", "),
            })
        }
    }

    /// Every instruction set usable here, slowest first (always has `Scalar`).
    pub fn available() -> Vec<Isa> {
        Isa::detected().to_vec()
    }

    /// Whether this CPU can run it.
    pub fn is_available(self) -> bool {
        Isa::detected().contains(&self)
    }

    /// Whether the AVX2 kernels (and the small AVX2 ops) run on this tier.
    pub fn runs_avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx)
    }

    /// Whether the AVX-512F/VL additions to the AVX2 kernels run on this
    /// tier (NVFP4 by table permutes, INT4 16 rows a vector).
    pub fn runs_avx512(self) -> bool {
        matches!(self, Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx)
    }

    /// The CPU features the tier needs that this CPU lacks: those of the
    /// tier it builds on, then its own.
    fn missing_features(self) -> Vec<&'static str> {
        let (builds_on, adds): (Option<Isa>, &[&'static str]) = match self {
            Isa::Scalar => (None, &[]),
            Isa::Avx2 => (None, &["avx2", "fma"]),
            Isa::Avx512 => (
                Some(Isa::Avx2),
                &["avx512f", "avx512vl", "avx512dq", "avx512bw"],
            ),
            Isa::Avx512Bf16 => (Some(Isa::Avx512), &["avx512bw", "avx512bf16"]),
            Isa::Amx => (
                Some(Isa::Avx512Bf16),
                &["amx-tile", "amx-bf16", AMX_PERMISSION],
            ),
            Isa::Neon => (None, &["neon"]),
        };
        let mut missing = builds_on.map(Isa::missing_features).unwrap_or_default();
        missing.extend(adds.iter().copied().filter(|feature| !has_feature(feature)));
        missing
    }

    fn detected() -> &'static [Isa] {
        static DETECTED: OnceLock<Vec<Isa>> = OnceLock::new();
        DETECTED.get_or_init(|| {
            Isa::ALL
                .into_iter()
                .filter(|isa| isa.missing_features().is_empty())
                .collect()
        })
    }
}

/// Run-time detection of one feature by its `target_feature` name (also
/// for the optional features a tier's kernels use where present, such as
/// AVX-512 VNNI).
pub(super) fn has_feature(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match feature {
            "avx2" => is_x86_feature_detected!("avx2"),
            "fma" => is_x86_feature_detected!("fma"),
            "avx512f" => is_x86_feature_detected!("avx512f"),
            "avx512bw" => is_x86_feature_detected!("avx512bw"),
            "avx512vl" => is_x86_feature_detected!("avx512vl"),
            "avx512dq" => is_x86_feature_detected!("avx512dq"),
            "avx512bf16" => is_x86_feature_detected!("avx512bf16"),
            "avx512vnni" => is_x86_feature_detected!("avx512vnni"),
            "amx-tile" => amx_cpuid_bit(24),
            "amx-bf16" => amx_cpuid_bit(22),
            AMX_PERMISSION => amx_permitted(),
            _ => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        feature == "neon" && std::arch::is_aarch64_feature_detected!("neon")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = feature;
        false
    }
}

/// The "feature" that is the kernel's permission to use AMX tile data.
const AMX_PERMISSION: &str = "the kernel's permission for AMX tile data (arch_prctl)";

/// CPUID leaf 7's EDX bit `bit` (22: AMX-BF16, 24: AMX-TILE), read
/// directly: `is_x86_feature_detected!` knows them only on nightly.
#[cfg(target_arch = "x86_64")]
fn amx_cpuid_bit(bit: u32) -> bool {
    // CPUID exists on every x86-64 CPU; leaf 7 where leaf 0 says so.
    std::arch::x86_64::__cpuid(0).eax >= 7
        && (std::arch::x86_64::__cpuid_count(7, 0).edx >> bit) & 1 == 1
}

/// Asks Linux, once per process, for the AMX tile data state (Linux 5.16
/// and later hand it out on request): without it the first tile
/// instruction kills the process. Also false where the CPU lacks AMX.
#[cfg(target_arch = "x86_64")]
fn amx_permitted() -> bool {
    static PERMITTED: OnceLock<bool> = OnceLock::new();
    *PERMITTED.get_or_init(|| {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        amx_cpuid_bit(24)
            // SAFETY: arch_prctl with these arguments only changes this
            // process's permitted extended state.
            && unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) } == 0
    })
}
