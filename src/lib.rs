//! sparkrt: plan every byte, map checkpoints once, run MoE models eagerly.
//!
//! See `docs/ARCHITECTURE.md` for the module map and the contracts between
//! modules.
pub mod checkpoint;
pub mod engine;
pub mod plan;
pub mod text;
pub mod units;
