//! Helpers shared by the AVX2 matmul kernels (`avx2.rs`, `avx2_fp8.rs`,
//! `avx2_fp4.rs` and the AVX-512 panel, `avx512_panel.rs`): the fixed lane
//! reduction of their summation order, the lockstep walk over a work unit's
//! rows, the `Decoder` each f32-decoding format implements, the panel
//! path's sizes and the `PanelTiles` its two microkernels implement, and the
//! panels' prefetch of their next block (`Ahead`).

use std::arch::x86_64::*;
use std::ops::Range;

use crate::backend::cpu::kernels::prefetch::LINE;

/// Step 2 of the summation order (see avx2.rs): `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn reduce(v: __m256) -> f32 {
    let h = _mm256_hadd_ps(v, v); // l0+l1, l2+l3, .. | l4+l5, l6+l7, ..
    let h = _mm256_hadd_ps(h, h);
    _mm_cvtss_f32(_mm_add_ss(
        _mm256_castps256_ps128(h),
        _mm256_extractf128_ps(h, 1),
    ))
}

/// The unit's rows cut into `R` contiguous shares walked in lockstep (each
/// share one sequential stream the prefetchers follow): `set` gets row `i`
/// of every share, then `single` each leftover row.
#[inline]
pub(super) fn in_lockstep<const R: usize>(
    rows: Range<usize>,
    mut set: impl FnMut([usize; R]),
    mut single: impl FnMut(usize),
) {
    let (sets, singles) = lockstep_sets::<R>(rows);
    sets.for_each(&mut set);
    singles.for_each(&mut single);
}

/// [`in_lockstep`]'s walk as data, for kernels that must not call through
/// closures (`avx2.rs`'s bodies inherit their entry point's features): the
/// sets (row `i` of every share), then the leftover rows.
#[inline(always)]
pub(super) fn lockstep_sets<const R: usize>(
    rows: Range<usize>,
) -> (impl Iterator<Item = [usize; R]>, Range<usize>) {
    let share = rows.len() / R;
    let start = rows.start;
    let sets = (0..share).map(move |i| {
        let mut set = [start; R];
        for (s, row) in set.iter_mut().enumerate() {
            *row += s * share + i;
        }
        set
    });
    (sets, start + R * share..rows.end)
}

/// Turns weight chunks into f32 vectors of 8 consecutive columns.
pub(super) trait Decoder {
    /// Values per chunk (a multiple of 8).
    const CHUNK: usize;
    /// Vectors per chunk.
    const VECS: usize = Self::CHUNK / 8;
    /// Whether the GEMV path walks 4 rows in lockstep for 1-2 tokens (else
    /// 2): enough independent chains to hide the FMA latency (one chain per
    /// output and token: 2 rows at one token leave NVFP4 latency-bound), as
    /// long as the rows' decoded chunks fit the registers of the build that
    /// runs the decoder (16 on AVX2, 32 on AVX-512). Which rows share a walk
    /// never changes a sum.
    const FOUR_ROWS_IN_LOCKSTEP: bool = true;
    /// Whether the format sums in the **paired order**: each output's even
    /// vectors (columns `16j .. 16j + 8`) in one 8-lane accumulator and its
    /// odd vectors in another, added lane by lane before the reduction
    /// (avx2.rs, step 1'). Then the AVX-512 build takes 16 columns of a row
    /// per zmm instruction (`decode_wide`), the even vector in the low half
    /// and the odd one in the high, with the AVX2 build's bits. Every chunk
    /// then holds an even number of vectors.
    const PAIRED: bool = false;
    /// Decodes chunk `chunk` of row `row` into `out[..VECS / 2]`, 16
    /// columns a zmm in order (for the `PAIRED` order's AVX-512 build).
    /// This default builds them from [`Decoder::decode`]'s vectors.
    ///
    /// # Safety
    ///
    /// As [`Decoder::decode`], and the CPU supports AVX-512F and DQ.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq")]
    #[inline]
    unsafe fn decode_wide(&self, row: usize, chunk: usize, out: &mut [__m512; 4]) {
        let mut narrow = [_mm256_setzero_ps(); 8];
        // SAFETY: the caller's contract.
        unsafe { self.decode(row, chunk, &mut narrow) };
        for (j, wide) in out.iter_mut().enumerate().take(Self::VECS / 2) {
            *wide =
                _mm512_insertf32x8::<1>(_mm512_castps256_ps512(narrow[2 * j]), narrow[2 * j + 1]);
        }
    }
    /// Decodes chunk `chunk` of row `row` into `out[..VECS]`, columns in order.
    ///
    /// # Safety
    ///
    /// The CPU supports AVX2 and FMA (callers are reached only through
    /// `Isa::Avx2`, which exists only after runtime detection). Chunk `chunk`
    /// of row `row` lies inside the matrix the decoder reads: `row < rows`,
    /// `(chunk + 1) · CHUNK ≤ cols`, and the data holds `rows × cols` values
    /// (as `check_problem` verified).
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]);
    /// `W[row, col]`, for the columns after the last whole chunk.
    fn scalar(&self, row: usize, col: usize) -> f32;
    /// The bytes holding row `row`'s values (its scales aside), for
    /// [`Ahead`]; empty past the matrix.
    fn row_bytes(&self, row: usize) -> &[u8];
}

/// f32 values of a decoded panel (96 KiB on the stack, L2-resident).
pub(super) const PANEL_FLOATS: usize = 24 * 1024;
/// Most rows decoded into one panel.
pub(super) const PANEL_MAX_ROWS: usize = 24;
/// Tokens of a panel microkernel tile.
pub(super) const NT: usize = 4;

/// The microkernel of the panel path: how a block of decoded rows lies in
/// the panel and the tile that multiplies `TILE_ROWS` of them by up to
/// `NT` tokens. `avx2.rs`'s `RowTiles` keeps each row in its own ymm
/// accumulators (every x86 tier); `avx512_panel.rs`'s `PairTiles` keeps two
/// rows per zmm (the AVX-512 build). Both sum each output as the module docs say (a lane
/// of one row's 8-lane accumulator per column), so which one runs never
/// changes a bit.
pub(super) trait PanelTiles {
    /// Block rows one tile covers; tile `i` covers block rows
    /// `i · TILE_ROWS ..`, at panel float `i · TILE_ROWS · whole`.
    const TILE_ROWS: usize;
    /// One tile's accumulators, parked between column blocks.
    type Accs: Copy;
    /// Rows per block for rows of `whole` decoded columns: as many as the
    /// panel takes, at most `PANEL_MAX_ROWS` (0 when not one tile's worth
    /// fits; the caller then takes another tile kind).
    fn block_rows(whole: usize) -> usize;
    /// Zeroed accumulators.
    ///
    /// # Safety
    ///
    /// The tile kind's features (the caller's entry point enables them).
    unsafe fn zero() -> Self::Accs;
    /// Decodes rows `block .. block + nb` (whole chunks) into the panel.
    ///
    /// # Safety
    ///
    /// The features; the rows lie in the matrix `dec` decodes; `panel`
    /// holds `nb · whole` writable floats rounded up to whole tiles, with
    /// `nb ≤ block_rows(whole)`.
    unsafe fn decode<D: Decoder>(dec: &D, panel: *mut f32, block: usize, nb: usize, whole: usize);
    /// The tile at `tile_panel` (its first `rows` block rows) × tokens `x`,
    /// `tn` of them (row stride `cols`), over columns `k0..k1`, into `acc`.
    ///
    /// # Safety
    ///
    /// The features; the tile's rows were decoded at `tile_panel`; `tn`
    /// tokens of `cols` floats at `x`; `k0 ≤ k1 ≤ whole`, multiples of 8.
    #[allow(clippy::too_many_arguments)]
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
    );
    /// The 8-lane accumulator of the tile's row `row` and token `t`.
    ///
    /// # Safety
    ///
    /// The features.
    unsafe fn output(acc: &Self::Accs, row: usize, t: usize) -> __m256;
}

/// Rows per panel block where the rows lie one after another, `whole`
/// decoded floats each (the AVX2 tiles' and the wide tiles' layout): as
/// many as the panel takes, at most `PANEL_MAX_ROWS`, in whole tiles of
/// `tile_rows` (0 when not one tile fits).
pub(super) fn row_block_rows(whole: usize, tile_rows: usize) -> usize {
    if whole == 0 {
        return 0;
    }
    (PANEL_FLOATS / whole).min(PANEL_MAX_ROWS) / tile_rows * tile_rows
}

/// Decodes rows `block .. block + nb` (whole chunks) into `panel`, one
/// after another, `whole` floats apart.
///
/// # Safety
///
/// AVX2 and FMA (the caller's entry point enables them: this is inlined
/// into it); the rows' chunks lie inside the matrix `dec` decodes;
/// `panel` is 32-byte aligned and holds `nb · whole` writable floats;
/// `whole` is a multiple of 8.
#[inline(always)]
pub(super) unsafe fn decode_rows<D: Decoder>(
    dec: &D,
    panel: *mut f32,
    block: usize,
    nb: usize,
    whole: usize,
) {
    // SAFETY: AVX is present (the contract).
    let mut w = [unsafe { _mm256_setzero_ps() }; 8];
    for r in 0..nb {
        for ch in 0..whole / D::CHUNK {
            // SAFETY: the chunk is inside the matrix; row r's floats
            // r · whole .. (r + 1) · whole are inside the panel, and
            // 32-byte aligned (whole is a multiple of 8).
            unsafe {
                dec.decode(block + r, ch, &mut w);
                let dst = panel.add(r * whole + ch * D::CHUNK);
                for (v, wv) in w.iter().enumerate().take(D::VECS) {
                    _mm256_store_ps(dst.add(8 * v), *wv);
                }
            }
        }
    }
}

/// Runs `tile.run::<R, T>(acc, k0, k1, …)` for `rows` (1 to 3) rows or row
/// pairs and `tn` (1 to `NT`) tokens, the const sizes chosen by match (a
/// microkernel's registers are fixed at compile time).
macro_rules! run_tile_sized {
    ($tile:expr, $rows:expr, $tn:expr, $acc:expr, $k0:expr, $k1:expr $(, $more:expr)*) => {
        match ($rows, $tn) {
            (3, 4) => $tile.run::<3, 4>($acc, $k0, $k1 $(, $more)*),
            (3, 3) => $tile.run::<3, 3>($acc, $k0, $k1 $(, $more)*),
            (3, 2) => $tile.run::<3, 2>($acc, $k0, $k1 $(, $more)*),
            (3, _) => $tile.run::<3, 1>($acc, $k0, $k1 $(, $more)*),
            (2, 4) => $tile.run::<2, 4>($acc, $k0, $k1 $(, $more)*),
            (2, 3) => $tile.run::<2, 3>($acc, $k0, $k1 $(, $more)*),
            (2, 2) => $tile.run::<2, 2>($acc, $k0, $k1 $(, $more)*),
            (2, _) => $tile.run::<2, 1>($acc, $k0, $k1 $(, $more)*),
            (_, 4) => $tile.run::<1, 4>($acc, $k0, $k1 $(, $more)*),
            (_, 3) => $tile.run::<1, 3>($acc, $k0, $k1 $(, $more)*),
            (_, 2) => $tile.run::<1, 2>($acc, $k0, $k1 $(, $more)*),
            (_, _) => $tile.run::<1, 1>($acc, $k0, $k1 $(, $more)*),
        }
    };
}
pub(super) use run_tile_sized;

/// Row `row`'s `len` bytes of a row-major matrix in `bytes` (empty past it).
pub(super) fn row_slice(bytes: &[u8], row: usize, len: usize) -> &[u8] {
    row.checked_mul(len)
        .and_then(|start| bytes.get(start..start.checked_add(len)?))
        .unwrap_or(&[])
}

/// Brings the rows of the panel's next block towards L2 while the current
/// block computes, a few lines after each microkernel tile: a block's rows
/// are separate streams a row stride apart (4 KiB for a 2048-column BF16
/// row, one page each), which the hardware prefetchers pick up late, and
/// with the few tokens an expert gets in a prefill (16 of 512 on a
/// 256-expert, top-8 model) the decode of each block otherwise waits on
/// memory. A hint only: it never changes a value.
pub(super) struct Ahead {
    rows: Range<usize>,
    /// Byte offset inside `rows.start` of the next line to ask for.
    at: usize,
    /// Lines asked for after each tile.
    per_step: usize,
}

impl Ahead {
    /// Rows `rows` spread over `steps` calls of [`Ahead::step`].
    pub(super) fn new<D: Decoder>(dec: &D, rows: Range<usize>, steps: usize) -> Ahead {
        let lines = rows.len() * dec.row_bytes(rows.start).len().div_ceil(LINE);
        Ahead {
            rows,
            at: 0,
            per_step: lines.div_ceil(steps.max(1)),
        }
    }

    /// Asks for the next `per_step` lines.
    #[inline(always)]
    pub(super) fn step<D: Decoder>(&mut self, dec: &D) {
        let mut left = self.per_step;
        while left > 0 && !self.rows.is_empty() {
            let row = dec.row_bytes(self.rows.start);
            match row.get(self.at..) {
                Some(rest) if !rest.is_empty() => {
                    // SAFETY: a prefetch reads nothing architecturally and
                    // never faults; the address lies inside the row.
                    unsafe { _mm_prefetch::<_MM_HINT_T1>(rest.as_ptr() as *const i8) };
                    self.at += LINE;
                    left -= 1;
                }
                _ => {
                    self.rows.start += 1;
                    self.at = 0;
                }
            }
        }
    }
}
