//! A linear layer's weight as it lies in the mapped checkpoint, in one of the
//! formats sparkrt computes on directly (never expanded into a dequantized copy).
//!
//! All byte slices borrow from the checkpoint's memory map: the mapping outlives
//! every weight. Slices may be misaligned; readers use unaligned loads.

use super::quant::{self, QuantError, check_len};
use crate::formats::{
    FP8_BLOCK, INT4_PER_WORD, MXFP4_GROUP, NVFP4_GROUP, ScaleType, fp8_block_index, fp8_value,
    int4_code, int4_value, int4_zero, read_bf16, read_f16, read_f32, read_u32,
};

/// Storage format and bytes of a `[rows, cols]` weight matrix (PyTorch layout:
/// `y = x · Wᵀ`, one row per output feature, `cols` = input features).
#[derive(Clone, Copy, Debug)]
pub enum WeightData<'a> {
    /// Little-endian f32, `rows × cols × 4` bytes.
    F32(&'a [u8]),
    /// Little-endian bf16, `rows × cols × 2` bytes.
    Bf16(&'a [u8]),
    /// ModelOpt NVFP4: `packed` is `[rows, cols/2]` E2M1 codes (low nibble =
    /// even element), `scales` `[rows, cols/16]` F8_E4M3, `global` = weight_scale_2.
    Nvfp4 {
        packed: &'a [u8],
        scales: &'a [u8],
        global: f32,
    },
    /// OCP MXFP4 (gpt-oss): `blocks` `[rows, cols/32, 16]` E2M1 codes (low
    /// nibble first), `scales` `[rows, cols/32]` E8M0 exponents (2^(s-127)).
    Mxfp4 { blocks: &'a [u8], scales: &'a [u8] },
    /// FP8 E4M3: `values` `[rows, cols]`, one byte per element, times the
    /// scale `scales` gives it (ModelOpt FP8 or FP8 block-wise).
    Fp8 {
        values: &'a [u8],
        scales: Fp8Scales<'a>,
    },
    /// GPTQ INT4, stored transposed (input-major), as the checkpoint has it:
    /// `qweight` `[cols/8, rows]` little-endian u32 words, word `(k, r)`
    /// holding `W[r, 8k..8k+8]` low nibble first; `qzeros` `[cols/group,
    /// rows/8]` words, word `(g, j)` holding the stored zero codes of rows
    /// `8j..8j+8`; `scales` `[cols/group, rows]` f16. Element `(r, c)` is
    /// `(code − (stored zero + zero_offset)) × scale` (`formats::int4_value`).
    /// `group` is a multiple of 8 dividing `cols`; `rows` a multiple of 8.
    Int4 {
        qweight: &'a [u8],
        qzeros: &'a [u8],
        scales: &'a [u8],
        group: usize,
        zero_offset: u8,
    },
}

/// Element `(row, col)` of a GPTQ INT4 matrix with `rows` output rows (the
/// layout of [`WeightData::Int4`]); indices must be in range.
#[allow(clippy::too_many_arguments)]
pub fn int4_element(
    qweight: &[u8],
    qzeros: &[u8],
    scales: &[u8],
    group: usize,
    zero_offset: u8,
    rows: usize,
    row: usize,
    col: usize,
) -> f32 {
    let word = read_u32(qweight, (col / INT4_PER_WORD) * rows + row);
    let g = col / group;
    let zeros = read_u32(qzeros, g * (rows / INT4_PER_WORD) + row / INT4_PER_WORD);
    let zero = int4_zero(int4_code(zeros, row % INT4_PER_WORD), zero_offset);
    let scale = read_f16(scales, g * rows + row);
    int4_value(int4_code(word, col % INT4_PER_WORD), zero, scale)
}

/// Where an FP8 weight's scales come from.
#[derive(Clone, Copy, Debug)]
pub enum Fp8Scales<'a> {
    /// One scale for the whole tensor (ModelOpt `weight_scale`).
    Tensor(f32),
    /// One scale per 128 × 128 block (`weight_scale_inv`
    /// `[ceil(rows/128), ceil(cols/128)]`, ragged edge blocks), stored as `dtype`.
    Block { bytes: &'a [u8], dtype: ScaleType },
}

impl Fp8Scales<'_> {
    /// The scale of element `(row, col)` of a matrix with `cols` columns.
    #[inline]
    pub fn at(&self, row: usize, col: usize, cols: usize) -> f32 {
        match *self {
            Fp8Scales::Tensor(scale) => scale,
            Fp8Scales::Block { bytes, dtype } => dtype.read(bytes, fp8_block_index(row, col, cols)),
        }
    }
}

/// A `[rows, cols]` weight matrix borrowed from the checkpoint.
#[derive(Clone, Copy, Debug)]
pub struct LinearWeight<'a> {
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData<'a>,
}

impl<'a> LinearWeight<'a> {
    /// A weight whose byte slices have exactly the lengths `rows × cols`
    /// implies for its format (and `cols` a multiple of the format's group).
    pub fn new(rows: usize, cols: usize, data: WeightData<'a>) -> Result<Self, QuantError> {
        let weight = LinearWeight { rows, cols, data };
        // Checking the largest product (4 bytes per F32 element) once keeps
        // every smaller one below from overflowing.
        let elements = rows
            .checked_mul(cols)
            .filter(|e| e.checked_mul(4).is_some())
            .ok_or(QuantError::Overflow { rows, cols })?;
        match data {
            WeightData::F32(bytes) => check_len("F32 weight", elements * 4, bytes.len())?,
            WeightData::Bf16(bytes) => check_len("BF16 weight", elements * 2, bytes.len())?,
            WeightData::Nvfp4 { packed, scales, .. } => {
                ensure_grouped(cols, NVFP4_GROUP)?;
                check_len("NVFP4 packed codes", elements / 2, packed.len())?;
                check_len("NVFP4 scales", elements / NVFP4_GROUP, scales.len())?;
            }
            WeightData::Mxfp4 { blocks, scales } => {
                ensure_grouped(cols, MXFP4_GROUP)?;
                check_len("MXFP4 blocks", elements / 2, blocks.len())?;
                check_len("MXFP4 scales", elements / MXFP4_GROUP, scales.len())?;
            }
            WeightData::Fp8 { values, scales } => {
                check_len("FP8 values", elements, values.len())?;
                if let Fp8Scales::Block { bytes, dtype } = scales {
                    let blocks = rows.div_ceil(FP8_BLOCK) * cols.div_ceil(FP8_BLOCK);
                    check_len("FP8 block scales", blocks * dtype.bytes(), bytes.len())?;
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
                    return Err(QuantError::Ungrouped {
                        cols: group,
                        group: INT4_PER_WORD,
                    });
                }
                ensure_grouped(cols, group)?;
                ensure_grouped(rows, INT4_PER_WORD)?;
                check_len("INT4 qweight", elements / 2, qweight.len())?;
                check_len("INT4 qzeros", elements / group / 2, qzeros.len())?;
                check_len("INT4 scales", elements / group * 2, scales.len())?;
            }
        }
        Ok(weight)
    }

    /// Decodes row `row` (one output feature, `cols` values) into `out` in
    /// f32 (the rules of `crate::formats`).
    pub fn decode_row(&self, row: usize, out: &mut [f32]) -> Result<(), QuantError> {
        if row >= self.rows {
            return Err(QuantError::RowOutOfRange {
                row,
                rows: self.rows,
            });
        }
        check_len("output row", self.cols, out.len())?;
        let cols = self.cols;
        match self.data {
            WeightData::F32(bytes) => {
                let row_bytes = row_slice(bytes, row, cols * 4, "F32 weight")?;
                for (i, value) in out.iter_mut().enumerate() {
                    *value = read_f32(row_bytes, i);
                }
            }
            WeightData::Bf16(bytes) => {
                let row_bytes = row_slice(bytes, row, cols * 2, "BF16 weight")?;
                for (i, value) in out.iter_mut().enumerate() {
                    *value = read_bf16(row_bytes, i);
                }
            }
            WeightData::Nvfp4 {
                packed,
                scales,
                global,
            } => {
                let groups = cols / NVFP4_GROUP;
                let packed = row_slice(packed, row, cols / 2, "NVFP4 packed codes")?;
                let scales = row_slice(scales, row, groups, "NVFP4 scales")?;
                quant::decode_nvfp4_row(packed, scales, global, out)?;
            }
            WeightData::Mxfp4 { blocks, scales } => {
                let groups = cols / MXFP4_GROUP;
                let blocks = row_slice(blocks, row, cols / 2, "MXFP4 blocks")?;
                let scales = row_slice(scales, row, groups, "MXFP4 scales")?;
                quant::decode_mxfp4_row(blocks, scales, out)?;
            }
            WeightData::Fp8 { values, scales } => {
                let values = row_slice(values, row, cols, "FP8 values")?;
                for (col, (value, &byte)) in out.iter_mut().zip(values).enumerate() {
                    *value = fp8_value(byte, scales.at(row, col, cols));
                }
            }
            WeightData::Int4 {
                qweight,
                qzeros,
                scales,
                group,
                zero_offset,
            } => {
                for (col, value) in out.iter_mut().enumerate() {
                    *value = int4_element(
                        qweight,
                        qzeros,
                        scales,
                        group,
                        zero_offset,
                        self.rows,
                        row,
                        col,
                    );
                }
            }
        }
        Ok(())
    }
}

fn ensure_grouped(cols: usize, group: usize) -> Result<(), QuantError> {
    if cols.is_multiple_of(group) {
        Ok(())
    } else {
        Err(QuantError::Ungrouped { cols, group })
    }
}

/// Row `row` of a matrix stored as rows of `row_len` bytes, or a length error
/// naming `what`.
fn row_slice<'a>(
    bytes: &'a [u8],
    row: usize,
    row_len: usize,
    what: &'static str,
) -> Result<&'a [u8], QuantError> {
    let range = row
        .checked_mul(row_len)
        .and_then(|start| Some(start..start.checked_add(row_len)?));
    range
        .and_then(|range| bytes.get(range))
        .ok_or(QuantError::RowLength {
            what,
            expected: row.saturating_add(1).saturating_mul(row_len),
            found: bytes.len(),
        })
}

/// Element type and bytes of a 1-D weight (a norm, a bias, attention sinks).
#[derive(Clone, Copy, Debug)]
pub enum VectorData<'a> {
    /// Little-endian f32, `len × 4` bytes.
    F32(&'a [u8]),
    /// Little-endian bf16, `len × 2` bytes.
    Bf16(&'a [u8]),
}

/// A 1-D weight borrowed from the checkpoint.
#[derive(Clone, Copy, Debug)]
pub struct VectorWeight<'a> {
    pub len: usize,
    pub data: VectorData<'a>,
    /// Added to every stored value when it is read: 1 for a zero-centred
    /// RMSNorm weight (`x̂ · (1 + w)`, Qwen3.5), 0 otherwise. The weight
    /// says it once, where it is loaded, so no op adds it twice.
    pub offset: f32,
}

impl<'a> VectorWeight<'a> {
    /// A weight read as stored.
    pub fn new(len: usize, data: VectorData<'a>) -> VectorWeight<'a> {
        VectorWeight {
            len,
            data,
            offset: 0.0,
        }
    }

    /// The weight of a zero-centred RMSNorm: read as `1 + w`.
    pub fn zero_centred(self) -> VectorWeight<'a> {
        VectorWeight {
            offset: 1.0,
            ..self
        }
    }

    /// Element `i` as f32 (`i < len`), the offset added.
    pub fn get(&self, i: usize) -> f32 {
        let stored = match self.data {
            VectorData::F32(b) => read_f32(b, i),
            VectorData::Bf16(b) => read_bf16(b, i),
        };
        stored + self.offset
    }
}
