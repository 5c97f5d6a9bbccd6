//! The one table of byte → value cases every decoder of the number formats
//! must pass (`sparkrt::formats`, the checkpoint's row decoders, the CPU
//! kernels, the CUDA kernels): tests/formats.rs runs the CPU side,
//! tests/cuda_kernels.rs the CUDA side. Values by hand from the definitions
//! (docs/FORMATS.md): E2M1 codes, FP8 E4M3 (`float8_e4m3fn`) with its
//! zeros, subnormals, largest value and NaN, and E8M0 with both ends and
//! its NaN byte. The E4M3 cases serve twice more as FP8 weight values
//! (ModelOpt per-tensor and block-wise scales).
#![allow(dead_code)]

use sparkrt::checkpoint::linear::{Fp8Scales, LinearWeight, WeightData};
use sparkrt::formats::ScaleType;

/// The format a case's byte is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    E2M1,
    E4M3,
    E8M0,
    /// E4M3 bytes as FP8 weight values, one per-tensor scale of 1.
    Fp8,
    /// E4M3 bytes as FP8 weight values, f32 block scales of 1.
    Fp8Block,
}

/// A byte and the f32 it decodes to (NaN: any NaN).
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub kind: Kind,
    pub byte: u8,
    pub value: f32,
}

const fn case(kind: Kind, byte: u8, value: f32) -> Case {
    Case { kind, byte, value }
}

use Kind::{E2M1, E4M3, E8M0, Fp8, Fp8Block};

pub const CASES: &[Case] = &[
    // E2M1: every code; bit 3 is the sign, so code 8 is −0.
    case(E2M1, 0x0, 0.0),
    case(E2M1, 0x1, 0.5),
    case(E2M1, 0x2, 1.0),
    case(E2M1, 0x3, 1.5),
    case(E2M1, 0x4, 2.0),
    case(E2M1, 0x5, 3.0),
    case(E2M1, 0x6, 4.0),
    case(E2M1, 0x7, 6.0),
    case(E2M1, 0x8, -0.0),
    case(E2M1, 0x9, -0.5),
    case(E2M1, 0xA, -1.0),
    case(E2M1, 0xB, -1.5),
    case(E2M1, 0xC, -2.0),
    case(E2M1, 0xD, -3.0),
    case(E2M1, 0xE, -4.0),
    case(E2M1, 0xF, -6.0),
    // E4M3: S.EEEE.MMM, bias 7, exponent 0 subnormal (m × 2^-9), no
    // infinities, S.1111.111 NaN.
    case(E4M3, 0x00, 0.0),
    case(E4M3, 0x80, -0.0),
    case(E4M3, 0x01, 0.001_953_125),  // 2^-9, the smallest subnormal
    case(E4M3, 0x07, 0.013_671_875),  // 7 × 2^-9, the largest subnormal
    case(E4M3, 0x87, -0.013_671_875), // its negative
    case(E4M3, 0x08, 0.015_625),      // 2^-6, the smallest normal
    case(E4M3, 0x38, 1.0),
    case(E4M3, 0x3C, 1.5),
    case(E4M3, 0x40, 2.0),
    case(E4M3, 0xB8, -1.0),
    case(E4M3, 0x77, 240.0),
    case(E4M3, 0x7E, 448.0), // the largest finite value
    case(E4M3, 0xFE, -448.0),
    case(E4M3, 0x7F, f32::NAN),
    case(E4M3, 0xFF, f32::NAN),
    // E8M0: 2^(s − 127); 0x00 is 2^-127 (an f32 subnormal); 0xFF is NaN.
    case(E8M0, 0x00, f32::from_bits(0x0040_0000)),
    case(E8M0, 0x01, f32::from_bits(0x0080_0000)), // 2^-126
    case(E8M0, 0x7E, 0.5),
    case(E8M0, 0x7F, 1.0),
    case(E8M0, 0x80, 2.0),
    case(E8M0, 0x85, 64.0),
    case(E8M0, 0xFE, f32::from_bits(0x7F00_0000)), // 2^127
    case(E8M0, 0xFF, f32::NAN),
];

/// The cases of one format, in table order.
pub fn cases(kind: Kind) -> Vec<Case> {
    let table = if matches!(kind, Fp8 | Fp8Block) {
        E4M3
    } else {
        kind
    };
    CASES
        .iter()
        .filter(|c| c.kind == table)
        .map(|c| Case { kind, ..*c })
        .collect()
}

/// Whether a decoder's `got` is the case's value: the same bits (so −0 is
/// not 0), or both NaN (a GPU's NaN need not have the CPU's bits).
pub fn same(got: f32, want: f32) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else {
        got.to_bits() == want.to_bits()
    }
}

/// Columns of a case weight: several NVFP4 groups and MXFP4 blocks, and a
/// whole chunk of every SIMD decoder (64 for AVX2's NVFP4, 8 MXFP4 scales
/// for its grouped scale decoder).
pub const CASE_COLS: usize = 256;

/// A weight whose row `r` shows case `r` of one format as its element 0
/// (all other elements are code 0):
/// - E2M1: NVFP4, code = the case's byte, every scale 1.0 (E4M3 0x38);
/// - E4M3: NVFP4, code 2 (1.0), every scale of the row the case's byte;
/// - E8M0: MXFP4, code 2 (1.0), every scale of the row the case's byte;
/// - Fp8 / Fp8Block: FP8, value = the case's byte, every scale 1.0.
///
/// The global scale is 1, so element 0 of row r is exactly the case's value.
pub struct CaseWeight {
    pub kind: Kind,
    pub cases: Vec<Case>,
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
}

impl CaseWeight {
    pub fn new(kind: Kind) -> CaseWeight {
        let cases = cases(kind);
        if matches!(kind, Fp8 | Fp8Block) {
            return CaseWeight::fp8(kind, cases);
        }
        let group = if kind == E8M0 { 32 } else { 16 };
        let mut codes = Vec::new();
        let mut scales = Vec::new();
        for c in &cases {
            let mut row = vec![0u8; CASE_COLS / 2];
            // The low nibble of byte 0 is element 0.
            row[0] = if kind == E2M1 { c.byte } else { 0x2 };
            codes.extend(row);
            let scale = if kind == E2M1 { 0x38 } else { c.byte };
            scales.extend(std::iter::repeat_n(scale, CASE_COLS / group));
        }
        CaseWeight {
            kind,
            cases,
            codes,
            scales,
        }
    }

    fn fp8(kind: Kind, cases: Vec<Case>) -> CaseWeight {
        let mut codes = Vec::new();
        for c in &cases {
            let mut row = vec![0u8; CASE_COLS];
            row[0] = c.byte;
            codes.extend(row);
        }
        // f32 1.0 for each of the [⌈rows/128⌉, ⌈256/128⌉] blocks.
        let blocks = cases.len().div_ceil(128) * CASE_COLS.div_ceil(128);
        let scales = if kind == Fp8Block {
            1.0f32.to_le_bytes().repeat(blocks)
        } else {
            Vec::new()
        };
        CaseWeight {
            kind,
            cases,
            codes,
            scales,
        }
    }

    pub fn rows(&self) -> usize {
        self.cases.len()
    }

    pub fn view(&self) -> LinearWeight<'_> {
        let data = match self.kind {
            E8M0 => WeightData::Mxfp4 {
                blocks: &self.codes,
                scales: &self.scales,
            },
            Fp8 => WeightData::Fp8 {
                values: &self.codes,
                scales: Fp8Scales::Tensor(1.0),
            },
            Fp8Block => WeightData::Fp8 {
                values: &self.codes,
                scales: Fp8Scales::Block {
                    bytes: &self.scales,
                    dtype: ScaleType::F32,
                },
            },
            _ => WeightData::Nvfp4 {
                packed: &self.codes,
                scales: &self.scales,
                global: 1.0,
            },
        };
        LinearWeight {
            rows: self.rows(),
            cols: CASE_COLS,
            data,
        }
    }
}

// ---- the FP8 E4M3 encoder (the FP8 KV cache) ---------------------------------

/// f32 → E4M3 byte cases of `formats::f32_to_e4m3`, by hand from the
/// definition (round to nearest even, saturate at ±448, NaN keeps its sign);
/// tests/kv_fp8.rs also checks every f32 against torch's table.
pub const E4M3_ENCODE: &[(f32, u8)] = &[
    (0.0, 0x00),
    (-0.0, 0x80),
    (1.0, 0x38),
    (-1.0, 0xB8),
    (1.0625, 0x38), // halfway 1 (mantissa 000) and 1.125 (001): even 000
    (1.1875, 0x3A), // halfway 1.125 (001) and 1.25 (010): even 010
    (f32::from_bits(0x3F88_0001), 0x39), // one ulp past 1.0625: up
    (240.0, 0x77),
    (448.0, 0x7E),
    (464.0, 0x7E), // halfway to the (NaN) 480: saturates
    (1.0e9, 0x7E),
    (f32::INFINITY, 0x7E),
    (f32::NEG_INFINITY, 0xFE),
    (-500.0, 0xFE),
    (f32::NAN, 0x7F),
    (-f32::NAN, 0xFF),
    (0.001_953_125, 0x01),   // 2^-9, the smallest subnormal
    (0.000_976_562_5, 0x00), // 2^-10, halfway to it: even 0
    (0.002_929_687_5, 0x02), // 3 × 2^-10, halfway 1 and 2 units: even 2
    (0.014_648_437_5, 0x08), // 7.5 × 2^-9, halfway 7 and 8 units: 8 is 2^-6
    (0.015_625, 0x08),       // 2^-6, the smallest normal
    (1.0e-10, 0x00),
    (-1.0e-10, 0x80),
];
/// A GPTQ INT4 element: a 4-bit code, the stored 4-bit zero point and the
/// offset the checkpoint adds to it (1 for GPTQ v1, 0 for v2), the f16
/// scale's bits, and the value `(code − (stored + offset)) × scale`.
#[derive(Clone, Copy, Debug)]
pub struct Int4Case {
    pub code: u8,
    pub stored_zero: u8,
    pub zero_offset: u8,
    pub scale: u16,
    pub value: f32,
}

const fn int4(code: u8, stored_zero: u8, zero_offset: u8, scale: u16, value: f32) -> Int4Case {
    Int4Case {
        code,
        stored_zero,
        zero_offset,
        scale,
        value,
    }
}

/// By hand from the definition (docs/FORMATS.md, INT4).
pub const INT4_CASES: &[Int4Case] = &[
    int4(0x0, 7, 1, 0x3C00, -8.0),   // v1: stored 7 is zero 8; scale 1
    int4(0xF, 7, 1, 0x3800, 3.5),    // (15 − 8) × 0.5
    int4(0x9, 8, 0, 0x4000, 2.0),    // v2: stored 8 is zero 8; × 2
    int4(0x3, 15, 1, 0x3C00, -13.0), // v1 zero 16: (3 − 16) × 1
    int4(0xF, 0, 0, 0x3400, 3.75),   // v2 zero 0: 15 × 0.25
    int4(0xC, 7, 1, 0xBE00, -6.0),   // a negative scale: 4 × −1.5
    int4(0xA, 7, 1, 0x0001, 1.192_092_9e-7), // f16 subnormal 2^-24: 2 × 2^-24
    int4(0x9, 7, 1, 0x7BFF, 65504.0), // the largest f16: 1 × 65504
    int4(0x1, 3, 0, 0x3555, -0.666_503_9), // (1 − 3) × 0.33325195 (f16 0x3555)
];

/// Columns and group of an INT4 case weight: two groups of 32.
pub const INT4_CASE_COLS: usize = 64;
pub const INT4_CASE_GROUP: usize = 32;

/// An 8 × 64 GPTQ INT4 weight showing case `index` at one element (row and
/// column vary with `index` so every nibble position of `qweight` and
/// `qzeros` is exercised); every other element has its row's zero point as
/// its code, so it is 0.
pub struct Int4CaseWeight {
    pub case: Int4Case,
    pub row: usize,
    pub col: usize,
    pub qweight: Vec<u8>,
    pub qzeros: Vec<u8>,
    pub scales: Vec<u8>,
}

impl Int4CaseWeight {
    pub const ROWS: usize = 8;

    pub fn new(index: usize) -> Int4CaseWeight {
        let case = INT4_CASES[index];
        let (rows, cols, group) = (Self::ROWS, INT4_CASE_COLS, INT4_CASE_GROUP);
        let row = (index * 3) % rows;
        let col = 8 * (index % 8) + (index + 5) % 8;
        let groups = cols / group;
        // Every row stores the case's zero point (and offset) in every group.
        let zero = case.stored_zero & 0x0F;
        let code_of = |r: usize, c: usize| -> u32 {
            if (r, c) == (row, col) {
                u32::from(case.code)
            } else {
                // code = zero point: (z − z) × s = 0, when the zero fits 4 bits.
                u32::from((zero + case.zero_offset).min(15))
            }
        };
        let mut qweight = Vec::new();
        for k in 0..cols / 8 {
            for r in 0..rows {
                let word = (0..8).fold(0u32, |w, j| w | (code_of(r, 8 * k + j) << (4 * j)));
                qweight.extend(word.to_le_bytes());
            }
        }
        let mut qzeros = Vec::new();
        for _ in 0..groups {
            let word = (0..8).fold(0u32, |w, j| w | (u32::from(zero) << (4 * j)));
            qzeros.extend(word.to_le_bytes());
        }
        let mut scales = Vec::new();
        for _ in 0..groups * rows {
            scales.extend(case.scale.to_le_bytes());
        }
        Int4CaseWeight {
            case,
            row,
            col,
            qweight,
            qzeros,
            scales,
        }
    }

    pub fn view(&self) -> LinearWeight<'_> {
        LinearWeight::new(
            Self::ROWS,
            INT4_CASE_COLS,
            WeightData::Int4 {
                qweight: &self.qweight,
                qzeros: &self.qzeros,
                scales: &self.scales,
                group: INT4_CASE_GROUP,
                zero_offset: self.case.zero_offset,
            },
        )
        .unwrap()
    }
}
