//! The step loop: continuous batching over one model.
//!
//! Each step packs, oldest sequence first, one decode token per running
//! sequence and chunks of waiting prompts, up to `max_num_batched_tokens`
//! tokens and `max_num_seqs` sequences. KV blocks are taken as chunks are
//! scheduled; when they run out, the newest sequence is preempted (its
//! blocks freed, its tokens recomputed later). A sequence that has not
//! started never preempts one that has: it starts once the blocks for all
//! its known tokens are free, beyond what the started sequences need for
//! theirs. New requests join between steps; finished, aborted and abandoned
//! ones leave at the next step.
//!
//! Prefix caching: when a sequence starts (first time or after a
//! preemption) it takes the longest chain of cached full blocks of its
//! tokens (`kv_blocks`) and computes only the rest. The CPU kernels are
//! batch-invariant and a step's own keys are rounded to the cache's
//! precision before attention, so the rest's logits are bitwise those of a
//! cold run. After each step the blocks that became full are registered
//! and sliding-window blocks that left the window are released.
//!
//! `n > 1`: the later choices of a request wait until the first samples,
//! then sample from its logits row and are forked from its blocks (see
//! [`Engine::add_request_group`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

use rayon::prelude::*;

use super::grammar::{Constraint, GrammarError, TokenMask};
use super::kv_blocks::{BlockAllocator, PrefixHit, root_hash};
use super::logprobs::{TokenLogprob, token_logprob};
use super::sampling::{Sampler, SamplingError, SamplingWorkspace};
use super::sequence::{Event, EventSink, FinishReason, Request, SeqId, Sequence, TextState};
use crate::backend::Backend;
use crate::model::{Buffers, ModelError, Transformer};
use crate::step::{Logits, StepBatch};
use crate::text::Tokenizer;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
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
        max = super::logprobs::MAX_TOP_LOGPROBS
    )]
    TooManyLogprobs { count: usize },
    #[error(
        "cache_salt has {bytes} bytes; at most {max} are accepted",
        max = crate::limits::MAX_CACHE_SALT_BYTES
    )]
    CacheSaltTooLong { bytes: usize },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(
        "{n} choices of one request are not served for a model with recurrent (Gated DeltaNet) state yet"
    )]
    ChoicesWithRecurrentState { n: usize },
}

/// Limits the engine schedules within (from the plan).
#[derive(Clone, Debug)]
pub struct EngineLimits {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    pub kv_blocks: usize,
    pub kv_block_size: usize,
    /// Tokens a sliding-window layer attends to (0: no such layers).
    pub sliding_window: usize,
    /// Keep full KV blocks for reuse by later requests.
    pub prefix_caching: bool,
}

/// Counters the server exports.
#[derive(Debug, Default)]
pub struct EngineCounters {
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub preemptions: AtomicU64,
    pub steps: AtomicU64,
    /// Tokens of starting sequences looked up in the prefix cache.
    pub prefix_cache_queries: AtomicU64,
    /// Of those, tokens served from the cache (not recomputed).
    pub prefix_cache_hits: AtomicU64,
}

/// What one step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Tokens run through the model.
    pub tokens: usize,
    /// Sequences that sampled a token.
    pub sampled: usize,
}

pub struct Engine<'w, B: Backend + 'w> {
    backend: &'w B,
    model: Transformer<'w, B>,
    buffers: Buffers<B>,
    limits: EngineLimits,
    blocks: BlockAllocator,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    batch: StepBatch,
    /// For each logit row of the current step: the running index of its
    /// sequence and whether the row is sampled.
    logit_owners: Vec<(usize, bool)>,
    /// Running index and token count of each sequence in the current step.
    scheduled: Vec<(usize, usize)>,
    sampling: SamplingWorkspace,
    tokenizer: Option<Arc<Tokenizer>>,
    eos: Vec<u32>,
    next_id: SeqId,
    pub counters: Arc<EngineCounters>,
}

impl<'w, B: Backend + 'w> Engine<'w, B> {
    pub fn new(
        backend: &'w B,
        model: Transformer<'w, B>,
        buffers: Buffers<B>,
        mut limits: EngineLimits,
        tokenizer: Option<Arc<Tokenizer>>,
        eos: Vec<u32>,
    ) -> Result<Self, EngineError> {
        if buffers.state.is_some() {
            // Until the scheduler hands out recurrent-state slots, a model
            // with Gated DeltaNet layers runs one sequence at a time (the
            // batch's default slot 0) and reuses no cached prefix (its
            // state is not cached with the KV blocks).
            limits.max_num_seqs = 1;
            limits.prefix_caching = false;
        }
        let blocks = BlockAllocator::new(limits.kv_blocks, limits.kv_block_size)
            .map_err(|e| {
                ModelError::Unsupported(format!("KV cache of {} blocks: {e}", limits.kv_blocks))
            })?
            .with_prefix_caching(limits.prefix_caching)
            .with_sliding_window(limits.sliding_window);
        let blocks_per_seq = limits.max_model_len.div_ceil(limits.kv_block_size);
        Ok(Engine {
            backend,
            batch: StepBatch::with_capacity(
                limits.max_num_batched_tokens,
                limits.max_num_seqs,
                blocks_per_seq,
            ),
            logit_owners: Vec::with_capacity(limits.max_num_batched_tokens),
            scheduled: Vec::with_capacity(limits.max_num_seqs),
            sampling: SamplingWorkspace::new(model.settings.vocab_size),
            model,
            buffers,
            blocks,
            limits,
            waiting: VecDeque::new(),
            running: Vec::new(),
            tokenizer,
            eos,
            next_id: 0,
            counters: Arc::new(EngineCounters::default()),
        })
    }

    pub fn limits(&self) -> &EngineLimits {
        &self.limits
    }

    pub fn vocab_size(&self) -> usize {
        self.model.settings.vocab_size
    }

    /// Sequences admitted and not yet finished.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn kv_blocks_used(&self) -> usize {
        self.blocks.used_blocks()
    }

    pub fn kv_blocks_total(&self) -> usize {
        self.blocks.num_blocks()
    }

    /// Unreferenced full blocks kept for the prefix cache (reclaimable);
    /// used + cached + free = total.
    pub fn kv_blocks_cached(&self) -> usize {
        self.blocks.cached_blocks()
    }

    /// Blocks holding nothing reusable.
    pub fn kv_blocks_free(&self) -> usize {
        self.blocks.free_blocks()
    }

    /// Checks the block books (tests): see [`BlockAllocator::audit`].
    pub fn audit_blocks(&self) -> Result<(), String> {
        self.blocks.audit()
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Queues a request; its events go to `sink`.
    pub fn add_request(
        &mut self,
        mut request: Request,
        sink: Box<dyn EventSink>,
    ) -> Result<SeqId, AdmissionError> {
        if let Some(count) = request.logprobs.too_many() {
            return Err(AdmissionError::TooManyLogprobs { count });
        }
        if request.prompt.is_empty() {
            return Err(AdmissionError::EmptyPrompt);
        }
        if request.prompt.len() >= self.limits.max_model_len {
            return Err(AdmissionError::PromptTooLong {
                prompt: request.prompt.len(),
                max_model_len: self.limits.max_model_len,
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
        let sampler = Sampler::for_prompt(&request.params, &request.prompt, &self.eos)?;
        let constraint = request.params.constraint.take();
        let id = self.next_id;
        self.next_id += 1;
        let text = self
            .tokenizer
            .as_ref()
            .map(|t| TextState::new(t, &request.params, request.skip_special_tokens));
        self.waiting.push_back(Sequence {
            id,
            prompt_len: request.prompt.len(),
            tokens: request.prompt,
            computed: 0,
            prompt_counted: 0,
            sampler,
            params: request.params,
            constraint,
            prompt_logits: request.prompt_logits,
            ignore_eos: request.ignore_eos,
            logprobs: request.logprobs,
            prompt_logprobs_next: 1,
            stop_logprob: None,
            sink,
            text,
            finished: None,
            scheduled_reported: false,
            salt_root: root_hash(request.cache_salt.as_deref()),
            cached_tokens: None,
            follows: None,
            has_followers: false,
        });
        Ok(id)
    }

    /// Cancels a request; it leaves at the next step.
    pub fn abort(&mut self, id: SeqId) {
        for seq in self.running.iter_mut().chain(self.waiting.iter_mut()) {
            if seq.id == id && seq.finished.is_none() {
                seq.finished = Some(FinishReason::Aborted);
            }
        }
    }

    /// Ends every request with `message` (after a step failed); they leave
    /// at the next step.
    pub fn fail_all(&mut self, message: &str) {
        for seq in self.running.iter_mut().chain(self.waiting.iter_mut()) {
            if seq.finished.is_none() {
                seq.sink.send(Event::Failed {
                    message: message.to_string(),
                });
                seq.finished = Some(FinishReason::Aborted);
            }
        }
    }

    /// Runs one step of the model over the scheduled tokens.
    pub fn step(&mut self) -> Result<StepReport, EngineError> {
        self.retire_finished();
        self.admit();
        self.schedule();
        let rows = self.batch.rows();
        if rows == 0 {
            return Ok(StepReport::default());
        }
        let sampled = self.run_model()?;
        self.counters.steps.fetch_add(1, Ordering::Relaxed);
        Ok(StepReport {
            tokens: rows,
            sampled,
        })
    }

    /// Removes finished sequences (and those whose client left), freeing
    /// their blocks, and tells their clients.
    fn retire_finished(&mut self) {
        for seq in self.running.iter_mut().chain(self.waiting.iter_mut()) {
            if seq.finished.is_none() && seq.sink.is_closed() {
                seq.finished = Some(FinishReason::Aborted);
            }
        }
        let mut index = 0;
        while index < self.running.len() {
            if self.running[index].finished.is_some() {
                let seq = self.running.remove(index);
                self.release(&seq);
                self.finish(seq);
            } else {
                index += 1;
            }
        }
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|s| s.finished.is_some());
        self.waiting = waiting.into();
        for seq in done {
            // A waiting sequence holds no blocks, except a choice forked in
            // a step whose forward pass then failed (it never moved on).
            self.release(&seq);
            self.finish(seq);
        }
    }

    fn release(&mut self, seq: &Sequence) {
        self.blocks.free(seq.id);
    }

    fn finish(&mut self, mut seq: Sequence) {
        let reason = seq.finished.unwrap_or(FinishReason::Aborted);
        let text = match (&mut seq.text, &self.tokenizer) {
            (Some(text), Some(tokenizer)) if reason != FinishReason::Aborted => {
                text.finish(tokenizer).unwrap_or_default()
            }
            _ => String::new(),
        };
        let completion_tokens = seq.generated();
        seq.sink.send(Event::Finished {
            reason,
            text,
            stop_logprob: seq.stop_logprob.take(),
            prompt_tokens: seq.prompt_len,
            completion_tokens,
            cached_tokens: seq.cached_tokens.unwrap_or(0),
        });
    }

    /// Moves waiting sequences into the running set while there is room.
    fn admit(&mut self) {
        while self.running.len() < self.limits.max_num_seqs {
            if self
                .waiting
                .front()
                .is_some_and(|s| self.waits_for_leader(s))
            {
                break;
            }
            let Some(seq) = self.waiting.pop_front() else {
                break;
            };
            self.running.push(seq);
        }
    }

    /// Fills the step batch, oldest sequence first, preempting the newest
    /// when KV blocks run out.
    fn schedule(&mut self) {
        self.batch.clear();
        self.logit_owners.clear();
        self.scheduled.clear();
        let mut budget = self.limits.max_num_batched_tokens;
        // Sequences sent back to the queue in this step.
        let mut returned = Vec::new();
        // Set once a sequence waits for blocks or is preempted: first come,
        // first served, so no later sequence starts in this step.
        let mut short_of_blocks = false;
        let mut index = 0;
        while index < self.running.len() && budget > 0 {
            let (id, known) = {
                let s = &self.running[index];
                (s.id, s.tokens.len())
            };
            if self.running[index].pending() == 0 {
                index += 1;
                continue;
            }
            if self.blocks.table(id).is_none() {
                let hit = self.prefix_hit(index);
                let empty = PrefixHit::default();
                let hit_ref = hit.as_ref().unwrap_or(&empty);
                let first_chunk =
                    (known - hit_ref.blocks.len() * self.blocks.block_size()).min(budget);
                if short_of_blocks || !self.can_start(id, known, hit_ref, first_chunk) {
                    if !short_of_blocks && self.blocks.used_blocks() == 0 {
                        // The whole pool is not enough: it would wait forever.
                        let needed = self.blocks.blocks_needed_after(hit_ref, known, first_chunk);
                        fail_one(
                            &mut self.running[index],
                            &format!(
                                "the sequence needs {needed} KV blocks; the pool has {}",
                                self.blocks.num_blocks()
                            ),
                        );
                        index += 1;
                        continue;
                    }
                    short_of_blocks = true;
                    returned.push(self.unschedule(index));
                    continue;
                }
                self.start_sequence(index, hit);
            }
            let (computed, pending) = {
                let s = &self.running[index];
                (s.computed, s.pending())
            };
            let chunk = pending.min(budget);
            if self.blocks.allocate_for(id, computed + chunk).is_err() {
                // Free the newest sequence and try again; if this is the
                // newest, it waits for blocks itself. (Only a started
                // sequence gets here: `can_start` checked the others.)
                short_of_blocks = true;
                let victim = self.running.len() - 1;
                returned.push(if self.blocks.table(self.running[victim].id).is_none() {
                    // It holds no blocks: nothing to preempt, it just waits.
                    self.unschedule(victim)
                } else {
                    self.preempt(victim)
                });
                if victim == index {
                    break;
                }
                continue;
            }
            let seq = &self.running[index];
            let reaches_end = computed + chunk == seq.tokens.len();
            let wants_prompt_rows = seq.prompt_logits || seq.wants_prompt_logprobs();
            let logits = if wants_prompt_rows && computed < seq.prompt_len {
                Logits::All
            } else if reaches_end {
                Logits::Last
            } else {
                Logits::None
            };
            let table = self
                .blocks
                .table(id)
                .map(|t| t.blocks())
                .unwrap_or_default();
            let sliding = self
                .blocks
                .sliding_table(id)
                .map(|t| t.blocks())
                .unwrap_or_default();
            let before = self.batch.logit_rows.len();
            self.batch.push_seq(
                &seq.tokens[computed..computed + chunk],
                computed,
                table,
                sliding,
                logits,
            );
            let added = self.batch.logit_rows.len() - before;
            for i in 0..added {
                // Only the chunk's last row, when it ends the known tokens, samples.
                let sampled = reaches_end && i + 1 == added;
                self.logit_owners.push((index, sampled));
            }
            self.scheduled.push((index, chunk));
            let seq = &mut self.running[index];
            if !std::mem::replace(&mut seq.scheduled_reported, true) {
                seq.sink.scheduled();
            }
            budget -= chunk;
            index += 1;
        }
        // Back to the front of the queue, oldest first (ids grow with
        // arrival): they were admitted before anything still waiting.
        returned.sort_unstable_by_key(|s| s.id);
        for seq in returned.into_iter().rev() {
            self.waiting.push_front(seq);
        }
    }

    /// Whether a sequence that has not started can start: whether the blocks
    /// for all of its tokens are free on top of those every started
    /// sequence (one holding blocks) needs to cache what it knows and its
    /// next token. Without
    /// that margin a sequence often starts only to be preempted (or to
    /// preempt others) a few steps later, and its work is thrown away.
    /// The blocks of `hit` are not needed anew, but those of them nobody
    /// references stop being available once taken. Sliding-window tables
    /// need only their window and a chunk (`first_chunk` tokens) at once.
    fn can_start(&self, id: SeqId, tokens: usize, hit: &PrefixHit, first_chunk: usize) -> bool {
        let reserved: usize = self
            .running
            .iter()
            .filter(|s| self.blocks.table(s.id).is_some())
            .map(|s| self.blocks.blocks_needed(s.id, s.tokens.len() + 1))
            .sum();
        debug_assert!(self.blocks.table(id).is_none());
        let new = self.blocks.blocks_needed_after(hit, tokens, first_chunk);
        new + self.blocks.unreferenced_in(hit) + reserved <= self.blocks.available_blocks()
    }

    /// The cached blocks running sequence `index` (not started) can start
    /// from. At least its last known token is computed, for the logits its
    /// next token is sampled from. A request reporting prompt logits or
    /// prompt log-probabilities needs every prompt row, so it skips the
    /// cache until they are reported (after a preemption it hits). `None`
    /// when the cache is not consulted.
    fn prefix_hit(&self, index: usize) -> Option<PrefixHit> {
        let seq = &self.running[index];
        if !self.blocks.prefix_caching() || seq.prompt_logits || seq.wants_prompt_logprobs() {
            return None;
        }
        let known = seq.tokens.len().saturating_sub(1);
        Some(self.blocks.lookup(seq.salt_root, &seq.tokens[..known]))
    }

    /// Gives running sequence `index` its table, starting with the blocks
    /// of `hit`, whose tokens then count as computed.
    fn start_sequence(&mut self, index: usize, hit: Option<PrefixHit>) {
        let seq = &mut self.running[index];
        if hit.is_some() {
            // Every known token but the last was looked up.
            self.counters
                .prefix_cache_queries
                .fetch_add(seq.tokens.len() as u64 - 1, Ordering::Relaxed);
        }
        let hit = hit.unwrap_or_default();
        let reused = hit.blocks.len() * self.blocks.block_size();
        self.blocks.start(seq.id, seq.salt_root, hit);
        seq.computed = reused;
        seq.cached_tokens.get_or_insert(reused);
        self.counters
            .prefix_cache_hits
            .fetch_add(reused as u64, Ordering::Relaxed);
    }

    /// Whether `seq`, a later choice of an `n > 1` request, is to wait for
    /// the choice computing the prompt: until that one samples its first
    /// token, when this one is forked from it (or, without room to fork,
    /// starts from the cached blocks it left).
    fn waits_for_leader(&self, seq: &Sequence) -> bool {
        let Some(leader) = seq.follows else {
            return false;
        };
        self.running
            .iter()
            .chain(self.waiting.iter())
            .find(|s| s.id == leader && s.finished.is_none())
            .is_some_and(|l| l.generated() == 0)
    }

    /// Takes running sequence `index` out of the running set, returning its
    /// blocks.
    fn unschedule(&mut self, index: usize) -> Sequence {
        let seq = self.running.remove(index);
        self.release(&seq);
        seq
    }

    /// Takes running sequence `index` out and frees its blocks; it is to be
    /// recomputed from scratch when it runs again.
    fn preempt(&mut self, index: usize) -> Sequence {
        let mut seq = self.unschedule(index);
        seq.computed = 0;
        self.counters.preemptions.fetch_add(1, Ordering::Relaxed);
        seq
    }

    /// Forward pass, sampling, events. Returns how many sequences sampled.
    fn run_model(&mut self) -> Result<usize, EngineError> {
        let Engine {
            backend,
            model,
            buffers,
            batch,
            blocks,
            running,
            waiting,
            logit_owners,
            scheduled,
            sampling,
            tokenizer,
            eos,
            limits,
            counters,
            ..
        } = self;
        let vocab = model.settings.vocab_size;
        let mut sampled = 0;
        let mut failure: Option<String> = None;
        // Later choices of `n > 1` requests that start from their leader's
        // blocks after this step, and the blocks to copy for them.
        let mut forks = Forks::with_room(limits.max_num_seqs.saturating_sub(running.len()));
        // The grammar masks of the constrained sequences that sample in this
        // step are computed beside the forward pass (they depend only on the
        // tokens so far), in parallel; only those sequences wait for them.
        let mut constraints: Vec<Option<(Constraint, Result<TokenMask, GrammarError>)>> =
            Vec::new();
        let to_mask: Vec<(usize, Constraint)> = logit_owners
            .iter()
            .filter(|&&(_, samples)| samples)
            .filter_map(|&(index, _)| Some((index, running[index].constraint.take()?)))
            .collect();
        let constrained: Vec<usize> = to_mask.iter().map(|&(index, _)| index).collect();
        let forward = std::thread::scope(|scope| {
            let mut masks = (!to_mask.is_empty()).then(|| {
                scope.spawn(move || {
                    to_mask
                        .into_par_iter()
                        .map(|(index, mut constraint)| {
                            let mask = constraint.mask();
                            (index, constraint, mask)
                        })
                        .collect::<Vec<_>>()
                })
            });
            let forward = model.forward(*backend, batch, buffers, &mut |first, count, values| {
                for row in 0..count {
                    let (index, samples) = logit_owners[first + row];
                    let logits = &values[row * vocab..(row + 1) * vocab];
                    let seq = &mut running[index];
                    let position = batch.positions[batch.logit_rows[first + row] as usize] as usize;
                    if seq.prompt_logits && position < seq.prompt_len {
                        seq.sink.send(Event::PromptLogits {
                            first: position,
                            values: logits.to_vec(),
                        });
                    }
                    report_prompt_logprob(seq, position, logits);
                    if !samples {
                        continue;
                    }
                    let mut mask = None;
                    if constrained.contains(&index) {
                        if let Some(handle) = masks.take() {
                            constraints.resize_with(running_len(&constrained), || None);
                            for (i, c, m) in handle.join().unwrap_or_default() {
                                constraints[i] = Some((c, m));
                            }
                        }
                        match constraints.get_mut(index).and_then(Option::take) {
                            Some((constraint, Ok(bits))) => {
                                seq.constraint = Some(constraint);
                                mask = Some(bits);
                            }
                            Some((_, Err(e))) => {
                                fail_one(seq, &format!("structured output: {e}"));
                                continue;
                            }
                            None => {
                                fail_one(seq, "structured output: the mask was not computed");
                                continue;
                            }
                        }
                    }
                    let text = (tokenizer.as_deref(), eos.as_slice(), limits.max_model_len);
                    match sample_into(seq, logits, mask.as_deref(), sampling, text) {
                        Ok(()) => {
                            sampled += 1;
                            if seq.generated() == 1 && seq.has_followers {
                                sampled += forks
                                    .fork_followers(seq, waiting, blocks, logits, sampling, text);
                            }
                        }
                        // The request's own settings left nothing to choose
                        // (a grammar and `min_tokens` at odds): it alone fails.
                        Err(SamplingError::AllTokensMasked) if mask.is_some() => fail_one(
                            seq,
                            "sampling failed: the grammar and min_tokens leave no token",
                        ),
                        Err(e) => failure = Some(format!("sampling failed: {e}")),
                    }
                }
            });
            // A forward pass that failed before any constrained row: the
            // masks are still out.
            if let Some(handle) = masks.take() {
                for (index, constraint, _) in handle.join().unwrap_or_default() {
                    running[index].constraint = Some(constraint);
                }
            }
            forward
        });
        // Constraints of rows the forward pass did not reach go back.
        for (index, slot) in constraints.into_iter().enumerate() {
            if let Some((constraint, _)) = slot {
                running[index].constraint = Some(constraint);
            }
        }
        forward?;
        // The forked choices' copies of their leader's partial blocks,
        // before anything writes to either again.
        if !forks.copies.is_empty() {
            backend
                .kv_copy_blocks(&mut buffers.kv, &forks.copies)
                .map_err(ModelError::from)?;
        }
        // The scheduled tokens are now in the cache.
        let mut prompt_tokens = 0;
        for &(index, chunk) in scheduled.iter() {
            let seq = &mut running[index];
            // Each prompt token counts once, not again when a preempted
            // sequence is recomputed.
            let prompt_done = (seq.computed + chunk).min(seq.prompt_len);
            prompt_tokens += prompt_done.saturating_sub(seq.prompt_counted);
            seq.prompt_counted = seq.prompt_counted.max(prompt_done);
            seq.computed += chunk;
            blocks.register_computed(seq.id, &seq.tokens, seq.computed);
            blocks.release_out_of_window(seq.id, seq.computed);
            if seq.computed >= seq.prompt_len {
                // Prompt logits are reported once, not again after a preemption.
                seq.prompt_logits = false;
            }
        }
        for id in forks.started {
            if let Some(at) = waiting.iter().position(|s| s.id == id)
                && let Some(seq) = waiting.remove(at)
            {
                blocks.release_out_of_window(seq.id, seq.computed);
                running.push(seq);
            }
        }
        counters
            .prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        counters
            .generation_tokens
            .fetch_add(sampled as u64, Ordering::Relaxed);
        if let Some(message) = failure {
            for seq in running.iter_mut() {
                seq.sink.send(Event::Failed {
                    message: message.clone(),
                });
                seq.finished = Some(FinishReason::Aborted);
            }
        }
        Ok(sampled)
    }

    /// Queues one request as `sinks.len()` choices (n > 1, best_of): choice
    /// j's events go to sinks[j]; when the request is seeded, choice j
    /// samples with seed `seed.wrapping_add(j)` (vLLM's rule), so `n = 4,
    /// seed = s` equals four requests seeded s, s+1, s+2, s+3.
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
        if sinks.len() > 1 && self.buffers.state.is_some() {
            // Forked choices copy KV blocks, not the recurrent state.
            return Err(AdmissionError::ChoicesWithRecurrentState { n: sinks.len() });
        }
        let mut ids: Vec<SeqId> = Vec::with_capacity(sinks.len());
        for (j, sink) in sinks.into_iter().enumerate() {
            let mut choice = request.clone();
            if let Some(seed) = choice.params.seed {
                choice.params.seed = Some(seed.wrapping_add(j as u64));
            }
            let id = match self.add_request(choice, sink) {
                Ok(id) => id,
                Err(e) => {
                    // All or none: the choices queued before this one go.
                    ids.iter().for_each(|&id| self.abort(id));
                    return Err(e);
                }
            };
            if let (Some(&leader), Some(seq)) = (ids.first(), self.waiting.back_mut()) {
                seq.follows = Some(leader);
            }
            if ids.len() == 1
                && let Some(first) = self.waiting.iter_mut().rev().find(|s| s.id == ids[0])
            {
                first.has_followers = true;
            }
            ids.push(id);
        }
        Ok(ids)
    }
}

/// The choices forked from their leaders in one step.
struct Forks {
    /// Sequences that can still join the running set.
    room: usize,
    /// `(from, to)` blocks to copy after the forward pass.
    copies: Vec<(u32, u32)>,
    /// Waiting choices that now hold tables and move to the running set.
    started: Vec<SeqId>,
}

impl Forks {
    fn with_room(room: usize) -> Forks {
        Forks {
            room,
            copies: Vec::new(),
            started: Vec::new(),
        }
    }

    /// Forks the waiting choices that follow `leader`, which just sampled
    /// its first token from `logits` (so its prompt is in the cache): each
    /// samples its own first token from the same row and takes the
    /// leader's blocks, while there is room. Returns how many sampled.
    fn fork_followers(
        &mut self,
        leader: &Sequence,
        waiting: &mut VecDeque<Sequence>,
        blocks: &mut BlockAllocator,
        logits: &[f32],
        sampling: &mut SamplingWorkspace,
        text: TextRules<'_>,
    ) -> usize {
        let mut sampled = 0;
        for seq in waiting.iter_mut() {
            if self.started.len() >= self.room {
                break;
            }
            let forkable = seq.follows == Some(leader.id)
                && seq.finished.is_none()
                && seq.constraint.is_none()
                && !seq.prompt_logits
                && !seq.wants_prompt_logprobs()
                && blocks.table(seq.id).is_none();
            if !forkable {
                continue;
            }
            let Ok(copies) = blocks.fork(leader.id, seq.id, seq.prompt_len) else {
                // No block for the copy: it starts from the cache later.
                continue;
            };
            self.copies.extend(copies);
            self.started.push(seq.id);
            seq.computed = seq.prompt_len;
            seq.prompt_counted = seq.prompt_len;
            seq.cached_tokens.get_or_insert(seq.prompt_len);
            if !std::mem::replace(&mut seq.scheduled_reported, true) {
                seq.sink.scheduled();
            }
            match sample_into(seq, logits, None, sampling, text) {
                Ok(()) => sampled += 1,
                Err(e) => fail_one(seq, &format!("sampling failed: {e}")),
            }
        }
        sampled
    }
}

/// What accepting a token needs besides the sequence: the tokenizer (for
/// its text), the end-of-sequence ids and `max_model_len`.
type TextRules<'a> = (Option<&'a Tokenizer>, &'a [u32], usize);

/// Samples `seq`'s next token from its logits `row` (only `allowed` ids,
/// when given) and appends it.
fn sample_into(
    seq: &mut Sequence,
    row: &[f32],
    allowed: Option<&[u32]>,
    sampling: &mut SamplingWorkspace,
    (tokenizer, eos, max_model_len): TextRules<'_>,
) -> Result<(), SamplingError> {
    let token = seq.sampler.sample_masked(row, allowed, sampling)?;
    // From the raw row, before any processing (vLLM's default).
    let logprob = seq.logprobs.sampled.map(|n| token_logprob(row, token, n));
    accept_token(seq, token, logprob, tokenizer, eos, max_model_len);
    Ok(())
}

/// One past the largest running index among `indices`.
fn running_len(indices: &[usize]) -> usize {
    indices.iter().max().map_or(0, |&i| i + 1)
}

/// Ends one sequence with a failure (the others go on).
fn fail_one(seq: &mut Sequence, message: &str) {
    seq.sink.send(Event::Failed {
        message: message.to_string(),
    });
    seq.finished = Some(FinishReason::Aborted);
}

/// Reports the log-probability of the prompt token after `position`, whose
/// logits `row` holds, if the request asked for it and it was not reported
/// before: the row is reduced here and nothing of it is kept.
fn report_prompt_logprob(seq: &mut Sequence, position: usize, row: &[f32]) {
    let Some(n) = seq.logprobs.prompt else {
        return;
    };
    let next = position + 1;
    if next < seq.prompt_len && next == seq.prompt_logprobs_next {
        let logprob = token_logprob(row, seq.tokens[next], n);
        seq.prompt_logprobs_next = next + 1;
        seq.sink.send(Event::PromptLogprob {
            position: next,
            logprob,
        });
    }
}

/// Appends a sampled token, emits its text, and decides whether the
/// sequence is done.
fn accept_token(
    seq: &mut Sequence,
    token: u32,
    logprob: Option<TokenLogprob>,
    tokenizer: Option<&Tokenizer>,
    eos: &[u32],
    max_model_len: usize,
) {
    seq.tokens.push(token);
    let stop_token = seq.params.stop_token_ids.contains(&token);
    if (!seq.ignore_eos && eos.contains(&token)) || stop_token {
        seq.stop_logprob = logprob;
        // The token that ended the text is not part of it, unless asked for.
        if stop_token && seq.params.include_stop_str_in_output {
            let (text, hidden, _) = match (&mut seq.text, tokenizer) {
                (Some(state), Some(t)) => state.push(t, token).unwrap_or_default(),
                _ => (String::new(), None, false),
            };
            seq.sink.send(Event::Token {
                id: token,
                text,
                logprob: seq.stop_logprob.take(),
                hidden,
            });
        }
        seq.finished = Some(FinishReason::Stop);
        return;
    }
    let mut grammar_done = false;
    if let Some(constraint) = &mut seq.constraint {
        if let Err(e) = constraint.consume(token) {
            fail_one(seq, &format!("structured output: {e}"));
            return;
        }
        grammar_done = constraint.is_finished();
    }
    let (text, hidden, stopped) = match (&mut seq.text, tokenizer) {
        (Some(state), Some(t)) => state.push(t, token).unwrap_or_default(),
        _ => (String::new(), None, false),
    };
    if !seq.sink.send(Event::Token {
        id: token,
        text,
        logprob,
        hidden,
    }) {
        seq.finished = Some(FinishReason::Aborted);
    } else if stopped || grammar_done {
        seq.finished = Some(FinishReason::Stop);
    } else if seq.generated() >= seq.params.max_tokens || seq.tokens.len() >= max_model_len {
        seq.finished = Some(FinishReason::Length);
    }
}
