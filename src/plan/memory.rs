//! The memory formulas: every byte count sparkrt prints or allocates comes
//! from here. The plan, the allocator (through the ledger) and the monitor all
//! use these functions, so a figure shown is a figure allocated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::device::PlanDevice;
use super::profile::{KvCacheDtype, ServingSection, StateDtype};
use crate::geometry::{Architecture, LayerAttention, ModelGeometry, Quantization, WeightGroup};

/// Activations, workspace and logits are f32 on every backend.
pub const ACTIVATION_BYTES: u64 = 4;
/// bf16 bytes, for weights that are never quantized.
const BF16: u64 = 2;
/// i32 ids, offsets and positions.
pub const INDEX_BYTES: u64 = 4;
/// Quantized activations (`backend::cpu::kernels::quantize`): an int16 code
/// per value and an f32 scale per 32 values.
pub const QUANTIZED_CODE_BYTES: u64 = 2;
const QUANTIZED_BLOCK: u64 = crate::formats::MXFP4_GROUP as u64;

/// Weight bytes by group (every group present, zero when empty), and the
/// bytes of tensors the checkpoint carries that text serving never reads
/// (by prefix: a vision tower, MTP layers), which are not planned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WeightBytes {
    pub groups: BTreeMap<WeightGroup, u64>,
    pub unused: BTreeMap<String, u64>,
}

impl WeightBytes {
    pub fn zero() -> WeightBytes {
        WeightBytes {
            groups: WeightGroup::ALL.iter().map(|&g| (g, 0)).collect(),
            unused: BTreeMap::new(),
        }
    }

    /// Counts `bytes` of tensors under `prefix` as mapped but never read.
    pub fn add_unused(&mut self, prefix: &str, bytes: u64) {
        *self.unused.entry(prefix.to_string()).or_insert(0) += bytes;
    }

    pub fn add(&mut self, group: WeightGroup, bytes: u64) {
        *self.groups.entry(group).or_insert(0) += bytes;
    }

    pub fn get(&self, group: WeightGroup) -> u64 {
        self.groups.get(&group).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.groups.values().sum()
    }
}

/// Bytes of one `[rows, cols]` linear weight stored as `format`, scales
/// included (`group`: the input columns per scale of INT4, ignored by the
/// other formats, which fix their own):
/// - NVFP4 = packed codes + one E4M3 scale per 16 + `weight_scale_2` + `input_scale`;
/// - MXFP4 = packed codes + one E8M0 scale per 32;
/// - FP8 = one byte per value + the f32 `weight_scale` + `input_scale`;
/// - FP8 block = one byte per value + an f32 scale per 128 × 128 block
///   (ragged edge blocks count whole);
/// - INT4 (GPTQ) = `qweight` (8 codes per int32) + an f16 scale and a packed
///   4-bit zero point per group and row + `g_idx` (one int32 per column).
pub fn linear_bytes(rows: u64, cols: u64, format: Quantization, group: u64) -> u64 {
    let fixed = format.group_size() as u64;
    match format {
        Quantization::Bf16 => rows * cols * BF16,
        Quantization::Nvfp4 => rows * cols / 2 + rows * cols.div_ceil(fixed) + 4 + 4,
        Quantization::Mxfp4 => rows * cols / 2 + rows * cols.div_ceil(fixed),
        Quantization::Fp8 => rows * cols + 4 + 4,
        Quantization::Fp8Block => {
            let block = crate::formats::FP8_BLOCK as u64;
            rows * cols + rows.div_ceil(block) * cols.div_ceil(block) * 4
        }
        Quantization::Int4 => {
            let groups = cols.div_ceil(group.max(1));
            rows * cols / 2 + groups * rows * 2 + groups * rows / 2 + cols * 4
        }
    }
}

/// The rows of the two tables that are split whole across ranks under
/// tensor and expert parallelism (`plan::parallel`): the experts a process
/// holds (by id) and the vocabulary rows of its embedding and lm_head. One
/// process holds all of both; the router, which scores every expert, and
/// the logits, gathered whole, are not shared out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Held {
    pub experts: u64,
    pub vocab_rows: u64,
}

impl Held {
    /// Everything: one process serving the model alone.
    pub fn all(g: &ModelGeometry) -> Held {
        Held {
            experts: g.num_experts as u64,
            vocab_rows: g.vocab_size as u64,
        }
    }
}

/// Weight bytes computed from the geometry alone (no checkpoint at hand).
/// Router, embeddings and norms are bf16; the lm_head takes
/// `lm_head_quantization`, the attention projections `attention_quantization`,
/// the experts and dense MLPs `quantization` (gpt-oss: its experts only).
pub fn estimate_weights(g: &ModelGeometry) -> WeightBytes {
    estimate_held_weights(g, Held::all(g))
}

/// [`estimate_weights`] of a process that holds `held` of the experts and
/// vocabulary rows (every other dimension is `g`'s: a rank's geometry from
/// `plan::parallel` has its own head and intermediate widths).
pub fn estimate_held_weights(g: &ModelGeometry, held: Held) -> WeightBytes {
    let h = g.hidden_size as u64;
    let (heads, kv_heads, hd) = (
        g.num_attention_heads as u64,
        g.num_kv_heads as u64,
        g.head_dim as u64,
    );
    let (e, i_moe) = (held.experts, g.moe_intermediate_size as u64);
    let router_experts = g.num_experts as u64;
    let q_dim = heads * hd;
    let kv_dim = kv_heads * hd;
    let gpt_oss = g.architecture == Architecture::GptOss;

    if g.architecture.is_hybrid() {
        return estimate_hybrid_weights(g, held);
    }
    let mut w = vocabulary_tables(g, held);
    let group = g.quant_group_size as u64;
    let attn = |rows, cols| linear_bytes(rows, cols, g.attention_quantization, group);
    let attention = attn(q_dim, h)
        + 2 * attn(kv_dim, h)
        + attn(h, q_dim)
        + if g.attention_bias {
            (q_dim + 2 * kv_dim + h) * BF16
        } else {
            0
        }
        + if gpt_oss { heads * BF16 } else { 0 }; // sinks
    let norms = 2 * h * BF16 + if gpt_oss { 0 } else { 2 * hd * BF16 }; // + q/k norm
    let router = router_experts * h * BF16 + if gpt_oss { router_experts * BF16 } else { 0 };
    let experts = if gpt_oss {
        // Stacked: gate_up [E, 2I, H] and down [E, H, I], each with a bf16 bias.
        e * (linear_bytes(2 * i_moe, h, g.quantization, group) + 2 * i_moe * BF16)
            + e * (linear_bytes(h, i_moe, g.quantization, group) + h * BF16)
    } else {
        e * mlp_bytes(i_moe, h, g.quantization, group)
    };
    let dense = mlp_bytes(g.intermediate_size as u64, h, dense_format(g), group);

    for layer in 0..g.num_layers {
        w.add(WeightGroup::Attention, attention);
        w.add(WeightGroup::Norms, norms);
        if g.is_moe_layer(layer) {
            w.add(WeightGroup::Router, router);
            w.add(WeightGroup::Experts, experts);
        } else {
            w.add(WeightGroup::DenseMlp, dense);
        }
    }
    w
}

/// What every architecture has outside its layers: the embedding table
/// (bf16), the lm_head unless tied (in `lm_head_quantization`) and the
/// final norm, for the vocabulary rows `held`.
fn vocabulary_tables(g: &ModelGeometry, held: Held) -> WeightBytes {
    let (h, v) = (g.hidden_size as u64, held.vocab_rows);
    let mut w = WeightBytes::zero();
    w.add(WeightGroup::Embeddings, v * h * BF16);
    if !g.tie_word_embeddings {
        let format = g.lm_head_quantization;
        let group = g.quant_group_size as u64;
        w.add(WeightGroup::LmHead, linear_bytes(v, h, format, group));
    }
    w.add(WeightGroup::Norms, h * BF16); // model.norm
    w
}

/// Bytes of a gated MLP of width `i` over `h` (gate, up and down projections).
fn mlp_bytes(i: u64, h: u64, format: Quantization, group: u64) -> u64 {
    2 * linear_bytes(i, h, format, group) + linear_bytes(h, i, format, group)
}

/// Format of the dense MLPs and shared experts: the experts' format, except
/// that gpt-oss's MXFP4 covers only its stacked experts.
fn dense_format(g: &ModelGeometry) -> Quantization {
    match g.quantization {
        Quantization::Mxfp4 => Quantization::Bf16,
        format => format,
    }
}

/// [`estimate_weights`] for qwen3_5_moe, qwen3_5 and qwen3_next: Gated
/// DeltaNet layers (projections, a `[channels, 1, kernel]` convolution,
/// `A_log`, `dt_bias`, the output norm) and gated-attention layers (`q_proj`
/// twice the query width), experts with a shared expert (and its `[1, H]`
/// gate) or a dense MLP; projections in `attention_quantization`, MLPs in
/// `quantization`, the rest bf16.
fn estimate_hybrid_weights(g: &ModelGeometry, held: Held) -> WeightBytes {
    let h = g.hidden_size as u64;
    let hd = g.head_dim as u64;
    let (q_dim, kv_dim) = (
        g.num_attention_heads as u64 * hd,
        g.num_kv_heads as u64 * hd,
    );
    let (e, i_moe) = (held.experts, g.moe_intermediate_size as u64);
    let router_experts = g.num_experts as u64;
    let mut w = vocabulary_tables(g, held);
    let group = g.quant_group_size as u64;
    let attn = |rows, cols| linear_bytes(rows, cols, g.attention_quantization, group);
    let attention = attn(2 * q_dim, h) + 2 * attn(kv_dim, h) + attn(h, q_dim);
    let linear = g.delta_net().map_or(0, |d| {
        let (channels, values, heads) = (
            d.conv_channels() as u64,
            d.value_width() as u64,
            d.value_heads as u64,
        );
        attn(channels, h)
            + attn(values, h)
            + 2 * attn(heads, h)
            + attn(h, values)
            + channels * d.conv_kernel as u64 * BF16
            + (2 * heads + d.value_dim as u64) * BF16
    });
    let s = g.shared_expert_intermediate_size as u64;
    let i_dense = g.intermediate_size as u64;
    for layer in 0..g.num_layers {
        w.add(WeightGroup::Norms, 2 * h * BF16);
        if g.layer_attention(layer) == LayerAttention::LinearAttention {
            w.add(WeightGroup::LinearAttention, linear);
        } else {
            w.add(WeightGroup::Attention, attention);
            w.add(WeightGroup::Norms, 2 * hd * BF16);
        }
        if g.is_moe_layer(layer) {
            w.add(WeightGroup::Router, router_experts * h * BF16);
            w.add(
                WeightGroup::Experts,
                e * mlp_bytes(i_moe, h, g.quantization, group),
            );
            w.add(
                WeightGroup::SharedExpert,
                mlp_bytes(s, h, dense_format(g), group) + h * BF16,
            );
        } else {
            w.add(
                WeightGroup::DenseMlp,
                mlp_bytes(i_dense, h, dense_format(g), group),
            );
        }
    }
    // A served MTP layer: a gated-attention layer with the decoder's MLP,
    // its `fc` ([H, 2H], bf16 as checkpoints keep it) and four norms.
    if g.mtp_layers > 0 {
        let mlp = if g.num_experts > 0 {
            router_experts * h * BF16
                + e * mlp_bytes(i_moe, h, g.quantization, group)
                + mlp_bytes(s, h, dense_format(g), group)
                + h * BF16
        } else {
            mlp_bytes(i_dense, h, dense_format(g), group)
        };
        let layer = attention + mlp + (2 * h + 2 * hd) * BF16;
        let head = 2 * h * h * BF16 + 3 * h * BF16;
        w.add(WeightGroup::Mtp, g.mtp_layers as u64 * layer + head);
    }
    w
}

/// Weight bytes one decode step of `batch` sequences reads (`groups`: the
/// plan's weight bytes by group): every non-expert weight once (attention,
/// router, dense MLPs, norms, lm_head: a matmul reads its weight once for
/// all the batch's rows), one embedding row per sequence, and of each MoE
/// layer's experts the distinct ones the batch's tokens are routed to —
/// exactly `top_k` at batch 1, [`expected_distinct_experts`] above.
pub fn decode_weight_bytes_per_step(
    groups: &BTreeMap<WeightGroup, u64>,
    top_k: usize,
    num_experts: usize,
    vocab_size: usize,
    batch: usize,
) -> u64 {
    let g = |group| groups.get(&group).copied().unwrap_or(0);
    let experts_bytes = g(WeightGroup::Experts);
    let e = num_experts.max(1) as u64;
    let experts = if batch <= 1 {
        experts_bytes * top_k as u64 / e
    } else {
        let distinct = expected_distinct_experts(num_experts, top_k, batch);
        (experts_bytes as f64 * distinct / e as f64).round() as u64
    };
    let embedding_rows =
        g(WeightGroup::Embeddings) / vocab_size.max(1) as u64 * batch.max(1) as u64;
    g(WeightGroup::Attention)
        + g(WeightGroup::LinearAttention)
        + g(WeightGroup::SharedExpert)
        + g(WeightGroup::Router)
        + g(WeightGroup::DenseMlp)
        + g(WeightGroup::Norms)
        + g(WeightGroup::LmHead)
        + experts
        + embedding_rows
}

/// Distinct experts one MoE layer runs for `batch` tokens each routed to
/// `top_k` of `num_experts`, expected under uniform routing: an expert is
/// missed by one token with probability `1 − k/E`, by all `B` with
/// `(1 − k/E)^B`, so `E · (1 − (1 − k/E)^B)` are hit (`k` at `B = 1`,
/// towards `E` as `B` grows). Real routers are skewed, so fewer in practice.
pub fn expected_distinct_experts(num_experts: usize, top_k: usize, batch: usize) -> f64 {
    if num_experts == 0 {
        return 0.0;
    }
    let e = num_experts as f64;
    let k = top_k.min(num_experts) as f64;
    e * (1.0 - (1.0 - k / e).powi(batch.min(i32::MAX as usize) as i32))
}

/// KV bytes one decode step of `batch` sequences reads at `context` tokens
/// each: every cached token of the full-attention layers
/// (`full_bytes_per_token`, [`kv_bytes_per_token`]) and the last
/// `min(context, window)` of the sliding ones (`sliding`, [`sliding_kv`]).
pub fn decode_kv_bytes_per_step(
    full_bytes_per_token: u64,
    sliding: &SlidingKv,
    context: usize,
    batch: usize,
) -> u64 {
    let context = context as u64;
    let sliding_tokens = context.min(sliding.window_tokens);
    batch as u64 * (context * full_bytes_per_token + sliding_tokens * sliding.bytes_per_token)
}

/// Recurrent-state bytes one decode step moves for `batch` sequences: each
/// Gated DeltaNet layer reads its slot's conv and delta-rule state and
/// writes it back, `2 × bytes_per_seq × batch` (zero without such layers).
/// Unlike the KV traffic it does not grow with the context.
pub fn decode_state_bytes_per_step(state: &RecurrentStatePlan, batch: usize) -> u64 {
    2 * state.bytes_per_seq * batch as u64
}

/// One named buffer of a plan category.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Buffer {
    pub name: String,
    pub bytes: u64,
    /// Where the backend puts it; listed only when not device memory.
    #[serde(default, skip_serializing_if = "Placement::is_device")]
    pub placement: Placement,
}

/// Where a buffer lives. Either way its bytes count the same on a unified
/// memory box; the backend allocates what the plan says (the CPU backend
/// has one memory for both).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Read and written by the kernels only.
    #[default]
    Device,
    /// Read by the host after every step (the logits): CUDA maps pinned host
    /// memory into the device, so the host reads it without a copy.
    HostMapped,
}

impl Placement {
    pub fn is_device(&self) -> bool {
        *self == Placement::Device
    }
}

/// A buffer in device memory.
fn buffer(name: &str, bytes: u64) -> Buffer {
    Buffer {
        name: name.to_string(),
        bytes,
        placement: Placement::Device,
    }
}

/// A buffer the host reads after every step.
fn host_mapped_buffer(name: &str, bytes: u64) -> Buffer {
    Buffer {
        placement: Placement::HostMapped,
        ..buffer(name, bytes)
    }
}

/// The ONE MoE workspace shared by every MoE layer, sized for the largest
/// batch the MoE can see: `capacity_tokens = max_num_batched_tokens × dp_size`
/// (tokens gathered from every data-parallel rank), `routed_rows =
/// capacity_tokens × top_k`. On the CPU, MXFP4 and NVFP4 matmuls read their
/// inputs quantized, into `quantized_input` and `quantized_scales`: the
/// experts' (gate/up: `routed_rows × hidden` values, down: `routed_rows ×
/// moe_intermediate`, one at a time) and, between expert calls, those of
/// the other NVFP4 linears (`capacity_tokens ×` their widest input).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MoeWorkspace {
    pub instances: u64,
    pub capacity_tokens: u64,
    pub routed_rows: u64,
    pub bytes: u64,
    /// What one workspace per MoE layer would cost (the design sparkrt avoids).
    pub per_layer_total_bytes: u64,
    pub buffers: Vec<Buffer>,
}

/// `held_experts`: the experts this process runs (all of them, or a rank's
/// share under expert parallelism, `plan::parallel`): the router still
/// picks `top_k` of every token's, but at most `held_experts` of them run
/// here, so the expert rows are `tokens × min(top_k, held_experts)`.
pub fn moe_workspace(
    g: &ModelGeometry,
    max_num_batched_tokens: usize,
    dp_size: usize,
    device: PlanDevice,
    held_experts: u64,
) -> MoeWorkspace {
    let capacity_tokens = max_num_batched_tokens as u64 * dp_size as u64;
    let routed = capacity_tokens * g.top_k as u64;
    let rows = capacity_tokens * (g.top_k as u64).min(held_experts);
    let (h, i) = (g.hidden_size as u64, g.moe_intermediate_size as u64);
    let mut buffers = vec![
        buffer("topk_ids", routed * INDEX_BYTES),
        buffer("topk_weights", routed * ACTIVATION_BYTES),
        buffer("expert_offsets", (g.num_experts as u64 + 1) * INDEX_BYTES),
        buffer("sorted_rows", rows * INDEX_BYTES),
    ];
    match device {
        // The CPU experts gather their rows, run gate/up, the activation and
        // down one after the other.
        PlanDevice::Cpu => buffers.extend([
            buffer("gathered_input", rows * h * ACTIVATION_BYTES),
            buffer("gate_up_output", rows * 2 * i * ACTIVATION_BYTES),
            buffer("activation", rows * i * ACTIVATION_BYTES),
            buffer("down_output", rows * h * ACTIVATION_BYTES),
        ]),
        // The CUDA experts read their rows in place and fuse gate/up with
        // the activation: no gathered input, no gate/up output. The route
        // kernel needs one completion counter, and the attention's split
        // partials use the workspace while no expert runs.
        PlanDevice::Cuda => buffers.extend([
            buffer(
                ATTENTION_PARTIALS,
                CUDA_ATTENTION_PARTIAL_SLOTS * (g.head_dim as u64 + 2) * ACTIVATION_BYTES,
            ),
            buffer(ROUTE_COUNTER, INDEX_BYTES),
            buffer("activation", rows * i * ACTIVATION_BYTES),
            buffer("down_output", rows * h * ACTIVATION_BYTES),
        ]),
    }
    if g.shared_expert_intermediate_size > 0 {
        // The shared expert runs on every token: its gate and up
        // projections, its output and the logit of its gate.
        let shared = g.shared_expert_intermediate_size as u64;
        buffers.push(buffer(
            SHARED_GATE,
            capacity_tokens * shared * ACTIVATION_BYTES,
        ));
        buffers.push(buffer(
            SHARED_UP,
            capacity_tokens * shared * ACTIVATION_BYTES,
        ));
        buffers.push(buffer(
            SHARED_OUTPUT,
            capacity_tokens * h * ACTIVATION_BYTES,
        ));
        buffers.push(buffer(
            SHARED_GATE_LOGIT,
            capacity_tokens * ACTIVATION_BYTES,
        ));
    }
    let expert_values = if quantizes_inputs(g.quantization) {
        rows * h.max(i)
    } else {
        0
    };
    let values = expert_values.max(capacity_tokens * dense_quantized_cols(g));
    if device == PlanDevice::Cpu && values > 0 {
        buffers.push(buffer("quantized_input", values * QUANTIZED_CODE_BYTES));
        buffers.push(buffer(
            "quantized_scales",
            values / QUANTIZED_BLOCK * ACTIVATION_BYTES,
        ));
    }
    let bytes = buffers.iter().map(|b| b.bytes).sum();
    MoeWorkspace {
        instances: 1,
        capacity_tokens,
        routed_rows: rows,
        bytes,
        per_layer_total_bytes: bytes * g.num_moe_layers() as u64,
        buffers,
    }
}

/// Whether CPU matmuls of this format read their inputs quantized to int16
/// (the integer kernels: MXFP4, and NVFP4 and GPTQ INT4 on x86; sized on
/// every host, so a plan does not depend on the instruction set).
fn quantizes_inputs(format: Quantization) -> bool {
    matches!(
        format,
        Quantization::Mxfp4 | Quantization::Nvfp4 | Quantization::Int4
    )
}

/// The widest input of a linear outside the experts whose inputs the CPU
/// quantizes (0 if none does): the attention and Gated DeltaNet projections,
/// the dense MLPs and shared expert, the lm_head and the MTP head's input
/// projection (twice the hidden size). One matmul call quantizes one input
/// (its jobs share it), so the workspace's buffers need `tokens ×` this.
fn dense_quantized_cols(g: &ModelGeometry) -> u64 {
    let attention = quantizes_inputs(g.attention_quantization);
    let mlp = quantizes_inputs(dense_format(g));
    let lm_head = quantizes_inputs(g.lm_head_quantization);
    if !(attention || mlp || lm_head) {
        return 0;
    }
    let h = g.hidden_size as u64;
    let mut cols = if g.mtp_layers > 0 { 2 * h } else { h };
    if attention {
        let values = g.delta_net().map_or(0, |d| d.value_width() as u64);
        cols = cols
            .max((g.num_attention_heads * g.head_dim) as u64)
            .max(values);
    }
    if mlp {
        let widest = g.intermediate_size.max(g.shared_expert_intermediate_size);
        cols = cols.max(widest as u64);
    }
    cols
}

/// The CUDA workspace's buffers besides the experts': the attention's split
/// partials and the route kernel's completion counter.
pub const ATTENTION_PARTIALS: &str = "attention_partials";
pub const ROUTE_COUNTER: &str = "route_counter";
/// (row, query head, split) partials the CUDA attention may keep, each
/// `head_dim + 2` f32 (the partial output, its running max and sum). A
/// decode step splits its keys only until about two blocks per
/// multiprocessor run, so rows × heads × splits stays near twice the
/// multiprocessors: 1,024 covers 512 of them (a GB10 has 48, an H200 132);
/// fewer slots only mean fewer splits.
pub const CUDA_ATTENTION_PARTIAL_SLOTS: u64 = 1024;

/// The shared expert's buffers in the MoE workspace (allocated by the model
/// as f32 buffers, not by the backend's routed-expert workspace).
pub const SHARED_GATE: &str = "shared_expert_gate_proj";
pub const SHARED_UP: &str = "shared_expert_up_proj";
pub const SHARED_OUTPUT: &str = "shared_expert_output";
pub const SHARED_GATE_LOGIT: &str = "shared_expert_gate_logit";

/// Activation buffers of gated attention and Gated DeltaNet layers.
pub const QUERY_GATE: &str = "query_gate";
/// A served MTP head's buffers: the target's last hidden state of every
/// row (its first pass's input) and `fc`'s input, `[embedding | hidden]`.
pub const MTP_HIDDEN: &str = "mtp_hidden";
pub const MTP_INPUT: &str = "mtp_input";
pub const ATTENTION_GATE: &str = "attention_gate";
pub const GDN_QKV: &str = "gdn_qkv";
pub const GDN_Z: &str = "gdn_z";
pub const GDN_B: &str = "gdn_b";
pub const GDN_A: &str = "gdn_a";
pub const GDN_OUTPUT: &str = "gdn_output";
/// qwen3_next's fused projections' outputs.
pub const GDN_QKVZ: &str = "gdn_qkvz";
pub const GDN_BA: &str = "gdn_ba";

/// The activation set: the largest live set of one forward step, allocated
/// once and reused by every layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Activations {
    pub bytes: u64,
    pub buffers: Vec<Buffer>,
}

/// `tokens` = max_num_batched_tokens (one step's tokens), `seqs` =
/// max_num_seqs (rows of logits sampled per step).
///
/// `logit_rows`: rows of the [`LOGITS`] buffer, one lm_head pass's worth:
/// `max_num_seqs`, times `1 + k` with `k` draft tokens per sequence (see
/// [`speculative`]).
pub fn activations(
    g: &ModelGeometry,
    tokens: usize,
    seqs: usize,
    logit_rows: usize,
    max_model_len: usize,
    kv_block_size: usize,
) -> Activations {
    let t = tokens as u64;
    let h = g.hidden_size as u64;
    let q_dim = (g.num_attention_heads * g.head_dim) as u64;
    let kv_dim = (g.num_kv_heads * g.head_dim) as u64;
    let blocks_per_seq = max_model_len.div_ceil(kv_block_size.max(1)) as u64;
    let mut buffers = vec![
        buffer("hidden", t * h * ACTIVATION_BYTES),
        buffer("normed", t * h * ACTIVATION_BYTES),
        buffer("q", t * q_dim * ACTIVATION_BYTES),
        buffer("k", t * kv_dim * ACTIVATION_BYTES),
        buffer("v", t * kv_dim * ACTIVATION_BYTES),
        buffer("attention_output", t * q_dim * ACTIVATION_BYTES),
        buffer("block_output", t * h * ACTIVATION_BYTES),
        buffer("router_logits", t * g.num_experts as u64 * ACTIVATION_BYTES),
        // cos and sin of each token's position, head_dim/2 of each
        buffer("rope", t * g.head_dim as u64 * ACTIVATION_BYTES),
    ];
    if g.architecture.is_hybrid() {
        // Gated attention: q_proj's query and gate, then the gate alone;
        // Gated DeltaNet: the projections' outputs (q, k and v convolved in
        // place) and the delta rule's output. Every buffer is listed, empty
        // where the model has no layer of its kind.
        let attention = if g.num_kv_layers() > 0 { q_dim } else { 0 };
        buffers.push(buffer(QUERY_GATE, 2 * t * attention * ACTIVATION_BYTES));
        buffers.push(buffer(ATTENTION_GATE, t * attention * ACTIVATION_BYTES));
        let (channels, values, heads) = g.delta_net().map_or((0, 0, 0), |d| {
            (
                d.conv_channels() as u64,
                d.value_width() as u64,
                d.value_heads as u64,
            )
        });
        buffers.push(buffer(GDN_QKV, t * channels * ACTIVATION_BYTES));
        buffers.push(buffer(GDN_Z, t * values * ACTIVATION_BYTES));
        buffers.push(buffer(GDN_B, t * heads * ACTIVATION_BYTES));
        buffers.push(buffer(GDN_A, t * heads * ACTIVATION_BYTES));
        buffers.push(buffer(GDN_OUTPUT, t * values * ACTIVATION_BYTES));
        if g.architecture == Architecture::Qwen3Next {
            buffers.push(buffer(GDN_QKVZ, t * (channels + values) * ACTIVATION_BYTES));
            buffers.push(buffer(GDN_BA, t * 2 * heads * ACTIVATION_BYTES));
        }
    }
    if g.mtp_layers > 0 {
        buffers.push(buffer(MTP_HIDDEN, t * h * ACTIVATION_BYTES));
        buffers.push(buffer(MTP_INPUT, 2 * t * h * ACTIVATION_BYTES));
    }
    if g.num_moe_layers() < g.num_layers {
        let i = g.intermediate_size as u64;
        buffers.push(buffer("dense_gate", t * i * ACTIVATION_BYTES));
        buffers.push(buffer("dense_up", t * i * ACTIVATION_BYTES));
    }
    // The logits are what the host reads every step.
    buffers.push(host_mapped_buffer(
        LOGITS,
        logit_rows as u64 * g.vocab_size as u64 * ACTIVATION_BYTES,
    ));
    let prompt = prompt_logprobs(g, tokens, logit_rows);
    if prompt.buffer == PROMPT_LOGITS {
        buffers.push(host_mapped_buffer(PROMPT_LOGITS, prompt.chunk_bytes));
    }
    let step = StepMetadataPlan::new(tokens, seqs, blocks_per_seq as usize);
    buffers.push(buffer(STEP_METADATA, step.bytes));
    Activations {
        bytes: buffers.iter().map(|b| b.bytes).sum(),
        buffers,
    }
}

/// The activation buffer the sampled rows' logits go to: `max_num_seqs`
/// rows.
pub const LOGITS: &str = "logits";
/// The activation buffer prompt rows' logits go to when a step asks for
/// more rows than [`LOGITS`] holds (see [`prompt_logprobs`]).
pub const PROMPT_LOGITS: &str = "prompt_logits";
/// Rows of logits computed at once for prompt log-probabilities: 64 rows
/// make one lm_head pass over the weights serve 64 prompt positions, for
/// 64 × vocab × 4 bytes (37 MiB at Qwen3's vocabulary of 151936).
pub const PROMPT_LOGPROB_CHUNK_ROWS: usize = 64;

/// What prompt log-probabilities (`echo` with `logprobs`, vLLM's
/// `prompt_logprobs`) cost. They need the logits of every prompt row, not
/// only the last: the model computes them `chunk_rows` rows at a time
/// (`min(64, max_num_batched_tokens)`, at least `max_num_seqs`) into a
/// planned buffer, [`PROMPT_LOGITS`] (or [`LOGITS`] where that already
/// holds as many rows), and the engine reduces each row at once to the
/// prompt token's log-probability, rank and at most 20 alternatives, so
/// nothing more is held, whatever the prompt's length. `unchunked_bytes` is
/// what one step's rows would take at once (`max_num_batched_tokens × vocab`
/// f32), which is never allocated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PromptLogprobsPlan {
    /// The buffer they are computed in.
    pub buffer: &'static str,
    pub chunk_rows: u64,
    pub chunk_bytes: u64,
    pub unchunked_bytes: u64,
}

pub fn prompt_logprobs(g: &ModelGeometry, tokens: usize, seqs: usize) -> PromptLogprobsPlan {
    let row = g.vocab_size as u64 * ACTIVATION_BYTES;
    let rows = PROMPT_LOGPROB_CHUNK_ROWS.min(tokens).max(seqs);
    PromptLogprobsPlan {
        buffer: if rows > seqs { PROMPT_LOGITS } else { LOGITS },
        chunk_rows: rows as u64,
        chunk_bytes: rows as u64 * row,
        unchunked_bytes: tokens as u64 * row,
    }
}

/// The name of the step metadata's activation buffer.
pub const STEP_METADATA: &str = "step_metadata";
/// Fields per sequence in the step metadata: start, length, cached length,
/// sliding-table start and block-table start (`kernels/common.cuh`, StepView).
pub const STEP_SEQ_FIELDS: usize = 5;

/// The step metadata one forward step reads: a token id and a position per
/// token (the second word is the token's logit row on CUDA); per sequence
/// its [`STEP_SEQ_FIELDS`] fields and two block tables (full-attention and
/// sliding-window layers, `crate::step`). All i32 words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StepMetadataPlan {
    pub max_tokens: usize,
    pub max_seqs: usize,
    pub max_blocks_per_seq: usize,
    /// 4-byte words: `2 × tokens + seqs × (2 × blocks_per_seq + 5)`.
    pub words: usize,
    pub bytes: u64,
}

impl StepMetadataPlan {
    pub fn new(max_tokens: usize, max_seqs: usize, max_blocks_per_seq: usize) -> StepMetadataPlan {
        let words = 2 * max_tokens + max_seqs * (2 * max_blocks_per_seq + STEP_SEQ_FIELDS);
        StepMetadataPlan {
            max_tokens,
            max_seqs,
            max_blocks_per_seq,
            words,
            bytes: words as u64 * INDEX_BYTES,
        }
    }

    /// The step metadata of a profile's serving limits.
    pub fn for_serving(s: &ServingSection) -> StepMetadataPlan {
        StepMetadataPlan::new(
            s.max_num_batched_tokens,
            s.max_num_seqs,
            s.max_model_len.div_ceil(s.kv_block_size.max(1)),
        )
    }
}

/// Elements of an f32 activation buffer of `bytes`.
pub fn activation_elements(bytes: u64) -> usize {
    (bytes / ACTIVATION_BYTES) as usize
}

/// Geometry of the KV cache a backend allocates, and the bytes it takes:
/// one pool of `blocks × block_size` token slots, shared by the
/// full-attention and the sliding-window layers. The pool is `arrays()`
/// arrays of K and V; the `k`-th full-attention layer and the `k`-th
/// sliding-window layer both live in array `k`, and a block belongs to one
/// kind at a time (the engine hands it to a sequence's full table or to its
/// sliding table), so a block id is one place in every array. A slot holds
/// `kv_heads × head_dim` values of K and as many of V.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Blocks of the pool.
    pub blocks: usize,
    /// Tokens a sliding-window layer attends to (0 without such layers).
    pub window: usize,
    /// Per layer: `true` when the layer uses a sliding window.
    pub sliding_layers: Vec<bool>,
    pub dtype: KvCacheDtype,
}

impl KvLayout {
    /// The layout of geometry `g` with `blocks` pool blocks and the
    /// sliding layers' `window` (plan::compute fills both).
    pub fn new(g: &ModelGeometry, s: &ServingSection, blocks: u64, window: u64) -> KvLayout {
        KvLayout {
            kv_heads: g.num_kv_heads,
            head_dim: g.head_dim,
            block_size: s.kv_block_size,
            blocks: blocks as usize,
            window: window as usize,
            // One entry per layer with a KV cache (Gated DeltaNet layers
            // have none): the model numbers its KV layers in this order.
            // The MTP layers' (full attention) come last.
            sliding_layers: (0..g.num_layers)
                .map(|i| g.layer_attention(i))
                .filter(|&kind| kind != LayerAttention::LinearAttention)
                .map(|kind| kind == LayerAttention::SlidingAttention)
                .chain(std::iter::repeat_n(false, g.mtp_layers))
                .collect(),
            dtype: s.kv_cache_dtype,
        }
    }

    /// Values of one K (or V) row: `kv_heads × head_dim`.
    pub fn width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding_layers.get(layer).copied().unwrap_or(false)
    }

    /// Whether any of the first `layers` layers uses a sliding window.
    pub fn has_sliding(&self, layers: usize) -> bool {
        (0..layers).any(|l| self.is_sliding(l))
    }

    /// Arrays of the first `layers` layers: the larger of the counts of
    /// full-attention and sliding-window layers.
    pub fn arrays(&self, layers: usize) -> usize {
        let sliding = (0..layers).filter(|&l| self.is_sliding(l)).count();
        sliding.max(layers - sliding)
    }

    /// The array `layer` reads and writes: its index among the layers of
    /// its kind.
    pub fn array_of(&self, layer: usize) -> usize {
        let kind = self.is_sliding(layer);
        (0..layer).filter(|&l| self.is_sliding(l) == kind).count()
    }

    /// Token slots of one array: `blocks × block_size`.
    pub fn array_slots(&self) -> usize {
        self.blocks * self.block_size
    }

    /// Values of one array's K (its V holds as many).
    pub fn array_elements(&self) -> usize {
        self.array_slots() * self.width()
    }

    /// Bytes of one array's K and V together.
    pub fn array_bytes(&self) -> u64 {
        2 * self.array_elements() as u64 * self.dtype.bytes()
    }

    /// Bytes of the whole cache of `layers` layers.
    pub fn bytes(&self, layers: usize) -> u64 {
        self.arrays(layers) as u64 * self.array_bytes()
    }
}

/// Bytes one token slot of the KV pool takes: K and V of each of its
/// arrays, `2 × max(full layers, sliding layers) × kv_heads × head_dim ×
/// dtype_bytes` (see [`KvLayout`]).
pub fn kv_bytes_per_token(g: &ModelGeometry, dtype_bytes: u64) -> u64 {
    let sliding = sliding_layers(g);
    let arrays = sliding.max(g.num_kv_layers() as u64 - sliding);
    2 * arrays * g.num_kv_heads as u64 * g.head_dim as u64 * dtype_bytes
}

/// Bytes per token the full-attention layers read (decode estimates):
/// `2 × full layers × kv_heads × head_dim × dtype_bytes`.
pub fn full_attention_bytes_per_token(g: &ModelGeometry, dtype_bytes: u64) -> u64 {
    let full = g.num_kv_layers() as u64 - sliding_layers(g);
    2 * full * g.num_kv_heads as u64 * g.head_dim as u64 * dtype_bytes
}

fn sliding_layers(g: &ModelGeometry) -> u64 {
    (0..g.num_layers)
        .filter(|&i| g.layer_attention(i) == LayerAttention::SlidingAttention)
        .count() as u64
}

/// The pool blocks sliding-window layers take beyond the full-attention
/// tokens. They keep their keys in blocks of the same pool, through a
/// second table per sequence, and a sequence holds only the blocks its
/// next token can attend to (older ones are released, or kept as cached
/// prefix blocks, which any allocation may reclaim): the `window − 1`
/// positions before that token span at most `blocks_per_seq =
/// ⌈(window − 1) / block⌉ + 1` blocks (`n` consecutive positions span at
/// most `⌈n / block⌉ + 1`). While a step runs, its chunks' positions take
/// sliding blocks too, released after the step once out of the window: a
/// chunk of `c` tokens at most `⌈c / block⌉` new ones, and the chunks of
/// one step (at most `max_num_batched_tokens` tokens over at most
/// `max_num_seqs` sequences) at most `step_blocks + max_num_seqs − 1`
/// together, `step_blocks = ⌈max_num_batched_tokens / block⌉` (each
/// ceiling adds less than a block). So the plan sets aside
///
/// `blocks = min(max_num_seqs × (blocks_per_seq + 1) + step_blocks,
///               max_num_seqs × ⌈max_model_len / block⌉)`
///
/// (the second: a sliding table is never longer than its sequence's full
/// table, which `max_model_len` bounds; it binds for short contexts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlidingKv {
    pub layers: u64,
    /// `min(sliding_window, max_model_len)`; 0 without sliding layers.
    pub window_tokens: u64,
    /// Bytes per token the sliding layers read (decode estimates):
    /// `2 × sliding layers × kv_heads × head_dim × dtype_bytes`.
    pub bytes_per_token: u64,
    /// Blocks one sequence's window holds at most between steps.
    pub blocks_per_seq: u64,
    /// Blocks one step's chunks may take: `⌈max_num_batched_tokens / block⌉`.
    pub step_blocks: u64,
    /// Blocks set aside in the pool.
    pub blocks: u64,
    /// Bytes of those blocks: `blocks × block × kv_bytes_per_token`.
    pub bytes: u64,
}

/// Blocks of `block` tokens the `window − 1` positions before a sequence's
/// next token span at most: `⌈(window − 1) / block⌉ + 1` (`n` consecutive
/// positions span at most `⌈n / block⌉ + 1` blocks).
pub fn sliding_window_blocks(window: usize, block: usize) -> usize {
    window.saturating_sub(1).div_ceil(block.max(1)) + 1
}

pub fn sliding_kv(g: &ModelGeometry, dtype_bytes: u64, s: &ServingSection) -> SlidingKv {
    let layers = sliding_layers(g);
    let window_tokens = if layers == 0 {
        0
    } else {
        g.sliding_window.unwrap_or(0).min(s.max_model_len) as u64
    };
    let block = s.kv_block_size.max(1) as u64;
    let seqs = s.max_num_seqs as u64;
    let (blocks_per_seq, step_blocks, blocks) = if window_tokens == 0 {
        (0, 0, 0)
    } else {
        let per_seq = sliding_window_blocks(window_tokens as usize, block as usize) as u64;
        let step = (s.max_num_batched_tokens as u64).div_ceil(block);
        let longest_tables = seqs * (s.max_model_len as u64).div_ceil(block);
        (
            per_seq,
            step,
            (seqs * (per_seq + 1) + step).min(longest_tables),
        )
    };
    SlidingKv {
        layers,
        window_tokens,
        bytes_per_token: 2 * layers * g.num_kv_heads as u64 * g.head_dim as u64 * dtype_bytes,
        blocks_per_seq,
        step_blocks,
        blocks,
        bytes: blocks * block * kv_bytes_per_token(g, dtype_bytes),
    }
}

/// The recurrent-state pool's buffers (category `recurrent_state`): the
/// live slots, one per running sequence, the prefix cache's snapshots and
/// speculative decoding's verify slots.
pub const RECURRENT_STATE_LIVE: &str = "recurrent_state.live";
pub const RECURRENT_STATE_SNAPSHOTS: &str = "recurrent_state.snapshots";
pub const RECURRENT_STATE_VERIFY: &str = "recurrent_state.verify";

/// The recurrent-state pool of the Gated DeltaNet layers: per layer and per
/// slot the convolution's last inputs, `conv_channels × (kernel − 1)`
/// values, and the delta rule's state, `value_heads × key_dim × value_dim`
/// values, in `state_dtype` (f32, or bf16 at half the bytes). A running sequence holds one live slot (`max_num_seqs`
/// of them); the prefix cache's snapshots fill the others
/// (`state_snapshots`, 0 with prefix caching off):
///
/// `bytes = layers × (live + snapshots + verify) × (conv + ssm) × dtype
/// bytes` (4 for f32, 2 for bf16), `verify = max_num_seqs × k` with `k`
/// draft tokens per step (0 without speculative decoding).
///
/// It is its own ledger category (`recurrent_state`, two buffers: live slots
/// and snapshots) and, unlike the KV cache, does not grow with the context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RecurrentStatePlan {
    pub layers: usize,
    /// Every slot of the pool: `live_slots + snapshot_slots + verify_slots`.
    pub slots: usize,
    /// Slots 0..live_slots: one per running sequence.
    pub live_slots: usize,
    /// The slots after them: cached states at block boundaries, which let
    /// a request with a cached prefix skip it (see `engine::state_cache`).
    pub snapshot_slots: usize,
    /// The slots after those, with speculative decoding: `k` per live slot,
    /// the states after each of a sequence's verify rows but the last, so
    /// that a partly rejected draft rolls back without recomputation.
    pub verify_slots: usize,
    /// Prompt positions between the snapshots a prefill takes besides the
    /// one at its last full block (0: none).
    pub snapshot_interval: usize,
    /// Values of one layer's convolution state for one sequence.
    pub conv_elements: usize,
    /// Values of one layer's delta-rule state for one sequence.
    pub ssm_elements: usize,
    /// Element type the pool stores.
    pub dtype: StateDtype,
    /// Bytes one slot takes over all layers.
    pub bytes_per_seq: u64,
    pub bytes: u64,
}

/// Snapshots per live slot when `state_snapshots` is not given: one for
/// each running sequence's rolling snapshot, one more for the prompts it
/// shares.
pub const DEFAULT_SNAPSHOTS_PER_SEQ: usize = 2;

pub fn recurrent_state(g: &ModelGeometry, s: &ServingSection) -> RecurrentStatePlan {
    let layers = g.num_linear_layers();
    let (conv_elements, ssm_elements) = g.delta_net().map_or((0, 0), |d| {
        (d.conv_state_elements(), d.ssm_state_elements())
    });
    let bytes_per_seq =
        layers as u64 * (conv_elements + ssm_elements) as u64 * s.state_dtype.bytes();
    let snapshot_slots = match (layers, s.enable_prefix_caching) {
        (0, _) | (_, false) => 0,
        _ => s
            .state_snapshots
            .unwrap_or(DEFAULT_SNAPSHOTS_PER_SEQ * s.max_num_seqs),
    };
    let verify_slots = match (layers, s.speculative) {
        (0, _) | (_, None) => 0,
        (_, Some(c)) => s.max_num_seqs * c.draft_rows(),
    };
    let slots = s.max_num_seqs + snapshot_slots + verify_slots;
    RecurrentStatePlan {
        layers,
        slots,
        live_slots: s.max_num_seqs,
        snapshot_slots,
        verify_slots,
        snapshot_interval: s.state_snapshot_interval,
        conv_elements,
        ssm_elements,
        dtype: s.state_dtype,
        bytes_per_seq,
        bytes: bytes_per_seq * slots as u64,
    }
}

/// Full-attention KV tokens that fit in `budget` bytes: whole blocks only,
/// capped at what `max_num_seqs` sequences of `max_model_len` tokens can use
/// (`max_num_seqs × ⌈max_model_len / block⌉` blocks).
pub fn kv_tokens_for(
    budget: u64,
    bytes_per_token: u64,
    block_size: usize,
    max_num_seqs: usize,
    max_model_len: usize,
) -> u64 {
    let block = block_size.max(1) as u64;
    let cap_blocks = max_num_seqs as u64 * (max_model_len as u64).div_ceil(block);
    let blocks = match bytes_per_token {
        0 => cap_blocks,
        bpt => (budget / (bpt * block)).min(cap_blocks),
    };
    blocks * block
}

/// Bytes of one CUDA expert-table entry (`backend::cuda::params::ExpertWeights`,
/// asserted there): three weight descriptors and two bias pointers.
pub const CUDA_EXPERT_TABLE_ENTRY_BYTES: u64 = 112;

/// Names of the runtime overhead's buffers.
pub const EXPERT_TABLES: &str = "expert_tables";
/// What the process itself takes (CPU: process, tokenizer, allocator slack;
/// CUDA: context, NVRTC modules, tokenizer, allocator slack).
pub const PROCESS: &str = "process";

/// The runtime overhead: the profile's (or the device's default) figure,
/// split into the buffers the runtime charges. On CUDA the backend's
/// device tables (an expert table per MoE layer) come out
/// of it and the process takes the rest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuntimeOverhead {
    pub bytes: u64,
    pub buffers: Vec<Buffer>,
}

pub fn runtime_overhead(g: &ModelGeometry, device: PlanDevice, bytes: u64) -> RuntimeOverhead {
    let buffers = match device {
        PlanDevice::Cpu => vec![buffer(PROCESS, bytes)],
        PlanDevice::Cuda => {
            let tables =
                g.num_moe_layers() as u64 * g.num_experts as u64 * CUDA_EXPERT_TABLE_ENTRY_BYTES;
            vec![
                buffer(EXPERT_TABLES, tables),
                buffer(PROCESS, bytes.saturating_sub(tables)),
            ]
        }
    };
    RuntimeOverhead { bytes, buffers }
}

/// The request queue's default bound (`serve --max-queue` overrides it).
///
/// vLLM does not cap its queue; a queue without a cap lets a burst of
/// clients grow the process without limit, and queued requests are not in
/// the plan. So the default is vLLM's behaviour up to a cap for safety,
/// sized from memory: a queued sequence holds at most its prompt's token
/// ids twice (the engine's sequence and the answer's record of the prompt,
/// `max_model_len` ids each) and [`QUEUED_SEQUENCE_FIXED_BYTES`]; the queue's
/// worst case must fit in [`QUEUE_BUDGET_SHARE`] of the safety margin, the
/// memory the plan leaves unclaimed above the eviction threshold for what
/// it does not count. A full queue of worst-case requests then cannot push
/// the host into the memory guard's zone on its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueuePlan {
    /// The most one queued sequence holds.
    pub bytes_per_sequence: u64,
    /// What the queue's worst case may take: the safety margin's share.
    pub budget: u64,
    /// Sequences (a request's choices count one each) allowed to wait.
    pub max_queue: usize,
}

/// A queued sequence's bytes besides its ids: its sampling parameters at
/// the request limits (≤ 1024 `logit_bias` entries × 8 B, ≤ 16 stop strings
/// × 256 B, ≤ 256 stop ids × 4 B: 13 KiB), its bookkeeping and its event
/// channel, rounded up. (A completions `echo` also keeps the prompt's text,
/// at most `max_prompt_bytes`: the rest of the margin covers the few that
/// ask.)
pub const QUEUED_SEQUENCE_FIXED_BYTES: u64 = 64 << 10;

/// The safety margin's share the queue's worst case may take: a quarter,
/// leaving the rest for the allocator's slack and page-cache swings the
/// margin is there for.
pub const QUEUE_BUDGET_SHARE: u64 = 4;

pub fn queue_plan(max_model_len: usize, safety_margin: u64) -> QueuePlan {
    let bytes_per_sequence = 2 * max_model_len as u64 * INDEX_BYTES + QUEUED_SEQUENCE_FIXED_BYTES;
    let budget = safety_margin / QUEUE_BUDGET_SHARE;
    let max_queue = usize::try_from(budget / bytes_per_sequence).unwrap_or(usize::MAX);
    QueuePlan {
        bytes_per_sequence,
        budget,
        max_queue: max_queue.max(1),
    }
}

/// The host's headroom: what the plan may use.
///
/// - `host_limit = mem_available − eviction_hard − os_reserve − safety_margin`
/// - with a kubelet: `kube_limit = mem_total − system_reserved − kube_reserved
///   − eviction_hard − kubepods_in_use − safety_margin`
/// - `usable = min(host_limit, kube_limit)`
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Headroom {
    pub mem_total: u64,
    pub mem_available: u64,
    pub eviction_hard: u64,
    pub os_reserve: u64,
    pub safety_margin: u64,
    pub system_reserved: u64,
    pub kube_reserved: u64,
    pub kubepods_in_use: u64,
    pub host_limit: i64,
    pub kube_limit: Option<i64>,
    pub usable: i64,
    pub binding: Binding,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Binding {
    Host,
    Kubelet,
}

/// Inputs of [`headroom`], all bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostFigures {
    pub mem_total: u64,
    pub mem_available: u64,
    pub eviction_hard: u64,
    pub system_reserved: u64,
    pub kube_reserved: u64,
    pub kubepods_in_use: u64,
    /// Whether a kubelet runs on this host (its limit then applies too).
    pub kubelet: bool,
}

pub fn headroom(host: &HostFigures, os_reserve: u64, safety_margin: u64) -> Headroom {
    let signed = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
    let host_limit = signed(host.mem_available)
        - signed(host.eviction_hard)
        - signed(os_reserve)
        - signed(safety_margin);
    let kube_limit = host.kubelet.then(|| {
        signed(host.mem_total)
            - signed(host.system_reserved)
            - signed(host.kube_reserved)
            - signed(host.eviction_hard)
            - signed(host.kubepods_in_use)
            - signed(safety_margin)
    });
    let (usable, binding) = match kube_limit {
        Some(k) if k < host_limit => (k, Binding::Kubelet),
        _ => (host_limit, Binding::Host),
    };
    Headroom {
        mem_total: host.mem_total,
        mem_available: host.mem_available,
        eviction_hard: host.eviction_hard,
        os_reserve,
        safety_margin,
        system_reserved: host.system_reserved,
        kube_reserved: host.kube_reserved,
        kubepods_in_use: host.kubepods_in_use,
        host_limit,
        kube_limit,
        usable,
        binding,
    }
}

impl Headroom {
    /// What the plan may use, in words: `"12.00 GiB usable"`, or, when the
    /// reserves leave nothing, which figure they exceed and by how much
    /// (never a negative byte count).
    pub fn usable_phrase(&self) -> String {
        match u64::try_from(self.usable) {
            Ok(bytes) => format!("{} usable", crate::units::format_bytes(bytes)),
            Err(_) => {
                let (reserves, figure) = match self.binding {
                    Binding::Host => (
                        "the eviction threshold, OS reserve and safety margin",
                        "MemAvailable",
                    ),
                    Binding::Kubelet => (
                        "the kubelet's reservations, eviction threshold, kubepods in use and safety margin",
                        "MemTotal",
                    ),
                };
                format!(
                    "nothing is usable: {reserves} exceed {figure} by {}",
                    crate::units::format_bytes(self.usable.unsigned_abs())
                )
            }
        }
    }
}

/// A signed headroom figure for a table cell: the GiB when not negative,
/// `none` otherwise (the verdict says by how much the reserves exceed it).
pub fn format_limit(bytes: i64) -> String {
    match u64::try_from(bytes) {
        Ok(bytes) => crate::units::format_bytes(bytes),
        Err(_) => "none".to_string(),
    }
}

/// MemAvailable below which the memory guard stops admitting work.
pub fn guard_threshold(eviction_hard: u64, safety_margin: u64) -> u64 {
    eviction_hard + safety_margin
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_weight_bytes_per_step_by_hand() {
        // 8 experts (1000 B each over all layers), top-2, 50-row embedding
        // of 100 B a row.
        let groups: BTreeMap<WeightGroup, u64> = [
            (WeightGroup::Attention, 1000),
            (WeightGroup::Router, 100),
            (WeightGroup::Norms, 10),
            (WeightGroup::LmHead, 500),
            (WeightGroup::Experts, 8000),
            (WeightGroup::Embeddings, 5000),
        ]
        .into_iter()
        .collect();
        // 1610 dense + 2 experts × 1000 + one row of 100.
        assert_eq!(decode_weight_bytes_per_step(&groups, 2, 8, 50, 1), 3710);
        // Batch 4: 8 × (1 − 0.75⁴) = 5.46875 experts → 5469 B, four rows.
        assert_eq!(
            decode_weight_bytes_per_step(&groups, 2, 8, 50, 4),
            1610 + 5469 + 400
        );
    }

    #[test]
    fn expected_distinct_experts_by_hand() {
        assert_eq!(expected_distinct_experts(128, 8, 1), 8.0);
        assert_eq!(expected_distinct_experts(8, 2, 4), 5.46875);
        // 128 × (1 − (120/128)³²) = 111.770…: a batch of 32 runs most experts.
        assert!((expected_distinct_experts(128, 8, 32) - 111.7710).abs() < 1e-3);
        assert_eq!(expected_distinct_experts(8, 8, 3), 8.0);
        assert_eq!(expected_distinct_experts(0, 2, 3), 0.0);
    }

    #[test]
    fn decode_kv_bytes_per_step_by_hand() {
        let sliding = SlidingKv {
            layers: 1,
            window_tokens: 16,
            bytes_per_token: 32,
            blocks_per_seq: 0,
            step_blocks: 0,
            blocks: 0,
            bytes: 0,
        };
        // 2 × (40 × 64 + 16 × 32): the sliding layer reads its window only.
        assert_eq!(decode_kv_bytes_per_step(64, &sliding, 40, 2), 6144);
        assert_eq!(
            decode_kv_bytes_per_step(64, &sliding, 10, 2),
            2 * (640 + 320)
        );
    }

    #[test]
    fn linear_bytes_by_format() {
        assert_eq!(linear_bytes(64, 128, Quantization::Bf16, 0), 16_384);
        // 64×128/2 codes + 64×8 scales + two f32 scalars
        assert_eq!(
            linear_bytes(64, 128, Quantization::Nvfp4, 0),
            4096 + 512 + 8
        );
        // 64×128/2 codes + 64×4 exponents
        assert_eq!(linear_bytes(64, 128, Quantization::Mxfp4, 0), 4096 + 256);
        // FP8: a byte per value and two f32 scalars.
        assert_eq!(linear_bytes(64, 128, Quantization::Fp8, 0), 8192 + 8);
        // FP8 block: 200 × 300 has 2 × 3 blocks (ragged edges count whole).
        assert_eq!(
            linear_bytes(200, 300, Quantization::Fp8Block, 0),
            60_000 + 6 * 4
        );
        // INT4, group 32: codes 64 × 128 / 2, 4 groups × 64 rows of f16
        // scales and 4-bit zeros, and an int32 `g_idx` per column.
        assert_eq!(
            linear_bytes(64, 128, Quantization::Int4, 32),
            4096 + 256 * 2 + 256 / 2 + 128 * 4
        );
    }

    #[test]
    fn headroom_binding() {
        let gib = 1i64 << 30;
        let host = HostFigures {
            mem_total: 100 << 30,
            mem_available: 90 << 30,
            eviction_hard: 1 << 30,
            system_reserved: 2 << 30,
            kube_reserved: 1 << 30,
            kubepods_in_use: 20 << 30,
            kubelet: true,
        };
        let h = headroom(&host, 4 << 30, 1 << 30);
        assert_eq!(h.host_limit, 84 * gib);
        assert_eq!(h.kube_limit, Some(75 * gib));
        assert_eq!((h.usable, h.binding), (75 * gib, Binding::Kubelet));
        let h = headroom(
            &HostFigures {
                kubelet: false,
                ..host
            },
            4 << 30,
            1 << 30,
        );
        assert_eq!(
            (h.usable, h.binding, h.kube_limit),
            (84 * gib, Binding::Host, None)
        );
    }

    #[test]
    fn negative_headroom_is_said_in_words() {
        let host = HostFigures {
            mem_total: 4 << 30,
            mem_available: 1 << 30,
            ..HostFigures::default()
        };
        let h = headroom(&host, 2 << 30, 1 << 30);
        assert_eq!(h.usable, -(2i64 << 30));
        let phrase = h.usable_phrase();
        assert_eq!(
            phrase,
            "nothing is usable: the eviction threshold, OS reserve and safety margin exceed MemAvailable by 2.00 GiB"
        );
        assert!(!phrase.contains('-'), "{phrase}");
        assert_eq!(format_limit(h.usable), "none");
        assert_eq!(format_limit(3 << 30), "3.00 GiB");
        let h = headroom(&host, 0, 0);
        assert_eq!(h.usable_phrase(), "1.00 GiB usable");
    }

    #[test]
    fn prompt_logprobs_cost_the_logits_buffer_not_a_step_of_rows() {
        // Qwen3-30B-A3B: vocab 151936, max_num_seqs 16, 8192 tokens a step.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("profiles/qwen3-30b-a3b-bf16.toml");
        let profile = super::super::profile::Profile::load(&path).unwrap();
        let g = profile.model.geometry.clone();
        assert_eq!(g.vocab_size, 151_936);
        assert_eq!(profile.serving.max_num_seqs, 16);
        let p = prompt_logprobs(&g, 8192, 16);
        assert_eq!(p.buffer, PROMPT_LOGITS);
        assert_eq!(p.chunk_rows, 64);
        assert_eq!(p.chunk_bytes, 64 * 151_936 * 4); // 37.1 MiB
        assert_eq!(p.unchunked_bytes, 8192 * 151_936 * 4); // 4.64 GiB
        let a = activations(&g, 8192, 16, 16, 4096, 16);
        let bytes = |name: &str| a.buffers.iter().find(|b| b.name == name).map(|b| b.bytes);
        assert_eq!(bytes(PROMPT_LOGITS), Some(p.chunk_bytes));
        assert_eq!(bytes(LOGITS), Some(16 * 151_936 * 4));
        // Where the sampled rows' buffer holds as many, it is reused.
        let p = prompt_logprobs(&g, 8192, 128);
        assert_eq!((p.buffer, p.chunk_rows), (LOGITS, 128));
        let a = activations(&g, 8192, 128, 128, 4096, 16);
        assert!(a.buffers.iter().all(|b| b.name != PROMPT_LOGITS));
        // Never more rows than a step has.
        assert_eq!(prompt_logprobs(&g, 5, 4).chunk_rows, 5);
    }

    #[test]
    fn the_host_reads_the_logits_from_host_mapped_buffers_and_nothing_else() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("profiles/qwen3-30b-a3b-bf16.toml");
        let profile = super::super::profile::Profile::load(&path).unwrap();
        let a = activations(&profile.model.geometry, 8192, 16, 16, 4096, 16);
        let host_mapped: Vec<&str> = a
            .buffers
            .iter()
            .filter(|b| b.placement == Placement::HostMapped)
            .map(|b| b.name.as_str())
            .collect();
        assert_eq!(host_mapped, [LOGITS, PROMPT_LOGITS]);
        // The plan lists the placement only where it is not device memory.
        let listed = serde_json::to_value(&a.buffers).unwrap();
        let placements: Vec<_> = listed
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|b| b.get("placement"))
            .collect();
        assert_eq!(placements, ["host_mapped", "host_mapped"]);
    }

    /// The CPU's quantized-activation buffers cover every NVFP4, MXFP4 or
    /// INT4 linear: the experts' routed rows, else (or if wider) the batch of
    /// tokens times the widest input of the other NVFP4 linears; none on
    /// CUDA, none where every linear multiplies f32 or bf16 inputs.
    #[test]
    fn quantized_activations_cover_every_integer_linear() {
        let quantized = |g: &ModelGeometry, device| {
            let ws = moe_workspace(g, 16, 1, device, g.num_experts as u64);
            let find = |name| ws.buffers.iter().find(|b| b.name == name).map(|b| b.bytes);
            (find("quantized_input"), find("quantized_scales"))
        };
        // hidden 32, 4 heads of 8 (q 32), experts 32 wide, top-2.
        let mut g = kv_geometry("F");
        g.quantization = Quantization::Bf16;
        assert_eq!(quantized(&g, PlanDevice::Cpu), (None, None));
        g.lm_head_quantization = Quantization::Nvfp4;
        // 16 tokens × 32 hidden values, 2 bytes each; an f32 per 32.
        assert_eq!(
            quantized(&g, PlanDevice::Cpu),
            (Some(16 * 32 * 2), Some(16 * 4))
        );
        g.attention_quantization = Quantization::Nvfp4;
        g.num_attention_heads = 8; // o_proj reads 64 values a token
        assert_eq!(
            quantized(&g, PlanDevice::Cpu),
            (Some(16 * 64 * 2), Some(16 * 2 * 4))
        );
        g.mtp_layers = 1; // eh_proj reads 2 × hidden: no wider
        assert_eq!(quantized(&g, PlanDevice::Cpu).0, Some(16 * 64 * 2));
        g.quantization = Quantization::Nvfp4; // 16 × 2 routed rows × 32
        g.moe_intermediate_size = 96;
        assert_eq!(quantized(&g, PlanDevice::Cpu).0, Some(16 * 2 * 96 * 2));
        assert_eq!(quantized(&g, PlanDevice::Cuda), (None, None));
        // GPTQ INT4 attention alone (the integer INT4 kernel): o_proj's 64.
        g.quantization = Quantization::Bf16;
        g.lm_head_quantization = Quantization::Bf16;
        g.attention_quantization = Quantization::Int4;
        assert_eq!(
            quantized(&g, PlanDevice::Cpu),
            (Some(16 * 64 * 2), Some(16 * 2 * 4))
        );
    }

    /// `types` as layers (`S` sliding, `F` full), 2 KV heads of 8, window 40.
    fn kv_geometry(types: &str) -> ModelGeometry {
        ModelGeometry {
            architecture: Architecture::GptOss,
            quantization: Quantization::Mxfp4,
            attention_quantization: Quantization::Bf16,
            lm_head_quantization: Quantization::Bf16,
            quant_group_size: 0,
            num_layers: types.len(),
            hidden_size: 32,
            num_attention_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            vocab_size: 64,
            num_experts: 4,
            top_k: 2,
            moe_intermediate_size: 32,
            intermediate_size: 0,
            mlp_only_layers: Vec::new(),
            decoder_sparse_step: 1,
            tie_word_embeddings: false,
            attention_bias: true,
            layer_types: types
                .chars()
                .map(|c| match c {
                    'S' => LayerAttention::SlidingAttention,
                    _ => LayerAttention::FullAttention,
                })
                .collect(),
            sliding_window: Some(40),
            linear_num_key_heads: 0,
            linear_num_value_heads: 0,
            linear_key_head_dim: 0,
            linear_value_head_dim: 0,
            linear_conv_kernel_dim: 0,
            shared_expert_intermediate_size: 0,
            mtp_layers: 0,
        }
    }

    fn kv_serving(max_model_len: usize) -> ServingSection {
        ServingSection {
            max_model_len,
            max_num_seqs: 3,
            max_num_batched_tokens: 100,
            kv_block_size: 16,
            kv_cache_dtype: KvCacheDtype::F32,
            ..ServingSection::default()
        }
    }

    #[test]
    fn sliding_layers_take_window_and_step_blocks_of_the_pool() {
        // 4 sliding and 2 full layers: a slot holds K and V of 4 arrays of
        // 2 × 8 f32 values, 2 × 4 × 16 × 4 = 512 B; full layers read
        // 2 × 2 × 16 × 4 = 256 B a token, sliding ones 2 × 4 × 16 × 4 = 512 B.
        let g = kv_geometry("SFSSFS");
        assert_eq!(kv_bytes_per_token(&g, 4), 512);
        assert_eq!(full_attention_bytes_per_token(&g, 4), 256);
        let k = sliding_kv(&g, 4, &kv_serving(1000));
        assert_eq!((k.layers, k.window_tokens, k.bytes_per_token), (4, 40, 512));
        // Window 40, block 16: ⌈39 / 16⌉ + 1 = 4 blocks a sequence; a step of
        // 100 tokens ⌈100 / 16⌉ = 7; 3 sequences: 3 × (4 + 1) + 7 = 22 blocks,
        // under the cap 3 × ⌈1000 / 16⌉ = 189; 22 × 16 slots × 512 B.
        assert_eq!((k.blocks_per_seq, k.step_blocks, k.blocks), (4, 7, 22));
        assert_eq!(k.bytes, 22 * 16 * 512);
        // max_model_len 20: the window is 20, ⌈19 / 16⌉ + 1 = 3 blocks, and
        // 3 × (3 + 1) + 7 = 19 is capped at 3 sequences × ⌈20 / 16⌉ = 6.
        let short = sliding_kv(&g, 4, &kv_serving(20));
        assert_eq!(short.window_tokens, 20);
        assert_eq!((short.blocks_per_seq, short.blocks), (3, 6));
        assert_eq!(short.bytes, 6 * 16 * 512);
        // No sliding layers: nothing set aside, a slot is the full layers'.
        let full = kv_geometry("FFF");
        let none = sliding_kv(&full, 4, &kv_serving(1000));
        assert_eq!(
            (none.layers, none.window_tokens, none.blocks, none.bytes),
            (0, 0, 0, 0)
        );
        assert_eq!(kv_bytes_per_token(&full, 4), 2 * 3 * 16 * 4);
        assert_eq!(full_attention_bytes_per_token(&full, 4), 2 * 3 * 16 * 4);
    }

    #[test]
    fn layout_arrays_are_shared_by_the_kth_layer_of_each_kind() {
        let g = kv_geometry("SFSSFS");
        let layout = KvLayout::new(&g, &kv_serving(1000), 30, 40);
        // Sliding layers 0, 2, 3, 5 take arrays 0..4, full layers 1, 4
        // arrays 0, 1: 4 arrays.
        let arrays: Vec<usize> = (0..6).map(|l| layout.array_of(l)).collect();
        assert_eq!(arrays, [0, 0, 1, 2, 1, 3]);
        assert_eq!(layout.arrays(6), 4);
        assert!(layout.has_sliding(6));
        // The first two layers alone: one of each kind, one array.
        assert_eq!(layout.arrays(2), 1);
        // An array: 30 blocks × 16 slots × 16 values, K and V in f32.
        assert_eq!(layout.array_slots(), 480);
        assert_eq!(layout.array_elements(), 480 * 16);
        assert_eq!(layout.array_bytes(), 2 * 480 * 16 * 4);
        assert_eq!(layout.bytes(6), 4 * 2 * 480 * 16 * 4);
        // The same as slots × kv_bytes_per_token.
        assert_eq!(layout.bytes(6), 480 * kv_bytes_per_token(&g, 4));
    }

    #[test]
    fn step_metadata_words_hold_two_tables_a_sequence() {
        // 2 × 100 tokens + 3 × (2 × 7 + 5) = 257 words of 4 bytes.
        let step = StepMetadataPlan::new(100, 3, 7);
        assert_eq!((step.words, step.bytes), (257, 1028));
        // max_model_len 100 in blocks of 16: 7 blocks a table.
        assert_eq!(StepMetadataPlan::for_serving(&kv_serving(100)), step);
    }

    #[test]
    fn kv_tokens_are_whole_blocks_and_capped() {
        assert_eq!(kv_tokens_for(1000 * 100, 100, 16, 10, 1000), 992);
        // one sequence of 1000 tokens needs 63 blocks of 16
        assert_eq!(kv_tokens_for(u64::MAX / 2, 100, 16, 1, 1000), 1008);
        assert_eq!(kv_tokens_for(u64::MAX / 2, 100, 16, 3, 1000), 3 * 1008);
        assert_eq!(kv_tokens_for(0, 100, 16, 1, 1000), 0);
    }
}

/// What speculative decoding costs (`[serving] speculative_config`): a
/// step verifies up to `k` draft tokens per sequence as extra rows of the
/// step (inside `max_num_batched_tokens`: no activation grows with them),
/// and their logits come back in one lm_head pass, so the [`LOGITS`] buffer
/// holds `max_num_seqs × (1 + k)` rows; on hybrid models the recurrent
/// state after each verify row is kept in `max_num_seqs × k` slots of the
/// recurrent-state pool ([`RecurrentStatePlan::verify_slots`]). The n-gram
/// proposer has no weights and no cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SpeculativePlan {
    /// `None`: speculative decoding is off and everything below is zero.
    pub method: Option<&'static str>,
    pub num_speculative_tokens: usize,
    /// Rows of the logits buffer.
    pub logit_rows: usize,
    /// What those rows add to the logits buffer: `max_num_seqs × k × vocab × 4`.
    pub logits_bytes: u64,
    pub verify_state_slots: usize,
    /// `verify_state_slots × bytes_per_seq` of the recurrent-state pool.
    pub verify_state_bytes: u64,
}

pub fn speculative(g: &ModelGeometry, s: &ServingSection) -> SpeculativePlan {
    let k = s.speculative.map_or(0, |c| c.draft_rows());
    let state = recurrent_state(g, s);
    SpeculativePlan {
        method: s.speculative.map(|c| c.method.name()),
        num_speculative_tokens: k,
        logit_rows: s.max_num_seqs * (1 + k),
        logits_bytes: (s.max_num_seqs * k) as u64 * g.vocab_size as u64 * ACTIVATION_BYTES,
        verify_state_slots: state.verify_slots,
        verify_state_bytes: state.verify_slots as u64 * state.bytes_per_seq,
    }
}
