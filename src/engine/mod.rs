//! The generation engine: paged KV block bookkeeping, sampling, and (to come)
//! the scheduler and the step loop.
pub mod kv_blocks;
pub mod sampling;
