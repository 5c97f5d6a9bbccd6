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
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Qwen3Moe => "qwen3_moe",
            Architecture::GptOss => "gpt_oss",
        }
    }
}

/// How the weights are stored. Attention, router, embeddings, norms and
/// lm_head stay in bf16 in every format sparkrt reads; only experts (and, for
/// NVFP4, dense MLPs) are quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantization {
    Bf16,
    Nvfp4,
    Mxfp4,
}

impl Quantization {
    pub fn name(self) -> &'static str {
        match self {
            Quantization::Bf16 => "bf16",
            Quantization::Nvfp4 => "nvfp4",
            Quantization::Mxfp4 => "mxfp4",
        }
    }
}

/// Attention span of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerAttention {
    FullAttention,
    SlidingAttention,
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
            quantization: $crate::geometry::Quantization = required,
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

impl ModelGeometry {
    /// Whether layer `i` has experts (the rule of transformers' Qwen3MoeDecoderLayer;
    /// every gpt_oss layer is sparse).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        match self.architecture {
            Architecture::GptOss => true,
            Architecture::Qwen3Moe => {
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
}

impl WeightGroup {
    pub const ALL: [WeightGroup; 7] = [
        WeightGroup::Embeddings,
        WeightGroup::Attention,
        WeightGroup::Router,
        WeightGroup::Experts,
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
        }
    }
}
