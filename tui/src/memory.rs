//! `GET /v1/memory`: the server's plan, live ledger, KV fill, host reading and
//! guard state (shape fixed in docs/ARCHITECTURE.md, "Contracts").

use serde::Deserialize;
use thiserror::Error;

use crate::host::HostSnapshot;

/// Ledger category names, as the contract spells them.
pub mod category {
    pub const WEIGHTS: &str = "weights";
    pub const MOE_WORKSPACE: &str = "moe_workspace";
    pub const ACTIVATIONS: &str = "activations";
    pub const KV_CACHE: &str = "kv_cache";
    pub const RUNTIME_OVERHEAD: &str = "runtime_overhead";
}

/// The parsed answer of `GET /v1/memory`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ServerMemory {
    /// What `sparkrt plan --json` prints; the monitor does not read into it.
    #[serde(default)]
    pub plan: serde_json::Value,
    pub ledger: Ledger,
    pub kv: KvState,
    pub host: HostSnapshot,
    pub guard: GuardState,
    /// Resident set of the server process.
    pub process_rss: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Ledger {
    pub categories: Vec<LedgerEntry>,
    pub page_cache_policy: PageCachePolicy,
    pub weights_residency: WeightsResidency,
}

/// One ledger row: what the plan set aside and what is held now.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LedgerEntry {
    pub name: String,
    pub planned: u64,
    pub allocated: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageCachePolicy {
    Keep,
    Willneed,
    Dontneed,
}

/// Where the weights live; `mapped` weights are page cache, not private memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightsResidency {
    Mapped,
    HostRegistered,
    DeviceCopy,
}

/// The paged KV cache's fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct KvState {
    pub block_size_tokens: u64,
    pub block_bytes: u64,
    pub blocks_total: u64,
    pub blocks_used: u64,
}

/// The memory guard: it refuses new work while MemAvailable is below
/// `threshold_bytes`, until it climbs back above `resume_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct GuardState {
    pub tripped: bool,
    pub threshold_bytes: u64,
    pub resume_bytes: u64,
}

#[derive(Debug, Error)]
pub enum MemoryParseError {
    #[error("/v1/memory is not the expected JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("/v1/memory: kv.blocks_used ({used}) exceeds kv.blocks_total ({total})")]
    KvOverfull { used: u64, total: u64 },
    #[error("/v1/memory: host.mem_available ({available}) exceeds host.mem_total ({total})")]
    AvailableAboveTotal { available: u64, total: u64 },
}

impl ServerMemory {
    /// Parses and checks the answer. Sizes must be non-negative integers;
    /// a missing field, a wrong type or an impossible figure is an error.
    pub fn parse(body: &str) -> Result<ServerMemory, MemoryParseError> {
        let memory: ServerMemory = serde_json::from_str(body)?;
        if memory.kv.blocks_used > memory.kv.blocks_total {
            return Err(MemoryParseError::KvOverfull {
                used: memory.kv.blocks_used,
                total: memory.kv.blocks_total,
            });
        }
        if memory.host.mem_available > memory.host.mem_total {
            return Err(MemoryParseError::AvailableAboveTotal {
                available: memory.host.mem_available,
                total: memory.host.mem_total,
            });
        }
        Ok(memory)
    }

    /// The ledger row of `name`, if the server reports one.
    pub fn category(&self, name: &str) -> Option<&LedgerEntry> {
        self.ledger.categories.iter().find(|c| c.name == name)
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
