//! Scalar reference decoders for the quantized formats (see FORMATS.md):
//! FP4 E2M1 codes, FP8 E4M3 and E8M0 scales, and whole NVFP4 / MXFP4 rows.
//!
//! These are the definitions the SIMD and CUDA kernels are tested against, so
//! they favour obviousness over speed. Every value is exact in f32.

/// Elements sharing one NVFP4 scale.
pub const NVFP4_GROUP: usize = 16;
/// Elements sharing one MXFP4 scale (one 16-byte block).
pub const MXFP4_GROUP: usize = 32;
/// Bytes of packed codes per MXFP4 block.
pub const MXFP4_BLOCK_BYTES: usize = MXFP4_GROUP / 2;

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

/// Magnitudes of the E2M1 codes 0..=7 (bit 3 is the sign).
const E2M1_MAGNITUDE: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Decodes an FP4 E2M1 code (low 4 bits of `code`; higher bits ignored).
pub fn e2m1_to_f32(code: u8) -> f32 {
    let magnitude = E2M1_MAGNITUDE[usize::from(code & 0x7)];
    if code & 0x8 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// Decodes FP8 E4M3 as stored by ModelOpt (`float8_e4m3fn`): exponent bias 7,
/// no infinities, `S.1111.111` is NaN, largest finite value 448.
pub fn e4m3_to_f32(byte: u8) -> f32 {
    let negative = byte & 0x80 != 0;
    let exponent = u32::from((byte >> 3) & 0xF);
    let mantissa = u32::from(byte & 0x7);
    if exponent == 0xF && mantissa == 0x7 {
        return f32::NAN;
    }
    let magnitude = if exponent == 0 {
        // Subnormal: mantissa × 2^-9 (0.mmm × 2^(1−7)).
        mantissa as f32 / 512.0
    } else {
        // Normal: rebias the exponent (−7 + 127) and widen the mantissa.
        f32::from_bits(((exponent + 120) << 23) | (mantissa << 20))
    };
    if negative { -magnitude } else { magnitude }
}

/// Decodes an E8M0 scale: 2^(byte − 127); 255 is NaN (OCP MX v1.0).
pub fn e8m0_to_f32(byte: u8) -> f32 {
    match byte {
        0xFF => f32::NAN,
        // 2^-127 is below f32's normal range: its bit pattern is subnormal.
        0 => f32::from_bits(0x0040_0000),
        _ => f32::from_bits(u32::from(byte) << 23),
    }
}

/// The two E2M1 codes of a packed byte: (element 2j, element 2j+1).
fn nibbles(byte: u8) -> (u8, u8) {
    (byte & 0x0F, byte >> 4)
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
    for (k, pair) in out.chunks_exact_mut(2).enumerate() {
        let (even, odd) = nibbles(packed[k]);
        let scale = e4m3_to_f32(scales[2 * k / NVFP4_GROUP]);
        // (code × scale) is exact in f32 (2 + 4 significant bits), so the
        // only rounding is the final multiply by the global scale.
        pair[0] = e2m1_to_f32(even) * scale * global;
        pair[1] = e2m1_to_f32(odd) * scale * global;
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
    for (k, pair) in out.chunks_exact_mut(2).enumerate() {
        let (even, odd) = nibbles(blocks[k]);
        let scale = e8m0_to_f32(scales[2 * k / MXFP4_GROUP]);
        pair[0] = e2m1_to_f32(even) * scale;
        pair[1] = e2m1_to_f32(odd) * scale;
    }
    Ok(())
}
