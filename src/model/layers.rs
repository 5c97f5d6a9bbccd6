//! The pieces a model is built of, over [`Backend`]: a layer's token mixer
//! (attention or a Gated DeltaNet) and MLP, and the settings every layer
//! shares. The architectures' loaders fill these in; the transformer runs
//! them.

use super::rope::Rope;
use crate::backend::{AttentionShape, Backend, DeltaNetShape, RouterKind};
use crate::checkpoint::config::ModelConfig;
use crate::geometry::Architecture;

/// The feed-forward half of a layer.
pub enum Mlp<'w, B: Backend + 'w> {
    Moe {
        router: B::Linear<'w>,
        router_bias: Option<B::Vector<'w>>,
        experts: B::Experts<'w>,
        /// An expert every token runs, weighted by its gate (qwen3_5_moe,
        /// qwen3_next).
        shared: Option<SharedExpert<'w, B>>,
    },
    Dense {
        gate: B::Linear<'w>,
        up: B::Linear<'w>,
        down: B::Linear<'w>,
    },
}

/// A SwiGLU expert run on every token, its output scaled by
/// `sigmoid(gate · x)` (`gate`: `[1, H]`).
pub struct SharedExpert<'w, B: Backend + 'w> {
    pub gate_proj: B::Linear<'w>,
    pub up_proj: B::Linear<'w>,
    pub down_proj: B::Linear<'w>,
    pub gate: B::Linear<'w>,
    pub intermediate_size: usize,
}

/// How a block mixes tokens.
pub enum Mixer<'w, B: Backend + 'w> {
    /// Softmax attention over the KV cache; `kv_layer` is the layer's index
    /// among the layers with a KV cache.
    Attention {
        attention: Attention<'w, B>,
        kv_layer: usize,
    },
    /// A Gated DeltaNet (linear attention with a recurrent state).
    DeltaNet(DeltaNet<'w, B>),
}

/// A Gated DeltaNet's input projections.
pub enum DeltaNetInput<'w, B: Backend + 'w> {
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` (qwen3_5).
    Split {
        qkv: B::Linear<'w>,
        z: B::Linear<'w>,
        b: B::Linear<'w>,
        a: B::Linear<'w>,
    },
    /// qwen3_next's `in_proj_qkvz` and `in_proj_ba`, grouped by key head.
    Fused {
        qkvz: B::Linear<'w>,
        ba: B::Linear<'w>,
    },
}

pub struct DeltaNet<'w, B: Backend + 'w> {
    pub input: DeltaNetInput<'w, B>,
    /// The depthwise convolution, `[channels × kernel]`.
    pub conv: B::Vector<'w>,
    pub a_log: B::Vector<'w>,
    pub dt_bias: B::Vector<'w>,
    /// The gated output norm's weight (`x̂ · w`, not zero-centred).
    pub norm: B::Vector<'w>,
    pub out_proj: B::Linear<'w>,
    pub shape: DeltaNetShape,
    /// The layer's index in the recurrent-state pool.
    pub state_layer: usize,
}

pub struct Layer<'w, B: Backend + 'w> {
    pub input_norm: B::Vector<'w>,
    pub post_attention_norm: B::Vector<'w>,
    pub mixer: Mixer<'w, B>,
    pub mlp: Mlp<'w, B>,
}

pub struct Attention<'w, B: Backend + 'w> {
    pub q: B::Linear<'w>,
    pub k: B::Linear<'w>,
    pub v: B::Linear<'w>,
    pub o: B::Linear<'w>,
    /// q/k/v/o biases (gpt_oss).
    pub qkvo_bias: Option<[B::Vector<'w>; 4]>,
    /// Per-head RMSNorm of q and k before RoPE (qwen3_moe).
    pub qk_norm: Option<(B::Vector<'w>, B::Vector<'w>)>,
    /// One learned sink logit per head (gpt_oss).
    pub sinks: Option<B::Vector<'w>>,
    /// `q_proj` also emits a gate per head; the output is scaled by its
    /// sigmoid before `o_proj` (qwen3_5, qwen3_next).
    pub output_gate: bool,
    pub shape: AttentionShape,
}

/// Settings shared by every layer.
#[derive(Clone, Debug)]
pub struct ModelSettings {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub num_experts: usize,
    pub top_k: usize,
    /// Width of a dense MLP layer (qwen3_moe `mlp_only_layers`).
    pub intermediate_size: usize,
    pub rms_norm_eps: f32,
    pub router: RouterKind,
    pub rope: Rope,
}

impl ModelSettings {
    /// The settings every architecture reads from its config, with its own
    /// router and RoPE.
    pub fn of(config: &ModelConfig, router: RouterKind, rope: Rope) -> ModelSettings {
        ModelSettings {
            architecture: config.geometry.architecture,
            hidden_size: config.geometry.hidden_size,
            vocab_size: config.geometry.vocab_size,
            num_experts: config.geometry.num_experts,
            top_k: config.geometry.top_k,
            intermediate_size: config.geometry.intermediate_size,
            rms_norm_eps: config.rms_norm_eps as f32,
            router,
            rope,
        }
    }
}

/// A multi-token-prediction head (Qwen3.5's and Qwen3-Next's `mtp.*`, as
/// vLLM's `qwen3_5_mtp.py` wires it): for position `t` it reads the
/// target's last hidden state `H[t]` (after the final norm) and the token
/// at `t + 1`, and its logits guess the token at `t + 2`:
/// `norm(layer(fc([embedding_norm(embed(x)) | hidden_norm(H)])))` through
/// the target's lm_head. Applied again to its own output it drafts further.
pub struct MtpHead<'w, B: Backend + 'w> {
    pub embedding_norm: B::Vector<'w>,
    pub hidden_norm: B::Vector<'w>,
    /// `[H, 2H]`: the embedding's half of the input first.
    pub fc: B::Linear<'w>,
    /// A full-attention decoder layer, on the KV layer after the decoder's.
    pub layer: Layer<'w, B>,
    pub norm: B::Vector<'w>,
}
