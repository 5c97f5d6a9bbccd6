//! The transformer, written once over [`Backend`]: qwen3_moe and gpt_oss are
//! the same stack of blocks with different options, loaded by
//! `qwen3_moe.rs` and `gpt_oss.rs` from a [`WeightSource`].

pub mod gpt_oss;
pub mod qwen3_moe;
pub mod rope;
pub mod source;

use thiserror::Error;

use crate::backend::{AttentionShape, Backend, BackendError, KvLayout, Matmul, RouterKind};
use crate::checkpoint::CheckpointError;
use crate::checkpoint::config::ModelConfig;
use crate::geometry::Architecture;
use crate::plan::Plan;
use crate::plan::ledger::Category;
use crate::plan::memory::{LOGITS, PROMPT_LOGITS, activation_elements};
use crate::step::StepBatch;
use rope::Rope;
pub use source::WeightSource;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("{0}")]
    Unsupported(String),
    #[error(
        "step of {rows} tokens and {seqs} sequences exceeds the planned {max_rows} tokens / {max_seqs} sequences"
    )]
    StepTooLarge {
        rows: usize,
        seqs: usize,
        max_rows: usize,
        max_seqs: usize,
    },
}

/// The feed-forward half of a layer.
pub enum Mlp<'w, B: Backend + 'w> {
    Moe {
        router: B::Linear<'w>,
        router_bias: Option<B::Vector<'w>>,
        experts: B::Experts<'w>,
    },
    Dense {
        gate: B::Linear<'w>,
        up: B::Linear<'w>,
        down: B::Linear<'w>,
    },
}

pub struct Layer<'w, B: Backend + 'w> {
    pub input_norm: B::Vector<'w>,
    pub post_attention_norm: B::Vector<'w>,
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
    pub attention: AttentionShape,
    pub mlp: Mlp<'w, B>,
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

pub struct Transformer<'w, B: Backend + 'w> {
    pub settings: ModelSettings,
    pub embed: B::Linear<'w>,
    pub layers: Vec<Layer<'w, B>>,
    pub norm: B::Vector<'w>,
    pub lm_head: B::Linear<'w>,
}

impl<'w, B: Backend + 'w> Transformer<'w, B> {
    /// Builds the model of `config` from `source`'s weights.
    pub fn load(
        backend: &B,
        config: &ModelConfig,
        source: &'w dyn WeightSource,
    ) -> Result<Self, ModelError> {
        match config.geometry.architecture {
            Architecture::Qwen3Moe => qwen3_moe::load(backend, config, source),
            Architecture::GptOss => gpt_oss::load(backend, config, source),
        }
    }

    /// Runs one step: every layer over `batch`'s rows, then the logits of
    /// `batch.logit_rows`, handed to `on_logits(first, count, values)` in
    /// groups of at most `max_num_seqs` rows (`count × vocab` values).
    pub fn forward(
        &self,
        b: &B,
        batch: &StepBatch,
        st: &mut Buffers<B>,
        on_logits: &mut dyn FnMut(usize, usize, &[f32]),
    ) -> Result<(), ModelError> {
        let rows = batch.rows();
        if rows > st.max_rows || batch.seqs.len() > st.max_seqs {
            return Err(ModelError::StepTooLarge {
                rows,
                seqs: batch.seqs.len(),
                max_rows: st.max_rows,
                max_seqs: st.max_seqs,
            });
        }
        if rows == 0 {
            return Ok(());
        }
        let s = &self.settings;
        let (h, eps) = (s.hidden_size, s.rms_norm_eps);
        b.load_step(batch, &mut st.step)?;
        b.rope_table(
            &st.step,
            &s.rope.inv_freq,
            s.rope.attention_factor,
            rows,
            &mut st.rope,
        )?;
        b.embed(&self.embed, &st.step, &mut st.hidden)?;

        for (index, layer) in self.layers.iter().enumerate() {
            // The previous layer's MLP output joins the residual here.
            if index == 0 {
                b.rmsnorm(&st.hidden, &layer.input_norm, eps, rows, h, &mut st.normed)?;
            } else {
                b.add_rmsnorm(
                    &mut st.hidden,
                    &st.block_out,
                    &layer.input_norm,
                    eps,
                    rows,
                    h,
                    &mut st.normed,
                )?;
            }
            self.attention(b, index, layer, rows, st)?;
            b.add_rmsnorm(
                &mut st.hidden,
                &st.block_out,
                &layer.post_attention_norm,
                eps,
                rows,
                h,
                &mut st.normed,
            )?;
            self.mlp(b, layer, rows, st)?;
        }
        b.add_rmsnorm(
            &mut st.hidden,
            &st.block_out,
            &self.norm,
            eps,
            rows,
            h,
            &mut st.normed,
        )?;

        // Logits only for the rows that are sampled (or asked for): up to
        // max_num_seqs rows at a time in `logits`, or, when prompt rows are
        // asked for too, in the planned `prompt_logits` chunk buffer.
        b.compact_rows(&mut st.normed, &st.step, h)?;
        let wanted = batch.logit_rows.len();
        let (out, chunk) = match &mut st.prompt_logits {
            Some(buffer) if wanted > st.max_seqs => (buffer, st.prompt_logit_rows),
            _ => (&mut st.logits, st.max_seqs),
        };
        let mut first = 0;
        while first < wanted {
            let count = (wanted - first).min(chunk);
            b.matmul(&mut [Matmul {
                x: &st.normed,
                x_row: first,
                rows: count,
                w: &self.lm_head,
                bias: None,
                out: &mut *out,
            }])?;
            b.read(out, count * s.vocab_size, &mut |values| {
                on_logits(first, count, values)
            })?;
            first += count;
        }
        Ok(())
    }

    fn attention(
        &self,
        b: &B,
        index: usize,
        layer: &Layer<'w, B>,
        rows: usize,
        st: &mut Buffers<B>,
    ) -> Result<(), ModelError> {
        let bias = |i: usize| layer.qkvo_bias.as_ref().map(|biases| &biases[i]);
        b.matmul(&mut [
            Matmul {
                x: &st.normed,
                x_row: 0,
                rows,
                w: &layer.q,
                bias: bias(0),
                out: &mut st.q,
            },
            Matmul {
                x: &st.normed,
                x_row: 0,
                rows,
                w: &layer.k,
                bias: bias(1),
                out: &mut st.k,
            },
            Matmul {
                x: &st.normed,
                x_row: 0,
                rows,
                w: &layer.v,
                bias: bias(2),
                out: &mut st.v,
            },
        ])?;
        let norms = layer
            .qk_norm
            .as_ref()
            .map(|(qn, kn)| (qn, kn, self.settings.rms_norm_eps));
        b.qk_norm_rope(
            &mut st.q,
            &mut st.k,
            norms,
            &st.rope,
            rows,
            &layer.attention,
        )?;
        b.attention(
            &st.q,
            &mut st.k,
            &mut st.v,
            &st.kv,
            index,
            &st.step,
            &layer.attention,
            layer.sinks.as_ref(),
            &mut st.workspace,
            &mut st.attn_out,
        )?;
        b.kv_append(&st.k, &st.v, &mut st.kv, index, &st.step)?;
        b.matmul(&mut [Matmul {
            x: &st.attn_out,
            x_row: 0,
            rows,
            w: &layer.o,
            bias: bias(3),
            out: &mut st.block_out,
        }])?;
        Ok(())
    }

    fn mlp(
        &self,
        b: &B,
        layer: &Layer<'w, B>,
        rows: usize,
        st: &mut Buffers<B>,
    ) -> Result<(), ModelError> {
        let s = &self.settings;
        match &layer.mlp {
            Mlp::Moe {
                router,
                router_bias,
                experts,
            } => {
                b.matmul(&mut [Matmul {
                    x: &st.normed,
                    x_row: 0,
                    rows,
                    w: router,
                    bias: router_bias.as_ref(),
                    out: &mut st.router_logits,
                }])?;
                b.route(
                    &st.router_logits,
                    rows,
                    s.num_experts,
                    s.top_k,
                    s.router,
                    &mut st.workspace,
                )?;
                b.moe(
                    &st.normed,
                    rows,
                    experts,
                    &mut st.workspace,
                    &mut st.block_out,
                )?;
            }
            Mlp::Dense { gate, up, down } => {
                let (Some(gate_out), Some(up_out)) = (st.dense_gate.as_mut(), st.dense_up.as_mut())
                else {
                    return Err(ModelError::Unsupported(
                        "a dense MLP layer without planned dense buffers".to_string(),
                    ));
                };
                b.matmul(&mut [
                    Matmul {
                        x: &st.normed,
                        x_row: 0,
                        rows,
                        w: gate,
                        bias: None,
                        out: gate_out,
                    },
                    Matmul {
                        x: &st.normed,
                        x_row: 0,
                        rows,
                        w: up,
                        bias: None,
                        out: up_out,
                    },
                ])?;
                b.silu_mul(gate_out, up_out, rows * s.intermediate_size)?;
                b.matmul(&mut [Matmul {
                    x: gate_out,
                    x_row: 0,
                    rows,
                    w: down,
                    bias: None,
                    out: &mut st.block_out,
                }])?;
            }
        }
        Ok(())
    }
}

/// Every buffer a forward step uses, allocated once from the plan and
/// charged to the ledger: the activation set, the one MoE workspace, the KV
/// cache and the step metadata.
pub struct Buffers<B: Backend> {
    pub max_rows: usize,
    pub max_seqs: usize,
    pub hidden: B::Buffer,
    pub normed: B::Buffer,
    pub q: B::Buffer,
    pub k: B::Buffer,
    pub v: B::Buffer,
    pub attn_out: B::Buffer,
    pub block_out: B::Buffer,
    pub router_logits: B::Buffer,
    pub rope: B::Buffer,
    pub dense_gate: Option<B::Buffer>,
    pub dense_up: Option<B::Buffer>,
    pub logits: B::Buffer,
    /// Rows of prompt logits computed at once, where the plan has a
    /// `prompt_logits` buffer (more rows than `logits`).
    pub prompt_logits: Option<B::Buffer>,
    pub prompt_logit_rows: usize,
    pub step: B::Step,
    pub workspace: B::Workspace,
    pub kv: B::KvCache,
}

impl<B: Backend> Buffers<B> {
    /// Allocates exactly what `plan` lists for activations, the MoE
    /// workspace and the KV cache.
    pub fn allocate(b: &B, plan: &Plan, kv: &KvLayout) -> Result<Self, ModelError> {
        let t = plan.serving.max_num_batched_tokens;
        let s = plan.serving.max_num_seqs;
        let find = |name: &str| plan.activations.buffers.iter().find(|buf| buf.name == name);
        let alloc = |name: &'static str| -> Result<B::Buffer, ModelError> {
            let planned = find(name).ok_or_else(|| {
                ModelError::Unsupported(format!("the plan lists no activation buffer {name}"))
            })?;
            let elements = activation_elements(planned.bytes);
            Ok(b.alloc(Category::Activations, name, elements, planned.placement)?)
        };
        let dense = find("dense_gate").is_some();
        let vocab = plan.model.vocab_size.max(1);
        let prompt_logit_rows =
            find(PROMPT_LOGITS).map_or(0, |buf| activation_elements(buf.bytes) / vocab);
        Ok(Buffers {
            max_rows: t,
            max_seqs: s,
            hidden: alloc("hidden")?,
            normed: alloc("normed")?,
            q: alloc("q")?,
            k: alloc("k")?,
            v: alloc("v")?,
            attn_out: alloc("attention_output")?,
            block_out: alloc("block_output")?,
            router_logits: alloc("router_logits")?,
            rope: alloc("rope")?,
            dense_gate: if dense {
                Some(alloc("dense_gate")?)
            } else {
                None
            },
            dense_up: if dense {
                Some(alloc("dense_up")?)
            } else {
                None
            },
            logits: alloc(LOGITS)?,
            prompt_logits: if prompt_logit_rows > 0 {
                Some(alloc(PROMPT_LOGITS)?)
            } else {
                None
            },
            prompt_logit_rows,
            step: b.step_storage(&plan.step_metadata)?,
            workspace: b.workspace(&plan.moe_workspace)?,
            kv: b.kv_cache(kv, plan.model.num_layers)?,
        })
    }
}
