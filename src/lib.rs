//! sparkrt: plan every byte, map checkpoints once, run MoE models eagerly.
//!
//! See `docs/ARCHITECTURE.md` for the module map and the contracts between
//! modules.
pub mod backend;
pub mod checkpoint;
pub mod plan;
pub mod units;
