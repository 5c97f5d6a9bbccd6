//! qwen3_5_moe (Qwen3.5 / Qwen3.6 MoE), qwen3_5 (dense) and qwen3_next
//! (Qwen3-Next): three Gated DeltaNet layers to one gated-attention layer
//! (`layer_types`), every decoder RMSNorm zero-centred (`x̂ · (1 + w)`,
//! the weights stored around 0), partial RoPE on the first `rotary_dim`
//! dims of each head, softmax-then-top-k routing renormalised, SwiGLU
//! experts plus a shared expert weighted by `sigmoid(shared_expert_gate)`
//! (qwen3_5: a dense SwiGLU MLP).
//!
//! The Qwen3.5 checkpoints are vision-language models: the decoder lives
//! under `model.language_model.`; the vision tower (`model.visual.`) is
//! never read, the MTP head (`mtp.`) only when it drafts. Qwen3-Next is text-only, under
//! `model.`, and fuses each GDN layer's input projections by key head
//! (`in_proj_qkvz`, `in_proj_ba`, unfused by `Backend::gdn_unfuse`).
//! Experts are read one tensor per expert (what transformers writes) or
//! stacked (`mlp.experts.gate_up_proj` `[E, 2I, H]`, gate rows first, and
//! `mlp.experts.down_proj` `[E, H, I]`, as Qwen publishes them).

use super::error::ModelError;
use super::layers::{
    Attention, DeltaNet, DeltaNetInput, Layer, Mixer, Mlp, ModelSettings, MtpHead, SharedExpert,
};
use super::rope::Rope;
use super::source::WeightSource;
use super::transformer::Transformer;
use crate::backend::{AttentionShape, Backend, ExpertActivation, ExpertsSpec, GateUp, RouterKind};
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::linear::LinearWeight;
use crate::geometry::{Architecture, LayerAttention, MTP_PREFIX};

pub fn load<'w, B: Backend + 'w>(
    b: &B,
    config: &ModelConfig,
    src: &'w dyn WeightSource,
) -> Result<Transformer<'w, B>, ModelError> {
    let rotary_dim = config.rotary_dim();
    let settings = ModelSettings::of(
        config,
        RouterKind::SoftmaxTopK {
            renormalize: config.norm_topk_prob,
        },
        // For text, mRoPE's three positions are the token's index: plain
        // RoPE over the rotary dims.
        Rope::plain(config.rope_theta, rotary_dim),
    );
    let shape = AttentionShape {
        heads: config.geometry.num_attention_heads,
        kv_heads: config.geometry.num_kv_heads,
        head_dim: config.geometry.head_dim,
        rotary_dim,
        scale: 1.0 / (config.geometry.head_dim as f32).sqrt(),
        window: None,
    };
    let text = config.geometry.architecture.text_prefix();
    // Experts stacked, or one tensor each: as the first MoE layer has them
    // (the checker holds every layer to the same layout).
    let stacked = (0..config.geometry.num_layers)
        .find(|&i| config.geometry.is_moe_layer(i))
        .is_some_and(|i| experts_stacked(src, &format!("{text}.layers.{i}")));
    // A zero-centred norm: its weight is read as `1 + w`.
    let norm = |name: &str| -> Result<B::Vector<'w>, ModelError> {
        Ok(b.vector(src.vector(name)?.zero_centred())?)
    };
    let (mut kv_layers, mut state_layers) = (0, 0);
    let mut layers = Vec::with_capacity(config.geometry.num_layers);
    for i in 0..config.geometry.num_layers {
        let p = format!("{text}.layers.{i}");
        let mixer = match config.layer_attention(i) {
            LayerAttention::LinearAttention => {
                let net = delta_net(b, config, src, &p, state_layers)?;
                state_layers += 1;
                Mixer::DeltaNet(net)
            }
            LayerAttention::FullAttention => {
                let attention = gated_attention(b, src, &p, shape, &norm)?;
                let kv_layer = kv_layers;
                kv_layers += 1;
                Mixer::Attention {
                    attention,
                    kv_layer,
                }
            }
            LayerAttention::SlidingAttention => {
                return Err(ModelError::Unsupported(format!(
                    "{} has no sliding-attention layers",
                    config.geometry.architecture.name()
                )));
            }
        };
        let mlp = mlp(b, config, src, &p, config.geometry.is_moe_layer(i), stacked)?;
        layers.push(Layer {
            input_norm: norm(&format!("{p}.input_layernorm.weight"))?,
            post_attention_norm: norm(&format!("{p}.post_attention_layernorm.weight"))?,
            mixer,
            mlp,
        });
    }
    let lm_head = if config.geometry.tie_word_embeddings {
        format!("{text}.embed_tokens")
    } else {
        "lm_head".to_string()
    };
    let mtp = match config.geometry.mtp_layers {
        0 => None,
        1 => Some(mtp_head(b, config, src, shape, kv_layers, &norm)?),
        n => {
            return Err(ModelError::Unsupported(format!(
                "an MTP head of {n} layers (sparkrt serves one-layer heads)"
            )));
        }
    };
    Ok(Transformer {
        settings,
        embed: b.linear(src.linear(&format!("{text}.embed_tokens"))?)?,
        layers,
        norm: norm(&format!("{text}.norm.weight"))?,
        lm_head: b.linear(src.linear(&lm_head)?)?,
        mtp,
    })
}

/// Whether the layer of prefix `p` keeps its experts stacked
/// (`mlp.experts.gate_up_proj`) rather than one tensor each.
fn experts_stacked(src: &dyn WeightSource, p: &str) -> bool {
    src.flat_vector(&format!("{p}.mlp.experts.gate_up_proj"))
        .is_ok()
}

/// A zero-centred norm's weight, read as `1 + w`.
type NormReader<'a, 'w, B> = dyn Fn(&str) -> Result<<B as Backend>::Vector<'w>, ModelError> + 'a;

/// The gated attention of layer prefix `p` (`q_proj` emits query and gate).
fn gated_attention<'w, B: Backend + 'w>(
    b: &B,
    src: &'w dyn WeightSource,
    p: &str,
    shape: AttentionShape,
    norm: &NormReader<'_, 'w, B>,
) -> Result<Attention<'w, B>, ModelError> {
    let attn = |name: &str| src.linear(&format!("{p}.self_attn.{name}"));
    Ok(Attention {
        q: b.linear(attn("q_proj")?)?,
        k: b.linear(attn("k_proj")?)?,
        v: b.linear(attn("v_proj")?)?,
        o: b.linear(attn("o_proj")?)?,
        qkvo_bias: None,
        qk_norm: Some((
            norm(&format!("{p}.self_attn.q_norm.weight"))?,
            norm(&format!("{p}.self_attn.k_norm.weight"))?,
        )),
        sinks: None,
        output_gate: true,
        shape,
    })
}

/// The MLP of layer prefix `p`: routed experts with the shared expert, or
/// a dense SwiGLU.
fn mlp<'w, B: Backend + 'w>(
    b: &B,
    config: &ModelConfig,
    src: &'w dyn WeightSource,
    p: &str,
    experts: bool,
    stacked: bool,
) -> Result<Mlp<'w, B>, ModelError> {
    if experts {
        return moe(b, config, src, p, stacked);
    }
    let dense = |name: &str| src.linear(&format!("{p}.mlp.{name}"));
    Ok(Mlp::Dense {
        gate: b.linear(dense("gate_proj")?)?,
        up: b.linear(dense("up_proj")?)?,
        down: b.linear(dense("down_proj")?)?,
    })
}

/// The checkpoint's one-layer MTP head (`mtp.*`): a gated-attention layer
/// with the decoder's kind of MLP, on KV layer `kv_layer` (after the
/// decoder's); its embedding and lm_head are the decoder's.
fn mtp_head<'w, B: Backend + 'w>(
    b: &B,
    config: &ModelConfig,
    src: &'w dyn WeightSource,
    shape: AttentionShape,
    kv_layer: usize,
    norm: &NormReader<'_, 'w, B>,
) -> Result<MtpHead<'w, B>, ModelError> {
    let m = MTP_PREFIX;
    let p = format!("{m}layers.0");
    let experts = config.geometry.num_experts > 0;
    let stacked = experts && experts_stacked(src, &p);
    Ok(MtpHead {
        embedding_norm: norm(&format!("{m}pre_fc_norm_embedding.weight"))?,
        hidden_norm: norm(&format!("{m}pre_fc_norm_hidden.weight"))?,
        fc: b.linear(src.linear(&format!("{m}fc"))?)?,
        layer: Layer {
            input_norm: norm(&format!("{p}.input_layernorm.weight"))?,
            post_attention_norm: norm(&format!("{p}.post_attention_layernorm.weight"))?,
            mixer: Mixer::Attention {
                attention: gated_attention(b, src, &p, shape, norm)?,
                kv_layer,
            },
            mlp: mlp(b, config, src, &p, experts, stacked)?,
        },
        norm: norm(&format!("{m}norm.weight"))?,
    })
}

/// The Gated DeltaNet of layer prefix `p`, the `state_layer`-th of its kind.
fn delta_net<'w, B: Backend + 'w>(
    b: &B,
    config: &ModelConfig,
    src: &'w dyn WeightSource,
    p: &str,
    state_layer: usize,
) -> Result<DeltaNet<'w, B>, ModelError> {
    let shape = config.geometry.delta_net().ok_or_else(|| {
        ModelError::Unsupported("a linear_attention layer without its geometry".to_string())
    })?;
    let linear = |name: &str| -> Result<B::Linear<'w>, ModelError> {
        Ok(b.linear(src.linear(&format!("{p}.linear_attn.{name}"))?)?)
    };
    let vector = |name: &str| -> Result<B::Vector<'w>, ModelError> {
        Ok(b.vector(src.vector(&format!("{p}.linear_attn.{name}"))?)?)
    };
    let input = if config.geometry.architecture == Architecture::Qwen3Next {
        DeltaNetInput::Fused {
            qkvz: linear("in_proj_qkvz")?,
            ba: linear("in_proj_ba")?,
        }
    } else {
        DeltaNetInput::Split {
            qkv: linear("in_proj_qkv")?,
            z: linear("in_proj_z")?,
            b: linear("in_proj_b")?,
            a: linear("in_proj_a")?,
        }
    };
    Ok(DeltaNet {
        input,
        conv: b.vector(src.flat_vector(&format!("{p}.linear_attn.conv1d.weight"))?)?,
        a_log: vector("A_log")?,
        dt_bias: vector("dt_bias")?,
        norm: vector("norm.weight")?,
        out_proj: linear("out_proj")?,
        shape,
        state_layer,
    })
}

/// The routed experts, the router and the shared expert of layer prefix `p`.
fn moe<'w, B: Backend + 'w>(
    b: &B,
    config: &ModelConfig,
    src: &'w dyn WeightSource,
    p: &str,
    stacked: bool,
) -> Result<Mlp<'w, B>, ModelError> {
    let (e, i) = (
        config.geometry.num_experts,
        config.geometry.moe_intermediate_size,
    );
    let experts = 0..e;
    let collect = |f: &dyn Fn(usize) -> Result<LinearWeight<'w>, ModelError>| {
        experts.clone().map(f).collect::<Result<Vec<_>, _>>()
    };
    let (gate, up, down) = if stacked {
        let gate_up = format!("{p}.mlp.experts.gate_up_proj");
        let down = format!("{p}.mlp.experts.down_proj");
        (
            collect(&|x| src.stacked_rows(&gate_up, x, 0, i))?,
            collect(&|x| src.stacked_rows(&gate_up, x, i, i))?,
            collect(&|x| src.stacked_rows(&down, x, 0, config.geometry.hidden_size))?,
        )
    } else {
        let expert = |x: usize, proj: &str| src.linear(&format!("{p}.mlp.experts.{x}.{proj}"));
        (
            collect(&|x| expert(x, "gate_proj"))?,
            collect(&|x| expert(x, "up_proj"))?,
            collect(&|x| expert(x, "down_proj"))?,
        )
    };
    let spec = ExpertsSpec {
        gate_up: GateUp::Split { gate, up },
        down,
        down_bias: Vec::new(),
        activation: ExpertActivation::SiluMul,
        hidden_size: config.geometry.hidden_size,
        intermediate_size: i,
    };
    let shared = |name: &str| -> Result<B::Linear<'w>, ModelError> {
        Ok(b.linear(src.linear(&format!("{p}.mlp.{name}"))?)?)
    };
    Ok(Mlp::Moe {
        router: shared("gate")?,
        router_bias: None,
        experts: b.experts(spec)?,
        shared: Some(SharedExpert {
            gate_proj: shared("shared_expert.gate_proj")?,
            up_proj: shared("shared_expert.up_proj")?,
            down_proj: shared("shared_expert.down_proj")?,
            gate: shared("shared_expert_gate")?,
            intermediate_size: config.geometry.shared_expert_intermediate_size,
        }),
    })
}
