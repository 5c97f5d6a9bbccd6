//! The live ledger: every buffer the runtime owns is charged to one of the
//! plan's categories, and a charge the plan did not foresee is an error, not
//! a surprise. The server's `/v1/memory` and the monitor read it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use thiserror::Error;

use super::Plan;

// The categories, the page-cache policy and where the weights live are on
// the wire (`/v1/memory`): defined once, with the monitor's types.
pub use sparkrt_tui::wire::{Category, PageCachePolicy, WeightsResidency};

/// A category's slot in the ledger's arrays ([`Category::ALL`]'s order).
fn index(category: Category) -> usize {
    category as usize
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

#[derive(Debug)]
pub struct Ledger {
    planned: [u64; 5],
    allocated: [AtomicU64; 5],
    notes: Mutex<LedgerNotes>,
}

#[derive(Clone, Debug, Default)]
struct LedgerNotes {
    /// `Keep` until the runtime applies another (nothing advised yet).
    page_cache_policy: PageCachePolicy,
    weights_residency: Option<WeightsResidency>,
}

/// One row of the ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerRow {
    pub name: &'static str,
    pub planned: u64,
    pub allocated: u64,
}

/// The ledger at one instant (the server turns it into `wire::Ledger`).
#[derive(Clone, Debug)]
pub struct LedgerSnapshot {
    pub categories: Vec<LedgerRow>,
    pub page_cache_policy: PageCachePolicy,
    /// `None` until a backend records where it put the weights.
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
        self.planned[index(category)]
    }

    pub fn allocated(&self, category: Category) -> u64 {
        self.allocated[index(category)].load(Ordering::Acquire)
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
        let slot = &self.allocated[index(category)];
        let planned = self.planned[index(category)];
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

    pub fn set_page_cache_policy(&self, policy: PageCachePolicy) {
        if let Ok(mut notes) = self.notes.lock() {
            notes.page_cache_policy = policy;
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
        self.ledger.allocated[index(self.category)].fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_contract_order() {
        for (slot, &category) in Category::ALL.iter().enumerate() {
            assert_eq!(index(category), slot, "{category:?}");
        }
    }

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
