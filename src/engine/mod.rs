//! The generation engine: paged KV block bookkeeping, sampling (logits
//! processors, structured-output grammars), log-probabilities and the step
//! loop (continuous batching), which fills each step's `step::StepBatch`.

pub mod grammar;
pub mod kv_blocks;
pub mod logprobs;
pub mod processors;
pub mod sampling;
pub mod scheduler;
pub mod sequence;

pub use logprobs::{LogprobRequest, MAX_TOP_LOGPROBS, TokenLogprob};
pub use scheduler::{
    AdmissionError, Engine, EngineCounters, EngineError, EngineLimits, StepReport,
};
pub use sequence::{Event, EventSink, FinishReason, Request, SeqId};
