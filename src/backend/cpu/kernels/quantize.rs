//! Activations quantized for the integer kernels (MXFP4; NVFP4 and GPTQ INT4
//! on x86).
//!
//! Why: decoding FP4 weights to f32 costs more vector instructions per byte
//! than two cores can issue at the memory bandwidth. Multiplying FP4 codes
//! (small integers) by int16 activations with `vpmaddwd` does 16 products per
//! instruction and keeps batch-1 decode at the bandwidth.
//!
//! The numerics: every token row is cut into the 32-value blocks of the
//! weights' scales, and block `b` is held as int16 codes `q` and one scale
//! `d_b`, a power of two, with `x ≈ q · d_b`:
//!
//! - `d_b = 2^(E − 14)`, where `2^E ≤ max|x| < 2^(E+1)` over the block, so
//!   the block's largest value keeps 15 significant bits (a bf16 keeps 8).
//!   Codes are rounded to nearest, ties to even, and saturated to the int16
//!   range, so every code is off by at most `d_b / 2` (a whole step for a
//!   value that rounds to 2^15 and becomes 32767).
//! - Being a power of two, `x / d_b` is exact before the rounding, small
//!   integers are held exactly, and `d_b` times the weights' E8M0 scale is
//!   exact too.
//! - A block of zeros has codes 0; a block holding a NaN or an infinity has
//!   codes 0 and a NaN scale, so the outputs it touches are NaN, as in f32.
//!
//! The layout is the order in which the AVX2 kernel's decoded weights come
//! out, so its loads need no shuffles: see [`code_position`] and
//! [`scale_position`].

use super::error::KernelError;
use crate::checkpoint::linear::{LinearWeight, WeightData};
use crate::formats::{E8M0, MXFP4_GROUP};

/// Values per block (the MXFP4 scale block).
pub const BLOCK: usize = MXFP4_GROUP;
/// Blocks whose scales are stored as one group (one 8-lane vector).
pub const SCALE_GROUP: usize = 8;
/// Smallest block exponent used: blocks whose largest value is below
/// 2^(MIN_EXPONENT) are quantized as if it were 2^(MIN_EXPONENT), which keeps
/// every scale a normal f32 (those values are far below anything a model
/// produces).
const MIN_EXPONENT: i32 = -95;
/// Significant bits below the block's top bit kept by the codes.
const CODE_BITS: i32 = 14;

/// The weights' side of the integer kernels: an E2M1 code looked up here
/// gives twice its value (an integer, -12..=12); placed in the high byte of a
/// 16-bit word it is worth 512 × the value.
pub const DOUBLED_E2M1: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
/// What an E8M0 scale is multiplied by to undo those codes' 512.
pub const CODE_UNSCALE: f32 = 1.0 / 512.0;

/// An MXFP4 block's E8M0 scale byte as the integer kernels apply it.
#[inline]
pub fn code_scale(byte: u8) -> f32 {
    E8M0[byte as usize] * CODE_UNSCALE
}

/// Whether NVFP4 weights multiply quantized activations as integers on the
/// x86 tiers (`x86/avx2_fp4.rs`): where their rows are whole activation
/// blocks; other NVFP4 rows decode to f32 (`x86/avx2.rs`), so every token of
/// a matrix takes one of the two.
pub fn integer_nvfp4(weight: &LinearWeight) -> bool {
    matches!(weight.data, WeightData::Nvfp4 { .. }) && weight.cols.is_multiple_of(BLOCK)
}

/// Room for quantized activations: `values` int16 codes and one f32 scale
/// per 32 values. The MoE workspace owns one, sized by the plan
/// (`plan::memory::quantized_activation_buffers`); a scratch made with
/// [`ActivationScratch::growable`] grows to whatever a call needs instead.
#[derive(Debug, Default)]
pub struct ActivationScratch {
    codes: Vec<i16>,
    scales: Vec<f32>,
    growable: bool,
}

impl ActivationScratch {
    /// A fixed scratch over buffers the caller allocated (and charged):
    /// a call needing more than `codes.len()` values fails.
    pub fn from_buffers(codes: Vec<i16>, scales: Vec<f32>) -> ActivationScratch {
        ActivationScratch {
            codes,
            scales,
            growable: false,
        }
    }

    /// A scratch that grows to the largest call it sees (and keeps that).
    pub fn growable() -> ActivationScratch {
        ActivationScratch {
            growable: true,
            ..ActivationScratch::default()
        }
    }

    /// Makes room for `values` quantized values (a multiple of 32).
    pub(super) fn reserve(&mut self, values: usize) -> Result<(), KernelError> {
        let blocks = values / BLOCK;
        if values <= self.codes.len() && blocks <= self.scales.len() {
            return Ok(());
        }
        if !self.growable {
            return Err(KernelError::ScratchTooSmall {
                needed: values,
                capacity: self.codes.len().min(self.scales.len() * BLOCK),
            });
        }
        self.codes.resize(values, 0);
        self.scales.resize(blocks, 0.0);
        Ok(())
    }

    /// The whole buffers, to be cut into per-problem parts.
    pub(super) fn parts(&mut self) -> (&mut [i16], &mut [f32]) {
        (&mut self.codes, &mut self.scales)
    }
}

/// Quantized activations of one problem, `[tokens, cols]`.
#[derive(Clone, Copy)]
pub struct QuantizedX<'a> {
    pub codes: &'a [i16],
    pub scales: &'a [f32],
    pub cols: usize,
}

impl<'a> QuantizedX<'a> {
    /// Codes of token `t` (`cols` values, in [`code_position`] order).
    pub fn codes_of(&self, t: usize) -> &'a [i16] {
        &self.codes[t * self.cols..(t + 1) * self.cols]
    }

    /// Scales of token `t` (`cols / 32` values, in [`scale_position`] order).
    pub fn scales_of(&self, t: usize) -> &'a [f32] {
        let blocks = self.cols / BLOCK;
        &self.scales[t * blocks..(t + 1) * blocks]
    }

    /// Block `b` of token `t` as the GPTQ INT4 kernel multiplies it: per
    /// 8 columns `w` and `j < 4`, the codes of columns `8w + j` and
    /// `8w + j + 4` as the low and high int16 of one value (neighbours in
    /// the layout of [`code_position`], which groups a block's values by
    /// their index mod 4), and the block's scale.
    pub fn column_pairs(&self, t: usize, b: usize) -> ([[i32; 4]; BLOCK / 8], f32) {
        let blocks = self.cols / BLOCK;
        let (start, offsets) = block_layout(blocks, b);
        let row = &self.codes_of(t)[start..];
        let pairs = std::array::from_fn(|w| {
            std::array::from_fn(|j| {
                let low = offsets[8 * w + j];
                i32::from(row[low] as u16) | (i32::from(row[low + 1]) << 16)
            })
        });
        (pairs, self.scales_of(t)[scale_position(blocks, b)])
    }
}

/// Where element `i` of block `b` goes in a row of `blocks` blocks.
///
/// Blocks are taken in pairs (2p, 2p + 1); a last block without a partner
/// stands alone. A block's 32 values form 4 groups of 8 by their index mod
/// 4: 0, 2, 1, 3 (the order in which the kernel's byte lookups produce the
/// codes), each in ascending order. A pair stores group g of its first
/// block then group g of its second, for g = 0..4 (so a 16-lane vector holds
/// one group of each block); a lone block stores its 4 groups in order.
pub fn code_position(blocks: usize, b: usize, i: usize) -> usize {
    let group = GROUP_OF[i % 4];
    let within = i / 4;
    let alone = b + 1 == blocks && blocks % 2 == 1;
    if alone {
        b * BLOCK + group * 8 + within
    } else {
        (b / 2) * 2 * BLOCK + group * 16 + (b % 2) * 8 + within
    }
}

/// Where block `b`'s scale goes in a row of `blocks` blocks: whole groups of
/// 8 blocks store their scales as 0 2 4 6 1 3 5 7 (so pair p of the group
/// finds its two scales at lanes p and 4 + p), the blocks after the last
/// whole group in order.
pub fn scale_position(blocks: usize, b: usize) -> usize {
    let group = b / SCALE_GROUP;
    if (group + 1) * SCALE_GROUP > blocks {
        return b;
    }
    let k = b % SCALE_GROUP;
    group * SCALE_GROUP + (k % 2) * 4 + k / 2
}

/// The scale of a block whose largest magnitude is `amax` (see the module).
pub fn block_scale(amax: f32) -> f32 {
    if !amax.is_finite() {
        return f32::NAN;
    }
    let biased = ((amax.to_bits() >> 23) & 0xFF) as i32;
    let exponent = (biased - 127).max(MIN_EXPONENT) - CODE_BITS;
    f32::from_bits(((exponent + 127) as u32) << 23)
}

/// Offsets of a block's 32 values from the block's start in the layout of
/// [`code_position`]: as the first block of a pair (the second adds 8), and
/// as a lone block.
const PAIR_OFFSETS: [usize; BLOCK] = offsets(16);
const LONE_OFFSETS: [usize; BLOCK] = offsets(8);

/// Where block `b` of a row of `blocks` blocks starts in the layout of
/// [`code_position`], and the offsets of its values from there.
fn block_layout(blocks: usize, b: usize) -> (usize, &'static [usize; BLOCK]) {
    let offsets = if b + 1 == blocks && blocks % 2 == 1 {
        &LONE_OFFSETS
    } else {
        &PAIR_OFFSETS
    };
    (code_position(blocks, b, 0), offsets)
}

/// The group of a value by its index mod 4.
const GROUP_OF: [usize; 4] = [0, 2, 1, 3];

const fn offsets(group_stride: usize) -> [usize; BLOCK] {
    let mut table = [0; BLOCK];
    let mut i = 0;
    while i < BLOCK {
        table[i] = GROUP_OF[i % 4] * group_stride + i / 4;
        i += 1;
    }
    table
}

/// 1.5 · 2^23: adding and subtracting it rounds an f32 below 2^22 in
/// magnitude to the nearest integer, ties to even (the FPU's rounding), in
/// plain arithmetic the compiler vectorises (`round_ties_even` is a library
/// call on baseline x86-64).
const ROUNDER: f32 = 12_582_912.0;

/// Quantizes one token row (`x.len()` a multiple of 32) into `codes` and
/// `scales` in the kernels' layout: the definition, which the AVX2 version
/// that `kernels::quantize_rows` runs matches bit for bit.
pub fn quantize_row(x: &[f32], codes: &mut [i16], scales: &mut [f32]) {
    let blocks = x.len() / BLOCK;
    for (b, block) in x.chunks_exact(BLOCK).enumerate() {
        // NaN-propagating max: a NaN anywhere makes the block NaN.
        let amax = block.iter().fold(0.0f32, |m, v| {
            if m.is_nan() || v.is_nan() {
                f32::NAN
            } else {
                m.max(v.abs())
            }
        });
        let scale = block_scale(amax);
        scales[scale_position(blocks, b)] = scale;
        // 1/scale is a power of two, so x · (1/scale) is exact; |x/scale| ≤
        // 2^15, well inside the rounder's range; `as` saturates to int16.
        let inverse = if scale.is_nan() { 0.0 } else { 1.0 / scale };
        let mut q = [0i16; BLOCK];
        for (q, &v) in q.iter_mut().zip(block) {
            *q = ((v * inverse + ROUNDER) - ROUNDER) as i16;
        }
        let (start, offsets) = block_layout(blocks, b);
        let codes = &mut codes[start..];
        for (&offset, &q) in offsets.iter().zip(&q) {
            codes[offset] = q;
        }
    }
}
