//! `config.json` of a model folder and its quantization (read by
//! `quant_config`, also from `hf_quant_config.json`).
//!
//! Hugging Face configs spell some keys two ways (`num_experts` /
//! `num_local_experts`, `rope_theta` / `rope_parameters.rope_theta`, …). Both
//! are accepted; when a file gives both and they disagree, it is an error
//! rather than a guess.

use std::fmt::Debug;
use std::path::Path;

use serde::Deserialize;

use super::error::CheckpointError;
use super::quant_config::{self, QuantizationConfig, RawHfQuant, RawQuant};
use crate::geometry::{Architecture, LayerAttention, ModelGeometry, Quantization};
use crate::limits::{self, GeometryFields};
use crate::util::files::read_regular_to_string;

pub const CONFIG_FILE: &str = "config.json";
pub const HF_QUANT_CONFIG_FILE: &str = "hf_quant_config.json";

/// What sparkrt needs from `config.json`, defaults applied as transformers
/// applies them: the model's shape, and what the forward pass needs beyond it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The shape, in sparkrt's names (`num_layers` for `num_hidden_layers`,
    /// `num_kv_heads` for `num_key_value_heads`, `top_k` for
    /// `num_experts_per_tok`; gpt_oss' `intermediate_size` is its
    /// `moe_intermediate_size`). Its `quantization` is that of
    /// [`ModelConfig::quantization`], `Bf16` when there is none.
    pub geometry: ModelGeometry,
    /// Renormalise the top-k routing weights (qwen3_moe).
    pub norm_topk_prob: bool,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// YaRN RoPE scaling (gpt_oss); `None` for plain RoPE.
    pub rope_scaling: Option<YarnScaling>,
    pub max_position_embeddings: usize,
    /// Clamp of the gpt_oss SwiGLU.
    pub swiglu_limit: Option<f64>,
    /// `None` when every weight is stored unquantized.
    pub quantization: Option<QuantizationConfig>,
    /// Share of each head RoPE rotates: its first `head_dim × factor` dims.
    pub partial_rotary_factor: f64,
    /// Layers of the checkpoint's MTP head (`mtp_num_hidden_layers`, Qwen3.5
    /// and Qwen3-Next); 0 without one. Served only when speculative
    /// decoding drafts with it (`ModelGeometry::mtp_layers`).
    pub mtp_num_hidden_layers: usize,
}

/// YaRN RoPE parameters (see docs/FORMATS.md, "RoPE of gpt_oss").
#[derive(Clone, Debug, PartialEq)]
pub struct YarnScaling {
    pub factor: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub truncate: bool,
    pub original_max_position_embeddings: usize,
    /// Overrides `0.1 · ln(factor) + 1` when set.
    pub attention_factor: Option<f64>,
}

impl ModelConfig {
    /// Reads `dir/config.json` (and `dir/hf_quant_config.json` when the config
    /// itself has no `quantization_config`).
    pub fn load(dir: &Path) -> Result<ModelConfig, CheckpointError> {
        let path = dir.join(CONFIG_FILE);
        let text = read(&path)?;
        let quant_path = dir.join(HF_QUANT_CONFIG_FILE);
        // Present but not a regular file is refused, not ignored.
        let hf_quant = if quant_path.exists() {
            Some((read(&quant_path)?, quant_path))
        } else {
            None
        };
        let hf_quant = hf_quant.as_ref().map(|(t, p)| (t.as_str(), p.as_path()));
        ModelConfig::parse(&text, &path, hf_quant)
    }

    /// Parses the text of a `config.json` found at `path` (used in messages),
    /// with the text and path of an `hf_quant_config.json` if there is one.
    pub fn parse(
        text: &str,
        path: &Path,
        hf_quant: Option<(&str, &Path)>,
    ) -> Result<ModelConfig, CheckpointError> {
        let mut raw: RawConfig =
            serde_json::from_str(text).map_err(|source| CheckpointError::ConfigJson {
                path: path.to_path_buf(),
                source,
            })?;
        // A vision-language checkpoint keeps its decoder's keys in
        // `text_config`; the keys of the whole file (quantization, tied
        // embeddings) stay where they are.
        if let Some(text_config) = raw.text_config.take() {
            raw = raw.with_text_config(*text_config);
        }
        // Before anything is sized by them (the gpt_oss default layer
        // types, the expected-tensor list, the plan's per-layer loops).
        raw.check_limits().map_err(|limit| CheckpointError::Limit {
            path: path.to_path_buf(),
            limit,
        })?;
        let keys = Keys { path };
        let model_type = keys.required("model_type", raw.model_type.clone())?;
        let architecture = match model_type.as_str() {
            "qwen3_moe" => Architecture::Qwen3Moe,
            "gpt_oss" => Architecture::GptOss,
            "qwen3_5_moe" => Architecture::Qwen35Moe,
            "qwen3_5" => Architecture::Qwen35,
            "qwen3_next" => Architecture::Qwen3Next,
            _ => {
                return Err(CheckpointError::UnsupportedArchitecture {
                    path: path.to_path_buf(),
                    model_type,
                });
            }
        };
        let quantization = match (&raw.quantization_config, hf_quant) {
            (Some(q), _) => Some(quant_config::parse(q, path)?),
            (None, Some((text, quant_path))) => {
                let raw: RawHfQuant =
                    serde_json::from_str(text).map_err(|source| CheckpointError::ConfigJson {
                        path: quant_path.to_path_buf(),
                        source,
                    })?;
                let mut q = raw.quantization;
                q.quant_method.get_or_insert_with(|| "modelopt".to_string());
                Some(quant_config::parse(&q, quant_path)?)
            }
            (None, None) => None,
        };
        let config = match architecture {
            Architecture::Qwen3Moe => keys.qwen3_moe(raw, quantization)?,
            Architecture::GptOss => keys.gpt_oss(raw, quantization)?,
            Architecture::Qwen35Moe | Architecture::Qwen35 | Architecture::Qwen3Next => {
                keys.hybrid(architecture, raw, quantization)?
            }
        };
        let mut config = config;
        config.geometry.quantization = config.linear_format(&config.mlp_module());
        config.geometry.attention_quantization = config.linear_format(&config.attention_module());
        config.geometry.lm_head_quantization = if config.geometry.tie_word_embeddings {
            // The embedding table serves as lm_head: bf16.
            Quantization::Bf16
        } else {
            config.linear_format("lm_head")
        };
        config.geometry.quant_group_size = match &config.quantization {
            Some(q) if q.method == Quantization::Int4 => q.group_size,
            _ => 0,
        };
        config.validate(path)?;
        Ok(config)
    }

    /// The quantization of the checkpoint's quantized linears (`Bf16` when
    /// none is).
    pub fn quantization_method(&self) -> Quantization {
        self.quantization
            .as_ref()
            .map_or(Quantization::Bf16, |q| q.method)
    }

    /// The query projection of the first full-attention layer: the module
    /// whose format the geometry records as the attention projections'.
    fn attention_module(&self) -> String {
        let layer = (0..self.geometry.num_layers)
            .find(|&i| self.layer_attention(i) != LayerAttention::LinearAttention)
            .unwrap_or(0);
        let prefix = self.geometry.architecture.text_prefix();
        format!("{prefix}.layers.{layer}.self_attn.q_proj")
    }

    /// The module whose format the geometry records as the MLPs': the first
    /// expert's gate projection of the first MoE layer (gpt-oss: the stacked
    /// experts), or the first dense MLP's.
    fn mlp_module(&self) -> String {
        let g = &self.geometry;
        let prefix = g.architecture.text_prefix();
        match (0..g.num_layers).find(|&i| g.num_experts > 0 && g.is_moe_layer(i)) {
            Some(layer) if g.architecture == Architecture::GptOss => {
                format!("{prefix}.layers.{layer}.mlp.experts")
            }
            Some(layer) => format!("{prefix}.layers.{layer}.mlp.experts.0.gate_proj"),
            None => format!("{prefix}.layers.0.mlp.gate_proj"),
        }
    }

    /// Dims of each head RoPE rotates (all of them unless the RoPE is partial).
    pub fn rotary_dim(&self) -> usize {
        // transformers: `int(head_dim × partial_rotary_factor)`.
        (self.geometry.head_dim as f64 * self.partial_rotary_factor) as usize
    }

    /// The layer kind of layer `i` (full attention when not listed).
    pub fn layer_attention(&self, i: usize) -> LayerAttention {
        self.geometry
            .layer_types
            .get(i)
            .copied()
            .unwrap_or(LayerAttention::FullAttention)
    }

    /// The format linear module `module` (a module path such as
    /// `model.layers.0.mlp.experts.3.gate_proj`, no `.weight`) is stored in
    /// ([`QuantizationConfig::format_of`]; bf16 without a quantization).
    pub fn linear_format(&self, module: &str) -> Quantization {
        self.quantization
            .as_ref()
            .map_or(Quantization::Bf16, |q| q.format_of(module))
    }

    /// Whether linear module `module` is stored in any quantized format.
    pub fn is_quantized(&self, module: &str) -> bool {
        self.linear_format(module) != Quantization::Bf16
    }

    fn validate(&self, path: &Path) -> Result<(), CheckpointError> {
        let fail = |reason: String| {
            Err(CheckpointError::Config {
                path: path.to_path_buf(),
                reason,
            })
        };
        let g = &self.geometry;
        let positive = [
            ("hidden_size", g.hidden_size),
            ("num_hidden_layers", g.num_layers),
            ("num_attention_heads", g.num_attention_heads),
            ("num_key_value_heads", g.num_kv_heads),
            ("head_dim", g.head_dim),
            ("vocab_size", g.vocab_size),
            ("decoder_sparse_step", g.decoder_sparse_step),
        ];
        // A dense model (qwen3_5) has no experts to size.
        let experts = [
            ("num_experts", g.num_experts),
            ("num_experts_per_tok", g.top_k),
            ("moe_intermediate_size", g.moe_intermediate_size),
        ];
        let dense_model = g.architecture == Architecture::Qwen35;
        let positive = positive
            .iter()
            .chain(experts.iter().filter(|_| !dense_model));
        for &(key, value) in positive {
            if value == 0 {
                return fail(format!("`{key}` must be positive"));
            }
        }
        if !g.num_attention_heads.is_multiple_of(g.num_kv_heads) {
            return fail(format!(
                "`num_attention_heads` ({}) is not a multiple of `num_key_value_heads` ({})",
                g.num_attention_heads, g.num_kv_heads
            ));
        }
        if g.top_k > g.num_experts {
            return fail(format!(
                "{} experts per token, but only {} experts",
                g.top_k, g.num_experts
            ));
        }
        if let Some(&layer) = g.mlp_only_layers.iter().find(|&&l| l >= g.num_layers) {
            return fail(format!(
                "`mlp_only_layers` names layer {layer}, but there are {} layers",
                g.num_layers
            ));
        }
        if g.num_moe_layers() < g.num_layers && g.intermediate_size == 0 {
            return fail("dense MLP layers need a positive `intermediate_size`".to_string());
        }
        if !g.layer_types.is_empty() && g.layer_types.len() != g.num_layers {
            return fail(format!(
                "`layer_types` has {} entries for {} layers",
                g.layer_types.len(),
                g.num_layers
            ));
        }
        let sliding = g.layer_types.contains(&LayerAttention::SlidingAttention);
        if sliding && g.sliding_window.is_none_or(|w| w == 0) {
            return fail("sliding-attention layers need a positive `sliding_window`".to_string());
        }
        if g.architecture.is_hybrid() {
            self.validate_hybrid(path)?;
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps < 0.0 {
            return fail("`rms_norm_eps` must be non-negative".to_string());
        }
        // Written so that NaN fails too.
        if self.rope_theta.is_nan() || self.rope_theta <= 0.0 {
            return fail("`rope_theta` must be positive".to_string());
        }
        Ok(())
    }
}

impl ModelConfig {
    /// The Gated DeltaNet and gated-attention checks of the hybrid
    /// architectures.
    fn validate_hybrid(&self, path: &Path) -> Result<(), CheckpointError> {
        let fail = |reason: String| {
            Err(CheckpointError::Config {
                path: path.to_path_buf(),
                reason,
            })
        };
        let g = &self.geometry;
        let linear = g.layer_types.contains(&LayerAttention::LinearAttention);
        if linear {
            let positive = [
                ("linear_num_key_heads", g.linear_num_key_heads),
                ("linear_num_value_heads", g.linear_num_value_heads),
                ("linear_key_head_dim", g.linear_key_head_dim),
                ("linear_value_head_dim", g.linear_value_head_dim),
                ("linear_conv_kernel_dim", g.linear_conv_kernel_dim),
            ];
            for (key, value) in positive {
                if value == 0 {
                    return fail(format!("`{key}` must be positive"));
                }
            }
            if !g
                .linear_num_value_heads
                .is_multiple_of(g.linear_num_key_heads)
            {
                return fail(format!(
                    "`linear_num_value_heads` ({}) is not a multiple of `linear_num_key_heads` ({})",
                    g.linear_num_value_heads, g.linear_num_key_heads
                ));
            }
        }
        if g.layer_types.contains(&LayerAttention::SlidingAttention) {
            return fail(format!(
                "{} has no sliding-attention layers",
                g.architecture.name()
            ));
        }
        let rotary = self.rotary_dim();
        if self.partial_rotary_factor.is_nan()
            || self.partial_rotary_factor <= 0.0
            || self.partial_rotary_factor > 1.0
            || rotary == 0
            || !rotary.is_multiple_of(2)
        {
            return fail(format!(
                "`partial_rotary_factor` {} gives {rotary} rotary dims of a {}-wide head: it must give a positive even count",
                self.partial_rotary_factor, g.head_dim
            ));
        }
        let has_moe = (0..g.num_layers).any(|i| g.is_moe_layer(i));
        if has_moe && g.shared_expert_intermediate_size == 0 {
            return fail("`shared_expert_intermediate_size` must be positive".to_string());
        }
        Ok(())
    }
}

fn read(path: &Path) -> Result<String, CheckpointError> {
    read_regular_to_string(path, limits::MAX_SMALL_FILE_BYTES).map_err(|source| {
        CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// config.json as written; every key optional so that a missing one gets a
/// message naming it, and unknown keys ignored (HF configs carry many).
#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: Option<usize>,
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    experts_per_token: Option<usize>,
    moe_intermediate_size: Option<usize>,
    intermediate_size: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    decoder_sparse_step: Option<usize>,
    norm_topk_prob: Option<bool>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRope>,
    rope_parameters: Option<RawRope>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    layer_types: Option<Vec<String>>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    swiglu_limit: Option<f64>,
    quantization_config: Option<RawQuant>,
    hidden_act: Option<String>,
    /// A vision-language checkpoint's decoder config.
    text_config: Option<Box<RawConfig>>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_conv_kernel_dim: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    /// transformers' default `layer_types`: every `n`-th layer full attention.
    full_attention_interval: Option<usize>,
    /// Qwen3-Next's legacy spelling (newer files: `rope_parameters`).
    partial_rotary_factor: Option<f64>,
    mtp_num_hidden_layers: Option<usize>,
}

impl RawConfig {
    /// `text`'s keys, with the keys of the whole file it leaves out: the
    /// architecture's `model_type` and the quantization of the outer file.
    fn with_text_config(self, mut text: RawConfig) -> RawConfig {
        text.model_type = self.model_type;
        text.quantization_config = text.quantization_config.or(self.quantization_config);
        text.tie_word_embeddings = text.tie_word_embeddings.or(self.tie_word_embeddings);
        text
    }

    /// Every size the file gives, as written, against `crate::limits`.
    fn check_limits(&self) -> Result<(), limits::LimitExceeded> {
        let given = |value: Option<usize>| value.unwrap_or(0);
        let either = |a: Option<usize>, b: Option<usize>| given(a).max(given(b));
        GeometryFields {
            layers: ("num_hidden_layers", given(self.num_hidden_layers)),
            experts: (
                "num_experts",
                either(self.num_experts, self.num_local_experts),
            ),
            experts_per_token: (
                "num_experts_per_tok",
                either(self.num_experts_per_tok, self.experts_per_token),
            ),
            hidden: ("hidden_size", given(self.hidden_size)),
            heads: ("num_attention_heads", given(self.num_attention_heads)),
            kv_heads: ("num_key_value_heads", given(self.num_key_value_heads)),
            head_dim: ("head_dim", given(self.head_dim)),
            vocab: ("vocab_size", given(self.vocab_size)),
            intermediate: ("intermediate_size", given(self.intermediate_size)),
            moe_intermediate: ("moe_intermediate_size", given(self.moe_intermediate_size)),
            decoder_sparse_step: ("decoder_sparse_step", given(self.decoder_sparse_step)),
            mlp_only_layers: (
                "mlp_only_layers",
                self.mlp_only_layers.as_ref().map_or(0, Vec::len),
            ),
            layer_types: ("layer_types", self.layer_types.as_ref().map_or(0, Vec::len)),
            sliding_window: ("sliding_window", given(self.sliding_window)),
        }
        .check()?;
        limits::HybridFields {
            key_heads: ("linear_num_key_heads", given(self.linear_num_key_heads)),
            value_heads: ("linear_num_value_heads", given(self.linear_num_value_heads)),
            key_head_dim: ("linear_key_head_dim", given(self.linear_key_head_dim)),
            value_head_dim: ("linear_value_head_dim", given(self.linear_value_head_dim)),
            conv_kernel: ("linear_conv_kernel_dim", given(self.linear_conv_kernel_dim)),
            shared_expert_intermediate: (
                "shared_expert_intermediate_size",
                given(self.shared_expert_intermediate_size),
            ),
        }
        .check()?;
        limits::check(
            "full_attention_interval",
            given(self.full_attention_interval),
            limits::MAX_LAYERS,
        )?;
        limits::check(
            "mtp_num_hidden_layers",
            given(self.mtp_num_hidden_layers),
            limits::MAX_LAYERS,
        )?;
        if let Some(text) = &self.text_config {
            text.check_limits()?;
        }
        limits::check(
            "max_position_embeddings",
            given(self.max_position_embeddings),
            limits::MAX_POSITION_EMBEDDINGS,
        )?;
        for (key, rope) in [
            ("rope_scaling", &self.rope_scaling),
            ("rope_parameters", &self.rope_parameters),
        ] {
            let original = rope
                .as_ref()
                .and_then(|r| r.original_max_position_embeddings);
            limits::check(
                format_args!("{key}.original_max_position_embeddings"),
                given(original),
                limits::MAX_POSITION_EMBEDDINGS,
            )?;
        }
        Ok(())
    }
}

/// `rope_scaling`, or transformers v5's `rope_parameters` (which also holds
/// `rope_theta`). Old files say `type`, newer ones `rope_type`, some both.
#[derive(Clone, Deserialize)]
struct RawRope {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    rope_theta: Option<f64>,
    factor: Option<f64>,
    beta_fast: Option<f64>,
    beta_slow: Option<f64>,
    truncate: Option<bool>,
    original_max_position_embeddings: Option<usize>,
    attention_factor: Option<f64>,
    partial_rotary_factor: Option<f64>,
    /// mRoPE's split of the rotary dims among time, height and width: for
    /// text the three positions are the token's index, so plain RoPE.
    mrope_section: Option<Vec<usize>>,
}

/// Key resolution with messages naming the file.
struct Keys<'a> {
    path: &'a Path,
}

impl Keys<'_> {
    fn error(&self, reason: String) -> CheckpointError {
        CheckpointError::Config {
            path: self.path.to_path_buf(),
            reason,
        }
    }

    fn required<T>(&self, key: &str, value: Option<T>) -> Result<T, CheckpointError> {
        value.ok_or_else(|| self.error(format!("missing `{key}`")))
    }

    /// The value of whichever of two spellings is present; both present and
    /// different is an error.
    fn either<T: PartialEq + Debug>(
        &self,
        (key_a, a): (&str, Option<T>),
        (key_b, b): (&str, Option<T>),
    ) -> Result<Option<T>, CheckpointError> {
        match (a, b) {
            (Some(a), Some(b)) if a != b => {
                Err(self.error(format!("`{key_a}` ({a:?}) and `{key_b}` ({b:?}) disagree")))
            }
            (Some(a), _) => Ok(Some(a)),
            (None, b) => Ok(b),
        }
    }

    /// `rope_theta` and the scaling from either `rope_scaling` or
    /// `rope_parameters`.
    fn rope(
        &self,
        raw: &RawConfig,
        default_theta: f64,
        max_position_embeddings: usize,
    ) -> Result<(f64, Option<YarnScaling>), CheckpointError> {
        let params_theta = raw.rope_parameters.as_ref().and_then(|p| p.rope_theta);
        let theta = self
            .either(
                ("rope_theta", raw.rope_theta),
                ("rope_parameters.rope_theta", params_theta),
            )?
            .unwrap_or(default_theta);
        let scaling = match (&raw.rope_scaling, &raw.rope_parameters) {
            (Some(scaling), _) => Some(("rope_scaling", scaling)),
            (None, Some(params)) => Some(("rope_parameters", params)),
            (None, None) => None,
        };
        let Some((key, scaling)) = scaling else {
            return Ok((theta, None));
        };
        let kind = self
            .either(
                (&format!("{key}.rope_type"), scaling.rope_type.clone()),
                (&format!("{key}.type"), scaling.legacy_type.clone()),
            )?
            .unwrap_or_else(|| "default".to_string());
        match kind.as_str() {
            "default" => Ok((theta, None)),
            "yarn" => {
                let factor = self.required(&format!("{key}.factor"), scaling.factor)?;
                if factor.is_nan() || factor < 1.0 {
                    return Err(self.error(format!("`{key}.factor` must be at least 1")));
                }
                Ok((
                    theta,
                    Some(YarnScaling {
                        factor,
                        beta_fast: scaling.beta_fast.unwrap_or(32.0),
                        beta_slow: scaling.beta_slow.unwrap_or(1.0),
                        truncate: scaling.truncate.unwrap_or(true),
                        original_max_position_embeddings: scaling
                            .original_max_position_embeddings
                            .unwrap_or(max_position_embeddings),
                        attention_factor: scaling.attention_factor,
                    }),
                ))
            }
            other => Err(self.error(format!(
                "RoPE type `{other}` is not supported (default, yarn)"
            ))),
        }
    }

    fn num_experts(&self, raw: &RawConfig) -> Result<usize, CheckpointError> {
        let n = self.either(
            ("num_experts", raw.num_experts),
            ("num_local_experts", raw.num_local_experts),
        )?;
        self.required("num_experts", n)
    }

    fn top_k(&self, raw: &RawConfig) -> Result<usize, CheckpointError> {
        let k = self.either(
            ("num_experts_per_tok", raw.num_experts_per_tok),
            ("experts_per_token", raw.experts_per_token),
        )?;
        self.required("num_experts_per_tok", k)
    }

    /// The keys both architectures share.
    fn common(&self, raw: &RawConfig) -> Result<Common, CheckpointError> {
        let hidden_size = self.required("hidden_size", raw.hidden_size)?;
        let num_attention_heads = self.required("num_attention_heads", raw.num_attention_heads)?;
        let head_dim = match raw.head_dim {
            Some(d) => d,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };
        Ok(Common {
            hidden_size,
            num_layers: self.required("num_hidden_layers", raw.num_hidden_layers)?,
            num_attention_heads,
            num_kv_heads: raw.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim,
            vocab_size: self.required("vocab_size", raw.vocab_size)?,
            num_experts: self.num_experts(raw)?,
            top_k: self.top_k(raw)?,
        })
    }

    fn qwen3_moe(
        &self,
        raw: RawConfig,
        quantization: Option<QuantizationConfig>,
    ) -> Result<ModelConfig, CheckpointError> {
        let c = self.common(&raw)?;
        if raw.use_sliding_window == Some(true) {
            return Err(
                self.error("`use_sliding_window` is not supported for qwen3_moe".to_string())
            );
        }
        let max_position_embeddings = raw.max_position_embeddings.unwrap_or(32768);
        let (rope_theta, rope_scaling) = self.rope(&raw, 10_000.0, max_position_embeddings)?;
        let geometry = ModelGeometry {
            architecture: Architecture::Qwen3Moe,
            quantization: method_of(&quantization),
            // Set by `ModelConfig::parse` once modules can be named.
            attention_quantization: Quantization::Bf16,
            lm_head_quantization: Quantization::Bf16,
            quant_group_size: 0,
            num_layers: c.num_layers,
            hidden_size: c.hidden_size,
            num_attention_heads: c.num_attention_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            vocab_size: c.vocab_size,
            num_experts: c.num_experts,
            top_k: c.top_k,
            moe_intermediate_size: self
                .required("moe_intermediate_size", raw.moe_intermediate_size)?,
            intermediate_size: raw.intermediate_size.unwrap_or(0),
            mlp_only_layers: raw.mlp_only_layers.unwrap_or_default(),
            decoder_sparse_step: raw.decoder_sparse_step.unwrap_or(1),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(false),
            layer_types: Vec::new(),
            sliding_window: None,
            linear_num_key_heads: 0,
            linear_num_value_heads: 0,
            linear_key_head_dim: 0,
            linear_value_head_dim: 0,
            linear_conv_kernel_dim: 0,
            shared_expert_intermediate_size: 0,
            mtp_layers: 0,
        };
        Ok(ModelConfig {
            geometry,
            norm_topk_prob: raw.norm_topk_prob.unwrap_or(false),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            swiglu_limit: None,
            quantization,
            // Plain RoPE over the whole head.
            partial_rotary_factor: 1.0,
            mtp_num_hidden_layers: 0,
        })
    }

    fn gpt_oss(
        &self,
        raw: RawConfig,
        quantization: Option<QuantizationConfig>,
    ) -> Result<ModelConfig, CheckpointError> {
        let c = self.common(&raw)?;
        let moe_intermediate_size = self.required("intermediate_size", raw.intermediate_size)?;
        let max_position_embeddings = raw.max_position_embeddings.unwrap_or(131_072);
        let (rope_theta, rope_scaling) = self.rope(&raw, 150_000.0, max_position_embeddings)?;
        let layer_types = match &raw.layer_types {
            Some(names) => names
                .iter()
                .map(|name| match name.as_str() {
                    "full_attention" => Ok(LayerAttention::FullAttention),
                    "sliding_attention" => Ok(LayerAttention::SlidingAttention),
                    other => Err(self.error(format!("unknown layer type `{other}`"))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            // transformers' default: even layers slide, odd layers see everything.
            None => (0..c.num_layers)
                .map(|i| {
                    if i % 2 == 0 {
                        LayerAttention::SlidingAttention
                    } else {
                        LayerAttention::FullAttention
                    }
                })
                .collect(),
        };
        let geometry = ModelGeometry {
            architecture: Architecture::GptOss,
            quantization: method_of(&quantization),
            // Set by `ModelConfig::parse` once modules can be named.
            attention_quantization: Quantization::Bf16,
            lm_head_quantization: Quantization::Bf16,
            quant_group_size: 0,
            num_layers: c.num_layers,
            hidden_size: c.hidden_size,
            num_attention_heads: c.num_attention_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            vocab_size: c.vocab_size,
            num_experts: c.num_experts,
            top_k: c.top_k,
            moe_intermediate_size,
            intermediate_size: 0,
            mlp_only_layers: Vec::new(),
            decoder_sparse_step: 1,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(true),
            layer_types,
            sliding_window: Some(raw.sliding_window.unwrap_or(128)),
            linear_num_key_heads: 0,
            linear_num_value_heads: 0,
            linear_key_head_dim: 0,
            linear_value_head_dim: 0,
            linear_conv_kernel_dim: 0,
            shared_expert_intermediate_size: 0,
            mtp_layers: 0,
        };
        Ok(ModelConfig {
            geometry,
            norm_topk_prob: false,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-5),
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            swiglu_limit: Some(raw.swiglu_limit.unwrap_or(7.0)),
            quantization,
            // Plain RoPE over the whole head.
            partial_rotary_factor: 1.0,
            mtp_num_hidden_layers: 0,
        })
    }
}

impl Keys<'_> {
    /// qwen3_5_moe, qwen3_5 and qwen3_next: Gated DeltaNet and gated
    /// attention layers (`layer_types`), partial RoPE, a shared expert.
    fn hybrid(
        &self,
        architecture: Architecture,
        raw: RawConfig,
        quantization: Option<QuantizationConfig>,
    ) -> Result<ModelConfig, CheckpointError> {
        let name = architecture.name();
        let c = match architecture {
            // The dense model has no experts.
            Architecture::Qwen35 => self.common_dense(&raw)?,
            _ => self.common(&raw)?,
        };
        if let Some(act) = &raw.hidden_act
            && act != "silu"
        {
            return Err(self.error(format!("`hidden_act` `{act}` is not supported (silu)")));
        }
        if raw.attention_bias == Some(true) {
            return Err(self.error(format!("`attention_bias` is not supported for {name}")));
        }
        if raw.use_sliding_window == Some(true) {
            return Err(self.error(format!("`use_sliding_window` is not supported for {name}")));
        }
        let max_position_embeddings = raw.max_position_embeddings.unwrap_or(32768);
        let (rope_theta, rope_scaling) = self.rope(&raw, 10_000.0, max_position_embeddings)?;
        if rope_scaling.is_some() {
            return Err(self.error(format!("YaRN RoPE is not supported for {name}")));
        }
        let params = raw.rope_parameters.as_ref();
        let partial_rotary_factor = self
            .either(
                ("partial_rotary_factor", raw.partial_rotary_factor),
                (
                    "rope_parameters.partial_rotary_factor",
                    params.and_then(|p| p.partial_rotary_factor),
                ),
            )?
            // transformers' default for these architectures.
            .unwrap_or(0.25);
        let layer_types = match &raw.layer_types {
            Some(names) => names
                .iter()
                .map(|name| match name.as_str() {
                    "full_attention" => Ok(LayerAttention::FullAttention),
                    "linear_attention" => Ok(LayerAttention::LinearAttention),
                    other => Err(self.error(format!(
                        "unknown layer type `{other}` (full_attention, linear_attention)"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            // transformers' default: every `interval`-th layer attends.
            None => {
                let interval = raw.full_attention_interval.unwrap_or(4);
                if interval == 0 {
                    return Err(self.error("`full_attention_interval` must be positive".into()));
                }
                (0..c.num_layers)
                    .map(|i| {
                        if (i + 1).is_multiple_of(interval) {
                            LayerAttention::FullAttention
                        } else {
                            LayerAttention::LinearAttention
                        }
                    })
                    .collect()
            }
        };
        let head_dim = c.head_dim;
        let rotary = (head_dim as f64 * partial_rotary_factor) as usize;
        if let Some(section) = params.and_then(|p| p.mrope_section.as_ref())
            && section.iter().sum::<usize>() * 2 != rotary
        {
            return Err(self.error(format!(
                "`rope_parameters.mrope_section` {section:?} does not cover the {rotary} rotary dims"
            )));
        }
        let moe = architecture != Architecture::Qwen35;
        let geometry = ModelGeometry {
            architecture,
            quantization: method_of(&quantization),
            // Set by `ModelConfig::parse` once modules can be named.
            attention_quantization: Quantization::Bf16,
            lm_head_quantization: Quantization::Bf16,
            quant_group_size: 0,
            num_layers: c.num_layers,
            hidden_size: c.hidden_size,
            num_attention_heads: c.num_attention_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim,
            vocab_size: c.vocab_size,
            num_experts: c.num_experts,
            top_k: c.top_k,
            moe_intermediate_size: if moe {
                self.required("moe_intermediate_size", raw.moe_intermediate_size)?
            } else {
                0
            },
            intermediate_size: if moe {
                raw.intermediate_size.unwrap_or(0)
            } else {
                self.required("intermediate_size", raw.intermediate_size)?
            },
            mlp_only_layers: raw.mlp_only_layers.unwrap_or_default(),
            decoder_sparse_step: raw.decoder_sparse_step.unwrap_or(1),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: false,
            layer_types,
            sliding_window: None,
            linear_num_key_heads: raw.linear_num_key_heads.unwrap_or(16),
            linear_num_value_heads: raw.linear_num_value_heads.unwrap_or(32),
            linear_key_head_dim: raw.linear_key_head_dim.unwrap_or(128),
            linear_value_head_dim: raw.linear_value_head_dim.unwrap_or(128),
            linear_conv_kernel_dim: raw.linear_conv_kernel_dim.unwrap_or(4),
            shared_expert_intermediate_size: if moe {
                raw.shared_expert_intermediate_size.unwrap_or(0)
            } else {
                0
            },
            mtp_layers: 0,
        };
        Ok(ModelConfig {
            geometry,
            // qwen3_5_moe always renormalises; qwen3_next reads the key.
            norm_topk_prob: match architecture {
                Architecture::Qwen3Next => raw.norm_topk_prob.unwrap_or(true),
                _ => true,
            },
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling: None,
            max_position_embeddings,
            swiglu_limit: None,
            quantization,
            partial_rotary_factor,
            mtp_num_hidden_layers: raw.mtp_num_hidden_layers.unwrap_or(0),
        })
    }

    /// The shared keys of a model without experts.
    fn common_dense(&self, raw: &RawConfig) -> Result<Common, CheckpointError> {
        let hidden_size = self.required("hidden_size", raw.hidden_size)?;
        let num_attention_heads = self.required("num_attention_heads", raw.num_attention_heads)?;
        let head_dim = match raw.head_dim {
            Some(d) => d,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };
        Ok(Common {
            hidden_size,
            num_layers: self.required("num_hidden_layers", raw.num_hidden_layers)?,
            num_attention_heads,
            num_kv_heads: raw.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim,
            vocab_size: self.required("vocab_size", raw.vocab_size)?,
            num_experts: 0,
            top_k: 0,
        })
    }
}

/// The storage format the geometry records: the quantization's, else bf16.
fn method_of(quantization: &Option<QuantizationConfig>) -> Quantization {
    quantization
        .as_ref()
        .map_or(Quantization::Bf16, |q| q.method)
}

/// The keys both architectures share, in the geometry's names.
struct Common {
    hidden_size: usize,
    num_layers: usize,
    num_attention_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    vocab_size: usize,
    num_experts: usize,
    top_k: usize,
}
