//! The AVX2 kernel for GPTQ INT4 weights, read in the checkpoint's own
//! input-major layout (no repacking at load).
//!
//! `qweight` holds, per packed input row `k` (8 input columns), one 32-bit
//! word per output row: the words of 8 consecutive output rows are one
//! contiguous 32-byte load. So a block of 8 output rows is computed with
//! its 8 outputs in the 8 lanes of a vector: for each of the word's 8
//! nibbles, the 8 rows' weights for one input column are decoded as
//! `(code − zero) × scale` (the rule of `formats::int4_value`) and
//! multiplied by that column's activation, broadcast.
//!
//! Up to 32 such blocks (256 rows) are computed together, so each packed
//! input row is one contiguous kilobyte read.
//!
//! Summation order (batch invariance): per group, every output sums
//! `code · x` in input-column order into 4 partial sums (column mod 4),
//! added as `(s0 + s1) + (s2 + s3)`, takes `zero · Σ x` off and adds the
//! scaled result to its total, groups in order, for every token count and
//! row chunk: tokens are computed in pairs only to share the decoded
//! weights, each with its own sums.

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::job::Job;
use crate::checkpoint::linear::WeightData;
use crate::formats::{INT4_PER_WORD, read_f16, read_u32};

/// Tokens sharing one decode of the weights.
const TOKEN_BLOCK: usize = 2;
/// 8-row blocks computed together: each packed input row is then read as
/// `CHUNK_BLOCKS × 32` contiguous bytes (the qweight layout is input-major:
/// 8 rows alone would read 32 bytes per page-sized stride and starve the
/// prefetchers).
const CHUNK_BLOCKS: usize = 32;
/// How many packed input rows ahead the kernel asks for its weights: each
/// packed row of a chunk is one kilobyte a page-sized stride from the last,
/// which the hardware prefetchers pick up late (`avx512_int4.rs` measured it).
pub(super) const PREFETCH_ROWS: usize = 4;
/// Bytes one prefetch asks for: a cache line.
pub(super) const LINE: usize = 64;

/// Rows `rows` (multiples of 8, as the dispatcher's units are) of an INT4 job.
///
/// # Safety
/// AVX2 and FMA are present; the job's shapes were checked by
/// `check_problem` (rows and group multiples of 8, slices of exact length).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn run_rows(job: &Job, rows: Range<usize>) {
    let WeightData::Int4 { .. } = job.weight.data else {
        unreachable!("x86::run_rows sends only INT4 here")
    };
    let mut r0 = rows.start;
    while r0 + INT4_PER_WORD <= rows.end {
        let blocks = ((rows.end - r0) / INT4_PER_WORD).min(CHUNK_BLOCKS);
        let mut t0 = 0;
        while t0 < job.tokens {
            if job.tokens - t0 >= TOKEN_BLOCK {
                // SAFETY: r0 + 8·blocks ≤ rows and t0 + 2 ≤ tokens.
                unsafe { row_chunk::<TOKEN_BLOCK>(job, r0, blocks, t0) };
                t0 += TOKEN_BLOCK;
            } else {
                // SAFETY: r0 + 8·blocks ≤ rows and t0 < tokens.
                unsafe { row_chunk::<1>(job, r0, blocks, t0) };
                t0 += 1;
            }
        }
        r0 += blocks * INT4_PER_WORD;
    }
}

/// Output rows `r0..r0 + 8·blocks` of tokens `t0..t0 + T`.
///
/// Per group of `group` input columns, each output first sums `code · x`
/// (the raw 4-bit codes, exact in f32) into 4 partial sums, then takes the
/// zero point off once with the group's `Σ x` and applies the scale once:
/// `total += scale · (Σ code·x − zero · Σ x)`. That is the same value as
/// summing `(code − zero) · scale · x` term by term, with two vector
/// operations per 8 weights instead of four.
///
/// # Safety
/// As [`run_rows`], with `r0 + 8·blocks ≤ rows`, `blocks ≤ CHUNK_BLOCKS`
/// and `t0 + T ≤ tokens`.
#[target_feature(enable = "avx2,fma")]
unsafe fn row_chunk<const T: usize>(job: &Job, r0: usize, blocks: usize, t0: usize) {
    let w = &job.weight;
    let WeightData::Int4 {
        qweight,
        qzeros,
        scales,
        group,
        zero_offset,
    } = w.data
    else {
        return;
    };
    let (n_rows, cols) = (w.rows, w.cols);
    let nibble = _mm256_set1_epi32(0x0F);
    let offset = _mm256_set1_epi32(i32::from(zero_offset));
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    // Per block and token: the outputs so far (whole groups).
    let mut total = [[_mm256_setzero_ps(); T]; CHUNK_BLOCKS];
    let mut zero = [_mm256_setzero_ps(); CHUNK_BLOCKS];
    let mut scale = [_mm256_setzero_ps(); CHUNK_BLOCKS];
    let words_per_group = group / INT4_PER_WORD;
    let packed_rows = cols / INT4_PER_WORD;
    let chunk_bytes = blocks * INT4_PER_WORD * 4;
    for g in 0..cols / group {
        for b in 0..blocks {
            let r = r0 + b * INT4_PER_WORD;
            // The 8 rows' zero points: one qzeros word, a nibble per row.
            let zeros = read_u32(qzeros, g * (n_rows / INT4_PER_WORD) + r / INT4_PER_WORD);
            zero[b] = _mm256_cvtepi32_ps(_mm256_add_epi32(
                _mm256_and_si256(
                    _mm256_srlv_epi32(_mm256_set1_epi32(zeros as i32), shifts),
                    nibble,
                ),
                offset,
            ));
            let mut s = [0.0f32; INT4_PER_WORD];
            for (i, s) in s.iter_mut().enumerate() {
                *s = read_f16(scales, g * n_rows + r + i);
            }
            // SAFETY: an 8-float stack array.
            scale[b] = unsafe { _mm256_loadu_ps(s.as_ptr()) };
        }
        // Per block and token, this group's 4 partial sums of code · x
        // (input column mod 4), and per token the group's Σ x in column
        // order.
        let mut sums = [[[_mm256_setzero_ps(); 4]; T]; CHUNK_BLOCKS];
        let mut x_sum = [0.0f32; T];
        for k in g * words_per_group..(g + 1) * words_per_group {
            if k + PREFETCH_ROWS < packed_rows {
                prefetch_packed_row(
                    qweight,
                    ((k + PREFETCH_ROWS) * n_rows + r0) * 4,
                    chunk_bytes,
                );
            }
            let col = k * INT4_PER_WORD;
            let mut x = [[_mm256_setzero_ps(); INT4_PER_WORD]; T];
            for (t, xt) in x.iter_mut().enumerate() {
                let row = (t0 + t) * cols + col;
                // SAFETY: t0 + t < tokens and col + 8 ≤ cols: inside x.
                let values = unsafe { job.x.get_unchecked(row..row + INT4_PER_WORD) };
                for (lane, &v) in xt.iter_mut().zip(values) {
                    *lane = _mm256_set1_ps(v);
                    x_sum[t] += v;
                }
            }
            for (b, block_sums) in sums.iter_mut().enumerate().take(blocks) {
                let at = (k * n_rows + r0 + b * INT4_PER_WORD) * 4;
                // SAFETY: words (k, r0 + 8b .. + 8) lie inside qweight, whose
                // length check_problem verified (cols/8 × rows words).
                let mut codes =
                    unsafe { _mm256_loadu_si256(qweight.as_ptr().add(at).cast::<__m256i>()) };
                let mut acc = *block_sums;
                for j in 0..INT4_PER_WORD {
                    let code = _mm256_cvtepi32_ps(_mm256_and_si256(codes, nibble));
                    codes = _mm256_srli_epi32::<4>(codes);
                    for t in 0..T {
                        acc[t][j % 4] = _mm256_fmadd_ps(code, x[t][j], acc[t][j % 4]);
                    }
                }
                *block_sums = acc;
            }
        }
        for b in 0..blocks {
            for t in 0..T {
                let s = &sums[b][t];
                let codes_x = _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
                // Σ code·x − zero · Σ x, times the scale.
                let centred = _mm256_fnmadd_ps(zero[b], _mm256_set1_ps(x_sum[t]), codes_x);
                total[b][t] = _mm256_fmadd_ps(scale[b], centred, total[b][t]);
            }
        }
    }
    for (b, block) in total.iter().enumerate().take(blocks) {
        for (t, &out) in block.iter().enumerate() {
            let r = r0 + b * INT4_PER_WORD;
            // SAFETY: out is [tokens, rows]; this unit owns rows r..r + 8.
            unsafe { _mm256_storeu_ps(job.out.get().add((t0 + t) * n_rows + r), out) };
        }
    }
}

/// Asks for the `len` bytes of `qweight` from byte `at`, a line at a time
/// (a hint only: it never changes a value).
#[inline]
pub(super) fn prefetch_packed_row(qweight: &[u8], at: usize, len: usize) {
    for line in (at..at + len).step_by(LINE) {
        if let Some(byte) = qweight.get(line) {
            // SAFETY: a prefetch reads nothing architecturally and never
            // faults; the address lies inside qweight.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(byte).cast()) };
        }
    }
}
