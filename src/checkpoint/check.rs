//! Does the checkpoint hold exactly the tensors the architecture needs, with
//! the right dtypes and shapes? Every problem is collected, not just the first.

use std::path::Path;

use super::config::ModelConfig;
use super::dtype::Dtype;
use super::error::{CheckpointError, TensorProblem};
use super::{Checkpoint, HeaderSet, TensorInfo};
use crate::formats::{MXFP4_BLOCK_BYTES, MXFP4_GROUP, NVFP4_GROUP};
use crate::geometry::{Architecture, Quantization};

/// Anything that can list a checkpoint's tensors: the headers alone or an
/// open checkpoint.
pub trait TensorCatalog {
    fn header_set(&self) -> &HeaderSet;
}

impl TensorCatalog for HeaderSet {
    fn header_set(&self) -> &HeaderSet {
        self
    }
}

impl TensorCatalog for Checkpoint {
    fn header_set(&self) -> &HeaderSet {
        self.headers()
    }
}

/// What one expected tensor must look like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub dtype: Dtype,
    pub shape: ExpectedShape,
    /// Optional tensors may be absent (NVFP4 `input_scale`, a tied `lm_head`).
    pub required: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpectedShape {
    Exact(Vec<usize>),
    /// One element: shape `[]` or `[1]` (exporters write either).
    Scalar,
}

impl ExpectedShape {
    fn accepts(&self, shape: &[usize]) -> bool {
        match self {
            ExpectedShape::Exact(expected) => expected == shape,
            ExpectedShape::Scalar => shape.is_empty() || shape == [1],
        }
    }

    fn describe(&self) -> String {
        match self {
            ExpectedShape::Exact(shape) => format!("{shape:?}"),
            ExpectedShape::Scalar => "a scalar".to_string(),
        }
    }
}

/// Checks the tensors of `catalog` against what `config` says the model needs.
pub fn check_tensors(
    config: &ModelConfig,
    catalog: &impl TensorCatalog,
) -> Result<(), CheckpointError> {
    let problems = tensor_problems(config, catalog.header_set());
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CheckpointError::Tensors { problems })
    }
}

/// Every disagreement between `headers` and the tensors `config` needs,
/// sorted by tensor name.
pub fn tensor_problems(config: &ModelConfig, headers: &HeaderSet) -> Vec<TensorProblem> {
    let expected = expected_tensors(config);
    // Both lists are sorted by name: walk them side by side.
    let mut expected = expected.iter().peekable();
    let mut problems = Vec::new();
    for tensor in &headers.tensors {
        while let Some((name, want)) = expected.next_if(|(name, _)| *name < tensor.name) {
            problems.extend(missing(name, want));
        }
        let file = headers.path_of(tensor);
        match expected.next_if(|(name, _)| *name == tensor.name) {
            Some((_, want)) => problems.extend(mismatch(tensor, file, want)),
            None => problems.push(TensorProblem::Unexpected {
                tensor: tensor.name.clone(),
                file: file.to_path_buf(),
            }),
        }
    }
    for (name, want) in expected {
        problems.extend(missing(name, want));
    }
    problems
}

fn missing(name: &str, want: &Expected) -> Option<TensorProblem> {
    want.required.then(|| TensorProblem::Missing {
        tensor: name.to_string(),
        expected: format!("{} {}", want.dtype, want.shape.describe()),
    })
}

fn mismatch(tensor: &TensorInfo, file: &Path, want: &Expected) -> Option<TensorProblem> {
    if tensor.dtype != want.dtype {
        return Some(TensorProblem::WrongDtype {
            tensor: tensor.name.clone(),
            file: file.to_path_buf(),
            found: tensor.dtype,
            expected: want.dtype,
        });
    }
    if !want.shape.accepts(&tensor.shape) {
        return Some(TensorProblem::WrongShape {
            tensor: tensor.name.clone(),
            file: file.to_path_buf(),
            found: tensor.shape.clone(),
            expected: want.shape.describe(),
        });
    }
    None
}

/// Every tensor the architecture described by `config` has, sorted by name.
pub fn expected_tensors(config: &ModelConfig) -> Vec<(String, Expected)> {
    let mut e = Expectations {
        config,
        tensors: Vec::new(),
    };
    let (h, v) = (config.geometry.hidden_size, config.geometry.vocab_size);
    e.bf16("model.embed_tokens.weight", &[v, h]);
    e.bf16("model.norm.weight", &[h]);
    if config.geometry.tie_word_embeddings {
        // Tied heads usually are not stored, but some exporters keep a copy.
        e.optional_bf16("lm_head.weight", &[v, h]);
    } else {
        e.linear("lm_head", v, h);
    }
    for layer in 0..config.geometry.num_layers {
        let prefix = format!("model.layers.{layer}");
        e.bf16(&format!("{prefix}.input_layernorm.weight"), &[h]);
        e.bf16(&format!("{prefix}.post_attention_layernorm.weight"), &[h]);
        e.attention(&prefix);
        match config.geometry.architecture {
            Architecture::Qwen3Moe => e.qwen3_mlp(&prefix, layer),
            Architecture::GptOss => e.gpt_oss_experts(&prefix),
        }
    }
    // Names are generated unique, so an unstable sort is deterministic.
    e.tensors.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    e.tensors
}

struct Expectations<'a> {
    config: &'a ModelConfig,
    tensors: Vec<(String, Expected)>,
}

impl Expectations<'_> {
    fn add(&mut self, name: &str, dtype: Dtype, shape: ExpectedShape, required: bool) {
        self.tensors.push((
            name.to_string(),
            Expected {
                dtype,
                shape,
                required,
            },
        ));
    }

    fn bf16(&mut self, name: &str, shape: &[usize]) {
        self.add(
            name,
            Dtype::Bf16,
            ExpectedShape::Exact(shape.to_vec()),
            true,
        );
    }

    fn optional_bf16(&mut self, name: &str, shape: &[usize]) {
        self.add(
            name,
            Dtype::Bf16,
            ExpectedShape::Exact(shape.to_vec()),
            false,
        );
    }

    fn u8(&mut self, name: &str, shape: &[usize]) {
        self.add(name, Dtype::U8, ExpectedShape::Exact(shape.to_vec()), true);
    }

    /// A `[rows, cols]` linear weight: BF16, or the NVFP4 triplet (plus the
    /// optional `input_scale`) when the config quantizes `module`.
    fn linear(&mut self, module: &str, rows: usize, cols: usize) {
        let nvfp4 = self.config.quantization_method() == Quantization::Nvfp4
            && self.config.is_quantized(module);
        if nvfp4 {
            self.u8(&format!("{module}.weight"), &[rows, cols / 2]);
            self.add(
                &format!("{module}.weight_scale"),
                Dtype::F8E4M3,
                ExpectedShape::Exact(vec![rows, cols / NVFP4_GROUP]),
                true,
            );
            self.add(
                &format!("{module}.weight_scale_2"),
                Dtype::F32,
                ExpectedShape::Scalar,
                true,
            );
            self.add(
                &format!("{module}.input_scale"),
                Dtype::F32,
                ExpectedShape::Scalar,
                false,
            );
        } else {
            self.bf16(&format!("{module}.weight"), &[rows, cols]);
        }
    }

    fn attention(&mut self, prefix: &str) {
        let c = self.config;
        let (h, d) = (c.geometry.hidden_size, c.geometry.head_dim);
        let (q, kv) = (
            c.geometry.num_attention_heads * d,
            c.geometry.num_kv_heads * d,
        );
        for (projection, rows, cols) in [
            ("q_proj", q, h),
            ("k_proj", kv, h),
            ("v_proj", kv, h),
            ("o_proj", h, q),
        ] {
            let module = format!("{prefix}.self_attn.{projection}");
            self.linear(&module, rows, cols);
            if c.geometry.attention_bias {
                self.bf16(&format!("{module}.bias"), &[rows]);
            }
        }
        match c.geometry.architecture {
            Architecture::Qwen3Moe => {
                self.bf16(&format!("{prefix}.self_attn.q_norm.weight"), &[d]);
                self.bf16(&format!("{prefix}.self_attn.k_norm.weight"), &[d]);
            }
            Architecture::GptOss => {
                self.bf16(
                    &format!("{prefix}.self_attn.sinks"),
                    &[c.geometry.num_attention_heads],
                );
            }
        }
    }

    fn qwen3_mlp(&mut self, prefix: &str, layer: usize) {
        let c = self.config;
        let h = c.geometry.hidden_size;
        if c.geometry.is_moe_layer(layer) {
            let i = c.geometry.moe_intermediate_size;
            self.linear(&format!("{prefix}.mlp.gate"), c.geometry.num_experts, h);
            for expert in 0..c.geometry.num_experts {
                let module = format!("{prefix}.mlp.experts.{expert}");
                self.linear(&format!("{module}.gate_proj"), i, h);
                self.linear(&format!("{module}.up_proj"), i, h);
                self.linear(&format!("{module}.down_proj"), h, i);
            }
        } else {
            let i = c.geometry.intermediate_size;
            self.linear(&format!("{prefix}.mlp.gate_proj"), i, h);
            self.linear(&format!("{prefix}.mlp.up_proj"), i, h);
            self.linear(&format!("{prefix}.mlp.down_proj"), h, i);
        }
    }

    /// gpt-oss stores all experts of a layer stacked: MXFP4 blocks and scales
    /// (rows × input/32 groups of 16 bytes) when quantized, else the
    /// transformers layout `gate_up_proj` [E, H, 2I] / `down_proj` [E, I, H].
    fn gpt_oss_experts(&mut self, prefix: &str) {
        let c = self.config;
        let (e, h, i) = (
            c.geometry.num_experts,
            c.geometry.hidden_size,
            c.geometry.moe_intermediate_size,
        );
        self.bf16(&format!("{prefix}.mlp.router.weight"), &[e, h]);
        self.bf16(&format!("{prefix}.mlp.router.bias"), &[e]);
        let experts = format!("{prefix}.mlp.experts");
        let mxfp4 = c.quantization_method() == Quantization::Mxfp4 && c.is_quantized(&experts);
        for (projection, rows, cols) in [("gate_up_proj", 2 * i, h), ("down_proj", h, i)] {
            let name = format!("{experts}.{projection}");
            if mxfp4 {
                let groups = cols / MXFP4_GROUP;
                self.u8(
                    &format!("{name}_blocks"),
                    &[e, rows, groups, MXFP4_BLOCK_BYTES],
                );
                self.u8(&format!("{name}_scales"), &[e, rows, groups]);
            } else {
                self.bf16(&name, &[e, cols, rows]);
            }
            self.bf16(&format!("{name}_bias"), &[e, rows]);
        }
    }
}
