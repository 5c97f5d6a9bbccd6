//! Reading `GET /v1/memory` ([`MemoryReport`], shape in [`crate::wire`]):
//! parse, refuse impossible figures, and the sums the panels draw.

use thiserror::Error;

use crate::wire::{Category, LedgerEntry, MemoryReport};

#[derive(Debug, Error)]
pub enum MemoryParseError {
    #[error("/v1/memory is not the expected JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("/v1/memory: kv.blocks_used ({used}) exceeds kv.blocks_total ({total})")]
    KvOverfull { used: u64, total: u64 },
    #[error("/v1/memory: host.mem_available ({available}) exceeds host.mem_total ({total})")]
    AvailableAboveTotal { available: u64, total: u64 },
}

impl MemoryReport {
    /// Parses and checks the answer. Sizes must be non-negative integers;
    /// a missing field, a wrong type or an impossible figure is an error.
    pub fn parse(body: &str) -> Result<MemoryReport, MemoryParseError> {
        let memory: MemoryReport = serde_json::from_str(body)?;
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
