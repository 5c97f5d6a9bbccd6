//! Whole NVFP4 / MXFP4 rows decoded to f32, with their lengths checked: what
//! `LinearWeight::decode_row` (the CPU embedding gather) uses. The element
//! rules are `crate::formats`'; this file only walks rows.

use crate::formats::{MXFP4_GROUP, NVFP4_GROUP, mxfp4_value, nvfp4_value, read_nibble};

/// A row whose pieces do not fit together.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{what}: expected {expected} bytes/elements, got {found}")]
    RowLength {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("row length {cols} is not a multiple of the {group}-element group")]
    Ungrouped { cols: usize, group: usize },
    #[error("a {rows} × {cols} matrix is too large to address")]
    Overflow { rows: usize, cols: usize },
    #[error("row {row} out of range ({rows} rows)")]
    RowOutOfRange { row: usize, rows: usize },
}

/// An error naming `what` unless it holds exactly `expected` bytes or values.
pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), QuantError> {
    if expected == found {
        Ok(())
    } else {
        Err(QuantError::RowLength {
            what,
            expected,
            found,
        })
    }
}

/// Decodes one NVFP4 row of `out.len()` elements: `packed` holds `cols/2`
/// bytes (low nibble = even element), `scales` `cols/16` E4M3 bytes, `global`
/// is `weight_scale_2`. Element k = e2m1(code k) × e4m3(scales[k/16]) × global.
pub fn decode_nvfp4_row(
    packed: &[u8],
    scales: &[u8],
    global: f32,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let cols = out.len();
    if !cols.is_multiple_of(NVFP4_GROUP) {
        return Err(QuantError::Ungrouped {
            cols,
            group: NVFP4_GROUP,
        });
    }
    check_len("NVFP4 packed codes", cols / 2, packed.len())?;
    check_len("NVFP4 scales", cols / NVFP4_GROUP, scales.len())?;
    for (k, value) in out.iter_mut().enumerate() {
        *value = nvfp4_value(
            read_nibble(packed, k) as u8,
            scales[k / NVFP4_GROUP],
            global,
        );
    }
    Ok(())
}

/// Decodes one MXFP4 row of `out.len()` elements: `blocks` holds `cols/32`
/// blocks of 16 bytes (low nibble first), `scales` `cols/32` E8M0 bytes.
/// Element k = e2m1(code k) × 2^(scales[k/32] − 127).
pub fn decode_mxfp4_row(blocks: &[u8], scales: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let cols = out.len();
    if !cols.is_multiple_of(MXFP4_GROUP) {
        return Err(QuantError::Ungrouped {
            cols,
            group: MXFP4_GROUP,
        });
    }
    check_len("MXFP4 blocks", cols / 2, blocks.len())?;
    check_len("MXFP4 scales", cols / MXFP4_GROUP, scales.len())?;
    for (k, value) in out.iter_mut().enumerate() {
        *value = mxfp4_value(read_nibble(blocks, k) as u8, scales[k / MXFP4_GROUP]);
    }
    Ok(())
}
