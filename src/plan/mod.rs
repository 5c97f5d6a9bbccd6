//! Profiles, the memory plan and the live ledger.
pub mod geometry;
pub mod memory;
