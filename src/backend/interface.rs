//! The [`Backend`] trait, every op the model needs, and the argument
//! bundles that name a backend's own buffer and weight types.

use super::error::BackendError;
use super::experts::{ExpertsSpec, RouterKind};
use super::shapes::{AttentionShape, DeltaNetShape};
use crate::checkpoint::kv_scales::KvScales;
use crate::checkpoint::linear::{LinearWeight, VectorWeight};
use crate::plan::ledger::Category;
use crate::plan::memory::{
    KvLayout, MoeWorkspace as MoeWorkspacePlan, Placement, RecurrentStatePlan, StepMetadataPlan,
};
use crate::step::StepBatch;

/// What a Gated DeltaNet layer's delta rule reads beside the
/// convolution's output: per value head `β = sigmoid(b)` and
/// `g = −exp(A_log) · softplus(a + dt_bias)`.
pub struct DeltaRuleGates<'a, 'w, B: Backend + 'w> {
    /// `[rows, value_heads]` step gate logits (`in_proj_b`).
    pub b: &'a B::Buffer,
    /// `[rows, value_heads]` decay logits (`in_proj_a`).
    pub a: &'a B::Buffer,
    pub a_log: &'a B::Vector<'w>,
    pub dt_bias: &'a B::Vector<'w>,
}

/// The operations the model needs. Implementations must be exact up to
/// floating-point summation order: the CPU backend is the reference.
pub trait Backend: Sync + Sized {
    /// An f32 buffer in the backend's memory.
    type Buffer: Send;
    /// A linear weight ready for [`Backend::matmul`].
    type Linear<'w>: Send + Sync
    where
        Self: 'w;
    /// A vector weight (norm, bias, sinks) ready for the ops.
    type Vector<'w>: Send + Sync
    where
        Self: 'w;
    /// The experts of one MoE layer.
    type Experts<'w>: Send + Sync
    where
        Self: 'w;
    /// The one MoE workspace every MoE layer borrows in turn.
    type Workspace: Send;
    /// The KV cache of every layer.
    type KvCache: Send;
    /// One step's token ids, positions and sequence table, in backend memory.
    type Step: Send;
    /// The Gated DeltaNet layers' states of every sequence slot.
    type RecurrentState: Send;

    fn name(&self) -> &'static str;

    /// Whether the backend computes on the host's rayon pool (the CPU
    /// backend): then the engine runs each step on a thread of that pool,
    /// which computes its share of every parallel op, instead of handing
    /// every op to the pool and sleeping until it is done.
    const COMPUTES_ON_HOST_POOL: bool = false;

    // ---- memory, all charged to the ledger, all allocated once ----

    /// A zeroed f32 buffer of `elements`, charged to `category`, where
    /// `placement` says.
    fn alloc(
        &self,
        category: Category,
        what: &'static str,
        elements: usize,
        placement: Placement,
    ) -> Result<Self::Buffer, BackendError>;
    fn linear<'w>(&self, w: LinearWeight<'w>) -> Result<Self::Linear<'w>, BackendError>;
    fn vector<'w>(&self, v: VectorWeight<'w>) -> Result<Self::Vector<'w>, BackendError>;
    fn experts<'w>(&self, spec: ExpertsSpec<'w>) -> Result<Self::Experts<'w>, BackendError>;
    /// The MoE workspace exactly as the plan lists it.
    fn workspace(&self, plan: &MoeWorkspacePlan) -> Result<Self::Workspace, BackendError>;
    /// The KV cache of `layers` layers exactly as the plan's layout lists
    /// it; an FP8 cache quantizes with `scales` (one per KV layer).
    fn kv_cache(
        &self,
        layout: &KvLayout,
        layers: usize,
        scales: &KvScales,
    ) -> Result<Self::KvCache, BackendError>;
    /// Step metadata storage exactly as the plan sizes it.
    fn step_storage(&self, plan: &StepMetadataPlan) -> Result<Self::Step, BackendError>;
    /// The recurrent-state pool exactly as the plan sizes it, zeroed.
    fn recurrent_state(
        &self,
        plan: &RecurrentStatePlan,
    ) -> Result<Self::RecurrentState, BackendError>;

    // ---- a forward step ----

    /// Copies the step's metadata into backend memory.
    fn load_step(&self, batch: &StepBatch, step: &mut Self::Step) -> Result<(), BackendError>;

    /// `out[t] = table[token[t]]`.
    fn embed(
        &self,
        table: &Self::Linear<'_>,
        step: &Self::Step,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// `out = rmsnorm(x) · w` over rows of `width`.
    fn rmsnorm(
        &self,
        x: &Self::Buffer,
        w: &Self::Vector<'_>,
        eps: f32,
        rows: usize,
        width: usize,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// `residual += delta; out = rmsnorm(residual) · w`.
    #[allow(clippy::too_many_arguments)]
    fn add_rmsnorm(
        &self,
        residual: &mut Self::Buffer,
        delta: &Self::Buffer,
        w: &Self::Vector<'_>,
        eps: f32,
        rows: usize,
        width: usize,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// `out[r] = x[r] · Wᵀ (+ bias)` for each job, all in one launch / parallel region.
    fn matmul(&self, jobs: &mut [Matmul<'_, '_, Self>]) -> Result<(), BackendError>;

    /// Cosines and sines of the step's positions: `[rows, head_dim]`
    /// (`head_dim/2` cos then `head_dim/2` sin per row), times `attention_factor`.
    fn rope_table(
        &self,
        step: &Self::Step,
        inv_freq: &[f32],
        attention_factor: f32,
        rows: usize,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// Per-head RMSNorm of q and k (when given), then neox RoPE, in place.
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope(
        &self,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        norms: Option<(&Self::Vector<'_>, &Self::Vector<'_>, f32)>,
        rope: &Self::Buffer,
        rows: usize,
        shape: &AttentionShape,
    ) -> Result<(), BackendError>;

    /// Causal attention of this step's queries over each sequence's cached
    /// past (layer `layer` of `kv`) and the step's own keys/values `k`, `v`.
    /// `k` and `v` are rounded to the cache's precision first (the CPU
    /// rounds them in place; CUDA as it reads them), so a key gives the
    /// same score whether it is read from the step or, later, from the
    /// cache. `ws` is scratch the backend may use (CUDA: the partial
    /// results of a decode split along the sequence); the MoE does not
    /// need it during attention.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buffer,
        k: &mut Self::Buffer,
        v: &mut Self::Buffer,
        kv: &Self::KvCache,
        layer: usize,
        step: &Self::Step,
        shape: &AttentionShape,
        sinks: Option<&Self::Vector<'_>>,
        ws: &mut Self::Workspace,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// Appends the step's keys and values to layer `layer` of the cache.
    fn kv_append(
        &self,
        k: &Self::Buffer,
        v: &Self::Buffer,
        kv: &mut Self::KvCache,
        layer: usize,
        step: &Self::Step,
    ) -> Result<(), BackendError>;

    /// Copies whole blocks of the cache, every array: for each `(from, to)`
    /// pair, the `block_size` slots of block `from` onto those of block
    /// `to` (copy on write of a partial block shared by `n > 1` choices).
    /// A block appears at most once as a `to`, never as a `from` too.
    fn kv_copy_blocks(
        &self,
        kv: &mut Self::KvCache,
        pairs: &[(u32, u32)],
    ) -> Result<(), BackendError>;

    /// Copies whole sequence slots of the recurrent-state pool, every
    /// layer's convolution and delta-rule state: for each `(from, to)` pair,
    /// slot `from` onto slot `to` (an `n > 1` choice takes its leader's
    /// state after the prompt). A slot appears at most once as a `to`,
    /// never as a `from` too.
    fn copy_state_slots(
        &self,
        state: &mut Self::RecurrentState,
        pairs: &[(u32, u32)],
    ) -> Result<(), BackendError>;

    /// Top-k routing of `rows` tokens from `[rows, E]` logits into the workspace.
    fn route(
        &self,
        logits: &Self::Buffer,
        rows: usize,
        num_experts: usize,
        top_k: usize,
        kind: RouterKind,
        ws: &mut Self::Workspace,
    ) -> Result<(), BackendError>;

    /// The routed experts of one layer: group rows by expert, gate/up,
    /// activation, down, and the routing-weighted sum into `out` (`[rows, H]`,
    /// overwritten).
    fn moe(
        &self,
        x: &Self::Buffer,
        rows: usize,
        experts: &Self::Experts<'_>,
        ws: &mut Self::Workspace,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    // ---- Gated DeltaNet and gated attention (qwen3_5, qwen3_next) ----

    /// The causal depthwise convolution of a Gated DeltaNet layer, in place
    /// over `qkv` (`[rows, conv_channels]`), then SiLU: each output sums
    /// `kernel` inputs of its channel, the token's and the ones before it,
    /// weighted by `weight` (`[channels, kernel]`, the last tap on the
    /// token). A sequence continues from the inputs its state slot kept
    /// (layer `layer` of the pool), zeros when its chunk starts at position
    /// 0, and the slot keeps its last `kernel − 1` inputs for the next step.
    #[allow(clippy::too_many_arguments)]
    fn gdn_conv(
        &self,
        qkv: &mut Self::Buffer,
        weight: &Self::Vector<'_>,
        state: &mut Self::RecurrentState,
        layer: usize,
        step: &Self::Step,
        shape: &DeltaNetShape,
    ) -> Result<(), BackendError>;

    /// The gated delta rule of a Gated DeltaNet layer over the convolved
    /// `qkv` (`[rows, q | k | v]`): q and k L2-normalised (in place), q scaled by
    /// `1/√key_dim`; per value head a state `S` (`key_dim × value_dim`,
    /// from the sequence's slot, zeroed at position 0) and per token
    /// `S ← e^g S; δ = β (v − Sᵀk); S ← S + k δᵀ; o = Sᵀq` into `out`
    /// (`[rows, value_heads × value_dim]`). The step's `state_saves` copy a
    /// sequence's states (this layer's convolution inputs in
    /// [`gdn_conv`](Self::gdn_conv), its delta-rule states here) after the
    /// saved row into the save's slot.
    #[allow(clippy::too_many_arguments)]
    fn gdn_delta_rule(
        &self,
        qkv: &mut Self::Buffer,
        gates: &DeltaRuleGates<'_, '_, Self>,
        state: &mut Self::RecurrentState,
        layer: usize,
        step: &Self::Step,
        shape: &DeltaNetShape,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// qwen3_next's fused projections back to the layout of the split
    /// ones: `qkvz` (`[rows, key_heads × (q, k, v, z of the head's group)]`)
    /// and `ba` (`[rows, key_heads × (b, a of the group)]`) into `qkv`
    /// (`[rows, q | k | v]`), `z`, `b` and `a`.
    #[allow(clippy::too_many_arguments)]
    fn gdn_unfuse(
        &self,
        qkvz: &Self::Buffer,
        ba: &Self::Buffer,
        rows: usize,
        shape: &DeltaNetShape,
        qkv: &mut Self::Buffer,
        z: &mut Self::Buffer,
        b: &mut Self::Buffer,
        a: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// `x = rmsnorm(x) · w · silu(z)` per group of `width` values (a value
    /// head), over `n` values (the Gated DeltaNet's output norm; `w` is
    /// not zero-centred).
    fn gated_rmsnorm(
        &self,
        x: &mut Self::Buffer,
        z: &Self::Buffer,
        w: &Self::Vector<'_>,
        eps: f32,
        width: usize,
        n: usize,
    ) -> Result<(), BackendError>;

    /// Gated attention's `q_proj` output (`[rows, heads × (query | gate)]`,
    /// `head_dim` each) into `q` and `gate` (`[rows, heads × head_dim]` each).
    fn split_query_gate(
        &self,
        query_gate: &Self::Buffer,
        rows: usize,
        heads: usize,
        head_dim: usize,
        q: &mut Self::Buffer,
        gate: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// `x[i] *= sigmoid(gate[i])` for `n` elements (gated attention's output).
    fn sigmoid_mul(
        &self,
        x: &mut Self::Buffer,
        gate: &Self::Buffer,
        n: usize,
    ) -> Result<(), BackendError>;

    /// `out[r] += sigmoid(logit[r]) · x[r]` over `rows` rows of `width`
    /// (the shared expert, weighted by its gate, joins the experts' sum).
    fn add_gated(
        &self,
        out: &mut Self::Buffer,
        x: &Self::Buffer,
        logits: &Self::Buffer,
        rows: usize,
        width: usize,
    ) -> Result<(), BackendError>;

    /// `gate[i] = silu(gate[i]) · up[i]` for `n` elements.
    fn silu_mul(
        &self,
        gate: &mut Self::Buffer,
        up: &Self::Buffer,
        n: usize,
    ) -> Result<(), BackendError>;

    /// `residual += delta` over `n` elements.
    fn add(
        &self,
        residual: &mut Self::Buffer,
        delta: &Self::Buffer,
        n: usize,
    ) -> Result<(), BackendError>;

    /// `out[r] = left[r] ‖ right[r]` over `rows` rows of `width` values
    /// each (`out` rows of `2 × width`): an MTP head's `fc` input,
    /// `[embedding | hidden]`.
    fn concat_rows(
        &self,
        left: &Self::Buffer,
        right: &Self::Buffer,
        rows: usize,
        width: usize,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// Moves row `rows[i]` of `buf` (rows of `width`) to row `i`, in order
    /// (`rows` ascending, so no row is overwritten before it is read).
    fn compact_rows(
        &self,
        buf: &mut Self::Buffer,
        step: &Self::Step,
        width: usize,
    ) -> Result<(), BackendError>;

    /// Hands the first `n` values of `buf` to `f` on the host.
    fn read(
        &self,
        buf: &Self::Buffer,
        n: usize,
        f: &mut dyn FnMut(&[f32]),
    ) -> Result<(), BackendError>;

    /// Kernel launches so far, on backends that launch kernels.
    fn launches(&self) -> Option<u64> {
        None
    }

    /// Where this backend's buffers live, for the memory guard.
    fn buffer_memory(&self) -> BufferMemory {
        BufferMemory::Process
    }
}

/// Where a backend's buffers live, which decides what the host's memory
/// figures show of them (`server::hidden_footprint`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferMemory {
    /// Process memory (CPU backend): in MemAvailable and the cgroup.
    Process,
    /// Driver allocations of a GPU sharing the host's pool (a GB10).
    IntegratedGpu,
    /// A GPU's own memory.
    DiscreteGpu,
}

/// One `out = x · Wᵀ (+ bias)` of a [`Backend::matmul`] call, over rows
/// `x_row..x_row + rows` of `x`, written to rows `0..rows` of `out`.
pub struct Matmul<'a, 'w, B: Backend + 'w> {
    pub x: &'a B::Buffer,
    pub x_row: usize,
    pub rows: usize,
    pub w: &'a B::Linear<'w>,
    pub bias: Option<&'a B::Vector<'w>>,
    pub out: &'a mut B::Buffer,
}
