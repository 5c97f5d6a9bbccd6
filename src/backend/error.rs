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
    /// The device can run nothing more (a sticky CUDA error: an illegal
    /// address, a failed launch): every later call fails the same way, so
    /// the process must restart ([`BackendError::is_fatal`]).
    #[error("the device is lost, the process must restart: {0}")]
    DeviceLost(String),
    /// An op this backend does not have yet (Gated DeltaNet on CUDA).
    #[error("{what} is not supported on the {backend} backend yet")]
    NotSupported {
        backend: &'static str,
        what: &'static str,
    },
}

impl BackendError {
    /// Whether no later op can succeed in this process (the device is lost):
    /// the server stops serving instead of failing request after request.
    pub fn is_fatal(&self) -> bool {
        matches!(self, BackendError::DeviceLost(_))
    }

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
