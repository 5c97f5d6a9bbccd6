//! AVX-512 BF16 matmul kernels for BF16 weights: the tier `Isa::Avx512Bf16`
//! (every other format runs the AVX2 kernels there).
//!
//! **The numerics.** The activations are rounded to bf16 (to nearest, ties
//! to even) and multiplied by the bf16 weights in pairs: `vdpbf16ps` adds
//! two products to each f32 lane per instruction, 32 multiply-adds per
//! 512-bit instruction where an f32 FMA does 16, and reads the weights as
//! they are (no widening, no decoded panel). A bf16 × bf16 product is exact
//! in f32; what differs from the AVX2 tier is the activations' rounding, a
//! relative error of at most 2⁻⁹ per product (llama.cpp rounds them the
//! same way on these CPUs). `tests/kernels_matmul.rs` bounds it.
//!
//! **One summation order** (the prefix cache's bitwise promise, as in
//! `avx2.rs`): whatever the path and however many tokens share the call,
//! 1. the columns of the whole 32-column chunks go to one 16-lane
//!    accumulator, lane `l` taking columns `32u + 2l` and `32u + 2l + 1` of
//!    chunk `u`, in ascending `u`, by `vdpbf16ps(acc, w, x)`;
//! 2. the 16 lanes are reduced as `l + (l + 8)` for `l < 8`, then in the
//!    AVX2 order (`lanes::reduce`);
//! 3. the columns after the last whole chunk are added one by one,
//!    `s + w · bf16(x)`.
//!
//! - GEMV path (at most `GEMV_MAX_TOKENS` tokens): `R` rows in lockstep,
//!   each chunk of the tokens' activations rounded as it is used.
//! - Block path (more tokens): for a block of `BLOCK_ROWS` rows (L1/L2
//!   resident, read in place), each tile of `NT` tokens has its activations
//!   rounded `KC` columns at a time into a stack buffer, then an `MR × NT`
//!   microkernel (24 accumulators, 4 + 6 loads per 24 `vdpbf16ps`) runs over
//!   every row tile of the block. Rounding once per block of rows costs
//!   1/`BLOCK_ROWS` of the multiply-adds.
//!
//! Every `unsafe fn` here requires AVX2, FMA, AVX-512F/BW/VL and AVX-512
//! BF16; the module is only entered through `Isa::Avx512Bf16`, which exists
//! only after run-time detection of all of them. Those that take a `job`
//! also require the job contract of `avx2.rs` (shapes checked by
//! `check_problem`, rows inside `0..rows`, each work unit owning its rows'
//! outputs).

use std::arch::x86_64::*;
use std::ops::Range;

use super::lanes::{in_lockstep, reduce};
use crate::backend::cpu::kernels::job::{Job, Path};
use crate::backend::cpu::kernels::prefetch::{STREAM_AHEAD, prefetch_line};
use crate::formats::{f32_to_bf16, read_bf16};

/// Columns per chunk: one 512-bit vector of bf16.
const CHUNK: usize = 32;
/// Problems with at most this many tokens take the GEMV path.
const GEMV_MAX_TOKENS: usize = 4;
/// Rows and tokens of the block path's microkernel.
const MR: usize = 4;
const NT: usize = 6;
/// Rows of a block (a multiple of `MR`; the dispatcher's units are
/// multiples of 24 rows, so only a problem's last block is short).
const BLOCK_ROWS: usize = 24;
/// Columns of activations rounded at a time (6 tokens × 512 × 2 B = 6 KiB,
/// L1-resident while every row tile of the block passes over it).
const KC: usize = 512;

/// Which path a problem takes.
pub(super) fn choose_path(tokens: usize) -> Path {
    if tokens > GEMV_MAX_TOKENS {
        Path::Panel
    } else {
        Path::Gemv
    }
}

/// Rows `rows` of a BF16 job (`bytes`: the weight's `rows × cols` bf16).
///
/// # Safety
///
/// The CPU supports the features of the module docs, and the job contract
/// holds for `job` and `rows`; `bytes` is the job's BF16 weight data.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn run_rows(bytes: &[u8], job: &Job, rows: Range<usize>) {
    let w = Bf16Rows {
        bytes,
        cols: job.weight.cols,
    };
    // SAFETY: same contract as this function's.
    unsafe {
        match job.path {
            Path::Gemv if job.tokens <= 2 => gemv_streams::<4>(&w, job, rows),
            Path::Gemv => gemv_streams::<2>(&w, job, rows),
            Path::Panel => block_rows(&w, job, rows),
        }
    }
}

/// The weight as rows of bf16.
struct Bf16Rows<'a> {
    bytes: &'a [u8],
    cols: usize,
}

impl Bf16Rows<'_> {
    /// Chunk `chunk` of row `row`: 32 bf16.
    ///
    /// # Safety
    ///
    /// The module's features; `row < rows` and `(chunk + 1) · 32 ≤ cols`.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
    #[inline]
    unsafe fn chunk(&self, row: usize, chunk: usize) -> __m512bh {
        let offset = (row * self.cols + chunk * CHUNK) * 2;
        // SAFETY: 64 bytes inside the weight per the contract; loadu has no
        // alignment need; 32 bf16 in a 512-bit register are a __m512bh.
        unsafe {
            std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                self.bytes.as_ptr().add(offset) as *const __m512i,
            ))
        }
    }
}

/// 32 activations from `x`, rounded to bf16 (nearest, ties to even).
///
/// # Safety
///
/// The module's features; 32 readable f32 at `x`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
pub(super) unsafe fn round_chunk(x: *const f32) -> __m512bh {
    // SAFETY: 32 readable f32 per the contract.
    unsafe { _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x.add(16)), _mm512_loadu_ps(x)) }
}

/// Steps 2 and 3 for one output: the reduced accumulator plus the columns
/// after the last whole chunk (`x`: the token's row of `cols` f32).
///
/// # Safety
///
/// The module's features; `x` holds `w.cols` readable f32; `row < rows`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
unsafe fn finish(w: &Bf16Rows, acc: __m512, row: usize, x: *const f32) -> f32 {
    let halves = _mm256_add_ps(
        _mm512_castps512_ps256(acc),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc))),
    );
    let mut sum = reduce(halves);
    for c in w.cols / CHUNK * CHUNK..w.cols {
        // SAFETY: c < cols.
        let xc = f32::from_bits(u32::from(f32_to_bf16(unsafe { *x.add(c) })) << 16);
        sum += read_bf16(w.bytes, row * w.cols + c) * xc;
    }
    sum
}

/// GEMV path with `R` rows in lockstep (see [`in_lockstep`]).
///
/// # Safety
///
/// The module's features; the job contract for `job` and `rows`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn gemv_streams<const R: usize>(w: &Bf16Rows, job: &Job, rows: Range<usize>) {
    // SAFETY: the rows are inside the unit, which owns their outputs.
    in_lockstep::<R>(
        rows,
        |set| unsafe { gemv_set(w, job, set) },
        |row| unsafe { gemv_set(w, job, [row]) },
    );
}

/// One set of rows against every token, in tiles of at most 4 tokens.
///
/// # Safety
///
/// The module's features; the job contract for `job` and every row of
/// `rows` (inside `0..rows`, its outputs owned by the caller's unit).
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
unsafe fn gemv_set<const R: usize>(w: &Bf16Rows, job: &Job, rows: [usize; R]) {
    let mut t0 = 0;
    while t0 < job.tokens {
        let tn = (job.tokens - t0).min(GEMV_MAX_TOKENS);
        // SAFETY: tokens t0..t0+tn exist; the rows are the caller's.
        unsafe {
            match tn {
                1 => gemv_tile::<R, 1>(w, job, rows, t0),
                2 => gemv_tile::<R, 2>(w, job, rows, t0),
                3 => gemv_tile::<R, 3>(w, job, rows, t0),
                _ => gemv_tile::<R, 4>(w, job, rows, t0),
            }
        }
        t0 += tn;
    }
}

/// `R` rows × `T` tokens from `t0`, every column.
///
/// # Safety
///
/// The module's features; the job contract for `job` and every row of
/// `rows`; tokens `t0..t0 + T` exist.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
unsafe fn gemv_tile<const R: usize, const T: usize>(
    w: &Bf16Rows,
    job: &Job,
    rows: [usize; R],
    t0: usize,
) {
    let (cols, n_rows) = (w.cols, job.weight.rows);
    let x = job.x[t0 * cols..].as_ptr();
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for ch in 0..cols / CHUNK {
        // SAFETY: x holds T rows of cols values; the chunk is inside them.
        let xb: [__m512bh; T] =
            std::array::from_fn(|t| unsafe { round_chunk(x.add(t * cols + ch * CHUNK)) });
        for (acc_r, &row) in acc.iter_mut().zip(&rows) {
            // A chunk is a cache line of the row.
            prefetch_line(
                w.bytes.as_ptr(),
                (row * cols + ch * CHUNK) * 2 + STREAM_AHEAD,
            );
            // SAFETY: chunk ch of the row is inside the matrix.
            let wv = unsafe { w.chunk(row, ch) };
            for (a, &xv) in acc_r.iter_mut().zip(&xb) {
                *a = _mm512_dpbf16_ps(*a, wv, xv);
            }
        }
    }
    for (acc_r, &row) in acc.iter().zip(&rows) {
        for (t, &a) in acc_r.iter().enumerate() {
            // SAFETY: token t0 + t exists; the unit owns this row.
            unsafe {
                *job.out.get().add((t0 + t) * n_rows + row) = finish(w, a, row, x.add(t * cols));
            }
        }
    }
}

/// `NT` tokens' activations for columns `k0..k0 + KC`, rounded to bf16.
#[repr(C, align(64))]
struct RoundedTile([[u16; KC]; NT]);

/// Accumulators of one token tile against every row tile of a block.
type BlockAccs = [[[__m512; NT]; MR]; BLOCK_ROWS / MR];

/// Block path (see the module docs). Accumulators stay in `BlockAccs`
/// between column blocks (an exact store and reload: the order holds).
///
/// # Safety
///
/// The module's features; the job contract for `job` and `rows`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn block_rows(w: &Bf16Rows, job: &Job, rows: Range<usize>) {
    let (cols, n_rows, tokens) = (w.cols, job.weight.rows, job.tokens);
    let whole = cols / CHUNK * CHUNK;
    let mut tile = RoundedTile([[0; KC]; NT]);
    let mut accs: BlockAccs = [[[_mm512_setzero_ps(); NT]; MR]; BLOCK_ROWS / MR];
    let mut block = rows.start;
    while block < rows.end {
        let nb = BLOCK_ROWS.min(rows.end - block);
        let tiles = nb.div_ceil(MR);
        let mut t0 = 0;
        while t0 < tokens {
            let tn = (tokens - t0).min(NT);
            let x = job.x[t0 * cols..].as_ptr();
            for acc in accs.iter_mut().take(tiles) {
                *acc = [[_mm512_setzero_ps(); NT]; MR];
            }
            let mut k0 = 0;
            while k0 < whole {
                let k1 = (k0 + KC).min(whole);
                for (t, dst) in tile.0.iter_mut().enumerate() {
                    for k in (k0..k1).step_by(CHUNK) {
                        // Tokens past the tile's end compute into
                        // accumulators nobody reads: zeros will do.
                        let v = if t < tn {
                            // SAFETY: token t0 + t exists, k + 32 ≤ cols.
                            unsafe { round_chunk(x.add(t * cols + k)) }
                        } else {
                            // SAFETY: zero bits are zero bf16.
                            unsafe {
                                std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512())
                            }
                        };
                        // SAFETY: k - k0 + 32 ≤ KC: inside the tile's row.
                        unsafe {
                            _mm512_storeu_si512(
                                dst.as_mut_ptr().add(k - k0) as *mut __m512i,
                                std::mem::transmute::<__m512bh, __m512i>(v),
                            )
                        };
                    }
                }
                for (i, acc) in accs.iter_mut().enumerate().take(tiles) {
                    let first = block + i * MR;
                    // SAFETY: rows first.. of the tile are inside the unit;
                    // columns k0..k1 inside `whole`; the tile holds them.
                    unsafe {
                        match (nb - i * MR).min(MR) {
                            4 => micro::<4>(w, first, &tile, acc, k0, k1),
                            3 => micro::<3>(w, first, &tile, acc, k0, k1),
                            2 => micro::<2>(w, first, &tile, acc, k0, k1),
                            _ => micro::<1>(w, first, &tile, acc, k0, k1),
                        }
                    }
                }
                k0 = k1;
            }
            for r in 0..nb {
                let row = block + r;
                for (t, &a) in accs[r / MR][r % MR].iter().enumerate().take(tn) {
                    // SAFETY: token t0 + t exists; the unit owns this row.
                    unsafe {
                        *job.out.get().add((t0 + t) * n_rows + row) =
                            finish(w, a, row, x.add(t * cols));
                    }
                }
            }
            t0 += tn;
        }
        block += nb;
    }
}

/// `RM` rows from `first` × the tile's `NT` tokens over columns `k0..k1`
/// (multiples of 32, at most `KC` apart), into `acc[..RM]`.
///
/// # Safety
///
/// The module's features; rows `first..first + RM` exist; `k1 ≤ cols`
/// rounded down to a chunk; `tile` holds columns `k0..k1`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
unsafe fn micro<const RM: usize>(
    w: &Bf16Rows,
    first: usize,
    tile: &RoundedTile,
    acc_io: &mut [[__m512; NT]; MR],
    k0: usize,
    k1: usize,
) {
    let mut acc: [[__m512; NT]; RM] = std::array::from_fn(|r| acc_io[r]);
    for k in (k0..k1).step_by(CHUNK) {
        // SAFETY: rows and chunk inside the matrix per the contract.
        let wv: [__m512bh; RM] = std::array::from_fn(|r| unsafe { w.chunk(first + r, k / CHUNK) });
        for t in 0..NT {
            // SAFETY: k - k0 + 32 ≤ KC; 64 readable bytes of the tile row.
            let xv = unsafe {
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    tile.0[t].as_ptr().add(k - k0) as *const __m512i,
                ))
            };
            for (acc_r, &wr) in acc.iter_mut().zip(&wv) {
                acc_r[t] = _mm512_dpbf16_ps(acc_r[t], wr, xv);
            }
        }
    }
    acc_io[..RM].copy_from_slice(&acc);
}
