//! The panel path of `avx2.rs` with 512-bit registers, for the AVX-512
//! build: two weight rows per zmm, so each fused multiply-add does 16 lane
//! products where the AVX2 microkernel does 8, and the same loads feed twice
//! the work. The sums are the AVX2 panel's, bit for bit.
//!
//! **Why the bits do not move.** In `avx2.rs`'s summation order, lane `l`
//! of an output's single 8-lane accumulator takes column `8u + l` of every
//! vector `u` in ascending `u`. Here the panel stores rows in pairs, vector
//! `u` of the even row in a zmm's low half and of the odd row in its high
//! half, and each token's 8 columns are broadcast to both halves: the low
//! half of an accumulator is exactly the even row's 8-lane accumulator, the
//! high half the odd row's, each lane taking the same products in the same
//! order. Both halves are then reduced and finished by `avx2.rs`'s own
//! `finish`. So GEMV (ymm) and this panel still agree for every token, and
//! batch invariance holds across the paths.
//!
//! Everything here is `#[inline(always)]` into `run_format_avx512` (AVX-512F,
//! VL and DQ enabled there), as the module docs of `avx2.rs` require.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::avx2::{KC, PANEL_FLOATS, PANEL_MAX_ROWS, finish};
use super::lanes::{Ahead, Decoder};
use crate::backend::cpu::kernels::job::Job;

/// Row pairs and tokens of the microkernel: 3 × 4 zmm accumulators (6 rows
/// × 4 tokens), 3 + 4 loads per 12 FMAs of 16 lanes.
const MP: usize = 3;
const NT: usize = 4;

/// The decoded panel, in row pairs (see the module docs), 64-byte aligned.
#[repr(C, align(64))]
struct PairPanel([MaybeUninit<f32>; PANEL_FLOATS]);

/// Accumulators of one token tile against every pair tile of a block, kept
/// between k blocks.
type PairAccs = [[[__m512; NT]; MP]; PANEL_MAX_ROWS / (2 * MP)];

/// Rows per block of the paired panel: an even count that fits it (0 if
/// not even one pair does; the caller then takes the AVX2 panel).
pub(super) fn pair_rows_for(whole: usize) -> usize {
    if whole == 0 {
        return 0;
    }
    (PANEL_FLOATS / whole).min(PANEL_MAX_ROWS) / 2 * 2
}

/// The panel path over row pairs: as `avx2.rs`'s `panel_rows`, block by
/// block (rows decoded once, then every token), with the next block
/// prefetched while this one computes.
///
/// # Safety
///
/// As `avx2.rs`'s `run_format`, and the CPU has AVX-512F, VL and DQ (the
/// caller is `run_format_avx512`); `block_rows = pair_rows_for(..) ≥ 2`.
#[inline(always)]
pub(super) unsafe fn pair_panel_rows<D: Decoder>(
    dec: &D,
    job: &Job,
    rows: Range<usize>,
    block_rows: usize,
) {
    let (cols, n_rows, tokens) = (job.weight.cols, job.weight.rows, job.tokens);
    let whole = cols / D::CHUNK * D::CHUNK;
    let mut panel = PairPanel([MaybeUninit::uninit(); PANEL_FLOATS]);
    let base = panel.0.as_mut_ptr() as *mut f32;
    // SAFETY: AVX-512F is present (the contract).
    let zero = unsafe { _mm512_setzero_ps() };
    let mut accs: PairAccs = [[[zero; NT]; MP]; PANEL_MAX_ROWS / (2 * MP)];
    let mut block = rows.start;
    while block < rows.end {
        let nb = block_rows.min(rows.end - block);
        let pairs = nb.div_ceil(2);
        // SAFETY: every chunk decoded is inside the matrix (rows of the
        // unit, whole chunks); pair p's floats are p·2·whole .. (p+1)·2·whole,
        // inside the panel since 2 · pairs ≤ block_rows and
        // block_rows · whole ≤ PANEL_FLOATS.
        unsafe { decode_pairs(dec, base, block, nb, whole) };
        let next = block + nb..(block + nb + block_rows).min(rows.end);
        let tiles = tokens.div_ceil(NT) * whole.div_ceil(KC) * pairs.div_ceil(MP);
        let mut ahead = Ahead::new(dec, next, tiles);
        let mut t0 = 0;
        while t0 < tokens {
            let tn = (tokens - t0).min(NT);
            let x = job.x[t0 * cols..].as_ptr();
            for acc in accs.iter_mut().take(pairs.div_ceil(MP)) {
                *acc = [[zero; NT]; MP];
            }
            let mut k0 = 0;
            while k0 < whole {
                let k1 = (k0 + KC).min(whole);
                for (i, acc) in accs.iter_mut().enumerate().take(pairs.div_ceil(MP)) {
                    let pm = (pairs - i * MP).min(MP);
                    let tile = PairTile {
                        panel: base.wrapping_add(i * MP * 2 * whole),
                        pair_stride: 2 * whole,
                        x,
                        cols,
                    };
                    // SAFETY: the tile's pairs were decoded above and tokens
                    // t0..t0+tn exist; k0..k1 lies inside `whole`.
                    unsafe {
                        match (pm, tn) {
                            (3, 4) => tile.run::<3, 4>(acc, k0, k1),
                            (3, 3) => tile.run::<3, 3>(acc, k0, k1),
                            (3, 2) => tile.run::<3, 2>(acc, k0, k1),
                            (3, _) => tile.run::<3, 1>(acc, k0, k1),
                            (2, 4) => tile.run::<2, 4>(acc, k0, k1),
                            (2, 3) => tile.run::<2, 3>(acc, k0, k1),
                            (2, 2) => tile.run::<2, 2>(acc, k0, k1),
                            (2, _) => tile.run::<2, 1>(acc, k0, k1),
                            (_, 4) => tile.run::<1, 4>(acc, k0, k1),
                            (_, 3) => tile.run::<1, 3>(acc, k0, k1),
                            (_, 2) => tile.run::<1, 2>(acc, k0, k1),
                            (_, _) => tile.run::<1, 1>(acc, k0, k1),
                        }
                    }
                    ahead.step(dec);
                }
                k0 = k1;
            }
            for r in 0..nb {
                let row = block + r;
                for (t, &acc) in accs[r / (2 * MP)][(r / 2) % MP].iter().enumerate().take(tn) {
                    // SAFETY: AVX-512F/DQ are present; token t0 + t exists;
                    // the unit owns this row.
                    unsafe {
                        let half = if r % 2 == 0 {
                            _mm512_castps512_ps256(acc)
                        } else {
                            _mm512_extractf32x8_ps::<1>(acc)
                        };
                        let sum = finish(dec, half, row, cols, x.add(t * cols));
                        *job.out.get().add((t0 + t) * n_rows + row) = sum;
                    }
                }
            }
            t0 += tn;
        }
        block += nb;
    }
}

/// Decodes rows `block .. block + nb` into row pairs at `base`: vector `u`
/// (columns 8u..8u+8) of row `2p + h` at float `p · 2 · whole + 16u + 8h`.
/// An odd last row's partner half is zero (its outputs are never read).
///
/// # Safety
///
/// AVX2 (the caller's features); the rows' whole chunks lie inside the
/// matrix `dec` decodes and `base` holds `nb.div_ceil(2) · 2 · whole`
/// writable floats.
#[inline(always)]
unsafe fn decode_pairs<D: Decoder>(dec: &D, base: *mut f32, block: usize, nb: usize, whole: usize) {
    // SAFETY: AVX2 is present (the contract).
    let zero = unsafe { _mm256_setzero_ps() };
    let mut w = [zero; 8];
    for r in 0..nb.div_ceil(2) * 2 {
        let half = base.wrapping_add((r / 2) * 2 * whole + (r % 2) * 8);
        for ch in 0..whole / D::CHUNK {
            if r < nb {
                // SAFETY: the chunk is inside the matrix (the contract).
                unsafe { dec.decode(block + r, ch, &mut w) };
            } else {
                w = [zero; 8];
            }
            for (v, wv) in w.iter().enumerate().take(D::VECS) {
                let u = ch * D::VECS + v;
                // SAFETY: inside the pair's 2 · whole floats (the contract);
                // 32-byte aligned: base is, and every offset is a multiple
                // of 8 floats.
                unsafe { _mm256_store_ps(half.add(16 * u), *wv) };
            }
        }
    }
}

/// Where a microkernel tile reads: row pairs from `panel` (stride
/// `pair_stride` floats), token rows from `x` (stride `cols`).
struct PairTile {
    panel: *const f32,
    pair_stride: usize,
    x: *const f32,
    cols: usize,
}

impl PairTile {
    /// `PM` row pairs × `NTOK` tokens over columns `k0..k1` (multiples of
    /// 8), accumulating into `acc[..PM][..NTOK]`.
    ///
    /// # Safety
    ///
    /// AVX-512F and DQ (the caller's features). `k1 − k0` a multiple of 8;
    /// for every `p < PM`, the pair's floats `16 · k0 / 8 .. 16 · k1 / 8`
    /// are readable and 64-byte aligned; for every `t < NTOK`,
    /// `x + t · cols + k0..k1` is readable.
    #[inline(always)]
    unsafe fn run<const PM: usize, const NTOK: usize>(
        &self,
        acc_io: &mut [[__m512; NT]; MP],
        k0: usize,
        k1: usize,
    ) {
        let mut acc = [[acc_io[0][0]; NTOK]; PM];
        for (a, io) in acc.iter_mut().zip(acc_io.iter()) {
            a.copy_from_slice(&io[..NTOK]);
        }
        let mut w = [acc_io[0][0]; PM];
        let mut k = k0;
        while k < k1 {
            for (p, wp) in w.iter_mut().enumerate() {
                // SAFETY: vector k / 8 of pair p: inside the panel, aligned.
                *wp = unsafe { _mm512_load_ps(self.panel.add(p * self.pair_stride + 2 * k)) };
            }
            for t in 0..NTOK {
                // SAFETY: inside the token's row; the 8 columns go to both
                // halves (one load, no shuffle).
                let xv = unsafe {
                    _mm512_broadcast_f32x8(_mm256_loadu_ps(self.x.add(t * self.cols + k)))
                };
                for (acc_p, wp) in acc.iter_mut().zip(&w) {
                    // SAFETY: AVX-512F is present (the contract).
                    acc_p[t] = unsafe { _mm512_fmadd_ps(*wp, xv, acc_p[t]) };
                }
            }
            k += 8;
        }
        for (io, a) in acc_io.iter_mut().zip(&acc) {
            io[..NTOK].copy_from_slice(a);
        }
    }
}
