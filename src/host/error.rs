//! What can go wrong reading the host, and the one way a host file is read.
//!
//! Every host file goes through the checked reader of the model files
//! ([`crate::util::files::read_regular`]): a FIFO as `proc/meminfo` or
//! `/dev/zero` as the kubelet configuration is refused at once, naming the
//! file, instead of blocking the start (or the memory guard's thread) on the
//! open or reading without end. `/proc` files are regular files whose
//! `fstat` size is 0; the reader's cap holds on what is read, not on the
//! size reported.

use std::io::ErrorKind;
use std::path::Path;

use thiserror::Error;

use crate::limits::MAX_HOST_FILE_BYTES;
use crate::units::QuantityError;
use crate::util::files::read_regular_to_string;

#[derive(Debug, Error)]
pub enum HostError {
    #[error("cannot read {file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}:{line}: {why}")]
    Malformed {
        file: String,
        line: usize,
        why: String,
    },
    #[error("{file}: field {field} is missing")]
    MissingField { file: String, field: String },
    #[error("{file}: {why}")]
    Inconsistent { file: String, why: String },
    #[error("{file}:{line}:{column}: not valid YAML: {why}")]
    Yaml {
        file: String,
        line: usize,
        column: usize,
        why: String,
    },
    #[error("{file}: {key}: {source}")]
    Quantity {
        file: String,
        key: String,
        source: QuantityError,
    },
}

/// Reads a host file that must exist.
pub(crate) fn read_host_file(path: &Path) -> Result<String, HostError> {
    read_regular_to_string(path, MAX_HOST_FILE_BYTES).map_err(|source| HostError::Read {
        file: path.display().to_string(),
        source,
    })
}

/// Reads a host file that may legitimately be absent.
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, HostError> {
    match read_host_file(path) {
        Ok(text) => Ok(Some(text)),
        Err(HostError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
