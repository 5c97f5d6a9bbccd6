//! The buffers a forward step runs in, allocated once from the plan.

use super::error::ModelError;
use crate::backend::{Backend, KvLayout};
use crate::checkpoint::kv_scales::KvScales;
use crate::plan::Plan;
use crate::plan::ledger::Category;
use crate::plan::memory::{self as plan_memory, LOGITS, PROMPT_LOGITS, activation_elements};

/// Every buffer a forward step uses, allocated once from the plan and
/// charged to the ledger: the activation set, the one MoE workspace, the KV
/// cache and the step metadata.
pub struct Buffers<B: Backend> {
    pub max_rows: usize,
    pub max_seqs: usize,
    /// Rows of `logits`: those one lm_head pass computes (`max_num_seqs`,
    /// times `1 + k` with speculative decoding).
    pub logit_rows: usize,
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
    /// A served MTP head's buffers.
    pub mtp: Option<MtpBuffers<B>>,
}

/// What an MTP head's passes add: the target's last hidden state of each
/// row, after its final norm (the first pass's input), and `fc`'s input.
pub struct MtpBuffers<B: Backend> {
    pub hidden: B::Buffer,
    pub input: B::Buffer,
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

impl<B: Backend> Buffers<B> {
    /// Allocates exactly what `plan` lists for activations, the MoE
    /// workspace and the KV cache (an FP8 one quantizing with `kv_scales`).
    pub fn allocate(
        b: &B,
        plan: &Plan,
        kv: &KvLayout,
        kv_scales: &KvScales,
    ) -> Result<Self, ModelError> {
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
        let mtp = if find(plan_memory::MTP_HIDDEN).is_some() {
            Some(MtpBuffers {
                hidden: alloc(plan_memory::MTP_HIDDEN)?,
                input: alloc(plan_memory::MTP_INPUT)?,
            })
        } else {
            None
        };
        let vocab = plan.model.vocab_size.max(1);
        let prompt_logit_rows =
            find(PROMPT_LOGITS).map_or(0, |buf| activation_elements(buf.bytes) / vocab);
        let logit_rows = find(LOGITS).map_or(s, |buf| activation_elements(buf.bytes) / vocab);
        Ok(Buffers {
            max_rows: t,
            max_seqs: s,
            logit_rows,
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
            kv: b.kv_cache(kv, kv.sliding_layers.len(), kv_scales)?,
            hybrid,
            shared,
            state,
            mtp,
        })
    }
}
