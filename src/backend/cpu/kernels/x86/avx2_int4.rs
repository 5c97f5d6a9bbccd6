//! The GPTQ INT4 kernel: the 4-bit codes times the activations quantized to
//! int16 (`kernels::quantize`), summed as integers, read in the
//! checkpoint's own input-major layout (no repacking at load). Written once
//! over the vector width ([`Int4Lanes`]), entered here with 8 rows a ymm
//! register (AVX2) and in `avx512_int4.rs` with 16 rows a zmm register.
//!
//! `qweight` holds, per packed input row `k` (8 input columns), one 32-bit
//! word per output row: the words of consecutive output rows are one
//! contiguous load, so a block of `LANES` output rows is computed with its
//! outputs in the lanes of a vector. Masking a word with `0x000F000F`
//! leaves nibbles 0 and 4 as the low and high int16 of the lane; shifted by
//! 4, 8 and 12 first, nibbles 1 and 5, 2 and 6, 3 and 7. Each such pair of
//! codes times the pair of activations of the same two columns (one
//! broadcast 32-bit value) is one `vpmaddwd` (`vpdpwssd` with AVX-512
//! VNNI): 2 products per lane per instruction, where decoding each code to
//! a float cost a mask, a convert and an FMA.
//!
//! **Numerics and summation order** (batch invariance; the same for every
//! lane width and with or without VNNI, so every x86 tier gives the same
//! bits). The input columns are cut into segments: the columns that share
//! both a weight group (scale, zero point) and an activation block (one
//! power-of-two scale `d`, 32 columns). Per segment every output sums
//! `code · q` exactly in int32 (at most 32 · 15 · 2^15 < 2^24, so the
//! conversion to f32 is exact too) and adds `sum · d` to its group's float
//! sum; per group it takes `zero · Σ x̂` off (`Σ x̂`: the segments' code sums
//! times their `d`, in order) and adds the result times the scale to its
//! total, groups in order, for every token count and row chunk. That is
//! `Σ (code − zero) · scale · x̂` (the rule of `formats::int4_value` on the
//! quantized activations `x̂ = q · d`, 15 significant bits of each block's
//! largest value). Tokens are computed in blocks only to share the decoded
//! weights, each with its own sums.
//!
//! Blocks of 256 rows in all are computed together, so each packed input
//! row is one contiguous kilobyte read (a page-sized stride from the last,
//! which the hardware prefetchers pick up late): with each block's words
//! the kernel asks for the same rows' words [`PREFETCH_ROWS`] packed rows
//! ahead, a line at a time (a burst of the whole kilobyte per packed row
//! was slower), and for the next group's scales and zero points.
//!
//! `vpdpwssd` is inline `asm!` (`avx512_int4.rs`): given the intrinsic,
//! LLVM's machine combiner splits chains of it into `vpmaddwd` + `vpaddd`.

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::job::Job;
use super::super::prefetch::prefetch_line;
use super::super::quantize::{BLOCK, QuantizedX};
use crate::checkpoint::linear::WeightData;
use crate::formats::{INT4_PER_WORD, read_f16, read_u32};

/// Tokens sharing one decode of the weights.
const TOKEN_BLOCK: usize = 4;
/// Output rows computed together: each packed input row is then read as a
/// contiguous kilobyte (rows alone would read a vector's bytes per
/// page-sized stride and starve the prefetchers).
const CHUNK_ROWS: usize = 256;
/// Blocks in a chunk of the narrowest vector (8 rows).
const MAX_BLOCKS: usize = CHUNK_ROWS / INT4_PER_WORD;
/// How many packed input rows ahead the kernel asks for its weights.
const PREFETCH_ROWS: usize = 12;
/// Packed input rows (words of 8 columns) per activation block.
const WORDS_PER_BLOCK: usize = BLOCK / INT4_PER_WORD;
/// Code pairs per word: nibbles `j` and `j + 4`.
const PAIRS: usize = INT4_PER_WORD / 2;

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
    unsafe fn zero_int() -> Self::I;
    unsafe fn splat(v: f32) -> Self::F;
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `c − a·b`.
    unsafe fn fnmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// The `LANES` words at `p` (unaligned).
    unsafe fn load_words(p: *const u8) -> Self::I;
    /// Each lane's nibbles 0 and 4 as its low and high int16.
    unsafe fn first_pair(words: Self::I) -> Self::I;
    /// The words shifted down by one nibble.
    unsafe fn next_nibbles(words: Self::I) -> Self::I;
    /// `acc` plus, per lane, the dot product of its two int16 codes with
    /// the two int16 of `x_pair` (low with low), in int32.
    unsafe fn dot_pair(acc: Self::I, codes: Self::I, x_pair: i32) -> Self::I;
    unsafe fn add_int(a: Self::I, b: Self::I) -> Self::I;
    /// The int32 lanes as floats.
    unsafe fn to_float(sums: Self::I) -> Self::F;
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
    unsafe fn zero_int() -> __m256i {
        // SAFETY: AVX2 and FMA (the contract).
        unsafe { _mm256_setzero_si256() }
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
    unsafe fn load_words(p: *const u8) -> __m256i {
        // SAFETY: AVX2 (the contract); 32 readable bytes at p.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
    #[inline(always)]
    unsafe fn first_pair(words: __m256i) -> __m256i {
        // SAFETY: AVX2 (the contract).
        unsafe { _mm256_and_si256(words, _mm256_set1_epi32(PAIR_MASK)) }
    }
    #[inline(always)]
    unsafe fn next_nibbles(words: __m256i) -> __m256i {
        // SAFETY: AVX2 (the contract).
        unsafe { _mm256_srli_epi32::<4>(words) }
    }
    #[inline(always)]
    unsafe fn dot_pair(acc: __m256i, codes: __m256i, x_pair: i32) -> __m256i {
        // SAFETY: AVX2 (the contract).
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(codes, _mm256_set1_epi32(x_pair))) }
    }
    #[inline(always)]
    unsafe fn add_int(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 (the contract).
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn to_float(sums: __m256i) -> __m256 {
        // SAFETY: AVX2 (the contract).
        unsafe { _mm256_cvtepi32_ps(sums) }
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

/// Keeps nibbles 0 and 4 of a word, as the low and high int16.
pub(super) const PAIR_MASK: i32 = 0x000F_000F;

/// Rows `rows` (multiples of 8, as the dispatcher's units are) of an INT4
/// job whose activations are `q`, 8 rows a ymm register.
///
/// # Safety
/// AVX2 and FMA are present; the job's shapes were checked by
/// `check_problem` (rows and group multiples of 8, slices of exact length)
/// and `q` is the job's activations quantized (columns a multiple of 32).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn run_rows(job: &Job, q: &QuantizedX, rows: Range<usize>) {
    // SAFETY: this function's contract, whose features Ymm needs.
    unsafe { run_rows_with::<Ymm>(job, q, rows) };
}

/// Rows `rows` of an INT4 job, `L::LANES` rows a vector, in chunks of
/// [`CHUNK_ROWS`]; returns the first row not computed (the rows left when
/// fewer than `L::LANES` remain).
///
/// # Safety
/// As [`run_rows`], with `L`'s features enabled by the (inlining) caller.
#[inline(always)]
pub(super) unsafe fn run_rows_with<L: Int4Lanes>(
    job: &Job,
    q: &QuantizedX,
    rows: Range<usize>,
) -> usize {
    let mut r0 = rows.start;
    while r0 + L::LANES <= rows.end {
        let blocks = ((rows.end - r0) / L::LANES).min(CHUNK_ROWS / L::LANES);
        let mut t0 = 0;
        while t0 < job.tokens {
            let left = job.tokens - t0;
            // SAFETY: r0 + LANES·blocks ≤ rows, and each arm's T ≤ the
            // tokens left (the last arm's `TOKEN_BLOCK` ≤ `left`).
            let tokens = unsafe {
                match left {
                    1 => row_chunk::<L, 1>(job, q, r0, blocks, t0),
                    2 => row_chunk::<L, 2>(job, q, r0, blocks, t0),
                    3 => row_chunk::<L, 3>(job, q, r0, blocks, t0),
                    _ => row_chunk::<L, TOKEN_BLOCK>(job, q, r0, blocks, t0),
                }
            };
            t0 += tokens;
        }
        r0 += blocks * L::LANES;
    }
    r0
}

/// Output rows `r0..r0 + LANES·blocks` of tokens `t0..t0 + T`; returns `T`.
///
/// # Safety
/// As [`run_rows_with`], with `r0 + LANES·blocks ≤ rows`,
/// `LANES·blocks ≤ CHUNK_ROWS` and `t0 + T ≤ tokens`.
#[inline(always)]
unsafe fn row_chunk<L: Int4Lanes, const T: usize>(
    job: &Job,
    q: &QuantizedX,
    r0: usize,
    blocks: usize,
    t0: usize,
) -> usize {
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
    // Per block and token: the outputs so far (whole groups), and the
    // current group's float sum of its segments.
    let mut total = [[zero; T]; MAX_BLOCKS];
    let mut group_sums = [[zero; T]; MAX_BLOCKS];
    let mut zeros = [zero; MAX_BLOCKS];
    let mut scale = [zero; MAX_BLOCKS];
    let words_per_group = group / INT4_PER_WORD;
    let zero_words_per_group = n_rows / INT4_PER_WORD;
    let packed_rows = cols / INT4_PER_WORD;
    // The activation block in use and, per token, its pairs of codes (word
    // within the block, pair) and its scale.
    let mut held_block = usize::MAX;
    let mut pairs = [[[0i32; PAIRS]; WORDS_PER_BLOCK]; T];
    let mut block_scale = [0.0f32; T];
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
            // The next group's, a row of the matrix away: too far for the
            // hardware prefetchers, and each waited on memory.
            if g + 1 < cols / group {
                prefetch_line(scales.as_ptr(), first + 2 * n_rows);
                prefetch_line(qzeros.as_ptr(), (first_word + zero_words_per_group) * 4);
            }
        }
        for block_sums in group_sums.iter_mut().take(blocks) {
            *block_sums = [zero; T];
        }
        let mut x_sum = [0.0f32; T];
        let group_end = (g + 1) * words_per_group;
        let mut k = g * words_per_group;
        while k < group_end {
            // The segment: words k..end, in one group and one activation block.
            let activation_block = k / WORDS_PER_BLOCK;
            let end = group_end.min((activation_block + 1) * WORDS_PER_BLOCK);
            if held_block != activation_block {
                held_block = activation_block;
                for t in 0..T {
                    (pairs[t], block_scale[t]) = q.column_pairs(t0 + t, activation_block);
                }
            }
            let within = k % WORDS_PER_BLOCK..(end - 1) % WORDS_PER_BLOCK + 1;
            for t in 0..T {
                let code_sum: i32 = pairs[t][within.clone()]
                    .iter()
                    .flatten()
                    .map(|&pair| i32::from(pair as i16) + (pair >> 16))
                    .sum();
                x_sum[t] += code_sum as f32 * block_scale[t];
            }
            let segment = Segment {
                qweight,
                block_start: activation_block * WORDS_PER_BLOCK,
                rows: n_rows,
                r0,
                prefetch_words: packed_rows,
            };
            for (b, block_sums) in group_sums.iter_mut().enumerate().take(blocks) {
                // SAFETY: as above; the segment's words lie inside qweight.
                // A whole activation block (the common case) as constants,
                // so its loop is unrolled.
                let sums = unsafe {
                    if within == (0..WORDS_PER_BLOCK) {
                        segment.sums::<L, T>(b, 0..WORDS_PER_BLOCK, &pairs)
                    } else {
                        segment.sums::<L, T>(b, within.clone(), &pairs)
                    }
                };
                for t in 0..T {
                    // SAFETY: as above.
                    block_sums[t] = unsafe {
                        L::fmadd(
                            L::to_float(sums[t]),
                            L::splat(block_scale[t]),
                            block_sums[t],
                        )
                    };
                }
            }
            k = end;
        }
        for b in 0..blocks {
            for t in 0..T {
                // SAFETY: as above.
                unsafe {
                    // Σ code·x̂ − zero · Σ x̂, times the scale.
                    let centred = L::fnmadd(zeros[b], L::splat(x_sum[t]), group_sums[b][t]);
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
    T
}

/// The packed input rows of one activation block (from `block_start`) of
/// a row chunk starting at row `r0`.
struct Segment<'a> {
    qweight: &'a [u8],
    block_start: usize,
    rows: usize,
    r0: usize,
    /// Packed input rows in all (none is prefetched past them).
    prefetch_words: usize,
}

impl Segment<'_> {
    /// Per token, the integer sums of block `b`'s codes in words `within`
    /// of the activation block times the activations' pairs.
    ///
    /// # Safety
    /// `L`'s features are enabled; words `within` for rows
    /// `r0 + LANES·b ..+ LANES` lie inside `qweight`.
    #[inline(always)]
    unsafe fn sums<L: Int4Lanes, const T: usize>(
        &self,
        b: usize,
        within: Range<usize>,
        pairs: &[[[i32; PAIRS]; WORDS_PER_BLOCK]; T],
    ) -> [L::I; T] {
        // Two sums per token (pairs 0, 2 and 1, 3), added at the end: the
        // integers are exact, so this only shortens the chains.
        // SAFETY: `L`'s features (the contract); so for every `L` call.
        let mut sums = [[unsafe { L::zero_int() }; 2]; T];
        for word in within {
            let kk = self.block_start + word;
            let at = (kk * self.rows + self.r0 + b * L::LANES) * 4;
            if kk + PREFETCH_ROWS < self.prefetch_words {
                prefetch_line(self.qweight.as_ptr(), at + PREFETCH_ROWS * self.rows * 4);
            }
            // SAFETY: inside qweight (the contract); as above.
            let mut words = unsafe { L::load_words(self.qweight.as_ptr().add(at)) };
            for j in 0..PAIRS {
                // SAFETY: as above.
                let codes = unsafe { L::first_pair(words) };
                // SAFETY: as above.
                words = unsafe { L::next_nibbles(words) };
                for t in 0..T {
                    let sum = &mut sums[t][j % 2];
                    // SAFETY: as above.
                    *sum = unsafe { L::dot_pair(*sum, codes, pairs[t][word][j]) };
                }
            }
        }
        // SAFETY: as above.
        sums.map(|[even, odd]| unsafe { L::add_int(even, odd) })
    }
}
