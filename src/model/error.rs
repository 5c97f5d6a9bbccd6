//! What can go wrong building or running a model.

use thiserror::Error;

use crate::backend::BackendError;
use crate::checkpoint::CheckpointError;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("{0}")]
    Unsupported(String),
    #[error(
        "step of {rows} tokens and {seqs} sequences exceeds the planned {max_rows} tokens / {max_seqs} sequences"
    )]
    StepTooLarge {
        rows: usize,
        seqs: usize,
        max_rows: usize,
        max_seqs: usize,
    },
}

impl ModelError {
    /// Whether nothing can run any more in this process (a lost device).
    pub fn is_fatal(&self) -> bool {
        matches!(self, ModelError::Backend(e) if e.is_fatal())
    }
}
