//! What a backend op can fail with.

use thiserror::Error;

use crate::plan::ledger::LedgerError;

#[derive(Debug, Error)]
pub enum BackendError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("{0}")]
    Shape(String),
    #[error("kernel failed: {0}")]
    Kernel(String),
    #[error("{what} needs {needed} elements but its buffer holds {capacity}")]
    Capacity {
        what: &'static str,
        needed: usize,
        capacity: usize,
    },
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// An op this backend does not have yet (Gated DeltaNet on CUDA).
    #[error("{what} is not supported on the {backend} backend yet")]
    NotSupported {
        backend: &'static str,
        what: &'static str,
    },
}

impl BackendError {
    /// An error when `needed` elements do not fit a buffer of `capacity`.
    pub(crate) fn check_capacity(
        what: &'static str,
        needed: usize,
        capacity: usize,
    ) -> Result<(), BackendError> {
        if needed > capacity {
            return Err(BackendError::Capacity {
                what,
                needed,
                capacity,
            });
        }
        Ok(())
    }
}
