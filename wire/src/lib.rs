//! The JSON sparkrt's processes exchange, defined once: the server (root
//! crate) builds these structs and serializes them, the monitor (`tui/`)
//! deserializes them, and the ledger and the memory guard use the same
//! categories and states. Shapes in docs/ARCHITECTURE.md, "Contracts".
//!
//! - `GET /v1/memory`: [`MemoryReport`] (plan, ledger, KV fill, host, guard).
//! - `GET /v1/stats`: [`ServingStats`] (the serving gauges and counters that
//!   `/metrics` also gives Prometheus).
//! - `GET /health`: [`HealthReport`] (with the start-up's [`LoadingReport`]).
//! - `sparkrt probe` with [`PROBE_SNAPSHOT_ARGS`]: one [`HostSnapshot`], the
//!   monitor's host reading (the monitor runs it each interval).
//!
//! Sizes are integers in bytes. Every field is required on reading: an
//! answer missing one (a server of another version) is refused, not guessed
//! at. Fields the reader does not know are ignored, so adding one is safe.
//!
//! This crate depends on serde alone, so that the server links no terminal
//! code and the monitor no server code. [`units`] is here for the same
//! reason: how byte figures print is shared by the server's CLI and the
//! monitor.

pub mod units;

use serde::{Deserialize, Serialize};

pub const MEMORY_PATH: &str = "/v1/memory";
pub const STATS_PATH: &str = "/v1/stats";
pub const HEALTH_PATH: &str = "/health";

/// The arguments after the `sparkrt` binary that print one [`HostSnapshot`]
/// as JSON on stdout, `usable` filled from the plan's headroom formula
/// (followed by `--host-root DIR`, `--kubelet-config FILE`, `--profile P` as
/// needed).
pub const PROBE_SNAPSHOT_ARGS: [&str; 3] = ["probe", "--json", "--snapshot"];

/// Most draft tokens a step may carry per sequence (speculative decoding):
/// each is a verify row of every layer and a logits row, so the plan's step
/// buffers grow with it; [`ServingStats`] counts kept drafts per position
/// up to it.
pub const MAX_SPECULATIVE_TOKENS: usize = 8;

/// The plan's memory categories: every byte the runtime owns is charged to
/// one of them. [`Category::ALL`] is the contract's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Weights,
    MoeWorkspace,
    Activations,
    KvCache,
    /// The Gated DeltaNet layers' recurrent-state pool (live slots and the
    /// prefix cache's snapshots).
    RecurrentState,
    RuntimeOverhead,
}

impl Category {
    pub const ALL: [Category; 6] = [
        Category::Weights,
        Category::MoeWorkspace,
        Category::Activations,
        Category::KvCache,
        Category::RecurrentState,
        Category::RuntimeOverhead,
    ];

    /// The name on the wire (a test checks it is serde's).
    pub fn name(self) -> &'static str {
        match self {
            Category::Weights => "weights",
            Category::MoeWorkspace => "moe_workspace",
            Category::Activations => "activations",
            Category::KvCache => "kv_cache",
            Category::RecurrentState => "recurrent_state",
            Category::RuntimeOverhead => "runtime_overhead",
        }
    }
}

/// What the kernel's page cache was told to do with the checkpoint's pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PageCachePolicy {
    /// Left to the kernel (pages come in on first touch).
    #[default]
    Keep,
    /// Read ahead with `madvise(MADV_WILLNEED)`.
    WillNeed,
    /// Dropped with `posix_fadvise(POSIX_FADV_DONTNEED)`.
    DontNeed,
}

impl PageCachePolicy {
    /// The name on the wire (a test checks it is serde's).
    pub fn name(self) -> &'static str {
        match self {
            PageCachePolicy::Keep => "keep",
            PageCachePolicy::WillNeed => "willneed",
            PageCachePolicy::DontNeed => "dontneed",
        }
    }
}

/// Where the weights live; `mapped` weights are page cache, not private memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightsResidency {
    /// Read in place from the memory map (CPU backend).
    Mapped,
    /// The mapping registered with the GPU and read in place (unified memory).
    HostRegistered,
    /// Copied once to device memory, page cache released.
    DeviceCopy,
}

/// The answer of `GET /v1/memory`.
///
/// `P` is the plan: the server sends its `Plan` (what `sparkrt plan --json`
/// prints); the monitor keeps it as untyped JSON (`serde_json::Value`) and
/// does not read into it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryReport<P> {
    #[serde(default)]
    pub plan: P,
    pub ledger: Ledger,
    pub kv: KvState,
    pub host: HostSnapshot,
    pub guard: GuardState,
    /// Resident set of the server process.
    pub process_rss: u64,
    /// The weights' load and, once loaded, how much of them the page cache
    /// still holds (absent from older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loading: Option<LoadingReport>,
}

impl<P> MemoryReport<P> {
    /// The ledger row of `category`, if the server reports one.
    pub fn category(&self, category: Category) -> Option<&LedgerEntry> {
        self.ledger
            .categories
            .iter()
            .find(|c| c.name == category.name())
    }

    /// Everything the runtime holds now, all categories together.
    pub fn runtime_allocated(&self) -> u64 {
        self.ledger
            .categories
            .iter()
            .fold(0u64, |sum, c| sum.saturating_add(c.allocated))
    }

    /// Bytes of KV blocks in use (`blocks_used × block_bytes`).
    pub fn kv_used_bytes(&self) -> u64 {
        self.kv.blocks_used.saturating_mul(self.kv.block_bytes)
    }
}

/// Where start-up is in bringing the weights in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadPhase {
    /// Planning and mapping the checkpoint (headers only).
    Mapping,
    /// Reading every weight page into the page cache.
    Reading,
    /// Copying the weights to the device or registering them with it (CUDA).
    Device,
    /// Building the model and allocating the plan's buffers.
    Allocating,
    /// Loaded; `resident_bytes` keeps being measured.
    Ready,
    /// Start-up failed or was stopped (`error` says why).
    Failed,
}

impl LoadPhase {
    /// Every phase, in start-up order (`Failed` last).
    pub const ALL: [LoadPhase; 6] = [
        LoadPhase::Mapping,
        LoadPhase::Reading,
        LoadPhase::Device,
        LoadPhase::Allocating,
        LoadPhase::Ready,
        LoadPhase::Failed,
    ];

    /// The name on the wire (a test checks it is serde's).
    pub fn name(self) -> &'static str {
        match self {
            LoadPhase::Mapping => "mapping",
            LoadPhase::Reading => "reading",
            LoadPhase::Device => "device",
            LoadPhase::Allocating => "allocating",
            LoadPhase::Ready => "ready",
            LoadPhase::Failed => "failed",
        }
    }
}

/// The `loading` section of `/v1/memory` and `/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadingReport {
    pub phase: LoadPhase,
    /// Bytes the current phase has done (read into the page cache, or
    /// copied to the device) of `total_bytes`.
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Bytes of the checkpoint's mapping the page cache holds, measured
    /// (`mincore`, sampled at most once a second), of `mapped_bytes`.
    pub resident_bytes: u64,
    pub mapped_bytes: u64,
    /// The current phase's mean rate so far.
    pub bytes_per_second: f64,
    /// Since start-up began.
    pub elapsed_seconds: f64,
    /// Until the current phase ends, at its mean rate (absent before a rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl LoadingReport {
    /// The weights' resident fraction (1 when nothing is mapped).
    pub fn resident_fraction(&self) -> f64 {
        if self.mapped_bytes == 0 {
            1.0
        } else {
            self.resident_bytes as f64 / self.mapped_bytes as f64
        }
    }

    /// The current phase's fraction done.
    pub fn done_fraction(&self) -> f64 {
        if self.total_bytes == 0 {
            0.0
        } else {
            (self.done_bytes as f64 / self.total_bytes as f64).min(1.0)
        }
    }

    /// One line for `/ready` and the monitor, e.g. `loading weights: 37%
    /// (3.8 of 10.2 GB, 2.1 GB/s)`.
    pub fn reason(&self) -> String {
        const GB: f64 = 1e9;
        let what = match self.phase {
            LoadPhase::Mapping => return "planning and mapping the checkpoint".to_string(),
            LoadPhase::Allocating => return "allocating the plan's buffers".to_string(),
            LoadPhase::Ready => return "loaded".to_string(),
            LoadPhase::Failed => {
                return format!(
                    "start-up failed: {}",
                    self.error.as_deref().unwrap_or("(no reason)")
                );
            }
            LoadPhase::Reading => "loading weights",
            LoadPhase::Device => "copying weights to the device",
        };
        // GB as the brief's figures; MB for a checkpoint under one GB.
        let (unit, scale) = if self.total_bytes as f64 >= GB {
            ("GB", GB)
        } else {
            ("MB", 1e6)
        };
        format!(
            "{what}: {:.0}% ({:.1} of {:.1} {unit}, {:.1} {unit}/s)",
            100.0 * self.done_fraction(),
            self.done_bytes as f64 / scale,
            self.total_bytes as f64 / scale,
            self.bytes_per_second / scale
        )
    }
}

/// The answer of `GET /health`: 200 while the process works (loading
/// included), 503 once the engine thread or start-up has failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthReport {
    /// `ok`, `loading` or `failed`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub loading: LoadingReport,
}

/// The live ledger: per category, what the plan set aside and what is held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    pub categories: Vec<LedgerEntry>,
    pub page_cache_policy: PageCachePolicy,
    pub weights_residency: WeightsResidency,
}

/// One ledger row. `name` is a [`Category::name`]; it stays a string so a
/// monitor can show a category added by a newer server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub name: String,
    pub planned: u64,
    pub allocated: u64,
}

/// The paged KV cache's fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvState {
    pub block_size_tokens: u64,
    pub block_bytes: u64,
    pub blocks_total: u64,
    /// Blocks sequences reference.
    pub blocks_used: u64,
    /// Unreferenced full blocks kept by the prefix cache (reclaimable);
    /// the rest, `blocks_total - blocks_used - blocks_cached`, is free.
    #[serde(default)]
    pub blocks_cached: u64,
}

/// The memory guard: it refuses new work while MemAvailable is below
/// `threshold_bytes`, until it climbs back above `resume_bytes`; also while
/// the server's own cgroup is within a safety margin of its `memory.max`,
/// and while the host cannot be read (it fails closed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardState {
    pub tripped: bool,
    pub threshold_bytes: u64,
    pub resume_bytes: u64,
    /// Why it is tripped; absent while it admits work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The server's own cgroup: what counts against its limit
    /// (`memory.current` less page cache), and the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_in_use: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_max: Option<u64>,
    /// Weights registered with the GPU driver (pinned file pages, an
    /// integrated GPU only): MemAvailable may count them as reclaimable,
    /// and the guard takes off what `Unevictable` does not already hold.
    #[serde(default)]
    pub pinned_weights_bytes: u64,
    /// Buffers the GPU driver allocates from the host pool (an integrated
    /// GPU only), from the ledger: `memory.current` misses them, and the
    /// guard adds them to `cgroup_in_use`'s check.
    #[serde(default)]
    pub driver_allocations_bytes: u64,
}

/// One reading of the host's memory, in bytes: the `host` object of
/// `/v1/memory`, and what `sparkrt probe` prints for the monitor
/// ([`PROBE_SNAPSHOT_ARGS`]).
///
/// `usable` is only in the probe's answer (the server leaves it out);
/// `gpu_processes` is never on the wire: only a monitor's host source fills
/// it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HostSnapshot {
    pub mem_total: u64,
    pub mem_available: u64,
    pub mem_free: u64,
    pub cached: u64,
    pub buffers: u64,
    pub shmem: u64,
    pub swap_total: u64,
    pub swap_free: u64,
    /// `memory.current` of the kubepods cgroup, when there is one.
    pub kubepods_current: Option<u64>,
    /// `memory.max` of the kubepods cgroup, when it is not `max`.
    pub kubepods_max: Option<u64>,
    /// kubelet `systemReserved.memory`.
    pub system_reserved: u64,
    /// kubelet `kubeReserved.memory`.
    pub kube_reserved: u64,
    /// kubelet `evictionHard["memory.available"]`, resolved to bytes: the
    /// kubelet starts evicting when MemAvailable falls below it.
    pub eviction_hard: u64,
    /// The plan's headroom (`plan::memory::Headroom::usable`) for this
    /// reading: what the plan lets the runtime hold. The pool bar draws a
    /// line this many bytes from its left end, where the runtime's
    /// categories start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usable: Option<u64>,
    /// Per-process GPU memory, where NVML reports it (empty elsewhere).
    #[serde(skip)]
    pub gpu_processes: Vec<GpuProcess>,
}

impl HostSnapshot {
    /// The eviction margin: MemAvailable minus the eviction threshold, how
    /// far the box is from the kubelet evicting pods. Negative once past the
    /// line. Live, and not the plan's headroom (that is `usable`, which also
    /// takes off the OS reserve, the safety margin and the kubelet's limit).
    pub fn eviction_margin(&self) -> i128 {
        i128::from(self.mem_available) - i128::from(self.eviction_hard)
    }

    /// Page cache as the pool bar counts it: Cached + Buffers.
    pub fn page_cache(&self) -> u64 {
        self.cached.saturating_add(self.buffers)
    }

    pub fn swap_used(&self) -> u64 {
        self.swap_total.saturating_sub(self.swap_free)
    }
}

/// GPU memory NVML attributes to one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    pub bytes: u64,
}

/// The answer of `GET /v1/stats`: the serving figures, read at one instant.
/// Counters (`*_total`, `requests`) count since the server started.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ServingStats {
    pub requests: RequestOutcomes,
    /// Sequences being served.
    pub requests_running: u64,
    /// Sequences queued.
    pub requests_waiting: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    /// Sequences preempted for KV blocks.
    pub preemptions_total: u64,
    pub kv_blocks_used: u64,
    /// Blocks holding nothing reusable (not used, not cached).
    pub kv_blocks_free: u64,
    /// Unreferenced full blocks kept by the prefix cache (reclaimable).
    #[serde(default)]
    pub kv_blocks_cached: u64,
    /// Prompt tokens looked up in the prefix cache.
    #[serde(default)]
    pub prefix_cache_queries_total: u64,
    /// Of those, tokens served from the cache.
    #[serde(default)]
    pub prefix_cache_hits_total: u64,
    /// Hybrid models: recurrent-state snapshots the prefix cache holds
    /// (each one sequence's state; the pool's size is the plan's).
    #[serde(default)]
    pub state_snapshots_cached: u64,
    /// Hybrid models: snapshots written since start (a prompt's boundary
    /// states kept for later requests).
    #[serde(default)]
    pub state_snapshots_taken_total: u64,
    /// Speculative decoding (vLLM's `spec_decode_*`): steps of a sequence
    /// that carried drafts, draft tokens verified, and of those the ones
    /// kept, in all and at each draft position (index 0: the first draft).
    #[serde(default)]
    pub spec_decode_num_drafts_total: u64,
    #[serde(default)]
    pub spec_decode_num_draft_tokens_total: u64,
    #[serde(default)]
    pub spec_decode_num_accepted_tokens_total: u64,
    #[serde(default)]
    pub spec_decode_num_accepted_tokens_per_pos: [u64; MAX_SPECULATIVE_TOKENS],
    /// Whether the memory guard refuses new work.
    pub guard_tripped: bool,
    /// Time to first token over the server's most recent requests (absent
    /// before the first token, and from older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_seconds: Option<Percentiles>,
    /// Inter-token latency over the most recent tokens (as `ttft_seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_seconds: Option<Percentiles>,
}

/// The median and the 99th percentile of a latency, in seconds, over a
/// window of recent samples (the server says how many in its README).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
}

/// Finished requests by outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestOutcomes {
    pub ok: u64,
    /// Answered 4xx or 5xx (not a capacity refusal), or failed mid-answer.
    pub error: u64,
    /// Refused for capacity before they started (429 queue full, 503
    /// memory guard or engine gone).
    pub rejected: u64,
    /// Admitted, then the client went away before the answer ended (absent
    /// from older servers: 0).
    #[serde(default)]
    pub cancelled: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serde_name(value: impl Serialize) -> String {
        serde_json::to_value(value)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }

    #[test]
    fn names_are_serdes() {
        for category in Category::ALL {
            assert_eq!(category.name(), serde_name(category));
        }
        for policy in [
            PageCachePolicy::Keep,
            PageCachePolicy::WillNeed,
            PageCachePolicy::DontNeed,
        ] {
            assert_eq!(policy.name(), serde_name(policy));
        }
        for phase in LoadPhase::ALL {
            assert_eq!(phase.name(), serde_name(phase));
        }
    }

    #[test]
    fn usable_is_on_the_wire_only_when_known() {
        // The server's `host` (usable unknown) has no such field; the probe's
        // answer carries it, and it reads back.
        let mut host = HostSnapshot {
            mem_total: 64,
            ..HostSnapshot::default()
        };
        let written = serde_json::to_value(&host).unwrap();
        assert_eq!(written.get("usable"), None, "{written}");
        host.usable = Some(48);
        let text = serde_json::to_string(&host).unwrap();
        let read: HostSnapshot = serde_json::from_str(&text).unwrap();
        assert_eq!(read, host);
    }
}
