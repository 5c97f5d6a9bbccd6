//! AMX-BF16 matmul kernel for BF16 weights: the tier `Isa::Amx` (every
//! other format runs as on `Isa::Avx512`).
//!
//! **The numerics** are `avx512_bf16.rs`'s: activations rounded to bf16
//! (nearest, ties to even), products of two bf16 exact in f32. A
//! `tdpbf16ps` multiplies a 16-row × 32-column tile of the weights, read in
//! place from the mapped checkpoint (row stride `2 · cols` bytes), by a
//! 32-column × 16-token tile of activations, adding into a 16 × 16 f32 tile:
//! 8192 (16 × 16 × 32) multiply-adds per instruction, where `vdpbf16ps`
//! does 32.
//!
//! **One summation order** (the prefix cache's bitwise promise): each output
//! is its own accumulator element of a C tile, which adds the 32-column
//! steps in ascending order (inside a step the hardware's own pairwise
//! order); no output's value depends on the others in its tile, so a
//! token's outputs do not depend on how many tokens or rows share its tiles
//! (the tile shapes are configured to the rows and tokens present, never
//! padded with other data). The columns after the last whole step are then
//! added one by one, `s + w · bf16(x)`, as on `Avx512Bf16`. One path serves
//! every token count.
//!
//! The B tile wants each token's column pairs down a column: the
//! activations of up to `BLOCK_TOKENS` tokens are rounded and packed into
//! that layout once per work unit (a per-thread buffer of
//! `2 · BLOCK_TOKENS · cols` bytes), then every 16-row block of the unit's
//! weights runs over every 16-token tile of them. The tile
//! instructions are written as `asm!` (their intrinsics are not stable):
//! one block configures the tiles, runs every step of one output tile (or
//! of a 2 × 2 block of them), stores it and releases the tiles, so no tile
//! state outlives it.
//!
//! Every `unsafe fn` here requires what `Isa::Amx` detects: AVX2, FMA,
//! AVX-512F/BW/VL, AVX-512 BF16, AMX-TILE and AMX-BF16, with the kernel's
//! permission to use the tile data granted (`isa.rs`). Those that take a
//! `job` also require the job contract of `avx2.rs`.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use crate::backend::cpu::kernels::job::Job;
use crate::formats::{f32_to_bf16, read_bf16};

/// Columns per step: one 64-byte row of a weight tile.
const STEP: usize = 32;
/// Weight rows per A tile, and column pairs (rows) per B tile.
const TILE_ROWS: usize = 16;
/// Tokens per B and C tile.
const TILE_TOKENS: usize = 16;
/// 32-bit elements (column pairs of 16 tokens × 16 pairs) of one packed step.
const PACKED_STEP: usize = TILE_ROWS * TILE_TOKENS;
/// Tokens packed at a time: their activations (`2 · cols` bytes each, 1
/// MiB at 2048 columns) stay in L2 while every row block passes over them.
const BLOCK_TOKENS: usize = 256;

thread_local! {
    /// The packed activations of one block of tokens: `steps × 256` u32 per
    /// 16 tokens, kept only for its allocation (it grows to
    /// `2 · BLOCK_TOKENS · cols` bytes for the widest problem seen).
    static PACKED: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// The tile configuration `ldtilecfg` reads (palette 1): tile 0 the
/// outputs, 1 the weights, 2 the activations.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

// The layout `ldtilecfg` reads: 64 bytes, row widths from byte 16, row
// counts from byte 48.
const _: () = assert!(
    std::mem::size_of::<TileConfig>() == 64
        && std::mem::offset_of!(TileConfig, bytes_per_row) == 16
        && std::mem::offset_of!(TileConfig, rows) == 48
);

impl TileConfig {
    /// The 2 × 2 blocks' tiles, all full: C tiles 0-3 (row tile `i / 2`
    /// against token tile `i % 2`), weights 4-5, activations 6-7.
    fn two_by_two() -> TileConfig {
        let mut config = TileConfig::new(TILE_ROWS, TILE_TOKENS);
        config.bytes_per_row[..8].fill(64);
        config.rows[..8].fill(TILE_ROWS as u8);
        config
    }

    /// `rows` weight rows against `tokens` tokens (each 1..=16).
    fn new(rows: usize, tokens: usize) -> TileConfig {
        let mut config = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes_per_row: [0; 16],
            rows: [0; 16],
        };
        let token_bytes = (4 * tokens) as u16;
        // C: rows × tokens f32; A: rows × 32 bf16; B: 16 pairs × tokens.
        config.bytes_per_row[..3].copy_from_slice(&[token_bytes, 64, token_bytes]);
        config.rows[..3].copy_from_slice(&[rows as u8, rows as u8, TILE_ROWS as u8]);
        config
    }
}

/// Rows `rows` of a BF16 job.
///
/// # Safety
///
/// The module's features and permission; `bytes` is the job's BF16 weight
/// (`rows × cols` values) and the job contract holds for `job` and `rows`.
pub(super) unsafe fn run_rows(bytes: &[u8], job: &Job, rows: Range<usize>) {
    PACKED.with(|cell| match cell.try_borrow_mut() {
        // SAFETY: (both arms) this function's contract.
        Ok(mut packed) => unsafe { run_rows_with(bytes, job, rows, &mut packed) },
        // Re-entered on this thread (a rayon worker that stole another
        // matmul while waiting): a buffer for this call.
        // SAFETY: as above.
        Err(_) => unsafe { run_rows_with(bytes, job, rows, &mut Vec::new()) },
    })
}

/// [`run_rows`] with its packing buffer.
///
/// # Safety
///
/// As [`run_rows`].
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn run_rows_with(bytes: &[u8], job: &Job, rows: Range<usize>, packed: &mut Vec<u32>) {
    let cols = job.weight.cols;
    let steps = cols / STEP;
    let mut t0 = 0;
    while t0 < job.tokens {
        let block_tokens = (job.tokens - t0).min(BLOCK_TOKENS);
        let tiles = block_tokens.div_ceil(TILE_TOKENS);
        packed.resize(tiles * steps * PACKED_STEP, 0);
        for tile in 0..tiles {
            let first = t0 + tile * TILE_TOKENS;
            let tokens = (t0 + block_tokens - first).min(TILE_TOKENS);
            // SAFETY: tokens first..first + tokens exist (`x` holds their
            // rows); the tile's share of `packed` holds `steps` steps.
            unsafe {
                pack(
                    job.x[first * cols..].as_ptr(),
                    cols,
                    tokens,
                    &mut packed[tile * steps * PACKED_STEP..],
                )
            };
        }
        let block = TokenBlock {
            bytes,
            job,
            steps,
            packed,
            t0,
            tokens: block_tokens,
        };
        // Each block of weight rows (L1/L2-resident) against every token
        // tile: the weights stream from memory once per `BLOCK_TOKENS`
        // tokens, the packed activations from L2. Pairs of full row tiles
        // against pairs of full token tiles share their tile loads (2 × 2);
        // the rest goes one tile at a time, with the same sums.
        let full_tiles = block_tokens / TILE_TOKENS;
        let mut r0 = rows.start;
        // SAFETY: (every call below) the rows are inside the unit's, the
        // tiles inside the block.
        unsafe {
            while rows.end - r0 >= 2 * TILE_ROWS {
                let mut tile = 0;
                while tile + 2 <= full_tiles {
                    block.two_by_two(r0, tile);
                    tile += 2;
                }
                for tile in tile..tiles {
                    block.one(r0, TILE_ROWS, tile);
                    block.one(r0 + TILE_ROWS, TILE_ROWS, tile);
                }
                r0 += 2 * TILE_ROWS;
            }
            while r0 < rows.end {
                let rn = (rows.end - r0).min(TILE_ROWS);
                for tile in 0..tiles {
                    block.one(r0, rn, tile);
                }
                r0 += rn;
            }
        }
        t0 += block_tokens;
    }
}

/// One packed block of tokens and what its output tiles read.
struct TokenBlock<'a> {
    bytes: &'a [u8],
    job: &'a Job<'a>,
    steps: usize,
    packed: &'a [u32],
    /// The block's first token and its token count.
    t0: usize,
    tokens: usize,
}

impl TokenBlock<'_> {
    /// Token tile `tile`'s first token and token count.
    fn tile_tokens(&self, tile: usize) -> (usize, usize) {
        let first = self.t0 + tile * TILE_TOKENS;
        (first, (self.t0 + self.tokens - first).min(TILE_TOKENS))
    }

    /// The packed steps of token tile `tile`.
    fn packed_tile(&self, tile: usize) -> *const u32 {
        self.packed[tile * self.steps * PACKED_STEP..].as_ptr()
    }

    /// The first weight row `r0`'s bytes.
    fn weight_rows(&self, r0: usize) -> *const u8 {
        self.bytes[r0 * self.job.weight.cols * 2..].as_ptr()
    }

    /// Rows `r0..r0 + rn` (at most 16) against token tile `tile`.
    ///
    /// # Safety
    ///
    /// The module's features and permission; the rows lie in the unit's,
    /// `tile` in the block.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn one(&self, r0: usize, rn: usize, tile: usize) {
        let (_, tokens) = self.tile_tokens(tile);
        let mut c = OutputTile::zeros();
        if self.steps > 0 {
            // SAFETY: the rows' whole steps are inside the weight (row
            // stride 2 · cols bytes); the tile's packed steps are in
            // `packed`; `c` holds 16 × 16 f32.
            unsafe {
                output_tile(
                    &TileConfig::new(rn, tokens),
                    self.weight_rows(r0),
                    self.job.weight.cols * 2,
                    self.packed_tile(tile),
                    self.steps,
                    &mut c,
                )
            };
        }
        // SAFETY: the rows are the unit's.
        unsafe { self.write(&c, r0, rn, tile) };
    }

    /// Rows `r0..r0 + 32` against the full token tiles `tile`, `tile + 1`.
    ///
    /// # Safety
    ///
    /// As [`TokenBlock::one`], for both row tiles and both token tiles
    /// (full: 16 rows and 16 tokens each).
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn two_by_two(&self, r0: usize, tile: usize) {
        let mut c = [
            OutputTile::zeros(),
            OutputTile::zeros(),
            OutputTile::zeros(),
            OutputTile::zeros(),
        ];
        if self.steps > 0 {
            // SAFETY: as in `one`, for 32 rows and two token tiles.
            unsafe {
                output_tiles_2x2(
                    self.weight_rows(r0),
                    self.job.weight.cols * 2,
                    [self.packed_tile(tile), self.packed_tile(tile + 1)],
                    self.steps,
                    &mut c,
                )
            };
        }
        for (i, c) in c.iter().enumerate() {
            // SAFETY: the rows are the unit's; C tile i is row tile i / 2
            // against token tile i % 2.
            unsafe { self.write(c, r0 + i / 2 * TILE_ROWS, TILE_ROWS, tile + i % 2) };
        }
    }

    /// Adds the columns after the last whole step to C tile `c` (rows
    /// `r0..r0 + rn` against token tile `tile`) and writes the outputs.
    ///
    /// # Safety
    ///
    /// The rows are the unit's (no other thread writes their outputs);
    /// `tile` lies in the block.
    unsafe fn write(&self, c: &OutputTile, r0: usize, rn: usize, tile: usize) {
        let (first, tokens) = self.tile_tokens(tile);
        let (cols, n_rows) = (self.job.weight.cols, self.job.weight.rows);
        for (r, c_row) in c.0.iter().enumerate().take(rn) {
            let row = r0 + r;
            for (t, &sum) in c_row.iter().enumerate().take(tokens) {
                let x = &self.job.x[(first + t) * cols..][..cols];
                let mut sum = sum;
                for (col, &xc) in x.iter().enumerate().skip(self.steps * STEP) {
                    let xc = f32::from_bits(u32::from(f32_to_bf16(xc)) << 16);
                    sum += read_bf16(self.bytes, row * cols + col) * xc;
                }
                // SAFETY: token first + t exists; the unit owns this row.
                unsafe { *self.job.out.get().add((first + t) * n_rows + row) = sum };
            }
        }
    }
}

/// A C tile as stored: 16 rows of 16 f32 (64-byte rows).
#[repr(C, align(64))]
struct OutputTile([[f32; TILE_TOKENS]; TILE_ROWS]);

// `output_tiles_2x2` stores its four tiles 1 KiB apart.
const _: () = assert!(std::mem::size_of::<OutputTile>() == 1024);

impl OutputTile {
    fn zeros() -> OutputTile {
        OutputTile([[0.0; TILE_TOKENS]; TILE_ROWS])
    }
}

/// Rounds the whole steps of `tokens` token rows from `x` to bf16 and
/// packs them as B tiles: step `s`, pair `p` (columns `32s + 2p`, `+ 1`),
/// token `t` at `packed[s · 256 + p · 16 + t]`, the even column in the low
/// half. Token slots past `tokens` are left as they were (the tiles are
/// configured not to read them).
///
/// # Safety
///
/// The module's features; `x` holds `tokens × cols` readable f32 and
/// `packed` at least `(cols / 32) · 256` values.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pack(x: *const f32, cols: usize, tokens: usize, packed: &mut [u32]) {
    let steps = cols / STEP;
    debug_assert!(packed.len() >= steps * PACKED_STEP && tokens <= TILE_TOKENS);
    // Pair p of a step goes 16 elements (one B row) after pair p - 1.
    let down_a_column = _mm512_setr_epi32(
        0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240,
    );
    for t in 0..tokens {
        for s in 0..steps {
            // SAFETY: 32 f32 of token t's row at step s (inside `cols`).
            let pairs = unsafe { super::avx512_bf16::round_chunk(x.add(t * cols + s * STEP)) };
            // SAFETY: the 16 targets s · 256 + 16p + t lie in `packed`.
            unsafe {
                _mm512_i32scatter_epi32::<4>(
                    packed.as_mut_ptr().add(s * PACKED_STEP + t) as *mut i32,
                    down_a_column,
                    std::mem::transmute::<__m512bh, __m512i>(pairs),
                )
            };
        }
    }
}

/// One C tile over `steps` whole steps: `rows × tokens` (the config's)
/// outputs of the weight rows at `weights` (row stride `stride` bytes)
/// against the packed activations, stored into `out`.
///
/// # Safety
///
/// The module's features and permission; `weights` holds the config's rows
/// of `steps · 64` readable bytes at stride `stride`; `packed` holds `steps`
/// packed steps (`steps · 1 KiB`); `steps ≥ 1`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn output_tile(
    config: &TileConfig,
    weights: *const u8,
    stride: usize,
    packed: *const u32,
    steps: usize,
    out: &mut OutputTile,
) {
    // SAFETY: the tiles read `config`'s rows from `weights` (stride
    // `stride`) and 16 rows of 64 bytes per step from `packed`, inside
    // what the contract makes readable, and write `config`'s rows of `out`
    // (64-byte rows); the block releases the tiles before it ends.
    unsafe {
        asm!(
            "ldtilecfg [{config}]",
            "tilezero tmm0",
            "2:",
            "tileloadd tmm1, [{weights} + {stride} * 1]",
            "tileloadd tmm2, [{packed} + {b_stride} * 1]",
            "tdpbf16ps tmm0, tmm1, tmm2",
            "add {weights}, 64",
            "add {packed}, 1024",
            "dec {steps}",
            "jnz 2b",
            "tilestored [{out} + {b_stride} * 1], tmm0",
            "tilerelease",
            config = in(reg) config as *const TileConfig,
            weights = inout(reg) weights => _,
            stride = in(reg) stride,
            packed = inout(reg) packed => _,
            b_stride = in(reg) 64usize,
            steps = inout(reg) steps => _,
            out = in(reg) out.0.as_mut_ptr(),
            options(nostack),
        );
    }
}

/// Four C tiles over `steps` whole steps: the 32 weight rows at `weights`
/// (row stride `stride` bytes; row tile 0 then 1) against two full packed
/// token tiles, stored into `out` (C tile `i`: row tile `i / 2` against
/// token tile `i % 2`). Each output sums as in [`output_tile`].
///
/// # Safety
///
/// The module's features and permission; `weights` holds 32 rows of
/// `steps · 64` readable bytes at stride `stride`; each of `packed` holds
/// `steps` packed steps of 16 tokens; `steps ≥ 1`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn output_tiles_2x2(
    weights: *const u8,
    stride: usize,
    packed: [*const u32; 2],
    steps: usize,
    out: &mut [OutputTile; 4],
) {
    let config = TileConfig::two_by_two();
    // SAFETY: the tiles read 16 rows at `weights` and 16 rows 16 strides
    // further, and 16 rows of 64 bytes per step from each packed tile,
    // inside what the contract makes readable; they write the four output
    // tiles (64-byte rows); the block releases the tiles before it ends.
    unsafe {
        asm!(
            "ldtilecfg [{config}]",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{w0} + {stride} * 1]",
            "tileloadd tmm5, [{w1} + {stride} * 1]",
            "tileloadd tmm6, [{p0} + {b_stride} * 1]",
            "tileloadd tmm7, [{p1} + {b_stride} * 1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {w0}, 64",
            "add {w1}, 64",
            "add {p0}, 1024",
            "add {p1}, 1024",
            "dec {steps}",
            "jnz 2b",
            "tilestored [{c} + {b_stride} * 1], tmm0",
            "tilestored [{c} + {b_stride} * 1 + 1024], tmm1",
            "tilestored [{c} + {b_stride} * 1 + 2048], tmm2",
            "tilestored [{c} + {b_stride} * 1 + 3072], tmm3",
            "tilerelease",
            config = in(reg) &config as *const TileConfig,
            w0 = inout(reg) weights => _,
            w1 = inout(reg) weights.wrapping_add(TILE_ROWS * stride) => _,
            stride = in(reg) stride,
            p0 = inout(reg) packed[0] => _,
            p1 = inout(reg) packed[1] => _,
            b_stride = in(reg) 64usize,
            steps = inout(reg) steps => _,
            // The four tiles are 1 KiB apart (`OutputTile` is 16 × 64 bytes).
            c = in(reg) out.as_mut_ptr(),
            options(nostack),
        );
    }
}
