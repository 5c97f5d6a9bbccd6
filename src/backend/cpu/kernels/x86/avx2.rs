//! x86-64 AVX2 + FMA matmul kernels for F32, BF16, NVFP4 and FP8 (whose
//! decoders are in `avx2_nvfp4.rs`, `avx512_nvfp4.rs` and `avx2_fp8.rs`;
//! MXFP4, and NVFP4 whose rows are whole 32-value blocks, have their integer
//! kernels in `avx2_fp4.rs`).
//!
//! **One summation order.** Every output `Σ_c W[r, c] · x[t, c]` is summed
//! the same way whatever path computes it, however many tokens share the
//! call and however rows are split between threads, so a token's outputs are
//! bitwise the same alone or in a batch (see [`crate::backend::cpu::kernels`] for why that matters):
//!
//! 1. the columns of the whole chunks (8 values for F32, 16 for BF16, 64 for
//!    NVFP4 and FP8) are taken as vectors of 8 consecutive columns; lane
//!    `l` of a single accumulator takes column `8u + l` of vector `u`, in
//!    ascending `u`, by fused multiply-add;
//! 2. the 8 lanes are reduced as `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`;
//! 3. the columns after the last whole chunk are added one by one, `s + w·x`.
//!
//! Formats whose decoder is `PAIRED` (FP8) sum in the **paired order**
//! instead of step 1: vector `u` goes to one of two accumulators by the
//! parity of `u`, each in ascending `u`, and the two are added lane by lane
//! before step 2. The AVX-512 build then takes 16 columns of a row per zmm
//! (`gemv_tile_wide`, `avx512_panel.rs`'s `WideTiles`): the even vector in
//! the low half, the odd one in the high, the same sums.
//!
//! The order depends on `cols` and the format only. Weights are decoded in
//! natural column order, so the activations are read where they are (no
//! copy, no scratch).
//!
//! - GEMV path (few tokens): weights decoded on the fly as they stream from
//!   memory. One accumulator chain per output is latency-bound, so `R` rows
//!   advance in lockstep, each taken from its own contiguous share of the
//!   work unit: `R` long sequential streams, each asking for its lines
//!   1 KiB ahead (`kernels::prefetch`: the hardware prefetchers pick such
//!   streams up late).
//! - Panel path (many tokens): a block of rows is decoded once into an f32
//!   panel on the stack (L2-resident), then a 3-row × 4-token microkernel
//!   (12 accumulators, 3 + 4 loads per 12 FMAs) runs over every token
//!   (`PanelTiles`: the AVX-512 build runs 3 row pairs × 4 tokens in zmm
//!   instead, `avx512_panel.rs`, the same sums), while the next block's
//!   rows are prefetched.
//!
//! Every `unsafe fn` here requires AVX2 and FMA; the module is only entered
//! through an x86 tier (`Isa::Avx2` and the AVX-512 ones), which exist only
//! after runtime detection. Those
//! that take a `job` also require **the job contract**: the job passed
//! `check_problem` (its weight data holds `rows × cols` values of its
//! format, `x` holds `tokens × cols` f32 and `out` is valid for writes of
//! `tokens × rows` f32), the rows they are given lie inside `0..rows`, and
//! no other thread writes those rows' outputs (`out[t · rows + r]`)
//! meanwhile: each work unit owns its rows.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::avx2_nvfp4::Nvfp4Dec;
use super::avx512_nvfp4::Nvfp4TableDec;
use super::avx512_panel::{PairTiles, WideTiles};
use super::lanes::{
    Ahead, Decoder, NT, PANEL_FLOATS, PANEL_MAX_ROWS, PanelTiles, decode_rows, lockstep_sets,
    reduce, row_block_rows, row_slice, run_tile_sized,
};
use crate::backend::cpu::kernels::isa::Isa;
use crate::backend::cpu::kernels::job::{Job, Path};
use crate::backend::cpu::kernels::prefetch::{LINE, STREAM_AHEAD, prefetch_line};
use crate::checkpoint::linear::{LinearWeight, WeightData};
use crate::formats::{read_bf16, read_f32};

/// Problems with at most this many tokens take the GEMV path: below it,
/// decoding a panel first costs more than it saves.
const GEMV_MAX_TOKENS: usize = 4;
/// Tokens a GEMV tile holds (more tokens: several tiles per row set, while
/// the rows are still in L1).
const GEMV_TOKENS: usize = 4;
/// Rows of the AVX2 panel microkernel.
const MR: usize = 3;
/// Columns per pass of the microkernel: the tokens' share (NT × KC floats,
/// 8 KiB) stays in L1 while every row tile of the panel passes over it.
const KC: usize = 512;

/// Which path a problem takes: the panel needs at least `MR` rows of the
/// row's whole chunks in the panel buffer.
pub(super) fn choose_path(w: &LinearWeight, tokens: usize) -> Path {
    if tokens > GEMV_MAX_TOKENS && RowTiles::<false>::block_rows(whole_columns(w)) >= MR {
        Path::Panel
    } else {
        Path::Gemv
    }
}

/// Columns covered by whole chunks of the format.
fn whole_columns(w: &LinearWeight) -> usize {
    let chunk = match w.data {
        WeightData::F32(_) => F32Dec::CHUNK,
        WeightData::Bf16(_) => Bf16Dec::CHUNK,
        WeightData::Nvfp4 { .. } => Nvfp4Dec::CHUNK,
        WeightData::Fp8 { .. } => super::avx2_fp8::Fp8Dec::CHUNK,
        WeightData::Mxfp4 { .. } | WeightData::Int4 { .. } => {
            unreachable!("MXFP4 and INT4 have their own kernels")
        }
    };
    w.cols / chunk * chunk
}

/// Rows `rows` of a job in F32, BF16, NVFP4 or FP8, on `isa` (an x86 tier:
/// the AVX-512 ones decode NVFP4 by table permutes, `avx512_nvfp4.rs`).
pub(super) fn run_rows(isa: Isa, job: &Job, rows: Range<usize>) {
    let w = &job.weight;
    let cols = w.cols;
    // SAFETY: (all arms) Job shapes were checked by `check_problem`, and this
    // module is only reached through an x86 tier, i.e. with AVX2 and FMA
    // present (and AVX-512F/VL where `isa.runs_avx512()`).
    unsafe {
        match w.data {
            WeightData::F32(bytes) => run_format_on(isa, &F32Dec { bytes, cols }, job, rows),
            WeightData::Bf16(bytes) => run_format_on(isa, &Bf16Dec { bytes, cols }, job, rows),
            WeightData::Nvfp4 {
                packed,
                scales,
                global,
            } => {
                let dec = Nvfp4Dec::new(packed, scales, global, cols);
                if isa.runs_avx512() {
                    run_format_avx512(&Nvfp4TableDec(dec), job, rows)
                } else {
                    run_format_avx2(&dec, job, rows)
                }
            }
            WeightData::Fp8 { values, scales } => {
                let dec = super::avx2_fp8::Fp8Dec {
                    values,
                    scales,
                    cols,
                };
                run_format_on(isa, &dec, job, rows)
            }
            WeightData::Mxfp4 { .. } | WeightData::Int4 { .. } => {
                unreachable!("x86::run_rows sends MXFP4 and INT4 to their kernels")
            }
        }
    }
}

/// [`run_format`] compiled for `isa`: the AVX-512 tiers' build, with 32
/// vector registers, for them, else the AVX2 one (the same sums and bits).
///
/// # Safety
///
/// As [`run_format`], and `isa` is an x86 tier this CPU has (detected).
unsafe fn run_format_on<D: Decoder>(isa: Isa, dec: &D, job: &Job, rows: Range<usize>) {
    // SAFETY: the CPU has AVX-512F/VL where `isa.runs_avx512()`, and AVX2
    // and FMA on every x86 tier; the rest is this function's contract.
    unsafe {
        if isa.runs_avx512() {
            run_format_avx512(dec, job, rows)
        } else {
            run_format_avx2(dec, job, rows)
        }
    }
}

/// [`run_format`] compiled for AVX2 + FMA (16 vector registers).
///
/// # Safety
///
/// As [`run_format`].
#[target_feature(enable = "avx2,fma")]
unsafe fn run_format_avx2<D: Decoder>(dec: &D, job: &Job, rows: Range<usize>) {
    // SAFETY: this function's contract; the features are enabled here.
    unsafe { run_format::<D, false>(dec, job, rows) }
}

/// [`run_format`] compiled with AVX-512F/VL too: 32 vector registers (the
/// GEMV's 4-row walks stop spilling) and the instructions the AVX-512
/// decoders use (`avx512_nvfp4.rs`), and the panel path over row pairs in
/// zmm registers (`avx512_panel.rs`, the same sums).
///
/// # Safety
///
/// As [`run_format`], and the CPU supports AVX-512F, VL and DQ (the
/// callers are reached only through the AVX-512 tiers).
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq")]
unsafe fn run_format_avx512<D: Decoder>(dec: &D, job: &Job, rows: Range<usize>) {
    // SAFETY: this function's contract; the features are enabled here.
    unsafe { run_format::<D, true>(dec, job, rows) }
}

/// Runs rows `rows` of `job` on the path `job.path` chose, decoding with `dec`.
///
/// This and the functions below it are always inlined into the two entry
/// points above, one build per tier, and carry no `target_feature` of their
/// own: the entry point's features (and so its registers, and the decoders'
/// instructions) apply to the whole body. That is why they hold no closures
/// that call intrinsics (a closure not inlined would be built without them).
///
/// # Safety
///
/// The CPU supports AVX2 and FMA, and the caller is one of the entry points
/// (`run_format_avx2`, `run_format_avx512`), which enable them. `dec`
/// decodes `job.weight` (its data and its `cols`), and the job contract of
/// the module docs holds for `job` and `rows`.
#[inline(always)]
unsafe fn run_format<D: Decoder, const WIDE: bool>(dec: &D, job: &Job, rows: Range<usize>) {
    let whole = job.weight.cols / D::CHUNK * D::CHUNK;
    // SAFETY: same contract as this function's; `WIDE` only from
    // `run_format_avx512`, whose features the paired panel needs; the
    // panel path was chosen with at least one row tile's worth of rows.
    unsafe {
        match job.path {
            Path::Gemv => gemv_rows::<D, WIDE>(dec, job, rows),
            Path::Panel if WIDE && D::PAIRED => panel_rows::<D, WideTiles>(dec, job, rows),
            Path::Panel if WIDE && PairTiles::block_rows(whole) >= 2 => {
                panel_rows::<D, PairTiles>(dec, job, rows)
            }
            Path::Panel if D::PAIRED => panel_rows::<D, RowTiles<true>>(dec, job, rows),
            Path::Panel => panel_rows::<D, RowTiles<false>>(dec, job, rows),
        }
    }
}

struct F32Dec<'a> {
    bytes: &'a [u8],
    cols: usize,
}

impl Decoder for F32Dec<'_> {
    const CHUNK: usize = 8;
    /// [`Decoder::decode`] for F32: one load of 8 values.
    ///
    /// # Safety
    ///
    /// As [`Decoder::decode`]: AVX2 and FMA, and the chunk inside the matrix,
    /// i.e. 32 readable bytes of `bytes` from byte
    /// `(row · cols + 8 · chunk) · 4`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]) {
        let offset = (row * self.cols + chunk * 8) * 4;
        // SAFETY: in bounds per the contract; loadu has no alignment need.
        out[0] = unsafe { _mm256_loadu_ps(self.bytes.as_ptr().add(offset) as *const f32) };
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        read_f32(self.bytes, row * self.cols + col)
    }
    fn row_bytes(&self, row: usize) -> &[u8] {
        row_slice(self.bytes, row, self.cols * 4)
    }
}

struct Bf16Dec<'a> {
    bytes: &'a [u8],
    cols: usize,
}

impl Decoder for Bf16Dec<'_> {
    const CHUNK: usize = 16;
    /// [`Decoder::decode`] for BF16: one load of 16 values, widened.
    ///
    /// # Safety
    ///
    /// As [`Decoder::decode`]: AVX2 and FMA, and the chunk inside the matrix,
    /// i.e. 32 readable bytes of `bytes` from byte
    /// `(row · cols + 16 · chunk) · 2`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]) {
        let offset = (row * self.cols + chunk * 16) * 2;
        // SAFETY: in bounds per the contract; loadu has no alignment need.
        let v = unsafe { _mm256_loadu_si256(self.bytes.as_ptr().add(offset) as *const __m256i) };
        // 64-bit quarters 0 2 | 1 3: each 128-bit half then holds the
        // columns its two output vectors need (0-3, 8-11 | 4-7, 12-15).
        let v = _mm256_permute4x64_epi64::<0b11_01_10_00>(v);
        // A bf16 is the top half of an f32: interleave zeros below it.
        let zero = _mm256_setzero_si256();
        out[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
        out[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        read_bf16(self.bytes, row * self.cols + col)
    }
    fn row_bytes(&self, row: usize) -> &[u8] {
        row_slice(self.bytes, row, self.cols * 2)
    }
}

/// Steps 2 and 3 for one output: the reduced accumulator plus the columns
/// after the last whole chunk (`x` is the token's row).
///
/// # Safety
///
/// As [`run_format`] for the features. `x` points to at least `cols`
/// readable f32 (the token's row); `W[row, ..]` is read through the
/// bounds-checked `scalar`.
#[inline(always)]
unsafe fn finish<D: Decoder>(dec: &D, acc: __m256, row: usize, cols: usize, x: *const f32) -> f32 {
    // SAFETY: AVX2 and FMA are present (the contract).
    let mut sum = unsafe { reduce(acc) };
    for c in cols / D::CHUNK * D::CHUNK..cols {
        // SAFETY: c < cols.
        sum += dec.scalar(row, c) * unsafe { *x.add(c) };
    }
    sum
}

/// GEMV path: `R` rows at a time (4 for 1-2 tokens where the decoder's
/// `FOUR_ROWS_IN_LOCKSTEP` allows, else 2: enough independent chains to
/// hide the FMA latency), tokens in tiles of at most `GEMV_TOKENS`.
///
/// # Safety
///
/// As [`run_format`] (`WIDE` only from its AVX-512 entry point).
#[inline(always)]
unsafe fn gemv_rows<D: Decoder, const WIDE: bool>(dec: &D, job: &Job, rows: Range<usize>) {
    // SAFETY: same contract as this function's.
    unsafe {
        if job.tokens <= 2 && D::FOUR_ROWS_IN_LOCKSTEP {
            gemv_streams::<D, 4, WIDE>(dec, job, rows)
        } else {
            gemv_streams::<D, 2, WIDE>(dec, job, rows)
        }
    }
}

/// GEMV path with `R` rows in lockstep (see [`lockstep_sets`]).
///
/// # Safety
///
/// As [`run_format`].
#[inline(always)]
unsafe fn gemv_streams<D: Decoder, const R: usize, const WIDE: bool>(
    dec: &D,
    job: &Job,
    rows: Range<usize>,
) {
    let (sets, singles) = lockstep_sets::<R>(rows);
    for set in sets {
        // SAFETY: the rows are inside the unit, which owns their outputs;
        // the rest is this function's contract.
        unsafe { gemv_set::<D, R, WIDE>(dec, job, set) };
    }
    for row in singles {
        // SAFETY: as above.
        unsafe { gemv_set::<D, 1, WIDE>(dec, job, [row]) };
    }
}

/// One set of rows against every token, a tile of tokens at a time (the
/// rows stay in L1 between tiles).
///
/// # Safety
///
/// As [`run_format`], for every row of `rows` (inside `0..rows`, its
/// outputs owned by the caller's unit).
#[inline(always)]
unsafe fn gemv_set<D: Decoder, const R: usize, const WIDE: bool>(
    dec: &D,
    job: &Job,
    rows: [usize; R],
) {
    let mut t0 = 0;
    while t0 < job.tokens {
        let tn = (job.tokens - t0).min(GEMV_TOKENS);
        // SAFETY: tokens t0..t0+tn exist; the rows are the caller's; the
        // wide tile only from the AVX-512 build (`WIDE`).
        unsafe {
            if WIDE && D::PAIRED {
                match tn {
                    1 => gemv_tile_wide::<D, R, 1>(dec, job, rows, t0),
                    2 => gemv_tile_wide::<D, R, 2>(dec, job, rows, t0),
                    3 => gemv_tile_wide::<D, R, 3>(dec, job, rows, t0),
                    _ => gemv_tile_wide::<D, R, 4>(dec, job, rows, t0),
                }
            } else {
                match tn {
                    1 => gemv_tile::<D, R, 1>(dec, job, rows, t0),
                    2 => gemv_tile::<D, R, 2>(dec, job, rows, t0),
                    3 => gemv_tile::<D, R, 3>(dec, job, rows, t0),
                    _ => gemv_tile::<D, R, 4>(dec, job, rows, t0),
                }
            }
        }
        t0 += tn;
    }
}

/// `R` rows × `T` tokens from `t0`, every column, decoding as it goes.
///
/// # Safety
///
/// As [`run_format`], for every row of `rows`; and tokens `t0..t0 + T` exist
/// (`t0 + T ≤ job.tokens`), so `x` holds their `T · cols` values and `out`
/// their outputs.
#[inline(always)]
unsafe fn gemv_tile<D: Decoder, const R: usize, const T: usize>(
    dec: &D,
    job: &Job,
    rows: [usize; R],
    t0: usize,
) {
    let (cols, n_rows) = (job.weight.cols, job.weight.rows);
    let x = job.x[t0 * cols..].as_ptr();
    let chunks = cols / D::CHUNK;
    // SAFETY: AVX2 is present (the contract).
    let zero = unsafe { _mm256_setzero_ps() };
    // Per output, its accumulator (a pair in the paired order: even, odd).
    let mut acc = [[[zero; 2]; T]; R];
    let mut w = [[zero; 8]; R];
    let streams = RowStreams::new(dec, rows, chunks);
    for ch in 0..chunks {
        let xo = ch * D::CHUNK;
        streams.prefetch(ch);
        for (&row, w_r) in rows.iter().zip(w.iter_mut()) {
            // SAFETY: chunk ch of the row is inside the matrix.
            unsafe { dec.decode(row, ch, w_r) };
        }
        // Vector by vector, the R·T accumulators side by side: independent
        // FMAs back to back hide the FMA latency (one row's chain alone is
        // VECS deep per chunk). Each accumulator still sums its products in
        // column order, so the result is the same bits as row by row.
        for v in 0..D::VECS {
            let half = if D::PAIRED { v % 2 } else { 0 };
            for t in 0..T {
                // SAFETY: x holds T rows of cols values from t0.
                let xv = unsafe { _mm256_loadu_ps(x.add(t * cols + xo + 8 * v)) };
                for (acc_r, w_r) in acc.iter_mut().zip(w.iter()) {
                    // SAFETY: FMA is present (the contract).
                    acc_r[t][half] = unsafe { _mm256_fmadd_ps(w_r[v], xv, acc_r[t][half]) };
                }
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (t, &[even, odd]) in acc_r.iter().enumerate() {
            // SAFETY: token t0 + t exists; the caller owns row rows[r];
            // AVX is present.
            unsafe {
                let acc_rt = if D::PAIRED {
                    _mm256_add_ps(even, odd)
                } else {
                    even
                };
                let sum = finish(dec, acc_rt, rows[r], cols, x.add(t * cols));
                *job.out.get().add((t0 + t) * n_rows + rows[r]) = sum;
            }
        }
    }
}

/// The GEMV's rows as streams: where each row's bytes start and how many
/// a chunk takes, for the prefetch.
struct RowStreams<const R: usize> {
    starts: [*const u8; R],
    chunk_bytes: usize,
}

impl<const R: usize> RowStreams<R> {
    #[inline(always)]
    fn new<D: Decoder>(dec: &D, rows: [usize; R], chunks: usize) -> Self {
        RowStreams {
            starts: rows.map(|row| dec.row_bytes(row).as_ptr()),
            chunk_bytes: dec.row_bytes(rows[0]).len() / chunks.max(1),
        }
    }

    /// Once per cache line of each row: asks for the line STREAM_AHEAD
    /// bytes on from chunk `ch` (past a row's end, the next row of its
    /// share).
    #[inline(always)]
    fn prefetch(&self, ch: usize) {
        let at = ch * self.chunk_bytes;
        if at % LINE < self.chunk_bytes {
            for &start in &self.starts {
                prefetch_line(start, at + STREAM_AHEAD);
            }
        }
    }
}

/// [`gemv_tile`] for the paired order in the AVX-512 build: each output's
/// two accumulators are the halves of one zmm, and each instruction takes
/// 16 columns of a row (`Decoder::decode_wide`).
///
/// # Safety
///
/// As [`gemv_tile`], `D::PAIRED`, and the CPU supports AVX-512F and DQ (the
/// caller is `run_format_avx512`'s build).
#[inline(always)]
unsafe fn gemv_tile_wide<D: Decoder, const R: usize, const T: usize>(
    dec: &D,
    job: &Job,
    rows: [usize; R],
    t0: usize,
) {
    let (cols, n_rows) = (job.weight.cols, job.weight.rows);
    let x = job.x[t0 * cols..].as_ptr();
    let chunks = cols / D::CHUNK;
    // SAFETY: AVX-512F is present (the contract).
    let zero = unsafe { _mm512_setzero_ps() };
    let mut acc = [[zero; T]; R];
    let mut w = [[zero; 4]; R];
    let streams = RowStreams::new(dec, rows, chunks);
    for ch in 0..chunks {
        let xo = ch * D::CHUNK;
        streams.prefetch(ch);
        for (&row, w_r) in rows.iter().zip(w.iter_mut()) {
            // SAFETY: chunk ch of the row is inside the matrix; AVX-512F
            // and DQ are present.
            unsafe { dec.decode_wide(row, ch, w_r) };
        }
        for j in 0..D::VECS / 2 {
            for t in 0..T {
                // SAFETY: x holds T rows of cols values from t0.
                let xv = unsafe { _mm512_loadu_ps(x.add(t * cols + xo + 16 * j)) };
                for (acc_r, w_r) in acc.iter_mut().zip(w.iter()) {
                    // SAFETY: AVX-512F is present (the contract).
                    acc_r[t] = unsafe { _mm512_fmadd_ps(w_r[j], xv, acc_r[t]) };
                }
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (t, &acc_rt) in acc_r.iter().enumerate() {
            // SAFETY: token t0 + t exists; the caller owns row rows[r];
            // AVX-512F and DQ are present.
            unsafe {
                let even_odd = _mm256_add_ps(
                    _mm512_castps512_ps256(acc_rt),
                    _mm512_extractf32x8_ps::<1>(acc_rt),
                );
                let sum = finish(dec, even_odd, rows[r], cols, x.add(t * cols));
                *job.out.get().add((t0 + t) * n_rows + rows[r]) = sum;
            }
        }
    }
}

/// The decoded panel, 64-byte aligned (the layout is the tiles' own).
#[repr(C, align(64))]
struct Panel([MaybeUninit<f32>; PANEL_FLOATS]);

/// Most tiles of one block (3-row tiles of a 24-row block).
const MAX_TILES: usize = PANEL_MAX_ROWS / MR;

/// Panel path: for each block of rows, decode the block's whole chunks into
/// the panel; then for each group of `NT` tokens, walk the columns in
/// blocks of `KC` and run the microkernel over every tile of the block, so
/// that the tokens' block of columns stays in L1 while the panel streams
/// from L2; meanwhile `Ahead` brings the next block's rows in. Accumulators
/// are parked between column blocks (an exact store and reload: the
/// summation order is unchanged).
///
/// # Safety
///
/// As [`run_format`], with the features of `K`, and
/// `K::block_rows(whole) ≥ 1` (the panel's size is derived from
/// `job.weight`, so every block fits it).
#[inline(always)]
unsafe fn panel_rows<D: Decoder, K: PanelTiles>(dec: &D, job: &Job, rows: Range<usize>) {
    let (cols, n_rows, tokens) = (job.weight.cols, job.weight.rows, job.tokens);
    let whole = cols / D::CHUNK * D::CHUNK;
    let block_rows = K::block_rows(whole);
    let mut panel = Panel([MaybeUninit::uninit(); PANEL_FLOATS]);
    let base = panel.0.as_mut_ptr() as *mut f32;
    // SAFETY: K's features are present (the contract).
    let zero = unsafe { K::zero() };
    let mut accs = [zero; MAX_TILES];
    let mut block = rows.start;
    while block < rows.end {
        let nb = block_rows.min(rows.end - block);
        let tiles = nb.div_ceil(K::TILE_ROWS);
        // SAFETY: the block's rows are the unit's (inside the matrix) and
        // nb ≤ block_rows, which the panel holds.
        unsafe { K::decode(dec, base, block, nb, whole) };
        let next = block + nb..(block + nb + block_rows).min(rows.end);
        let mut ahead = Ahead::new(dec, next, tokens.div_ceil(NT) * whole.div_ceil(KC) * tiles);
        let mut t0 = 0;
        while t0 < tokens {
            let tn = (tokens - t0).min(NT);
            let x = job.x[t0 * cols..].as_ptr();
            accs[..tiles].fill(zero);
            let mut k0 = 0;
            while k0 < whole {
                let k1 = (k0 + KC).min(whole);
                for (i, acc) in accs.iter_mut().enumerate().take(tiles) {
                    let tile_rows = (nb - i * K::TILE_ROWS).min(K::TILE_ROWS);
                    let tile_panel = base.wrapping_add(i * K::TILE_ROWS * whole);
                    // SAFETY: the tile's rows were decoded above at
                    // `tile_panel` and tokens t0..t0+tn exist; k0..k1 lies
                    // inside `whole`.
                    unsafe { K::run(tile_panel, whole, tile_rows, x, cols, tn, acc, k0, k1) };
                    ahead.step(dec);
                }
                k0 = k1;
            }
            for r in 0..nb {
                let row = block + r;
                for t in 0..tn {
                    // SAFETY: K's features; token t0 + t exists; the unit
                    // owns this row.
                    unsafe {
                        let acc = K::output(&accs[r / K::TILE_ROWS], r % K::TILE_ROWS, t);
                        let sum = finish(dec, acc, row, cols, x.add(t * cols));
                        *job.out.get().add((t0 + t) * n_rows + row) = sum;
                    }
                }
            }
            t0 += tn;
        }
        block += nb;
    }
}

/// The AVX2 microkernel: `MR` rows × `NT` tokens, one ymm accumulator per
/// output (two in the paired order, each taking its vectors in a pass of
/// its own), rows decoded one after another (`whole` floats apart).
pub(super) struct RowTiles<const PAIRED: bool>;

impl<const PAIRED: bool> PanelTiles for RowTiles<PAIRED> {
    const TILE_ROWS: usize = MR;
    /// The even vectors' accumulators, then the odd ones' (paired order).
    type Accs = [[[__m256; NT]; MR]; 2];

    fn block_rows(whole: usize) -> usize {
        row_block_rows(whole, MR)
    }

    #[inline(always)]
    unsafe fn zero() -> Self::Accs {
        // SAFETY: AVX is present (the contract).
        [[[unsafe { _mm256_setzero_ps() }; NT]; MR]; 2]
    }

    #[inline(always)]
    unsafe fn decode<D: Decoder>(dec: &D, panel: *mut f32, block: usize, nb: usize, whole: usize) {
        // SAFETY: the caller's contract.
        unsafe { decode_rows(dec, panel, block, nb, whole) }
    }

    #[inline(always)]
    unsafe fn run(
        tile_panel: *const f32,
        whole: usize,
        rows: usize,
        x: *const f32,
        cols: usize,
        tn: usize,
        acc: &mut Self::Accs,
        k0: usize,
        k1: usize,
    ) {
        let tile = Tile {
            panel: tile_panel,
            whole,
            x,
            cols,
        };
        let [even, odd] = acc;
        // SAFETY: the caller's contract, for `rows` rows and `tn` tokens;
        // in the paired order k0 and k1 are multiples of 16 (the chunk's
        // vector count is even), so vector k / 8's parity is (k / 8) mod 2.
        unsafe {
            if PAIRED {
                run_tile_sized!(tile, rows, tn, even, k0, k1, 16);
                run_tile_sized!(tile, rows, tn, odd, k0 + 8, k1, 16);
            } else {
                run_tile_sized!(tile, rows, tn, even, k0, k1, 8);
            }
        }
    }

    #[inline(always)]
    unsafe fn output(acc: &Self::Accs, row: usize, t: usize) -> __m256 {
        if PAIRED {
            // SAFETY: AVX is present (the contract).
            unsafe { _mm256_add_ps(acc[0][row][t], acc[1][row][t]) }
        } else {
            acc[0][row][t]
        }
    }
}

/// Where a microkernel tile reads: panel rows from `panel` (stride
/// `whole`), token rows from `x` (stride `cols`).
struct Tile {
    panel: *const f32,
    whole: usize,
    x: *const f32,
    cols: usize,
}

impl Tile {
    /// `RM` panel rows × `NTOK` tokens over the vectors at columns `k0`,
    /// `k0 + step`, … below `k1` (8 columns each; `step` 8, or 16 for one
    /// parity of the paired order), accumulating into `acc[..RM][..NTOK]`.
    ///
    /// # Safety
    ///
    /// As [`run_format`] for the features. `k0 ≤ k1`, multiples of 8; for
    /// every `r < RM`, `panel + r · whole + k0..k1` is
    /// readable and 32-byte aligned (aligned loads: `panel` is, and `whole`
    /// is a multiple of 8); for every `t < NTOK`, `x + t · cols + k0..k1` is
    /// readable.
    #[inline(always)]
    unsafe fn run<const RM: usize, const NTOK: usize>(
        &self,
        acc_io: &mut [[__m256; NT]; MR],
        k0: usize,
        k1: usize,
        step: usize,
    ) {
        let mut acc = [[acc_io[0][0]; NTOK]; RM];
        for (a, io) in acc.iter_mut().zip(acc_io.iter()) {
            a.copy_from_slice(&io[..NTOK]);
        }
        let mut w = [acc_io[0][0]; RM];
        let mut k = k0;
        while k < k1 {
            for (r, wr) in w.iter_mut().enumerate() {
                // SAFETY: k + 8 <= k1 <= whole: inside every panel row.
                *wr = unsafe { _mm256_load_ps(self.panel.add(r * self.whole + k)) };
            }
            for t in 0..NTOK {
                // SAFETY: inside every token row, as above.
                let xv = unsafe { _mm256_loadu_ps(self.x.add(t * self.cols + k)) };
                for (acc_r, wr) in acc.iter_mut().zip(&w) {
                    // SAFETY: FMA is present (the contract).
                    acc_r[t] = unsafe { _mm256_fmadd_ps(*wr, xv, acc_r[t]) };
                }
            }
            k += step;
        }
        for (io, a) in acc_io.iter_mut().zip(&acc) {
            io[..NTOK].copy_from_slice(a);
        }
    }
}
