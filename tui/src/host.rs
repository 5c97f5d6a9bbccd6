//! Host readings the monitor draws ([`HostSnapshot`], defined with the wire
//! types because `/v1/memory` sends the same figures), and the trait the
//! root crate implements to supply them (it owns the host probe and the plan
//! formulas).

pub use crate::wire::{GpuProcess, HostSnapshot};

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

/// Where the monitor gets host readings. Called from the collector thread
/// once per interval; an `Err` is shown on screen and the monitor goes on.
pub trait HostSource: Send {
    fn read(&mut self) -> Result<HostSnapshot, String>;
}
