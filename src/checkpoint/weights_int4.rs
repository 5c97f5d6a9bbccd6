//! GPTQ INT4 linear weights (`qweight`, `qzeros`, `scales`, optional
//! `g_idx`), borrowed in the checkpoint's input-major layout and validated
//! strictly: dtypes, shapes, the group size, the zero points of a
//! symmetric checkpoint, and that `g_idx` (when present) is the identity
//! grouping `c / group` (a permuting one is act-order, which is not read).

use super::dtype::Dtype;
use super::error::CheckpointError;
use super::linear::{LinearWeight, WeightData};
use super::mapped::Checkpoint;
use super::view::TensorView;
use super::weights::{checked, matrix};
use crate::formats::{INT4_PER_WORD, int4_code, int4_zero, read_u32};

/// The zero point every row of a symmetric 4-bit checkpoint has (2^(4−1)).
pub const INT4_SYMMETRIC_ZERO: i32 = 8;

impl Checkpoint {
    /// Module `module` stored as GPTQ INT4 with `group` input columns per
    /// scale (the config's `group_size`).
    pub(super) fn int4(
        &self,
        module: &str,
        group: usize,
        sym: bool,
        zero_offset: u8,
    ) -> Result<LinearWeight<'_>, CheckpointError> {
        let qweight = self.tensor(&format!("{module}.qweight"))?;
        qweight.expect_dtype(Dtype::I32)?;
        let [packed_in, rows] = matrix(&qweight, "[in/8, out]")?;
        let cols = packed_in * INT4_PER_WORD;
        if group == 0 || !group.is_multiple_of(INT4_PER_WORD) || !cols.is_multiple_of(group) {
            return Err(qweight.wrong_shape(&format!(
                "[in/8, out] with `in` a multiple of the group size {group} (itself a multiple of 8)"
            )));
        }
        if !rows.is_multiple_of(INT4_PER_WORD) {
            return Err(qweight.wrong_shape("[in/8, out] with `out` a multiple of 8"));
        }
        let groups = cols / group;
        let qzeros = self.tensor(&format!("{module}.qzeros"))?;
        qzeros.expect_dtype(Dtype::I32)?;
        qzeros.expect_shape(&[groups, rows / INT4_PER_WORD])?;
        let scales = self.tensor(&format!("{module}.scales"))?;
        scales.expect_dtype(Dtype::F16)?;
        scales.expect_shape(&[groups, rows])?;
        let g_idx_name = format!("{module}.g_idx");
        if self.contains(&g_idx_name) {
            let g_idx = self.tensor(&g_idx_name)?;
            g_idx.expect_dtype(Dtype::I32)?;
            g_idx.expect_shape(&[cols])?;
            identity_grouping(&g_idx, group)?;
        }
        if sym {
            symmetric_zeros(&qzeros, zero_offset)?;
        }
        let data = WeightData::Int4 {
            qweight: qweight.bytes(),
            qzeros: qzeros.bytes(),
            scales: scales.bytes(),
            group,
            zero_offset,
        };
        checked(&qweight, rows, cols, data)
    }
}

fn bad(view: &TensorView<'_>, reason: String) -> CheckpointError {
    CheckpointError::BadValues {
        path: view.path().to_path_buf(),
        tensor: view.name().to_string(),
        reason,
    }
}

/// `g_idx[c] == c / group` for every column: groups of consecutive columns.
fn identity_grouping(g_idx: &TensorView<'_>, group: usize) -> Result<(), CheckpointError> {
    let bytes = g_idx.bytes();
    for c in 0..bytes.len() / 4 {
        let found = read_u32(bytes, c) as i32;
        if i64::from(found) != (c / group) as i64 {
            return Err(bad(
                g_idx,
                format!(
                    "column {c} is in group {found}, not {} (act-order / desc_act permutations are not supported)",
                    c / group
                ),
            ));
        }
    }
    Ok(())
}

/// Every zero point of a symmetric checkpoint is 8.
fn symmetric_zeros(qzeros: &TensorView<'_>, offset: u8) -> Result<(), CheckpointError> {
    let bytes = qzeros.bytes();
    for w in 0..bytes.len() / 4 {
        let word = read_u32(bytes, w);
        for n in 0..INT4_PER_WORD {
            let zero = int4_zero(int4_code(word, n), offset);
            if zero != INT4_SYMMETRIC_ZERO {
                return Err(bad(
                    qzeros,
                    format!(
                        "zero point {zero} (word {w}, nibble {n}) in a symmetric (sym: true) checkpoint, whose zero points are all {INT4_SYMMETRIC_ZERO}"
                    ),
                ));
            }
        }
    }
    Ok(())
}
