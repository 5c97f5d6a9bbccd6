//! The monitor's integration tests in one binary (one link instead of one
//! per file); each module is one topic.

// A test that unwraps fails with the reason; that is what a test should do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod collector;
mod keys;
mod parse_memory;
mod parse_stats;
mod pool;
mod probe;
mod render;
