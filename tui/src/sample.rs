//! One round of readings, as the collector sends it to the draw loop.

use std::time::Instant;

use sparkrt_wire::{HostSnapshot, LoadingReport, ServingStats};

use crate::link::ServerLink;
use crate::memory::ServerMemory;
use crate::processes::ProcessRow;

/// Everything read in one round.
#[derive(Debug, Clone)]
pub struct Sample {
    pub taken_at: Instant,
    /// The host source's reading, or why it failed.
    pub host: Result<HostSnapshot, String>,
    pub processes: Vec<ProcessRow>,
    pub link: ServerLink,
    /// `/v1/memory`, while connected.
    pub server: Option<ServerMemory>,
    /// `/v1/stats` (or why it could not be read), while connected.
    pub stats: Option<Result<ServingStats, String>>,
    pub generation_tokens_per_s: Option<f64>,
    pub prompt_tokens_per_s: Option<f64>,
    /// The server's `/health` loading section while it starts (before
    /// `/v1/memory` answers).
    pub loading: Option<LoadingReport>,
}

impl Sample {
    /// The host reading to draw: the local one, else the server's.
    pub fn host_reading(&self) -> Option<&HostSnapshot> {
        self.host
            .as_ref()
            .ok()
            .or_else(|| self.server.as_ref().map(|s| &s.host))
    }

    pub fn serving(&self) -> Option<&ServingStats> {
        self.stats.as_ref().and_then(|m| m.as_ref().ok())
    }
}
