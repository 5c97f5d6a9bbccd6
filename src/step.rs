//! One forward step's input: the tokens of every scheduled sequence, packed
//! into rows, with each sequence's place in the KV cache.
//!
//! Sized once for `max_num_batched_tokens` tokens and `max_num_seqs`
//! sequences (the plan's `step_metadata`); `clear` keeps the capacity, so a
//! step allocates nothing.
//!
//! A sequence has two block tables over the same positions: the blocks of
//! its full-attention layers and those of its sliding-window layers (models
//! without the latter have no sliding tables). A sliding table's entries
//! for blocks that have left the window are [`NO_BLOCK`]: a backend never
//! reads a key there that the mask lets through, and reads nothing there
//! at all (a masked key is taken as zeros).

/// A sliding table's entry for a block no longer (or never) held.
pub const NO_BLOCK: u32 = u32::MAX;

/// One sequence's share of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqChunk {
    /// First row of this sequence's tokens in the step.
    pub start: u32,
    /// Number of its tokens in the step.
    pub len: u32,
    /// Tokens of the sequence already in the KV cache (the position of its first row).
    pub past: u32,
    /// Where its sliding-window table starts in
    /// [`StepBatch::sliding_block_tables`] (as long as its full table, when
    /// the batch has sliding tables).
    pub sliding_start: u32,
    /// Where its block table starts in [`StepBatch::block_tables`].
    pub table_start: u32,
    /// Number of blocks in its table (covering `past + len` tokens).
    pub table_len: u32,
    /// Its slot in the recurrent-state pool (models with Gated DeltaNet
    /// layers): the sequence's index in the batch unless
    /// [`StepBatch::set_state_slot`] says otherwise. A slot must stay the
    /// sequence's from its first chunk to its last.
    pub state_slot: u32,
}

impl SeqChunk {
    /// Rows `start..start+len` of the step.
    pub fn rows(&self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

#[derive(Clone, Debug, Default)]
pub struct StepBatch {
    /// Token id of each row.
    pub tokens: Vec<u32>,
    /// Position of each row in its sequence.
    pub positions: Vec<u32>,
    pub seqs: Vec<SeqChunk>,
    /// Every sequence's block table, back to back.
    pub block_tables: Vec<u32>,
    /// Every sequence's sliding-window table, back to back; empty when the
    /// model has no sliding-window layers.
    pub sliding_block_tables: Vec<u32>,
    /// Rows whose logits are wanted, ascending.
    pub logit_rows: Vec<u32>,
    /// Recurrent states to keep at rows inside the step (models with Gated
    /// DeltaNet layers): the prefix cache's snapshots.
    pub state_saves: Vec<StateSave>,
}

/// "After row `row` of sequence `seq` (its index in [`StepBatch::seqs`]),
/// copy its recurrent state into slot `slot`": the state covering every
/// position up to that row's, kept so that a later sequence with the same
/// tokens can start there. The slot is no sequence's of the step, and no
/// slot is saved twice in one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateSave {
    pub seq: u32,
    pub row: u32,
    pub slot: u32,
}

impl StepBatch {
    pub fn with_capacity(max_tokens: usize, max_seqs: usize, max_blocks_per_seq: usize) -> Self {
        StepBatch {
            tokens: Vec::with_capacity(max_tokens),
            positions: Vec::with_capacity(max_tokens),
            seqs: Vec::with_capacity(max_seqs),
            block_tables: Vec::with_capacity(max_seqs * max_blocks_per_seq),
            sliding_block_tables: Vec::with_capacity(max_seqs * max_blocks_per_seq),
            logit_rows: Vec::with_capacity(max_tokens.max(max_seqs)),
            // Two snapshots and a verify save per draft, per sequence.
            state_saves: Vec::with_capacity((2 + sparkrt_wire::MAX_SPECULATIVE_TOKENS) * max_seqs),
        }
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.seqs.clear();
        self.block_tables.clear();
        self.sliding_block_tables.clear();
        self.logit_rows.clear();
        self.state_saves.clear();
    }

    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// Adds `tokens` of a sequence that already has `past` tokens cached;
    /// `blocks` must cover `past + tokens.len()` tokens, and `sliding` (its
    /// sliding-window table) is as long, or empty for a model without
    /// sliding-window layers. `logits` says which rows' logits are computed.
    pub fn push_seq(
        &mut self,
        tokens: &[u32],
        past: usize,
        blocks: &[u32],
        sliding: &[u32],
        logits: Logits,
    ) {
        debug_assert!(sliding.is_empty() || sliding.len() == blocks.len());
        let start = self.tokens.len();
        self.tokens.extend_from_slice(tokens);
        self.positions
            .extend((0..tokens.len()).map(|i| (past + i) as u32));
        match logits {
            Logits::None => {}
            Logits::Last => {
                if !tokens.is_empty() {
                    self.logit_rows.push((start + tokens.len() - 1) as u32);
                }
            }
            Logits::All => self
                .logit_rows
                .extend((start..start + tokens.len()).map(|r| r as u32)),
        }
        self.seqs.push(SeqChunk {
            start: start as u32,
            len: tokens.len() as u32,
            past: past as u32,
            sliding_start: self.sliding_block_tables.len() as u32,
            table_start: self.block_tables.len() as u32,
            table_len: blocks.len() as u32,
            state_slot: self.seqs.len() as u32,
        });
        self.block_tables.extend_from_slice(blocks);
        self.sliding_block_tables.extend_from_slice(sliding);
    }

    /// Gives sequence `i` (in push order) state slot `slot`.
    pub fn set_state_slot(&mut self, i: usize, slot: u32) {
        if let Some(chunk) = self.seqs.get_mut(i) {
            chunk.state_slot = slot;
        }
    }

    /// Block table of sequence `i`.
    pub fn table(&self, i: usize) -> &[u32] {
        let s = &self.seqs[i];
        &self.block_tables[s.table_start as usize..(s.table_start + s.table_len) as usize]
    }

    /// Sliding-window table of sequence `i` (empty without sliding tables).
    pub fn sliding_table(&self, i: usize) -> &[u32] {
        let s = &self.seqs[i];
        let start = s.sliding_start as usize;
        self.sliding_block_tables
            .get(start..start + s.table_len as usize)
            .unwrap_or_default()
    }

    /// The table a layer reads: the sliding-window one for a sliding layer.
    pub fn table_for(&self, i: usize, sliding: bool) -> &[u32] {
        if sliding {
            self.sliding_table(i)
        } else {
            self.table(i)
        }
    }
}

/// Which logits of a sequence's rows a step computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}
