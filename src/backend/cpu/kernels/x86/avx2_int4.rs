//! The GPTQ INT4 kernel, read in the checkpoint's own input-major layout
//! (no repacking at load): written once over the vector width
//! ([`Int4Lanes`]), entered here with 8 rows a ymm register (AVX2) and in
//! `avx512_int4.rs` with 16 rows a zmm register.
//!
//! `qweight` holds, per packed input row `k` (8 input columns), one 32-bit
//! word per output row: the words of consecutive output rows are one
//! contiguous load. So a block of `LANES` output rows is computed with its
//! outputs in the lanes of a vector: for each of the word's 8 nibbles, the
//! rows' codes for one input column become floats and are multiplied by
//! that column's activation, broadcast.
//!
//! Blocks of 256 rows in all are computed together, so each packed input
//! row is one contiguous kilobyte read, and the kernel asks for the
//! kilobyte [`PREFETCH_ROWS`] packed rows ahead (a page-sized stride from
//! the last, which the hardware prefetchers pick up late: without the hint
//! the kernel waited on the `qweight` loads most of its time, `perf
//! annotate` on the INT4 bench model's decode).
//!
//! Summation order (batch invariance), the same for every lane width, so
//! both tiers give the same bits: per group, every output sums `code · x`
//! in input-column order into 4 partial sums (column mod 4), added as
//! `(s0 + s1) + (s2 + s3)`, takes `zero · Σ x` off (`Σ x` summed in column
//! order) and adds the result times the scale to its total, groups in
//! order, for every token count and row chunk: tokens are computed in
//! pairs only to share the decoded weights, each with its own sums. That is
//! the value of summing `(code − zero) · scale · x` term by term (the rule
//! of `formats::int4_value`), with two vector operations per vector of
//! weights instead of four.

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::job::Job;
use super::super::prefetch::{LINE, prefetch_line};
use crate::checkpoint::linear::WeightData;
use crate::formats::{INT4_PER_WORD, read_f16, read_u32};

/// Tokens sharing one decode of the weights.
const TOKEN_BLOCK: usize = 2;
/// Output rows computed together: each packed input row is then read as a
/// contiguous kilobyte (rows alone would read a vector's bytes per
/// page-sized stride and starve the prefetchers).
const CHUNK_ROWS: usize = 256;
/// Blocks in a chunk of the narrowest vector (8 rows).
const MAX_BLOCKS: usize = CHUNK_ROWS / INT4_PER_WORD;
/// How many packed input rows ahead the kernel asks for its weights.
const PREFETCH_ROWS: usize = 4;

/// One vector width of the kernel: `LANES` output rows per vector. Every
/// method is one or two instructions, inlined into the entry point that
/// enables the width's features.
pub(super) trait Int4Lanes {
    /// Output rows per vector (a multiple of 8: whole `qzeros` words).
    const LANES: usize;
    type F: Copy;
    type I: Copy;
    /// # Safety
    /// The width's features (the entry point enables them); so for all.
    unsafe fn zero() -> Self::F;
    unsafe fn splat(v: f32) -> Self::F;
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `c − a·b`.
    unsafe fn fnmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    /// The `LANES` words at `p` (unaligned).
    unsafe fn load_words(p: *const u8) -> Self::I;
    /// Each lane's low nibble as a float, exactly.
    unsafe fn low_nibbles(words: Self::I) -> Self::F;
    unsafe fn next_nibbles(words: Self::I) -> Self::I;
    /// The zero points (plus `offset`) of the `LANES` rows whose `qzeros`
    /// words start at word `first` (a nibble per row, 8 rows a word), as
    /// floats.
    unsafe fn zero_points(qzeros: &[u8], first: usize, offset: u8) -> Self::F;
    /// The `LANES` f16 scales at `halves` (2 bytes each), widened exactly.
    unsafe fn scales(halves: &[u8]) -> Self::F;
    unsafe fn store(p: *mut f32, v: Self::F);
}

/// 8 rows a ymm register (AVX2, FMA).
pub(super) struct Ymm;

impl Int4Lanes for Ymm {
    const LANES: usize = 8;
    type F = __m256;
    type I = __m256i;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: AVX2 and FMA (the contract).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        // SAFETY: AVX2 and FMA (the contract).
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: AVX2 and FMA (the contract).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: AVX2 and FMA (the contract).
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 and FMA (the contract).
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn load_words(p: *const u8) -> __m256i {
        // SAFETY: AVX2 (the contract); 32 readable bytes at p.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
    #[inline(always)]
    unsafe fn low_nibbles(words: __m256i) -> __m256 {
        // SAFETY: AVX2 and FMA (the contract).
        unsafe { _mm256_cvtepi32_ps(_mm256_and_si256(words, _mm256_set1_epi32(0x0F))) }
    }
    #[inline(always)]
    unsafe fn next_nibbles(words: __m256i) -> __m256i {
        // SAFETY: AVX2 and FMA (the contract).
        unsafe { _mm256_srli_epi32::<4>(words) }
    }
    #[inline(always)]
    unsafe fn zero_points(qzeros: &[u8], first: usize, offset: u8) -> __m256 {
        let word = read_u32(qzeros, first);
        // SAFETY: AVX2 and FMA (the contract).
        unsafe {
            let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
            let nibbles = _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), shifts),
                _mm256_set1_epi32(0x0F),
            );
            _mm256_cvtepi32_ps(_mm256_add_epi32(
                nibbles,
                _mm256_set1_epi32(i32::from(offset)),
            ))
        }
    }
    #[inline(always)]
    unsafe fn scales(halves: &[u8]) -> __m256 {
        // SAFETY: AVX2 and FMA (the contract).
        unsafe {
            let mut s = [0.0f32; 8];
            for (i, s) in s.iter_mut().enumerate() {
                *s = read_f16(halves, i);
            }
            _mm256_loadu_ps(s.as_ptr())
        }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: AVX2 (the contract); 8 writable floats at p.
        unsafe { _mm256_storeu_ps(p, v) }
    }
}

/// Rows `rows` (multiples of 8, as the dispatcher's units are) of an INT4
/// job, 8 rows a ymm register.
///
/// # Safety
/// AVX2 and FMA are present; the job's shapes were checked by
/// `check_problem` (rows and group multiples of 8, slices of exact length).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn run_rows(job: &Job, rows: Range<usize>) {
    // SAFETY: this function's contract, whose features Ymm needs.
    unsafe { run_rows_with::<Ymm>(job, rows) };
}

/// Rows `rows` of an INT4 job, `L::LANES` rows a vector, in chunks of
/// [`CHUNK_ROWS`]; returns the first row not computed (the rows left when
/// fewer than `L::LANES` remain).
///
/// # Safety
/// As [`run_rows`], with `L`'s features enabled by the (inlining) caller.
#[inline(always)]
pub(super) unsafe fn run_rows_with<L: Int4Lanes>(job: &Job, rows: Range<usize>) -> usize {
    let mut r0 = rows.start;
    while r0 + L::LANES <= rows.end {
        let blocks = ((rows.end - r0) / L::LANES).min(CHUNK_ROWS / L::LANES);
        let mut t0 = 0;
        while t0 < job.tokens {
            if job.tokens - t0 >= TOKEN_BLOCK {
                // SAFETY: r0 + LANES·blocks ≤ rows and t0 + 2 ≤ tokens.
                unsafe { row_chunk::<L, TOKEN_BLOCK>(job, r0, blocks, t0) };
                t0 += TOKEN_BLOCK;
            } else {
                // SAFETY: r0 + LANES·blocks ≤ rows and t0 < tokens.
                unsafe { row_chunk::<L, 1>(job, r0, blocks, t0) };
                t0 += 1;
            }
        }
        r0 += blocks * L::LANES;
    }
    r0
}

/// Output rows `r0..r0 + LANES·blocks` of tokens `t0..t0 + T`.
///
/// # Safety
/// As [`run_rows_with`], with `r0 + LANES·blocks ≤ rows`,
/// `LANES·blocks ≤ CHUNK_ROWS` and `t0 + T ≤ tokens`.
#[inline(always)]
unsafe fn row_chunk<L: Int4Lanes, const T: usize>(job: &Job, r0: usize, blocks: usize, t0: usize) {
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
    // SAFETY: `L`'s features are enabled (this function's contract); so for
    // every `L` call below ("as above"), their pointers in bounds as noted.
    let zero = unsafe { L::zero() };
    // Per block and token: the outputs so far (whole groups).
    let mut total = [[zero; T]; MAX_BLOCKS];
    let mut zeros = [zero; MAX_BLOCKS];
    let mut scale = [zero; MAX_BLOCKS];
    // Zeroed per group below, only the blocks in use (a zmm chunk uses half).
    let mut sums = [[[zero; 4]; T]; MAX_BLOCKS];
    let words_per_group = group / INT4_PER_WORD;
    let zero_words_per_group = n_rows / INT4_PER_WORD;
    let packed_rows = cols / INT4_PER_WORD;
    let chunk_bytes = blocks * L::LANES * 4;
    for g in 0..cols / group {
        for b in 0..blocks {
            let r = r0 + b * L::LANES;
            let first_word = g * zero_words_per_group + r / INT4_PER_WORD;
            let first = (g * n_rows + r) * 2;
            // SAFETY: as above.
            unsafe {
                zeros[b] = L::zero_points(qzeros, first_word, zero_offset);
                scale[b] = L::scales(&scales[first..first + 2 * L::LANES]);
            }
        }
        // Per block and token, this group's 4 partial sums of code · x
        // (input column mod 4), and per token the group's Σ x.
        for block_sums in sums.iter_mut().take(blocks) {
            *block_sums = [[zero; 4]; T];
        }
        let mut x_sum = [0.0f32; T];
        for k in g * words_per_group..(g + 1) * words_per_group {
            if k + PREFETCH_ROWS < packed_rows {
                prefetch(
                    qweight,
                    ((k + PREFETCH_ROWS) * n_rows + r0) * 4,
                    chunk_bytes,
                );
            }
            let col = k * INT4_PER_WORD;
            let mut x = [[zero; INT4_PER_WORD]; T];
            for (t, xt) in x.iter_mut().enumerate() {
                let row = (t0 + t) * cols + col;
                // SAFETY: t0 + t < tokens and col + 8 ≤ cols: inside x.
                let values = unsafe { job.x.get_unchecked(row..row + INT4_PER_WORD) };
                for (lane, &v) in xt.iter_mut().zip(values) {
                    // SAFETY: as above.
                    *lane = unsafe { L::splat(v) };
                    x_sum[t] += v;
                }
            }
            for (b, block_sums) in sums.iter_mut().enumerate().take(blocks) {
                let at = (k * n_rows + r0 + b * L::LANES) * 4;
                // SAFETY: words (k, r0 + LANES·b ..) lie inside qweight,
                // whose length check_problem verified (cols/8 × rows words).
                let mut words = unsafe { L::load_words(qweight.as_ptr().add(at)) };
                let mut acc = *block_sums;
                for j in 0..INT4_PER_WORD {
                    // SAFETY: as above.
                    let code = unsafe { L::low_nibbles(words) };
                    // SAFETY: as above.
                    words = unsafe { L::next_nibbles(words) };
                    for t in 0..T {
                        // SAFETY: as above.
                        acc[t][j % 4] = unsafe { L::fmadd(code, x[t][j], acc[t][j % 4]) };
                    }
                }
                *block_sums = acc;
            }
        }
        for b in 0..blocks {
            for t in 0..T {
                let s = &sums[b][t];
                // SAFETY: as above.
                unsafe {
                    let codes_x = L::add(L::add(s[0], s[1]), L::add(s[2], s[3]));
                    // Σ code·x − zero · Σ x, times the scale.
                    let centred = L::fnmadd(zeros[b], L::splat(x_sum[t]), codes_x);
                    total[b][t] = L::fmadd(scale[b], centred, total[b][t]);
                }
            }
        }
    }
    for (b, block) in total.iter().enumerate().take(blocks) {
        for (t, &out) in block.iter().enumerate() {
            let r = r0 + b * L::LANES;
            // SAFETY: out is [tokens, rows]; this unit owns rows r..r + LANES.
            unsafe { L::store(job.out.get().add((t0 + t) * n_rows + r), out) };
        }
    }
}

/// Asks for the `len` bytes of `qweight` from byte `at`, a line at a time
/// (a hint only: it never changes a value); none past `qweight`.
#[inline(always)]
fn prefetch(qweight: &[u8], at: usize, len: usize) {
    for line in (at..(at + len).min(qweight.len())).step_by(LINE) {
        prefetch_line(qweight.as_ptr(), line);
    }
}
