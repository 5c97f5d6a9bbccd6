//! x86-64 AVX2 MXFP4 kernels: FP4 codes times int16 activations, as
//! integers (activations quantized by [`crate::backend::cpu::kernels::quantize`]).
//!
//! Why integers: decoding FP4 to f32 costs about 40 vector instructions per
//! 64 weights, more than two cores issue at the memory bandwidth. Here 64
//! codes become int16 in 9 instructions (two byte lookups, then a shift or
//! a mask per vector) and `vpmaddwd` does 16 products per instruction.
//!
//! **One summation order.** An output is `Σ_b float(Σ_i c_i · q_i) · s_b`
//! where `c_i` is 512 × the E2M1 value (the doubled code in a word's high
//! byte), `q_i` the activation codes and `s_b = (E8M0_b / 512) · d_b`, exact
//! (powers of two). The integer sums are exact (a lane adds 8 products:
//! `8 · 3072 · 32768 < 2^31`), so only the f32 part has an order, and it
//! depends on `cols` only:
//!
//! 1. blocks go in pairs (2p, 2p + 1): lanes 0-3 hold four partial integer
//!    sums of block 2p, lanes 4-7 four of block 2p + 1; a lone last block
//!    fills lanes 0-3 (lanes 4-7 add zero). Pair by pair in ascending order,
//!    one 8-lane accumulator takes `float(sums) · scales` by fused
//!    multiply-add;
//! 2. the 8 lanes are reduced as in `avx2.rs` (`lanes::reduce`).
//!
//! Both paths run the same tile code and differ only in where the decoded
//! weights come from: decoded as they stream from memory (GEMV, few tokens),
//! or from a panel decoded once per block of rows (many tokens).
//!
//! Every `unsafe fn` here requires AVX2 and FMA (entered only through
//! `Isa::Avx2`), and the shapes `check_problem` verified. Those that take a
//! `job` also require **the job contract** (as in `avx2.rs`): the job passed
//! `check_problem` (its MXFP4 data holds `rows × cols` codes and
//! `rows × cols / 32` scales, `x` holds `tokens × cols` f32 and `out` is
//! valid for writes of `tokens × rows` f32), the rows they are given lie
//! inside `0..rows`, and no other thread writes those rows' outputs
//! (`out[t · rows + r]`) meanwhile: each work unit owns its rows.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::lanes::{in_lockstep, reduce};
use crate::backend::cpu::kernels::job::{Job, Path};
use crate::backend::cpu::kernels::prefetch::{LINE, STREAM_AHEAD, prefetch_line};
use crate::backend::cpu::kernels::quantize::{
    BLOCK, CODE_UNSCALE, DOUBLED_E2M1, QuantizedX, SCALE_GROUP, block_scale, code_position,
    code_scale, scale_position,
};
use crate::formats::E8M0_NAN;

/// Problems with at most this many tokens take the GEMV path.
const GEMV_MAX_TOKENS: usize = 4;
/// Tokens a tile holds. Panel tiles are 1 row × NT tokens: with more rows
/// the accumulators and scales no longer fit the 16 registers (measured:
/// 2 × 4 ran at 60% of 1 × 4).
const NT: usize = 4;
/// Decoded panel: 32-byte vectors (96 KiB on the stack, L2-resident).
const PANEL_VECTORS: usize = 3072;
/// Decoded panel: f32 weight scales.
const PANEL_SCALES: usize = 2048;
/// Most rows decoded into one panel.
const PANEL_MAX_ROWS: usize = 24;

/// The rows of a matrix in the kernel's terms.
#[derive(Clone, Copy)]
struct Shape {
    blocks: usize,
    /// Whole pairs of blocks.
    pairs: usize,
    /// Whole groups of 8 scales.
    groups: usize,
    /// Whether the last block has no partner.
    lone: bool,
}

impl Shape {
    fn of(cols: usize) -> Shape {
        let blocks = cols / BLOCK;
        Shape {
            blocks,
            pairs: blocks / 2,
            groups: blocks / SCALE_GROUP,
            lone: blocks % 2 == 1,
        }
    }

    /// 32-byte vectors of one decoded panel row.
    fn panel_stride(self) -> usize {
        4 * self.pairs + if self.lone { 2 } else { 0 }
    }
}

/// Which path a problem takes (the panel needs room for a row).
pub(super) fn choose_path(cols: usize, tokens: usize) -> Path {
    if tokens > GEMV_MAX_TOKENS && panel_rows_for(Shape::of(cols)) > 0 {
        Path::Panel
    } else {
        Path::Gemv
    }
}

/// Rows per panel block: as many as fit the panel (0 if none does).
fn panel_rows_for(shape: Shape) -> usize {
    let by_codes = PANEL_VECTORS / shape.panel_stride().max(1);
    let by_scales = PANEL_SCALES / shape.blocks.max(1);
    by_codes.min(by_scales).min(PANEL_MAX_ROWS)
}

/// Runs rows `rows` of an MXFP4 problem whose activations are `q`.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (callers are reached only through `Isa::Avx2`,
/// which exists only after runtime detection). `codes` and `scales` are
/// `job.weight`'s MXFP4 data, `q` is `job.x` quantized
/// (`q.cols == job.weight.cols`, all `job.tokens` tokens), and the job contract
/// of the module docs holds for `job` and `rows`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn run_rows(
    codes: &[u8],
    scales: &[u8],
    q: &QuantizedX,
    job: &Job,
    rows: Range<usize>,
) {
    let shape = Shape::of(job.weight.cols);
    let stream = Stream {
        codes,
        scales,
        shape,
    };
    // SAFETY: this function's contract.
    unsafe {
        match job.path {
            Path::Gemv if job.tokens <= 2 => in_lockstep::<4>(
                rows,
                |set| gemv(&stream, q, job, set),
                |row| gemv(&stream, q, job, [row]),
            ),
            Path::Gemv => in_lockstep::<2>(
                rows,
                |set| gemv(&stream, q, job, set),
                |row| gemv(&stream, q, job, [row]),
            ),
            Path::Panel => panel(&stream, q, job, rows),
        }
    }
}

/// Where a tile finds its decoded weights.
trait Weights {
    /// Pair `p` of row `r`: four vectors of 8 + 8 int16 codes (group g of
    /// block 2p, then of block 2p + 1), matching the activation layout.
    ///
    /// # Safety
    ///
    /// The CPU supports AVX2 and FMA (callers are reached only through
    /// `Isa::Avx2`, which exists only after runtime detection). `r` is a row
    /// these weights hold (for a [`Panel`], one decoded into it) and
    /// `p < shape.pairs`.
    unsafe fn pair(&self, r: usize, p: usize) -> [__m256i; 4];
    /// The lone last block of row `r`: its 4 groups of 8 codes.
    ///
    /// # Safety
    ///
    /// The CPU supports AVX2 and FMA (callers are reached only through
    /// `Isa::Avx2`, which exists only after runtime detection). `r` is a row
    /// these weights hold (for a [`Panel`], one decoded into it) and the shape
    /// has a lone last block (`shape.lone`).
    unsafe fn lone(&self, r: usize) -> [__m128i; 4];
    /// Scales (× 1/512) of group `g` of row `r`, lanes 0 2 4 6 1 3 5 7.
    ///
    /// # Safety
    ///
    /// The CPU supports AVX2 and FMA (callers are reached only through
    /// `Isa::Avx2`, which exists only after runtime detection). `r` is a row
    /// these weights hold (for a [`Panel`], one decoded into it) and
    /// `g < shape.groups`.
    unsafe fn group_scales(&self, r: usize, g: usize) -> __m256;
    /// Scale (× 1/512) of block `b` of row `r`, after the whole groups.
    ///
    /// # Safety
    ///
    /// The CPU supports AVX2 and FMA (callers are reached only through
    /// `Isa::Avx2`, which exists only after runtime detection). `r` is a row
    /// these weights hold (for a [`Panel`], one decoded into it) and
    /// `b < shape.blocks`.
    unsafe fn block_scale(&self, r: usize, b: usize) -> f32;
    /// Asks for row `r`'s codes some way past pair `p`, where they still
    /// stream from memory (see `kernels::prefetch`); a hint only.
    fn prefetch(&self, _r: usize, _p: usize) {}
}

/// Decodes straight from the mapped weights.
struct Stream<'a> {
    codes: &'a [u8],
    scales: &'a [u8],
    shape: Shape,
}

impl Weights for Stream<'_> {
    /// [`Weights::pair`], decoded from the mapped codes.
    ///
    /// # Safety
    ///
    /// As [`Weights::pair`]: AVX2 and FMA, `r < rows` of the checked matrix and
    /// `p < pairs`, i.e. 32 readable bytes of `codes` from
    /// `(r · blocks + 2p) · 16`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn pair(&self, r: usize, p: usize) -> [__m256i; 4] {
        let offset = (r * self.shape.blocks + 2 * p) * BLOCK / 2;
        // SAFETY: the pair lies inside row r of the checked matrix.
        unsafe { decode_pair(self.codes.as_ptr().add(offset)) }
    }
    /// [`Weights::lone`], decoded from the mapped codes.
    ///
    /// # Safety
    ///
    /// As [`Weights::lone`]: AVX2 and FMA, `r < rows` of the checked matrix and
    /// `shape.lone`, i.e. 16 readable bytes of `codes` from
    /// `(r · blocks + blocks − 1) · 16`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn lone(&self, r: usize) -> [__m128i; 4] {
        let offset = (r * self.shape.blocks + self.shape.blocks - 1) * BLOCK / 2;
        // SAFETY: as above.
        unsafe { decode_block(self.codes.as_ptr().add(offset)) }
    }
    /// [`Weights::group_scales`], decoded from the mapped scales.
    ///
    /// # Safety
    ///
    /// As [`Weights::group_scales`]: AVX2 and FMA, `r < rows` of the checked
    /// matrix and `g < groups`, i.e. 8 readable bytes of `scales` from
    /// `r · blocks + 8g`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn group_scales(&self, r: usize, g: usize) -> __m256 {
        let offset = r * self.shape.blocks + g * SCALE_GROUP;
        // SAFETY: as above.
        unsafe { decode_group_scales(self.scales.as_ptr().add(offset)) }
    }
    /// [`Weights::block_scale`], decoded from the mapped scales.
    ///
    /// # Safety
    ///
    /// As [`Weights::block_scale`]: AVX2 and FMA (the scale byte itself is read
    /// bounds-checked).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block_scale(&self, r: usize, b: usize) -> f32 {
        code_scale(self.scales[r * self.shape.blocks + b])
    }
    /// Once per cache line of the row (a pair is 32 bytes of codes).
    #[inline(always)]
    fn prefetch(&self, r: usize, p: usize) {
        let at = p * BLOCK;
        if at % LINE < BLOCK {
            let row = r * self.shape.blocks * BLOCK / 2;
            prefetch_line(self.codes.as_ptr(), row + at + STREAM_AHEAD);
        }
    }
}

/// `quantize::DOUBLED_E2M1` as a byte lookup table, in both lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn doubled_e2m1() -> __m256i {
    // SAFETY: the table is 16 readable bytes; loadu has no alignment need.
    let table = unsafe { _mm_loadu_si128(DOUBLED_E2M1.as_ptr() as *const __m128i) };
    _mm256_broadcastsi128_si256(table)
}

/// Decodes two consecutive blocks (32 bytes at `p`: block 2p in the low
/// 128-bit lane, 2p + 1 in the high one) into the 4 groups of
/// `quantize::code_position`.
///
/// Byte j holds element 2j in its low nibble and 2j + 1 in its high one.
/// Looking the low nibbles up gives the doubled even codes, one per byte,
/// so 16-bit word k holds element 4k in its low byte and 4k + 2 in its
/// high one; shifting the low byte up (or masking it off) leaves one code
/// in a word's high byte: an int16 worth 256 × the doubled code, i.e. 512
/// × the E2M1 value. The high nibbles give elements 4k + 1 and 4k + 3.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (callers are reached only through `Isa::Avx2`,
/// which exists only after runtime detection). `p` points to at least 32
/// readable bytes (no alignment needed).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn decode_pair(p: *const u8) -> [__m256i; 4] {
    let nibble = _mm256_set1_epi8(0x0F);
    let high_byte = _mm256_set1_epi16(0xFF00u16 as i16);
    // SAFETY: the caller's contract; loadu has no alignment need.
    let bytes = unsafe { _mm256_loadu_si256(p as *const __m256i) };
    let even = _mm256_shuffle_epi8(doubled_e2m1(), _mm256_and_si256(bytes, nibble));
    let odd = _mm256_shuffle_epi8(
        doubled_e2m1(),
        _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble),
    );
    [
        _mm256_slli_epi16(even, 8),
        _mm256_and_si256(even, high_byte),
        _mm256_slli_epi16(odd, 8),
        _mm256_and_si256(odd, high_byte),
    ]
}

/// [`decode_pair`] for one block (16 bytes at `p`).
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (callers are reached only through `Isa::Avx2`,
/// which exists only after runtime detection). `p` points to at least 16
/// readable bytes (no alignment needed).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn decode_block(p: *const u8) -> [__m128i; 4] {
    let nibble = _mm_set1_epi8(0x0F);
    let high_byte = _mm_set1_epi16(0xFF00u16 as i16);
    let table = _mm256_castsi256_si128(doubled_e2m1());
    // SAFETY: the caller's contract.
    let bytes = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let even = _mm_shuffle_epi8(table, _mm_and_si128(bytes, nibble));
    let odd = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble));
    [
        _mm_slli_epi16(even, 8),
        _mm_and_si128(even, high_byte),
        _mm_slli_epi16(odd, 8),
        _mm_and_si128(odd, high_byte),
    ]
}

/// 8 E8M0 bytes at `p` → their scales × 1/512, in lanes 0 2 4 6 1 3 5 7
/// (`crate::formats::e8m0_to_f32`'s rule): the exponent byte shifted into
/// place is the f32 2^(e − 127), except e = 0 (2^-127 is a subnormal) and
/// e = 0xFF (NaN); × 1/512 is exact.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (callers are reached only through `Isa::Avx2`,
/// which exists only after runtime detection). `p` points to at least 8
/// readable bytes (no alignment needed).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn decode_group_scales(p: *const u8) -> __m256 {
    // SAFETY: the caller's contract.
    let bytes = unsafe { _mm_loadl_epi64(p as *const __m128i) };
    let order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, -1, -1, -1, -1, -1, -1, -1, -1);
    let e = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(bytes, order));
    let bits = _mm256_slli_epi32(e, 23);
    let is_zero = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
    let bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x0040_0000), is_zero);
    let is_nan = _mm256_cmpeq_epi32(e, _mm256_set1_epi32(i32::from(E8M0_NAN)));
    let bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(f32::NAN.to_bits() as i32), is_nan);
    _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(CODE_UNSCALE))
}

/// Lanes 0-3 ← lane k, lanes 4-7 ← lane 4 + k: pair k's scales of a group.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn pair_scales(s: __m256, k: usize) -> __m256 {
    match k {
        0 => _mm256_permute_ps::<0x00>(s),
        1 => _mm256_permute_ps::<0x55>(s),
        2 => _mm256_permute_ps::<0xAA>(s),
        _ => _mm256_permute_ps::<0xFF>(s),
    }
}

/// Integer partial sums of one pair against a token's codes at `x`.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (callers are reached only through `Isa::Avx2`,
/// which exists only after runtime detection). `x` points to at least 64
/// readable i16 (no alignment needed).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn pair_sums(w: &[__m256i; 4], x: *const i16) -> __m256i {
    // SAFETY: the caller's contract.
    let s: [__m256i; 4] = std::array::from_fn(|g| unsafe {
        _mm256_madd_epi16(w[g], _mm256_loadu_si256(x.add(16 * g) as *const __m256i))
    });
    _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]))
}

/// [`pair_sums`] for the lone block (32 codes at `x`), in lanes 0-3.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (callers are reached only through `Isa::Avx2`,
/// which exists only after runtime detection). `x` points to at least 32
/// readable i16 (no alignment needed).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn lone_sums(w: &[__m128i; 4], x: *const i16) -> __m256i {
    // SAFETY: the caller's contract.
    let s: [__m128i; 4] = std::array::from_fn(|g| unsafe {
        _mm_madd_epi16(w[g], _mm_loadu_si128(x.add(8 * g) as *const __m128i))
    });
    let sums = _mm_add_epi32(_mm_add_epi32(s[0], s[1]), _mm_add_epi32(s[2], s[3]));
    _mm256_inserti128_si256::<0>(_mm256_setzero_si256(), sums)
}

/// `R` rows × `T` tokens from `t0`, every column: the one summation order
/// of the module. `rows[r]` is row r in `w`'s terms, `out_rows[r]` the
/// output row it writes.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (callers are reached only through `Isa::Avx2`,
/// which exists only after runtime detection). `w` holds rows `rows` in the
/// shape of `q.cols` (its pairs, lone block, groups and scales, as the
/// [`Weights`] methods require); `q` is `job.x` quantized with
/// `q.cols == job.weight.cols`; tokens `t0..t0 + T` exist
/// (`t0 + T ≤ job.tokens`); and the job contract of the module docs holds for
/// every row of `out_rows` (inside `0..rows`, its outputs owned by the caller's
/// unit).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<W: Weights, const R: usize, const T: usize>(
    w: &W,
    rows: [usize; R],
    out_rows: [usize; R],
    q: &QuantizedX,
    t0: usize,
    job: &Job,
) {
    let shape = Shape::of(q.cols);
    let codes: [*const i16; T] = std::array::from_fn(|t| q.codes_of(t0 + t).as_ptr());
    let scales: [&[f32]; T] = std::array::from_fn(|t| q.scales_of(t0 + t));
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    // SAFETY: (whole body) pairs, blocks and groups are inside the rows of
    // `w` and the tokens' codes, per the shape of the checked problem.
    unsafe {
        for g in 0..shape.groups {
            let ws: [__m256; R] = std::array::from_fn(|r| w.group_scales(rows[r], g));
            let s: [[__m256; T]; R] = std::array::from_fn(|r| {
                std::array::from_fn(|t| {
                    let x = _mm256_loadu_ps(scales[t].as_ptr().add(g * SCALE_GROUP));
                    _mm256_mul_ps(ws[r], x)
                })
            });
            for k in 0..SCALE_GROUP / 2 {
                let p = g * SCALE_GROUP / 2 + k;
                for r in 0..R {
                    w.prefetch(rows[r], p);
                    let wp = w.pair(rows[r], p);
                    for t in 0..T {
                        let sums = pair_sums(&wp, codes[t].add(2 * BLOCK * p));
                        let scale = pair_scales(s[r][t], k);
                        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[r][t]);
                    }
                }
            }
        }
        for p in shape.groups * SCALE_GROUP / 2..shape.pairs {
            for r in 0..R {
                let wp = w.pair(rows[r], p);
                let (w0, w1) = (
                    w.block_scale(rows[r], 2 * p),
                    w.block_scale(rows[r], 2 * p + 1),
                );
                for t in 0..T {
                    let sums = pair_sums(&wp, codes[t].add(2 * BLOCK * p));
                    let scale = _mm256_set_m128(
                        _mm_set1_ps(w1 * scales[t][2 * p + 1]),
                        _mm_set1_ps(w0 * scales[t][2 * p]),
                    );
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[r][t]);
                }
            }
        }
        if shape.lone {
            let b = shape.blocks - 1;
            for r in 0..R {
                let wb = w.lone(rows[r]);
                let wscale = w.block_scale(rows[r], b);
                for t in 0..T {
                    let sums = lone_sums(&wb, codes[t].add(BLOCK * b));
                    // Lanes 4-7 add 0 · 0 (never 0 · inf).
                    let scale =
                        _mm256_set_m128(_mm_setzero_ps(), _mm_set1_ps(wscale * scales[t][b]));
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[r][t]);
                }
            }
        }
        let n_rows = job.weight.rows;
        for (r, acc_r) in acc.iter().enumerate() {
            for (t, &a) in acc_r.iter().enumerate() {
                *job.out.get().add((t0 + t) * n_rows + out_rows[r]) = reduce(a);
            }
        }
    }
}

/// GEMV path: one set of rows against every token, a tile of tokens at a
/// time (the rows stay in L1 between tiles).
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (callers are reached only through `Isa::Avx2`,
/// which exists only after runtime detection). `w` streams `job.weight`'s MXFP4
/// data, `q` is `job.x` quantized (`q.cols == job.weight.cols`), and the job
/// contract of the module docs holds for `job` and every row of `rows`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn gemv<const R: usize>(w: &Stream, q: &QuantizedX, job: &Job, rows: [usize; R]) {
    let mut t0 = 0;
    while t0 < job.tokens {
        let tn = (job.tokens - t0).min(NT);
        // SAFETY: tokens t0..t0 + tn exist; the unit owns the rows.
        unsafe {
            match tn {
                1 => tile::<_, R, 1>(w, rows, rows, q, t0, job),
                2 => tile::<_, R, 2>(w, rows, rows, q, t0, job),
                3 => tile::<_, R, 3>(w, rows, rows, q, t0, job),
                _ => tile::<_, R, 4>(w, rows, rows, q, t0, job),
            }
        }
        t0 += tn;
    }
}

/// A block of rows decoded once: per row `stride` vectors of codes, then
/// `blocks` scales (× 1/512) in the activation scales' order.
struct Panel {
    codes: *const __m256i,
    scales: *const f32,
    shape: Shape,
}

impl Weights for Panel {
    /// [`Weights::pair`], from the decoded panel (aligned loads).
    ///
    /// # Safety
    ///
    /// As [`Weights::pair`]: AVX2 and FMA, `r` one of the rows `panel` decoded
    /// into `codes` (32-byte aligned, `panel_stride()` vectors a row) and
    /// `p < pairs`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn pair(&self, r: usize, p: usize) -> [__m256i; 4] {
        let base = r * self.shape.panel_stride() + 4 * p;
        // SAFETY: decoded by `panel` for every row and pair of the block.
        std::array::from_fn(|g| unsafe { _mm256_load_si256(self.codes.add(base + g)) })
    }
    /// [`Weights::lone`], from the decoded panel (aligned loads).
    ///
    /// # Safety
    ///
    /// As [`Weights::lone`]: AVX2 and FMA, `r` one of the rows `panel` decoded
    /// into `codes` (32-byte aligned, `panel_stride()` vectors a row) and
    /// `shape.lone`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn lone(&self, r: usize) -> [__m128i; 4] {
        let base = (r * self.shape.panel_stride() + 4 * self.shape.pairs) as isize;
        let p = self.codes as *const __m128i;
        // SAFETY: as above (the lone block is two vectors after the pairs).
        std::array::from_fn(|g| unsafe { _mm_load_si128(p.offset(2 * base + g as isize)) })
    }
    /// [`Weights::group_scales`], from the decoded panel.
    ///
    /// # Safety
    ///
    /// As [`Weights::group_scales`]: AVX2 and FMA, `r` one of the rows `panel`
    /// decoded into `scales` (`blocks` values a row) and `g < groups`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn group_scales(&self, r: usize, g: usize) -> __m256 {
        // SAFETY: as above.
        unsafe { _mm256_loadu_ps(self.scales.add(r * self.shape.blocks + g * SCALE_GROUP)) }
    }
    /// [`Weights::block_scale`], from the decoded panel.
    ///
    /// # Safety
    ///
    /// As [`Weights::block_scale`]: AVX2 and FMA, `r` one of the rows `panel`
    /// decoded into `scales` (`blocks` values a row) and `b < blocks`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block_scale(&self, r: usize, b: usize) -> f32 {
        // SAFETY: as above.
        unsafe { *self.scales.add(r * self.shape.blocks + b) }
    }
}

#[repr(C, align(32))]
struct PanelCodes([MaybeUninit<__m256i>; PANEL_VECTORS]);

/// Panel path: for each block of rows, decode it into the panel, then run
/// 1 × `NT` tiles over every token (a token tile's codes stay in L1 while
/// the panel streams from L2).
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (callers are reached only through `Isa::Avx2`,
/// which exists only after runtime detection). `stream` streams `job.weight`'s
/// MXFP4 data, `q` is `job.x` quantized (`q.cols == job.weight.cols`), and the
/// job contract of the module docs holds for `job` and `rows` (the panel's size
/// is derived from the shape, so every block fits it).
#[target_feature(enable = "avx2,fma")]
unsafe fn panel(stream: &Stream, q: &QuantizedX, job: &Job, rows: Range<usize>) {
    let shape = stream.shape;
    let stride = shape.panel_stride();
    let block_rows = panel_rows_for(shape);
    let mut codes = PanelCodes([MaybeUninit::uninit(); PANEL_VECTORS]);
    let mut scales = [0.0f32; PANEL_SCALES];
    let codes_base = codes.0.as_mut_ptr() as *mut __m256i;
    let mut block = rows.start;
    while block < rows.end {
        let nb = block_rows.min(rows.end - block);
        // SAFETY: (decoding) rows block..block + nb exist; nb × stride ≤
        // PANEL_VECTORS and nb × blocks ≤ PANEL_SCALES by `panel_rows_for`.
        unsafe {
            for r in 0..nb {
                let row = block + r;
                let dst = codes_base.add(r * stride);
                for p in 0..shape.pairs {
                    for (g, v) in stream.pair(row, p).into_iter().enumerate() {
                        _mm256_store_si256(dst.add(4 * p + g), v);
                    }
                }
                if shape.lone {
                    let dst = dst.add(4 * shape.pairs) as *mut __m128i;
                    for (g, v) in stream.lone(row).into_iter().enumerate() {
                        _mm_store_si128(dst.add(g), v);
                    }
                }
                let s = &mut scales[r * shape.blocks..(r + 1) * shape.blocks];
                for g in 0..shape.groups {
                    let v = stream.group_scales(row, g);
                    _mm256_storeu_ps(s.as_mut_ptr().add(g * SCALE_GROUP), v);
                }
                for (b, v) in s.iter_mut().enumerate().skip(shape.groups * SCALE_GROUP) {
                    *v = stream.block_scale(row, b);
                }
            }
        }
        let decoded = Panel {
            codes: codes_base,
            scales: scales.as_ptr(),
            shape,
        };
        let mut t0 = 0;
        while t0 < job.tokens {
            let tn = (job.tokens - t0).min(NT);
            for r in 0..nb {
                let rows = ([r], [block + r]);
                // SAFETY: panel row r was decoded above; tokens t0..t0 + tn
                // exist; the unit owns the output row.
                unsafe {
                    match tn {
                        1 => tile::<_, 1, 1>(&decoded, rows.0, rows.1, q, t0, job),
                        2 => tile::<_, 1, 2>(&decoded, rows.0, rows.1, q, t0, job),
                        3 => tile::<_, 1, 3>(&decoded, rows.0, rows.1, q, t0, job),
                        _ => tile::<_, 1, 4>(&decoded, rows.0, rows.1, q, t0, job),
                    }
                }
            }
            t0 += tn;
        }
        block += nb;
    }
}

/// `quantize::quantize_row` with AVX2, bit for bit: the same scale, the same
/// rounding (`vcvtps2dq` rounds to nearest even, as the scalar rounder
/// does), the same saturation (`vpackssdw`, as the scalar `as i16`) and the
/// same layout.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (the caller checks
/// `Isa::Avx2.is_available()`). That is the only obligation for memory: every
/// access is bounds-checked against the slices or inside `x`'s whole blocks.
/// For the result to be right, `x.len()` is a multiple of 32, `codes` as long
/// as `x` and `scales` holding `x.len() / 32` values (a short `codes` or
/// `scales` panics).
#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn quantize_row(
    x: &[f32],
    codes: &mut [i16],
    scales: &mut [f32],
) {
    let blocks = x.len() / BLOCK;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    // Within each 128-bit lane of 8 int16 (a, a+1, .., a+7): a a+4 | a+2
    // a+6 | a+1 a+5 | a+3 a+7, i.e. one 32-bit pair per group.
    let by_group = _mm256_broadcastsi128_si256(_mm_setr_epi8(
        0, 1, 8, 9, 4, 5, 12, 13, 2, 3, 10, 11, 6, 7, 14, 15,
    ));
    let pairs_in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..blocks {
        // SAFETY: block b lies inside x.
        let v: [__m256; 4] =
            std::array::from_fn(|k| unsafe { _mm256_loadu_ps(x.as_ptr().add(b * BLOCK + 8 * k)) });
        let max = v.iter().fold(_mm256_setzero_ps(), |m, &v| {
            _mm256_max_ps(m, _mm256_and_ps(v, abs_mask))
        });
        let nan = v.iter().fold(_mm256_setzero_ps(), |n, &v| {
            _mm256_or_ps(n, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v))
        });
        let max = _mm_max_ps(_mm256_castps256_ps128(max), _mm256_extractf128_ps(max, 1));
        let max = _mm_max_ps(max, _mm_movehl_ps(max, max));
        let max = _mm_max_ss(max, _mm_shuffle_ps::<1>(max, max));
        let amax = if _mm256_movemask_ps(nan) != 0 {
            f32::NAN
        } else {
            _mm_cvtss_f32(max)
        };
        let scale = block_scale(amax);
        scales[scale_position(blocks, b)] = scale;
        let start = code_position(blocks, b, 0);
        let lone = b + 1 == blocks && blocks % 2 == 1;
        let stride = if lone { 8 } else { 16 };
        let dst = codes[start..start + 3 * stride + 8].as_mut_ptr();
        if scale.is_nan() {
            for g in 0..4 {
                // SAFETY: group g's 8 codes lie inside the slice above.
                unsafe {
                    _mm_storeu_si128(dst.add(g * stride) as *mut __m128i, _mm_setzero_si128())
                };
            }
            continue;
        }
        let inverse = _mm256_set1_ps(1.0 / scale);
        let q: [__m256i; 4] =
            std::array::from_fn(|k| _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inverse)));
        // int16 in natural order: values 0-15 and 16-31.
        let low = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[0], q[1]));
        let high = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[2], q[3]));
        let (low, high) = (
            _mm256_shuffle_epi8(low, by_group),
            _mm256_shuffle_epi8(high, by_group),
        );
        // Groups 0 | 1 (values ≡ 0, 2 mod 4) and 2 | 3 (≡ 1, 3 mod 4).
        let first = _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi32(low, high), pairs_in_order);
        let second = _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi32(low, high), pairs_in_order);
        // SAFETY: as above.
        unsafe {
            _mm_storeu_si128(dst as *mut __m128i, _mm256_castsi256_si128(first));
            _mm_storeu_si128(
                dst.add(stride) as *mut __m128i,
                _mm256_extracti128_si256::<1>(first),
            );
            _mm_storeu_si128(
                dst.add(2 * stride) as *mut __m128i,
                _mm256_castsi256_si128(second),
            );
            _mm_storeu_si128(
                dst.add(3 * stride) as *mut __m128i,
                _mm256_extracti128_si256::<1>(second),
            );
        }
    }
}
