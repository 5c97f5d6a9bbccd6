//! Where a model's weights come from: an open checkpoint (the only source
//! in production; `--load-format dummy` writes a random one first).

use super::error::ModelError;
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::linear::{LinearWeight, VectorData, VectorWeight, WeightData};
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
    /// Rows `first..first + rows` of expert `expert` of a stacked BF16
    /// tensor `[experts, rows, cols]`, as a `[rows, cols]` weight
    /// (Qwen3.5's `mlp.experts.gate_up_proj`: gate rows, then up rows).
    fn stacked_rows(
        &self,
        tensor: &str,
        expert: usize,
        first: usize,
        rows: usize,
    ) -> Result<LinearWeight<'_>, ModelError>;
    /// A tensor of any shape as its flat values (a `[channels, 1, kernel]`
    /// convolution weight).
    fn flat_vector(&self, tensor: &str) -> Result<VectorWeight<'_>, ModelError>;
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

    fn stacked_rows(
        &self,
        tensor: &str,
        expert: usize,
        first: usize,
        rows: usize,
    ) -> Result<LinearWeight<'_>, ModelError> {
        let view = self.checkpoint.tensor(tensor)?;
        let &[experts, all_rows, cols] = view.shape() else {
            return Err(view.wrong_shape("[experts, rows, cols]").into());
        };
        if view.dtype() != Dtype::Bf16 {
            return Err(CheckpointError::WrongDtype {
                path: view.path().to_path_buf(),
                tensor: view.name().to_string(),
                found: view.dtype(),
                expected: "BF16 (stacked experts)".to_string(),
            }
            .into());
        }
        if expert >= experts || first + rows > all_rows {
            return Err(view
                .wrong_shape(&format!(
                    "at least {} experts of {} rows",
                    expert + 1,
                    first + rows
                ))
                .into());
        }
        // The checker matched the shape to the bytes: the range is inside.
        let row_bytes = cols * 2;
        let start = (expert * all_rows + first) * row_bytes;
        let bytes = view
            .bytes()
            .get(start..start + rows * row_bytes)
            .unwrap_or_default();
        LinearWeight::new(rows, cols, WeightData::Bf16(bytes)).map_err(|source| {
            CheckpointError::Quant {
                path: view.path().to_path_buf(),
                tensor: view.name().to_string(),
                source,
            }
            .into()
        })
    }

    fn flat_vector(&self, tensor: &str) -> Result<VectorWeight<'_>, ModelError> {
        let view = self.checkpoint.tensor(tensor)?;
        vector_of(&view, view.bytes())
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
    Ok(VectorWeight::new(len, data))
}
