//! The generation engine: continuous batching over one model, as three
//! parts with one data type between each.
//!
//! ```text
//!  requests ─► scheduler ──StepPlan──► executor ──logits rows──► output stage ─► events
//!                 ▲                                                   │
//!                 └──────────── apply: computed tokens, blocks ◄──────┘
//! ```
//!
//! - [`scheduler`]: pure policy over the paged KV blocks: admission,
//!   chunked prefill, prefix hits, preemption, forks of `n > 1` choices;
//!   fills a [`StepPlan`].
//! - [`executor`]: the plan through the model and backend into logits rows
//!   ([`Executor`]; [`ModelExecutor`] for a loaded model).
//! - [`output`]: logits rows into sampled tokens, log-probabilities, grammar
//!   advances, stop rules and events.
//!
//! [`Engine`] composes them and checks requests before they are queued.

mod counters;
mod drafts;
pub mod executor;
pub mod grammar;
pub mod kv_blocks;
pub mod logprobs;
mod mtp;
pub mod output;
pub mod processors;
pub mod request;
pub mod sampling;
mod scheduler;
mod sequence;
mod state_cache;
pub mod step_plan;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use thiserror::Error;

pub use counters::{DraftStats, EngineCounters, EngineLimits};
pub use executor::{Executor, ModelExecutor};
pub use logprobs::{LogprobRequest, MAX_TOP_LOGPROBS, TokenLogprob};
pub use output::StepOutcome;
pub use request::{Event, EventSink, FinishReason, Request, SeqId};
pub use step_plan::StepPlan;

use mtp::MtpDrafter;
use output::OutputStage;
use sampling::SamplingError;
use scheduler::Scheduler;
use sequence::Sequence;

use crate::model::ModelError;
use crate::plan::speculative::DraftMethod;
use crate::text::Tokenizer;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("KV cache of {blocks} blocks: {source}")]
    KvBlocks {
        blocks: usize,
        source: kv_blocks::KvBlocksError,
    },
}

impl EngineError {
    /// Whether no later step can succeed (the device is lost): the server
    /// stops at once instead of failing every request that follows.
    pub fn is_fatal(&self) -> bool {
        matches!(self, EngineError::Model(e) if e.is_fatal())
    }
}

/// Why a request was not admitted.
#[derive(Debug, Error, PartialEq)]
pub enum AdmissionError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "the prompt has {prompt} tokens; this model serves at most {max_model_len} tokens per sequence, output included"
    )]
    PromptTooLong { prompt: usize, max_model_len: usize },
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error(
        "{count} log-probability alternatives asked for; at most {max} are reported",
        max = logprobs::MAX_TOP_LOGPROBS
    )]
    TooManyLogprobs { count: usize },
    #[error(
        "cache_salt has {bytes} bytes; at most {max} are accepted",
        max = crate::limits::MAX_CACHE_SALT_BYTES
    )]
    CacheSaltTooLong { bytes: usize },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
}

/// What one step did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Tokens run through the model.
    pub tokens: usize,
    /// Sequences that sampled a token.
    pub sampled: usize,
    /// Why the step's sampling failed for every running sequence (the
    /// model's logits were NaN or infinite): the step ran, its sequences
    /// ended with this message. `None` for a step that worked.
    pub failure: Option<String>,
}

pub struct Engine<'w> {
    scheduler: Scheduler,
    executor: Box<dyn Executor + 'w>,
    output: OutputStage,
    /// The current step's plan (its capacity kept between steps).
    plan: StepPlan,
    /// Drafts from the model's MTP head (speculative `method = "mtp"`).
    drafter: Option<MtpDrafter>,
    next_id: SeqId,
    pub counters: Arc<EngineCounters>,
}

impl<'w> Engine<'w> {
    /// An engine over `executor` within `limits`; `tokenizer` turns tokens
    /// into text (none: ids only), `eos` are the end-of-sequence ids.
    pub fn new(
        executor: impl Executor + 'w,
        limits: EngineLimits,
        tokenizer: Option<Arc<Tokenizer>>,
        eos: Vec<u32>,
    ) -> Result<Self, EngineError> {
        let counters = Arc::new(EngineCounters::default());
        let blocks = limits.kv_blocks;
        let (speculative, block_size) = (limits.speculative, limits.kv_block_size);
        let output = OutputStage::new(executor.vocab_size(), tokenizer, eos, limits.max_model_len);
        let scheduler = Scheduler::new(limits, Arc::clone(&counters))
            .map_err(|source| EngineError::KvBlocks { blocks, source })?;
        let plan = scheduler.plan_capacity();
        let drafter = speculative
            .filter(|c| c.method == DraftMethod::Mtp)
            .map(|c| MtpDrafter::new(c.num_speculative_tokens, block_size, &plan.batch));
        Ok(Engine {
            plan,
            drafter,
            scheduler,
            executor: Box::new(executor),
            output,
            next_id: 0,
            counters,
        })
    }

    pub fn limits(&self) -> &EngineLimits {
        self.scheduler.limits()
    }

    pub fn vocab_size(&self) -> usize {
        self.executor.vocab_size()
    }

    /// Sequences admitted and not yet finished.
    pub fn num_running(&self) -> usize {
        self.scheduler.num_running()
    }

    pub fn num_waiting(&self) -> usize {
        self.scheduler.num_waiting()
    }

    pub fn kv_blocks_used(&self) -> usize {
        self.scheduler.blocks().used_blocks()
    }

    pub fn kv_blocks_total(&self) -> usize {
        self.scheduler.blocks().num_blocks()
    }

    /// Unreferenced full blocks kept for the prefix cache (reclaimable);
    /// used + cached + free = total.
    pub fn kv_blocks_cached(&self) -> usize {
        self.scheduler.blocks().cached_blocks()
    }

    /// Blocks holding nothing reusable.
    pub fn kv_blocks_free(&self) -> usize {
        self.scheduler.blocks().free_blocks()
    }

    /// Checks the block and snapshot books (tests): see
    /// [`kv_blocks::BlockAllocator::audit`].
    pub fn audit_blocks(&self) -> Result<(), String> {
        self.scheduler.audit()
    }

    /// Recurrent-state snapshots the prefix cache holds (hybrid models).
    pub fn state_snapshots(&self) -> usize {
        self.scheduler.state_snapshots()
    }

    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    /// Queues a request; its events go to `sink`.
    pub fn add_request(
        &mut self,
        request: Request,
        sink: Box<dyn EventSink>,
    ) -> Result<SeqId, AdmissionError> {
        let seq = self.sequence(request, sink)?;
        let id = seq.id;
        self.scheduler.add_group(vec![seq]);
        Ok(id)
    }

    /// Queues one request as `sinks.len()` choices (n > 1, best_of): choice
    /// j's events go to sinks[j]; when the request is seeded, choice j
    /// samples with seed `seed.wrapping_add(j)` (vLLM's rule), so `n = 4,
    /// seed = s` equals four requests seeded s, s+1, s+2, s+3. All or none
    /// are queued.
    ///
    /// The prompt is computed once: the first choice computes it and the
    /// others wait in the queue. When it samples its first token, each of
    /// them samples its own from the same logits and is forked from its
    /// blocks (full blocks shared, the partial last one copied). A choice
    /// that cannot be forked (no room, or it needs every prompt row or a
    /// grammar mask) starts from the cached blocks instead.
    pub fn add_request_group(
        &mut self,
        request: Request,
        sinks: Vec<Box<dyn EventSink>>,
    ) -> Result<Vec<SeqId>, AdmissionError> {
        let mut choices = Vec::with_capacity(sinks.len());
        for (j, sink) in sinks.into_iter().enumerate() {
            let mut choice = request.clone();
            if let Some(seed) = choice.params.seed {
                choice.params.seed = Some(seed.wrapping_add(j as u64));
            }
            choices.push(self.sequence(choice, sink)?);
        }
        let ids = choices.iter().map(|s| s.id).collect();
        self.scheduler.add_group(choices);
        Ok(ids)
    }

    /// Cancels a request; it leaves at the next step.
    pub fn abort(&mut self, id: SeqId) {
        self.scheduler.abort(id);
    }

    /// Ends every request with `message` (after a step failed); they leave
    /// at the next step.
    pub fn fail_all(&mut self, message: &str) {
        self.scheduler.fail_all(message);
    }

    /// Runs one step: retire, admit, schedule, execute and sample, apply.
    ///
    /// Where the model computes on the host's rayon pool, the step runs on
    /// one of its threads: one hand-over a step instead of one for every
    /// parallel op, each of which woke the pool and put the caller to sleep
    /// (about 280 context switches a token on the 8-layer bench model;
    /// decode 1.04x, 2 vCPUs).
    pub fn step(&mut self) -> Result<StepReport, EngineError> {
        if self.executor.computes_on_host_pool() {
            rayon::scope(|_| self.step_here())
        } else {
            self.step_here()
        }
    }

    fn step_here(&mut self) -> Result<StepReport, EngineError> {
        for seq in self.scheduler.retire_finished() {
            self.output.finish(seq);
        }
        self.scheduler.admit();
        self.scheduler.schedule(&mut self.plan);
        if self.plan.is_empty() {
            return Ok(StepReport::default());
        }
        let Engine {
            scheduler,
            executor,
            output,
            plan,
            drafter,
            ..
        } = self;
        let outcome = output.process(plan, scheduler.running_mut(), |logits| {
            executor.execute(plan, logits)
        });
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                // The choices forked in this step never got their copies:
                // they end with the step (the others are the caller's).
                for fork in &plan.forks {
                    scheduler.running_mut()[fork.choice].fail(&e.to_string());
                }
                scheduler.abandon(plan);
                return Err(e.into());
            }
        };
        scheduler.settle_drafts(plan);
        if let Some(drafter) = drafter.as_mut()
            && let Err(e) = drafter.draft(plan, scheduler.running_mut(), executor.as_mut())
        {
            if e.is_fatal() {
                scheduler.abandon(plan);
                return Err(e.into());
            }
            // Drafts only save time: the step stands without them.
            tracing::warn!("MTP drafts failed, the step goes on without them: {e}");
        }
        if !plan.state_settles.is_empty()
            && let Err(e) = executor.copy_states(&plan.state_settles)
        {
            // The kept rows' states are lost: the step's sequences end.
            for chunk in &plan.chunks {
                scheduler.running_mut()[chunk.seq].fail(&e.to_string());
            }
            scheduler.abandon(plan);
            return Err(e.into());
        }
        scheduler.apply(plan);
        if let Some(message) = &outcome.failure {
            scheduler.fail_running(message);
        }
        self.counters
            .generation_tokens
            .fetch_add(outcome.sampled as u64, Ordering::Relaxed);
        self.counters.steps.fetch_add(1, Ordering::Relaxed);
        Ok(StepReport {
            tokens: self.plan.rows(),
            sampled: outcome.sampled,
            failure: outcome.failure,
        })
    }

    /// Checks `request` against the model and the limits and makes its
    /// sequence.
    fn sequence(
        &mut self,
        request: Request,
        sink: Box<dyn EventSink>,
    ) -> Result<Sequence, AdmissionError> {
        if let Some(count) = request.logprobs.too_many() {
            return Err(AdmissionError::TooManyLogprobs { count });
        }
        if request.prompt.is_empty() {
            return Err(AdmissionError::EmptyPrompt);
        }
        let max_model_len = self.limits().max_model_len;
        if request.prompt.len() >= max_model_len {
            return Err(AdmissionError::PromptTooLong {
                prompt: request.prompt.len(),
                max_model_len,
            });
        }
        let vocab = self.vocab_size();
        if let Some(&id) = request.prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(AdmissionError::TokenOutOfRange { id, vocab });
        }
        request.params.validate_ids(vocab)?;
        if let Some(salt) = &request.cache_salt
            && salt.len() > crate::limits::MAX_CACHE_SALT_BYTES
        {
            return Err(AdmissionError::CacheSaltTooLong { bytes: salt.len() });
        }
        let id = self.next_id;
        self.next_id += 1;
        Ok(Sequence::new(
            id,
            request,
            sink,
            self.output.tokenizer(),
            self.output.eos(),
        )?)
    }
}
