//! Memory read bandwidth, the roofline of bandwidth-bound decoding.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

use super::prefetch::{LINE, STREAM_AHEAD, prefetch_line};

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
    // Non-zero fill so every page is really backed before timing.
    let buffer = vec![1u8; bytes.max(2 * SLICE_BYTES)];
    let timed = || {
        let mut rates = Vec::new();
        for sweep in 0..SWEEPS {
            for slice in buffer.chunks(SLICE_BYTES) {
                let share = slice.len().div_ceil(threads);
                let start = Instant::now();
                // Wrapping, as the sums are: `sum()` would overflow-check in a debug build.
                let total = slice
                    .par_chunks(share)
                    .map(sum_bytes)
                    .reduce(|| 0, u64::wrapping_add);
                black_box(total);
                let seconds = start.elapsed().as_secs_f64();
                if sweep > 0 && slice.len() == SLICE_BYTES {
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

/// Sequential streams each thread reads at once. One stream a thread
/// measured 14-16 GB/s on a Sapphire Rapids-class Xeon (2 vCPUs) where the
/// GEMV kernels, walking 4 rows in lockstep with software prefetch, read
/// 20-22: with 4 streams and the kernels' prefetch the probe reads 19-20.
/// A roofline the kernels beat would flatter every share quoted against it.
const STREAMS: usize = 4;

/// Wrapping sum of little-endian words with independent lanes (any
/// alignment), so the loop is load-bound: the bytes cut into [`STREAMS`]
/// parts read in lockstep, a line of each at a time, each asking for its
/// line `STREAM_AHEAD` bytes on as the kernels do; the tail after the last
/// whole line of each part alone.
fn sum_bytes(bytes: &[u8]) -> u64 {
    let part = bytes.len() / STREAMS / LINE * LINE;
    let mut acc = [0u64; 8];
    for at in (0..part).step_by(LINE) {
        for s in 0..STREAMS {
            let line = &bytes[s * part + at..][..LINE];
            prefetch_line(line.as_ptr(), STREAM_AHEAD);
            for (a, word) in acc.iter_mut().zip(line.chunks_exact(8)) {
                let mut w = [0u8; 8];
                w.copy_from_slice(word);
                *a = a.wrapping_add(u64::from_le_bytes(w));
            }
        }
    }
    let tail = bytes[STREAMS * part..]
        .iter()
        .fold(0u64, |a, &b| a.wrapping_add(u64::from(b)));
    acc.iter().fold(tail, |a, &w| a.wrapping_add(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The streams and the tail cover every byte once, whatever the length.
    #[test]
    fn the_stream_sum_reads_every_byte_once() {
        for len in [0, 1, 63, 64, 255, 256, 257, 4 * 64 * 3 + 17, 10_000] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            // Little-endian words of 8 bytes, then the tail's bytes alone.
            let whole = len / STREAMS / LINE * LINE * STREAMS;
            let expect_bytes = bytes[..whole]
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
                .chain(bytes[whole..].iter().map(|&b| u64::from(b)))
                .fold(0u64, u64::wrapping_add);
            assert_eq!(sum_bytes(&bytes), expect_bytes, "{len} bytes");
        }
    }
}
