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

/// Everything the plan needs to know about a model, and nothing more.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelGeometry {
    pub architecture: Architecture,
    pub quantization: Quantization,
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Intermediate size of one expert.
    pub moe_intermediate_size: usize,
    /// Intermediate size of a dense MLP layer (qwen3_moe `mlp_only_layers`); 0 if none.
    pub intermediate_size: usize,
    /// Layers with a dense MLP instead of experts (qwen3_moe).
    pub mlp_only_layers: Vec<usize>,
    /// A layer `i` is sparse when `(i + 1) % decoder_sparse_step == 0` (qwen3_moe).
    pub decoder_sparse_step: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v/o projections carry biases (gpt_oss).
    pub attention_bias: bool,
    /// Per-layer attention span; empty means every layer is full attention.
    pub layer_types: Vec<LayerAttention>,
    /// Window of sliding-attention layers, in tokens.
    pub sliding_window: Option<usize>,
}

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
