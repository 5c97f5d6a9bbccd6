//! `sparkrt top`: a terminal monitor of the unified memory pool while serving.
//!
//! This crate knows nothing of the root `sparkrt` crate. It draws view-model
//! structs, reads the server's `GET /v1/memory` and `GET /v1/stats` (typed by
//! `sparkrt_wire`, which the server serializes too), and asks a
//! [`HostSource`] for host readings: the binary's, [`probe::ProbeCommand`],
//! runs the `sparkrt` binary's probe (it owns the host probe and the plan
//! formulas).
//!
//! Threads: a collector ([`collector`]) and an input reader ([`event`]) feed
//! one draw loop ([`run::draw_loop`]) over a channel, so a slow server never
//! freezes the screen.

pub mod app;
pub mod client;
pub mod collector;
pub mod event;
pub mod history;
pub mod host;
pub mod link;
pub mod memory;
pub mod options;
pub mod pool;
pub mod probe;
pub mod processes;
pub mod rates;
pub mod run;
pub mod sample;
pub mod stats;
mod terminal;
pub mod ui;
pub mod units;

pub use host::HostSource;
pub use options::{TopOptions, parse_interval};
pub use run::{TopError, run};
