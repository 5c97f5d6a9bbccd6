//! The live ledger: every buffer the runtime owns is charged to one of the
//! plan's categories, and a charge the plan did not foresee is an error, not
//! a surprise. The server's `/v1/memory` and the monitor read it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use thiserror::Error;

use super::Plan;

// The categories, the page-cache policy and where the weights live are on
// the wire (`/v1/memory`): defined once, with the monitor's types.
pub use sparkrt_wire::{Category, PageCachePolicy, WeightsResidency};

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
    #[error("the plan lists no {category} buffer {what}")]
    Unplanned {
        category: &'static str,
        what: String,
    },
    #[error("the allocations differ from the plan: {}", list_mismatches(.0))]
    Incomplete(Vec<BufferMismatch>),
}

/// A planned buffer whose charges do not add up to its plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BufferMismatch {
    pub category: &'static str,
    pub name: String,
    pub planned: u64,
    pub charged: u64,
}

fn list_mismatches(mismatches: &[BufferMismatch]) -> String {
    let rows: Vec<String> = mismatches
        .iter()
        .map(|m| {
            format!(
                "{}/{} charged {} bytes, planned {}",
                m.category, m.name, m.charged, m.planned
            )
        })
        .collect();
    rows.join("; ")
}

/// One buffer the plan lists: what a charge names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedBuffer {
    pub category: Category,
    pub name: String,
    pub bytes: u64,
}

impl PlannedBuffer {
    pub fn new(category: Category, name: &str, bytes: u64) -> PlannedBuffer {
        PlannedBuffer {
            category,
            name: name.to_string(),
            bytes,
        }
    }
}

/// The name of the weights' one buffer and of the KV cache's.
pub const WEIGHTS: &str = "weights";
pub const KV_CACHE: &str = "kv_cache";

/// How many categories a ledger keeps, one budget each.
pub const CATEGORIES: usize = Category::ALL.len();

/// Category budgets and, for a ledger made from a plan, the plan's buffers
/// one by one: a charge names its buffer, and [`Ledger::verify_complete`]
/// finds any buffer charged more or less than planned.
#[derive(Debug)]
pub struct Ledger {
    planned: [u64; CATEGORIES],
    allocated: [AtomicU64; CATEGORIES],
    /// Empty for a ledger made from budgets alone (tests).
    buffers: Vec<PlannedBuffer>,
    /// Live bytes charged to each of `buffers`.
    charged: Vec<AtomicU64>,
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
    /// A ledger whose budgets are the plan's categories and whose buffers
    /// are the plan's buffers.
    pub fn from_plan(plan: &Plan) -> Arc<Ledger> {
        let budgets = [
            plan.weights.total,
            plan.moe_workspace.bytes,
            plan.activations.bytes,
            plan.kv_cache.bytes,
            plan.recurrent_state.bytes,
            plan.runtime_overhead.bytes,
        ];
        Arc::new(Ledger::with_buffers(budgets, planned_buffers(plan)))
    }

    /// Budgets in the order of [`Category::ALL`], no buffers: any name may
    /// be charged and [`Ledger::verify_complete`] has nothing to check.
    pub fn with_budgets(planned: [u64; CATEGORIES]) -> Ledger {
        Ledger::with_buffers(planned, Vec::new())
    }

    /// Budgets in the order of [`Category::ALL`] and the buffers charges
    /// must name.
    pub fn with_buffers(planned: [u64; CATEGORIES], buffers: Vec<PlannedBuffer>) -> Ledger {
        Ledger {
            planned,
            allocated: Default::default(),
            charged: buffers.iter().map(|_| AtomicU64::new(0)).collect(),
            buffers,
            notes: Mutex::new(LedgerNotes::default()),
        }
    }

    /// Checks that every planned buffer is charged exactly its planned
    /// bytes: called once every allocation of start-up is made.
    pub fn verify_complete(&self) -> Result<(), LedgerError> {
        let mismatches: Vec<BufferMismatch> = self
            .buffers
            .iter()
            .zip(&self.charged)
            .map(|(b, charged)| BufferMismatch {
                category: b.category.name(),
                name: b.name.clone(),
                planned: b.bytes,
                charged: charged.load(Ordering::Acquire),
            })
            .filter(|m| m.charged != m.planned)
            .collect();
        if mismatches.is_empty() {
            Ok(())
        } else {
            Err(LedgerError::Incomplete(mismatches))
        }
    }

    /// The planned buffer `what` of `category`: None for a ledger without
    /// buffers, an error when the plan does not list it.
    fn buffer_index(&self, category: Category, what: &str) -> Result<Option<usize>, LedgerError> {
        if self.buffers.is_empty() {
            return Ok(None);
        }
        self.buffers
            .iter()
            .position(|b| b.category == category && b.name == what)
            .map(Some)
            .ok_or_else(|| LedgerError::Unplanned {
                category: category.name(),
                what: what.to_string(),
            })
    }

    pub fn planned(&self, category: Category) -> u64 {
        self.planned[index(category)]
    }

    pub fn allocated(&self, category: Category) -> u64 {
        self.allocated[index(category)].load(Ordering::Acquire)
    }

    /// Charges `bytes` to the buffer `what` of `category`; fails, charging
    /// nothing, if the plan lists no such buffer or the category would
    /// exceed its plan. The charge is returned when the [`Charge`] is dropped.
    pub fn charge(
        self: &Arc<Self>,
        category: Category,
        bytes: u64,
        what: &str,
    ) -> Result<Charge, LedgerError> {
        let buffer = self.buffer_index(category, what)?;
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
        if let Some(i) = buffer {
            self.charged[i].fetch_add(bytes, Ordering::AcqRel);
        }
        Ok(Charge {
            ledger: Arc::clone(self),
            category,
            buffer,
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

/// Every buffer of `plan`, by category: the weights as one, the MoE
/// workspace's and the activations' as listed, the KV cache as one (and
/// the recurrent-state pool, in the same category), the runtime
/// overhead's as listed.
pub fn planned_buffers(plan: &Plan) -> Vec<PlannedBuffer> {
    let listed = |category: Category, buffers: &[super::memory::Buffer]| {
        buffers
            .iter()
            .map(move |b| PlannedBuffer::new(category, &b.name, b.bytes))
            .collect::<Vec<_>>()
    };
    let mut all = vec![PlannedBuffer::new(
        Category::Weights,
        WEIGHTS,
        plan.weights.total,
    )];
    all.extend(listed(Category::MoeWorkspace, &plan.moe_workspace.buffers));
    all.extend(listed(Category::Activations, &plan.activations.buffers));
    all.push(PlannedBuffer::new(
        Category::KvCache,
        KV_CACHE,
        plan.kv_cache.bytes,
    ));
    let state = &plan.recurrent_state;
    if state.bytes > 0 {
        all.push(PlannedBuffer::new(
            Category::RecurrentState,
            super::memory::RECURRENT_STATE_LIVE,
            state.live_slots as u64 * state.bytes_per_seq,
        ));
        if state.snapshot_slots > 0 {
            all.push(PlannedBuffer::new(
                Category::RecurrentState,
                super::memory::RECURRENT_STATE_SNAPSHOTS,
                state.snapshot_slots as u64 * state.bytes_per_seq,
            ));
        }
        if state.verify_slots > 0 {
            all.push(PlannedBuffer::new(
                Category::RecurrentState,
                super::memory::RECURRENT_STATE_VERIFY,
                state.verify_slots as u64 * state.bytes_per_seq,
            ));
        }
    }
    all.extend(listed(
        Category::RuntimeOverhead,
        &plan.runtime_overhead.buffers,
    ));
    all
}

/// A charge held against the ledger; released when dropped.
#[derive(Debug)]
pub struct Charge {
    ledger: Arc<Ledger>,
    category: Category,
    buffer: Option<usize>,
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
        if let Some(i) = self.buffer {
            self.ledger.charged[i].fetch_sub(self.bytes, Ordering::AcqRel);
        }
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
        let ledger = Arc::new(Ledger::with_budgets([100, 50, 0, 0, 0, 0]));
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

    fn itemised() -> Arc<Ledger> {
        Arc::new(Ledger::with_buffers(
            [100, 0, 30, 0, 0, 0],
            vec![
                PlannedBuffer::new(Category::Weights, "weights", 100),
                PlannedBuffer::new(Category::Activations, "hidden", 10),
                PlannedBuffer::new(Category::Activations, "logits", 20),
            ],
        ))
    }

    #[test]
    fn a_charge_below_plan_is_caught_by_the_completeness_check() {
        let ledger = itemised();
        let _w = ledger.charge(Category::Weights, 100, "weights").unwrap();
        let _h = ledger.charge(Category::Activations, 10, "hidden").unwrap();
        // Under its plan: the category check alone lets it through.
        let _l = ledger.charge(Category::Activations, 19, "logits").unwrap();
        assert_eq!(
            ledger.verify_complete(),
            Err(LedgerError::Incomplete(vec![BufferMismatch {
                category: "activations",
                name: "logits".into(),
                planned: 20,
                charged: 19,
            }]))
        );
    }

    #[test]
    fn an_uncharged_buffer_is_caught_and_an_exact_ledger_passes() {
        let ledger = itemised();
        let w = ledger.charge(Category::Weights, 100, "weights").unwrap();
        let _h = ledger.charge(Category::Activations, 10, "hidden").unwrap();
        let err = ledger.verify_complete().unwrap_err();
        assert!(
            err.to_string()
                .contains("activations/logits charged 0 bytes, planned 20")
        );
        // Two charges of one buffer add up.
        let _a = ledger.charge(Category::Activations, 15, "logits").unwrap();
        let _b = ledger.charge(Category::Activations, 5, "logits").unwrap();
        assert_eq!(ledger.verify_complete(), Ok(()));
        // A released charge is no longer counted.
        drop(w);
        assert!(ledger.verify_complete().is_err());
    }

    #[test]
    fn a_charge_must_name_a_planned_buffer() {
        let ledger = itemised();
        assert_eq!(
            ledger
                .charge(Category::Activations, 1, "scratch")
                .unwrap_err(),
            LedgerError::Unplanned {
                category: "activations",
                what: "scratch".into()
            }
        );
        // The right name in the wrong category is not the buffer either.
        assert!(ledger.charge(Category::Weights, 1, "hidden").is_err());
        assert_eq!(ledger.allocated(Category::Activations), 0);
    }
}
