//! The generation engine: paged KV block bookkeeping, sampling and the step
//! loop (continuous batching), which fills each step's `step::StepBatch`.

pub mod kv_blocks;
pub mod logprobs;
pub mod sampling;
pub mod scheduler;
pub mod sequence;

pub use logprobs::{LogprobRequest, MAX_TOP_LOGPROBS, TokenLogprob};
pub use scheduler::{
    AdmissionError, Engine, EngineCounters, EngineError, EngineLimits, StepReport,
};
pub use sequence::{Event, EventSink, FinishReason, Request, SeqId};
