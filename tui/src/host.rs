//! Host readings the monitor draws, and the trait the root crate implements
//! to supply them (it owns the host probe and the plan formulas).

use serde::Deserialize;

/// One reading of the host's memory, in bytes.
///
/// The fields named like the `host` object of `GET /v1/memory` have the same
/// meaning there; `usable` and `gpu_processes` come only from a
/// [`HostSource`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
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
    /// What the plan lets the runtime hold. The pool bar draws a line this
    /// many bytes from its left end, where the runtime's categories start.
    #[serde(skip)]
    pub usable: Option<u64>,
    /// Per-process GPU memory, where NVML reports it (empty elsewhere).
    #[serde(skip)]
    pub gpu_processes: Vec<GpuProcess>,
}

/// GPU memory NVML attributes to one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    pub bytes: u64,
}

impl HostSnapshot {
    /// MemAvailable minus the eviction threshold: how far the box is from
    /// the kubelet evicting pods. Negative once past the line.
    pub fn headroom(&self) -> i128 {
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
