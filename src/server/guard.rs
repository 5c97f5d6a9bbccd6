//! The memory guard: reads MemAvailable and the server's own cgroup on a
//! short interval and stops admitting work when either is within a safety
//! margin of its line (MemAvailable below `eviction_hard + safety_margin`;
//! the cgroup's use above `memory.max − safety_margin`), until it is back a
//! further margin clear of it. A host it cannot read trips it too: it
//! fails closed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::hidden_footprint::{BufferMemory, HiddenFootprint};
use crate::host::cgroup::{self, OwnCgroup};
use crate::host::{self, MemInfo};
use crate::plan::ledger::Ledger;
use crate::plan::memory::guard_threshold;
pub use sparkrt_wire::GuardState;

#[derive(Debug)]
pub struct MemoryGuard {
    root: PathBuf,
    /// Trip below this MemAvailable.
    pub threshold_bytes: u64,
    /// Resume at or above this MemAvailable.
    pub resume_bytes: u64,
    /// Kept below the cgroup's `memory.max` (twice that to resume).
    pub safety_margin: u64,
    tripped: AtomicBool,
    latest: Mutex<Option<MemInfo>>,
    detail: Mutex<Detail>,
    /// The ledger whose buffers the host's figures may not show, and where
    /// they live (`hidden_footprint`); none until the backend is loaded.
    accounting: Mutex<Option<(Arc<Ledger>, BufferMemory)>>,
}

/// What the last reading found, for `/v1/memory`.
#[derive(Debug, Default)]
struct Detail {
    reason: Option<String>,
    cgroup: Option<OwnCgroup>,
}

impl MemoryGuard {
    /// Trips below `eviction_hard + safety_margin`; resumes one more
    /// `safety_margin` above that, so it does not flap.
    pub fn new(root: PathBuf, eviction_hard: u64, safety_margin: u64) -> Arc<MemoryGuard> {
        let threshold = guard_threshold(eviction_hard, safety_margin);
        Arc::new(MemoryGuard {
            root,
            threshold_bytes: threshold,
            resume_bytes: threshold + safety_margin,
            safety_margin,
            tripped: AtomicBool::new(false),
            latest: Mutex::new(None),
            detail: Mutex::new(Detail::default()),
            accounting: Mutex::new(None),
        })
    }

    /// From now on, adds back what `ledger`'s buffers hide from MemAvailable
    /// and the cgroup (see `hidden_footprint`).
    pub fn account_for(&self, ledger: Arc<Ledger>, memory: BufferMemory) {
        if let Ok(mut accounting) = self.accounting.lock() {
            *accounting = Some((ledger, memory));
        }
    }

    fn hidden(&self) -> HiddenFootprint {
        self.accounting
            .lock()
            .ok()
            .and_then(|a| {
                a.as_ref()
                    .map(|(ledger, memory)| HiddenFootprint::of(&ledger.snapshot(), *memory))
            })
            .unwrap_or_default()
    }

    pub fn tripped(&self) -> bool {
        self.tripped.load(Ordering::Acquire)
    }

    pub fn state(&self) -> GuardState {
        let (reason, cgroup) = self
            .detail
            .lock()
            .map(|d| (d.reason.clone(), d.cgroup.clone()))
            .unwrap_or_default();
        let hidden = self.hidden();
        GuardState {
            tripped: self.tripped(),
            threshold_bytes: self.threshold_bytes,
            resume_bytes: self.resume_bytes,
            reason,
            cgroup_in_use: cgroup.as_ref().map(OwnCgroup::in_use),
            cgroup_max: cgroup.and_then(|c| c.memory.max),
            pinned_weights_bytes: hidden.pinned_weights,
            driver_allocations_bytes: hidden.driver_allocations,
        }
    }

    pub fn latest(&self) -> Option<MemInfo> {
        self.latest.lock().ok().and_then(|m| *m)
    }

    /// One reading: updates the latest figures and the tripped state.
    pub fn check(&self) {
        let was = self.tripped();
        let hidden = self.hidden();
        let mut reasons = Vec::new();
        match host::read_meminfo(&self.root) {
            Ok(info) => {
                let line = if was {
                    self.resume_bytes
                } else {
                    self.threshold_bytes
                };
                let available = hidden.available(&info);
                if available < line {
                    let pinned = if available == info.mem_available {
                        String::new()
                    } else {
                        format!(
                            " (less {} of registered weights it counts as reclaimable)",
                            info.mem_available - available
                        )
                    };
                    reasons.push(format!(
                        "MemAvailable {}{pinned} is below {line}",
                        info.mem_available
                    ));
                }
                if let Ok(mut latest) = self.latest.lock() {
                    *latest = Some(info);
                }
            }
            Err(e) => reasons.push(format!("cannot read the host's memory: {e}")),
        }
        let own = match cgroup::read_own(&self.root) {
            Ok(own) => own,
            Err(e) => {
                reasons.push(format!("cannot read this process's cgroup: {e}"));
                None
            }
        };
        if let Some(own) = &own
            && let Some(max) = own.memory.max
        {
            let margin = if was {
                2 * self.safety_margin
            } else {
                self.safety_margin
            };
            // The driver's allocations from the host pool are not charged
            // to the cgroup: count them from the ledger, so the footprint
            // stays within the limit the pod was scheduled by.
            let in_use = own.in_use().saturating_add(hidden.driver_allocations);
            if in_use.saturating_add(margin) > max {
                let driver = if hidden.driver_allocations > 0 {
                    format!(
                        " ({} of it GPU driver allocations outside the cgroup)",
                        hidden.driver_allocations
                    )
                } else {
                    String::new()
                };
                reasons.push(format!(
                    "cgroup {} uses {in_use}{driver} of its memory.max {max} (margin {margin})",
                    own.memory.path.display()
                ));
            }
        }
        let now = !reasons.is_empty();
        let reason = now.then(|| reasons.join("; "));
        if now != was {
            match &reason {
                Some(why) => tracing::warn!("memory guard tripped, refusing new requests: {why}"),
                None => tracing::info!("memory guard cleared"),
            }
        }
        self.tripped.store(now, Ordering::Release);
        if let Ok(mut detail) = self.detail.lock() {
            *detail = Detail {
                reason,
                cgroup: own,
            };
        }
    }

    /// Checks every `interval` until `stop` is set.
    pub fn spawn(
        self: &Arc<Self>,
        interval: Duration,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        let guard = Arc::clone(self);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                guard.check();
                std::thread::sleep(interval);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal: 16777216 kB\nMemFree: 8000000 kB\nMemAvailable: 12000000 kB\n\
        Buffers: 0 kB\nCached: 0 kB\nShmem: 0 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n";

    fn host(meminfo: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("proc/self")).unwrap();
        std::fs::write(root.path().join("proc/meminfo"), meminfo).unwrap();
        root
    }

    #[test]
    fn unreadable_or_garbage_meminfo_trips_with_a_reason() {
        let root = host(MEMINFO);
        let guard = MemoryGuard::new(root.path().to_path_buf(), 1 << 30, 1 << 29);
        guard.check();
        assert!(!guard.tripped());
        assert_eq!(guard.state().reason, None);
        std::fs::write(root.path().join("proc/meminfo"), "MemTotal: lots\n").unwrap();
        guard.check();
        let state = guard.state();
        assert!(state.tripped);
        assert!(state.reason.unwrap().contains("meminfo"));
        std::fs::remove_file(root.path().join("proc/meminfo")).unwrap();
        guard.check();
        assert!(guard.tripped());
        std::fs::write(root.path().join("proc/meminfo"), MEMINFO).unwrap();
        guard.check();
        assert!(!guard.tripped());
    }

    #[test]
    fn registered_weights_and_driver_allocations_are_counted_on_an_integrated_gpu() {
        use crate::plan::ledger::{Category, WeightsResidency};
        // MemAvailable 12000000 kB ≈ 11.44 GiB still counts 4 GiB of
        // registered weights as reclaimable page cache.
        let root = host(MEMINFO);
        std::fs::write(root.path().join("proc/self/cgroup"), "0::/pod\n").unwrap();
        let dir = root.path().join("sys/fs/cgroup/pod");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.max"), format!("{}\n", 16u64 << 30)).unwrap();
        std::fs::write(dir.join("memory.current"), format!("{}\n", 1u64 << 30)).unwrap();
        let gib = 1u64 << 30;
        let ledger = Arc::new(Ledger::with_budgets([4 * gib, 0, 0, 6 * gib, 0, 0]));
        let _weights = ledger
            .charge(Category::Weights, 4 * gib, "weights")
            .unwrap();
        let _kv = ledger.charge(Category::KvCache, 6 * gib, "kv").unwrap();
        ledger.set_weights_residency(WeightsResidency::HostRegistered);
        // Line 8 GiB: 11.44 GiB clears it, 11.44 − 4 does not.
        let guard = MemoryGuard::new(root.path().to_path_buf(), 7 * gib, gib);
        guard.check();
        assert!(!guard.tripped(), "{:?}", guard.state().reason);
        guard.account_for(Arc::clone(&ledger), BufferMemory::DiscreteGpu);
        guard.check();
        assert!(!guard.tripped(), "a discrete GPU hides nothing");
        guard.account_for(Arc::clone(&ledger), BufferMemory::IntegratedGpu);
        guard.check();
        let reason = guard.state().reason.unwrap_or_default();
        assert!(guard.tripped());
        assert!(
            reason.contains(&format!("less {} of registered weights", 4 * gib)),
            "{reason}"
        );
        // The kernel reporting them unevictable (so MemAvailable already
        // left them out) clears it; the cgroup then sees 1 GiB + the 6 GiB
        // of KV the driver allocated, within 16 GiB less the margin.
        std::fs::write(
            root.path().join("proc/meminfo"),
            format!("{MEMINFO}Unevictable: {} kB\n", 4 << 20),
        )
        .unwrap();
        guard.check();
        guard.check();
        assert!(!guard.tripped(), "{:?}", guard.state().reason);
        std::fs::write(dir.join("memory.max"), format!("{}\n", 15u64 << 29)).unwrap();
        guard.check();
        let reason = guard.state().reason.unwrap_or_default();
        assert!(
            reason.contains(&format!("{} of it GPU driver allocations", 6 * gib)),
            "{reason}"
        );
    }

    #[test]
    fn the_own_cgroup_near_its_max_trips() {
        let root = host(MEMINFO);
        std::fs::write(root.path().join("proc/self/cgroup"), "0::/pod\n").unwrap();
        let dir = root.path().join("sys/fs/cgroup/pod");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.max"), "10000\n").unwrap();
        std::fs::write(dir.join("memory.current"), "9000\n").unwrap();
        let guard = MemoryGuard::new(root.path().to_path_buf(), 0, 2000);
        guard.check();
        let state = guard.state();
        assert!(state.tripped);
        assert_eq!(state.cgroup_in_use, Some(9000));
        assert_eq!(state.cgroup_max, Some(10000));
        assert!(state.reason.unwrap().contains("memory.max"));
        // Hysteresis: 7000 + 2 margins is still above the max.
        std::fs::write(dir.join("memory.current"), "7000\n").unwrap();
        guard.check();
        assert!(guard.tripped());
        std::fs::write(dir.join("memory.current"), "6000\n").unwrap();
        guard.check();
        assert!(!guard.tripped());
    }
}
