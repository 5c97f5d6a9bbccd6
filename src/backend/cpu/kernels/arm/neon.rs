//! aarch64 NEON matmul kernels (the Spark's Grace CPU).
//!
//! Deliberately simple: every problem runs as a GEMV over token groups of at
//! most 4, weights decoded in natural column order (NEON's zips and table
//! lookups make that cheap), so x is read as it is.
//!
//! One summation order for every output, whatever the token count, group or
//! row block (see the kernels' module docs): two accumulators, vector `v`
//! of each chunk into accumulator `v % 2` by fused multiply-add, chunks in
//! order; then `acc0 + acc1`, the lanes summed by `vaddvq_f32`, and the
//! columns past the last whole chunk added one by one.
//!
//! Every `unsafe fn` here requires NEON, part of the aarch64 baseline (the
//! module is entered only through `Isa::Neon`). Those that take a `job` also
//! require **the job contract**: the job passed `check_problem` (its weight
//! data holds `rows × cols` values of its format, `x` holds `tokens × cols`
//! f32 and `out` is valid for writes of `tokens × rows` f32), the rows they
//! are given lie inside `0..rows`, and no other thread writes those rows'
//! outputs (`out[t · rows + r]`) meanwhile: each work unit owns its rows.

use std::arch::aarch64::*;
use std::ops::Range;

use super::tiles::for_each_tile;
use crate::backend::cpu::kernels::job::Job;
use crate::checkpoint::linear::WeightData;
use crate::formats::{E2M1, E4M3, NVFP4_GROUP, read_bf16, read_f32, read_nibble};

/// bf16 low / high byte of each E2M1 code (see x86/avx2.rs for the derivation).
static LOW_BYTES: [u8; 16] = [
    0, 0, 0x80, 0xC0, 0, 0x40, 0x80, 0xC0, 0, 0, 0x80, 0xC0, 0, 0x40, 0x80, 0xC0,
];
static HIGH_BYTES: [u8; 16] = [
    0, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0,
];

/// Rows `rows` of a job in F32, BF16 or NVFP4.
pub(super) fn run_rows(job: &Job, rows: Range<usize>) {
    let w = &job.weight;
    let cols = w.cols;
    // SAFETY: (all arms) shapes were checked by `check_problem`; NEON is part
    // of the aarch64 baseline.
    unsafe {
        match w.data {
            WeightData::F32(bytes) => gemv_rows(&F32Dec { bytes, cols }, job, rows),
            WeightData::Bf16(bytes) => gemv_rows(&Bf16Dec { bytes, cols }, job, rows),
            WeightData::Nvfp4 {
                packed,
                scales,
                global,
            } => {
                let mut table = [0.0f32; 256];
                for (t, &s) in table.iter_mut().zip(E4M3.iter()) {
                    *t = s * global;
                }
                let dec = Fp4Dec {
                    codes: packed,
                    scales,
                    cols,
                    block: NVFP4_GROUP,
                    table: &table,
                };
                gemv_rows(&dec, job, rows)
            }
            WeightData::Mxfp4 { .. } => unreachable!("arm::run_rows sends MXFP4 to neon_mxfp4"),
            WeightData::Fp8 { .. } | WeightData::Int4 { .. } => {
                unreachable!("matmul sends FP8 and INT4 on NEON to the portable kernel")
            }
        }
    }
}

/// Turns weight chunks into f32x4 vectors in natural order.
trait Decoder {
    /// Values per chunk (a multiple of 4).
    const CHUNK: usize;
    const VECS: usize = Self::CHUNK / 4;
    /// Decodes chunk `chunk` of row `row` into `out[..VECS]`, columns in order.
    ///
    /// # Safety
    ///
    /// The CPU supports NEON (part of the aarch64 baseline; callers are reached
    /// only through `Isa::Neon`). Chunk `chunk` of row `row` lies inside the
    /// matrix the decoder reads: `row < rows`, `(chunk + 1) · CHUNK ≤ cols`,
    /// and the data holds `rows × cols` values (as `check_problem` verified).
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [float32x4_t; 8]);
    fn scalar(&self, row: usize, col: usize) -> f32;
}

struct F32Dec<'a> {
    bytes: &'a [u8],
    cols: usize,
}

impl Decoder for F32Dec<'_> {
    const CHUNK: usize = 4;
    /// [`Decoder::decode`] for F32: one load of 4 values.
    ///
    /// # Safety
    ///
    /// As [`Decoder::decode`]: NEON, and the chunk inside the matrix, i.e. 16
    /// readable bytes of `bytes` from byte `(row · cols + 4 · chunk) · 4`.
    #[target_feature(enable = "neon")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [float32x4_t; 8]) {
        let offset = (row * self.cols + chunk * 4) * 4;
        // SAFETY: in bounds per the contract; byte loads need no alignment.
        out[0] = vreinterpretq_f32_u8(unsafe { vld1q_u8(self.bytes.as_ptr().add(offset)) });
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        read_f32(self.bytes, row * self.cols + col)
    }
}

struct Bf16Dec<'a> {
    bytes: &'a [u8],
    cols: usize,
}

impl Decoder for Bf16Dec<'_> {
    const CHUNK: usize = 8;
    /// [`Decoder::decode`] for BF16: one load of 8 values, widened.
    ///
    /// # Safety
    ///
    /// As [`Decoder::decode`]: NEON, and the chunk inside the matrix, i.e. 16
    /// readable bytes of `bytes` from byte `(row · cols + 8 · chunk) · 2`.
    #[target_feature(enable = "neon")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [float32x4_t; 8]) {
        let offset = (row * self.cols + chunk * 8) * 2;
        // SAFETY: in bounds per the contract; byte loads need no alignment.
        let v = vreinterpretq_u16_u8(unsafe { vld1q_u8(self.bytes.as_ptr().add(offset)) });
        out[0] = vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(v)));
        out[1] = vreinterpretq_f32_u32(vshll_high_n_u16::<16>(v));
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        read_bf16(self.bytes, row * self.cols + col)
    }
}

/// NVFP4 (16-element blocks, e4m3 scale × global; MXFP4 has its integer
/// kernel in `neon_mxfp4`): `table` maps a scale byte to its f32 factor.
struct Fp4Dec<'a> {
    codes: &'a [u8],
    scales: &'a [u8],
    cols: usize,
    block: usize,
    table: &'a [f32; 256],
}

impl Decoder for Fp4Dec<'_> {
    const CHUNK: usize = 32;
    /// [`Decoder::decode`] for NVFP4: 32 codes, then their block scales.
    ///
    /// # Safety
    ///
    /// As [`Decoder::decode`]: NEON, and the chunk inside the matrix, i.e. 16
    /// readable bytes of `codes` from byte `(row · cols + 32 · chunk) / 2` (the
    /// scales are read bounds-checked).
    #[target_feature(enable = "neon")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [float32x4_t; 8]) {
        let first = row * self.cols + chunk * 32;
        // SAFETY: 16 bytes of codes in bounds per the contract; static tables.
        let (bytes, low_bytes, high_bytes) = unsafe {
            (
                vld1q_u8(self.codes.as_ptr().add(first / 2)),
                vld1q_u8(LOW_BYTES.as_ptr()),
                vld1q_u8(HIGH_BYTES.as_ptr()),
            )
        };
        let lo = vandq_u8(bytes, vdupq_n_u8(0x0F));
        let hi = vshrq_n_u8::<4>(bytes);
        // Zip low/high nibbles back into element order: 0-15, then 16-31.
        for (half, codes) in [vzip1q_u8(lo, hi), vzip2q_u8(lo, hi)]
            .into_iter()
            .enumerate()
        {
            let l = vqtbl1q_u8(low_bytes, codes);
            let h = vqtbl1q_u8(high_bytes, codes);
            let first8 = vreinterpretq_u16_u8(vzip1q_u8(l, h));
            let last8 = vreinterpretq_u16_u8(vzip2q_u8(l, h));
            out[4 * half] = vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(first8)));
            out[4 * half + 1] = vreinterpretq_f32_u32(vshll_high_n_u16::<16>(first8));
            out[4 * half + 2] = vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(last8)));
            out[4 * half + 3] = vreinterpretq_f32_u32(vshll_high_n_u16::<16>(last8));
        }
        for (v, o) in out.iter_mut().enumerate() {
            let scale = self.table[self.scales[(first + 4 * v) / self.block] as usize];
            *o = vmulq_n_f32(*o, scale);
        }
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        let index = row * self.cols + col;
        E2M1[read_nibble(self.codes, index)] * self.table[self.scales[index / self.block] as usize]
    }
}

/// GEMV over the unit's rows, in row blocks × token groups (see
/// [`for_each_tile`]).
///
/// # Safety
///
/// The CPU supports NEON (part of the aarch64 baseline; callers are reached
/// only through `Isa::Neon`). `dec` decodes `job.weight` (its data and its
/// `cols`), and the job contract of the module docs holds for `job` and `rows`.
#[target_feature(enable = "neon")]
unsafe fn gemv_rows<D: Decoder>(dec: &D, job: &Job, rows: Range<usize>) {
    let (cols, n_rows) = (job.weight.cols, job.weight.rows);
    for_each_tile(rows, job.tokens, |rows, t0, tn| {
        // SAFETY: token group t0..t0+tn is inside x and out; rows inside W.
        unsafe {
            let (x, out) = (job.x.as_ptr().add(t0 * cols), job.out.0.add(t0 * n_rows));
            // The accumulator count is part of the summation order: the
            // same 2 for every group size.
            match tn {
                1 => gemv_block_rows::<D, 4, 1>(dec, rows, cols, x, out, n_rows),
                2 => gemv_block_rows::<D, 4, 2>(dec, rows, cols, x, out, n_rows),
                3 => gemv_block_rows::<D, 2, 3>(dec, rows, cols, x, out, n_rows),
                _ => gemv_block_rows::<D, 2, 4>(dec, rows, cols, x, out, n_rows),
            }
        }
    });
}

/// Rows `rows` × `T` tokens, `R` rows at a time, then the leftover rows one by
/// one.
///
/// # Safety
///
/// The CPU supports NEON (part of the aarch64 baseline; callers are reached
/// only through `Isa::Neon`). Every row of `rows` is inside the matrix `dec`
/// reads, whose columns are `cols`; `x` points to `T` token rows of `cols`
/// readable f32 (stride `cols`); `out` is valid for writes at
/// `t · out_stride + r` for `t < T` and `r` in `rows`, and no other thread
/// writes those outputs meanwhile.
#[target_feature(enable = "neon")]
unsafe fn gemv_block_rows<D: Decoder, const R: usize, const T: usize>(
    dec: &D,
    rows: Range<usize>,
    cols: usize,
    x: *const f32,
    out: *mut f32,
    out_stride: usize,
) {
    let mut r = rows.start;
    while r + R <= rows.end {
        // SAFETY: rows r..r + R are inside the matrix, x/out cover T tokens.
        unsafe { gemv::<D, R, T>(dec, r, cols, x, out, out_stride) };
        r += R;
    }
    while r < rows.end {
        // SAFETY: row r is inside the matrix, x/out cover T tokens.
        unsafe { gemv::<D, 1, T>(dec, r, cols, x, out, out_stride) };
        r += 1;
    }
}

/// Accumulators per output (part of the summation order).
const A: usize = 2;

/// R rows × T tokens with A accumulators per pair; x is `[T][cols]`.
///
/// # Safety
///
/// The CPU supports NEON (part of the aarch64 baseline; callers are reached
/// only through `Isa::Neon`). Rows `row0..row0 + R` are inside the matrix `dec`
/// reads, whose columns are `cols`; `x` points to `T` token rows of `cols`
/// readable f32 (stride `cols`); `out` is valid for writes at
/// `t · out_stride + row0 + r` for `t < T`, `r < R`, and no other thread writes
/// those outputs meanwhile.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn gemv<D: Decoder, const R: usize, const T: usize>(
    dec: &D,
    row0: usize,
    cols: usize,
    x: *const f32,
    out: *mut f32,
    out_stride: usize,
) {
    let chunks = cols / D::CHUNK;
    let mut acc = [[[vdupq_n_f32(0.0); A]; T]; R];
    let mut w = [vdupq_n_f32(0.0); 8];
    for ch in 0..chunks {
        let xo = ch * D::CHUNK;
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: chunk ch of row row0 + r is inside the matrix.
            unsafe { dec.decode(row0 + r, ch, &mut w) };
            for (t, acc_rt) in acc_r.iter_mut().enumerate() {
                for (v, wv) in w.iter().enumerate().take(D::VECS) {
                    // SAFETY: x holds T rows of cols values.
                    let xv = unsafe { vld1q_f32(x.add(t * cols + xo + 4 * v)) };
                    acc_rt[v % A] = vfmaq_f32(acc_rt[v % A], *wv, xv);
                }
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (t, acc_rt) in acc_r.iter().enumerate() {
            let mut v = acc_rt[0];
            for a in acc_rt.iter().skip(1) {
                v = vaddq_f32(v, *a);
            }
            let mut sum = vaddvq_f32(v);
            for c in chunks * D::CHUNK..cols {
                // SAFETY: c < cols, t < T.
                sum += dec.scalar(row0 + r, c) * unsafe { *x.add(t * cols + c) };
            }
            // SAFETY: the caller owns this output.
            unsafe { *out.add(t * out_stride + row0 + r) = sum };
        }
    }
}
