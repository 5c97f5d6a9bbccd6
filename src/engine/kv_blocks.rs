//! Paged KV cache bookkeeping: which fixed-size blocks of the cache belong to
//! which sequence. No tensor memory lives here; the KV tensors are indexed by
//! the slots this module hands out.
//!
//! The cache is `num_blocks` blocks of `block_size` token slots. A sequence
//! owns a [`BlockTable`]: its `i`-th entry is the block holding the sequence's
//! tokens `i * block_size .. (i + 1) * block_size`, so token `p` lives in slot
//! `table[p / block_size] * block_size + p % block_size`.
//!
//! Sliding-window layers (gpt-oss) only attend to the last `window` tokens.
//! Because the table is indexed by position, the blocks that fell entirely out
//! of the window are always a prefix of it ([`BlockTable::blocks_out_of_window`]);
//! a later change can return them to the free list and mark their entries
//! as gone without moving any other entry. (Full-attention layers still need
//! those tokens, so that change also needs a separate table for the sliding
//! layers.)

use std::collections::HashMap;

/// Identifies a sequence (a request) to the allocator.
pub type SeqId = u64;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvBlocksError {
    #[error("KV block size must be at least one token")]
    ZeroBlockSize,
    #[error("{requested} KV blocks cannot be numbered with 32-bit ids")]
    TooManyBlocks { requested: usize },
    #[error("out of KV blocks: {needed} more needed, {free} free")]
    OutOfBlocks { needed: usize, free: usize },
}

/// The blocks of one sequence, in position order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<u32>,
}

impl BlockTable {
    /// Block ids, the one holding position 0 first.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The blocks whose every position is older than the last `window` of a
    /// sequence of `seq_len` tokens; a sliding-window layer never reads them
    /// again. Always a prefix of the table.
    pub fn blocks_out_of_window(&self, block_size: usize, seq_len: usize, window: usize) -> &[u32] {
        let first_needed_position = seq_len.saturating_sub(window);
        let whole_blocks_before = first_needed_position / block_size.max(1);
        &self.blocks[..whole_blocks_before.min(self.blocks.len())]
    }
}

/// Hands out KV blocks to sequences and takes them back.
#[derive(Debug)]
pub struct BlockAllocator {
    block_size: usize,
    num_blocks: usize,
    /// Free block ids; popped from the end, so block 0 goes out first.
    free: Vec<u32>,
    tables: HashMap<SeqId, BlockTable>,
}

impl BlockAllocator {
    pub fn new(
        num_blocks: usize,
        block_size_tokens: usize,
    ) -> Result<BlockAllocator, KvBlocksError> {
        if block_size_tokens == 0 {
            return Err(KvBlocksError::ZeroBlockSize);
        }
        let last_id = u32::try_from(num_blocks).map_err(|_| KvBlocksError::TooManyBlocks {
            requested: num_blocks,
        })?;
        Ok(BlockAllocator {
            block_size: block_size_tokens,
            num_blocks,
            free: (0..last_id).rev().collect(),
            tables: HashMap::new(),
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    pub fn used_blocks(&self) -> usize {
        self.num_blocks - self.free.len()
    }

    /// Number of sequences holding a table (possibly empty).
    pub fn num_seqs(&self) -> usize {
        self.tables.len()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for_tokens(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Blocks `seq` would have to be given to hold `new_total_tokens`.
    pub fn blocks_needed(&self, seq: SeqId, new_total_tokens: usize) -> usize {
        let have = self.tables.get(&seq).map_or(0, BlockTable::len);
        self.blocks_for_tokens(new_total_tokens)
            .saturating_sub(have)
    }

    /// Whether `num_blocks` more blocks are free.
    pub fn can_allocate(&self, num_blocks: usize) -> bool {
        num_blocks <= self.free.len()
    }

    /// Grows the table of `seq` (created if new) to hold `new_total_tokens`
    /// tokens. All or nothing: when too few blocks are free, nothing changes
    /// (a new sequence gets no table). A table never shrinks here.
    pub fn allocate_for(
        &mut self,
        seq: SeqId,
        new_total_tokens: usize,
    ) -> Result<(), KvBlocksError> {
        let needed = self.blocks_needed(seq, new_total_tokens);
        if !self.can_allocate(needed) {
            return Err(KvBlocksError::OutOfBlocks {
                needed,
                free: self.free.len(),
            });
        }
        let new_blocks = self.free.split_off(self.free.len() - needed);
        // `split_off` keeps the free list's order; reversed, the lowest id comes first.
        let table = self.tables.entry(seq).or_default();
        table.blocks.extend(new_blocks.into_iter().rev());
        Ok(())
    }

    /// Returns every block of `seq` to the free list and forgets the
    /// sequence; returns how many blocks it held (0 for an unknown sequence).
    pub fn free(&mut self, seq: SeqId) -> usize {
        let Some(table) = self.tables.remove(&seq) else {
            return 0;
        };
        let count = table.blocks.len();
        // Pushed in reverse so the sequence's first block is reused first.
        self.free.extend(table.blocks.into_iter().rev());
        count
    }

    pub fn table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.tables.get(&seq)
    }

    /// The blocks of `table` that a sliding-window layer with `window` tokens
    /// no longer reads once the sequence holds `seq_len` tokens.
    pub fn blocks_out_of_window<'t>(
        &self,
        table: &'t BlockTable,
        seq_len: usize,
        window: usize,
    ) -> &'t [u32] {
        table.blocks_out_of_window(self.block_size, seq_len, window)
    }

    /// The cache slot of token `position` of a sequence with `table`, or
    /// `None` when the table does not reach that far.
    pub fn slot(&self, table: &BlockTable, position: usize) -> Option<usize> {
        let block = *table.blocks.get(position / self.block_size)?;
        Some(block as usize * self.block_size + position % self.block_size)
    }
}
