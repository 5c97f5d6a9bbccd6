//! Where a model's weights come from: an open checkpoint (the only source
//! in production; `--load-format dummy` writes a random one first).

use super::ModelError;
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::linear::{LinearWeight, VectorData, VectorWeight};
use crate::checkpoint::{Checkpoint, CheckpointError, Dtype, TensorView};

/// Weights by name, borrowed from wherever they live.
pub trait WeightSource: Sync {
    /// The weight of linear module `module` (`X` for tensor `X.weight`).
    fn linear(&self, module: &str) -> Result<LinearWeight<'_>, ModelError>;
    /// A 1-D tensor.
    fn vector(&self, tensor: &str) -> Result<VectorWeight<'_>, ModelError>;
    /// Row `row` of a 2-D tensor (stacked per-expert biases).
    fn vector_row(&self, tensor: &str, row: usize) -> Result<VectorWeight<'_>, ModelError>;
    /// Expert `expert` of stacked MXFP4 experts (`X_blocks`, `X_scales`).
    fn stacked_expert(&self, prefix: &str, expert: usize) -> Result<LinearWeight<'_>, ModelError>;
}

/// An open checkpoint and its config.
pub struct CheckpointSource<'c> {
    pub checkpoint: &'c Checkpoint,
    pub config: &'c ModelConfig,
}

impl WeightSource for CheckpointSource<'_> {
    fn linear(&self, module: &str) -> Result<LinearWeight<'_>, ModelError> {
        Ok(self.checkpoint.linear(self.config, module)?)
    }

    fn vector(&self, tensor: &str) -> Result<VectorWeight<'_>, ModelError> {
        let view = self.checkpoint.tensor(tensor)?;
        if view.shape().len() != 1 {
            return Err(view.wrong_shape("[n]").into());
        }
        vector_of(&view, view.bytes())
    }

    fn vector_row(&self, tensor: &str, row: usize) -> Result<VectorWeight<'_>, ModelError> {
        let view = self.checkpoint.tensor(tensor)?;
        let &[rows, _] = view.shape() else {
            return Err(view.wrong_shape("[rows, n]").into());
        };
        if row >= rows {
            return Err(view
                .wrong_shape(&format!("at least {} rows", row + 1))
                .into());
        }
        let row_bytes = view.bytes().len() / rows;
        let bytes = view
            .bytes()
            .get(row * row_bytes..(row + 1) * row_bytes)
            .unwrap_or_default();
        vector_of(&view, bytes)
    }

    fn stacked_expert(&self, prefix: &str, expert: usize) -> Result<LinearWeight<'_>, ModelError> {
        Ok(self.checkpoint.mxfp4_expert(prefix, expert)?)
    }
}

fn vector_of<'a>(view: &TensorView<'a>, bytes: &'a [u8]) -> Result<VectorWeight<'a>, ModelError> {
    let (len, data) = match view.dtype() {
        Dtype::Bf16 => (bytes.len() / 2, VectorData::Bf16(bytes)),
        Dtype::F32 => (bytes.len() / 4, VectorData::F32(bytes)),
        found => {
            return Err(CheckpointError::WrongDtype {
                path: view.path().to_path_buf(),
                tensor: view.name().to_string(),
                found,
                expected: "BF16 or F32".to_string(),
            }
            .into());
        }
    };
    Ok(VectorWeight { len, data })
}
