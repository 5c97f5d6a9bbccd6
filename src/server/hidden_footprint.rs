//! What of this process's memory the host's own figures do not show, so the
//! memory guard can add it back.
//!
//! Two blind spots, both on an integrated GPU (a GB10) only:
//! - Weights registered with the driver (`HostRegistered`) are file pages
//!   pinned for the device. They stay on the page cache's lists, so
//!   MemAvailable counts them as reclaimable; they are not. Where the kernel
//!   moved them to the unevictable list instead, MemAvailable already leaves
//!   them out, so only the part `Unevictable` cannot account for is taken
//!   off (an under-estimate by whatever else is unevictable, never a double
//!   count).
//! - Buffers the GPU driver allocates from the host pool (KV cache, MoE
//!   workspace, activations, recurrent state, a device copy of the weights)
//!   are not charged to this process's memory cgroup, so `memory.current`
//!   misses them. The ledger has every one of them, charged before it was
//!   allocated; the runtime overhead (process, context, small device
//!   tables) is left out as mostly host-side.
//!
//! On a discrete GPU device memory is not host memory, and the CPU backend's
//! buffers are ordinary process memory: nothing is hidden.

pub use crate::backend::BufferMemory;
use crate::host::MemInfo;
use crate::plan::ledger::{Category, LedgerSnapshot, WeightsResidency};

/// Bytes the host's figures miss, from one ledger snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HiddenFootprint {
    /// Registered (pinned) weight pages MemAvailable counts as reclaimable.
    pub pinned_weights: u64,
    /// Driver allocations from the host pool, outside the memory cgroup.
    pub driver_allocations: u64,
}

impl HiddenFootprint {
    pub fn of(snapshot: &LedgerSnapshot, memory: BufferMemory) -> HiddenFootprint {
        if memory != BufferMemory::IntegratedGpu {
            return HiddenFootprint::default();
        }
        let allocated = |category: Category| {
            snapshot
                .categories
                .iter()
                .find(|row| row.name == category.name())
                .map_or(0, |row| row.allocated)
        };
        let weights = allocated(Category::Weights);
        let buffers: u64 = [
            Category::MoeWorkspace,
            Category::Activations,
            Category::KvCache,
            Category::RecurrentState,
        ]
        .into_iter()
        .map(allocated)
        .sum();
        let (pinned_weights, copied_weights) = match snapshot.weights_residency {
            Some(WeightsResidency::HostRegistered) => (weights, 0),
            Some(WeightsResidency::DeviceCopy) => (0, weights),
            // Read in place from pageable memory: ordinary page cache.
            Some(WeightsResidency::Mapped) | None => (0, 0),
        };
        HiddenFootprint {
            pinned_weights,
            driver_allocations: buffers + copied_weights,
        }
    }

    /// MemAvailable less the pinned weights the kernel does not already
    /// leave out of it.
    pub fn available(&self, info: &MemInfo) -> u64 {
        let counted_as_reclaimable = self.pinned_weights.saturating_sub(info.unevictable);
        info.mem_available.saturating_sub(counted_as_reclaimable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::ledger::Ledger;

    const GIB: u64 = 1 << 30;

    fn snapshot(residency: Option<WeightsResidency>) -> LedgerSnapshot {
        let ledger = std::sync::Arc::new(Ledger::with_budgets([
            20 * GIB,
            GIB,
            GIB,
            8 * GIB,
            2 * GIB,
            GIB,
        ]));
        let charges: Vec<_> = [
            (Category::Weights, 20 * GIB),
            (Category::MoeWorkspace, GIB),
            (Category::Activations, GIB / 2),
            (Category::KvCache, 8 * GIB),
            (Category::RecurrentState, 2 * GIB),
            (Category::RuntimeOverhead, GIB),
        ]
        .into_iter()
        .map(|(c, bytes)| ledger.charge(c, bytes, "test").unwrap())
        .collect();
        if let Some(r) = residency {
            ledger.set_weights_residency(r);
        }
        let snap = ledger.snapshot();
        drop(charges);
        snap
    }

    #[test]
    fn only_an_integrated_gpu_hides_memory() {
        let snap = snapshot(Some(WeightsResidency::HostRegistered));
        for memory in [BufferMemory::Process, BufferMemory::DiscreteGpu] {
            assert_eq!(
                HiddenFootprint::of(&snap, memory),
                HiddenFootprint::default()
            );
        }
    }

    #[test]
    fn registered_weights_are_pinned_and_buffers_are_the_drivers() {
        let hidden = HiddenFootprint::of(
            &snapshot(Some(WeightsResidency::HostRegistered)),
            BufferMemory::IntegratedGpu,
        );
        // Workspace 1 + activations 0.5 + KV 8 + state 2; overhead left out.
        assert_eq!(
            hidden,
            HiddenFootprint {
                pinned_weights: 20 * GIB,
                driver_allocations: 11 * GIB + GIB / 2,
            }
        );
        let copied = HiddenFootprint::of(
            &snapshot(Some(WeightsResidency::DeviceCopy)),
            BufferMemory::IntegratedGpu,
        );
        assert_eq!(copied.pinned_weights, 0);
        assert_eq!(copied.driver_allocations, 31 * GIB + GIB / 2);
        let mapped = HiddenFootprint::of(
            &snapshot(Some(WeightsResidency::Mapped)),
            BufferMemory::IntegratedGpu,
        );
        assert_eq!(mapped.pinned_weights, 0);
    }

    #[test]
    fn pinned_pages_already_unevictable_are_not_taken_off_twice() {
        let hidden = HiddenFootprint {
            pinned_weights: 20 * GIB,
            driver_allocations: 0,
        };
        let mut info = MemInfo {
            mem_total: 120 * GIB,
            mem_available: 90 * GIB,
            ..MemInfo::default()
        };
        assert_eq!(hidden.available(&info), 70 * GIB);
        info.unevictable = 20 * GIB;
        assert_eq!(hidden.available(&info), 90 * GIB);
        info.unevictable = 5 * GIB;
        assert_eq!(hidden.available(&info), 75 * GIB);
        info.mem_available = 10 * GIB;
        assert_eq!(hidden.available(&info), 0);
    }
}
