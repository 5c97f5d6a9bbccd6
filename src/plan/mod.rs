//! Profiles, the memory plan and the live ledger.
pub mod memory;
