//! Memory read bandwidth, the roofline of bandwidth-bound decoding.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

/// Bytes read per timed pass: large enough that thread start-up is noise,
/// small enough that a busy machine still leaves some passes undisturbed.
const SLICE_BYTES: usize = 64 << 20;
/// Sweeps over the whole buffer (the first one is a warm-up).
const SWEEPS: usize = 4;

/// Bytes per second that `threads` threads read from memory: a buffer of
/// `bytes` (make it several times the last-level cache) is swept in
/// 64 MiB slices, each slice summed by all threads in parallel and timed on
/// its own, and the median slice rate is returned. Slicing keeps every pass
/// cold (the rest of the buffer evicts it) while the median ignores passes
/// that another process interrupted.
pub fn measure_read_bandwidth(threads: usize, bytes: usize) -> f64 {
    let threads = threads.max(1);
    let slice_words = SLICE_BYTES / 8;
    let words = (bytes / 8).max(2 * slice_words);
    // Non-zero fill so every page is really backed before timing.
    let buffer = vec![1u64; words];
    let timed = || {
        let mut rates = Vec::new();
        for sweep in 0..SWEEPS {
            for slice in buffer.chunks(slice_words) {
                let share = slice.len().div_ceil(threads);
                let start = Instant::now();
                // Wrapping, as the sums are: `sum()` would overflow-check in a debug build.
                let total = slice
                    .par_chunks(share)
                    .map(sum_words)
                    .reduce(|| 0, u64::wrapping_add);
                black_box(total);
                let seconds = start.elapsed().as_secs_f64();
                if sweep > 0 && slice.len() == slice_words {
                    rates.push(SLICE_BYTES as f64 / seconds);
                }
            }
        }
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    };
    match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(pool) => pool.install(timed),
        // No new pool (out of threads?): measure on the current one.
        Err(_) => timed(),
    }
}

/// Bytes per second that `threads` threads read from memory the process
/// already maps, e.g. the checkpoint's weights: nothing is allocated, so
/// the measurement does not grow the process. `regions` are read in passes
/// of 64 MiB (split evenly between the threads), up to `max_bytes` per sweep;
/// the first sweep is a warm-up (it faults in any page not yet resident),
/// the median pass rate of the next ones is returned. Make the regions
/// several times the last-level cache, or the figure is the cache's.
pub fn measure_read_bandwidth_of(threads: usize, regions: &[&[u8]], max_bytes: usize) -> f64 {
    let threads = threads.max(1);
    // Each pass: pieces of at most piece_bytes, so every thread gets a share.
    let piece_bytes = (SLICE_BYTES / (4 * threads)).max(4096);
    let mut passes: Vec<Vec<&[u8]>> = vec![Vec::new()];
    let (mut in_pass, mut total) = (0usize, 0usize);
    'regions: for region in regions {
        for piece in region.chunks(piece_bytes) {
            if total >= max_bytes {
                break 'regions;
            }
            if in_pass >= SLICE_BYTES {
                passes.push(Vec::new());
                in_pass = 0;
            }
            if let Some(pass) = passes.last_mut() {
                pass.push(piece);
            }
            in_pass += piece.len();
            total += piece.len();
        }
    }
    let timed = || {
        let mut rates = Vec::new();
        for sweep in 0..SWEEPS {
            for pass in &passes {
                let bytes: usize = pass.iter().map(|p| p.len()).sum();
                let start = Instant::now();
                let sum = pass
                    .par_iter()
                    .map(|p| sum_bytes(p))
                    .reduce(|| 0, u64::wrapping_add);
                black_box(sum);
                let seconds = start.elapsed().as_secs_f64();
                // Full passes only: a short last pass times mostly start-up.
                if sweep > 0 && bytes * 2 >= SLICE_BYTES {
                    rates.push(bytes as f64 / seconds);
                }
            }
        }
        rates.sort_by(f64::total_cmp);
        rates.get(rates.len() / 2).copied().unwrap_or(0.0)
    };
    match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(pool) => pool.install(timed),
        Err(_) => timed(),
    }
}

/// Wrapping sum of little-endian words with independent lanes (any
/// alignment), so the loop is load-bound.
fn sum_bytes(bytes: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = bytes.chunks_exact(64);
    for chunk in &mut chunks {
        for (a, word) in acc.iter_mut().zip(chunk.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            *a = a.wrapping_add(u64::from_le_bytes(w));
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &b| a.wrapping_add(u64::from(b)));
    acc.iter().fold(tail, |a, &w| a.wrapping_add(w))
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
