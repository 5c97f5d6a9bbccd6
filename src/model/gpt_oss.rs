//! gpt_oss (gpt-oss-20b, gpt-oss-120b): attention biases and per-head sinks,
//! sliding-window layers, YaRN RoPE, top-k-then-softmax routing with a bias,
//! MXFP4 experts with interleaved gate/up rows and a clamped SwiGLU.

use super::error::ModelError;
use super::layers::{Attention, Layer, Mixer, Mlp, ModelSettings};
use super::rope::{Rope, Yarn};
use super::source::WeightSource;
use super::transformer::Transformer;
use crate::backend::{AttentionShape, Backend, ExpertActivation, ExpertsSpec, GateUp, RouterKind};
use crate::checkpoint::config::ModelConfig;
use crate::geometry::{LayerAttention, Quantization};

/// The sigmoid slope of gpt_oss's SwiGLU.
const SWIGLU_ALPHA: f32 = 1.702;
/// transformers' default `swiglu_limit`.
const DEFAULT_SWIGLU_LIMIT: f64 = 7.0;

pub fn load<'w, B: Backend + 'w>(
    b: &B,
    config: &ModelConfig,
    src: &'w dyn WeightSource,
) -> Result<Transformer<'w, B>, ModelError> {
    let rope = match &config.rope_scaling {
        Some(y) => Rope::yarn(
            config.rope_theta,
            config.geometry.head_dim,
            &Yarn {
                factor: y.factor,
                beta_fast: y.beta_fast,
                beta_slow: y.beta_slow,
                truncate: y.truncate,
                original_max_position_embeddings: y.original_max_position_embeddings as f64,
                attention_factor: y.attention_factor,
            },
        ),
        None => Rope::plain(config.rope_theta, config.geometry.head_dim),
    };
    // No dense layers: `intermediate_size` is never read.
    let settings = ModelSettings::of(config, RouterKind::TopKSoftmax, rope);
    let limit = config.swiglu_limit.unwrap_or(DEFAULT_SWIGLU_LIMIT) as f32;
    let mxfp4 = config.quantization_method() == Quantization::Mxfp4;
    let mut layers = Vec::with_capacity(config.geometry.num_layers);
    for i in 0..config.geometry.num_layers {
        let p = format!("model.layers.{i}");
        let window = match config.geometry.layer_types.get(i) {
            Some(LayerAttention::SlidingAttention) => config.geometry.sliding_window,
            _ => None,
        };
        let experts = 0..config.geometry.num_experts;
        let stacked = |name: &str, e: usize| {
            if mxfp4 {
                src.stacked_expert(&format!("{p}.mlp.experts.{name}"), e)
            } else {
                Err(ModelError::Unsupported(
                    "gpt_oss experts are read in MXFP4 only".to_string(),
                ))
            }
        };
        let spec = ExpertsSpec {
            gate_up: GateUp::Interleaved {
                gate_up: experts
                    .clone()
                    .map(|e| stacked("gate_up_proj", e))
                    .collect::<Result<_, _>>()?,
                bias: experts
                    .clone()
                    .map(|e| src.vector_row(&format!("{p}.mlp.experts.gate_up_proj_bias"), e))
                    .collect::<Result<_, _>>()?,
            },
            down: experts
                .clone()
                .map(|e| stacked("down_proj", e))
                .collect::<Result<_, _>>()?,
            down_bias: experts
                .map(|e| src.vector_row(&format!("{p}.mlp.experts.down_proj_bias"), e))
                .collect::<Result<_, _>>()?,
            activation: ExpertActivation::ClampedSwiglu {
                limit,
                alpha: SWIGLU_ALPHA,
            },
            hidden_size: config.geometry.hidden_size,
            intermediate_size: config.geometry.moe_intermediate_size,
        };
        let attn = |name: &str| src.linear(&format!("{p}.self_attn.{name}"));
        let bias = |name: &str| src.vector(&format!("{p}.self_attn.{name}.bias"));
        let attention = Attention {
            q: b.linear(attn("q_proj")?)?,
            k: b.linear(attn("k_proj")?)?,
            v: b.linear(attn("v_proj")?)?,
            o: b.linear(attn("o_proj")?)?,
            qkvo_bias: Some([
                b.vector(bias("q_proj")?)?,
                b.vector(bias("k_proj")?)?,
                b.vector(bias("v_proj")?)?,
                b.vector(bias("o_proj")?)?,
            ]),
            qk_norm: None,
            sinks: Some(b.vector(src.vector(&format!("{p}.self_attn.sinks"))?)?),
            output_gate: false,
            shape: AttentionShape {
                heads: config.geometry.num_attention_heads,
                kv_heads: config.geometry.num_kv_heads,
                head_dim: config.geometry.head_dim,
                rotary_dim: config.geometry.head_dim,
                scale: 1.0 / (config.geometry.head_dim as f32).sqrt(),
                window,
            },
        };
        layers.push(Layer {
            input_norm: b.vector(src.vector(&format!("{p}.input_layernorm.weight"))?)?,
            post_attention_norm: b
                .vector(src.vector(&format!("{p}.post_attention_layernorm.weight"))?)?,
            mixer: Mixer::Attention {
                attention,
                kv_layer: i,
            },
            mlp: Mlp::Moe {
                router: b.linear(src.linear(&format!("{p}.mlp.router"))?)?,
                router_bias: Some(b.vector(src.vector(&format!("{p}.mlp.router.bias"))?)?),
                experts: b.experts(spec)?,
                shared: None,
            },
        });
    }
    Ok(Transformer {
        settings,
        embed: b.linear(src.linear("model.embed_tokens")?)?,
        layers,
        norm: b.vector(src.vector("model.norm.weight")?)?,
        lm_head: b.linear(src.linear("lm_head")?)?,
        mtp: None,
    })
}
