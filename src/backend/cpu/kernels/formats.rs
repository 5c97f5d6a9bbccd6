//! Scalar decoding of the weight formats (FORMATS.md), shape checks, and the
//! bf16 rounding rule. Everything here reads bytes one at a time, so it works
//! on misaligned slices; SIMD kernels use it for tails and as their oracle.

use super::error::KernelError;
use crate::checkpoint::linear::{LinearWeight, WeightData};

/// E2M1 (FP4) code → value; bit 3 is the sign.
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// F8_E4M3 (fn variant: no infinities, S.1111.111 is NaN) → f32, by bit pattern.
pub static E4M3: [f32; 256] = e4m3_table();

/// E8M0 exponent → 2^(s − 127), as FORMATS.md defines it (255 gives +inf).
pub static E8M0: [f32; 256] = e8m0_table();

const fn e4m3_table() -> [f32; 256] {
    let mut table = [0.0f32; 256];
    let mut b = 0usize;
    while b < 256 {
        let sign = (b as u32 & 0x80) << 24;
        let exp = (b >> 3) & 0x0F;
        let man = (b & 0x07) as u32;
        table[b] = if exp == 0x0F && man == 7 {
            f32::NAN
        } else if exp == 0 {
            // Subnormal: man/8 · 2^-6 = man · 2^-9, exact in f32.
            let mag = man as f32 * (1.0 / 512.0);
            f32::from_bits(mag.to_bits() | sign)
        } else {
            f32::from_bits(sign | ((exp as u32 + 120) << 23) | (man << 20))
        };
        b += 1;
    }
    table
}

const fn e8m0_table() -> [f32; 256] {
    let mut table = [0.0f32; 256];
    let mut s = 0usize;
    while s < 256 {
        table[s] = match s {
            0 => f32::from_bits(0x0040_0000), // 2^-127, a subnormal
            255 => f32::INFINITY,             // 2^128 overflows f32
            _ => f32::from_bits((s as u32) << 23),
        };
        s += 1;
    }
    table
}

/// bf16 bits → f32 (exact).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 → bf16 bits, rounding to nearest even (as PyTorch does); NaN stays NaN.
#[inline]
pub fn f32_to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) | 0x0040) as u16;
    }
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// Little-endian bf16 at element `index` of a byte slice.
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

/// FP4 code of element `index` in a nibble-packed slice (low nibble = even element).
#[inline]
pub fn read_nibble(bytes: &[u8], index: usize) -> usize {
    let byte = bytes[index / 2];
    (if index.is_multiple_of(2) {
        byte & 0x0F
    } else {
        byte >> 4
    }) as usize
}

/// Weight element `W[row, col]` as f32, straight from the format's definition.
/// NVFP4 multiplies e2m1 × e4m3 first (exact), then the global scale.
pub fn weight_at(w: &LinearWeight, row: usize, col: usize) -> f32 {
    let index = row * w.cols + col;
    match w.data {
        WeightData::F32(bytes) => read_f32(bytes, index),
        WeightData::Bf16(bytes) => read_bf16(bytes, index),
        WeightData::Nvfp4 {
            packed,
            scales,
            global,
        } => {
            let scale = E4M3[scales[row * (w.cols / 16) + col / 16] as usize];
            E2M1[read_nibble(packed, index)] * scale * global
        }
        WeightData::Mxfp4 { blocks, scales } => {
            let scale = E8M0[scales[row * (w.cols / 32) + col / 32] as usize];
            E2M1[read_nibble(blocks, index)] * scale
        }
    }
}

/// Short name of a format, for errors and benchmark tables.
pub fn format_name(data: &WeightData) -> &'static str {
    match data {
        WeightData::F32(_) => "F32",
        WeightData::Bf16(_) => "BF16",
        WeightData::Nvfp4 { .. } => "NVFP4",
        WeightData::Mxfp4 { .. } => "MXFP4",
    }
}

/// Bytes of weight data (codes and scales) the matrix occupies.
pub fn weight_bytes(w: &LinearWeight) -> usize {
    match w.data {
        WeightData::F32(b) | WeightData::Bf16(b) => b.len(),
        WeightData::Nvfp4 { packed, scales, .. } => packed.len() + scales.len(),
        WeightData::Mxfp4 { blocks, scales } => blocks.len() + scales.len(),
    }
}

/// Checks that the byte slices hold exactly a `[rows, cols]` matrix of the
/// format and that `cols` fits the format's block size.
pub fn check_weight(w: &LinearWeight) -> Result<(), KernelError> {
    let format = format_name(&w.data);
    let elements = w
        .rows
        .checked_mul(w.cols)
        .ok_or(KernelError::ShapeOverflow {
            rows: w.rows,
            cols: w.cols,
        })?;
    let expect = |part: &'static str, expected: usize, got: usize| {
        if expected == got {
            Ok(())
        } else {
            Err(KernelError::WeightBytes {
                format,
                part,
                rows: w.rows,
                cols: w.cols,
                expected,
                got,
            })
        }
    };
    let block = |multiple: usize| {
        if w.cols.is_multiple_of(multiple) {
            Ok(())
        } else {
            Err(KernelError::ColsNotBlockMultiple {
                format,
                multiple,
                cols: w.cols,
            })
        }
    };
    let overflow = KernelError::ShapeOverflow {
        rows: w.rows,
        cols: w.cols,
    };
    match w.data {
        WeightData::F32(bytes) => expect(
            "data",
            elements.checked_mul(4).ok_or(overflow)?,
            bytes.len(),
        ),
        WeightData::Bf16(bytes) => expect(
            "data",
            elements.checked_mul(2).ok_or(overflow)?,
            bytes.len(),
        ),
        WeightData::Nvfp4 { packed, scales, .. } => {
            block(16)?;
            expect("packed codes", elements / 2, packed.len())?;
            expect("scales", elements / 16, scales.len())
        }
        WeightData::Mxfp4 { blocks, scales } => {
            block(32)?;
            expect("blocks", elements / 2, blocks.len())?;
            expect("scales", elements / 32, scales.len())
        }
    }
}
