//! Memory read bandwidth, the roofline of bandwidth-bound decoding.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

/// Bytes per second `threads` threads read from a `bytes`-long buffer (make it
/// larger than the last-level cache): the median of 5 timed passes after a
/// warm-up, each thread summing its own contiguous share.
pub fn measure_read_bandwidth(threads: usize, bytes: usize) -> f64 {
    let threads = threads.max(1);
    let words = (bytes / 8).max(threads * 1024);
    // Non-zero fill so every page is really backed before timing.
    let buffer = vec![1u64; words];
    let share = words.div_ceil(threads);
    let pass = || {
        let start = Instant::now();
        let total: u64 = buffer.par_chunks(share).map(sum_words).sum();
        black_box(total);
        start.elapsed().as_secs_f64()
    };
    let timed = || {
        pass();
        let mut times: Vec<f64> = (0..5).map(|_| pass()).collect();
        times.sort_by(f64::total_cmp);
        times[2]
    };
    let seconds = match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(pool) => pool.install(timed),
        // No new pool (out of threads?): measure on the current one.
        Err(_) => timed(),
    };
    (words * 8) as f64 / seconds
}

/// Wrapping sum with independent lanes, so the loop is load-bound.
fn sum_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for chunk in &mut chunks {
        for (a, &w) in acc.iter_mut().zip(chunk) {
            *a = a.wrapping_add(w);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &w| a.wrapping_add(w));
    acc.iter().fold(tail, |a, &w| a.wrapping_add(w))
}
