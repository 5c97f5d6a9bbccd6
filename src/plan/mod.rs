//! Profiles, the memory plan and the live ledger.
//!
//! A plan is computed before anything is allocated, from a profile, the
//! checkpoint's headers (when at hand) and a reading of the host. It says
//! whether the model fits and, if not, by how much and which knob to turn.

mod device;
pub mod ledger;
pub mod memory;
pub mod parallel;
pub mod perf;
pub mod profile;
pub mod report;
pub mod speculative;

use serde::Serialize;
use thiserror::Error;

use crate::geometry::{self, Architecture, ModelGeometry, WeightGroup};
use memory::{
    Activations, Headroom, HostFigures, KvLayout, MoeWorkspace, RecurrentStatePlan,
    RuntimeOverhead, SlidingKv, StepMetadataPlan, WeightBytes,
};
use profile::{DEFAULT_CPU_OVERHEAD, DEFAULT_CUDA_OVERHEAD, KvCacheDtype, KvCacheSize, Profile};

use crate::host::HostReading;
pub use device::PlanDevice;

#[derive(Debug, Error)]
pub enum PlanError {
    #[error(
        "the checkpoint does not match the profile: {field} is {checkpoint} in the checkpoint's config.json but {profile} in the profile"
    )]
    GeometryMismatch {
        field: String,
        profile: String,
        checkpoint: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModelSummary {
    pub name: Option<String>,
    pub architecture: Architecture,
    pub quantization: geometry::Quantization,
    pub num_layers: usize,
    pub num_moe_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub hidden_size: usize,
    pub moe_intermediate_size: usize,
    pub vocab_size: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WeightsPlan {
    pub total: u64,
    pub groups: std::collections::BTreeMap<WeightGroup, u64>,
    /// Bytes of the checkpoint's tensors text serving never reads, by
    /// prefix (a vision tower, MTP layers): mapped, never touched, not in
    /// `total`.
    pub unused: std::collections::BTreeMap<String, u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KvPlan {
    pub dtype: KvCacheDtype,
    pub block_size: usize,
    /// Bytes of one token slot of the pool ([`memory::kv_bytes_per_token`]).
    pub bytes_per_token: u64,
    /// Full-attention tokens the cache holds (whole blocks): what an
    /// explicit `kv_cache` buys, or what `"auto"` leaves room for; the
    /// sliding-window layers' blocks come on top.
    pub tokens: u64,
    /// Blocks of the pool: `tokens / block_size + sliding.blocks`.
    pub blocks: u64,
    /// Bytes of one block: `block_size × bytes_per_token`.
    pub block_bytes: u64,
    /// The blocks set aside for sliding-window layers (zero without such layers).
    pub sliding: SlidingKv,
    /// The explicit `kv_cache` asked for, when it was more than
    /// `max_num_seqs` sequences of `max_model_len` tokens can use and the
    /// cache was cut to that (`None` otherwise, and with `"auto"`).
    pub capped_from: Option<u64>,
    /// `tokens × bytes_per_token + sliding.bytes` (the layout's bytes).
    pub bytes: u64,
    /// What the backend allocates: the pool's arrays.
    #[serde(skip)]
    pub layout: KvLayout,
}

/// Why a plan does not fit and what would make it fit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Shortfall {
    pub bytes: u64,
    pub advice: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub fits: bool,
    /// True when weights come from the geometry, not a checkpoint's headers.
    pub estimated: bool,
    pub profile: String,
    pub device: PlanDevice,
    pub host: Headroom,
    pub model: ModelSummary,
    pub weights: WeightsPlan,
    pub moe_workspace: MoeWorkspace,
    pub activations: Activations,
    /// Where prompt log-probabilities are computed, and what they cost.
    pub prompt_logprobs: memory::PromptLogprobsPlan,
    pub runtime_overhead: RuntimeOverhead,
    pub kv_cache: KvPlan,
    /// The Gated DeltaNet layers' states (zero bytes without such layers),
    /// charged with the KV cache.
    pub recurrent_state: RecurrentStatePlan,
    /// Speculative decoding's rows and state slots (inside `activations`
    /// and `recurrent_state`; all zero when it is off).
    pub speculative: memory::SpeculativePlan,
    /// The step metadata (also the activation buffer `step_metadata`).
    #[serde(skip)]
    pub step_metadata: StepMetadataPlan,
    /// The request queue's default bound (not in `total`: see there).
    pub queue: memory::QueuePlan,
    pub total: u64,
    pub shortfall: Option<Shortfall>,
    /// max_model_len and friends, echoed so the plan reads on its own.
    pub serving: profile::ServingSection,
    /// Where each serving value (and the geometry, `model`) came from:
    /// flag, request, profile, checkpoint or default.
    pub sources: std::collections::BTreeMap<&'static str, profile::ValueSource>,
}

impl Plan {
    /// Bytes of everything but the KV cache.
    pub fn fixed_bytes(&self) -> u64 {
        self.weights.total
            + self.moe_workspace.bytes
            + self.activations.bytes
            + self.runtime_overhead.bytes
            + self.recurrent_state.bytes
    }
}

/// Weight bytes read to decode one token at batch 1 (bench's roofline):
/// every dense weight, `top_k` of each MoE layer's experts, one embedding row.
pub fn decode_weight_bytes_per_token(plan: &Plan) -> u64 {
    memory::decode_weight_bytes_per_step(
        &plan.weights.groups,
        plan.model.top_k,
        plan.model.num_experts,
        plan.model.vocab_size,
        1,
    )
}

/// The host figures of a reading, as the plan's formulas take them.
pub fn host_figures(reading: &HostReading) -> HostFigures {
    HostFigures {
        mem_total: reading.meminfo.mem_total,
        mem_available: reading.meminfo.mem_available,
        eviction_hard: reading.eviction_hard(),
        system_reserved: reading.system_reserved(),
        kube_reserved: reading.kube_reserved(),
        kubepods_in_use: reading.kubepods_in_use(),
        kubelet: reading.kubelet.is_some(),
    }
}

/// Computes the plan. `exact_weights` are the checkpoint's header bytes by
/// group; without them weights are estimated from the geometry.
pub fn compute(
    profile: &Profile,
    host: &HostFigures,
    exact_weights: Option<WeightBytes>,
    device: PlanDevice,
) -> Plan {
    let served = profile.served_geometry();
    let held = memory::Held::all(&served);
    compute_for(profile, &served, held, host, exact_weights, device)
}

/// [`compute`] for a process that computes with geometry `g` and holds
/// `held` of the experts and vocabulary: the whole served model, or one
/// rank's share of it (`parallel`).
fn compute_for(
    profile: &Profile,
    g: &ModelGeometry,
    held: memory::Held,
    host: &HostFigures,
    exact_weights: Option<WeightBytes>,
    device: PlanDevice,
) -> Plan {
    let s = &profile.serving;
    let headroom = memory::headroom(
        host,
        profile.host.os_reserve.0,
        profile.host.safety_margin.0,
    );
    let estimated = exact_weights.is_none();
    let weights = exact_weights.unwrap_or_else(|| memory::estimate_held_weights(g, held));
    let workspace =
        memory::moe_workspace(g, s.max_num_batched_tokens, s.dp_size, device, held.experts);
    let speculative = memory::speculative(g, s);
    let activations = memory::activations(
        g,
        s.max_num_batched_tokens,
        s.max_num_seqs,
        speculative.logit_rows,
        s.max_model_len,
        s.kv_block_size,
    );
    let overhead = profile
        .backend
        .runtime_overhead
        .map(|b| b.0)
        .unwrap_or(match device {
            PlanDevice::Cpu => DEFAULT_CPU_OVERHEAD,
            PlanDevice::Cuda => DEFAULT_CUDA_OVERHEAD,
        });
    let dtype_bytes = s.kv_cache_dtype.bytes();
    let bytes_per_token = memory::kv_bytes_per_token(g, dtype_bytes);
    let sliding = memory::sliding_kv(g, dtype_bytes, s);
    let state = memory::recurrent_state(g, s);

    // The sliding layers' reserve is fixed by the serving limits, so it is
    // paid before the full-attention tokens: `"auto"` gives those what is
    // left, and an explicit `kv_cache` buys only them (the reserve comes on
    // top, as the sliding layers' rings did).
    let fixed = weights.total()
        + workspace.bytes
        + activations.bytes
        + overhead
        + state.bytes
        + sliding.bytes;
    let usable = headroom.usable;
    let kv_budget = match s.kv_cache {
        KvCacheSize::Auto => u64::try_from(usable - fixed as i64).unwrap_or(0),
        KvCacheSize::Bytes(b) => b,
    };
    let tokens = memory::kv_tokens_for(
        kv_budget,
        bytes_per_token,
        s.kv_block_size,
        s.max_num_seqs,
        s.max_model_len,
    );
    // The sliding layers' blocks come on top of the full-attention tokens'.
    let blocks = tokens / s.kv_block_size.max(1) as u64 + sliding.blocks;
    let most_tokens = memory::kv_tokens_for(
        u64::MAX,
        bytes_per_token,
        s.kv_block_size,
        s.max_num_seqs,
        s.max_model_len,
    );
    let capped_from = match s.kv_cache {
        KvCacheSize::Bytes(asked)
            if tokens == most_tokens && asked > tokens.saturating_mul(bytes_per_token) =>
        {
            Some(asked)
        }
        _ => None,
    };
    let layout = KvLayout::new(g, s, blocks, sliding.window_tokens);
    // The cache's bytes are the layout's, array by array: `tokens ×
    // bytes_per_token + sliding.bytes`.
    let kv_bytes = layout.bytes(g.num_kv_layers());
    let total = fixed - sliding.bytes + kv_bytes;

    // One sequence of max_model_len tokens must fit in the cache (its
    // sliding blocks are within the reserve, which holds max_num_seqs ≥ 1
    // windows).
    let one_sequence = memory::kv_tokens_for(
        u64::MAX,
        bytes_per_token,
        s.kv_block_size,
        1,
        s.max_model_len,
    );
    let fits = (total as i64) <= usable && tokens >= one_sequence;
    let shortfall = (!fits).then(|| {
        // `needed`: the least plan that fits (one full-length sequence of
        // full-attention tokens; `fixed` holds the sliding reserve). An
        // explicit kv_cache is also short of the tokens one sequence lacks,
        // whatever the host has.
        let needed = (fixed + one_sequence * bytes_per_token) as i64;
        let short = match s.kv_cache {
            KvCacheSize::Auto => needed - usable,
            KvCacheSize::Bytes(_) => (total as i64 - usable)
                .max(needed - usable)
                .max((one_sequence.saturating_sub(tokens) * bytes_per_token) as i64),
        };
        Shortfall {
            bytes: u64::try_from(short).unwrap_or(0),
            advice: advice(
                profile,
                &weights,
                &headroom,
                tokens,
                one_sequence,
                bytes_per_token,
                &workspace,
                &activations,
                &sliding,
            ),
        }
    });

    Plan {
        fits,
        estimated,
        profile: profile.source.clone(),
        device,
        host: headroom,
        model: ModelSummary {
            name: profile.model.name.clone(),
            architecture: g.architecture,
            quantization: g.quantization,
            num_layers: g.num_layers,
            num_moe_layers: g.num_moe_layers(),
            num_experts: g.num_experts,
            top_k: g.top_k,
            hidden_size: g.hidden_size,
            moe_intermediate_size: g.moe_intermediate_size,
            vocab_size: g.vocab_size,
        },
        weights: WeightsPlan {
            total: weights.total(),
            groups: weights.groups,
            unused: weights.unused,
        },
        moe_workspace: workspace,
        prompt_logprobs: memory::prompt_logprobs(
            g,
            s.max_num_batched_tokens,
            speculative.logit_rows,
        ),
        activations,
        runtime_overhead: memory::runtime_overhead(g, device, overhead),
        kv_cache: KvPlan {
            dtype: s.kv_cache_dtype,
            block_size: s.kv_block_size,
            bytes_per_token,
            tokens,
            blocks,
            block_bytes: bytes_per_token * s.kv_block_size as u64,
            sliding,
            capped_from,
            bytes: kv_bytes,
            layout,
        },
        recurrent_state: state,
        speculative,
        step_metadata: StepMetadataPlan::for_serving(s),
        queue: memory::queue_plan(s.max_model_len, profile.host.safety_margin.0),
        total,
        shortfall,
        serving: s.clone(),
        sources: profile.sources.clone(),
    }
}

/// Which knobs would make a plan that does not fit, fit.
#[allow(clippy::too_many_arguments)]
fn advice(
    profile: &Profile,
    weights: &WeightBytes,
    headroom: &Headroom,
    kv_tokens: u64,
    one_sequence: u64,
    bytes_per_token: u64,
    workspace: &MoeWorkspace,
    activations: &Activations,
    sliding: &SlidingKv,
) -> Vec<String> {
    use crate::units::format_bytes;
    let s = &profile.serving;
    if weights.total() as i64 > headroom.usable {
        let usable = match u64::try_from(headroom.usable) {
            Ok(bytes) => format!("only {} is usable on this host", format_bytes(bytes)),
            Err(_) => format!("{} on this host", headroom.usable_phrase()),
        };
        return vec![format!(
            "the weights alone take {} but {usable}: this model does not fit here; choose a smaller model or quantization, or a host with more memory",
            format_bytes(weights.total()),
        )];
    }
    let mut advice = Vec::new();
    if let KvCacheSize::Bytes(b) = s.kv_cache {
        if kv_tokens < one_sequence {
            advice.push(format!(
                "kv_cache = {} holds {kv_tokens} tokens, fewer than one max_model_len = {} sequence ({} needed): raise kv_cache or lower max_model_len",
                format_bytes(b),
                s.max_model_len,
                format_bytes(one_sequence * bytes_per_token)
            ));
        } else {
            advice.push(format!(
                "lower kv_cache (now {}) or set it to \"auto\"",
                format_bytes(b)
            ));
        }
    }
    let per_batched_token = (workspace.bytes + activations.bytes) / s.max_num_batched_tokens as u64;
    // The sliding reserve's `step_blocks` (see `memory::sliding_kv`): one
    // block of `kv_block_size` token slots per `kv_block_size` batched
    // tokens, so a slot (`bytes_per_token`) per batched token, unless the
    // max_model_len cap binds (hence "up to").
    let sliding_share = if sliding.step_blocks > 0 {
        format!(
            ", the sliding-window layers' KV blocks up to {} more",
            crate::units::format_bytes(bytes_per_token)
        )
    } else {
        String::new()
    };
    advice.push(format!(
        "lower max_num_batched_tokens (now {}): the MoE workspace and activations cost {} per batched token{sliding_share}",
        s.max_num_batched_tokens,
        crate::units::format_bytes(per_batched_token)
    ));
    advice.push(format!(
        "lower max_model_len (now {}): one full-length sequence needs {} of KV cache",
        s.max_model_len,
        format_bytes(one_sequence * bytes_per_token)
    ));
    advice
}

/// Checks that a checkpoint's geometry is the profile's, naming the first
/// field that differs.
pub fn check_geometry(
    profile: &ModelGeometry,
    checkpoint: &ModelGeometry,
) -> Result<(), PlanError> {
    let as_fields = |g: &ModelGeometry| match serde_json::to_value(g) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let (p, c) = (as_fields(profile), as_fields(checkpoint));
    for (field, profile_value) in &p {
        let checkpoint_value = c.get(field).unwrap_or(&serde_json::Value::Null);
        if profile_value != checkpoint_value {
            return Err(PlanError::GeometryMismatch {
                field: field.clone(),
                profile: profile_value.to_string(),
                checkpoint: checkpoint_value.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny gpt-oss fixture's profile: 4 layers alternating sliding
    /// (window 8) and full attention, 2 KV heads of 16, f32 keys, blocks of
    /// 16, 8 sequences of up to 1024 tokens, 256 tokens a step; 1 GiB OS
    /// reserve and 512 MiB safety margin.
    fn gpt_oss_tiny() -> Profile {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/gpt-oss-tiny.toml");
        Profile::load(&path).unwrap()
    }

    /// A host with `usable` bytes usable under the tiny profile's reserves.
    fn host(usable: u64) -> HostFigures {
        HostFigures {
            mem_total: usable + (3 << 30),
            mem_available: usable + (1 << 30) + (512 << 20),
            ..HostFigures::default()
        }
    }

    // By hand for gpt-oss-tiny: 2 arrays (2 sliding, 2 full layers), a slot
    // 2 × 2 × 32 × 4 = 512 B, a block 16 × 512 = 8192 B. Sliding: window 8,
    // ⌈7 / 16⌉ + 1 = 2 blocks a sequence, ⌈256 / 16⌉ = 16 for a step:
    // 8 × (2 + 1) + 16 = 40 blocks (cap 8 × ⌈1024 / 16⌉ = 512), 327680 B.
    const SLOT: u64 = 512;
    const BLOCK: u64 = 16 * SLOT;
    const SLIDING_BLOCKS: u64 = 40;

    #[test]
    fn an_explicit_kv_cache_buys_full_attention_tokens_and_sliding_blocks_come_on_top() {
        let mut p = gpt_oss_tiny();
        p.serving.kv_cache = KvCacheSize::Bytes(100 * BLOCK + 5);
        let plan = compute(&p, &host(64 << 30), None, PlanDevice::Cpu);
        let kv = &plan.kv_cache;
        assert_eq!((kv.bytes_per_token, kv.block_bytes), (SLOT, BLOCK));
        assert_eq!(kv.sliding.blocks, SLIDING_BLOCKS);
        assert_eq!(kv.sliding.bytes, SLIDING_BLOCKS * BLOCK);
        // 100 whole blocks of full-attention tokens, the sliding 40 besides.
        assert_eq!(kv.tokens, 100 * 16);
        assert_eq!(kv.blocks, 100 + SLIDING_BLOCKS);
        // arrays × blocks × block × width × (K, V) × f32.
        assert_eq!(kv.bytes, 2 * 140 * 16 * 32 * 2 * 4);
        assert_eq!(kv.bytes, kv.tokens * SLOT + kv.sliding.bytes);
        assert_eq!(kv.layout.bytes(4), kv.bytes);
        assert_eq!(kv.layout.blocks, 140);
        assert_eq!(kv.capped_from, None);
        assert_eq!(plan.total, plan.fixed_bytes() + kv.bytes);
        assert!(plan.fits);

        // More than 8 sequences of 1024 tokens can use: cut to 8 × 64
        // blocks, and the sliding ones still come on top.
        p.serving.kv_cache = KvCacheSize::Bytes(1 << 40);
        let plan = compute(&p, &host(64 << 30), None, PlanDevice::Cpu);
        let kv = &plan.kv_cache;
        assert_eq!(kv.tokens, 8 * 1024);
        assert_eq!(kv.blocks, 8 * 64 + SLIDING_BLOCKS);
        assert_eq!(kv.capped_from, Some(1 << 40));
        assert_eq!(kv.bytes, 2 * (512 + 40) * 16 * 32 * 2 * 4);
    }

    #[test]
    fn fits_and_shortfall_count_the_sliding_reserve() {
        let p = gpt_oss_tiny();
        let fixed = compute(&p, &host(64 << 30), None, PlanDevice::Cpu).fixed_bytes();
        // One 1024-token sequence is 64 blocks; with the sliding 40 the
        // least that fits is fixed + 104 blocks.
        let least = fixed + (64 + SLIDING_BLOCKS) * BLOCK;
        let plan = compute(&p, &host(least), None, PlanDevice::Cpu);
        assert!(plan.fits);
        assert_eq!(plan.kv_cache.tokens, 1024);
        assert_eq!(plan.total, least);
        // A byte less: 63 blocks of full-attention tokens, a byte short.
        let plan = compute(&p, &host(least - 1), None, PlanDevice::Cpu);
        assert!(!plan.fits);
        assert_eq!(plan.kv_cache.tokens, 63 * 16);
        let short = plan.shortfall.unwrap();
        assert_eq!(short.bytes, 1);
        // The advice prices a batched token with the sliding blocks' slot.
        assert!(
            short
                .advice
                .iter()
                .any(|a| a.contains("max_num_batched_tokens (now 256)")
                    && a.ends_with("the sliding-window layers' KV blocks up to 512 B more")),
            "{:?}",
            short.advice
        );
        assert!(
            short
                .advice
                .iter()
                .any(|a| a.starts_with("lower max_model_len (now 1024)")),
            "{:?}",
            short.advice
        );

        // An explicit kv_cache of 63 blocks on a big host: fewer tokens than
        // one sequence, short by the 64th block.
        let mut p = p;
        p.serving.kv_cache = KvCacheSize::Bytes(63 * BLOCK);
        let plan = compute(&p, &host(64 << 30), None, PlanDevice::Cpu);
        assert!(!plan.fits);
        assert_eq!(plan.total, fixed + (63 + SLIDING_BLOCKS) * BLOCK);
        // The host has room: short by the one block of 16 tokens the cache
        // lacks, 16 × 512 B.
        let short = plan.shortfall.unwrap();
        assert_eq!(short.bytes, BLOCK);
        assert!(
            short.advice[0].starts_with("kv_cache = "),
            "{:?}",
            short.advice
        );
    }
}
