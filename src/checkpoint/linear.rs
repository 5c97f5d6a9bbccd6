//! A linear layer's weight as it lies in the mapped checkpoint, in one of the
//! formats sparkrt computes on directly (never expanded into a dequantized copy).
//!
//! All byte slices borrow from the checkpoint's memory map: the mapping outlives
//! every weight. Slices may be misaligned; readers use unaligned loads.

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
}

/// A `[rows, cols]` weight matrix borrowed from the checkpoint.
#[derive(Clone, Copy, Debug)]
pub struct LinearWeight<'a> {
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData<'a>,
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
}

impl VectorWeight<'_> {
    /// Element `i` as f32 (`i < len`).
    pub fn get(&self, i: usize) -> f32 {
        match self.data {
            VectorData::F32(b) => {
                f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
            }
            VectorData::Bf16(b) => {
                f32::from_bits(u32::from(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])) << 16)
            }
        }
    }
}
