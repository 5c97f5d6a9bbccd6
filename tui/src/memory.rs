//! Reading `GET /v1/memory` ([`MemoryReport`], shape in [`sparkrt_wire`]):
//! parse, and refuse impossible figures.

use sparkrt_wire::MemoryReport;
use thiserror::Error;

/// `/v1/memory` as the monitor keeps it: the plan as untyped JSON, since the
/// monitor does not read into it (and knows nothing of the root crate's
/// `Plan`).
pub type ServerMemory = MemoryReport<serde_json::Value>;

#[derive(Debug, Error)]
pub enum MemoryParseError {
    #[error("/v1/memory is not the expected JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("/v1/memory: kv.blocks_used ({used}) exceeds kv.blocks_total ({total})")]
    KvOverfull { used: u64, total: u64 },
    #[error("/v1/memory: host.mem_available ({available}) exceeds host.mem_total ({total})")]
    AvailableAboveTotal { available: u64, total: u64 },
}

/// Parses and checks the answer. Sizes must be non-negative integers; a
/// missing field, a wrong type or an impossible figure is an error.
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
