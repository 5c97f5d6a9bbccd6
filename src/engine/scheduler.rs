//! The scheduling policy: which sequences run, which of their tokens each
//! step computes, where their keys go. Pure bookkeeping over the KV block
//! allocator; it fills a [`StepPlan`] and knows nothing of the model or of
//! sampling.
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
//! tokens (`kv_blocks`) and computes only the rest. After each step
//! ([`Scheduler::apply`]) the blocks that became full are registered and
//! sliding-window blocks that left the window are released.
//!
//! `n > 1`: the later choices of a request wait in the queue until the
//! first (their leader) reaches the end of its prompt; in that step they
//! are forked from its blocks (full blocks shared, the partial last one
//! copied after the forward pass) and sample their first token from its
//! logits row ([`super::step_plan::Fork`]).
//!
//! Recurrent state (models with Gated DeltaNet layers): a sequence holds a
//! slot of the state pool while it holds blocks; the pool has one per
//! sequence `max_num_seqs` allows, so a starting sequence always finds one.
//! A forked choice gets a slot and a copy of its leader's. A cached prefix
//! is reused only up to a block boundary whose state was kept
//! ([`super::state_cache`]): a sequence starting there has the snapshot
//! copied into its slot before the step. Snapshots are taken, as state saves
//! of the step's rows, at the prompt's last full block (a resent prompt,
//! or the next `n > 1` choice, starts there), every
//! `snapshot_interval` prompt positions (requests that share only the first
//! part of a long prompt), and at the last block boundary a sequence
//! decoded past (its rolling snapshot, registered when it finishes: the
//! next turn of a conversation resends this one's prompt and answer).
//!
//! Speculative decoding ([`super::drafts`]): a decoding sequence's chunk
//! may carry draft tokens after its known one, as long as the step's
//! budget, its `max_tokens`, the context and the KV blocks allow (never
//! preempting anything for them). Once the output stage has kept some of
//! them, [`Scheduler::settle_drafts`] rolls a hybrid model's state back to
//! the last kept row (the step saved the state after each verify row in the
//! sequence's verify slots) and [`Scheduler::apply`] counts only the kept
//! rows as computed: the rejected rows' keys are overwritten later.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::counters::{EngineCounters, EngineLimits};
use super::drafts::Proposer;
use super::kv_blocks::{BlockAllocator, KvBlocksError, PrefixHit};
use super::request::{FinishReason, SeqId};
use super::sequence::{Rolling, Sequence};
use super::state_cache::StateCache;
use super::step_plan::{ChunkKind, Fork, LogitRow, RowRole, ScheduledChunk, StepPlan};
use crate::step::{Logits, StateSave};

pub(crate) struct Scheduler {
    limits: EngineLimits,
    blocks: BlockAllocator,
    /// Recurrent-state slots no sequence holds (popped from the end).
    free_slots: Vec<u32>,
    /// The snapshot slots after them.
    states: StateCache,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    counters: Arc<EngineCounters>,
    /// Speculative decoding's proposer (`None`: off).
    proposer: Option<Proposer>,
    /// The first of the recurrent-state pool's verify slots (after the live
    /// and snapshot slots; `k` per live slot).
    verify_base: u32,
    /// A chunk's known token and drafts, put together (capacity kept).
    draft_rows: Vec<u32>,
}

impl Scheduler {
    pub fn new(limits: EngineLimits, counters: Arc<EngineCounters>) -> Result<Self, KvBlocksError> {
        let blocks = BlockAllocator::new(limits.kv_blocks, limits.kv_block_size)?
            .with_prefix_caching(limits.prefix_caching)
            .with_sliding_window(limits.sliding_window);
        let free_slots = (0..limits.state_slots as u32).rev().collect();
        let snapshots = if limits.prefix_caching {
            limits.snapshot_slots
        } else {
            0
        };
        let states = StateCache::new(limits.state_slots as u32, snapshots);
        Ok(Scheduler {
            blocks,
            free_slots,
            states,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters,
            proposer: limits.speculative.map(|c| Proposer::new(&c)),
            verify_base: (limits.state_slots + limits.snapshot_slots) as u32,
            draft_rows: Vec::with_capacity(1 + crate::plan::speculative::MAX_SPECULATIVE_TOKENS),
            limits,
        })
    }

    /// An empty plan with room for the largest step these limits allow.
    pub fn plan_capacity(&self) -> StepPlan {
        let l = &self.limits;
        StepPlan::with_capacity(
            l.max_num_batched_tokens,
            l.max_num_seqs,
            l.max_model_len.div_ceil(l.kv_block_size),
        )
    }

    pub fn limits(&self) -> &EngineLimits {
        &self.limits
    }

    pub fn blocks(&self) -> &BlockAllocator {
        &self.blocks
    }

    /// Recurrent-state snapshots the prefix cache holds.
    pub fn state_snapshots(&self) -> usize {
        self.states.cached()
    }

    /// Checks the block and snapshot books (tests).
    pub fn audit(&self) -> Result<(), String> {
        self.blocks.audit()?;
        self.states.audit()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// The running set, in the order the current plan's indices refer to.
    pub fn running_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    /// Queues the choices of one request: the first computes the prompt,
    /// the others follow it (forked when it reaches the end of its prompt).
    pub fn add_group(&mut self, mut choices: Vec<Sequence>) {
        let leader = choices.first().map(|s| s.id);
        if choices.len() > 1
            && let Some(first) = choices.first_mut()
        {
            first.has_followers = true;
        }
        for (j, mut seq) in choices.drain(..).enumerate() {
            if j > 0 {
                seq.follows = leader;
            }
            self.waiting.push_back(seq);
        }
    }

    /// Cancels a request; it leaves at the next step.
    pub fn abort(&mut self, id: SeqId) {
        for seq in self.running.iter_mut().chain(self.waiting.iter_mut()) {
            if seq.id == id && seq.finished.is_none() {
                seq.finished = Some(FinishReason::Aborted);
            }
        }
    }

    /// Ends every request with `message`; they leave at the next step.
    pub fn fail_all(&mut self, message: &str) {
        for seq in self.running.iter_mut().chain(self.waiting.iter_mut()) {
            if seq.finished.is_none() {
                seq.fail(message);
            }
        }
    }

    /// Ends every running sequence with `message` (a step's sampling
    /// failed for reasons no request chose).
    pub fn fail_running(&mut self, message: &str) {
        for seq in self.running.iter_mut() {
            seq.fail(message);
        }
    }

    /// Takes out the finished sequences (and those whose client left),
    /// freeing their blocks; the caller tells their clients.
    pub fn retire_finished(&mut self) -> Vec<Sequence> {
        for seq in self.running.iter_mut().chain(self.waiting.iter_mut()) {
            if seq.finished.is_none() && seq.sink.is_closed() {
                seq.finished = Some(FinishReason::Aborted);
            }
        }
        let mut done = Vec::new();
        let mut index = 0;
        while index < self.running.len() {
            if self.running[index].finished.is_some() {
                let mut seq = self.running.remove(index);
                self.keep_rolling(&mut seq);
                self.release(&mut seq);
                done.push(seq);
            } else {
                index += 1;
            }
        }
        let (finished, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|s| s.finished.is_some());
        self.waiting = waiting.into();
        // A waiting sequence holds no blocks (freeing none is harmless).
        for mut seq in finished {
            self.release(&mut seq);
            done.push(seq);
        }
        done
    }

    /// Moves waiting sequences into the running set while there is room.
    pub fn admit(&mut self) {
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

    /// Fills `plan` for the next step, oldest sequence first, preempting the
    /// newest when KV blocks run out; then forks the choices whose leader
    /// reaches the end of its prompt in this step.
    pub fn schedule(&mut self, plan: &mut StepPlan) {
        plan.clear();
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
                let (hit, snapshot) = self.prefix_hit(index);
                let empty = PrefixHit::default();
                let hit_ref = hit.as_ref().unwrap_or(&empty);
                let first_chunk =
                    (known - hit_ref.blocks.len() * self.blocks.block_size()).min(budget);
                if short_of_blocks || !self.can_start(id, known, hit_ref, first_chunk) {
                    if !short_of_blocks && self.blocks.used_blocks() == 0 {
                        // The whole pool is not enough: it would wait forever.
                        let needed = self.blocks.blocks_needed_after(hit_ref, known, first_chunk);
                        self.running[index].fail(&format!(
                            "the sequence needs {needed} KV blocks; the pool has {}",
                            self.blocks.num_blocks()
                        ));
                        index += 1;
                        continue;
                    }
                    short_of_blocks = true;
                    returned.push(self.unschedule(index));
                    continue;
                }
                self.start_sequence(index, hit);
                if let (Some(from), Some(to)) = (snapshot, self.running[index].state_slot) {
                    plan.state_restores.push((from, to));
                }
            }
            let (computed, pending) = {
                let s = &self.running[index];
                (s.computed, s.pending())
            };
            let chunk = pending.min(budget);
            let mut drafts = self.draft(index, budget);
            if drafts > 0
                && self
                    .blocks
                    .allocate_for(id, computed + chunk + drafts)
                    .is_err()
            {
                // No blocks for the drafts: decode without them rather
                // than preempt anything for a guess.
                self.running[index].drafts.end();
                drafts = 0;
            }
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
            self.reserve_lookahead(index, computed + chunk + drafts);
            self.push_chunk(plan, index, chunk);
            if drafts > 0 {
                self.plan_verify_saves(plan, index, drafts);
            } else {
                self.plan_snapshots(plan, index, chunk);
            }
            self.running[index].report_scheduled();
            budget -= chunk + drafts;
            index += 1;
        }
        // Back to the front of the queue, oldest first (ids grow with
        // arrival): they were admitted before anything still waiting.
        returned.sort_unstable_by_key(|s| s.id);
        for seq in returned.into_iter().rev() {
            self.waiting.push_front(seq);
        }
        self.fork_choices(plan);
    }

    /// Adds `chunk` tokens of running sequence `index` (its blocks already
    /// allocated), followed by its drafts if it has any, to the plan, with
    /// the logits rows it needs.
    fn push_chunk(&mut self, plan: &mut StepPlan, index: usize, chunk: usize) {
        let mut draft_rows = std::mem::take(&mut self.draft_rows);
        let seq = &self.running[index];
        let computed = seq.computed;
        let drafts = seq.drafts.tokens.len();
        let reaches_end = computed + chunk == seq.tokens.len();
        let wants_prompt_rows = seq.prompt_logits || seq.wants_prompt_logprobs();
        let logits = if wants_prompt_rows && computed < seq.prompt_len {
            Logits::All
        } else if drafts > 0 {
            // Every verify row is sampled, while the drafts before it hold.
            Logits::All
        } else if reaches_end {
            Logits::Last
        } else {
            Logits::None
        };
        let table = self
            .blocks
            .table(seq.id)
            .map(|t| t.blocks())
            .unwrap_or_default();
        let sliding = self
            .blocks
            .sliding_table(seq.id)
            .map(|t| t.blocks())
            .unwrap_or_default();
        let known = &seq.tokens[computed..computed + chunk];
        let rows = if drafts > 0 {
            draft_rows.clear();
            draft_rows.extend_from_slice(known);
            draft_rows.extend_from_slice(&seq.drafts.tokens);
            &draft_rows[..]
        } else {
            known
        };
        let before = plan.batch.logit_rows.len();
        plan.batch.push_seq(rows, computed, table, sliding, logits);
        if let Some(slot) = seq.state_slot {
            plan.batch.set_state_slot(plan.batch.seqs.len() - 1, slot);
        }
        let added = plan.batch.logit_rows.len() - before;
        for i in 0..added {
            let row = plan.batch.logit_rows[before + i] as usize;
            let role = if drafts > 0 {
                // The known token's row samples as a decode row would; the
                // drafts' rows verify.
                if i == 0 {
                    RowRole::Sample
                } else {
                    RowRole::Verify
                }
            } else if reaches_end && i + 1 == added {
                // Only the chunk's last row, when it ends the known tokens, samples.
                RowRole::Sample
            } else {
                RowRole::Report
            };
            plan.logit_rows.push(LogitRow {
                seq: index,
                position: plan.batch.positions[row] as usize,
                role,
            });
        }
        let decode = chunk == 1 && reaches_end && computed >= seq.prompt_len;
        plan.chunks.push(ScheduledChunk {
            seq: index,
            id: seq.id,
            computed,
            len: chunk + drafts,
            kind: if decode {
                ChunkKind::Decode
            } else {
                ChunkKind::Prefill
            },
            drafts,
        });
        self.draft_rows = draft_rows;
    }

    /// Proposes the drafts of running sequence `index` for this step, into
    /// its `drafts` (speculative decoding): only a decoding sequence drafts,
    /// at most `k`, no more than the step's `budget` after its known token,
    /// its `max_tokens` and the context leave room to keep, and not while
    /// it backs off from failed drafts. Returns how many.
    fn draft(&mut self, index: usize, budget: usize) -> usize {
        let Some(proposer) = self.proposer else {
            return 0;
        };
        let max_model_len = self.limits.max_model_len;
        let seq = &mut self.running[index];
        seq.drafts.end();
        if seq.pending() != 1 || seq.computed < seq.prompt_len || seq.finished.is_some() {
            return 0;
        }
        // The step appends at most drafts + 1 tokens.
        let room = (seq.params.max_tokens.saturating_sub(seq.generated()))
            .min(max_model_len.saturating_sub(seq.tokens.len()))
            .saturating_sub(1);
        let limit = proposer.k().min(budget.saturating_sub(1)).min(room);
        if limit == 0 {
            return 0;
        }
        if !seq.drafts.backoff.allows(&seq.tokens) {
            // Prompt lookup costs a scan, no model pass: what it would
            // draft is the back-off's shadow draft (an MTP head's drafts
            // are not made while backing off).
            if let Proposer::Ngram(ngram) = proposer
                && seq.drafts.backoff.wants_shadow()
            {
                ngram.propose(&seq.tokens, limit, &mut seq.drafts.tokens);
                seq.drafts
                    .backoff
                    .shadow(seq.tokens.len(), &seq.drafts.tokens);
                seq.drafts.end();
            }
            return 0;
        }
        proposer.propose(&seq.tokens, limit, &mut seq.drafts);
        seq.drafts.begin();
        seq.drafts.tokens.len()
    }

    /// Blocks for the positions an MTP head's later passes write after a
    /// chunk that ends at `end` tokens and reaches the sequence's known end
    /// (`Proposer::lookahead`), within `max_model_len`; best effort: where
    /// there are none, that step's drafts stop short (`engine::mtp`).
    fn reserve_lookahead(&mut self, index: usize, end: usize) {
        let Some(proposer) = self.proposer else {
            return;
        };
        let seq = &self.running[index];
        let extra = proposer.lookahead();
        if extra == 0 || end < seq.tokens.len() {
            return;
        }
        let total = (end + extra).min(self.limits.max_model_len);
        // Taken only with a block to spare for every running sequence's
        // next token: not having them costs drafts, never a preemption.
        let needed = self.blocks.blocks_needed(seq.id, total);
        if needed > 0 && needed + self.running.len() <= self.blocks.available_blocks() {
            let _ = self.blocks.allocate_for(seq.id, total);
        }
    }

    /// Slot `j` of the verify slots of live slot `live`.
    fn verify_slot(&self, live: u32, j: usize) -> u32 {
        let k = self.proposer.map_or(0, |p| p.k()) as u32;
        self.verify_base + live * k + j as u32
    }

    /// The state saves of a chunk with `drafts` drafts just pushed for
    /// running sequence `index` (hybrid models): the state after each row
    /// but the last, into the sequence's verify slots.
    fn plan_verify_saves(&mut self, plan: &mut StepPlan, index: usize, drafts: usize) {
        let Some(live) = self.running[index].state_slot else {
            return;
        };
        let batch_seq = plan.batch.seqs.len() - 1;
        let first_row = plan.batch.seqs[batch_seq].start;
        for j in 0..drafts {
            plan.batch.state_saves.push(StateSave {
                seq: batch_seq as u32,
                row: first_row + j as u32,
                slot: self.verify_slot(live, j),
            });
        }
    }

    /// Once the output stage has verified the step's drafts: counts them,
    /// tells each sequence's back-off, and on hybrid models plans the state
    /// copies ([`StepPlan::state_settles`]) that roll a partly rejected
    /// draft's state back to its last kept row and move a rolling snapshot
    /// crossed by the kept rows into its slot.
    pub fn settle_drafts(&mut self, plan: &mut StepPlan) {
        let bs = self.blocks.block_size();
        for i in 0..plan.chunks.len() {
            let chunk = plan.chunks[i];
            if chunk.drafts == 0 {
                continue;
            }
            let (m, c) = (chunk.drafts, chunk.computed);
            let seq = &self.running[chunk.seq];
            let (a, live, rolling) = (seq.drafts.accepted, seq.state_slot, seq.rolling);
            let counters = &self.counters;
            counters.spec_drafts.fetch_add(1, Ordering::Relaxed);
            counters
                .spec_draft_tokens
                .fetch_add(m as u64, Ordering::Relaxed);
            counters
                .spec_accepted_tokens
                .fetch_add(a as u64, Ordering::Relaxed);
            for position in &counters.spec_accepted_per_position[..a] {
                position.fetch_add(1, Ordering::Relaxed);
            }
            self.running[chunk.seq].drafts.backoff.record(a);
            let Some(live) = live else {
                continue;
            };
            // Rows 0..=a are kept: the state is the one after row a.
            let boundary = (c + 1 + a) / bs * bs;
            if self.states.enabled() && boundary > c {
                let row = boundary - 1 - c;
                let from = if row == m {
                    live
                } else {
                    self.verify_slot(live, row)
                };
                if let Some(slot) = rolling.map(|r| r.slot).or_else(|| self.states.take()) {
                    plan.state_settles.push((from, slot));
                    self.running[chunk.seq].rolling = Some(Rolling {
                        position: boundary,
                        slot,
                    });
                }
            }
            if a < m {
                plan.state_settles.push((self.verify_slot(live, a), live));
            }
        }
    }

    /// The state saves of the chunk just pushed for running sequence
    /// `index` (models with snapshot slots): at the block boundaries it
    /// crosses that the policy keeps (see the module's notes), each into a
    /// slot taken from the cache, and its rolling snapshot when it decodes
    /// past a boundary. Boundaries already cached are only marked used; when
    /// every slot is held, none is taken.
    fn plan_snapshots(&mut self, plan: &mut StepPlan, index: usize, chunk: usize) {
        if !self.states.enabled() || self.running[index].state_slot.is_none() {
            return;
        }
        let Some(scheduled) = plan.chunks.last().copied() else {
            return;
        };
        let batch_seq = plan.batch.seqs.len() as u32 - 1;
        let first_row = plan.batch.seqs[batch_seq as usize].start as usize;
        let (c, bs) = (scheduled.computed, self.blocks.block_size());
        let seq = &self.running[index];
        let save_at = |position: usize| StateSave {
            seq: batch_seq,
            // The row of position `position − 1`: the state after it.
            row: (first_row + position - 1 - c) as u32,
            slot: 0,
        };
        if scheduled.kind == ChunkKind::Decode {
            let end = c + chunk;
            if !end.is_multiple_of(bs) {
                return;
            }
            let slot = match seq.rolling {
                Some(rolling) => Some(rolling.slot),
                None => self.states.take(),
            };
            if let Some(slot) = slot {
                plan.batch.state_saves.push(StateSave {
                    slot,
                    ..save_at(end)
                });
                self.running[index].rolling = Some(Rolling {
                    position: end,
                    slot,
                });
            }
            return;
        }
        // The prompt's last full block before its last token (a later
        // request computes at least that token), and every interval.
        let last_block = (seq.prompt_len - 1) / bs * bs;
        let interval = self.limits.snapshot_interval;
        // Planning a step allocates nothing: the positions are iterated.
        let every_interval = c
            .checked_div(interval)
            .into_iter()
            .flat_map(|first| (first + 1..).map(move |k| k * interval))
            .take_while(|&p| p <= c + chunk);
        let on_an_interval = interval > 0 && last_block.is_multiple_of(interval);
        let last =
            (last_block > c && last_block <= c + chunk && !on_an_interval).then_some(last_block);
        for position in every_interval.chain(last) {
            let Some(hash) = self.blocks.chain_hash(seq.id, &seq.tokens, position / bs) else {
                continue;
            };
            if self.states.get(hash).is_some() || plan.snapshots.iter().any(|&(_, h)| h == hash) {
                self.states.touch(hash);
                continue;
            }
            let Some(slot) = self.states.take() else {
                break;
            };
            plan.batch.state_saves.push(StateSave {
                slot,
                ..save_at(position)
            });
            plan.snapshots.push((slot, hash));
            self.counters
                .state_snapshots_taken
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Registers a finishing sequence's rolling snapshot (if it ended as
    /// asked, not aborted) under the hash of the block it ends; its slot is
    /// given back otherwise.
    fn keep_rolling(&mut self, seq: &mut Sequence) {
        let Some(rolling) = seq.rolling.take() else {
            return;
        };
        let blocks = rolling.position / self.blocks.block_size();
        let hash = (seq.finished != Some(FinishReason::Aborted))
            .then(|| self.blocks.chain_hash(seq.id, &seq.tokens, blocks))
            .flatten();
        match hash {
            Some(hash) => self.states.register(rolling.slot, hash),
            None => self.states.release(rolling.slot),
        }
    }

    /// Gives back the snapshot slots of a plan whose step failed (its
    /// saves never happened).
    pub fn abandon(&mut self, plan: &StepPlan) {
        for &(slot, _) in &plan.snapshots {
            self.states.release(slot);
        }
        for chunk in &plan.chunks {
            self.running[chunk.seq].drafts.end();
        }
    }

    /// Forks the waiting choices whose leader samples its first token in
    /// this step (so its prompt will be in the cache), while there is room
    /// for them and a block for each partial copy. A choice that needs every
    /// prompt row or a grammar mask is not forked: it starts later from the
    /// cached blocks.
    fn fork_choices(&mut self, plan: &mut StepPlan) {
        let mut room = self.limits.max_num_seqs.saturating_sub(self.running.len());
        let leaders: Vec<usize> = plan
            .logit_rows
            .iter()
            .filter(|row| row.role == RowRole::Sample)
            .map(|row| row.seq)
            .filter(|&i| self.running[i].has_followers && self.running[i].generated() == 0)
            .collect();
        for leader in leaders {
            let (leader_id, prompt_len) =
                (self.running[leader].id, self.running[leader].prompt_len);
            let mut at = 0;
            while at < self.waiting.len() && room > 0 {
                let seq = &self.waiting[at];
                let forkable = seq.follows == Some(leader_id)
                    && seq.finished.is_none()
                    && seq.constraint.is_none()
                    && !seq.prompt_logits
                    && !seq.wants_prompt_logprobs()
                    && self.blocks.table(seq.id).is_none();
                if !forkable {
                    at += 1;
                    continue;
                }
                let leader_slot = self.running[leader].state_slot;
                if leader_slot.is_some() && self.free_slots.is_empty() {
                    break;
                }
                let Ok(copies) = self.blocks.fork(leader_id, seq.id, prompt_len) else {
                    // No block for the copy: it starts from the cache later.
                    at += 1;
                    continue;
                };
                let Some(mut seq) = self.waiting.remove(at) else {
                    break;
                };
                plan.kv_copies.extend(copies);
                if let Some(from) = leader_slot {
                    let to = self.free_slots.pop();
                    seq.state_slot = to;
                    plan.state_copies.extend(to.map(|to| (from, to)));
                }
                seq.computed = prompt_len;
                seq.prompt_counted = prompt_len;
                seq.cached_tokens.get_or_insert(prompt_len);
                seq.report_scheduled();
                self.running.push(seq);
                plan.forks.push(Fork {
                    leader,
                    choice: self.running.len() - 1,
                });
                room -= 1;
            }
        }
    }

    /// Advances the sequences of `plan` once its step ran: the scheduled
    /// tokens are in the cache, the blocks that became full are registered,
    /// and sliding-window blocks that left the window are released.
    pub fn apply(&mut self, plan: &StepPlan) {
        let mut prompt_tokens = 0;
        for chunk in &plan.chunks {
            let seq = &mut self.running[chunk.seq];
            // Each prompt token counts once, not again when a preempted
            // sequence is recomputed.
            let prompt_done = (seq.computed + chunk.len).min(seq.prompt_len);
            prompt_tokens += prompt_done.saturating_sub(seq.prompt_counted);
            seq.prompt_counted = seq.prompt_counted.max(prompt_done);
            // A chunk with drafts computed its known token and the drafts
            // kept; the rest are overwritten later.
            let kept = match chunk.drafts {
                0 => chunk.len,
                _ => 1 + seq.drafts.accepted,
            };
            seq.drafts.end();
            seq.computed += kept;
            self.blocks
                .register_computed(seq.id, &seq.tokens, seq.computed);
            self.blocks.release_out_of_window(seq.id, seq.computed);
            if seq.computed >= seq.prompt_len {
                // Prompt logits are reported once, not again after a preemption.
                seq.prompt_logits = false;
            }
        }
        for fork in &plan.forks {
            let seq = &self.running[fork.choice];
            self.blocks.release_out_of_window(seq.id, seq.computed);
        }
        for &(slot, hash) in &plan.snapshots {
            self.states.register(slot, hash);
        }
        self.counters
            .prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
    }

    /// Whether a sequence that has not started can start: whether the blocks
    /// for all of its tokens are free on top of those every started
    /// sequence (one holding blocks) needs to cache what it knows and its
    /// next token. Without that margin a sequence often starts only to be
    /// preempted (or to preempt others) a few steps later, and its work is
    /// thrown away. The blocks of `hit` are not needed anew, but those of
    /// them nobody references stop being available once taken.
    /// Sliding-window tables need only their window and a chunk
    /// (`first_chunk` tokens) at once.
    fn can_start(&self, id: SeqId, tokens: usize, hit: &PrefixHit, first_chunk: usize) -> bool {
        let reserved: usize = self
            .running
            .iter()
            .filter(|s| self.blocks.table(s.id).is_some())
            .map(|s| self.blocks.blocks_needed(s.id, s.tokens.len() + 1))
            .sum();
        debug_assert!(self.blocks.table(id).is_none());
        let new = self.blocks.blocks_needed_after(hit, tokens, first_chunk);
        let slot_free = self.limits.state_slots == 0 || !self.free_slots.is_empty();
        slot_free
            && new + self.blocks.unreferenced_in(hit) + reserved <= self.blocks.available_blocks()
    }

    /// The cached blocks running sequence `index` (not started) can start
    /// from, and on a model with recurrent state the snapshot slot holding
    /// the state at their end (the hit is cut back to the deepest boundary
    /// with one). At least its last known token is computed, for the logits
    /// its next token is sampled from. A request reporting prompt logits or
    /// prompt log-probabilities needs every prompt row, so it skips the
    /// cache until they are reported (after a preemption it hits). `None`
    /// when the cache is not consulted.
    fn prefix_hit(&self, index: usize) -> (Option<PrefixHit>, Option<u32>) {
        let seq = &self.running[index];
        let has_state = self.limits.state_slots > 0;
        if !self.blocks.prefix_caching()
            || (has_state && !self.states.enabled())
            || seq.prompt_logits
            || seq.wants_prompt_logprobs()
        {
            return (None, None);
        }
        let known = seq.tokens.len().saturating_sub(1);
        let mut hit = self.blocks.lookup(seq.salt_root, &seq.tokens[..known]);
        if !has_state {
            return (Some(hit), None);
        }
        // Hybrid models with sliding-window layers too do not exist; their
        // hit would need its window trimmed again.
        let deepest = (1..=hit.hashes.len())
            .rev()
            .find_map(|n| self.states.get(hit.hashes[n - 1]).map(|slot| (n, slot)));
        let Some((n, slot)) = deepest.filter(|_| hit.sliding.is_empty()) else {
            return (Some(PrefixHit::default()), None);
        };
        hit.blocks.truncate(n);
        hit.hashes.truncate(n);
        (Some(hit), Some(slot))
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
        if let Some(&last) = hit.hashes.last() {
            self.states.touch(last);
        }
        let reused = hit.blocks.len() * self.blocks.block_size();
        self.blocks.start(seq.id, seq.salt_root, hit);
        if self.limits.state_slots > 0 {
            // `can_start` saw one free.
            seq.state_slot = self.free_slots.pop();
        }
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
        let mut seq = self.running.remove(index);
        self.release(&mut seq);
        seq
    }

    /// Frees a sequence's blocks, its state slot and its rolling snapshot.
    fn release(&mut self, seq: &mut Sequence) {
        self.blocks.free(seq.id);
        if let Some(slot) = seq.state_slot.take() {
            self.free_slots.push(slot);
        }
        if let Some(rolling) = seq.rolling.take() {
            self.states.release(rolling.slot);
        }
    }

    /// Takes running sequence `index` out and frees its blocks; it is to be
    /// recomputed from scratch when it runs again.
    fn preempt(&mut self, index: usize) -> Sequence {
        let mut seq = self.unschedule(index);
        seq.computed = 0;
        self.counters.preemptions.fetch_add(1, Ordering::Relaxed);
        seq
    }
}
