//! What can go wrong reading the host, and the one way a host file that may
//! be absent is read.

use std::io::ErrorKind;
use std::path::Path;

use thiserror::Error;

use crate::units::QuantityError;

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

/// Reads a file that may legitimately be absent.
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, HostError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(HostError::Read {
            file: path.display().to_string(),
            source,
        }),
    }
}
