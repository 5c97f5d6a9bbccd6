//! Greedy sampling's cost per row: the scan of a whole logits row that every
//! sampled row of every step pays on the host (the CUDA backend hands the
//! logits back host-mapped), at Qwen3's and Qwen3.5's vocabulary sizes,
//! beside a one-pass scan with early exits (what `checked_argmax` was before
//! it became two branch-free passes). Prints medians of 21 runs over 32 rows.
//!
//! `cargo bench --bench sampling`

use std::time::Instant;

use sparkrt::engine::sampling::{Sampler, SamplingParams, SamplingWorkspace};
use sparkrt::util::rng::SplitMix64;

const ROWS: usize = 32;
const RUNS: usize = 21;

/// The first strictly larger value wins; NaN or +inf stops the scan.
fn one_pass(row: &[f32]) -> Option<u32> {
    let (mut best, mut best_logit) = (0, f32::NEG_INFINITY);
    for (index, &value) in row.iter().enumerate() {
        if value.is_nan() || value == f32::INFINITY {
            return None;
        }
        if value > best_logit {
            best = index;
            best_logit = value;
        }
    }
    Some(best as u32)
}

fn median_micros_per_row(mut run: impl FnMut() -> u64) -> f64 {
    let mut times: Vec<f64> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(run());
            start.elapsed().as_secs_f64() * 1e6 / ROWS as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[RUNS / 2]
}

fn main() {
    let mut rng = SplitMix64::new(5);
    println!("greedy sampling, µs per row (median of {RUNS} runs over {ROWS} rows)");
    println!(
        "{:>8} {:>10} {:>10} {:>7}",
        "vocab", "sampler", "one-pass", "ratio"
    );
    for vocab in [151_936usize, 248_320] {
        let logits: Vec<f32> = (0..vocab * ROWS)
            .map(|_| (rng.next_f64() * 30.0 - 15.0) as f32)
            .collect();
        let mut sampler = match Sampler::new(&SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }) {
            Ok(sampler) => sampler,
            Err(e) => panic!("greedy parameters are valid: {e}"),
        };
        let mut workspace = SamplingWorkspace::new(vocab);
        let sampled = median_micros_per_row(|| {
            logits
                .chunks_exact(vocab)
                .map(|row| sampler.sample(row, &mut workspace).map_or(0, u64::from))
                .sum()
        });
        let scanned = median_micros_per_row(|| {
            logits
                .chunks_exact(vocab)
                .map(|row| one_pass(std::hint::black_box(row)).map_or(0, u64::from))
                .sum()
        });
        println!(
            "{vocab:>8} {sampled:>10.1} {scanned:>10.1} {:>6.2}×",
            scanned / sampled
        );
    }
}
