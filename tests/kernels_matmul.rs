//! matmul / matmul_grouped on every instruction set of this CPU against the
//! scalar reference: awkward shapes, misaligned weight bytes, all FP4 codes.

use crate::kernels_common;

use kernels_common::{
    FORMATS, FP8_FORMATS, Format, OwnedWeight, Rng, bf16_rounding_bound, bits, quantization_bound,
    random_weight, random_x, run_grouped, run_on, tolerance,
};
use sparkrt::backend::cpu::kernels::{
    GroupedProblem, Isa, KernelError, add_bias_bf16, matmul, matmul_grouped, quantizes_activations,
    reference, rounds_activations_to_bf16,
};
use sparkrt::checkpoint::linear::{LinearWeight, WeightData};
use sparkrt::formats::{E2M1, E4M3, E8M0, bf16_to_f32, f32_to_bf16};

/// Column counts that are legal for a format and not multiples of the SIMD
/// chunk (8 / 16 / 64), plus one above the kernels' 2048-column panel.
fn awkward_cols(format: Format) -> &'static [usize] {
    match format {
        Format::F32 => &[1, 7, 100, 2100],
        Format::Bf16 => &[3, 24, 100, 2085],
        Format::Nvfp4 => &[16, 32, 48, 64, 96, 416, 2128, 2144],
        Format::Mxfp4 => &[32, 96, 160, 2112],
        Format::Fp8 | Format::Fp8Block(_) => &[1, 31, 33, 128, 200, 2085],
    }
}

const TOKENS: [usize; 8] = [1, 2, 3, 4, 5, 17, 64, 0];
const ROWS: [usize; 3] = [1, 13, 30];

/// Integer-like data: every order of summation gives the exact result, so
/// any decoding or layout slip shows up as an inequality.
#[test]
fn exact_on_every_isa_shape_and_offset() {
    let mut rng = Rng::new(1);
    for isa in Isa::available() {
        for format in FORMATS.into_iter().chain(FP8_FORMATS) {
            for &cols in awkward_cols(format) {
                for rows in ROWS {
                    for offset in [0, 1, 2] {
                        let w = random_weight(&mut rng, format, rows, cols, offset, true);
                        for tokens in TOKENS {
                            if cols > 1000 && tokens > 17 {
                                continue; // keep the scalar reference quick
                            }
                            let x = random_x(&mut rng, tokens * cols, true);
                            let (want, _) = reference::matmul(&x, tokens, &w.view());
                            let got = run_on(isa, &x, tokens, &w.view());
                            assert_eq!(
                                got, want,
                                "{isa:?} {format:?} rows {rows} cols {cols} tokens {tokens} offset {offset}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Random data: within a summation-order bound of the f64 reference (plus,
/// where the instruction set quantizes the activations, the bound of that).
#[test]
fn random_within_summation_tolerance() {
    let mut rng = Rng::new(2);
    for isa in Isa::available() {
        for format in FORMATS.into_iter().chain(FP8_FORMATS) {
            for &cols in awkward_cols(format) {
                let rows = 13;
                let w = random_weight(&mut rng, format, rows, cols, 1, false);
                for tokens in [1, 3, 4, 9, 17, 64] {
                    let x = random_x(&mut rng, tokens * cols, false);
                    let (want, magnitude) = reference::matmul(&x, tokens, &w.view());
                    let got = run_on(isa, &x, tokens, &w.view());
                    let quantized = quantizes_activations(isa, &w.view());
                    let rounded = rounds_activations_to_bf16(isa, &w.view());
                    for i in 0..got.len() {
                        let (t, r) = (i / rows, i % rows);
                        let mut tol = tolerance(cols, magnitude[i]);
                        if quantized {
                            tol += quantization_bound(&x[t * cols..(t + 1) * cols], &w.view(), r);
                        }
                        if rounded {
                            tol += bf16_rounding_bound(&x[t * cols..(t + 1) * cols], &w.view(), r);
                        }
                        assert!(
                            (got[i] - want[i]).abs() <= tol,
                            "{isa:?} {format:?} cols {cols} tokens {tokens} [{i}]: {} vs {} (tol {tol})",
                            got[i],
                            want[i]
                        );
                    }
                }
            }
        }
    }
}

/// FP8 block scales over several 128-row and 128-column blocks, ragged at
/// both edges: each element takes its own block's scale, on every path.
#[test]
fn fp8_block_scales_apply_to_their_own_blocks() {
    let mut rng = Rng::new(3);
    for isa in Isa::available() {
        for format in FP8_FORMATS {
            let w = random_weight(&mut rng, format, 300, 290, 1, true);
            for tokens in [1, 2, 9] {
                let x = random_x(&mut rng, tokens * 290, true);
                let (want, _) = reference::matmul(&x, tokens, &w.view());
                let got = run_on(isa, &x, tokens, &w.view());
                assert_eq!(got, want, "{isa:?} {format:?} tokens {tokens}");
            }
        }
    }
}

/// Many problems in one call (MoE-like: most experts empty, a few with 1-40
/// rows, different formats) give what each gives alone.
#[test]
fn grouped_matches_each_problem_alone() {
    let mut rng = Rng::new(3);
    for isa in Isa::available() {
        let tokens_per_problem = [0, 1, 0, 3, 40, 1, 0, 0, 17, 2, 1, 8];
        let weights: Vec<OwnedWeight> = tokens_per_problem
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let format = FORMATS[i % 4];
                let cols = awkward_cols(format)[1 + i % 3];
                random_weight(&mut rng, format, 20 + i, cols, i % 3, true)
            })
            .collect();
        let xs: Vec<Vec<f32>> = weights
            .iter()
            .zip(tokens_per_problem)
            .map(|(w, t)| random_x(&mut rng, t * w.cols, true))
            .collect();
        let views: Vec<LinearWeight> = weights.iter().map(|w| w.view()).collect();
        let outs = run_grouped(isa, &views, &xs, &tokens_per_problem);
        for (i, ((w, x), out)) in views.iter().zip(&xs).zip(&outs).enumerate() {
            let (want, _) = reference::matmul(x, tokens_per_problem[i], w);
            assert_eq!(out, &want, "{isa:?} problem {i}");
        }
    }
}

/// The best-ISA entry points agree with the explicit ones.
#[test]
fn matmul_uses_the_best_isa() {
    let mut rng = Rng::new(4);
    let w = random_weight(&mut rng, Format::Bf16, 30, 100, 0, true);
    let x = random_x(&mut rng, 5 * 100, true);
    let mut out = vec![0.0; 5 * 30];
    matmul(&x, 5, &w.view(), &mut out).unwrap();
    assert_eq!(out, run_on(Isa::best(), &x, 5, &w.view()));
    let mut out2 = vec![0.0; 5 * 30];
    matmul_grouped(&mut [GroupedProblem {
        x: &x,
        tokens: 5,
        weight: w.view(),
        out: &mut out2,
    }])
    .unwrap();
    assert_eq!(out, out2);
}

/// One row of 16 FP4 codes 0..15 each, against the E2M1 table by hand.
#[test]
fn fp4_codes_decode_to_the_e2m1_table() {
    // Codes 0..15 in order: byte j holds codes 2j (low) and 2j+1 (high).
    let codes: Vec<u8> = (0..32u8)
        .map(|j| (((2 * j + 1) % 16) << 4) | ((2 * j) % 16))
        .collect();
    for isa in Isa::available() {
        // NVFP4: scale 0x38 = 1.0, global 1: W[0, c] = E2M1[c % 16].
        let scales = vec![0x38u8; 4];
        let w = LinearWeight {
            rows: 1,
            cols: 64,
            data: WeightData::Nvfp4 {
                packed: &codes,
                scales: &scales,
                global: 1.0,
            },
        };
        for c in 0..64 {
            let mut x = vec![0.0f32; 64];
            x[c] = 1.0;
            assert_eq!(
                run_on(isa, &x, 1, &w),
                vec![E2M1[c % 16]],
                "{isa:?} NVFP4 col {c}"
            );
        }
        // MXFP4: scale 127 = 1.0.
        let scales = vec![127u8; 2];
        let w = LinearWeight {
            rows: 1,
            cols: 64,
            data: WeightData::Mxfp4 {
                blocks: &codes,
                scales: &scales,
            },
        };
        for c in 0..64 {
            let mut x = vec![0.0f32; 64];
            x[c] = 1.0;
            assert_eq!(
                run_on(isa, &x, 1, &w),
                vec![E2M1[c % 16]],
                "{isa:?} MXFP4 col {c}"
            );
        }
    }
}

/// Each 16-block of an NVFP4 row (and each 32-block of MXFP4) uses its own scale.
#[test]
fn fp4_block_scales_apply_to_their_own_columns() {
    let codes = vec![0x22u8; 64]; // every element code 2 = 1.0
    let nv_scales = [0x30u8, 0x38, 0x40, 0x48, 0x50, 0x58, 0x60, 0x68]; // 0.5, 1, 2, ... 64
    let mx_scales = [126u8, 127, 128, 129];
    for isa in Isa::available() {
        let w = LinearWeight {
            rows: 1,
            cols: 128,
            data: WeightData::Nvfp4 {
                packed: &codes,
                scales: &nv_scales,
                global: 0.25,
            },
        };
        for c in 0..128 {
            let mut x = vec![0.0f32; 128];
            x[c] = 1.0;
            let want = E4M3[nv_scales[c / 16] as usize] * 0.25;
            assert_eq!(run_on(isa, &x, 1, &w), vec![want], "{isa:?} NVFP4 col {c}");
        }
        let w = LinearWeight {
            rows: 1,
            cols: 128,
            data: WeightData::Mxfp4 {
                blocks: &codes,
                scales: &mx_scales,
            },
        };
        for c in 0..128 {
            let mut x = vec![0.0f32; 128];
            x[c] = 1.0;
            let want = E8M0[mx_scales[c / 32] as usize];
            assert_eq!(run_on(isa, &x, 1, &w), vec![want], "{isa:?} MXFP4 col {c}");
        }
    }
}

#[test]
fn decode_tables_match_hand_values() {
    assert_eq!(E4M3[0x38], 1.0);
    assert_eq!(E4M3[0x7E], 448.0);
    assert_eq!(E4M3[0xFE], -448.0);
    assert_eq!(E4M3[0x01], 2f32.powi(-9));
    assert_eq!(E4M3[0x07], 7.0 * 2f32.powi(-9));
    assert_eq!(E4M3[0x08], 2f32.powi(-6));
    assert_eq!(E4M3[0x3C], 1.5);
    assert!(E4M3[0x7F].is_nan() && E4M3[0xFF].is_nan());
    assert_eq!(E4M3[0x80], 0.0);
    assert_eq!(E8M0[127], 1.0);
    assert_eq!(E8M0[130], 8.0);
    assert_eq!(E8M0[0], 2f32.powi(-127));
    assert_eq!(E2M1[7], 6.0);
    assert_eq!(E2M1[9], -0.5);
    assert_eq!(bf16_to_f32(0x3F80), 1.0);
    assert_eq!(f32_to_bf16(1.0), 0x3F80);
    // Halfway cases round to even; just above rounds up.
    assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8001)), 0x3F81);
    assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
}

#[test]
fn shape_errors_are_reported_not_panicked() {
    let bytes = vec![0u8; 64];
    let x = [0.0f32; 32];
    let mut out = vec![0.0f32; 4];
    // BF16 [4, 8] needs 64 bytes: fine; [4, 9] does not fit.
    let w = LinearWeight {
        rows: 4,
        cols: 9,
        data: WeightData::Bf16(&bytes),
    };
    assert!(matches!(
        matmul(&x[..9], 1, &w, &mut out),
        Err(KernelError::WeightBytes {
            expected: 72,
            got: 64,
            ..
        })
    ));
    // NVFP4 with cols not a multiple of 16.
    let w = LinearWeight {
        rows: 1,
        cols: 24,
        data: WeightData::Nvfp4 {
            packed: &bytes[..12],
            scales: &bytes[..1],
            global: 1.0,
        },
    };
    assert!(matches!(
        matmul(&x[..24], 1, &w, &mut out[..1]),
        Err(KernelError::ColsNotBlockMultiple { multiple: 16, .. })
    ));
    // x and out lengths.
    let w = LinearWeight {
        rows: 4,
        cols: 8,
        data: WeightData::Bf16(&bytes),
    };
    assert!(matches!(
        matmul(&x[..7], 1, &w, &mut out),
        Err(KernelError::Length { what: "x", .. })
    ));
    assert!(matches!(
        matmul(&x[..8], 1, &w, &mut out[..3]),
        Err(KernelError::Length { what: "out", .. })
    ));
}

#[test]
fn bias_is_added_to_every_token() {
    let bias: Vec<u8> = [1.0f32, -2.5, 0.25]
        .iter()
        .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
        .collect();
    let mut out = vec![1.0f32, 1.0, 1.0, 0.0, 0.0, 0.0];
    add_bias_bf16(&mut out, 3, &bias[..]);
    assert_eq!(out, vec![2.0, -1.5, 1.25, 1.0, -2.5, 0.25]);
    // Misaligned bias bytes.
    let mut shifted = vec![0u8];
    shifted.extend(&bias);
    let mut out = vec![0.0f32; 3];
    add_bias_bf16(&mut out, 3, &shifted[1..]);
    assert_eq!(out, vec![1.0, -2.5, 0.25]);
}

/// The SIMD path this CPU should get is the one picked (unless SPARKRT_ISA
/// chose another): the fastest tier that keeps the activations in f32.
#[test]
fn best_isa_is_the_simd_one_this_cpu_has() {
    #[cfg(target_arch = "x86_64")]
    if std::env::var("SPARKRT_ISA").is_err() {
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let avx512 =
            avx2 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl");
        let bf16 = avx512
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512bf16");
        // The AVX-512 BF16 tier rounds activations: available, never the default.
        if avx512 {
            assert_eq!(Isa::best(), Isa::Avx512);
        } else if avx2 {
            assert_eq!(Isa::best(), Isa::Avx2);
        }
        assert_eq!(Isa::available().contains(&Isa::Avx512), avx512);
        assert_eq!(Isa::available().contains(&Isa::Avx512Bf16), bf16);
        // AMX also needs the kernel's permission: available only on top of
        // AVX-512 BF16, and never the default either.
        if Isa::available().contains(&Isa::Amx) {
            assert!(bf16);
        }
    }
    #[cfg(target_arch = "aarch64")]
    assert_eq!(Isa::best(), Isa::Neon);
    assert!(Isa::available().contains(&Isa::Scalar));
}

/// The AVX-512 tier promises the AVX2 tier's bits (its NVFP4 decoder and
/// its row-pair panel are faster routes to the same products): every
/// format, awkward shapes and misaligned bytes, GEMV and panel token counts,
/// odd row counts and several panel blocks (the pair panel's lone last row,
/// its prefetch of the next block), random data.
#[test]
fn avx512_tier_gives_the_avx2_bits() {
    if !Isa::Avx512.is_available() {
        eprintln!("skipped: this CPU lacks AVX-512F/VL/DQ/BW (the avx512 tier)");
        return;
    }
    let mut rng = Rng::new(21);
    for format in FORMATS.into_iter().chain(FP8_FORMATS) {
        for &cols in awkward_cols(format) {
            for (offset, rows) in [(0, 29), (1, 29), (0, 53)] {
                let w = random_weight(&mut rng, format, rows, cols, offset, false);
                for tokens in [1, 2, 3, 5, 17] {
                    let x = random_x(&mut rng, tokens * cols, false);
                    assert_eq!(
                        bits(&run_on(Isa::Avx512, &x, tokens, &w.view())),
                        bits(&run_on(Isa::Avx2, &x, tokens, &w.view())),
                        "{format:?} cols {cols} tokens {tokens} offset {offset}"
                    );
                }
            }
        }
    }
}

/// Zero input columns: every output is an empty sum, 0, on every path.
#[test]
fn zero_columns_give_zeros() {
    for isa in Isa::available() {
        for tokens in [1, 5, 17] {
            let w = LinearWeight {
                rows: 7,
                cols: 0,
                data: WeightData::Bf16(&[]),
            };
            assert_eq!(
                run_on(isa, &[], tokens, &w),
                vec![0.0; 7 * tokens],
                "{isa:?}"
            );
        }
    }
}

/// All-zero weights (FP4 codes +0 and −0) or all-zero inputs give zeros.
#[test]
fn zeros_in_give_zeros_out() {
    let mut rng = Rng::new(6);
    for isa in Isa::available() {
        for format in FORMATS {
            let cols = awkward_cols(format)[2];
            let mut w = random_weight(&mut rng, format, 9, cols, 1, false);
            for tokens in [1, 17] {
                let zeros = vec![0.0f32; tokens * cols];
                let out = run_on(isa, &zeros, tokens, &w.view());
                assert!(out.iter().all(|&v| v == 0.0), "{isa:?} {format:?} zero x");
            }
            // Zero the weights: 0x88 holds two −0 codes, 0x00 two +0 codes.
            let fill = if matches!(format, Format::Nvfp4 | Format::Mxfp4) {
                0x88
            } else {
                0x00
            };
            let offset = w.offset;
            w.data[offset..].fill(fill);
            for tokens in [1, 17] {
                let x = random_x(&mut rng, tokens * cols, false);
                let out = run_on(isa, &x, tokens, &w.view());
                assert!(out.iter().all(|&v| v == 0.0), "{isa:?} {format:?} zero W");
            }
        }
    }
}
