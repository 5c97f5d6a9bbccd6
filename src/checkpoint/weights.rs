//! Linear weights for the engines, borrowed from the mapping in the format
//! they are stored in (BF16, NVFP4 triplets, MXFP4 stacked experts).

use super::config::ModelConfig;
use super::dtype::Dtype;
use super::error::CheckpointError;
use super::linear::{LinearWeight, WeightData};
use super::mapped::Checkpoint;
use super::quant_config::QuantScheme;
use super::view::TensorView;
use crate::formats::{MXFP4_BLOCK_BYTES, MXFP4_GROUP, NVFP4_GROUP};
use crate::geometry::Quantization;

impl Checkpoint {
    /// The weight of linear module `module` (e.g.
    /// `model.layers.0.mlp.experts.3.gate_proj`): NVFP4 when the config
    /// quantizes the module (`X.weight`, `X.weight_scale`, `X.weight_scale_2`),
    /// else BF16 or F32 `X.weight`.
    pub fn linear(
        &self,
        config: &ModelConfig,
        module: &str,
    ) -> Result<LinearWeight<'_>, CheckpointError> {
        let format = config.linear_format(module);
        let scheme = config.quantization.as_ref().map(|q| q.scheme);
        // compressed-tensors names the packed codes `weight_packed`; a module
        // its `Linear` target covers that holds a plain `weight` instead (an
        // embedding) is read as stored, as `check_tensors` expects it.
        if (format, scheme) == (Quantization::Nvfp4, Some(QuantScheme::CompressedTensors)) {
            let packed = format!("{module}.weight_packed");
            if self.contains(&packed) {
                return self.compressed_tensors_nvfp4(module, self.tensor(&packed)?);
            }
            return self.plain(self.tensor(&format!("{module}.weight"))?);
        }
        // GPTQ modules have no `X.weight`: their own tensor names. As for
        // NVFP4, an embedding the config's rules cover is still a float
        // `X.weight` (the checker lists `qweight` for every linear layer).
        if let (Quantization::Int4, Some(QuantScheme::Gptq { sym, zero_offset })) = (format, scheme)
            && (self.contains(&format!("{module}.qweight"))
                || !self.contains(&format!("{module}.weight")))
        {
            let group = config.quantization.as_ref().map_or(0, |q| q.group_size);
            return self.int4(module, group, sym, zero_offset);
        }
        let weight = self.tensor(&format!("{module}.weight"))?;
        match (format, scheme) {
            (Quantization::Bf16, _) => {}
            // Only linear layers are quantized: an embedding matched by the
            // config's globs still holds bf16.
            (Quantization::Nvfp4, Some(QuantScheme::ModelOpt)) if weight.dtype() == Dtype::U8 => {
                return self.nvfp4(module, weight);
            }
            (Quantization::Nvfp4, Some(QuantScheme::ModelOpt)) => {}
            (Quantization::Fp8, Some(QuantScheme::ModelOpt)) if weight.dtype() != Dtype::Bf16 => {
                return self.fp8_tensor(module, weight);
            }
            (Quantization::Fp8Block, Some(QuantScheme::Fp8Block))
                if weight.dtype() != Dtype::Bf16 =>
            {
                return self.fp8_block(module, weight);
            }
            (Quantization::Fp8, Some(QuantScheme::ModelOpt))
            | (Quantization::Fp8Block, Some(QuantScheme::Fp8Block)) => {}
            // MXFP4 covers gpt-oss's stacked experts only ([`Self::mxfp4_expert`]):
            // any other module its config does not exclude is stored as is.
            (Quantization::Mxfp4, _) => {}
            (Quantization::Int4, Some(QuantScheme::Gptq { .. })) => {}
            (format, scheme) => {
                return Err(CheckpointError::UnreadFormat {
                    module: module.to_string(),
                    format: format.name(),
                    scheme: scheme.map_or("unquantized", QuantScheme::name),
                });
            }
        }
        self.plain(weight)
    }

    /// A BF16 or F32 `weight` as stored.
    fn plain<'a>(&'a self, weight: TensorView<'a>) -> Result<LinearWeight<'a>, CheckpointError> {
        let [rows, cols] = matrix(&weight, "[out, in]")?;
        let data = match weight.dtype() {
            Dtype::Bf16 => WeightData::Bf16(weight.bytes()),
            Dtype::F32 => WeightData::F32(weight.bytes()),
            found => {
                return Err(CheckpointError::WrongDtype {
                    path: weight.path().to_path_buf(),
                    tensor: weight.name().to_string(),
                    found,
                    expected: "BF16 or F32 (the config does not quantize this module)".to_string(),
                });
            }
        };
        checked(&weight, rows, cols, data)
    }

    /// compressed-tensors NVFP4: element = e2m1 × e4m3 scale ÷
    /// `weight_global_scale` (llm-compressor stores the reciprocal of
    /// ModelOpt's `weight_scale_2`), so the global factor is its inverse.
    fn compressed_tensors_nvfp4<'a>(
        &'a self,
        module: &str,
        packed: TensorView<'a>,
    ) -> Result<LinearWeight<'a>, CheckpointError> {
        let [rows, packed_cols] = matrix(&packed, "[out, in/2]")?;
        let codes = packed.u8()?;
        let cols = packed_cols * 2;
        if !cols.is_multiple_of(NVFP4_GROUP) {
            return Err(packed.wrong_shape("[out, in/2] with `in` a multiple of 16"));
        }
        let scales = self.tensor(&format!("{module}.weight_scale"))?;
        scales.expect_dtype(Dtype::F8E4M3)?;
        scales.expect_shape(&[rows, cols / NVFP4_GROUP])?;
        let global_view = self.tensor(&format!("{module}.weight_global_scale"))?;
        let global_scale = global_view.scalar_f32()?;
        if !(global_scale.is_finite() && global_scale > 0.0) {
            return Err(CheckpointError::BadScale {
                path: global_view.path().to_path_buf(),
                tensor: global_view.name().to_string(),
                value: global_scale,
            });
        }
        let data = WeightData::Nvfp4 {
            packed: codes,
            scales: scales.bytes(),
            global: global_scale.recip(),
        };
        checked(&packed, rows, cols, data)
    }

    fn nvfp4<'a>(
        &'a self,
        module: &str,
        weight: TensorView<'a>,
    ) -> Result<LinearWeight<'a>, CheckpointError> {
        let packed = weight.u8()?;
        let [rows, packed_cols] = matrix(&weight, "[out, in/2]")?;
        let cols = packed_cols * 2;
        let scales = self.tensor(&format!("{module}.weight_scale"))?;
        scales.expect_dtype(Dtype::F8E4M3)?;
        scales.expect_shape(&[rows, cols / NVFP4_GROUP])?;
        if !cols.is_multiple_of(NVFP4_GROUP) {
            return Err(weight.wrong_shape("[out, in/2] with `in` a multiple of 16"));
        }
        let global = self
            .tensor(&format!("{module}.weight_scale_2"))?
            .scalar_f32()?;
        let data = WeightData::Nvfp4 {
            packed,
            scales: scales.bytes(),
            global,
        };
        checked(&weight, rows, cols, data)
    }

    /// Expert `expert` of gpt-oss's stacked MXFP4 experts: `tensor_prefix` is
    /// e.g. `model.layers.0.mlp.experts.gate_up_proj`, whose `_blocks`
    /// [E, rows, cols/32, 16] and `_scales` [E, rows, cols/32] are sliced to
    /// the expert's rows without copying.
    pub fn mxfp4_expert(
        &self,
        tensor_prefix: &str,
        expert: usize,
    ) -> Result<LinearWeight<'_>, CheckpointError> {
        let blocks = self.tensor(&format!("{tensor_prefix}_blocks"))?;
        let scales = self.tensor(&format!("{tensor_prefix}_scales"))?;
        let block_bytes = blocks.u8()?;
        let scale_bytes = scales.u8()?;
        let &[experts, rows, groups, width] = blocks.shape() else {
            return Err(blocks.wrong_shape("[experts, rows, cols/32, 16]"));
        };
        if width != MXFP4_BLOCK_BYTES {
            return Err(blocks.wrong_shape("[experts, rows, cols/32, 16]"));
        }
        scales.expect_shape(&[experts, rows, groups])?;
        if expert >= experts {
            return Err(CheckpointError::ExpertOutOfRange {
                prefix: tensor_prefix.to_string(),
                expert,
                num_experts: experts,
            });
        }
        // Shapes are validated against the byte lengths, so these products
        // fit and the ranges lie inside the tensors.
        let per_expert_scales = rows * groups;
        let per_expert_blocks = per_expert_scales * MXFP4_BLOCK_BYTES;
        let data = WeightData::Mxfp4 {
            blocks: expert_slice(block_bytes, expert, per_expert_blocks),
            scales: expert_slice(scale_bytes, expert, per_expert_scales),
        };
        checked(&blocks, rows, groups * MXFP4_GROUP, data)
    }
}

/// Expert `expert`'s `len` bytes of a stacked tensor (empty if out of range,
/// which the length check in `checked` then reports).
fn expert_slice(bytes: &[u8], expert: usize, len: usize) -> &[u8] {
    let range = expert
        .checked_mul(len)
        .and_then(|start| Some(start..start.checked_add(len)?));
    range.and_then(|r| bytes.get(r)).unwrap_or_default()
}

/// The `[rows, cols]` of a 2-D tensor.
pub(super) fn matrix(view: &TensorView<'_>, expected: &str) -> Result<[usize; 2], CheckpointError> {
    match *view.shape() {
        [rows, cols] => Ok([rows, cols]),
        _ => Err(view.wrong_shape(expected)),
    }
}

/// Builds the weight, turning any length disagreement into an error naming
/// the tensor.
pub(super) fn checked<'a>(
    view: &TensorView<'a>,
    rows: usize,
    cols: usize,
    data: WeightData<'a>,
) -> Result<LinearWeight<'a>, CheckpointError> {
    LinearWeight::new(rows, cols, data).map_err(|source| CheckpointError::Quant {
        path: view.path().to_path_buf(),
        tensor: view.name().to_string(),
        source,
    })
}
