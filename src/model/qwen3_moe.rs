//! qwen3_moe (Qwen3-30B-A3B, Qwen3-235B-A22B): q/k RMSNorm before plain
//! RoPE, softmax-then-top-k routing, SwiGLU experts, optional dense layers.

use super::error::ModelError;
use super::layers::{Attention, Layer, Mixer, Mlp, ModelSettings};
use super::rope::Rope;
use super::source::WeightSource;
use super::transformer::Transformer;
use crate::backend::{AttentionShape, Backend, ExpertActivation, ExpertsSpec, GateUp, RouterKind};
use crate::checkpoint::config::ModelConfig;

pub fn load<'w, B: Backend + 'w>(
    b: &B,
    config: &ModelConfig,
    src: &'w dyn WeightSource,
) -> Result<Transformer<'w, B>, ModelError> {
    let settings = ModelSettings::of(
        config,
        RouterKind::SoftmaxTopK {
            renormalize: config.norm_topk_prob,
        },
        Rope::plain(config.rope_theta, config.geometry.head_dim),
    );
    let shape = AttentionShape {
        heads: config.geometry.num_attention_heads,
        kv_heads: config.geometry.num_kv_heads,
        head_dim: config.geometry.head_dim,
        rotary_dim: config.geometry.head_dim,
        scale: 1.0 / (config.geometry.head_dim as f32).sqrt(),
        window: None,
    };
    let mut layers = Vec::with_capacity(config.geometry.num_layers);
    for i in 0..config.geometry.num_layers {
        let p = format!("model.layers.{i}");
        let mlp = if config.geometry.is_moe_layer(i) {
            let expert = |e: usize, proj: &str| src.linear(&format!("{p}.mlp.experts.{e}.{proj}"));
            let experts = 0..config.geometry.num_experts;
            let spec = ExpertsSpec {
                gate_up: GateUp::Split {
                    gate: experts
                        .clone()
                        .map(|e| expert(e, "gate_proj"))
                        .collect::<Result<_, _>>()?,
                    up: experts
                        .clone()
                        .map(|e| expert(e, "up_proj"))
                        .collect::<Result<_, _>>()?,
                },
                down: experts
                    .map(|e| expert(e, "down_proj"))
                    .collect::<Result<_, _>>()?,
                down_bias: Vec::new(),
                activation: ExpertActivation::SiluMul,
                hidden_size: config.geometry.hidden_size,
                intermediate_size: config.geometry.moe_intermediate_size,
            };
            Mlp::Moe {
                router: b.linear(src.linear(&format!("{p}.mlp.gate"))?)?,
                router_bias: None,
                experts: b.experts(spec)?,
                shared: None,
            }
        } else {
            Mlp::Dense {
                gate: b.linear(src.linear(&format!("{p}.mlp.gate_proj"))?)?,
                up: b.linear(src.linear(&format!("{p}.mlp.up_proj"))?)?,
                down: b.linear(src.linear(&format!("{p}.mlp.down_proj"))?)?,
            }
        };
        let attention = Attention {
            q: b.linear(src.linear(&format!("{p}.self_attn.q_proj"))?)?,
            k: b.linear(src.linear(&format!("{p}.self_attn.k_proj"))?)?,
            v: b.linear(src.linear(&format!("{p}.self_attn.v_proj"))?)?,
            o: b.linear(src.linear(&format!("{p}.self_attn.o_proj"))?)?,
            qkvo_bias: None,
            qk_norm: Some((
                b.vector(src.vector(&format!("{p}.self_attn.q_norm.weight"))?)?,
                b.vector(src.vector(&format!("{p}.self_attn.k_norm.weight"))?)?,
            )),
            sinks: None,
            output_gate: false,
            shape,
        };
        layers.push(Layer {
            input_norm: b.vector(src.vector(&format!("{p}.input_layernorm.weight"))?)?,
            post_attention_norm: b
                .vector(src.vector(&format!("{p}.post_attention_layernorm.weight"))?)?,
            mixer: Mixer::Attention {
                attention,
                kv_layer: i,
            },
            mlp,
        });
    }
    let lm_head = if config.geometry.tie_word_embeddings {
        "model.embed_tokens"
    } else {
        "lm_head"
    };
    Ok(Transformer {
        settings,
        embed: b.linear(src.linear("model.embed_tokens")?)?,
        layers,
        norm: b.vector(src.vector("model.norm.weight")?)?,
        lm_head: b.linear(src.linear(lm_head)?)?,
        mtp: None,
    })
}
