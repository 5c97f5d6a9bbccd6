//! The AVX-512 tiers' kernel for GPTQ INT4 weights: `avx2_int4.rs`'s
//! computation with 16 output rows per zmm register instead of 8 per ymm.
//!
//! The `qweight` words of 16 consecutive output rows are one contiguous
//! 64-byte load (the layout is input-major, a word per row), so a 16-row
//! block's outputs sit in the 16 lanes of a vector. Per nibble, the AVX2
//! kernel spends a mask, a convert and a shift to turn the codes into
//! floats; here one `vpermps` looks them up in the table `0.0 ..= 15.0`
//! (the permute reads only each lane's low 4 bits, so no mask) after the
//! shift: half the vectors and a quarter fewer operations per weight.
//!
//! **The same bits as AVX2.** Each lane computes exactly what the AVX2
//! kernel's lane for that row does, in the same order: the codes as exact
//! floats, the 4 partial sums by input column mod 4, `(s0 + s1) + (s2 +
//! s3)`, the zero point off with the group's `Σ x` (summed in column order
//! by the same scalar loop), the scale applied once per group, groups in
//! order. The scales widen from f16 by `vcvtph2ps`, exact as `read_f16`.
//! A row range whose length is an odd multiple of 8 leaves its last 8 rows
//! to the AVX2 kernel.

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::job::Job;
use super::avx2_int4::{self, PREFETCH_ROWS, prefetch_packed_row};
use crate::checkpoint::linear::WeightData;
use crate::formats::{INT4_PER_WORD, read_u32};

/// Output rows per zmm vector.
const LANES: usize = 16;
/// Tokens sharing one decode of the weights.
const TOKEN_BLOCK: usize = 2;
/// 16-row blocks computed together: each packed input row is then read as
/// `CHUNK_BLOCKS × 64` contiguous bytes, the kilobyte the AVX2 kernel reads.
const CHUNK_BLOCKS: usize = 16;

/// Rows `rows` (multiples of 8, as the dispatcher's units are) of an INT4 job.
///
/// # Safety
/// AVX2, FMA and AVX-512F are present (the AVX-512 tiers exist only after
/// run-time detection); the job's shapes were checked by `check_problem`
/// (rows and group multiples of 8, slices of exact length).
#[target_feature(enable = "avx2,fma,avx512f")]
pub(super) unsafe fn run_rows(job: &Job, rows: Range<usize>) {
    let mut r0 = rows.start;
    while r0 + LANES <= rows.end {
        let blocks = ((rows.end - r0) / LANES).min(CHUNK_BLOCKS);
        let mut t0 = 0;
        while t0 < job.tokens {
            if job.tokens - t0 >= TOKEN_BLOCK {
                // SAFETY: r0 + 16·blocks ≤ rows and t0 + 2 ≤ tokens.
                unsafe { row_chunk::<TOKEN_BLOCK>(job, r0, blocks, t0) };
                t0 += TOKEN_BLOCK;
            } else {
                // SAFETY: r0 + 16·blocks ≤ rows and t0 < tokens.
                unsafe { row_chunk::<1>(job, r0, blocks, t0) };
                t0 += 1;
            }
        }
        r0 += blocks * LANES;
    }
    if r0 < rows.end {
        // SAFETY: the remaining 8 rows, with this function's contract.
        unsafe { avx2_int4::run_rows(job, r0..rows.end) };
    }
}

/// Output rows `r0..r0 + 16·blocks` of tokens `t0..t0 + T`, as
/// `avx2_int4`'s `row_chunk` with 16-lane vectors.
///
/// # Safety
/// As [`run_rows`], with `r0 + 16·blocks ≤ rows`, `blocks ≤ CHUNK_BLOCKS`
/// and `t0 + T ≤ tokens`.
#[target_feature(enable = "avx2,fma,avx512f")]
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
        unreachable!("x86::run_rows sends only INT4 here")
    };
    let (n_rows, cols) = (w.rows, w.cols);
    let codes_as_floats = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    );
    let nibble = _mm512_set1_epi32(0x0F);
    let offset = _mm512_set1_epi32(i32::from(zero_offset));
    // Lane i of a block is row r + i: its zero point is nibble i mod 8 of
    // the qzeros word of rows r + 8·(i / 8).
    let shifts = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    let mut total = [[_mm512_setzero_ps(); T]; CHUNK_BLOCKS];
    let mut zero = [_mm512_setzero_ps(); CHUNK_BLOCKS];
    let mut scale = [_mm512_setzero_ps(); CHUNK_BLOCKS];
    let words_per_group = group / INT4_PER_WORD;
    let zero_words_per_group = n_rows / INT4_PER_WORD;
    let packed_rows = cols / INT4_PER_WORD;
    let chunk_bytes = blocks * LANES * 4;
    for g in 0..cols / group {
        for b in 0..blocks {
            let r = r0 + b * LANES;
            let word = g * zero_words_per_group + r / INT4_PER_WORD;
            let (low, high) = (read_u32(qzeros, word), read_u32(qzeros, word + 1));
            let words = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_set1_epi32(low as i32)),
                _mm256_set1_epi32(high as i32),
            );
            zero[b] = _mm512_cvtepi32_ps(_mm512_add_epi32(
                _mm512_and_si512(_mm512_srlv_epi32(words, shifts), nibble),
                offset,
            ));
            let first = (g * n_rows + r) * 2;
            let halves = &scales[first..first + 2 * LANES];
            // SAFETY: `halves` is 32 bytes, 16 f16 scales; loadu has no
            // alignment need.
            let halves = unsafe { _mm256_loadu_si256(halves.as_ptr().cast::<__m256i>()) };
            scale[b] = _mm512_cvtph_ps(halves);
        }
        let mut sums = [[[_mm512_setzero_ps(); 4]; T]; CHUNK_BLOCKS];
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
            let mut x = [[_mm512_setzero_ps(); INT4_PER_WORD]; T];
            for (t, xt) in x.iter_mut().enumerate() {
                let row = (t0 + t) * cols + col;
                // SAFETY: t0 + t < tokens and col + 8 ≤ cols: inside x.
                let values = unsafe { job.x.get_unchecked(row..row + INT4_PER_WORD) };
                for (lane, &v) in xt.iter_mut().zip(values) {
                    *lane = _mm512_set1_ps(v);
                    x_sum[t] += v;
                }
            }
            for (b, block_sums) in sums.iter_mut().enumerate().take(blocks) {
                let at = (k * n_rows + r0 + b * LANES) * 4;
                // SAFETY: words (k, r0 + 16b .. + 16) lie inside qweight,
                // whose length check_problem verified (cols/8 × rows words).
                let mut codes = unsafe { _mm512_loadu_si512(qweight.as_ptr().add(at).cast()) };
                let mut acc = *block_sums;
                for j in 0..INT4_PER_WORD {
                    let code = _mm512_permutexvar_ps(codes, codes_as_floats);
                    codes = _mm512_srli_epi32::<4>(codes);
                    for t in 0..T {
                        acc[t][j % 4] = _mm512_fmadd_ps(code, x[t][j], acc[t][j % 4]);
                    }
                }
                *block_sums = acc;
            }
        }
        for b in 0..blocks {
            for t in 0..T {
                let s = &sums[b][t];
                let codes_x = _mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]));
                let centred = _mm512_fnmadd_ps(zero[b], _mm512_set1_ps(x_sum[t]), codes_x);
                total[b][t] = _mm512_fmadd_ps(scale[b], centred, total[b][t]);
            }
        }
    }
    for (b, block) in total.iter().enumerate().take(blocks) {
        for (t, &out) in block.iter().enumerate() {
            let r = r0 + b * LANES;
            // SAFETY: out is [tokens, rows]; this unit owns rows r..r + 16.
            unsafe { _mm512_storeu_ps(job.out.get().add((t0 + t) * n_rows + r), out) };
        }
    }
}
