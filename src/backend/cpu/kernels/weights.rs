//! A weight matrix as the kernels see it: its shape checks, its size, and
//! its element `W[row, col]` straight from the format's definition (in
//! `crate::formats`), which the tests hold every kernel to.

use super::error::KernelError;
use crate::checkpoint::linear::{Fp8Scales, LinearWeight, WeightData, int4_element};
use crate::formats::{
    FP8_BLOCK, INT4_PER_WORD, MXFP4_GROUP, NVFP4_GROUP, fp8_value, mxfp4_value, nvfp4_value,
    read_bf16, read_f32, read_nibble,
};

/// Weight element `W[row, col]` as f32, straight from the format's definition.
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
            let scale = scales[row * (w.cols / NVFP4_GROUP) + col / NVFP4_GROUP];
            nvfp4_value(read_nibble(packed, index) as u8, scale, global)
        }
        WeightData::Mxfp4 { blocks, scales } => {
            let scale = scales[row * (w.cols / MXFP4_GROUP) + col / MXFP4_GROUP];
            mxfp4_value(read_nibble(blocks, index) as u8, scale)
        }
        WeightData::Fp8 { values, scales } => fp8_value(values[index], scales.at(row, col, w.cols)),
        WeightData::Int4 {
            qweight,
            qzeros,
            scales,
            group,
            zero_offset,
        } => int4_element(
            qweight,
            qzeros,
            scales,
            group,
            zero_offset,
            w.rows,
            row,
            col,
        ),
    }
}

/// Short name of a format, for errors and benchmark tables.
pub fn format_name(data: &WeightData) -> &'static str {
    match data {
        WeightData::F32(_) => "F32",
        WeightData::Bf16(_) => "BF16",
        WeightData::Nvfp4 { .. } => "NVFP4",
        WeightData::Mxfp4 { .. } => "MXFP4",
        WeightData::Fp8 {
            scales: Fp8Scales::Tensor(_),
            ..
        } => "FP8",
        WeightData::Fp8 {
            scales: Fp8Scales::Block { .. },
            ..
        } => "FP8-block",
        WeightData::Int4 { .. } => "INT4",
    }
}

/// Bytes of weight data (codes and scales) the matrix occupies.
pub fn weight_bytes(w: &LinearWeight) -> usize {
    match w.data {
        WeightData::F32(b) | WeightData::Bf16(b) => b.len(),
        WeightData::Nvfp4 { packed, scales, .. } => packed.len() + scales.len(),
        WeightData::Mxfp4 { blocks, scales } => blocks.len() + scales.len(),
        WeightData::Fp8 { values, scales } => {
            values.len()
                + match scales {
                    Fp8Scales::Tensor(_) => 4,
                    Fp8Scales::Block { bytes, .. } => bytes.len(),
                }
        }
        WeightData::Int4 {
            qweight,
            qzeros,
            scales,
            ..
        } => qweight.len() + qzeros.len() + scales.len(),
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
            block(NVFP4_GROUP)?;
            expect("packed codes", elements / 2, packed.len())?;
            expect("scales", elements / NVFP4_GROUP, scales.len())
        }
        WeightData::Mxfp4 { blocks, scales } => {
            block(MXFP4_GROUP)?;
            expect("blocks", elements / 2, blocks.len())?;
            expect("scales", elements / MXFP4_GROUP, scales.len())
        }
        WeightData::Fp8 { values, scales } => {
            expect("values", elements, values.len())?;
            match scales {
                Fp8Scales::Tensor(_) => Ok(()),
                Fp8Scales::Block { bytes, dtype } => {
                    let blocks = w.rows.div_ceil(FP8_BLOCK) * w.cols.div_ceil(FP8_BLOCK);
                    expect(
                        "block scales",
                        blocks.checked_mul(dtype.bytes()).ok_or(overflow)?,
                        bytes.len(),
                    )
                }
            }
        }
        WeightData::Int4 {
            qweight,
            qzeros,
            scales,
            group,
            ..
        } => {
            if group == 0 || !group.is_multiple_of(INT4_PER_WORD) {
                return Err(KernelError::ColsNotBlockMultiple {
                    format,
                    multiple: INT4_PER_WORD,
                    cols: group,
                });
            }
            block(group)?;
            if !w.rows.is_multiple_of(INT4_PER_WORD) {
                return Err(KernelError::ColsNotBlockMultiple {
                    format: "INT4 rows",
                    multiple: INT4_PER_WORD,
                    cols: w.rows,
                });
            }
            expect("qweight", elements / 2, qweight.len())?;
            expect("qzeros", elements / group / 2, qzeros.len())?;
            expect("scales", elements / group * 2, scales.len())
        }
    }
}
