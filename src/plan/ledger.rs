//! The live ledger: every buffer the runtime owns is charged to one of the
//! plan's categories, and a charge the plan did not foresee is an error, not
//! a surprise. The server's `/v1/memory` and the monitor read it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use thiserror::Error;

use super::Plan;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Weights,
    MoeWorkspace,
    Activations,
    KvCache,
    RuntimeOverhead,
}

impl Category {
    pub const ALL: [Category; 5] = [
        Category::Weights,
        Category::MoeWorkspace,
        Category::Activations,
        Category::KvCache,
        Category::RuntimeOverhead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Category::Weights => "weights",
            Category::MoeWorkspace => "moe_workspace",
            Category::Activations => "activations",
            Category::KvCache => "kv_cache",
            Category::RuntimeOverhead => "runtime_overhead",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LedgerError {
    #[error(
        "allocating {requested} bytes for {what} would take {category} to {would_be} bytes, over its planned {planned} bytes"
    )]
    OverPlan {
        category: &'static str,
        what: String,
        requested: u64,
        planned: u64,
        would_be: u64,
    },
}

/// Where the weights live (recorded for `/v1/memory`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightsResidency {
    /// Read in place from the memory map (CPU backend).
    Mapped,
    /// The mapping registered with the GPU and read in place (unified memory).
    HostRegistered,
    /// Copied once to device memory, page cache released.
    DeviceCopy,
}

#[derive(Debug)]
pub struct Ledger {
    planned: [u64; 5],
    allocated: [AtomicU64; 5],
    notes: Mutex<LedgerNotes>,
}

#[derive(Clone, Debug, Default, Serialize)]
struct LedgerNotes {
    page_cache_policy: Option<String>,
    weights_residency: Option<WeightsResidency>,
}

/// One row of the ledger, as `/v1/memory` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LedgerRow {
    pub name: &'static str,
    pub planned: u64,
    pub allocated: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LedgerSnapshot {
    pub categories: Vec<LedgerRow>,
    pub page_cache_policy: Option<String>,
    pub weights_residency: Option<WeightsResidency>,
}

impl Ledger {
    /// A ledger whose budgets are the plan's categories.
    pub fn from_plan(plan: &Plan) -> Arc<Ledger> {
        Arc::new(Ledger::with_budgets([
            plan.weights.total,
            plan.moe_workspace.bytes,
            plan.activations.bytes,
            plan.kv_cache.bytes,
            plan.runtime_overhead.bytes,
        ]))
    }

    /// Budgets in the order of [`Category::ALL`].
    pub fn with_budgets(planned: [u64; 5]) -> Ledger {
        Ledger {
            planned,
            allocated: Default::default(),
            notes: Mutex::new(LedgerNotes::default()),
        }
    }

    pub fn planned(&self, category: Category) -> u64 {
        self.planned[category.index()]
    }

    pub fn allocated(&self, category: Category) -> u64 {
        self.allocated[category.index()].load(Ordering::Acquire)
    }

    /// Charges `bytes` to `category`; fails, charging nothing, if the
    /// category would exceed its plan. The charge is returned when the
    /// [`Charge`] is dropped.
    pub fn charge(
        self: &Arc<Self>,
        category: Category,
        bytes: u64,
        what: &str,
    ) -> Result<Charge, LedgerError> {
        let slot = &self.allocated[category.index()];
        let planned = self.planned[category.index()];
        slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
            current.checked_add(bytes).filter(|&sum| sum <= planned)
        })
        .map_err(|current| LedgerError::OverPlan {
            category: category.name(),
            what: what.to_string(),
            requested: bytes,
            planned,
            would_be: current.saturating_add(bytes),
        })?;
        Ok(Charge {
            ledger: Arc::clone(self),
            category,
            bytes,
        })
    }

    pub fn set_page_cache_policy(&self, policy: &str) {
        if let Ok(mut notes) = self.notes.lock() {
            notes.page_cache_policy = Some(policy.to_string());
        }
    }

    pub fn set_weights_residency(&self, residency: WeightsResidency) {
        if let Ok(mut notes) = self.notes.lock() {
            notes.weights_residency = Some(residency);
        }
    }

    pub fn snapshot(&self) -> LedgerSnapshot {
        let notes = self.notes.lock().map(|n| n.clone()).unwrap_or_default();
        LedgerSnapshot {
            categories: Category::ALL
                .iter()
                .map(|&c| LedgerRow {
                    name: c.name(),
                    planned: self.planned(c),
                    allocated: self.allocated(c),
                })
                .collect(),
            page_cache_policy: notes.page_cache_policy,
            weights_residency: notes.weights_residency,
        }
    }
}

/// A charge held against the ledger; released when dropped.
#[derive(Debug)]
pub struct Charge {
    ledger: Arc<Ledger>,
    category: Category,
    bytes: u64,
}

impl Charge {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.ledger.allocated[self.category.index()].fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_up_to_the_plan_and_no_further() {
        let ledger = Arc::new(Ledger::with_budgets([100, 50, 0, 0, 0]));
        let a = ledger.charge(Category::Weights, 60, "a").unwrap();
        let _b = ledger.charge(Category::Weights, 40, "b").unwrap();
        let err = ledger.charge(Category::Weights, 1, "c").unwrap_err();
        assert_eq!(
            err,
            LedgerError::OverPlan {
                category: "weights",
                what: "c".into(),
                requested: 1,
                planned: 100,
                would_be: 101
            }
        );
        assert_eq!(ledger.allocated(Category::Weights), 100);
        drop(a);
        assert_eq!(ledger.allocated(Category::Weights), 40);
        assert!(ledger.charge(Category::Activations, 1, "x").is_err());
        let rows = ledger.snapshot().categories;
        assert_eq!(rows[0].allocated, 40);
        assert_eq!(rows[1].planned, 50);
    }
}
