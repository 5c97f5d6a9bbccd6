//! How a backend's allocations are sized and charged to the ledger, the
//! same way on every backend.

use std::sync::Arc;

use super::error::BackendError;
use crate::plan::ledger::{Category, Charge, Ledger};
use crate::plan::memory::MoeWorkspace as MoeWorkspacePlan;

/// Charges the plan's MoE workspace buffer `name` to the ledger before a
/// backend allocates it: its planned bytes and the charge to keep.
pub(crate) fn charge_workspace_buffer(
    plan: &MoeWorkspacePlan,
    ledger: &Arc<Ledger>,
    name: &str,
) -> Result<(usize, Charge), BackendError> {
    let planned = plan
        .buffers
        .iter()
        .find(|b| b.name == name)
        .ok_or_else(|| {
            BackendError::Shape(format!("the plan's MoE workspace has no buffer {name}"))
        })?;
    let bytes = usize::try_from(planned.bytes)
        .map_err(|_| BackendError::Shape(format!("{name} is too large")))?;
    let charge = ledger.charge(Category::MoeWorkspace, planned.bytes, name)?;
    Ok((bytes, charge))
}

/// Byte size of a buffer of `elements` f32 activations.
pub fn f32_bytes(elements: usize) -> u64 {
    elements as u64 * crate::plan::memory::ACTIVATION_BYTES
}
