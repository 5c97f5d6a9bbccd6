//! What the CUDA driver, NVRTC and the device can fail with, and how a
//! backend op reports it.

use thiserror::Error;

use crate::backend::error::BackendError;

#[derive(Clone, Debug, Error)]
pub enum CudaError {
    #[error("{0}")]
    Unavailable(String),
    #[error("NVRTC is unavailable: {0}")]
    NvrtcMissing(String),
    #[error("{call} failed: {error}")]
    Driver { call: &'static str, error: String },
    #[error("allocating {bytes} bytes on the device failed: {error}")]
    OutOfMemory { bytes: u64, error: String },
    #[error("compiling {file} failed:\n{log}")]
    Compile { file: String, log: String },
    #[error("{0}")]
    Bounds(String),
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> BackendError {
        match e {
            CudaError::Unavailable(_) | CudaError::NvrtcMissing(_) => {
                BackendError::Unavailable(e.to_string())
            }
            other => BackendError::Kernel(other.to_string()),
        }
    }
}
