//! The monitor's integration tests in one binary (one link instead of one
//! per file); each module is one topic.

mod common;

mod collector;
mod keys;
mod parse_memory;
mod parse_stats;
mod pool;
mod render;
