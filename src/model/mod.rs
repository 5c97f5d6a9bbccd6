//! The transformer, written once over [`Backend`]: qwen3_moe, gpt_oss,
//! qwen3_5_moe, qwen3_5 and qwen3_next are the same stack of blocks with
//! different options, loaded by `qwen3_moe.rs`, `gpt_oss.rs` and
//! `qwen3_5.rs` from a [`WeightSource`]. A block mixes tokens with
//! attention or with a Gated DeltaNet ([`Mixer`]), then runs its MLP.

pub mod gpt_oss;
pub mod qwen3_5;
pub mod qwen3_moe;
pub mod rope;
pub mod source;

use thiserror::Error;

use crate::backend::{
    AttentionShape, Backend, BackendError, DeltaNetShape, DeltaRuleGates, KvLayout, Matmul,
    RouterKind,
};
use crate::checkpoint::CheckpointError;
use crate::checkpoint::config::ModelConfig;
use crate::geometry::Architecture;
use crate::plan::Plan;
use crate::plan::ledger::Category;
use crate::plan::memory::{self as plan_memory, LOGITS, PROMPT_LOGITS, activation_elements};
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
            Architecture::Qwen35Moe | Architecture::Qwen35 | Architecture::Qwen3Next => {
                qwen3_5::load(backend, config, source)
            }
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
            match &layer.mixer {
                Mixer::Attention {
                    attention,
                    kv_layer,
                } => self.attention(b, *kv_layer, attention, rows, st)?,
                Mixer::DeltaNet(net) => self.delta_net(b, net, rows, st)?,
            }
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
        layer: &Attention<'w, B>,
        rows: usize,
        st: &mut Buffers<B>,
    ) -> Result<(), ModelError> {
        let bias = |i: usize| layer.qkvo_bias.as_ref().map(|biases| &biases[i]);
        // A gated layer's q_proj writes query and gate, split below.
        let query_out = match (layer.output_gate, st.hybrid.as_mut()) {
            (false, _) => &mut st.q,
            (true, Some(h)) => &mut h.query_gate,
            (true, None) => return Err(missing_buffers("gated attention")),
        };
        b.matmul(&mut [
            Matmul {
                x: &st.normed,
                x_row: 0,
                rows,
                w: &layer.q,
                bias: bias(0),
                out: query_out,
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
        let shape = &layer.shape;
        if layer.output_gate
            && let Some(h) = st.hybrid.as_mut()
        {
            b.split_query_gate(
                &h.query_gate,
                rows,
                shape.heads,
                shape.head_dim,
                &mut st.q,
                &mut h.attention_gate,
            )?;
        }
        let norms = layer
            .qk_norm
            .as_ref()
            .map(|(qn, kn)| (qn, kn, self.settings.rms_norm_eps));
        b.qk_norm_rope(&mut st.q, &mut st.k, norms, &st.rope, rows, shape)?;
        b.attention(
            &st.q,
            &mut st.k,
            &mut st.v,
            &st.kv,
            index,
            &st.step,
            shape,
            layer.sinks.as_ref(),
            &mut st.workspace,
            &mut st.attn_out,
        )?;
        b.kv_append(&st.k, &st.v, &mut st.kv, index, &st.step)?;
        if layer.output_gate
            && let Some(h) = st.hybrid.as_ref()
        {
            let n = rows * shape.heads * shape.head_dim;
            b.sigmoid_mul(&mut st.attn_out, &h.attention_gate, n)?;
        }
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

    /// A Gated DeltaNet block: input projections, causal convolution, the
    /// gated delta rule over the sequence's recurrent state, the gated
    /// output norm and `out_proj` into `block_out`.
    fn delta_net(
        &self,
        b: &B,
        net: &DeltaNet<'w, B>,
        rows: usize,
        st: &mut Buffers<B>,
    ) -> Result<(), ModelError> {
        let (Some(h), Some(state)) = (st.hybrid.as_mut(), st.state.as_mut()) else {
            return Err(missing_buffers("a Gated DeltaNet layer"));
        };
        let shape = &net.shape;
        let x = &st.normed;
        let job = |w, out| Matmul {
            x,
            x_row: 0,
            rows,
            w,
            bias: None,
            out,
        };
        match &net.input {
            DeltaNetInput::Split { qkv, z, b: beta, a } => b.matmul(&mut [
                job(qkv, &mut h.gdn_qkv),
                job(z, &mut h.gdn_z),
                job(beta, &mut h.gdn_b),
                job(a, &mut h.gdn_a),
            ])?,
            DeltaNetInput::Fused { qkvz, ba } => {
                let (Some(fused_qkvz), Some(fused_ba)) = (h.gdn_qkvz.as_mut(), h.gdn_ba.as_mut())
                else {
                    return Err(missing_buffers("fused Gated DeltaNet projections"));
                };
                b.matmul(&mut [job(qkvz, fused_qkvz), job(ba, fused_ba)])?;
                b.gdn_unfuse(
                    fused_qkvz,
                    fused_ba,
                    rows,
                    shape,
                    &mut h.gdn_qkv,
                    &mut h.gdn_z,
                    &mut h.gdn_b,
                    &mut h.gdn_a,
                )?;
            }
        }
        b.gdn_conv(
            &mut h.gdn_qkv,
            &net.conv,
            state,
            net.state_layer,
            &st.step,
            shape,
        )?;
        let gates = DeltaRuleGates {
            b: &h.gdn_b,
            a: &h.gdn_a,
            a_log: &net.a_log,
            dt_bias: &net.dt_bias,
        };
        b.gdn_delta_rule(
            &mut h.gdn_qkv,
            &gates,
            state,
            net.state_layer,
            &st.step,
            shape,
            &mut h.gdn_out,
        )?;
        b.gated_rmsnorm(
            &mut h.gdn_out,
            &h.gdn_z,
            &net.norm,
            self.settings.rms_norm_eps,
            shape.value_dim,
            rows * shape.value_width(),
        )?;
        b.matmul(&mut [Matmul {
            x: &h.gdn_out,
            x_row: 0,
            rows,
            w: &net.out_proj,
            bias: None,
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
                shared,
            } => {
                let router_job = Matmul {
                    x: &st.normed,
                    x_row: 0,
                    rows,
                    w: router,
                    bias: router_bias.as_ref(),
                    out: &mut st.router_logits,
                };
                match (shared, st.shared.as_mut()) {
                    (None, _) => b.matmul(&mut [router_job])?,
                    // The shared expert's projections and gate in the
                    // router's launch.
                    (Some(e), Some(sb)) => {
                        let job = |w, out| Matmul {
                            x: &st.normed,
                            x_row: 0,
                            rows,
                            w,
                            bias: None,
                            out,
                        };
                        b.matmul(&mut [
                            router_job,
                            job(&e.gate, &mut sb.gate_logit),
                            job(&e.gate_proj, &mut sb.gate_proj),
                            job(&e.up_proj, &mut sb.up_proj),
                        ])?;
                    }
                    (Some(_), None) => return Err(missing_buffers("a shared expert")),
                }
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
                if let (Some(e), Some(sb)) = (shared, st.shared.as_mut()) {
                    b.silu_mul(&mut sb.gate_proj, &sb.up_proj, rows * e.intermediate_size)?;
                    b.matmul(&mut [Matmul {
                        x: &sb.gate_proj,
                        x_row: 0,
                        rows,
                        w: &e.down_proj,
                        bias: None,
                        out: &mut sb.output,
                    }])?;
                    b.add_gated(
                        &mut st.block_out,
                        &sb.output,
                        &sb.gate_logit,
                        rows,
                        s.hidden_size,
                    )?;
                }
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
    /// Gated attention and Gated DeltaNet buffers (qwen3_5, qwen3_next).
    pub hybrid: Option<HybridBuffers<B>>,
    /// The shared expert's buffers (from the MoE workspace's plan).
    pub shared: Option<SharedExpertBuffers<B>>,
    /// The Gated DeltaNet layers' recurrent states, one slot per sequence.
    pub state: Option<B::RecurrentState>,
}

/// The activation buffers gated attention and Gated DeltaNet layers add.
pub struct HybridBuffers<B: Backend> {
    pub query_gate: B::Buffer,
    pub attention_gate: B::Buffer,
    pub gdn_qkv: B::Buffer,
    pub gdn_z: B::Buffer,
    pub gdn_b: B::Buffer,
    pub gdn_a: B::Buffer,
    pub gdn_out: B::Buffer,
    /// qwen3_next's fused projections' outputs.
    pub gdn_qkvz: Option<B::Buffer>,
    pub gdn_ba: Option<B::Buffer>,
}

/// The shared expert's gate and up projections, output and gate logit.
pub struct SharedExpertBuffers<B: Backend> {
    pub gate_proj: B::Buffer,
    pub up_proj: B::Buffer,
    pub output: B::Buffer,
    pub gate_logit: B::Buffer,
}

fn missing_buffers(what: &str) -> ModelError {
    ModelError::Unsupported(format!("{what} without its planned buffers"))
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
        let optional = |name: &'static str| -> Result<Option<B::Buffer>, ModelError> {
            find(name)
                .map(|planned| {
                    let elements = activation_elements(planned.bytes);
                    b.alloc(Category::Activations, name, elements, planned.placement)
                })
                .transpose()
                .map_err(ModelError::from)
        };
        let hybrid = if find(plan_memory::GDN_QKV).is_some() {
            Some(HybridBuffers {
                query_gate: alloc(plan_memory::QUERY_GATE)?,
                attention_gate: alloc(plan_memory::ATTENTION_GATE)?,
                gdn_qkv: alloc(plan_memory::GDN_QKV)?,
                gdn_z: alloc(plan_memory::GDN_Z)?,
                gdn_b: alloc(plan_memory::GDN_B)?,
                gdn_a: alloc(plan_memory::GDN_A)?,
                gdn_out: alloc(plan_memory::GDN_OUTPUT)?,
                gdn_qkvz: optional(plan_memory::GDN_QKVZ)?,
                gdn_ba: optional(plan_memory::GDN_BA)?,
            })
        } else {
            None
        };
        let workspace_buffer = |name: &'static str| {
            plan.moe_workspace
                .buffers
                .iter()
                .find(|buf| buf.name == name)
        };
        let shared_alloc = |name: &'static str| -> Result<B::Buffer, ModelError> {
            let planned = workspace_buffer(name).ok_or_else(|| {
                ModelError::Unsupported(format!("the plan's MoE workspace lists no {name}"))
            })?;
            let elements = activation_elements(planned.bytes);
            Ok(b.alloc(Category::MoeWorkspace, name, elements, planned.placement)?)
        };
        let shared = if workspace_buffer(plan_memory::SHARED_GATE).is_some() {
            Some(SharedExpertBuffers {
                gate_proj: shared_alloc(plan_memory::SHARED_GATE)?,
                up_proj: shared_alloc(plan_memory::SHARED_UP)?,
                output: shared_alloc(plan_memory::SHARED_OUTPUT)?,
                gate_logit: shared_alloc(plan_memory::SHARED_GATE_LOGIT)?,
            })
        } else {
            None
        };
        let state = if plan.recurrent_state.bytes > 0 {
            Some(b.recurrent_state(&plan.recurrent_state)?)
        } else {
            None
        };
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
            // One array entry per layer with a KV cache.
            kv: b.kv_cache(kv, kv.sliding_layers.len())?,
            hybrid,
            shared,
            state,
        })
    }
}
