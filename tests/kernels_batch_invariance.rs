//! Batch invariance of the matmul kernels: on every instruction set, each
//! token's outputs are BITWISE the same whether the token is computed alone
//! (tokens = 1) or among others, whatever path the token count selects, in a
//! grouped call, and whatever the number of threads. Random (inexact) data,
//! so that any difference in summation order shows in the last bits.

use crate::kernels_common;

use kernels_common::{
    FORMATS, FP8_FORMATS, Format, Rng, bits, random_weight, random_x, run_grouped, run_on,
};
use sparkrt::backend::cpu::kernels::Isa;
use sparkrt::checkpoint::linear::LinearWeight;

/// Legal column counts per format: with and without a tail after the last
/// whole SIMD chunk, the bench model's widths, and widths around the largest
/// a decoded panel holds (8192 f32 values per row for 3 rows).
fn cols_for(format: Format) -> &'static [usize] {
    match format {
        Format::F32 => &[1, 7, 24, 100, 768],
        Format::Bf16 => &[3, 24, 100, 768, 2085, 8192, 8224],
        Format::Nvfp4 => &[16, 48, 80, 96, 768, 2128, 2144],
        Format::Mxfp4 => &[32, 96, 160, 768, 2112],
        Format::Fp8 | Format::Fp8Block(_) => &[5, 32, 100, 768, 2085],
    }
}

/// Token counts on both sides of every path and tile boundary.
const TOKENS: [usize; 10] = [2, 3, 4, 5, 7, 8, 9, 13, 17, 33];

/// Row `t` of `[tokens, width]`.
fn row(values: &[f32], t: usize, width: usize) -> &[f32] {
    &values[t * width..(t + 1) * width]
}

#[test]
fn every_token_of_a_batch_equals_the_token_alone() {
    let mut rng = Rng::new(11);
    for isa in Isa::available() {
        for format in FORMATS.into_iter().chain(FP8_FORMATS) {
            for &cols in cols_for(format) {
                let rows = if cols > 4096 { 7 } else { 29 };
                let w = random_weight(&mut rng, format, rows, cols, 1, false);
                let w = w.view();
                let most = *TOKENS.iter().max().unwrap();
                let x = random_x(&mut rng, most * cols, false);
                let alone: Vec<Vec<f32>> = (0..most)
                    .map(|t| run_on(isa, row(&x, t, cols), 1, &w))
                    .collect();
                for tokens in TOKENS {
                    let together = run_on(isa, &x[..tokens * cols], tokens, &w);
                    for (t, alone) in alone.iter().enumerate().take(tokens) {
                        assert_eq!(
                            bits(row(&together, t, rows)),
                            bits(alone),
                            "{isa:?} {format:?} cols {cols}: token {t} of {tokens} differs from alone"
                        );
                    }
                }
            }
        }
    }
}

/// Enough rows and tokens for every kernel's widest blocks (AMX's 2 × 2
/// tiles of 32 rows × 32 tokens, beside single tiles at the edges): each
/// token of 50 equals the token alone.
#[test]
fn wide_blocks_equal_each_token_alone() {
    let mut rng = Rng::new(14);
    for isa in Isa::available() {
        for format in FORMATS.into_iter().chain(FP8_FORMATS) {
            let cols = cols_for(format)[2];
            let rows = 77;
            let w = random_weight(&mut rng, format, rows, cols, 1, false);
            let w = w.view();
            let tokens = 50;
            let x = random_x(&mut rng, tokens * cols, false);
            let together = run_on(isa, &x, tokens, &w);
            for t in 0..tokens {
                let alone = run_on(isa, row(&x, t, cols), 1, &w);
                assert_eq!(
                    bits(row(&together, t, rows)),
                    bits(&alone),
                    "{isa:?} {format:?} cols {cols}: token {t} of {tokens} differs from alone"
                );
            }
        }
    }
}

/// A grouped call of MoE-like problems (mixed formats and token counts,
/// some empty) against each token of each problem computed alone.
#[test]
fn grouped_problems_equal_each_token_alone() {
    let mut rng = Rng::new(12);
    let tokens_per_problem = [0, 1, 9, 3, 40, 1, 0, 5, 17, 2, 4, 8];
    for isa in Isa::available() {
        let weights: Vec<_> = tokens_per_problem
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let format = FORMATS[i % 4];
                let cols = cols_for(format)[i % 4];
                random_weight(&mut rng, format, 30 + 7 * i, cols, i % 3, false)
            })
            .collect();
        let xs: Vec<Vec<f32>> = weights
            .iter()
            .zip(tokens_per_problem)
            .map(|(w, t)| random_x(&mut rng, t * w.cols, false))
            .collect();
        let views: Vec<LinearWeight> = weights.iter().map(|w| w.view()).collect();
        let outs = run_grouped(isa, &views, &xs, &tokens_per_problem);
        for (p, ((w, x), out)) in views.iter().zip(&xs).zip(&outs).enumerate() {
            for t in 0..tokens_per_problem[p] {
                let alone = run_on(isa, row(x, t, w.cols), 1, w);
                assert_eq!(
                    bits(row(out, t, w.rows)),
                    bits(&alone),
                    "{isa:?} problem {p} token {t}"
                );
            }
        }
    }
}

/// Matrices big enough to be cut into many work units (and, on AVX2, into
/// row streams of different lengths) give the same bits on 1, 2 and 3
/// threads, for a decode-sized and a prefill-sized token count.
#[test]
fn thread_count_does_not_change_a_bit() {
    let mut rng = Rng::new(13);
    for isa in Isa::available() {
        for (format, rows, cols) in [
            (Format::Bf16, 1001, 2048),
            (Format::Nvfp4, 517, 768),
            (Format::Mxfp4, 333, 2112),
        ] {
            let w = random_weight(&mut rng, format, rows, cols, 0, false);
            for tokens in [1, 2, 6, 19] {
                let x = random_x(&mut rng, tokens * cols, false);
                let outputs: Vec<Vec<u32>> = [1, 2, 3]
                    .iter()
                    .map(|&threads| {
                        let pool = rayon::ThreadPoolBuilder::new()
                            .num_threads(threads)
                            .build()
                            .unwrap();
                        bits(&pool.install(|| run_on(isa, &x, tokens, &w.view())))
                    })
                    .collect();
                assert_eq!(
                    outputs[0], outputs[1],
                    "{isa:?} {format:?} tokens {tokens}: 1 vs 2 threads"
                );
                assert_eq!(
                    outputs[0], outputs[2],
                    "{isa:?} {format:?} tokens {tokens}: 1 vs 3 threads"
                );
                // And the first token equals itself computed alone.
                let alone = pool_free_alone(isa, &x[..cols], &w.view());
                assert_eq!(
                    outputs[0][..rows],
                    alone[..],
                    "{isa:?} {format:?} tokens {tokens}: alone"
                );
            }
        }
    }
}

fn pool_free_alone(isa: Isa, x: &[f32], w: &LinearWeight) -> Vec<u32> {
    bits(&run_on(isa, x, 1, w))
}
