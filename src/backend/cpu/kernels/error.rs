//! The one error type of the kernels: shapes that do not fit together.

use super::isa::Isa;

/// Errors of the matmul entry points: shapes that do not fit together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    #[error("{format} weight [{rows}, {cols}]: {part} has {got} bytes, expected {expected}")]
    WeightBytes {
        format: &'static str,
        part: &'static str,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("{format} weight needs cols to be a multiple of {multiple}, got {cols}")]
    ColsNotBlockMultiple {
        format: &'static str,
        multiple: usize,
        cols: usize,
    },
    #[error("weight shape [{rows}, {cols}] overflows usize")]
    ShapeOverflow { rows: usize, cols: usize },
    #[error("{what} has {got} values, expected {tokens} tokens × {width} = {expected}")]
    Length {
        what: &'static str,
        tokens: usize,
        width: usize,
        expected: usize,
        got: usize,
    },
    #[error("quantized activations need room for {needed} values, the scratch holds {capacity}")]
    ScratchTooSmall { needed: usize, capacity: usize },
    #[error("instruction set {0:?} is not available on this CPU")]
    IsaUnavailable(Isa),
}
