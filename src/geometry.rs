//! The model geometry the memory plan needs: from a profile's `[model]`
//! section (before any checkpoint is downloaded) or from a checkpoint's
//! `config.json` (see `checkpoint::config`). Plain data, below both the
//! checkpoint reader and the plan, so neither imports the other for it.

use serde::{Deserialize, Serialize};

/// Architectures sparkrt runs (the `model_type` of `config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    Qwen3Moe,
    GptOss,
    /// Qwen3.5 / Qwen3.6 MoE (`Qwen3_5MoeForConditionalGeneration`):
    /// Gated DeltaNet and gated-attention layers, experts and a shared expert.
    #[serde(rename = "qwen3_5_moe")]
    Qwen35Moe,
    /// Qwen3.5 dense (`Qwen3_5ForConditionalGeneration`): the same layers
    /// with a dense MLP.
    #[serde(rename = "qwen3_5")]
    Qwen35,
    /// Qwen3-Next: Qwen3.5's layers with fused GDN input projections, flat
    /// (text-only) checkpoint.
    Qwen3Next,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Qwen3Moe => "qwen3_moe",
            Architecture::GptOss => "gpt_oss",
            Architecture::Qwen35Moe => "qwen3_5_moe",
            Architecture::Qwen35 => "qwen3_5",
            Architecture::Qwen3Next => "qwen3_next",
        }
    }

    /// Where the decoder's tensors live: `model.language_model` in the
    /// vision-language checkpoints of Qwen3.5, `model` elsewhere.
    pub fn text_prefix(self) -> &'static str {
        match self {
            Architecture::Qwen35Moe | Architecture::Qwen35 => "model.language_model",
            _ => "model",
        }
    }

    /// Whether layers mix tokens with Gated DeltaNet and gated attention
    /// (Qwen3.5 and Qwen3-Next): `q_proj` emits a gate per head, every
    /// decoder RMSNorm is zero-centred, RoPE is partial.
    pub fn is_hybrid(self) -> bool {
        matches!(
            self,
            Architecture::Qwen35Moe | Architecture::Qwen35 | Architecture::Qwen3Next
        )
    }

    /// Top-level tensor prefixes a checkpoint of this architecture carries
    /// that text serving never reads (a vision tower, multi-token
    /// prediction layers): mapped, not planned as resident weights.
    pub fn unused_prefixes(self) -> &'static [&'static str] {
        match self {
            Architecture::Qwen35Moe | Architecture::Qwen35 => &["model.visual.", MTP_PREFIX],
            Architecture::Qwen3Next => &[MTP_PREFIX],
            _ => &[],
        }
    }
}

/// Where a checkpoint keeps its MTP head (Qwen3.5, Qwen3-Next).
pub const MTP_PREFIX: &str = "mtp.";

/// The number format a linear weight is stored in (`crate::formats` defines
/// each). A checkpoint may mix them: the geometry records the routed
/// experts' format and the attention projections' separately.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantization {
    #[default]
    Bf16,
    /// E2M1 codes, an E4M3 scale per 16 and an f32 global scale.
    Nvfp4,
    /// E2M1 codes and an E8M0 scale per 32 (gpt-oss).
    Mxfp4,
    /// E4M3 values with one f32 scale per tensor (ModelOpt FP8).
    Fp8,
    /// E4M3 values with one f32 scale per 128 × 128 block (`weight_scale_inv`).
    Fp8Block,
    /// 4-bit integers with a scale and a zero point per group of input
    /// columns (GPTQ / AutoRound layout).
    Int4,
}

impl Quantization {
    pub fn name(self) -> &'static str {
        match self {
            Quantization::Bf16 => "bf16",
            Quantization::Nvfp4 => "nvfp4",
            Quantization::Mxfp4 => "mxfp4",
            Quantization::Fp8 => "fp8",
            Quantization::Fp8Block => "fp8_block",
            Quantization::Int4 => "int4",
        }
    }
}

/// Attention span of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerAttention {
    FullAttention,
    SlidingAttention,
    /// Gated DeltaNet (`linear_attention`): a recurrent state per sequence,
    /// no KV cache.
    LinearAttention,
}

/// The model's shape, listed once: calls `$then!` with every field of
/// [`ModelGeometry`] as `docs name: Type = default,` in order, where
/// `default` is `required` or `(value)`, the value a profile's `[model]`
/// without a checkpoint takes when it leaves the key out.
///
/// [`ModelGeometry`] is made from this list (below), and so is the
/// all-optional `[model]` of a profile file (`plan::profile`), so a field
/// added here is a profile key at once. A new field also needs: its value
/// in `checkpoint::config` (which builds a `ModelGeometry` from config.json),
/// and, for a size, its limit in `limits::GeometryFields`.
macro_rules! with_geometry_fields {
    ($then:ident) => {
        $then! {
            architecture: $crate::geometry::Architecture = required,
            /// Format of the routed experts (and of NVFP4 dense MLPs).
            quantization: $crate::geometry::Quantization = required,
            /// Format of the attention and Gated DeltaNet projections.
            #[serde(default)]
            attention_quantization: $crate::geometry::Quantization = ($crate::geometry::Quantization::Bf16),
            /// Format of the lm_head (NVIDIA's ModelOpt checkpoints keep it
            /// in NVFP4; most others in bf16).
            #[serde(default)]
            lm_head_quantization: $crate::geometry::Quantization = ($crate::geometry::Quantization::Bf16),
            /// Input columns per scale of grouped integer formats (INT4); 0
            /// when the formats fix their own groups.
            #[serde(default)]
            quant_group_size: usize = (0),
            num_layers: usize = required,
            hidden_size: usize = required,
            num_attention_heads: usize = required,
            num_kv_heads: usize = required,
            head_dim: usize = required,
            vocab_size: usize = required,
            num_experts: usize = required,
            /// Experts each token is routed to (`num_experts_per_tok`).
            top_k: usize = required,
            /// Intermediate size of one expert.
            moe_intermediate_size: usize = required,
            /// Intermediate size of a dense MLP layer (qwen3_moe `mlp_only_layers`); 0 if none.
            intermediate_size: usize = (0),
            /// Layers with a dense MLP instead of experts (qwen3_moe).
            mlp_only_layers: Vec<usize> = (Vec::new()),
            /// A layer `i` is sparse when `(i + 1) % decoder_sparse_step == 0` (qwen3_moe).
            decoder_sparse_step: usize = (1),
            tie_word_embeddings: bool = (false),
            /// q/k/v/o projections carry biases (gpt_oss).
            attention_bias: bool = (false),
            /// Per-layer attention span; empty means every layer is full attention.
            layer_types: Vec<$crate::geometry::LayerAttention> = (Vec::new()),
            /// Window of sliding-attention layers, in tokens.
            sliding_window: Option<usize> = (None),
            /// Gated DeltaNet (`linear_attention` layers): key heads, value heads,
            /// their widths and the causal convolution's kernel; 0 without such layers.
            #[serde(default)]
            linear_num_key_heads: usize = (0),
            #[serde(default)]
            linear_num_value_heads: usize = (0),
            #[serde(default)]
            linear_key_head_dim: usize = (0),
            #[serde(default)]
            linear_value_head_dim: usize = (0),
            #[serde(default)]
            linear_conv_kernel_dim: usize = (0),
            /// Width of the shared expert every token also runs (Qwen3.5 MoE,
            /// Qwen3-Next); 0 without one.
            #[serde(default)]
            shared_expert_intermediate_size: usize = (0),
            /// MTP layers the served model runs: the checkpoint's MTP head
            /// (`mtp.*`, one full-attention layer) when speculative decoding
            /// drafts with it (`method = "mtp"`), else 0. Each has a KV
            /// layer after the decoder's and resident weights.
            #[serde(default, skip_serializing_if = "crate::geometry::is_zero")]
            mtp_layers: usize = (0),
        }
    };
}
pub(crate) use with_geometry_fields;

macro_rules! define_model_geometry {
    ($($(#[$doc:meta])* $field:ident: $ty:ty = $default:tt,)*) => {
        /// Everything the plan needs to know about a model, and nothing more.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        pub struct ModelGeometry {
            $($(#[$doc])* pub $field: $ty,)*
        }
    };
}
with_geometry_fields!(define_model_geometry);

/// serde's `skip_serializing_if` for counts that are usually absent.
pub(crate) fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl ModelGeometry {
    /// Whether layer `i` has experts (the rule of transformers' Qwen3MoeDecoderLayer;
    /// every gpt_oss layer is sparse).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        match self.architecture {
            Architecture::GptOss | Architecture::Qwen35Moe => true,
            Architecture::Qwen35 => false,
            Architecture::Qwen3Moe | Architecture::Qwen3Next => {
                !self.mlp_only_layers.contains(&i)
                    && self.num_experts > 0
                    && self.decoder_sparse_step > 0
                    && (i + 1).is_multiple_of(self.decoder_sparse_step)
            }
        }
    }

    pub fn num_moe_layers(&self) -> usize {
        (0..self.num_layers)
            .filter(|&i| self.is_moe_layer(i))
            .count()
    }

    /// Attention span of layer `i` (full unless `layer_types` says sliding).
    pub fn layer_attention(&self, i: usize) -> LayerAttention {
        self.layer_types
            .get(i)
            .copied()
            .unwrap_or(LayerAttention::FullAttention)
    }

    /// Layers with a KV cache (full or sliding-window attention), the
    /// served MTP layers last.
    pub fn num_kv_layers(&self) -> usize {
        self.num_decoder_kv_layers() + self.mtp_layers
    }

    /// The decoder's layers with a KV cache (MTP layers not counted).
    pub fn num_decoder_kv_layers(&self) -> usize {
        (0..self.num_layers)
            .filter(|&i| self.layer_attention(i) != LayerAttention::LinearAttention)
            .count()
    }

    /// Gated DeltaNet layers (a recurrent state per sequence each).
    pub fn num_linear_layers(&self) -> usize {
        self.num_layers - self.num_decoder_kv_layers()
    }

    /// The Gated DeltaNet shape, when the model has such layers.
    pub fn delta_net(&self) -> Option<DeltaNetShape> {
        (self.num_linear_layers() > 0).then_some(DeltaNetShape {
            key_heads: self.linear_num_key_heads,
            value_heads: self.linear_num_value_heads,
            key_dim: self.linear_key_head_dim,
            value_dim: self.linear_value_head_dim,
            conv_kernel: self.linear_conv_kernel_dim,
        })
    }
}

/// The shape of a Gated DeltaNet layer. Each key head serves
/// `value_heads / key_heads` consecutive value heads (value head `h` reads
/// key head `h / (value_heads / key_heads)`, transformers' repeat_interleave).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub conv_kernel: usize,
}

impl DeltaNetShape {
    /// Width of the query (and of the key) projection: `key_heads × key_dim`.
    pub fn key_width(&self) -> usize {
        self.key_heads * self.key_dim
    }

    /// Width of the value projection (and of `z`, and of the output).
    pub fn value_width(&self) -> usize {
        self.value_heads * self.value_dim
    }

    /// Channels of the causal convolution: q, k and v, `2·key_width + value_width`.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }

    /// Inputs the convolution keeps between steps: `kernel − 1` per channel.
    pub fn conv_state_len(&self) -> usize {
        self.conv_kernel.saturating_sub(1)
    }

    /// Values of the convolution state of one layer and sequence.
    pub fn conv_state_elements(&self) -> usize {
        self.conv_channels() * self.conv_state_len()
    }

    /// Values of the delta-rule state of one layer and sequence:
    /// `value_heads × key_dim × value_dim`.
    pub fn ssm_state_elements(&self) -> usize {
        self.value_heads * self.key_dim * self.value_dim
    }

    /// Value heads each key head serves.
    pub fn group(&self) -> usize {
        self.value_heads / self.key_heads.max(1)
    }
}

/// Groups the plan and `inspect` report weight bytes by (which tensor
/// belongs to which: `checkpoint::groups`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightGroup {
    Embeddings,
    Attention,
    Router,
    Experts,
    DenseMlp,
    Norms,
    LmHead,
    /// Gated DeltaNet projections, convolution and gates.
    LinearAttention,
    /// The shared expert and its gate: read for every token.
    SharedExpert,
    /// The MTP head (`mtp.*`) when it drafts: its layer, `fc` and norms.
    /// Not in [`WeightGroup::ALL`]: a plan lists it only when it is served.
    Mtp,
}

impl WeightGroup {
    pub const ALL: [WeightGroup; 9] = [
        WeightGroup::Embeddings,
        WeightGroup::Attention,
        WeightGroup::LinearAttention,
        WeightGroup::Router,
        WeightGroup::Experts,
        WeightGroup::SharedExpert,
        WeightGroup::DenseMlp,
        WeightGroup::Norms,
        WeightGroup::LmHead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WeightGroup::Embeddings => "embeddings",
            WeightGroup::Attention => "attention",
            WeightGroup::Router => "router",
            WeightGroup::Experts => "experts",
            WeightGroup::DenseMlp => "dense_mlp",
            WeightGroup::Norms => "norms",
            WeightGroup::LmHead => "lm_head",
            WeightGroup::LinearAttention => "linear_attention",
            WeightGroup::SharedExpert => "shared_expert",
            WeightGroup::Mtp => "mtp",
        }
    }
}
