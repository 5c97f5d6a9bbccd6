//! The number formats of the checkpoints, defined once: the NVFP4, MXFP4,
//! FP8-block and INT4 group sizes, FP4 (E2M1) codes, FP8 (E4M3) values and
//! scales, E8M0 scales, and bf16.
//! `docs/FORMATS.md` describes the byte layouts and the specifications they
//! follow.
//!
//! Every decoder in the crate follows these rules: the checkpoint's row
//! decoders, the CPU kernels (which look values up in the tables here), and
//! the CUDA kernels, which take this file's constants from the
//! `constants.cuh` the host writes (`backend::cuda::constants`) and mirror
//! its rules in `kernels/common.cuh`. `tests/formats.rs` holds one table of
//! byte → value cases that all of them pass.
//!
//! Everything here reads bytes one at a time (it works on misaligned
//! slices), and every value it decodes is exact in f32.

use crate::geometry::Quantization;

/// Elements sharing one NVFP4 scale (an E4M3 byte).
pub const NVFP4_GROUP: usize = 16;
/// Elements sharing one MXFP4 scale (an E8M0 byte): one block of codes.
pub const MXFP4_GROUP: usize = 32;
/// Bytes of packed codes per MXFP4 block (two codes per byte).
pub const MXFP4_BLOCK_BYTES: usize = MXFP4_GROUP / 2;

/// Rows and columns per FP8 block scale (`weight_block_size [128, 128]`).
pub const FP8_BLOCK: usize = 128;
/// INT4 codes per packed 32-bit word (GPTQ `qweight` / `qzeros`).
pub const INT4_PER_WORD: usize = 8;

impl Quantization {
    /// The multiple a row's length must be for the format's fixed groups:
    /// 16 for NVFP4, 32 for MXFP4, the 8 codes of a word for INT4 (whose
    /// scale groups the checkpoint chooses), and 1 for bf16 and FP8 (whose
    /// blocks may be ragged at the edge).
    pub fn group_size(self) -> usize {
        match self {
            Quantization::Bf16 | Quantization::Fp8 | Quantization::Fp8Block => 1,
            Quantization::Nvfp4 => NVFP4_GROUP,
            Quantization::Mxfp4 => MXFP4_GROUP,
            Quantization::Int4 => INT4_PER_WORD,
        }
    }
}

// ---- FP4 E2M1 -----------------------------------------------------------------

/// E2M1 (FP4) code → value: codes 0..=7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6;
/// bit 3 is the sign (so code 8 is −0).
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Decodes an FP4 E2M1 code (the low 4 bits of `code`; higher bits ignored).
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    E2M1[usize::from(code & 0x0F)]
}

/// FP4 code of element `index` of a nibble-packed slice: the low nibble of a
/// byte is the even element, the high nibble the odd one.
#[inline]
pub fn read_nibble(bytes: &[u8], index: usize) -> usize {
    let byte = bytes[index / 2];
    (if index.is_multiple_of(2) {
        byte & 0x0F
    } else {
        byte >> 4
    }) as usize
}

// ---- FP8 E4M3 -------------------------------------------------------------------

/// Decodes FP8 E4M3 as ModelOpt stores it (`float8_e4m3fn`): exponent bias
/// 7, no infinities, `S.1111.111` is NaN, largest finite value 448,
/// exponent 0 is subnormal (`0.mmm × 2^-6`).
pub const fn e4m3_to_f32(byte: u8) -> f32 {
    let negative = byte & 0x80 != 0;
    let exponent = ((byte >> 3) & 0x0F) as u32;
    let mantissa = (byte & 0x07) as u32;
    if exponent == 0x0F && mantissa == 0x07 {
        return f32::NAN;
    }
    let magnitude = if exponent == 0 {
        // Subnormal: mantissa / 8 × 2^-6 = mantissa × 2^-9, exact in f32.
        mantissa as f32 / 512.0
    } else {
        // Normal: rebias the exponent (−7 + 127) and widen the mantissa.
        f32::from_bits(((exponent + 120) << 23) | (mantissa << 20))
    };
    if negative { -magnitude } else { magnitude }
}

/// [`e4m3_to_f32`] of every byte, for kernels that look scales up.
pub static E4M3: [f32; 256] = {
    let mut table = [0.0f32; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = e4m3_to_f32(byte as u8);
        byte += 1;
    }
    table
};

// ---- FP8 E4M3 encoding (the FP8 KV cache) ----------------------------------------

/// The largest finite E4M3 (`float8_e4m3fn`) value.
pub const E4M3_MAX: f32 = 448.0;

/// Encodes f32 as FP8 E4M3 (`float8_e4m3fn`), saturating: round to nearest
/// even, magnitudes past [`E4M3_MAX`] (infinities too) to ±448, NaN to
/// `S.1111.111` with the input's sign, −0 to `0x80`. It is
/// `torch.clamp(x, -448, 448).to(torch.float8_e4m3fn)`, the conversion
/// vLLM's FP8 KV cache and CUDA's `__NV_SATFINITE` make;
/// `scripts/e4m3_reference.py` regenerates torch's table that
/// tests/formats.rs checks every f32 against. [`e4m3_to_f32`] inverts it
/// on every byte but the NaNs.
#[inline]
pub fn f32_to_e4m3(value: f32) -> u8 {
    let bits = value.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    if value.is_nan() {
        return sign | 0x7F;
    }
    let magnitude = value.abs();
    if magnitude >= E4M3_MAX {
        return sign | 0x7E;
    }
    if magnitude < 0.015_625 {
        // Below 2^-6: subnormal, in units of 2^-9 (the scaling is exact).
        // Rounding up to 8 units gives 0x08, the smallest normal, as it should.
        return sign | (magnitude * 512.0).round_ties_even() as u8;
    }
    // Normal: keep 3 of f32's 23 mantissa bits, ties to the even one (a
    // carry out of the mantissa bumps the exponent, as it should), then
    // rebias the exponent (−127 + 7). Below 448 the result is at most 0x7E.
    let abs_bits = magnitude.to_bits();
    let rounded = abs_bits + 0x7_FFFF + ((abs_bits >> 20) & 1);
    let exponent = (rounded >> 23) - 120;
    let mantissa = (rounded >> 20) & 0x07;
    sign | ((exponent << 3) | mantissa) as u8
}

/// An FP8 weight element: `e4m3(byte) × scale`, with `scale` the tensor's
/// `weight_scale` (ModelOpt FP8) or the element's block's `weight_scale_inv`
/// (FP8 block-wise: despite the name it multiplies). One rounding: the
/// product's.
#[inline]
pub fn fp8_value(byte: u8, scale: f32) -> f32 {
    E4M3[usize::from(byte)] * scale
}

/// Index of the block scale of element `(row, col)` of a matrix with `cols`
/// columns stored in square blocks of [`FP8_BLOCK`]: the scales are
/// `[ceil(rows/128), ceil(cols/128)]` row-major, edge blocks ragged.
#[inline]
pub fn fp8_block_index(row: usize, col: usize, cols: usize) -> usize {
    (row / FP8_BLOCK) * cols.div_ceil(FP8_BLOCK) + col / FP8_BLOCK
}

/// The element type of a tensor of scales that exporters write in more than
/// one float type (FP8 block-wise `weight_scale_inv`: F32, but Qwen's
/// `Qwen3-*-FP8` releases store BF16, some F16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleType {
    F32,
    Bf16,
    F16,
}

impl ScaleType {
    /// Bytes per scale.
    pub const fn bytes(self) -> usize {
        match self {
            ScaleType::F32 => 4,
            ScaleType::Bf16 | ScaleType::F16 => 2,
        }
    }

    /// Scale `index` of a little-endian slice of this type, as f32 (exact).
    #[inline]
    pub fn read(self, bytes: &[u8], index: usize) -> f32 {
        match self {
            ScaleType::F32 => read_f32(bytes, index),
            ScaleType::Bf16 => read_bf16(bytes, index),
            ScaleType::F16 => {
                f16_to_f32(u16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]))
            }
        }
    }
}

// ---- E8M0 ---------------------------------------------------------------------------

/// The E8M0 byte that is not a power of two: NaN (OCP Microscaling Formats (MX) v1.0).
pub const E8M0_NAN: u8 = 0xFF;

/// Decodes an E8M0 scale: 2^(byte − 127), and [`E8M0_NAN`] is NaN (the OCP
/// MX specification's rule; 2^128 would not fit in f32 anyway). Byte 0 is
/// 2^-127, a subnormal f32.
pub const fn e8m0_to_f32(byte: u8) -> f32 {
    match byte {
        E8M0_NAN => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        _ => f32::from_bits((byte as u32) << 23),
    }
}

/// [`e8m0_to_f32`] of every byte, for kernels that look scales up.
pub static E8M0: [f32; 256] = {
    let mut table = [0.0f32; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = e8m0_to_f32(byte as u8);
        byte += 1;
    }
    table
};

// ---- quantized elements -------------------------------------------------------------

/// An NVFP4 element: `e2m1(code) × e4m3(scale) × global`. The first product
/// is exact in f32 (2 + 4 significant bits), so the multiply by the global
/// scale (`weight_scale_2`) is the only rounding.
#[inline]
pub fn nvfp4_value(code: u8, scale: u8, global: f32) -> f32 {
    e2m1_to_f32(code) * E4M3[usize::from(scale)] * global
}

/// An MXFP4 element: `e2m1(code) × e8m0(scale)`, exact.
#[inline]
pub fn mxfp4_value(code: u8, scale: u8) -> f32 {
    e2m1_to_f32(code) * E8M0[usize::from(scale)]
}

// ---- INT4 (GPTQ) ---------------------------------------------------------------------

/// INT4 code `nibble` (0..8) of a packed 32-bit GPTQ word (`qweight` along
/// the input dimension, `qzeros` along the output one): nibble `j` is bits
/// `4j..4j+4`, so the low nibble is the first of the word's 8 elements.
#[inline]
pub fn int4_code(word: u32, nibble: usize) -> u8 {
    ((word >> (4 * nibble)) & 0x0F) as u8
}

/// The zero point a stored 4-bit `qzeros` code means: GPTQ v1 checkpoints
/// (`checkpoint_format: gptq`, AutoGPTQ's layout, AutoRound's
/// `auto_round:auto_gptq`) store `zero − 1`, so `offset` is 1 and zero
/// points lie in 1..=16; GPTQ v2 stores the zero itself (`offset` 0).
#[inline]
pub fn int4_zero(stored: u8, offset: u8) -> i32 {
    i32::from(stored & 0x0F) + i32::from(offset)
}

/// An INT4 element: `(code − zero) × scale`, `scale` the group's f16 value.
/// The difference is a small integer, so the product is the one rounding.
#[inline]
pub fn int4_value(code: u8, zero: i32, scale: f32) -> f32 {
    (i32::from(code & 0x0F) - zero) as f32 * scale
}

/// Little-endian 32-bit word at element `index` of a byte slice.
#[inline]
pub fn read_u32(bytes: &[u8], index: usize) -> u32 {
    let b = &bytes[4 * index..4 * index + 4];
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

// ---- f16 ------------------------------------------------------------------------------

/// IEEE binary16 bits → f32, exact (subnormals, infinities and NaN kept).
pub const fn f16_to_f32(bits: u16) -> f32 {
    let sign = ((bits as u32) & 0x8000) << 16;
    let exponent = ((bits >> 10) & 0x1F) as u32;
    let mantissa = (bits & 0x03FF) as u32;
    let magnitude = if exponent == 0 {
        // Subnormal (or zero): mantissa × 2^-24, exact in f32.
        return if sign != 0 {
            -(mantissa as f32 / 16_777_216.0)
        } else {
            mantissa as f32 / 16_777_216.0
        };
    } else if exponent == 0x1F {
        0x7F80_0000 | (mantissa << 13)
    } else {
        ((exponent + 112) << 23) | (mantissa << 13)
    };
    f32::from_bits(sign | magnitude)
}

/// Little-endian f16 at element `index` of a byte slice, as f32.
#[inline]
pub fn read_f16(bytes: &[u8], index: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]))
}

// ---- bf16 and f32 -------------------------------------------------------------------

/// bf16 bits → f32 (exact: bf16 is the top half of an f32).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 → bf16 bits, rounding to nearest even (as PyTorch does); NaN stays a
/// quiet NaN.
#[inline]
pub fn f32_to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) | 0x0040) as u16;
    }
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// Little-endian bf16 at element `index` of a byte slice, as f32.
#[inline]
pub fn read_bf16(bytes: &[u8], index: usize) -> f32 {
    bf16_to_f32(u16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]))
}

/// Little-endian f32 at element `index` of a byte slice.
#[inline]
pub fn read_f32(bytes: &[u8], index: usize) -> f32 {
    let b = &bytes[4 * index..4 * index + 4];
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}
