//! Activation quantization for the integer kernels: the layout (and the
//! INT4 kernel's pairs of it), the rounding rule against an f64
//! recomputation, the special blocks, the SIMD quantizer against the scalar
//! definition bit for bit, and a scratch that is too small.

use crate::kernels_common;

use kernels_common::{Format, Rng, random_weight};
use sparkrt::backend::cpu::kernels::quantize::{
    DOUBLED_E2M1, QuantizedX, block_scale, code_position, code_scale, quantize_row, scale_position,
};
use sparkrt::backend::cpu::kernels::{
    ActivationScratch, GroupedProblem, Isa, KernelError, matmul_grouped_in, quantize_rows,
    quantizes_activations,
};
use sparkrt::formats::{E2M1, E8M0};

const BLOCK_COUNTS: [usize; 9] = [1, 2, 3, 8, 9, 10, 17, 24, 90];

#[test]
fn positions_are_a_permutation_of_the_row() {
    for blocks in BLOCK_COUNTS {
        let mut codes: Vec<usize> = (0..blocks)
            .flat_map(|b| (0..32).map(move |i| code_position(blocks, b, i)))
            .collect();
        codes.sort_unstable();
        assert_eq!(
            codes,
            (0..32 * blocks).collect::<Vec<_>>(),
            "{blocks} blocks"
        );
        let mut scales: Vec<usize> = (0..blocks).map(|b| scale_position(blocks, b)).collect();
        scales.sort_unstable();
        assert_eq!(scales, (0..blocks).collect::<Vec<_>>(), "{blocks} blocks");
    }
}

/// The INT4 kernel's view of a block (`QuantizedX::column_pairs`): the
/// codes of columns 8w + j and 8w + j + 4 of block b, and b's scale, for
/// every block of rows of 1 to 90 blocks and two tokens.
#[test]
fn column_pairs_are_the_codes_of_their_columns() {
    let mut rng = Rng::new(35);
    for blocks in BLOCK_COUNTS {
        let cols = 32 * blocks;
        let x = rng.floats(2 * cols, -4.0, 4.0);
        let mut codes = vec![0i16; 2 * cols];
        let mut scales = vec![0f32; 2 * blocks];
        for t in 0..2 {
            quantize_row(
                &x[t * cols..(t + 1) * cols],
                &mut codes[t * cols..(t + 1) * cols],
                &mut scales[t * blocks..(t + 1) * blocks],
            );
        }
        let q = QuantizedX {
            codes: &codes,
            scales: &scales,
            cols,
        };
        for t in 0..2 {
            let row = &codes[t * cols..(t + 1) * cols];
            for b in 0..blocks {
                let (pairs, scale) = q.column_pairs(t, b);
                assert_eq!(scale, scales[t * blocks + scale_position(blocks, b)]);
                for (w, word) in pairs.iter().enumerate() {
                    for (j, &pair) in word.iter().enumerate() {
                        let code = |i: usize| row[code_position(blocks, b, i)];
                        assert_eq!(pair as i16, code(8 * w + j), "{blocks} blocks, b {b}");
                        assert_eq!((pair >> 16) as i16, code(8 * w + j + 4));
                    }
                }
            }
        }
    }
}

#[test]
fn layout_matches_hand_positions() {
    // Two blocks: group g of block 0 at 16g, of block 1 at 16g + 8; groups
    // are the values ≡ 0, 2, 1, 3 mod 4.
    assert_eq!(code_position(2, 0, 0), 0);
    assert_eq!(code_position(2, 0, 4), 1);
    assert_eq!(code_position(2, 0, 2), 16);
    assert_eq!(code_position(2, 0, 1), 32);
    assert_eq!(code_position(2, 0, 31), 48 + 7);
    assert_eq!(code_position(2, 1, 0), 8);
    assert_eq!(code_position(2, 1, 3), 56);
    // The lone third block of three: its groups 8 apart, after the pair.
    assert_eq!(code_position(3, 2, 0), 64);
    assert_eq!(code_position(3, 2, 2), 72);
    assert_eq!(code_position(3, 2, 31), 64 + 24 + 7);
    // Scales: whole groups of 8 as 0 2 4 6 1 3 5 7, the rest in order.
    let order: Vec<usize> = (0..8).map(|b| scale_position(9, b)).collect();
    assert_eq!(order, [0, 4, 1, 5, 2, 6, 3, 7]);
    assert_eq!(scale_position(9, 8), 8);
    assert_eq!(scale_position(7, 5), 5);
}

/// The weights' side: codes become twice their E2M1 value, and a scale
/// byte its E8M0 value over the 512 a code in a word's high byte carries.
#[test]
fn weight_codes_and_scales_match_the_format_tables() {
    for (code, &doubled) in DOUBLED_E2M1.iter().enumerate() {
        assert_eq!(doubled as f32, 2.0 * E2M1[code], "code {code}");
    }
    for byte in 0..=255u8 {
        // Bit patterns, so that the NaN of byte 0xFF compares too.
        assert_eq!(
            (code_scale(byte) * 512.0).to_bits(),
            E8M0[byte as usize].to_bits(),
            "byte {byte}"
        );
    }
}

#[test]
fn block_scale_keeps_15_bits_of_the_largest_value() {
    assert_eq!(block_scale(3.0), 2f32.powi(1 - 14));
    assert_eq!(block_scale(4.0), 2f32.powi(2 - 14));
    assert_eq!(block_scale(0.999), 2f32.powi(-1 - 14));
    assert!(block_scale(f32::INFINITY).is_nan());
    assert!(block_scale(f32::NAN).is_nan());
    // Tiny blocks stay on a normal scale.
    assert!(block_scale(0.0).is_normal());
    assert!(block_scale(1e-40).is_normal());
}

/// Each code is x / scale rounded to nearest, ties to even, saturated to
/// int16, recomputed in f64.
#[test]
fn codes_round_to_nearest_even_within_half_a_step() {
    let mut rng = Rng::new(21);
    let blocks = 5;
    for _ in 0..50 {
        let x: Vec<f32> = (0..32 * blocks).map(|_| rng.uniform(-7.0, 7.0)).collect();
        let (mut codes, mut scales) = (vec![0i16; x.len()], vec![0f32; blocks]);
        quantize_row(&x, &mut codes, &mut scales);
        for b in 0..blocks {
            let block = &x[32 * b..32 * (b + 1)];
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let step = 2f64.powi(amax.log2().floor() as i32 - 14);
            assert_eq!(scales[scale_position(blocks, b)] as f64, step);
            for (i, &v) in block.iter().enumerate() {
                let want = (v as f64 / step).round_ties_even().clamp(-32768.0, 32767.0);
                let q = codes[code_position(blocks, b, i)];
                assert_eq!(q as f64, want, "block {b} value {i}: {v}");
                assert!((q as f64 * step - v as f64).abs() <= step);
            }
        }
    }
}

#[test]
fn special_blocks() {
    // Block 0: small integers (exact); 1: zeros; 2: a NaN; 3: an infinity;
    // 4: ties (odd multiples of half a step).
    let mut x = vec![0.0f32; 32 * 5];
    for i in 0..32 {
        x[i] = (i as f32) - 16.0;
        x[64 + i] = 1.0;
        x[96 + i] = -2.0;
        x[128 + i] = (2 * i as i32 - 31) as f32 * 0.5 * 2f32.powi(-14);
    }
    x[64 + 5] = f32::NAN;
    x[96 + 7] = f32::NEG_INFINITY;
    x[128] = 1.0; // amax 1: step 2^-14, so the others are ties
    let (mut codes, mut scales) = (vec![7i16; x.len()], vec![0f32; 5]);
    quantize_row(&x, &mut codes, &mut scales);
    let code = |b: usize, i: usize| codes[code_position(5, b, i)];
    let scale = |b: usize| scales[scale_position(5, b)];
    for (i, &v) in x[..32].iter().enumerate() {
        assert_eq!(code(0, i) as f32 * scale(0), v);
        assert_eq!(code(1, i), 0);
        assert_eq!(code(2, i), 0);
        assert_eq!(code(3, i), 0);
    }
    assert!(scale(2).is_nan() && scale(3).is_nan());
    // Ties go to even: -29/2 → -14, -1/2 → 0, 1/2 → 0, 3/2 → 2.
    assert_eq!(code(4, 1), -14);
    assert_eq!(code(4, 15), 0);
    assert_eq!(code(4, 16), 0);
    assert_eq!(code(4, 17), 2);
    assert_eq!(code(4, 0), 16384);
    // Saturation: 2 - 2^-15 is 32767.5 steps of 2^-14, which rounds to
    // 2^15 and is held as 32767.
    let mut top = vec![0.0f32; 32];
    top[3] = 2.0 - 2f32.powi(-15);
    top[4] = -(2.0 - 2f32.powi(-15));
    let (mut c, mut s) = (vec![0i16; 32], vec![0f32; 1]);
    quantize_row(&top, &mut c, &mut s);
    assert_eq!(s[0], 2f32.powi(-14));
    assert_eq!(c[code_position(1, 0, 3)], 32767);
    assert_eq!(c[code_position(1, 0, 4)], -32768);
}

/// `quantize_rows` (AVX2 where present) is the scalar definition bit for bit.
#[test]
fn fast_quantizer_matches_the_definition() {
    let mut rng = Rng::new(22);
    for blocks in BLOCK_COUNTS {
        let cols = 32 * blocks;
        let tokens = 3;
        let mut x: Vec<f32> = (0..tokens * cols)
            .map(|i| match i % 97 {
                0 => 0.0,
                1 => 2f32.powi(-14) * 0.5 * (2 * (i % 7) as i32 + 1) as f32,
                2 => 2.0 - 2f32.powi(-15),
                3 => -(2.0 - 2f32.powi(-15)),
                _ => rng.uniform(-3.0, 3.0) * 2f32.powi((i % 13) as i32 - 6),
            })
            .collect();
        if blocks > 2 {
            x[40] = f32::NAN;
            x[cols + 70] = f32::INFINITY;
            x[2 * cols..2 * cols + 32].fill(0.0);
        }
        let mut codes = vec![0i16; x.len()];
        let mut scales = vec![0f32; x.len() / 32];
        quantize_rows(&x, cols, &mut codes, &mut scales).unwrap();
        for t in 0..tokens {
            let (mut c, mut s) = (vec![0i16; cols], vec![0f32; blocks]);
            quantize_row(&x[t * cols..(t + 1) * cols], &mut c, &mut s);
            assert_eq!(
                &codes[t * cols..(t + 1) * cols],
                &c[..],
                "{blocks} blocks, token {t}"
            );
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&scales[t * blocks..(t + 1) * blocks]), bits(&s));
        }
    }
}

#[test]
fn a_scratch_too_small_is_an_error() {
    let mut rng = Rng::new(23);
    let w = random_weight(&mut rng, Format::Mxfp4, 8, 64, 0, false);
    if !quantizes_activations(Isa::best(), &w.view()) {
        println!(
            "skipped: {:?} does not quantize MXFP4 activations",
            Isa::best()
        );
        return;
    }
    let x = vec![1.0f32; 3 * 64];
    let mut out = vec![0.0f32; 3 * 8];
    let mut scratch = ActivationScratch::from_buffers(vec![0; 128], vec![0.0; 4]);
    let err = matmul_grouped_in(
        &mut [GroupedProblem {
            x: &x,
            tokens: 3,
            weight: w.view(),
            out: &mut out,
        }],
        &mut scratch,
    )
    .unwrap_err();
    assert_eq!(
        err,
        KernelError::ScratchTooSmall {
            needed: 192,
            capacity: 128
        }
    );
    // Room for exactly the call: it runs.
    let mut scratch = ActivationScratch::from_buffers(vec![0; 192], vec![0.0; 6]);
    let mut problems = [GroupedProblem {
        x: &x,
        tokens: 3,
        weight: w.view(),
        out: &mut out,
    }];
    matmul_grouped_in(&mut problems, &mut scratch).unwrap();
}

/// Problems reading one input (an expert's gate and up) quantize it once:
/// a scratch with room for that input alone runs them, and each output is
/// what the problem gives alone. A BF16 problem on the same input first
/// does not count.
#[test]
fn problems_sharing_an_input_quantize_it_once() {
    let mut rng = Rng::new(24);
    let (cols, tokens) = (96, 3);
    let bf16 = random_weight(&mut rng, Format::Bf16, 5, cols, 0, false);
    let gate = random_weight(&mut rng, Format::Mxfp4, 7, cols, 0, false);
    let up = random_weight(&mut rng, Format::Mxfp4, 9, cols, 1, false);
    if !quantizes_activations(Isa::best(), &gate.view()) {
        println!(
            "skipped: {:?} does not quantize MXFP4 activations",
            Isa::best()
        );
        return;
    }
    let x = kernels_common::random_x(&mut rng, tokens * cols, false);
    let alone: Vec<Vec<f32>> = [&bf16, &gate, &up]
        .iter()
        .map(|w| {
            kernels_common::run_grouped(
                Isa::best(),
                &[w.view()],
                std::slice::from_ref(&x),
                &[tokens],
            )
            .remove(0)
        })
        .collect();
    let mut outs: Vec<Vec<f32>> = [5, 7, 9].iter().map(|r| vec![0.0; r * tokens]).collect();
    let mut scratch =
        ActivationScratch::from_buffers(vec![0; tokens * cols], vec![0.0; tokens * cols / 32]);
    {
        let [a, b, c] = &mut outs[..] else {
            unreachable!()
        };
        let mut problems = [
            GroupedProblem {
                x: &x,
                tokens,
                weight: bf16.view(),
                out: a,
            },
            GroupedProblem {
                x: &x,
                tokens,
                weight: gate.view(),
                out: b,
            },
            GroupedProblem {
                x: &x,
                tokens,
                weight: up.view(),
                out: c,
            },
        ];
        matmul_grouped_in(&mut problems, &mut scratch).unwrap();
    }
    assert_eq!(outs, alone);
}
