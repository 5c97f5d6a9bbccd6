//! What the CUDA driver, NVRTC and the device can fail with, and how a
//! backend op reports it.

use cudarc::driver::sys;
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
    /// A sticky error ([`is_sticky`]): the context is dead. `kernel` is the
    /// launch that faulted when known (`SPARKRT_CUDA_SYNC=1` synchronises
    /// after every launch to know it); otherwise the error surfaced at a
    /// later call, asynchronously, from some earlier launch.
    #[error("{call} failed: {error} ({})", match kernel {
        Some(k) => format!("in kernel {k}"),
        None => format!("from an earlier launch; {} names the kernel", SYNC_ENV),
    })]
    Fault {
        call: &'static str,
        error: String,
        kernel: Option<&'static str>,
    },
    #[error("allocating {bytes} bytes on the device failed: {error}")]
    OutOfMemory { bytes: u64, error: String },
    #[error("compiling {file} failed:\n{log}")]
    Compile { file: String, log: String },
    #[error("{0}")]
    Bounds(String),
}

/// Set to 1, every kernel launch is followed by a synchronisation, so a
/// fault names the kernel that caused it (slow: for diagnosis).
pub const SYNC_ENV: &str = "SPARKRT_CUDA_SYNC";

/// Whether a driver result leaves the context unusable: after these every
/// later call on the context fails too (the CUDA documentation's "the
/// process must be terminated and relaunched").
pub fn is_sticky(code: sys::CUresult) -> bool {
    use sys::CUresult as R;
    matches!(
        code,
        R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_ECC_UNCORRECTABLE
    )
}

impl CudaError {
    /// This error, naming `kernel` if it is a fault.
    pub fn in_kernel(self, kernel: &'static str) -> CudaError {
        match self {
            CudaError::Fault { call, error, .. } => CudaError::Fault {
                call,
                error,
                kernel: Some(kernel),
            },
            other => other,
        }
    }
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> BackendError {
        match e {
            CudaError::Unavailable(_) | CudaError::NvrtcMissing(_) => {
                BackendError::Unavailable(e.to_string())
            }
            CudaError::Fault { .. } => BackendError::DeviceLost(e.to_string()),
            other => BackendError::Kernel(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_errors_lose_the_device_and_others_do_not() {
        use sys::CUresult as R;
        for code in [R::CUDA_ERROR_ILLEGAL_ADDRESS, R::CUDA_ERROR_LAUNCH_FAILED] {
            assert!(is_sticky(code), "{code:?}");
        }
        for code in [
            R::CUDA_ERROR_OUT_OF_MEMORY,
            R::CUDA_ERROR_INVALID_VALUE,
            R::CUDA_ERROR_NOT_SUPPORTED,
        ] {
            assert!(!is_sticky(code), "{code:?}");
        }
        let fault = CudaError::Fault {
            call: "cuStreamSynchronize",
            error: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            kernel: None,
        };
        assert!(
            fault
                .to_string()
                .contains("SPARKRT_CUDA_SYNC names the kernel")
        );
        let named = fault.in_kernel("rmsnorm");
        assert_eq!(
            named.to_string(),
            "cuStreamSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (in kernel rmsnorm)"
        );
        let lost = BackendError::from(named);
        assert!(lost.is_fatal(), "{lost}");
        assert!(lost.to_string().contains("in kernel rmsnorm"), "{lost}");
        let other = BackendError::from(CudaError::Driver {
            call: "cuMemcpyHtoDAsync",
            error: "CUDA_ERROR_INVALID_VALUE".into(),
        });
        assert!(!other.is_fatal(), "{other}");
    }
}
