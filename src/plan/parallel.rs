//! Tensor and expert parallelism as the plan sees it: what one rank of
//! `world` holds, and each rank's plan against its own node.
//!
//! The split is vLLM's: attention by query head (KV heads split, or each
//! held by `world / num_kv_heads` ranks when there are fewer of them than
//! ranks), dense MLPs and the shared expert by intermediate column, Gated
//! DeltaNet layers by key and value head, the embedding and lm_head by
//! vocabulary row; the routed experts by id (expert parallelism), each rank
//! holding a contiguous run of them. Norms, the router (it scores every
//! expert) and the MTP head's `fc` are held whole by every rank, and so are
//! the hidden states and the logits (all-gathered, so any rank can sample).
//!
//! A rank is planned with [`super::compute`]'s formulas over its own
//! geometry ([`RankShare::geometry`]) and its node's host figures; the
//! ranks share one scheduler, so they hold the same number of KV tokens:
//! the fewest any rank's `"auto"` leaves room for.

use serde::Serialize;
use thiserror::Error;

use super::memory::{ACTIVATION_BYTES, Held, HostFigures};
use super::profile::{KvCacheSize, Profile};
use super::{Plan, PlanDevice, compute_for};
use crate::geometry::{ModelGeometry, Quantization};

/// The most ranks a plan is made for (a bound on the input, far above the
/// two to four Sparks a model is split over).
pub const MAX_RANKS: usize = 64;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ParallelError {
    #[error("--tensor-parallel-size {world} must be between 1 and {MAX_RANKS}")]
    WorldSize { world: usize },
    #[error(
        "{what} = {size} does not split over {world} ranks: tensor parallelism needs it to be a multiple of --tensor-parallel-size"
    )]
    NotDivisible {
        what: &'static str,
        size: usize,
        world: usize,
    },
    #[error(
        "num_kv_heads = {kv_heads} does not split over {world} ranks: either must be a multiple of the other"
    )]
    KvHeads { kv_heads: usize, world: usize },
    #[error(
        "num_experts = {experts} is fewer than the {world} ranks: expert parallelism gives every rank at least one expert"
    )]
    TooFewExperts { experts: usize, world: usize },
    #[error(
        "splitting {what} over {world} ranks leaves {width} columns a rank, not a multiple of {format}'s group of {group}: choose another --tensor-parallel-size"
    )]
    QuantizationGroup {
        what: &'static str,
        width: usize,
        world: usize,
        format: &'static str,
        group: usize,
    },
    #[error(
        "{given} node host roots were given for --tensor-parallel-size {world}: give one per rank, or none"
    )]
    NodeCount { given: usize, world: usize },
}

/// What one rank holds: its slice of every split dimension.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RankShare {
    pub rank: usize,
    pub world: usize,
    pub attention_heads: usize,
    pub kv_heads: usize,
    /// Ranks holding each of this rank's KV heads: 1, or
    /// `world / num_kv_heads` when there are fewer KV heads than ranks.
    pub kv_head_copies: usize,
    /// The dense MLPs' intermediate columns (0 without dense layers) and
    /// the shared expert's.
    pub intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    /// Gated DeltaNet heads.
    pub linear_key_heads: usize,
    pub linear_value_heads: usize,
    /// The routed experts `first_expert .. first_expert + experts`.
    pub first_expert: usize,
    pub experts: usize,
    /// The embedding's and lm_head's rows `first_vocab_row .. + vocab_rows`.
    pub first_vocab_row: usize,
    pub vocab_rows: usize,
}

impl RankShare {
    /// The geometry this rank computes with: its heads and widths; the
    /// experts and the vocabulary stay whole (the router scores every
    /// expert, the logits are gathered whole): what it holds of those two is
    /// [`RankShare::held`].
    pub fn geometry(&self, g: &ModelGeometry) -> ModelGeometry {
        ModelGeometry {
            num_attention_heads: self.attention_heads,
            num_kv_heads: self.kv_heads,
            intermediate_size: self.intermediate_size,
            shared_expert_intermediate_size: self.shared_expert_intermediate_size,
            linear_num_key_heads: self.linear_key_heads,
            linear_num_value_heads: self.linear_value_heads,
            ..g.clone()
        }
    }

    /// The expert and vocabulary rows this rank holds.
    pub fn held(&self) -> Held {
        Held {
            experts: self.experts as u64,
            vocab_rows: self.vocab_rows as u64,
        }
    }
}

/// Refuses a rank count outside `1..=MAX_RANKS` before anything is sized by it.
pub fn check_world(world: usize) -> Result<(), ParallelError> {
    if world == 0 || world > MAX_RANKS {
        return Err(ParallelError::WorldSize { world });
    }
    Ok(())
}

/// The share of every rank of `world` in `g`, or why `g` does not split so.
pub fn shares(g: &ModelGeometry, world: usize) -> Result<Vec<RankShare>, ParallelError> {
    check_world(world)?;
    let split = |what: &'static str, size: usize| {
        if size.is_multiple_of(world) {
            Ok(size / world)
        } else {
            Err(ParallelError::NotDivisible { what, size, world })
        }
    };
    let attention_heads = split("num_attention_heads", g.num_attention_heads)?;
    let (kv_heads, kv_head_copies) = if g.num_kv_heads.is_multiple_of(world) {
        (g.num_kv_heads / world, 1)
    } else if g.num_kv_heads > 0 && world.is_multiple_of(g.num_kv_heads) {
        (1, world / g.num_kv_heads)
    } else {
        return Err(ParallelError::KvHeads {
            kv_heads: g.num_kv_heads,
            world,
        });
    };
    // `intermediate_size` is only read where a layer has a dense MLP.
    let dense_layers = g.num_moe_layers() < g.num_layers;
    let intermediate_size = if dense_layers {
        split("intermediate_size", g.intermediate_size)?
    } else {
        0
    };
    let shared = split(
        "shared_expert_intermediate_size",
        g.shared_expert_intermediate_size,
    )?;
    let linear_key_heads = split("linear_num_key_heads", g.linear_num_key_heads)?;
    let linear_value_heads = split("linear_num_value_heads", g.linear_num_value_heads)?;
    if g.num_experts > 0 && g.num_experts < world {
        return Err(ParallelError::TooFewExperts {
            experts: g.num_experts,
            world,
        });
    }
    check_groups(
        g,
        world,
        attention_heads,
        intermediate_size,
        shared,
        linear_value_heads,
    )?;
    let vocab_per_rank = g.vocab_size.div_ceil(world);
    // The first `num_experts % world` ranks hold one expert more (vLLM's
    // linear expert map).
    let (base, extra) = (g.num_experts / world, g.num_experts % world);
    Ok((0..world)
        .map(|rank| {
            let first_expert = rank * base + rank.min(extra);
            let first_vocab_row = (rank * vocab_per_rank).min(g.vocab_size);
            RankShare {
                rank,
                world,
                attention_heads,
                kv_heads,
                kv_head_copies,
                intermediate_size,
                shared_expert_intermediate_size: shared,
                linear_key_heads,
                linear_value_heads,
                first_expert,
                experts: base + usize::from(rank < extra),
                first_vocab_row,
                vocab_rows: vocab_per_rank.min(g.vocab_size - first_vocab_row),
            }
        })
        .collect())
}

/// The row-parallel projections (o_proj, the MLPs' down_proj, Gated
/// DeltaNet's out_proj) split their input columns: each rank's slice must be
/// whole scale groups of the projection's format, so no group's scale is
/// shared between ranks.
fn check_groups(
    g: &ModelGeometry,
    world: usize,
    heads: usize,
    intermediate: usize,
    shared: usize,
    linear_value_heads: usize,
) -> Result<(), ParallelError> {
    let dense = match g.quantization {
        // gpt-oss's MXFP4 covers only its experts, which are not split.
        Quantization::Mxfp4 => Quantization::Bf16,
        format => format,
    };
    let inputs = [
        (
            "o_proj's input",
            heads * g.head_dim,
            g.attention_quantization,
        ),
        (
            "Gated DeltaNet out_proj's input",
            linear_value_heads * g.linear_value_head_dim,
            g.attention_quantization,
        ),
        ("the dense MLP's down_proj input", intermediate, dense),
        ("the shared expert's down_proj input", shared, dense),
    ];
    for (what, width, format) in inputs {
        let group = input_group(format, g.quant_group_size);
        if width % group != 0 {
            return Err(ParallelError::QuantizationGroup {
                what,
                width,
                world,
                format: format.name(),
                group,
            });
        }
    }
    Ok(())
}

/// Input columns per scale of `format` (1 where there is no group).
fn input_group(format: Quantization, int4_group: usize) -> usize {
    match format {
        Quantization::Fp8Block => crate::formats::FP8_BLOCK,
        Quantization::Int4 => int4_group.max(format.group_size()),
        other => other.group_size(),
    }
}

/// A node one rank runs on: a name for messages and its host figures.
#[derive(Clone, Debug)]
pub struct NodeHost {
    pub name: String,
    pub figures: HostFigures,
}

/// One rank's share and its plan against its node.
#[derive(Clone, Debug, Serialize)]
pub struct RankPlan {
    pub node: String,
    pub share: RankShare,
    pub plan: Plan,
}

/// The plans of every rank: the model is served only if every one fits.
#[derive(Clone, Debug, Serialize)]
pub struct ParallelPlan {
    pub tensor_parallel_size: usize,
    pub fits: bool,
    /// KV tokens every rank holds (the fewest of the ranks' own figures).
    pub kv_tokens: u64,
    pub ranks: Vec<RankPlan>,
    pub collectives: CollectiveTraffic,
    pub gb10_decode: DecodeBound,
}

impl ParallelPlan {
    /// The first rank that does not fit, if any.
    pub fn first_short(&self) -> Option<&RankPlan> {
        self.ranks.iter().find(|r| !r.plan.fits)
    }
}

/// Plans every rank of `nodes.len()` (one node per rank) for `profile`,
/// from the geometry (checkpoint headers are summed per process, not per
/// rank, so rank weights are estimated).
pub fn plan_ranks(
    profile: &Profile,
    nodes: &[NodeHost],
    device: PlanDevice,
) -> Result<ParallelPlan, ParallelError> {
    let served = profile.served_geometry();
    let world = nodes.len();
    let shares = shares(&served, world)?;
    let plan_all = |profile: &Profile| -> Vec<RankPlan> {
        shares
            .iter()
            .zip(nodes)
            .map(|(share, node)| RankPlan {
                node: node.name.clone(),
                share: share.clone(),
                plan: compute_for(
                    profile,
                    &share.geometry(&served),
                    share.held(),
                    &node.figures,
                    None,
                    device,
                ),
            })
            .collect()
    };
    let mut ranks = plan_all(profile);
    let fewest = ranks
        .iter()
        .map(|r| r.plan.kv_cache.tokens)
        .min()
        .unwrap_or(0);
    let every_rank_fits = ranks.iter().all(|r| r.plan.fits);
    if every_rank_fits && ranks.iter().any(|r| r.plan.kv_cache.tokens != fewest) {
        // Every rank's bytes per token are the same (its KV heads are), so
        // buying the fewest tokens on each is one explicit size for all.
        let mut even = profile.clone();
        even.serving.kv_cache = KvCacheSize::Bytes(fewest * ranks[0].plan.kv_cache.bytes_per_token);
        ranks = plan_all(&even);
    }
    let collectives = CollectiveTraffic::of(&served, world);
    let gb10_decode = DecodeBound::gb10(&ranks, &collectives);
    Ok(ParallelPlan {
        tensor_parallel_size: world,
        fits: ranks.iter().all(|r| r.plan.fits),
        kv_tokens: fewest,
        ranks,
        collectives,
        gb10_decode,
    })
}

/// Link figures the on-paper decode bound assumes: the NCCL all-gather a
/// user measured between two Sparks' ConnectX-7 ports (~20 GB/s, quoted in
/// the two-Sparks issue; not measured here), and 10 µs for one step of a collective (RoCE's few
/// microseconds one way plus the library's own; an assumption, not a
/// measurement).
pub const LINK_BYTES_PER_SECOND: f64 = 20e9;
pub const COLLECTIVE_STEP_SECONDS: f64 = 10e-6;

/// What the collectives move per decoded token of one sequence, and the
/// decode rate they alone allow on [`LINK_BYTES_PER_SECOND`] and
/// [`COLLECTIVE_STEP_SECONDS`]: one all-reduce of the hidden state after
/// the vocabulary-parallel embedding, two per layer (after attention or the
/// delta rule, after the MLP or experts) and one all-gather of the logits,
/// all of f32 activations (vLLM moves bf16: half the bytes), each ring-shaped (an all-reduce sends
/// `2(N−1)/N` of its buffer in `2(N−1)` steps, an all-gather `(N−1)/N` in
/// `N−1`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CollectiveTraffic {
    pub all_reduces_per_token: u64,
    pub all_reduce_bytes: u64,
    pub all_gather_bytes: u64,
    /// Bytes each rank sends per token.
    pub sent_bytes_per_token: u64,
    /// Ring steps per token, each paying the link latency.
    pub steps_per_token: u64,
    pub seconds_per_token: f64,
    /// `1 / seconds_per_token`; none for one rank, which sends nothing.
    pub tokens_per_second_bound: Option<f64>,
}

impl CollectiveTraffic {
    pub fn of(g: &ModelGeometry, world: usize) -> CollectiveTraffic {
        let n = world as u64;
        let layers = (g.num_layers + g.mtp_layers) as u64;
        let all_reduces = if n > 1 { 2 * layers + 1 } else { 0 };
        let all_reduce_bytes = g.hidden_size as u64 * ACTIVATION_BYTES;
        let all_gather_bytes = g.vocab_size as u64 * ACTIVATION_BYTES;
        let (sent, steps) = if n > 1 {
            (
                all_reduces * 2 * (n - 1) * all_reduce_bytes / n + (n - 1) * all_gather_bytes / n,
                all_reduces * 2 * (n - 1) + (n - 1),
            )
        } else {
            (0, 0)
        };
        let seconds = sent as f64 / LINK_BYTES_PER_SECOND + steps as f64 * COLLECTIVE_STEP_SECONDS;
        CollectiveTraffic {
            all_reduces_per_token: all_reduces,
            all_reduce_bytes,
            all_gather_bytes,
            sent_bytes_per_token: sent,
            steps_per_token: steps,
            seconds_per_token: seconds,
            tokens_per_second_bound: (seconds > 0.0).then(|| 1.0 / seconds),
        }
    }
}

/// Batch-1 decode on GB10 nodes, on paper: each token reads every rank's
/// weights at once ([`super::decode_weight_bytes_per_token`] of its plan:
/// its share of the dense weights and, in expectation, `top_k × held /
/// num_experts` experts), so the most any rank reads at the GB10's
/// bandwidth, then waits for the collectives (eager: no overlap assumed).
/// Optimistic: a token's experts fall unevenly, and the rank that gets more
/// of them sets the pace (top-8 over 2 ranks: ≈ 5.1 on the busier, not 4).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecodeBound {
    pub bandwidth_bytes_per_second: f64,
    /// The most weight bytes any rank reads per token.
    pub weight_bytes_per_token: u64,
    pub weight_seconds: f64,
    pub collective_seconds: f64,
    pub tokens_per_second: f64,
}

impl DecodeBound {
    fn gb10(ranks: &[RankPlan], collectives: &CollectiveTraffic) -> DecodeBound {
        let bandwidth = super::perf::device_peaks("GB10").map_or(0.0, |p| p.bandwidth_bytes_s);
        let bytes = ranks
            .iter()
            .map(|r| super::decode_weight_bytes_per_token(&r.plan))
            .max()
            .unwrap_or(0);
        let weight_seconds = if bandwidth > 0.0 {
            bytes as f64 / bandwidth
        } else {
            0.0
        };
        let seconds = weight_seconds + collectives.seconds_per_token;
        DecodeBound {
            bandwidth_bytes_per_second: bandwidth,
            weight_bytes_per_token: bytes,
            weight_seconds,
            collective_seconds: collectives.seconds_per_token,
            tokens_per_second: if seconds > 0.0 { 1.0 / seconds } else { 0.0 },
        }
    }
}
