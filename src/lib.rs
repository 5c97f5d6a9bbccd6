//! sparkrt: plan every byte, map checkpoints once, run MoE models eagerly.
//!
//! See `docs/ARCHITECTURE.md` for the module map and the contracts between
//! modules.
pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod deploy;
pub mod engine;
pub mod formats;
pub mod geometry;
pub mod host;
pub mod limits;
pub mod model;
pub mod plan;
pub mod progress;
pub mod runtime;
pub mod server;
pub mod step;
pub mod text;
pub mod units;
pub mod util;
