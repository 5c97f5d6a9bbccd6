//! x86-64 integer FP4 kernels: the FP4 codes of MXFP4 (gpt-oss) and NVFP4
//! (ModelOpt, compressed-tensors) weights times int16 activations, as
//! integers (activations quantized by [`crate::backend::cpu::kernels::quantize`]).
//!
//! Why integers: decoding FP4 to f32 costs more vector instructions per
//! weight than two cores issue at the memory bandwidth (NVFP4's table
//! permutes, `avx512_nvfp4.rs`, reached 63-90% of it). Here 64 codes become
//! int16 in 9 instructions (two byte lookups, then a shift or a mask per
//! vector) and `vpmaddwd` does 16 products per instruction.
//!
//! **One summation order.** An output is `Σ_p float(Σ_i c_i · q_i) · s_p`
//! over the 64-value pairs `p` of activation blocks, where `c_i` is 512 ×
//! the E2M1 value (the doubled code in a word's high byte), `q_i` the
//! activation codes and `s_p` the pair's 8 lane scales: weight scale × 1/512
//! × activation block scale. The integer sums are exact (a lane adds 8
//! products: `8 · 3072 · 32768 < 2^31`), so only the f32 part has an order,
//! and it depends on `cols` and the format only:
//!
//! 1. activation blocks (32 values) go in pairs (2p, 2p + 1): lanes 0-3 hold
//!    four partial integer sums of block 2p (values 8j .. 8j + 7 in lane j),
//!    lanes 4-7 four of block 2p + 1; a lone last block fills lanes 0-3
//!    (lanes 4-7 add zero). A lane's weight scale is its block's: MXFP4 has
//!    one per 32 values (lanes 0-3 and 4-7), NVFP4 one per 16 (lanes 0-1,
//!    2-3, 4-5, 6-7). Unit by unit (pairs, then the lone block) in
//!    ascending order, the accumulator of the unit's parity (8 lanes) takes
//!    `float(sums) · scales` by fused multiply-add;
//! 2. the even units' accumulator and the odd units' are added lane by lane
//!    (where the units are odd in number, the odd accumulator first adds
//!    0 · 0, as the wide tile's last couple does), and the 8 lanes are
//!    reduced as in `avx2.rs` (`lanes::reduce`).
//!
//! Units alternate between two accumulators so that the AVX-512 tiers can
//! take a couple of units (128 values) per zmm instruction, the even one in
//! the low 8 lanes and the odd one in the high 8 (`tile_wide`, with
//! `vpdpwssd` where the CPU has AVX-512 VNNI): every lane sees the same
//! operations as in the AVX2 tile (`tile`), so every tier gives the same
//! bits. Both paths run the same tile code and differ only in where the
//! decoded weights come from: decoded as they stream from memory (GEMV, few
//! tokens), or from a panel decoded once per block of rows (many tokens).
//!
//! Every `unsafe fn` here requires AVX2 and FMA (entered only through an x86
//! tier), and the shapes `check_problem` verified. Those that take a `job`
//! also require **the job contract** (as in `avx2.rs`): the job passed
//! `check_problem` (its FP4 data holds `rows × cols` codes and
//! `rows × cols / VALUES` scales, `x` holds `tokens × cols` f32 and `out` is
//! valid for writes of `tokens × rows` f32), the rows they are given lie
//! inside `0..rows`, and no other thread writes those rows' outputs
//! (`out[t · rows + r]`) meanwhile: each work unit owns its rows.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::fp4_scales::{BlockScales, GROUP_VALUES, couple_lanes_0246, pair_scales};
use super::lanes::{lockstep_sets, reduce};
use crate::backend::cpu::kernels::isa::{Isa, has_feature};
use crate::backend::cpu::kernels::job::{Job, Path};
use crate::backend::cpu::kernels::prefetch::{LINE, STREAM_AHEAD, prefetch_line};
use crate::backend::cpu::kernels::quantize::{BLOCK, DOUBLED_E2M1, QuantizedX, SCALE_GROUP};
use crate::formats::NVFP4_GROUP;

/// Problems with at most this many tokens take the GEMV path.
const GEMV_MAX_TOKENS: usize = 4;
/// Tokens a tile holds. Panel tiles are 1 row × NT tokens: with more rows
/// the accumulators and scales no longer fit the 16 registers (measured:
/// 2 × 4 ran at 60% of 1 × 4).
const NT: usize = 4;
/// Decoded panel: 32-byte vectors (96 KiB on the stack, L2-resident).
const PANEL_VECTORS: usize = 3072;
/// Decoded panel: f32 weight scales (16 KiB).
const PANEL_SCALES: usize = 4096;
/// Most rows decoded into one panel.
const PANEL_MAX_ROWS: usize = 24;

/// The rows of a matrix in the kernel's terms (activation blocks).
#[derive(Clone, Copy)]
struct Shape {
    blocks: usize,
    /// Whole pairs of blocks.
    pairs: usize,
    /// Whole groups of 8 blocks.
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

    /// Weight scales per row, one per `S::VALUES` of its `32 · blocks` values.
    fn row_scales<S: BlockScales>(self) -> usize {
        self.blocks * BLOCK / S::VALUES
    }

    /// Pairs and the lone block: the units the accumulators alternate over.
    fn units(self) -> usize {
        self.pairs + usize::from(self.lone)
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

/// Rows per panel block: as many as fit the panel (0 if none does). Sized
/// for NVFP4's scales (twice MXFP4's), so both formats cut rows alike.
fn panel_rows_for(shape: Shape) -> usize {
    let by_codes = PANEL_VECTORS / shape.panel_stride().max(1);
    let by_scales = PANEL_SCALES / (shape.blocks * BLOCK / NVFP4_GROUP).max(1);
    by_codes.min(by_scales).min(PANEL_MAX_ROWS)
}

/// Runs rows `rows` of an FP4 problem (`codes` and `scales` its data,
/// `format` its scales' rule) whose activations are `q`, on `isa`.
///
/// # Safety
///
/// `isa` is an x86 tier this CPU has (AVX2 and FMA, and AVX-512F/VL where
/// `isa.runs_avx512()`). `codes` and `scales` are `job.weight`'s FP4 data in
/// `S`'s format, `q` is `job.x` quantized (`q.cols == job.weight.cols`, all
/// `job.tokens` tokens), and the job contract of the module docs holds for
/// `job` and `rows`.
pub(super) unsafe fn run_rows<S: BlockScales>(
    isa: Isa,
    stream: Stream<S>,
    q: &QuantizedX,
    job: &Job,
    rows: Range<usize>,
) {
    // SAFETY: the features each entry point enables are present (the
    // caller's contract); the rest is this function's contract.
    unsafe {
        if isa.runs_avx512() && has_feature("avx512vnni") {
            run_rows_avx512_vnni(&stream, q, job, rows)
        } else if isa.runs_avx512() {
            run_rows_avx512(&stream, q, job, rows)
        } else {
            run_rows_avx2(&stream, q, job, rows)
        }
    }
}

/// [`run_body`] compiled for AVX2 + FMA.
///
/// # Safety
///
/// As [`run_body`].
#[target_feature(enable = "avx2,fma")]
unsafe fn run_rows_avx2<S: BlockScales>(
    stream: &Stream<S>,
    q: &QuantizedX,
    job: &Job,
    rows: Range<usize>,
) {
    // SAFETY: this function's contract; the features are enabled here.
    unsafe { run_body::<S, false, false>(stream, q, job, rows) }
}

/// [`run_body`] compiled with AVX-512F/BW/VL/DQ too: the wide tile, two
/// pairs per zmm instruction (the same bits).
///
/// # Safety
///
/// As [`run_body`], and the CPU supports AVX-512F, BW, VL and DQ (the
/// AVX-512 tiers).
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn run_rows_avx512<S: BlockScales>(
    stream: &Stream<S>,
    q: &QuantizedX,
    job: &Job,
    rows: Range<usize>,
) {
    // SAFETY: this function's contract; the features are enabled here.
    unsafe { run_body::<S, true, false>(stream, q, job, rows) }
}

/// [`run_rows_avx512`] with AVX-512 VNNI: the wide tile's integer sums by
/// `vpdpwssd` (the same integers, so the same bits).
///
/// # Safety
///
/// As [`run_rows_avx512`], and the CPU supports AVX-512 VNNI.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
unsafe fn run_rows_avx512_vnni<S: BlockScales>(
    stream: &Stream<S>,
    q: &QuantizedX,
    job: &Job,
    rows: Range<usize>,
) {
    // SAFETY: this function's contract; the features are enabled here.
    unsafe { run_body::<S, true, true>(stream, q, job, rows) }
}

/// The kernel's body, always inlined into the three entry points above and
/// built with their features (so it calls no closures that hold intrinsics,
/// see `avx2.rs`'s `run_format`).
///
/// # Safety
///
/// The CPU supports AVX2 and FMA and the caller is one of the entry points
/// (`WIDE` only the AVX-512 one); `stream` streams `job.weight`'s FP4 data,
/// `q` is `job.x` quantized, and the job contract of the module docs holds
/// for `job` and `rows`.
#[inline(always)]
unsafe fn run_body<S: BlockScales, const WIDE: bool, const VNNI: bool>(
    stream: &Stream<S>,
    q: &QuantizedX,
    job: &Job,
    rows: Range<usize>,
) {
    // SAFETY: (all arms) this function's contract; the lockstep sets and
    // leftover rows are rows of `rows`.
    unsafe {
        match job.path {
            Path::Gemv if job.tokens <= 2 => {
                let (sets, singles) = lockstep_sets::<4>(rows);
                for set in sets {
                    gemv::<S, 4, WIDE, VNNI>(stream, q, job, set);
                }
                for row in singles {
                    gemv::<S, 1, WIDE, VNNI>(stream, q, job, [row]);
                }
            }
            Path::Gemv => {
                let (sets, singles) = lockstep_sets::<2>(rows);
                for set in sets {
                    gemv::<S, 2, WIDE, VNNI>(stream, q, job, set);
                }
                for row in singles {
                    gemv::<S, 1, WIDE, VNNI>(stream, q, job, [row]);
                }
            }
            Path::Panel => panel::<S, WIDE, VNNI>(stream, q, job, rows),
        }
    }
}

/// Where a tile finds its decoded weights.
trait Weights {
    type Scales: BlockScales;
    /// The rows' shape.
    fn shape(&self) -> Shape;
    /// Couple `c` of row `r` (pairs 2c and 2c + 1, within whole groups):
    /// per group, pair 2c's 16 codes then pair 2c + 1's.
    ///
    /// # Safety
    ///
    /// AVX2, FMA and AVX-512F/BW. `r` is a row these weights hold and
    /// `c < 2 · shape.groups`; a [`Panel`] decoded for the wide tile.
    unsafe fn couple(&self, r: usize, c: usize) -> [__m512i; 4];
    /// Pair `p` of row `r`: four vectors of 8 + 8 int16 codes (group g of
    /// block 2p, then of block 2p + 1), matching the activation layout.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA. `r` is a row these weights hold (for a [`Panel`], one
    /// decoded into it) and `p < shape.pairs`.
    unsafe fn pair(&self, r: usize, p: usize) -> [__m256i; 4];
    /// The lone last block of row `r`: its 4 groups of 8 codes.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA. `r` is a row these weights hold and the shape has a
    /// lone last block (`shape.lone`).
    unsafe fn lone(&self, r: usize) -> [__m128i; 4];
    /// Weight scales (× 1/512) of group `g` of row `r`.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA. `r` is a row these weights hold and `g < shape.groups`.
    unsafe fn group_scales(&self, r: usize, g: usize) -> <Self::Scales as BlockScales>::Group;
    /// Scale (× 1/512) of weight block `b` (of `VALUES` values) of row `r`,
    /// after the whole groups.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA. `r` is a row these weights hold and `b` one of its
    /// blocks.
    unsafe fn block_scale(&self, r: usize, b: usize) -> f32;
    /// Asks for row `r`'s codes some way past pair `p`, where they still
    /// stream from memory (see `kernels::prefetch`); a hint only.
    fn prefetch(&self, _r: usize, _p: usize) {}
}

/// Decodes straight from the mapped weights.
pub(super) struct Stream<'a, S> {
    codes: &'a [u8],
    scales: &'a [u8],
    shape: Shape,
    format: S,
}

impl<'a, S: BlockScales> Stream<'a, S> {
    /// An FP4 matrix of `cols` columns: `codes` `[rows, cols / 2]` (element
    /// `2j` in byte `j`'s low nibble), `scales` `[rows, cols / VALUES]`.
    pub(super) fn new(codes: &'a [u8], scales: &'a [u8], cols: usize, format: S) -> Self {
        Stream {
            codes,
            scales,
            shape: Shape::of(cols),
            format,
        }
    }
}

impl<S: BlockScales> Weights for Stream<'_, S> {
    type Scales = S;
    fn shape(&self) -> Shape {
        self.shape
    }
    /// [`Weights::couple`], decoded from the mapped codes.
    ///
    /// # Safety
    ///
    /// As [`Weights::couple`]: 64 readable bytes of `codes` from
    /// `(r · blocks + 4c) · 16`.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    #[inline]
    unsafe fn couple(&self, r: usize, c: usize) -> [__m512i; 4] {
        let offset = (r * self.shape.blocks + 4 * c) * BLOCK / 2;
        // SAFETY: the couple lies inside row r of the checked matrix.
        unsafe { decode_couple(self.codes.as_ptr().add(offset)) }
    }
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
    /// matrix and `g < groups`, i.e. `GROUP_VALUES / VALUES` readable bytes
    /// of `scales` from `r · row_scales + g · GROUP_VALUES / VALUES`
    /// ([`Shape::row_scales`]).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn group_scales(&self, r: usize, g: usize) -> S::Group {
        let offset = r * self.shape.row_scales::<S>() + g * (GROUP_VALUES / S::VALUES);
        // SAFETY: as above.
        unsafe { self.format.decode_group(self.scales.as_ptr().add(offset)) }
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
        self.format
            .scale(self.scales[r * self.shape.row_scales::<S>() + b])
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

/// [`decode_pair`] for two pairs (64 bytes at `p`, activation blocks
/// 4c .. 4c + 3 in the four 128-bit lanes): per group, pair 2c's codes in
/// the low 256 bits and pair 2c + 1's in the high ones.
///
/// # Safety
///
/// The CPU supports AVX2, FMA and AVX-512F/BW (the wide entry point). `p`
/// points to at least 64 readable bytes (no alignment needed).
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
#[inline]
unsafe fn decode_couple(p: *const u8) -> [__m512i; 4] {
    let table = _mm512_broadcast_i32x4(_mm256_castsi256_si128(doubled_e2m1()));
    let nibble = _mm512_set1_epi8(0x0F);
    let high_byte = _mm512_set1_epi16(0xFF00u16 as i16);
    // SAFETY: the caller's contract; loadu has no alignment need.
    let bytes = unsafe { _mm512_loadu_si512(p as *const __m512i) };
    let even = _mm512_shuffle_epi8(table, _mm512_and_si512(bytes, nibble));
    let odd = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble));
    [
        _mm512_slli_epi16(even, 8),
        _mm512_and_si512(even, high_byte),
        _mm512_slli_epi16(odd, 8),
        _mm512_and_si512(odd, high_byte),
    ]
}

/// A token's activation codes for couple `c`, per group: pair 2c's 16
/// then pair 2c + 1's (64 values apart in the quantized row).
///
/// # Safety
///
/// The CPU supports AVX2, FMA and AVX-512F. `x` points to a quantized row
/// holding the couple (`128 · (c + 1)` values).
#[target_feature(enable = "avx2,fma,avx512f")]
#[inline]
unsafe fn couple_codes(x: *const i16, c: usize) -> [__m512i; 4] {
    std::array::from_fn(|g| {
        // SAFETY: both halves lie inside the couple (the caller's contract).
        unsafe {
            let even = _mm256_loadu_si256(x.add(4 * BLOCK * c + 16 * g) as *const __m256i);
            let odd =
                _mm256_loadu_si256(x.add(4 * BLOCK * c + 2 * BLOCK + 16 * g) as *const __m256i);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(even), odd)
        }
    })
}

/// [`couple_sums`] by `vpdpwssd` (AVX-512 VNNI): each group's products
/// added in the same instruction; the same exact integers.
///
/// # Safety
///
/// The CPU supports AVX-512 VNNI (the VNNI entry point).
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn couple_sums_vnni(w: &[__m512i; 4], x: &[__m512i; 4]) -> __m512i {
    let mut sums = _mm512_madd_epi16(w[0], x[0]);
    for g in 1..4 {
        sums = _mm512_dpwssd_epi32(sums, w[g], x[g]);
    }
    sums
}

/// Integer partial sums of one couple: [`pair_sums`] of pair 2c in lanes
/// 0-7 and of pair 2c + 1 in lanes 8-15.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
#[inline]
fn couple_sums(w: &[__m512i; 4], x: &[__m512i; 4]) -> __m512i {
    let s: [__m512i; 4] = std::array::from_fn(|g| _mm512_madd_epi16(w[g], x[g]));
    _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]))
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
/// of the module, 8 lanes at a time. `rows[r]` is row r in `w`'s terms,
/// `out_rows[r]` the output row it writes.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA, enabled by the caller (this is inlined
/// into the entry points). `w` holds rows `rows` in the shape of `q.cols`
/// (its pairs, lone block, groups and scales, as the [`Weights`] methods
/// require); `q` is `job.x` quantized with `q.cols == job.weight.cols`;
/// tokens `t0..t0 + T` exist (`t0 + T ≤ job.tokens`); and the job contract
/// of the module docs holds for every row of `out_rows` (inside `0..rows`,
/// its outputs owned by the caller's unit).
#[inline(always)]
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
    // SAFETY: (whole body) AVX2 is enabled by the caller; pairs, blocks and
    // groups are inside the rows of `w` and the tokens' codes, per the shape
    // of the checked problem.
    unsafe {
        // Per row and token, the even units' accumulator and the odd ones'.
        let mut acc = [[[_mm256_setzero_ps(); 2]; T]; R];
        for g in 0..shape.groups {
            let ws: [_; R] = std::array::from_fn(|r| w.group_scales(rows[r], g));
            let xs: [__m256; T] =
                std::array::from_fn(|t| _mm256_loadu_ps(scales[t].as_ptr().add(g * SCALE_GROUP)));
            for k in 0..SCALE_GROUP / 2 {
                let p = g * SCALE_GROUP / 2 + k;
                for r in 0..R {
                    w.prefetch(rows[r], p);
                    let wp = w.pair(rows[r], p);
                    let lanes = W::Scales::pair_lanes(ws[r], k);
                    for t in 0..T {
                        let sums = pair_sums(&wp, codes[t].add(2 * BLOCK * p));
                        let scale = _mm256_mul_ps(lanes, pair_scales(xs[t], k));
                        let a = &mut acc[r][t][k % 2];
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, *a);
                    }
                }
            }
        }
        for p in shape.groups * SCALE_GROUP / 2..shape.units() {
            for r in 0..R {
                let (wu, lanes) = tail_unit(w, rows[r], p);
                for t in 0..T {
                    let (sums, x) = tail_unit_x(&wu, codes[t], scales[t], shape, p);
                    let scale = _mm256_mul_ps(lanes, x);
                    let a = &mut acc[r][t][p % 2];
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, *a);
                }
            }
        }
        let n_rows = job.weight.rows;
        for (r, acc_r) in acc.iter_mut().enumerate() {
            for (t, a) in acc_r.iter_mut().enumerate() {
                if shape.units() % 2 == 1 {
                    // The wide tile's last couple has no odd half: it adds
                    // 0 · 0 there.
                    let zero = _mm256_setzero_ps();
                    a[1] = _mm256_fmadd_ps(zero, zero, a[1]);
                }
                let sum = reduce(_mm256_add_ps(a[0], a[1]));
                *job.out.get().add((t0 + t) * n_rows + out_rows[r]) = sum;
            }
        }
    }
}

/// A unit after the whole groups (a pair, or the lone last block) of row
/// `r`: its codes as a pair's 4 vectors (a lone block's in the low halves,
/// zeros above) and its 8 weight lane scales.
///
/// # Safety
///
/// As [`tile`]; `p < shape.units()` and past the whole groups.
#[inline(always)]
unsafe fn tail_unit<W: Weights>(w: &W, r: usize, p: usize) -> ([__m256i; 4], __m256) {
    let shape = w.shape();
    let per_pair = 2 * BLOCK / W::Scales::VALUES;
    let lone = p == shape.pairs;
    let blocks = if lone { per_pair / 2 } else { per_pair };
    // SAFETY: the unit is inside row r (the caller's contract); AVX2 is
    // enabled by the caller.
    unsafe {
        let s: [f32; 4] = std::array::from_fn(|i| {
            if i < blocks {
                w.block_scale(r, p * per_pair + i)
            } else {
                0.0
            }
        });
        let lanes = W::Scales::lanes_of(s, lone);
        let codes = if lone {
            let b = w.lone(r);
            [
                _mm256_zextsi128_si256(b[0]),
                _mm256_zextsi128_si256(b[1]),
                _mm256_zextsi128_si256(b[2]),
                _mm256_zextsi128_si256(b[3]),
            ]
        } else {
            w.pair(r, p)
        };
        (codes, lanes)
    }
}

/// [`tail_unit`]'s integer sums against a token (`codes` and `scales` its
/// quantized row) and the token's 8 activation lane scales for the unit.
///
/// # Safety
///
/// As [`tail_unit`].
#[inline(always)]
unsafe fn tail_unit_x(
    w: &[__m256i; 4],
    codes: *const i16,
    scales: &[f32],
    shape: Shape,
    p: usize,
) -> (__m256i, __m256) {
    // SAFETY: as the caller's; the lone block's codes are 32 values at
    // 32 · (blocks − 1) = 64 · pairs.
    unsafe {
        if p == shape.pairs {
            let wb = [
                _mm256_castsi256_si128(w[0]),
                _mm256_castsi256_si128(w[1]),
                _mm256_castsi256_si128(w[2]),
                _mm256_castsi256_si128(w[3]),
            ];
            let x = _mm256_set_m128(_mm_setzero_ps(), _mm_set1_ps(scales[2 * p]));
            (lone_sums(&wb, codes.add(2 * BLOCK * p)), x)
        } else {
            let x = _mm256_set_m128(_mm_set1_ps(scales[2 * p + 1]), _mm_set1_ps(scales[2 * p]));
            (pair_sums(w, codes.add(2 * BLOCK * p)), x)
        }
    }
}

/// [`tile`] in zmm registers (AVX-512F/BW): a couple of units (pairs 2c
/// and 2c + 1, 128 values) per instruction, the even unit in the low 8
/// lanes and the odd one in the high 8, so every lane takes the very
/// operations of [`tile`]'s lane in its even or odd accumulator: the same
/// sums, the same bits.
///
/// # Safety
///
/// As [`tile`], and the caller enables AVX-512F/BW/VL/DQ (the wide entry
/// point); `w` decodes whole couples ([`Weights::couple`]).
#[inline(always)]
unsafe fn tile_wide<W: Weights, const R: usize, const T: usize, const VNNI: bool>(
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
    // SAFETY: (whole body) the features are enabled by the caller; couples,
    // pairs, blocks and groups are inside the rows of `w` and the tokens'
    // codes, per the shape of the checked problem.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        for g in 0..shape.groups {
            let ws: [_; R] = std::array::from_fn(|r| w.group_scales(rows[r], g));
            let xs: [__m256; T] =
                std::array::from_fn(|t| _mm256_loadu_ps(scales[t].as_ptr().add(g * SCALE_GROUP)));
            for j in 0..2 {
                let c = 2 * g + j;
                let x: [[__m512i; 4]; T] = std::array::from_fn(|t| couple_codes(codes[t], c));
                let xl: [__m512; T] = std::array::from_fn(|t| couple_lanes_0246(xs[t], j));
                for r in 0..R {
                    w.prefetch(rows[r], 2 * c);
                    let wc = w.couple(rows[r], c);
                    let lanes = W::Scales::couple_lanes(ws[r], j);
                    for t in 0..T {
                        let sums = if VNNI {
                            couple_sums_vnni(&wc, &x[t])
                        } else {
                            couple_sums(&wc, &x[t])
                        };
                        let scale = _mm512_mul_ps(lanes, xl[t]);
                        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[r][t]);
                    }
                }
            }
        }
        let mut p = shape.groups * SCALE_GROUP / 2;
        while p < shape.units() {
            let odd = p + 1 < shape.units();
            for r in 0..R {
                let even_unit = tail_unit(w, rows[r], p);
                let odd_unit = odd.then(|| tail_unit(w, rows[r], p + 1));
                for t in 0..T {
                    let (s0, x0) = tail_unit_x(&even_unit.0, codes[t], scales[t], shape, p);
                    let scale0 = _mm256_mul_ps(even_unit.1, x0);
                    let (s1, scale1) = match &odd_unit {
                        Some((wu, lanes)) => {
                            let (s1, x1) = tail_unit_x(wu, codes[t], scales[t], shape, p + 1);
                            (s1, _mm256_mul_ps(*lanes, x1))
                        }
                        None => (_mm256_setzero_si256(), _mm256_setzero_ps()),
                    };
                    let sums = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(s0), s1);
                    let scale = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(scale0), scale1);
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[r][t]);
                }
            }
            p += 2;
        }
        let n_rows = job.weight.rows;
        for (r, acc_r) in acc.iter().enumerate() {
            for (t, &a) in acc_r.iter().enumerate() {
                let halves =
                    _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps::<1>(a));
                *job.out.get().add((t0 + t) * n_rows + out_rows[r]) = reduce(halves);
            }
        }
    }
}

/// GEMV path: one set of rows against every token, a tile of tokens at a
/// time (the rows stay in L1 between tiles).
///
/// # Safety
///
/// As [`tile`] (AVX2 and FMA enabled by the caller); `w` streams
/// `job.weight`'s FP4 data, `q` is `job.x` quantized (`q.cols ==
/// job.weight.cols`), and the job contract of the module docs holds for
/// `job` and every row of `rows`.
#[inline(always)]
unsafe fn gemv<S: BlockScales, const R: usize, const WIDE: bool, const VNNI: bool>(
    w: &Stream<S>,
    q: &QuantizedX,
    job: &Job,
    rows: [usize; R],
) {
    let mut t0 = 0;
    while t0 < job.tokens {
        let tn = (job.tokens - t0).min(NT);
        // SAFETY: tokens t0..t0 + tn exist; the unit owns the rows.
        unsafe { tile_tokens::<_, R, WIDE, VNNI>(w, rows, rows, q, t0, tn, job) };
        t0 += tn;
    }
}

/// [`tile`] (or, `WIDE`, [`tile_wide`]) for `tn` (1..=4) tokens from `t0`.
///
/// # Safety
///
/// As [`tile`] for `T = tn`; `WIDE` only where [`tile_wide`]'s features
/// are enabled (and a [`Panel`] was decoded for it).
#[inline(always)]
unsafe fn tile_tokens<W: Weights, const R: usize, const WIDE: bool, const VNNI: bool>(
    w: &W,
    rows: [usize; R],
    out_rows: [usize; R],
    q: &QuantizedX,
    t0: usize,
    tn: usize,
    job: &Job,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match (tn, WIDE) {
            (1, false) => tile::<_, R, 1>(w, rows, out_rows, q, t0, job),
            (2, false) => tile::<_, R, 2>(w, rows, out_rows, q, t0, job),
            (3, false) => tile::<_, R, 3>(w, rows, out_rows, q, t0, job),
            (_, false) => tile::<_, R, 4>(w, rows, out_rows, q, t0, job),
            (1, true) => tile_wide::<_, R, 1, VNNI>(w, rows, out_rows, q, t0, job),
            (2, true) => tile_wide::<_, R, 2, VNNI>(w, rows, out_rows, q, t0, job),
            (3, true) => tile_wide::<_, R, 3, VNNI>(w, rows, out_rows, q, t0, job),
            (_, true) => tile_wide::<_, R, 4, VNNI>(w, rows, out_rows, q, t0, job),
        }
    }
}

/// A block of rows decoded once: per row `stride` vectors of codes, then
/// its weight scales (× 1/512), each group as `store_group` stores it, the
/// blocks after the whole groups in order.
struct Panel<S> {
    codes: *const __m256i,
    scales: *const f32,
    shape: Shape,
    format: std::marker::PhantomData<S>,
}

impl<S: BlockScales> Weights for Panel<S> {
    type Scales = S;
    fn shape(&self) -> Shape {
        self.shape
    }
    /// [`Weights::couple`], from a panel `panel` decoded for the wide tile
    /// (a whole couple's 4 vectors of 64 bytes where its two pairs' 8
    /// vectors of 32 would be; 64-byte aligned: rows are an even number of
    /// 32-byte vectors apart).
    ///
    /// # Safety
    ///
    /// As [`Weights::couple`].
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    #[inline]
    unsafe fn couple(&self, r: usize, c: usize) -> [__m512i; 4] {
        let base = r * self.shape.panel_stride() + 8 * c;
        // SAFETY: decoded by `panel` for every row and couple of the block.
        std::array::from_fn(|g| unsafe {
            _mm512_load_si512(self.codes.add(base + 2 * g) as *const __m512i)
        })
    }
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
    /// decoded into `scales` (`row_scales` values a row) and `g < groups`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn group_scales(&self, r: usize, g: usize) -> S::Group {
        let at = r * self.shape.row_scales::<S>() + g * (GROUP_VALUES / S::VALUES);
        // SAFETY: as above.
        unsafe { S::load_group(self.scales.add(at)) }
    }
    /// [`Weights::block_scale`], from the decoded panel.
    ///
    /// # Safety
    ///
    /// As [`Weights::block_scale`]: AVX2 and FMA, `r` one of the rows `panel`
    /// decoded into `scales` (`row_scales` values a row) and `b` one of its
    /// blocks.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block_scale(&self, r: usize, b: usize) -> f32 {
        // SAFETY: as above.
        unsafe { *self.scales.add(r * self.shape.row_scales::<S>() + b) }
    }
}

#[repr(C, align(64))]
struct PanelCodes([MaybeUninit<__m256i>; PANEL_VECTORS]);

/// Panel path: for each block of rows, decode it into the panel, then run
/// 1 × `NT` tiles over every token (a token tile's codes stay in L1 while
/// the panel streams from L2).
///
/// # Safety
///
/// As [`tile`] (AVX2 and FMA enabled by the caller); `stream` streams
/// `job.weight`'s FP4 data, `q` is `job.x` quantized (`q.cols ==
/// job.weight.cols`), and the job contract of the module docs holds for
/// `job` and `rows` (the panel's size is derived from the shape, so every
/// block fits it).
#[inline(always)]
unsafe fn panel<S: BlockScales, const WIDE: bool, const VNNI: bool>(
    stream: &Stream<S>,
    q: &QuantizedX,
    job: &Job,
    rows: Range<usize>,
) {
    let shape = stream.shape;
    let stride = shape.panel_stride();
    let row_scales = shape.row_scales::<S>();
    let group_scales = GROUP_VALUES / S::VALUES;
    let block_rows = panel_rows_for(shape);
    let mut codes = PanelCodes([MaybeUninit::uninit(); PANEL_VECTORS]);
    let mut scales = [0.0f32; PANEL_SCALES];
    let codes_base = codes.0.as_mut_ptr() as *mut __m256i;
    let mut block = rows.start;
    while block < rows.end {
        let nb = block_rows.min(rows.end - block);
        // SAFETY: (decoding) rows block..block + nb exist; nb × stride ≤
        // PANEL_VECTORS and nb × row_scales ≤ PANEL_SCALES by
        // `panel_rows_for` (row_scales ≤ cols / 16).
        unsafe {
            for r in 0..nb {
                let row = block + r;
                let dst = codes_base.add(r * stride);
                // The wide tile reads whole groups' pairs as couples.
                let couples = if WIDE { 2 * shape.groups } else { 0 };
                for c in 0..couples {
                    for (g, v) in stream.couple(row, c).into_iter().enumerate() {
                        _mm512_store_si512(dst.add(8 * c + 2 * g) as *mut __m512i, v);
                    }
                }
                for p in 2 * couples..shape.pairs {
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
                let s = &mut scales[r * row_scales..(r + 1) * row_scales];
                for g in 0..shape.groups {
                    let v = stream.group_scales(row, g);
                    S::store_group(v, s.as_mut_ptr().add(g * group_scales));
                }
                for (b, v) in s.iter_mut().enumerate().skip(shape.groups * group_scales) {
                    *v = stream.block_scale(row, b);
                }
            }
        }
        let decoded = Panel::<S> {
            codes: codes_base,
            scales: scales.as_ptr(),
            shape,
            format: std::marker::PhantomData,
        };
        let mut t0 = 0;
        while t0 < job.tokens {
            let tn = (job.tokens - t0).min(NT);
            // The wide tile takes two rows at a time: each token's codes,
            // loaded once per couple, serve both.
            let pairs = if WIDE { nb / 2 } else { 0 };
            for r in (0..pairs).map(|i| 2 * i) {
                let rows = ([r, r + 1], [block + r, block + r + 1]);
                // SAFETY: panel rows r and r + 1 were decoded above, for the
                // wide tile; tokens t0..t0 + tn exist; the unit owns the
                // output rows.
                unsafe {
                    tile_tokens::<_, 2, WIDE, VNNI>(&decoded, rows.0, rows.1, q, t0, tn, job)
                };
            }
            for r in 2 * pairs..nb {
                let rows = ([r], [block + r]);
                // SAFETY: panel row r was decoded above (for the wide tile
                // where WIDE); tokens t0..t0 + tn exist; the unit owns the
                // output row.
                unsafe {
                    tile_tokens::<_, 1, WIDE, VNNI>(&decoded, rows.0, rows.1, q, t0, tn, job)
                };
            }
            t0 += tn;
        }
        block += nb;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::job::OutPtr;
    use crate::backend::cpu::kernels::quantize::quantize_row as quantize_definition;
    use crate::backend::cpu::kernels::x86::fp4_scales::Nvfp4Scales;
    use crate::checkpoint::linear::{LinearWeight, WeightData};

    /// One entry point of the kernel, for NVFP4.
    type Build = unsafe fn(&Stream<Nvfp4Scales>, &QuantizedX, &Job, Range<usize>);

    /// Every build of the kernel on one NVFP4 problem: the AVX2 one, the
    /// wide one and the wide one with VNNI (the tier runs only one of the
    /// last two, by the CPU), each output's bits.
    fn every_build(cols: usize, rows: usize, tokens: usize) -> Vec<Vec<u32>> {
        // Codes, scale bytes (no NaN: 0x7F / 0xFF skipped) and a global
        // scale that exercise every code and many scales.
        let codes: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 37 % 256) as u8).collect();
        let scales: Vec<u8> = (0..rows * cols / 16)
            .map(|i| (i * 11 % 0x70) as u8 + 0x08)
            .collect();
        let x: Vec<f32> = (0..tokens * cols)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 97.0)
            .collect();
        let mut q_codes = vec![0i16; tokens * cols];
        let mut q_scales = vec![0.0f32; tokens * cols / BLOCK];
        for t in 0..tokens {
            quantize_definition(
                &x[t * cols..(t + 1) * cols],
                &mut q_codes[t * cols..(t + 1) * cols],
                &mut q_scales[t * cols / BLOCK..(t + 1) * cols / BLOCK],
            );
        }
        let q = QuantizedX {
            codes: &q_codes,
            scales: &q_scales,
            cols,
        };
        let weight = LinearWeight {
            rows,
            cols,
            data: WeightData::Nvfp4 {
                packed: &codes,
                scales: &scales,
                global: 0.0123,
            },
        };
        let builds: [Build; 3] = [run_rows_avx2, run_rows_avx512, run_rows_avx512_vnni];
        builds
            .iter()
            .map(|&build| {
                let mut out = vec![0.0f32; tokens * rows];
                let job = Job {
                    weight,
                    tokens,
                    path: choose_path(cols, tokens),
                    x: &x,
                    quantized: Some(q),
                    out: OutPtr(out.as_mut_ptr()),
                };
                let stream = Stream::new(&codes, &scales, cols, Nvfp4Scales::new(0.0123));
                // SAFETY: the callers checked the features; the job holds
                // `rows × cols` codes, their scales, `tokens` quantized rows
                // and room for every output; one thread owns every row.
                unsafe { build(&stream, &q, &job, 0..rows) };
                out.iter().map(|v| v.to_bits()).collect()
            })
            .collect()
    }

    #[test]
    fn the_wide_builds_give_the_avx2_bits_with_and_without_vnni() {
        let features = ["avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni"];
        if !features.iter().all(|f| has_feature(f)) {
            eprintln!("skipped: this CPU lacks one of {features:?}");
            return;
        }
        // Groups only, groups and tail pairs, a lone block after odd and
        // even units; GEMV (1-4 tokens) and panel (9 tokens) paths.
        for cols in [256, 416, 2144, 96, 64, 32] {
            for (rows, tokens) in [(13, 1), (8, 2), (5, 3), (11, 9)] {
                let [avx2, wide, vnni] = <[Vec<u32>; 3]>::try_from(every_build(cols, rows, tokens))
                    .unwrap_or_else(|_| unreachable!("three builds"));
                assert!(avx2.iter().all(|&b| f32::from_bits(b).is_normal()));
                assert_eq!(wide, avx2, "wide, cols {cols} rows {rows} tokens {tokens}");
                assert_eq!(vnni, avx2, "vnni, cols {cols} rows {rows} tokens {tokens}");
            }
        }
    }
}
