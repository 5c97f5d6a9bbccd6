//! FP8 E4M3 linear weights, borrowed from the mapping: ModelOpt's per-tensor
//! layout (`weight` E4M3 `[out, in]`, `weight_scale` f32 scalar; its
//! `input_scale` is the static activation scale, unused since sparkrt
//! multiplies with f32 activations) and the block-wise layout of Qwen's
//! `-FP8` releases (`weight` E4M3 `[out, in]`, `weight_scale_inv`
//! `[ceil(out/128), ceil(in/128)]` in F32, BF16 or F16, which multiplies).

use super::dtype::Dtype;
use super::error::CheckpointError;
use super::linear::{Fp8Scales, LinearWeight, WeightData};
use super::mapped::Checkpoint;
use super::view::TensorView;
use crate::formats::{FP8_BLOCK, ScaleType};

/// The dtypes a block-wise `weight_scale_inv` is published in, first the
/// one transformers writes.
pub const BLOCK_SCALE_DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

/// The `[rows, cols]` of the scales of a `[rows, cols]` block-wise FP8 weight.
pub fn block_scale_shape(rows: usize, cols: usize) -> [usize; 2] {
    [rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK)]
}

impl Checkpoint {
    /// ModelOpt FP8: `X.weight` (E4M3) times the scalar `X.weight_scale`.
    pub(super) fn fp8_tensor<'a>(
        &'a self,
        module: &str,
        weight: TensorView<'a>,
    ) -> Result<LinearWeight<'a>, CheckpointError> {
        let [rows, cols] = fp8_matrix(&weight)?;
        let scale = self
            .tensor(&format!("{module}.weight_scale"))?
            .scalar_f32()?;
        let data = WeightData::Fp8 {
            values: weight.bytes(),
            scales: Fp8Scales::Tensor(scale),
        };
        super::weights::checked(&weight, rows, cols, data)
    }

    /// FP8 block-wise: `X.weight` (E4M3) times its block's `X.weight_scale_inv`.
    pub(super) fn fp8_block<'a>(
        &'a self,
        module: &str,
        weight: TensorView<'a>,
    ) -> Result<LinearWeight<'a>, CheckpointError> {
        let [rows, cols] = fp8_matrix(&weight)?;
        let scales = self.tensor(&format!("{module}.weight_scale_inv"))?;
        let dtype = match scales.dtype() {
            Dtype::F32 => ScaleType::F32,
            Dtype::Bf16 => ScaleType::Bf16,
            Dtype::F16 => ScaleType::F16,
            found => {
                return Err(CheckpointError::WrongDtype {
                    path: scales.path().to_path_buf(),
                    tensor: scales.name().to_string(),
                    found,
                    expected: "F32, BF16 or F16".to_string(),
                });
            }
        };
        scales.expect_shape(&block_scale_shape(rows, cols))?;
        let data = WeightData::Fp8 {
            values: weight.bytes(),
            scales: Fp8Scales::Block {
                bytes: scales.bytes(),
                dtype,
            },
        };
        super::weights::checked(&weight, rows, cols, data)
    }
}

/// The `[rows, cols]` of a 2-D E4M3 weight.
fn fp8_matrix(weight: &TensorView<'_>) -> Result<[usize; 2], CheckpointError> {
    weight.expect_dtype(Dtype::F8E4M3)?;
    match *weight.shape() {
        [rows, cols] => Ok([rows, cols]),
        _ => Err(weight.wrong_shape("[out, in]")),
    }
}
