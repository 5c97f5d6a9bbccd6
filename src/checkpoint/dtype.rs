//! Element types a safetensors header may name, and their sizes.

use std::fmt;

/// A safetensors dtype with a whole number of bytes per element.
///
/// Sub-byte dtypes (`F4`, `F6_*`) are not accepted: the formats sparkrt reads
/// store FP4 codes packed into `U8` tensors, and a sub-byte element count
/// would make `shape × size == byte length` ambiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    Bf16,
    F32,
    F64,
    /// FP8 with 4 exponent and 3 mantissa bits, no infinities (`e4m3fn`).
    F8E4M3,
    /// FP8 with 5 exponent and 2 mantissa bits.
    F8E5M2,
    /// OCP MX scale: an 8-bit exponent, value 2^(byte − 127), 0xFF NaN
    /// (`crate::formats::e8m0_to_f32`).
    F8E8M0,
}

impl Dtype {
    const ALL: [Dtype; 16] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::U16,
        Dtype::I16,
        Dtype::U32,
        Dtype::I32,
        Dtype::U64,
        Dtype::I64,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::F32,
        Dtype::F64,
        Dtype::F8E4M3,
        Dtype::F8E5M2,
        Dtype::F8E8M0,
    ];

    /// The dtype's spelling in a safetensors header.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::U16 => "U16",
            Dtype::I16 => "I16",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::U64 => "U64",
            Dtype::I64 => "I64",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E8M0 => "F8_E8M0",
        }
    }

    /// Parses a header's dtype string; `None` for anything unknown.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::F8E8M0 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    /// Whether the dtype holds real-valued weights (as opposed to integer
    /// codes or FP8 scales).
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::Bf16 | Dtype::F32 | Dtype::F64)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::from_name(d.name()), Some(d));
        }
        assert_eq!(Dtype::from_name("bf16"), None);
        assert_eq!(Dtype::from_name("F4"), None);
        assert_eq!(Dtype::from_name(""), None);
    }
}
