//! The step plan: what the scheduler decided for one step, the one data
//! type between the scheduler, the executor and the output stage.
//!
//! The executor reads [`StepPlan::batch`] (the model's rows, positions and
//! block tables) and [`StepPlan::kv_copies`]; the output stage reads
//! [`StepPlan::logit_rows`] and [`StepPlan::forks`] to know what each
//! logits row is for; the scheduler reads [`StepPlan::chunks`] back when the
//! step is done, to advance each sequence.
//!
//! A sequence may own several rows of a step and several logits rows (a
//! prompt chunk reporting prompt log-probabilities has one per row); each
//! logits row carries its [`RowRole`].

use super::kv_blocks::BlockHash;
use super::request::SeqId;
use crate::step::StepBatch;

/// One sequence's rows in the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledChunk {
    /// Index of the sequence in the running set (stable for the step).
    pub seq: usize,
    pub id: SeqId,
    /// Tokens of the sequence computed before the step: the position of
    /// its first row.
    pub computed: usize,
    /// Its rows in the step (tokens computed by it).
    pub len: usize,
    pub kind: ChunkKind,
    /// Of `len`, the draft tokens after the sequence's one known token
    /// (speculative decoding; 0 otherwise).
    pub drafts: usize,
}

/// What a chunk computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkKind {
    /// Known tokens not yet in the cache: the prompt, or all of a
    /// preempted sequence's tokens being recomputed.
    Prefill,
    /// The one token sampled in the step before.
    Decode,
}

/// What one logits row is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowRole {
    /// Reported only: prompt logits or prompt log-probabilities.
    Report,
    /// The sequence's next token is sampled from it (after reporting, when
    /// it is a prompt row too).
    Sample,
    /// A later row of a chunk with drafts: sampled, as the position after
    /// it would be, only while every earlier draft of the chunk was kept.
    Verify,
}

/// One row of [`StepBatch::logit_rows`], in the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogitRow {
    /// Running index of the sequence it belongs to.
    pub seq: usize,
    /// Position of the row's token in its sequence.
    pub position: usize,
    pub role: RowRole,
}

/// A later choice of an `n > 1` request forked from its leader in this
/// step: it samples its first token from the leader's [`RowRole::Sample`]
/// row and holds the leader's blocks (the partial last one copied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fork {
    /// Running index of the leader.
    pub leader: usize,
    /// Running index of the forked choice.
    pub choice: usize,
}

/// Everything one step does.
#[derive(Clone, Debug, Default)]
pub struct StepPlan {
    /// The model's input.
    pub batch: StepBatch,
    /// The sequences with rows in the step, in batch order.
    pub chunks: Vec<ScheduledChunk>,
    /// What each row of `batch.logit_rows` is for, in the same order.
    pub logit_rows: Vec<LogitRow>,
    /// Choices forked in this step.
    pub forks: Vec<Fork>,
    /// `(from, to)` KV blocks to copy after the forward pass, before
    /// anything writes to either again (the forked choices' partial blocks).
    pub kv_copies: Vec<(u32, u32)>,
    /// `(from, to)` recurrent-state slots to copy after the forward pass
    /// (a forked choice takes its leader's state after the prompt).
    pub state_copies: Vec<(u32, u32)>,
    /// `(snapshot, live)` recurrent-state slots to copy before the forward
    /// pass: a sequence starting from a cached prefix takes the state kept
    /// at its end.
    pub state_restores: Vec<(u32, u32)>,
    /// Snapshot slots the step's `batch.state_saves` fill, and the chain
    /// hash of the block each one ends: findable once the step is applied.
    pub snapshots: Vec<(u32, BlockHash)>,
    /// `(from, to)` recurrent-state slots to copy once the drafts are
    /// settled (after the output stage): a partly rejected draft's state
    /// rolls back to its last kept row, and a rolling snapshot crossed by
    /// kept rows is taken from the verify slot of its row.
    pub state_settles: Vec<(u32, u32)>,
}

impl StepPlan {
    /// A plan with room for `max_tokens` rows and `max_seqs` sequences of
    /// `max_blocks_per_seq` blocks: planning a step allocates nothing.
    pub fn with_capacity(max_tokens: usize, max_seqs: usize, max_blocks_per_seq: usize) -> Self {
        StepPlan {
            batch: StepBatch::with_capacity(max_tokens, max_seqs, max_blocks_per_seq),
            chunks: Vec::with_capacity(max_seqs),
            logit_rows: Vec::with_capacity(max_tokens.max(max_seqs)),
            forks: Vec::with_capacity(max_seqs),
            kv_copies: Vec::with_capacity(2 * max_seqs),
            state_copies: Vec::with_capacity(max_seqs),
            state_restores: Vec::with_capacity(max_seqs),
            snapshots: Vec::with_capacity(2 * max_seqs),
            state_settles: Vec::with_capacity(2 * max_seqs),
        }
    }

    pub fn clear(&mut self) {
        self.batch.clear();
        self.chunks.clear();
        self.logit_rows.clear();
        self.forks.clear();
        self.kv_copies.clear();
        self.state_copies.clear();
        self.state_restores.clear();
        self.snapshots.clear();
        self.state_settles.clear();
    }

    /// Rows the model runs.
    pub fn rows(&self) -> usize {
        self.batch.rows()
    }

    pub fn is_empty(&self) -> bool {
        self.batch.rows() == 0
    }

    /// The forks whose leader is running index `leader`.
    pub fn forks_of(&self, leader: usize) -> impl Iterator<Item = &Fork> + '_ {
        self.forks.iter().filter(move |f| f.leader == leader)
    }
}
