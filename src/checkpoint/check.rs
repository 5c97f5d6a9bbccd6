//! Does the checkpoint hold exactly the tensors the architecture needs, with
//! the right dtypes and shapes? Every problem is collected, not just the first.

use std::path::Path;

use super::config::ModelConfig;
use super::dtype::Dtype;
use super::error::{CheckpointError, TensorProblem};
use super::header_set::{HeaderSet, TensorInfo};
use super::mapped::Checkpoint;
use super::quant_config::QuantScheme;
use crate::formats::{INT4_PER_WORD, MXFP4_BLOCK_BYTES, MXFP4_GROUP, NVFP4_GROUP};
use crate::geometry::{Architecture, LayerAttention, Quantization};

/// The names an NVFP4 layout gives a module's codes, global scale and
/// activation scale (the E4M3 group scales are `weight_scale` in both).
#[derive(Clone, Copy)]
struct Nvfp4Names {
    codes: &'static str,
    global: &'static str,
    input: &'static str,
}

/// ModelOpt: `weight`, `weight_scale_2`, `input_scale`.
const MODELOPT_NVFP4: Nvfp4Names = Nvfp4Names {
    codes: "weight",
    global: "weight_scale_2",
    input: "input_scale",
};

/// compressed-tensors: `weight_packed`, `weight_global_scale` (which
/// divides), `input_global_scale`.
const COMPRESSED_TENSORS_NVFP4: Nvfp4Names = Nvfp4Names {
    codes: "weight_packed",
    global: "weight_global_scale",
    input: "input_global_scale",
};

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
    /// Other dtypes the tensor may have (F32 gates of Gated DeltaNet, the
    /// BF16 or F16 block scales of FP8).
    pub or_dtypes: &'static [Dtype],
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
    let expected = expected_tensors_in(config, ExpertLayout::of(config, headers));
    // Both lists are sorted by name: walk them side by side.
    let mut expected = expected.iter().peekable();
    let mut problems = Vec::new();
    for tensor in &headers.tensors {
        while let Some((name, want)) = expected.next_if(|(name, _)| *name < tensor.name) {
            problems.extend(missing(name, want));
        }
        let file = headers.path_of(tensor);
        // Mapped, never read (a vision tower, MTP layers): not checked.
        if super::groups::unused_prefix(config.geometry.architecture, &tensor.name).is_some() {
            continue;
        }
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
    if tensor.dtype != want.dtype && !want.or_dtypes.contains(&tensor.dtype) {
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

/// How a checkpoint stores the experts of a hybrid architecture: one
/// tensor per expert and projection (what transformers writes), or the
/// experts of a layer stacked (`mlp.experts.gate_up_proj` `[E, 2I, H]`,
/// `mlp.experts.down_proj` `[E, H, I]`, as Qwen publishes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertLayout {
    PerExpert,
    Stacked,
}

impl ExpertLayout {
    /// The layout `headers` use: stacked when the first MoE layer's stacked
    /// tensor is there.
    pub fn of(config: &ModelConfig, headers: &HeaderSet) -> ExpertLayout {
        let first_moe = (0..config.geometry.num_layers).find(|&i| config.geometry.is_moe_layer(i));
        let stacked = first_moe.is_some_and(|i| {
            let name = format!(
                "{}.layers.{i}.mlp.experts.gate_up_proj",
                config.geometry.architecture.text_prefix()
            );
            headers.get(&name).is_some()
        });
        if stacked && config.geometry.architecture.is_hybrid() {
            ExpertLayout::Stacked
        } else {
            ExpertLayout::PerExpert
        }
    }
}

/// Every tensor the architecture described by `config` has, sorted by name
/// (experts one tensor per expert).
pub fn expected_tensors(config: &ModelConfig) -> Vec<(String, Expected)> {
    expected_tensors_in(config, ExpertLayout::PerExpert)
}

/// [`expected_tensors`] with the experts laid out as `experts` says.
pub fn expected_tensors_in(config: &ModelConfig, experts: ExpertLayout) -> Vec<(String, Expected)> {
    let mut e = Expectations {
        config,
        tensors: Vec::new(),
    };
    let (h, v) = (config.geometry.hidden_size, config.geometry.vocab_size);
    let text = config.geometry.architecture.text_prefix();
    e.bf16(&format!("{text}.embed_tokens.weight"), &[v, h]);
    e.bf16(&format!("{text}.norm.weight"), &[h]);
    if config.geometry.tie_word_embeddings {
        // Tied heads usually are not stored, but some exporters keep a copy.
        e.optional_bf16("lm_head.weight", &[v, h]);
    } else {
        e.linear("lm_head", v, h);
    }
    for layer in 0..config.geometry.num_layers {
        let prefix = format!("{text}.layers.{layer}");
        e.bf16(&format!("{prefix}.input_layernorm.weight"), &[h]);
        e.bf16(&format!("{prefix}.post_attention_layernorm.weight"), &[h]);
        if config.layer_attention(layer) == LayerAttention::LinearAttention {
            e.delta_net(&prefix);
        } else {
            e.attention(&prefix);
        }
        match config.geometry.architecture {
            Architecture::Qwen3Moe => e.qwen3_mlp(&prefix, layer),
            Architecture::GptOss => e.gpt_oss_experts(&prefix),
            Architecture::Qwen35Moe | Architecture::Qwen35 | Architecture::Qwen3Next => {
                e.hybrid_mlp(&prefix, layer, experts)
            }
        }
    }
    // Names are generated unique, so an unstable sort is deterministic.
    e.tensors.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    e.tensors
}

/// The tensors of the checkpoint's one-layer MTP head (`mtp.*`, what
/// `model::qwen3_5`'s `mtp_head` reads: the two pre-`fc` norms, `fc`, a
/// gated-attention layer with the decoder's kind of MLP, the final norm);
/// empty without `mtp_num_hidden_layers` or off the hybrids. Text serving
/// never requires them; synthetic checkpoints write them, so a bench model
/// can draft with `mtp`.
pub fn expected_mtp_tensors(config: &ModelConfig) -> Vec<(String, Expected)> {
    let mut e = Expectations {
        config,
        tensors: Vec::new(),
    };
    if config.mtp_num_hidden_layers == 0 || !config.geometry.architecture.is_hybrid() {
        return e.tensors;
    }
    let h = config.geometry.hidden_size;
    let m = crate::geometry::MTP_PREFIX;
    for norm in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"] {
        e.bf16(&format!("{m}{norm}.weight"), &[h]);
    }
    e.linear(&format!("{m}fc"), h, 2 * h);
    let layer = format!("{m}layers.0");
    e.bf16(&format!("{layer}.input_layernorm.weight"), &[h]);
    e.bf16(&format!("{layer}.post_attention_layernorm.weight"), &[h]);
    e.attention(&layer);
    e.hybrid_mlp(&layer, 0, ExpertLayout::PerExpert);
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
                or_dtypes: &[],
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

    /// A `[rows, cols]` linear weight in the format the config gives
    /// `module`: BF16, the NVFP4 triplet (plus the optional `input_scale`),
    /// FP8 ([`Self::fp8_linear`]) or GPTQ INT4 ([`Self::int4`]).
    fn linear(&mut self, module: &str, rows: usize, cols: usize) {
        let scheme = self.config.quantization.as_ref().map(|q| q.scheme);
        match self.config.linear_format(module) {
            Quantization::Int4 if matches!(scheme, Some(QuantScheme::Gptq { .. })) => {
                self.int4(module, rows, cols)
            }
            Quantization::Nvfp4 if scheme == Some(QuantScheme::CompressedTensors) => {
                self.compressed_tensors_nvfp4(module, rows, cols)
            }
            Quantization::Nvfp4 => self.nvfp4_linear(module, rows, cols),
            format @ (Quantization::Fp8 | Quantization::Fp8Block) => {
                self.fp8_linear(module, rows, cols, format)
            }
            _ => self.bf16(&format!("{module}.weight"), &[rows, cols]),
        }
    }

    fn nvfp4_linear(&mut self, module: &str, rows: usize, cols: usize) {
        self.nvfp4_tensors(module, rows, cols, MODELOPT_NVFP4);
    }

    /// An NVFP4 triplet in either layout's names: the packed codes, the
    /// E4M3 group scales, the f32 global scale and the optional activation
    /// scale.
    fn nvfp4_tensors(&mut self, module: &str, rows: usize, cols: usize, names: Nvfp4Names) {
        self.u8(&format!("{module}.{}", names.codes), &[rows, cols / 2]);
        self.add(
            &format!("{module}.weight_scale"),
            Dtype::F8E4M3,
            ExpectedShape::Exact(vec![rows, cols / NVFP4_GROUP]),
            true,
        );
        for (name, required) in [(names.global, true), (names.input, false)] {
            self.add(
                &format!("{module}.{name}"),
                Dtype::F32,
                ExpectedShape::Scalar,
                required,
            );
        }
    }

    /// FP8 E4M3 `weight` `[rows, cols]` and its scales: ModelOpt's f32
    /// `weight_scale` (and the optional, unused `input_scale`), or the
    /// block-wise `weight_scale_inv` `[ceil(rows/128), ceil(cols/128)]`.
    fn fp8_linear(&mut self, module: &str, rows: usize, cols: usize, format: Quantization) {
        self.add(
            &format!("{module}.weight"),
            Dtype::F8E4M3,
            ExpectedShape::Exact(vec![rows, cols]),
            true,
        );
        if format == Quantization::Fp8Block {
            let [first, ..] = super::fp8::BLOCK_SCALE_DTYPES;
            self.add(
                &format!("{module}.weight_scale_inv"),
                first,
                ExpectedShape::Exact(super::fp8::block_scale_shape(rows, cols).to_vec()),
                true,
            );
            if let Some((_, last)) = self.tensors.last_mut() {
                last.or_dtypes = &super::fp8::BLOCK_SCALE_DTYPES[1..];
            }
            return;
        }
        for (name, required) in [("weight_scale", true), ("input_scale", false)] {
            self.add(
                &format!("{module}.{name}"),
                Dtype::F32,
                ExpectedShape::Scalar,
                required,
            );
        }
    }

    /// compressed-tensors' NVFP4 tensors of `module` (`nvfp4-pack-quantized`).
    fn compressed_tensors_nvfp4(&mut self, module: &str, rows: usize, cols: usize) {
        self.nvfp4_tensors(module, rows, cols, COMPRESSED_TENSORS_NVFP4);
    }

    /// A GPTQ INT4 `[rows, cols]` linear: `qweight` I32 `[cols/8, rows]`,
    /// `qzeros` I32 `[cols/group, rows/8]`, `scales` F16 `[cols/group,
    /// rows]`, optional `g_idx` I32 `[cols]`. Shapes that do not divide are
    /// listed as is (the floor), so the tensor's real shape fails the check
    /// and names it; the reader (`weights_int4`) repeats the divisibility test.
    fn int4(&mut self, module: &str, rows: usize, cols: usize) {
        let group = self
            .config
            .quantization
            .as_ref()
            .map_or(1, |q| q.group_size.max(1));
        let groups = cols / group;
        let exact = |shape: Vec<usize>| ExpectedShape::Exact(shape);
        self.add(
            &format!("{module}.qweight"),
            Dtype::I32,
            exact(vec![cols / INT4_PER_WORD, rows]),
            true,
        );
        self.add(
            &format!("{module}.qzeros"),
            Dtype::I32,
            exact(vec![groups, rows / INT4_PER_WORD]),
            true,
        );
        self.add(
            &format!("{module}.scales"),
            Dtype::F16,
            exact(vec![groups, rows]),
            true,
        );
        self.add(
            &format!("{module}.g_idx"),
            Dtype::I32,
            exact(vec![cols]),
            false,
        );
    }

    /// A BF16 (or F32) vector of `len`.
    fn bf16_or_f32(&mut self, name: &str, len: usize) {
        self.bf16(name, &[len]);
        if let Some((_, last)) = self.tensors.last_mut() {
            last.or_dtypes = &[Dtype::F32];
        }
    }

    fn attention(&mut self, prefix: &str) {
        let c = self.config;
        let (h, d) = (c.geometry.hidden_size, c.geometry.head_dim);
        let (q, kv) = (
            c.geometry.num_attention_heads * d,
            c.geometry.num_kv_heads * d,
        );
        // Gated attention: `q_proj` emits a query and a gate per head.
        let q_rows = if c.geometry.architecture.is_hybrid() {
            2 * q
        } else {
            q
        };
        for (projection, rows, cols) in [
            ("q_proj", q_rows, h),
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
            Architecture::Qwen3Moe
            | Architecture::Qwen35Moe
            | Architecture::Qwen35
            | Architecture::Qwen3Next => {
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
        self.kv_scales(prefix);
    }

    /// The FP8 KV cache's optional scalar scales, either spelling
    /// (`kv_scales` checks that they come in full sets).
    fn kv_scales(&mut self, prefix: &str) {
        for name in super::kv_scales::KV_SCALE_NAMES.iter().flatten() {
            self.add(
                &format!("{prefix}.{name}"),
                Dtype::F32,
                ExpectedShape::Scalar,
                false,
            );
            if let Some((_, last)) = self.tensors.last_mut() {
                last.or_dtypes = &[Dtype::Bf16];
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

    /// A Gated DeltaNet layer: its input projections (fused in qwen3_next),
    /// the depthwise convolution `[channels, 1, kernel]`, the decay and
    /// step gates per value head, the output norm and projection.
    fn delta_net(&mut self, prefix: &str) {
        let c = self.config;
        let g = &c.geometry;
        let Some(shape) = g.delta_net() else {
            return;
        };
        let h = c.geometry.hidden_size;
        let p = format!("{prefix}.linear_attn");
        let (channels, values, heads) = (
            shape.conv_channels(),
            shape.value_width(),
            shape.value_heads,
        );
        if c.geometry.architecture == Architecture::Qwen3Next {
            self.linear(&format!("{p}.in_proj_qkvz"), channels + values, h);
            self.linear(&format!("{p}.in_proj_ba"), 2 * heads, h);
        } else {
            self.linear(&format!("{p}.in_proj_qkv"), channels, h);
            self.linear(&format!("{p}.in_proj_z"), values, h);
            self.linear(&format!("{p}.in_proj_b"), heads, h);
            self.linear(&format!("{p}.in_proj_a"), heads, h);
        }
        self.bf16(
            &format!("{p}.conv1d.weight"),
            &[channels, 1, shape.conv_kernel],
        );
        self.bf16_or_f32(&format!("{p}.A_log"), heads);
        self.bf16_or_f32(&format!("{p}.dt_bias"), heads);
        self.bf16_or_f32(&format!("{p}.norm.weight"), shape.value_dim);
        self.linear(&format!("{p}.out_proj"), h, values);
    }

    /// Experts (per expert or stacked), the router, the shared expert and
    /// its gate; or a dense MLP.
    fn hybrid_mlp(&mut self, prefix: &str, layer: usize, layout: ExpertLayout) {
        let c = self.config;
        let h = c.geometry.hidden_size;
        if !c.geometry.is_moe_layer(layer) {
            let i = c.geometry.intermediate_size;
            self.linear(&format!("{prefix}.mlp.gate_proj"), i, h);
            self.linear(&format!("{prefix}.mlp.up_proj"), i, h);
            self.linear(&format!("{prefix}.mlp.down_proj"), h, i);
            return;
        }
        let (e, i) = (c.geometry.num_experts, c.geometry.moe_intermediate_size);
        self.linear(&format!("{prefix}.mlp.gate"), e, h);
        match layout {
            ExpertLayout::PerExpert => {
                for expert in 0..e {
                    let module = format!("{prefix}.mlp.experts.{expert}");
                    self.linear(&format!("{module}.gate_proj"), i, h);
                    self.linear(&format!("{module}.up_proj"), i, h);
                    self.linear(&format!("{module}.down_proj"), h, i);
                }
            }
            ExpertLayout::Stacked => {
                self.bf16(
                    &format!("{prefix}.mlp.experts.gate_up_proj"),
                    &[e, 2 * i, h],
                );
                self.bf16(&format!("{prefix}.mlp.experts.down_proj"), &[e, h, i]);
            }
        }
        let s = c.geometry.shared_expert_intermediate_size;
        let shared = format!("{prefix}.mlp.shared_expert");
        self.linear(&format!("{shared}.gate_proj"), s, h);
        self.linear(&format!("{shared}.up_proj"), s, h);
        self.linear(&format!("{shared}.down_proj"), h, s);
        self.linear(&format!("{prefix}.mlp.shared_expert_gate"), 1, h);
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
        let mxfp4 = c.linear_format(&experts) == Quantization::Mxfp4;
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
