//! `sparkrt top`: a terminal monitor of the unified memory pool while serving.
//!
//! This crate knows nothing of the root `sparkrt` crate. It draws view-model
//! structs, reads the server's `GET /v1/memory` and `GET /v1/stats` (typed by
//! [`wire`], which the server serializes too), and asks a [`HostSource`]
//! (implemented by the root crate, which owns the host probe and the plan
//! formulas) for host readings.
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
pub mod processes;
pub mod rates;
pub mod run;
pub mod sample;
pub mod stats;
mod terminal;
pub mod ui;
pub mod units;
pub mod wire;

pub use host::{GpuProcess, HostSnapshot, HostSource};
pub use options::{TopOptions, parse_interval};
pub use run::{TopError, run};
