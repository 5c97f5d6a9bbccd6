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
//! `WideTiles` is the panel of the paired order (FP8): one row per zmm, 16
//! consecutive columns, the even vector's 8 in the low half and the odd
//! one's in the high, which are the two accumulators of that order; the
//! halves are added before `finish`, as the AVX2 build adds its two.
//!
//! Only the layouts and the tiles are here: `avx2.rs`'s `panel_rows` runs the
//! block loop for both tile kinds. Everything is `#[inline(always)]` into
//! `run_format_avx512` (AVX-512F, VL and DQ enabled there), as the module
//! docs of `avx2.rs` require.

use std::arch::x86_64::*;

use super::lanes::{
    Decoder, NT, PANEL_FLOATS, PANEL_MAX_ROWS, PanelTiles, decode_rows, row_block_rows,
    run_tile_sized,
};

/// Row pairs of a microkernel tile: 3 pairs × `NT` tokens, 12 zmm
/// accumulators, 3 + 4 loads per 12 FMAs of 16 lanes.
const MP: usize = 3;

/// The panel's tiles over row pairs, for `avx2.rs`'s `panel_rows` (its
/// block loop, prefetch and finish are the AVX2 panel's).
pub(super) struct PairTiles;

impl PanelTiles for PairTiles {
    const TILE_ROWS: usize = 2 * MP;
    type Accs = [[__m512; NT]; MP];

    /// An even count (a lone last row of a unit is paired with zeros).
    fn block_rows(whole: usize) -> usize {
        if whole == 0 {
            return 0;
        }
        (PANEL_FLOATS / whole).min(PANEL_MAX_ROWS) / 2 * 2
    }

    #[inline(always)]
    unsafe fn zero() -> Self::Accs {
        // SAFETY: AVX-512F is present (the contract).
        [[unsafe { _mm512_setzero_ps() }; NT]; MP]
    }

    #[inline(always)]
    unsafe fn decode<D: Decoder>(dec: &D, panel: *mut f32, block: usize, nb: usize, whole: usize) {
        // SAFETY: the caller's contract (block_rows is even, so the pairs
        // of nb rows fit the panel).
        unsafe { decode_pairs(dec, panel, block, nb, whole) }
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
        let tile = PairTile {
            panel: tile_panel,
            pair_stride: 2 * whole,
            x,
            cols,
        };
        // SAFETY: the caller's contract, for the tile's pairs and `tn`
        // tokens.
        unsafe { run_tile_sized!(tile, rows.div_ceil(2), tn, acc, k0, k1) }
    }

    /// The even row's accumulator is the low half, the odd row's the high.
    #[inline(always)]
    unsafe fn output(acc: &Self::Accs, row: usize, t: usize) -> __m256 {
        let pair = acc[row / 2][t];
        if row.is_multiple_of(2) {
            // SAFETY: AVX-512F is present (the contract).
            unsafe { _mm512_castps512_ps256(pair) }
        } else {
            // SAFETY: AVX-512DQ is present (the contract).
            unsafe { _mm512_extractf32x8_ps::<1>(pair) }
        }
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

/// Rows of a wide microkernel tile: 3 rows × `NT` tokens, 12 zmm
/// accumulators, 3 + 4 loads per 12 FMAs of 16 lanes.
const MW: usize = 3;

/// The paired order's tiles: rows one after another in the panel (the AVX2
/// tiles' layout, `decode_rows`), 16 columns a zmm.
pub(super) struct WideTiles;

impl PanelTiles for WideTiles {
    const TILE_ROWS: usize = MW;
    type Accs = [[__m512; NT]; MW];

    fn block_rows(whole: usize) -> usize {
        row_block_rows(whole, MW)
    }

    #[inline(always)]
    unsafe fn zero() -> Self::Accs {
        // SAFETY: AVX-512F is present (the contract).
        [[unsafe { _mm512_setzero_ps() }; NT]; MW]
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
        let tile = WideTile {
            panel: tile_panel,
            whole,
            x,
            cols,
        };
        // SAFETY: the caller's contract, for `rows` rows and `tn` tokens.
        unsafe { run_tile_sized!(tile, rows, tn, acc, k0, k1) }
    }

    /// The even vectors' accumulator (low half) plus the odd ones' (high).
    #[inline(always)]
    unsafe fn output(acc: &Self::Accs, row: usize, t: usize) -> __m256 {
        let wide = acc[row][t];
        // SAFETY: AVX-512F and DQ are present (the contract).
        unsafe {
            _mm256_add_ps(
                _mm512_castps512_ps256(wide),
                _mm512_extractf32x8_ps::<1>(wide),
            )
        }
    }
}

/// Where a wide microkernel tile reads: rows from `panel` (stride `whole`),
/// token rows from `x` (stride `cols`).
struct WideTile {
    panel: *const f32,
    whole: usize,
    x: *const f32,
    cols: usize,
}

impl WideTile {
    /// `RM` rows × `NTOK` tokens over columns `k0..k1` (multiples of 16),
    /// accumulating into `acc[..RM][..NTOK]`.
    ///
    /// # Safety
    ///
    /// AVX-512F (the caller's features). For every `r < RM`,
    /// `panel + r · whole + k0..k1` is readable; for every `t < NTOK`,
    /// `x + t · cols + k0..k1` is readable.
    #[inline(always)]
    unsafe fn run<const RM: usize, const NTOK: usize>(
        &self,
        acc_io: &mut [[__m512; NT]; MW],
        k0: usize,
        k1: usize,
    ) {
        let mut acc = [[acc_io[0][0]; NTOK]; RM];
        for (a, io) in acc.iter_mut().zip(acc_io.iter()) {
            a.copy_from_slice(&io[..NTOK]);
        }
        let mut w = [acc_io[0][0]; RM];
        let mut k = k0;
        while k < k1 {
            for (r, wr) in w.iter_mut().enumerate() {
                // SAFETY: k + 16 <= k1 <= whole: inside every panel row.
                *wr = unsafe { _mm512_loadu_ps(self.panel.add(r * self.whole + k)) };
            }
            for t in 0..NTOK {
                // SAFETY: inside the token's row, as above.
                let xv = unsafe { _mm512_loadu_ps(self.x.add(t * self.cols + k)) };
                for (acc_r, wr) in acc.iter_mut().zip(&w) {
                    // SAFETY: AVX-512F is present (the contract).
                    acc_r[t] = unsafe { _mm512_fmadd_ps(*wr, xv, acc_r[t]) };
                }
            }
            k += 16;
        }
        for (io, a) in acc_io.iter_mut().zip(&acc) {
            io[..NTOK].copy_from_slice(a);
        }
    }
}
