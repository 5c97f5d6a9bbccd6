//! aarch64 NEON MXFP4 kernel: FP4 codes times int16 activations, as
//! integers (activations quantized by [`crate::backend::cpu::kernels::quantize`];
//! see `x86/avx2_fp4.rs` for why).
//!
//! A code becomes an int16 worth 512 × its E2M1 value with a table lookup
//! and a shift or a mask (the same decode as AVX2, 16 bytes at a time), and
//! `smlal` multiplies and accumulates 4 of them per instruction.
//!
//! One summation order for every output (its own, as every instruction set
//! has): block by block in ascending order, the block's exact integer sums
//! (4 lanes) times `(E8M0_b / 512) · d_b` go into one 4-lane f32
//! accumulator by fused multiply-add; then the lanes are summed by
//! `vaddvq_f32`. Tokens are taken in groups of at most 4, rows in blocks.
//!
//! Every `unsafe fn` here requires NEON, part of the aarch64 baseline (the
//! module is entered only through `Isa::Neon`). Those that take a `job` also
//! require **the job contract** (as in `neon.rs`): the job passed
//! `check_problem` (its MXFP4 data holds `rows × cols` codes and
//! `rows × cols / 32` scales, `x` holds `tokens × cols` f32 and `out` is
//! valid for writes of `tokens × rows` f32), the rows they are given lie
//! inside `0..rows`, and no other thread writes those rows' outputs
//! (`out[t · rows + r]`) meanwhile: each work unit owns its rows.

use std::arch::aarch64::*;
use std::ops::Range;

use super::tiles::for_each_tile;
use crate::backend::cpu::kernels::job::Job;
use crate::backend::cpu::kernels::quantize::{
    BLOCK, DOUBLED_E2M1, QuantizedX, code_position, code_scale, scale_position,
};

/// Runs rows `rows` of an MXFP4 problem whose activations are `q`.
///
/// # Safety
///
/// The CPU supports NEON (part of the aarch64 baseline; callers are reached
/// only through `Isa::Neon`). `codes` and `scales` are `job.weight`'s MXFP4
/// data, `q` is `job.x` quantized (`q.cols == job.weight.cols`, all
/// `job.tokens` tokens), and the job contract of the module docs holds for
/// `job` and `rows`.
#[target_feature(enable = "neon")]
pub(super) unsafe fn run_rows(
    codes: &[u8],
    scales: &[u8],
    q: &QuantizedX,
    job: &Job,
    rows: Range<usize>,
) {
    let w = Weights {
        codes,
        scales,
        blocks: job.weight.cols / BLOCK,
    };
    for_each_tile(rows, job.tokens, |block, t0, tn| {
        // Rows side by side: 4 for 1-2 tokens, else 2 (enough independent
        // chains; the order of each output does not depend on it).
        let wide = if tn <= 2 { 4 } else { 2 };
        let mut r = block.start;
        while r < block.end {
            let rn = if block.end - r >= wide { wide } else { 1 };
            // SAFETY: rows r..r + rn exist and belong to the unit; tokens
            // t0..t0 + tn exist.
            unsafe {
                match (rn, tn) {
                    (4, 1) => tile::<4, 1>(&w, r, q, t0, job),
                    (4, _) => tile::<4, 2>(&w, r, q, t0, job),
                    (2, 3) => tile::<2, 3>(&w, r, q, t0, job),
                    (2, _) => tile::<2, 4>(&w, r, q, t0, job),
                    (_, 1) => tile::<1, 1>(&w, r, q, t0, job),
                    (_, 2) => tile::<1, 2>(&w, r, q, t0, job),
                    (_, 3) => tile::<1, 3>(&w, r, q, t0, job),
                    (_, _) => tile::<1, 4>(&w, r, q, t0, job),
                }
            }
            r += rn;
        }
    });
}

struct Weights<'a> {
    codes: &'a [u8],
    scales: &'a [u8],
    blocks: usize,
}

impl Weights<'_> {
    /// Block `b` of row `r` as its 4 groups of 8 int16 codes (values ≡ 0,
    /// 2, 1, 3 mod 4, as `quantize::code_position` lays the activations).
    ///
    /// # Safety
    ///
    /// The CPU supports NEON (part of the aarch64 baseline; callers are reached
    /// only through `Isa::Neon`). `r < rows` of the checked matrix and
    /// `b < blocks`, i.e. 16 readable bytes of `codes` from
    /// `(r · blocks + b) · 16`.
    #[target_feature(enable = "neon")]
    #[inline]
    unsafe fn block(&self, r: usize, b: usize) -> [int16x8_t; 4] {
        // SAFETY: the caller's contract; static table.
        let (bytes, table) = unsafe {
            (
                vld1q_u8(self.codes.as_ptr().add((r * self.blocks + b) * BLOCK / 2)),
                vld1q_s8(DOUBLED_E2M1.as_ptr()),
            )
        };
        // Byte j holds values 2j (low nibble) and 2j + 1 (high nibble), so
        // 16-bit word k of a lookup holds values 4k and 4k + 2 (or 4k + 1
        // and 4k + 3): shift the low byte up, or mask it off.
        let even = vreinterpretq_s16_s8(vqtbl1q_s8(table, vandq_u8(bytes, vdupq_n_u8(0x0F))));
        let odd = vreinterpretq_s16_s8(vqtbl1q_s8(table, vshrq_n_u8::<4>(bytes)));
        let high_byte = vdupq_n_s16(0xFF00u16 as i16);
        [
            vshlq_n_s16::<8>(even),
            vandq_s16(even, high_byte),
            vshlq_n_s16::<8>(odd),
            vandq_s16(odd, high_byte),
        ]
    }

    /// Scale of block `b` of row `r`, × 1/512.
    fn scale(&self, r: usize, b: usize) -> f32 {
        code_scale(self.scales[r * self.blocks + b])
    }
}

/// `R` rows from `row0` × `T` tokens from `t0`, every column.
///
/// # Safety
///
/// The CPU supports NEON (part of the aarch64 baseline; callers are reached
/// only through `Isa::Neon`). `w` is `job.weight`'s MXFP4 data with
/// `w.blocks == q.cols / 32`; `q` is `job.x` quantized with
/// `q.cols == job.weight.cols`; tokens `t0..t0 + T` exist
/// (`t0 + T ≤ job.tokens`); and the job contract of the module docs holds for
/// rows `row0..row0 + R` (inside `0..rows`, their outputs owned by the caller's
/// unit).
#[target_feature(enable = "neon")]
#[inline]
unsafe fn tile<const R: usize, const T: usize>(
    w: &Weights,
    row0: usize,
    q: &QuantizedX,
    t0: usize,
    job: &Job,
) {
    let blocks = w.blocks;
    let codes: [*const i16; T] = std::array::from_fn(|t| q.codes_of(t0 + t).as_ptr());
    let scales: [&[f32]; T] = std::array::from_fn(|t| q.scales_of(t0 + t));
    let mut acc = [[vdupq_n_f32(0.0); T]; R];
    for b in 0..blocks {
        // Group g of this block's activations: 8 codes from `base + g · step`.
        let base = code_position(blocks, b, 0);
        let step = code_position(blocks, b, 2) - base;
        let sb = scale_position(blocks, b);
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: block b of row row0 + r is inside the matrix.
            let wb = unsafe { w.block(row0 + r, b) };
            let ws = w.scale(row0 + r, b);
            for (t, acc_rt) in acc_r.iter_mut().enumerate() {
                // SAFETY: the 4 groups of 8 codes lie inside token t's row.
                let x: [int16x8_t; 4] =
                    std::array::from_fn(|g| unsafe { vld1q_s16(codes[t].add(base + g * step)) });
                let mut lo = vmull_s16(vget_low_s16(wb[0]), vget_low_s16(x[0]));
                let mut hi = vmull_high_s16(wb[0], x[0]);
                for g in 1..4 {
                    lo = vmlal_s16(lo, vget_low_s16(wb[g]), vget_low_s16(x[g]));
                    hi = vmlal_high_s16(hi, wb[g], x[g]);
                }
                let sums = vcvtq_f32_s32(vaddq_s32(lo, hi));
                *acc_rt = vfmaq_n_f32(*acc_rt, sums, ws * scales[t][sb]);
            }
        }
    }
    let n_rows = job.weight.rows;
    for (r, acc_r) in acc.iter().enumerate() {
        for (t, acc_rt) in acc_r.iter().enumerate() {
            // SAFETY: token t0 + t exists; the unit owns row row0 + r.
            unsafe { *job.out.get().add((t0 + t) * n_rows + row0 + r) = vaddvq_f32(*acc_rt) };
        }
    }
}
