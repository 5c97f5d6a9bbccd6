//! Shared helpers of the kernel tests: a seeded generator and owned weight
//! matrices in every format, stored at a chosen byte offset so that the
//! kernels see misaligned slices like the ones a memory map hands out.
#![allow(dead_code)]

use sparkrt::checkpoint::linear::{Fp8Scales, LinearWeight, WeightData};
use sparkrt::formats::{ScaleType, f32_to_bf16};

/// SplitMix64: small, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
    /// Uniform integer in lo..=hi.
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }
    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
    pub fn floats(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Format {
    F32,
    Bf16,
    Nvfp4,
    Mxfp4,
    /// FP8 E4M3 with one per-tensor scale (`global`).
    Fp8,
    /// FP8 E4M3 with 128 × 128 block scales stored as the given type.
    Fp8Block(ScaleType),
}

pub const FORMATS: [Format; 4] = [Format::F32, Format::Bf16, Format::Nvfp4, Format::Mxfp4];

/// The FP8 formats (the CPU backend's only: CUDA refuses them).
pub const FP8_FORMATS: [Format; 4] = [
    Format::Fp8,
    Format::Fp8Block(ScaleType::F32),
    Format::Fp8Block(ScaleType::Bf16),
    Format::Fp8Block(ScaleType::F16),
];

/// A weight matrix that owns its bytes; `data` and `scales` start at `offset`.
pub struct OwnedWeight {
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    pub offset: usize,
    pub data: Vec<u8>,
    pub scales: Vec<u8>,
    pub global: f32,
}

impl OwnedWeight {
    pub fn view(&self) -> LinearWeight<'_> {
        let data = &self.data[self.offset..];
        let scales = &self.scales[self.offset.min(self.scales.len())..];
        let data = match self.format {
            Format::F32 => WeightData::F32(data),
            Format::Bf16 => WeightData::Bf16(data),
            Format::Nvfp4 => WeightData::Nvfp4 {
                packed: data,
                scales,
                global: self.global,
            },
            Format::Mxfp4 => WeightData::Mxfp4 {
                blocks: data,
                scales,
            },
            Format::Fp8 => WeightData::Fp8 {
                values: data,
                scales: Fp8Scales::Tensor(self.global),
            },
            Format::Fp8Block(dtype) => WeightData::Fp8 {
                values: data,
                scales: Fp8Scales::Block {
                    bytes: scales,
                    dtype,
                },
            },
        };
        LinearWeight {
            rows: self.rows,
            cols: self.cols,
            data,
        }
    }
}

fn with_offset(offset: usize, bytes: impl IntoIterator<Item = u8>) -> Vec<u8> {
    let mut v = vec![0xA5u8; offset];
    v.extend(bytes);
    v
}

/// Random weights. `exact` keeps every value a small multiple of a power of
/// two, so that any summation order gives the same f32 result.
pub fn random_weight(
    rng: &mut Rng,
    format: Format,
    rows: usize,
    cols: usize,
    offset: usize,
    exact: bool,
) -> OwnedWeight {
    let n = rows * cols;
    let (data, scales, global) = match format {
        Format::F32 => {
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    if exact {
                        rng.int(-4, 4) as f32
                    } else {
                        rng.uniform(-1.0, 1.0)
                    }
                })
                .collect();
            (
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                vec![],
                1.0,
            )
        }
        Format::Bf16 => {
            let values: Vec<u16> = (0..n)
                .map(|_| {
                    let v = if exact {
                        rng.int(-8, 8) as f32 * 0.25
                    } else {
                        rng.uniform(-1.0, 1.0)
                    };
                    f32_to_bf16(v)
                })
                .collect();
            (
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                vec![],
                1.0,
            )
        }
        Format::Nvfp4 => {
            let codes: Vec<u8> = (0..n / 2).map(|_| rng.byte()).collect();
            let scales: Vec<u8> = (0..n / 16)
                .map(|_| {
                    if exact {
                        // e4m3 powers of two 2^-2..2^2: exponent field 5..9, mantissa 0.
                        (rng.int(5, 9) as u8) << 3 | (rng.byte() & 0x80)
                    } else {
                        // Any finite e4m3 (subnormals and zero included), not NaN.
                        let b = rng.byte();
                        if b & 0x7F == 0x7F { b & 0xF8 } else { b }
                    }
                })
                .collect();
            (codes, scales, if exact { 0.5 } else { 0.0371 })
        }
        Format::Mxfp4 => {
            let codes: Vec<u8> = (0..n / 2).map(|_| rng.byte()).collect();
            let scales: Vec<u8> = (0..n / 32)
                .map(|_| {
                    if exact {
                        rng.int(125, 129) as u8
                    } else {
                        rng.int(110, 135) as u8
                    }
                })
                .collect();
            (codes, scales, 1.0)
        }
        Format::Fp8 | Format::Fp8Block(_) => {
            let values: Vec<u8> = (0..n)
                .map(|_| {
                    if exact {
                        // ±2^-2..2^2 × (1 + m/8): exponent field 5..9.
                        (rng.int(5, 9) as u8) << 3 | (rng.byte() & 0x87)
                    } else {
                        // Any finite e4m3 (subnormals and zeros included), not NaN.
                        let b = rng.byte();
                        if b & 0x7F == 0x7F { b & 0xF8 } else { b }
                    }
                })
                .collect();
            let blocks = rows.div_ceil(128) * cols.div_ceil(128);
            let scales: Vec<f32> = (0..blocks)
                .map(|_| {
                    if exact {
                        2f32.powi(rng.int(-1, 1) as i32)
                    } else {
                        rng.uniform(0.001, 0.05)
                    }
                })
                .collect();
            let scales = match format {
                Format::Fp8Block(ScaleType::F32) => {
                    scales.iter().flat_map(|v| v.to_le_bytes()).collect()
                }
                Format::Fp8Block(ScaleType::Bf16) => scales
                    .iter()
                    .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
                    .collect(),
                Format::Fp8Block(ScaleType::F16) => scales
                    .iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
                    .collect(),
                _ => vec![],
            };
            (values, scales, if exact { 0.5 } else { 0.0371 })
        }
    };
    OwnedWeight {
        format,
        rows,
        cols,
        offset,
        data: with_offset(offset, data),
        scales: with_offset(offset, scales),
        global,
    }
}

/// Activations: small integers when `exact`, else uniform with a few zeros.
pub fn random_x(rng: &mut Rng, n: usize, exact: bool) -> Vec<f32> {
    (0..n)
        .map(|i| {
            if exact {
                rng.int(-3, 3) as f32
            } else if i % 11 == 0 {
                0.0
            } else {
                rng.uniform(-2.0, 2.0)
            }
        })
        .collect()
}

/// How far quantizing the activations can move `W[row] · x`: each value is
/// rounded to a multiple of its 32-block's step `2^(E − 14)`, `2^E` the
/// block's largest power of two (the rule `kernels::quantize` documents),
/// so it moves by at most a step (half, unless saturated), times |w|.
pub fn quantization_bound(x: &[f32], w: &LinearWeight, row: usize) -> f32 {
    x.chunks(32)
        .enumerate()
        .map(|(b, block)| {
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let step = if amax == 0.0 {
                0.0
            } else {
                2f32.powi(amax.log2().floor() as i32 - 14)
            };
            (0..32)
                .map(|i| {
                    sparkrt::backend::cpu::kernels::weights::weight_at(w, row, 32 * b + i).abs()
                        * step
                })
                .sum::<f32>()
        })
        .sum()
}

/// How far rounding the activations to bf16 (the AVX-512 BF16 tier's BF16
/// kernels) moves `W[row] · x`: Σ |w| · |x − bf16(x)|, exactly.
pub fn bf16_rounding_bound(x: &[f32], w: &LinearWeight, row: usize) -> f32 {
    x.iter()
        .enumerate()
        .map(|(c, &v)| {
            let rounded = sparkrt::formats::bf16_to_f32(sparkrt::formats::f32_to_bf16(v));
            sparkrt::backend::cpu::kernels::weights::weight_at(w, row, c).abs()
                * (v - rounded).abs()
        })
        .sum()
}

/// Summation-order error bound: a few √n·ε of the sum of |terms|.
pub fn tolerance(cols: usize, magnitude: f32) -> f32 {
    4.0 * (cols as f32).sqrt() * f32::EPSILON * magnitude + 1e-30
}

/// `w` against `x` (`tokens` rows) alone in one call on `isa`; the output
/// `[tokens, rows]`.
pub fn run_on(
    isa: sparkrt::backend::cpu::kernels::Isa,
    x: &[f32],
    tokens: usize,
    w: &LinearWeight,
) -> Vec<f32> {
    use sparkrt::backend::cpu::kernels::{GroupedProblem, matmul_grouped_on};
    let mut out = vec![f32::NAN; tokens * w.rows];
    let mut problems = [GroupedProblem {
        x,
        tokens,
        weight: *w,
        out: &mut out,
    }];
    matmul_grouped_on(isa, &mut problems).unwrap();
    out
}

/// The bits of `values`, for bitwise comparisons that print readably.
pub fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Runs `weights[i]` against `xs[i]` (`tokens[i]` rows each) in ONE grouped
/// call on `isa`; returns each problem's output, `[tokens[i], rows]`.
pub fn run_grouped(
    isa: sparkrt::backend::cpu::kernels::Isa,
    weights: &[LinearWeight],
    xs: &[Vec<f32>],
    tokens: &[usize],
) -> Vec<Vec<f32>> {
    use sparkrt::backend::cpu::kernels::{GroupedProblem, matmul_grouped_on};
    let mut outs: Vec<Vec<f32>> = weights
        .iter()
        .zip(tokens)
        .map(|(w, &t)| vec![f32::NAN; t * w.rows])
        .collect();
    let mut problems: Vec<GroupedProblem> = weights
        .iter()
        .zip(xs)
        .zip(outs.iter_mut())
        .zip(tokens)
        .map(|(((w, x), out), &tokens)| GroupedProblem {
            x,
            tokens,
            weight: *w,
            out,
        })
        .collect();
    matmul_grouped_on(isa, &mut problems).unwrap();
    drop(problems);
    outs
}
