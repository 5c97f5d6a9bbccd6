//! Paged KV cache bookkeeping: which fixed-size blocks of the cache belong to
//! which sequence, and which full blocks are kept for reuse (prefix caching).
//! No tensor memory lives here; the KV tensors are indexed by the slots this
//! module hands out.
//!
//! The cache is `num_blocks` blocks of `block_size` token slots. A sequence
//! owns a [`BlockTable`]: its `i`-th entry is the block holding the sequence's
//! tokens `i * block_size .. (i + 1) * block_size`, so token `p` lives in slot
//! `table[p / block_size] * block_size + p % block_size`.
//!
//! **Prefix caching.** Every block is in exactly one of three states:
//! *used* (referenced by one or more tables), *cached* (unreferenced, but a
//! full block whose keys and values are known by the hash of its content,
//! kept for reuse) or *free* (unreferenced, nothing worth keeping). A full
//! block's identity is a hash chain: `hash(parent block's hash, its token
//! ids)`, rooted in the request's salt ([`root_hash`]). Anything else that
//! changes the keys of a block — the model, its weights, the KV dtype, the
//! block size — is fixed for the allocator's engine, so it needs no place in
//! the hash. A hit is also checked token by token against the ids kept with
//! the block (and its parent's hash), so a hash collision cannot hand a
//! sequence another prompt's keys. Only full blocks are shared; a sequence's
//! partial last block is always its own. New blocks come from the free
//! blocks first, then from the cached ones, least recently used first.
//!
//! **Sliding-window layers** (gpt-oss) keep their keys in blocks of the same
//! pool, through a second table per sequence over the same positions. A
//! block there whose every position is older than the window of the
//! sequence's next token is released ([`BlockAllocator::release_out_of_window`])
//! and its entry becomes [`NO_BLOCK`]; a full one stays cached like any
//! other. Its identity is its full-attention twin's hash, derived
//! ([`sliding_hash`]), so the two kinds never stand in for each other. A hit
//! of `m` blocks needs the full blocks `0..m` and the sliding blocks of the
//! last window before position `m × block_size`; [`BlockAllocator::lookup`]
//! takes the longest `m` that has both.
//!
//! **Forks** (`n > 1`): a choice can start from another's table
//! ([`BlockAllocator::fork`]): the full blocks are shared, the partial last
//! block is copied (the engine copies its keys), so each writes its own.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

pub use crate::step::NO_BLOCK;

use crate::plan::memory::sliding_window_blocks;

/// Identifies a sequence (a request) to the allocator.
pub type SeqId = u64;

/// The identity of a full block: a 128-bit hash of its token ids and of the
/// chain before it.
pub type BlockHash = u128;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvBlocksError {
    #[error("KV block size must be at least one token")]
    ZeroBlockSize,
    #[error("{requested} KV blocks cannot be numbered with 32-bit ids")]
    TooManyBlocks { requested: usize },
    #[error("out of KV blocks: {needed} more needed, {free} free")]
    OutOfBlocks { needed: usize, free: usize },
    #[error("sequence {0} holds no KV blocks")]
    UnknownSequence(SeqId),
}

/// Two 64-bit SipHash lanes (std's hasher with its fixed keys) over
/// `parts`, told apart by a lane byte: 128 bits, so an accidental collision
/// among the blocks of one engine is astronomically unlikely.
fn hash128(parts: impl Fn(&mut DefaultHasher)) -> BlockHash {
    let lane = |tag: u8| {
        let mut h = DefaultHasher::new();
        tag.hash(&mut h);
        parts(&mut h);
        h.finish()
    };
    (u128::from(lane(0)) << 64) | u128::from(lane(1))
}

/// The root of a request's hash chain: requests with different salts
/// (`cache_salt`) never share a block; no salt is a root of its own.
pub fn root_hash(salt: Option<&str>) -> BlockHash {
    match salt {
        None => 0,
        Some(salt) => hash128(|h| {
            "cache_salt".hash(h);
            salt.hash(h);
        }),
    }
}

/// The hash of a full block of `tokens` whose predecessor hashed to `parent`.
pub fn block_hash(parent: BlockHash, tokens: &[u32]) -> BlockHash {
    hash128(|h| {
        parent.hash(h);
        tokens.hash(h);
    })
}

/// The identity of the sliding-window block beside the full block `full`.
pub fn sliding_hash(full: BlockHash) -> BlockHash {
    hash128(|h| {
        "sliding".hash(h);
        full.hash(h);
    })
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
}

/// A cache hit: the cached blocks holding the first `blocks.len()` full
/// blocks of a sequence's tokens, and their chain hashes; with
/// sliding-window layers, as many sliding entries ([`NO_BLOCK`] before the
/// window).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixHit {
    pub blocks: Vec<u32>,
    pub hashes: Vec<BlockHash>,
    pub sliding: Vec<u32>,
}

impl PrefixHit {
    /// The blocks of the hit, full and sliding.
    fn all_blocks(&self) -> impl Iterator<Item = u32> + '_ {
        self.blocks
            .iter()
            .chain(&self.sliding)
            .copied()
            .filter(|&b| b != NO_BLOCK)
    }
}

/// What a cached block's keys were computed from, checked on every hit.
#[derive(Clone, Debug)]
struct BlockContent {
    hash: BlockHash,
    parent: BlockHash,
    tokens: Box<[u32]>,
}

/// A sequence's tables and the hash chain of its full blocks so far.
#[derive(Clone, Debug, Default)]
struct SeqBlocks {
    table: BlockTable,
    /// Its sliding-window table (as long as `table`; empty without such
    /// layers), [`NO_BLOCK`] where released.
    sliding: BlockTable,
    root: BlockHash,
    /// Chain hashes of its first `hashes.len()` blocks (full and computed).
    hashes: Vec<BlockHash>,
}

/// Hands out KV blocks to sequences, takes them back, and keeps full blocks
/// for reuse.
#[derive(Debug)]
pub struct BlockAllocator {
    block_size: usize,
    num_blocks: usize,
    prefix_caching: bool,
    /// Tokens a sliding-window layer attends to; 0: no such layers, no
    /// sliding tables.
    window: usize,
    /// Tables referencing each block.
    refs: Vec<u32>,
    /// What each registered block holds; `None` for a block not (or no
    /// longer) known by its content.
    content: Vec<Option<BlockContent>>,
    by_hash: HashMap<BlockHash, u32>,
    /// Unreferenced blocks holding nothing reusable; popped from the end,
    /// so block 0 goes out first.
    free: Vec<u32>,
    /// Unreferenced registered blocks by the tick they became so: the first
    /// is the least recently used, evicted first.
    cached: BTreeMap<u64, u32>,
    /// The key of each block in `cached` (valid while it is there).
    cached_tick: Vec<u64>,
    tick: u64,
    tables: HashMap<SeqId, SeqBlocks>,
}

impl BlockAllocator {
    /// An allocator with prefix caching on.
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
            prefix_caching: true,
            window: 0,
            refs: vec![0; num_blocks],
            content: vec![None; num_blocks],
            by_hash: HashMap::new(),
            free: (0..last_id).rev().collect(),
            cached: BTreeMap::new(),
            cached_tick: vec![0; num_blocks],
            tick: 0,
            tables: HashMap::new(),
        })
    }

    /// Turns prefix caching on or off: off, no block is ever registered, so
    /// none is cached or shared.
    pub fn with_prefix_caching(mut self, on: bool) -> BlockAllocator {
        self.prefix_caching = on;
        self
    }

    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Gives every sequence a sliding-window table for layers attending to
    /// the last `window` tokens (0: none).
    pub fn with_sliding_window(mut self, window: usize) -> BlockAllocator {
        self.window = window;
        self
    }

    /// Block tables per sequence: 2 with sliding-window layers, else 1.
    fn tables_per_seq(&self) -> usize {
        1 + usize::from(self.window > 0)
    }

    /// The first block a sequence holding `computed` tokens still needs in
    /// its sliding table: its next token attends to positions from
    /// `computed + 1 − window`.
    fn first_window_block(&self, computed: usize) -> usize {
        (computed + 1).saturating_sub(self.window) / self.block_size
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Unreferenced blocks holding nothing reusable.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Unreferenced full blocks kept for reuse (reclaimable).
    pub fn cached_blocks(&self) -> usize {
        self.cached.len()
    }

    /// Blocks some sequence references; `used + cached + free = total`.
    pub fn used_blocks(&self) -> usize {
        self.num_blocks - self.free.len() - self.cached.len()
    }

    /// Blocks a new allocation can take: free ones, then cached ones.
    pub fn available_blocks(&self) -> usize {
        self.free.len() + self.cached.len()
    }

    /// Number of sequences holding a table (possibly empty).
    pub fn num_seqs(&self) -> usize {
        self.tables.len()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for_tokens(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Blocks `seq` would have to be given to hold `new_total_tokens`
    /// (in both its tables).
    pub fn blocks_needed(&self, seq: SeqId, new_total_tokens: usize) -> usize {
        let have = self.tables.get(&seq).map_or(0, |s| s.table.len());
        self.blocks_for_tokens(new_total_tokens)
            .saturating_sub(have)
            * self.tables_per_seq()
    }

    /// Blocks a new sequence starting from `hit` needs at most at once for
    /// `tokens` tokens beyond those of the hit, computed in chunks of at
    /// most `chunk` tokens: a full table's block for each, and in a
    /// sliding-window table the blocks of the window and of one chunk
    /// (the older ones are released after each step).
    pub fn blocks_needed_after(&self, hit: &PrefixHit, tokens: usize, chunk: usize) -> usize {
        let full = self
            .blocks_for_tokens(tokens)
            .saturating_sub(hit.blocks.len());
        let sliding = if self.window > 0 {
            let window = sliding_window_blocks(self.window, self.block_size);
            full.min(window + self.blocks_for_tokens(chunk) + 1)
        } else {
            0
        };
        full + sliding
    }

    /// Whether `num_blocks` more blocks can be allocated.
    pub fn can_allocate(&self, num_blocks: usize) -> bool {
        num_blocks <= self.available_blocks()
    }

    /// The longest chain of cached blocks holding the full blocks of
    /// `tokens`, for a request whose chain starts at `root` (with
    /// sliding-window layers: and the sliding blocks of its last window).
    /// Takes nothing.
    pub fn lookup(&self, root: BlockHash, tokens: &[u32]) -> PrefixHit {
        let mut hit = PrefixHit::default();
        if !self.prefix_caching {
            return hit;
        }
        let mut parent = root;
        for block_tokens in tokens.chunks_exact(self.block_size) {
            let hash = block_hash(parent, block_tokens);
            let Some(block) = self.cached_as(hash, parent, block_tokens) else {
                break;
            };
            hit.blocks.push(block);
            hit.hashes.push(hash);
            parent = hash;
        }
        if self.window > 0 {
            self.trim_to_window(&mut hit, root, tokens);
        }
        hit
    }

    /// The block registered as `hash`, if it holds `tokens` after `parent`.
    fn cached_as(&self, hash: BlockHash, parent: BlockHash, tokens: &[u32]) -> Option<u32> {
        let &block = self.by_hash.get(&hash)?;
        self.content[block as usize]
            .as_ref()
            .is_some_and(|c| c.hash == hash && c.parent == parent && *c.tokens == *tokens)
            .then_some(block)
    }

    /// Shortens a hit of full blocks to the longest that also has the
    /// sliding blocks of its last window, and fills those in.
    fn trim_to_window(&self, hit: &mut PrefixHit, root: BlockHash, tokens: &[u32]) {
        let bs = self.block_size;
        let sliding: Vec<Option<u32>> = (0..hit.blocks.len())
            .map(|i| {
                let parent = if i == 0 { root } else { hit.hashes[i - 1] };
                let block_tokens = &tokens[i * bs..(i + 1) * bs];
                self.cached_as(sliding_hash(hit.hashes[i]), parent, block_tokens)
            })
            .collect();
        let mut m = hit.blocks.len();
        while m > 0 && sliding[self.first_window_block(m * bs)..m].contains(&None) {
            m -= 1;
        }
        let first = self.first_window_block(m * bs);
        hit.blocks.truncate(m);
        hit.hashes.truncate(m);
        hit.sliding = (0..m)
            .map(|i| if i < first { None } else { sliding[i] })
            .map(|b| b.unwrap_or(NO_BLOCK))
            .collect();
    }

    /// How many blocks of `hit` are cached (unreferenced): taking them
    /// lowers what is available to allocate.
    pub fn unreferenced_in(&self, hit: &PrefixHit) -> usize {
        hit.all_blocks()
            .filter(|&b| self.refs[b as usize] == 0)
            .count()
    }

    /// Gives `seq`, which holds no table, one starting with the blocks of
    /// `hit` (from [`lookup`](Self::lookup) with the same `root`, nothing
    /// changed in between), each referenced once more.
    pub fn start(&mut self, seq: SeqId, root: BlockHash, hit: PrefixHit) {
        let blocks: Vec<u32> = hit.all_blocks().collect();
        for block in blocks {
            self.take_ref(block);
        }
        self.tables.insert(
            seq,
            SeqBlocks {
                table: BlockTable { blocks: hit.blocks },
                // Empty unless `lookup` found sliding blocks (a window).
                sliding: BlockTable {
                    blocks: hit.sliding,
                },
                root,
                hashes: hit.hashes,
            },
        );
    }

    /// Gives `child`, which holds no table, the tables of `parent` holding
    /// `computed` tokens: its full blocks shared (referenced once more), a
    /// partial last block replaced by a new one. Returns the `(from, to)`
    /// pairs whose keys the caller copies before either sequence writes
    /// again. All or nothing, like [`allocate_for`](Self::allocate_for).
    pub fn fork(
        &mut self,
        parent: SeqId,
        child: SeqId,
        computed: usize,
    ) -> Result<Vec<(u32, u32)>, KvBlocksError> {
        let Some(source) = self.tables.get(&parent).cloned() else {
            return Err(KvBlocksError::UnknownSequence(parent));
        };
        let full = computed / self.block_size;
        let partial = !computed.is_multiple_of(self.block_size);
        // Each table's entry for the partial block, where it has one.
        let copies = [&source.table, &source.sliding]
            .iter()
            .filter(|t| partial && t.blocks.get(full).is_some_and(|&b| b != NO_BLOCK))
            .count();
        if !self.can_allocate(copies) {
            return Err(KvBlocksError::OutOfBlocks {
                needed: copies,
                free: self.available_blocks(),
            });
        }
        let mut pairs = Vec::with_capacity(copies);
        let mut share = |allocator: &mut Self, table: &BlockTable| -> BlockTable {
            let mut blocks = Vec::with_capacity(table.len());
            for (i, &block) in table.blocks.iter().enumerate().take(full + 1) {
                if block == NO_BLOCK {
                    blocks.push(NO_BLOCK);
                } else if i < full {
                    allocator.take_ref(block);
                    blocks.push(block);
                } else if partial {
                    // `can_allocate` checked there is one.
                    if let Some(copy) = allocator.take_block() {
                        pairs.push((block, copy));
                        blocks.push(copy);
                    }
                }
            }
            BlockTable { blocks }
        };
        let table = share(self, &source.table);
        let sliding = share(self, &source.sliding);
        let hashes = source.hashes.iter().take(full).copied().collect();
        self.tables.insert(
            child,
            SeqBlocks {
                table,
                sliding,
                root: source.root,
                hashes,
            },
        );
        Ok(pairs)
    }

    fn take_ref(&mut self, block: u32) {
        let b = block as usize;
        if self.refs[b] == 0 {
            self.cached.remove(&self.cached_tick[b]);
        }
        self.refs[b] += 1;
    }

    /// One block for a table: a free one, else the least recently used
    /// cached one, which forgets its content.
    fn take_block(&mut self) -> Option<u32> {
        let block = match self.free.pop() {
            Some(block) => block,
            None => {
                let (_, block) = self.cached.pop_first()?;
                if let Some(content) = self.content[block as usize].take() {
                    self.by_hash.remove(&content.hash);
                }
                block
            }
        };
        self.refs[block as usize] = 1;
        Some(block)
    }

    /// Grows the table of `seq` (created if new, with `root` 0) to hold
    /// `new_total_tokens` tokens. All or nothing: when too few blocks can be
    /// had, nothing changes (a new sequence gets no table). A table never
    /// shrinks here.
    pub fn allocate_for(
        &mut self,
        seq: SeqId,
        new_total_tokens: usize,
    ) -> Result<(), KvBlocksError> {
        let needed = self.blocks_needed(seq, new_total_tokens);
        if !self.can_allocate(needed) {
            return Err(KvBlocksError::OutOfBlocks {
                needed,
                free: self.available_blocks(),
            });
        }
        let mut new_blocks = Vec::with_capacity(needed);
        for _ in 0..needed {
            // `can_allocate` checked there are enough.
            if let Some(block) = self.take_block() {
                new_blocks.push(block);
            }
        }
        let sliding = self.window > 0;
        let entry = self.tables.entry(seq).or_default();
        if sliding {
            // Alternately: the full table's block, then its sliding twin.
            let (mut full, mut twin) = (Vec::new(), Vec::new());
            for pair in new_blocks.chunks_exact(2) {
                full.push(pair[0]);
                twin.push(pair[1]);
            }
            entry.table.blocks.extend(full);
            entry.sliding.blocks.extend(twin);
        } else {
            entry.table.blocks.extend(new_blocks);
        }
        Ok(())
    }

    /// The chain hash of the first `blocks` full blocks of `tokens`, the
    /// tokens of `seq`: its registered hashes, extended over the rest. A
    /// recurrent-state snapshot at position `blocks × block_size` is known
    /// by it. `None` without a table or for `blocks` 0 or past `tokens`.
    pub fn chain_hash(&self, seq: SeqId, tokens: &[u32], blocks: usize) -> Option<BlockHash> {
        let entry = self.tables.get(&seq)?;
        if blocks == 0 || blocks * self.block_size > tokens.len() {
            return None;
        }
        if let Some(&hash) = entry.hashes.get(blocks - 1) {
            return Some(hash);
        }
        let known = entry.hashes.len();
        let start = entry.hashes.last().copied().unwrap_or(entry.root);
        Some(
            tokens[known * self.block_size..blocks * self.block_size]
                .chunks_exact(self.block_size)
                .fold(start, block_hash),
        )
    }

    /// Registers the blocks of `seq` that are full of computed tokens
    /// (`tokens[..computed]`, its keys and values in the cache), so later
    /// sequences can hit them. A block whose content another block already
    /// holds stays private (it is freed, not cached, when `seq` ends).
    pub fn register_computed(&mut self, seq: SeqId, tokens: &[u32], computed: usize) {
        let block_size = self.block_size;
        let caching = self.prefix_caching;
        let Some(entry) = self.tables.get_mut(&seq) else {
            return;
        };
        let full = (computed.min(tokens.len()) / block_size).min(entry.table.len());
        while entry.hashes.len() < full {
            let i = entry.hashes.len();
            let parent = entry.hashes.last().copied().unwrap_or(entry.root);
            let block_tokens = &tokens[i * block_size..(i + 1) * block_size];
            let hash = block_hash(parent, block_tokens);
            entry.hashes.push(hash);
            if !caching {
                continue;
            }
            let twin = entry.sliding.blocks.get(i).copied();
            let kinds = [
                (Some(entry.table.blocks[i]), hash),
                (twin, sliding_hash(hash)),
            ];
            for (block, hash) in kinds {
                let Some(block) = block.filter(|&b| b != NO_BLOCK) else {
                    continue;
                };
                if self.content[block as usize].is_none() && !self.by_hash.contains_key(&hash) {
                    self.by_hash.insert(hash, block);
                    self.content[block as usize] = Some(BlockContent {
                        hash,
                        parent,
                        tokens: block_tokens.into(),
                    });
                }
            }
        }
    }

    /// Releases the sliding blocks of `seq` that its next token (after
    /// `computed` tokens) can no longer attend to: each becomes cached if
    /// registered, else free. Returns how many were released.
    pub fn release_out_of_window(&mut self, seq: SeqId, computed: usize) -> usize {
        if self.window == 0 {
            return 0;
        }
        let first = self.first_window_block(computed);
        let Some(entry) = self.tables.get_mut(&seq) else {
            return 0;
        };
        let mut released = Vec::new();
        for block in entry.sliding.blocks.iter_mut().take(first) {
            if *block != NO_BLOCK {
                released.push(std::mem::replace(block, NO_BLOCK));
            }
        }
        for &block in released.iter().rev() {
            self.drop_ref(block);
        }
        released.len()
    }

    /// Drops one reference to `block`: unreferenced, it is cached if it is
    /// registered, else free.
    fn drop_ref(&mut self, block: u32) {
        let b = block as usize;
        self.refs[b] = self.refs[b].saturating_sub(1);
        if self.refs[b] > 0 {
            return;
        }
        if self.content[b].is_some() {
            self.cached_tick[b] = self.tick;
            self.cached.insert(self.tick, block);
            self.tick += 1;
        } else {
            self.free.push(block);
        }
    }

    /// Drops `seq`'s reference to each of its blocks and forgets the
    /// sequence; returns how many blocks it held (0 for an unknown
    /// sequence). A block nobody references any more is cached if it is
    /// registered, else free. The last block goes first, so a chain's tail
    /// is evicted before its head.
    pub fn free(&mut self, seq: SeqId) -> usize {
        let Some(entry) = self.tables.remove(&seq) else {
            return 0;
        };
        let count = entry.table.blocks.len();
        // Position by position from the end, the sliding twin after its
        // full block, so a chain's tail is evicted first.
        for i in (0..count).rev() {
            self.drop_ref(entry.table.blocks[i]);
            if let Some(&twin) = entry.sliding.blocks.get(i)
                && twin != NO_BLOCK
            {
                self.drop_ref(twin);
            }
        }
        count
    }

    pub fn table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.tables.get(&seq).map(|s| &s.table)
    }

    /// The sliding-window table of `seq` (empty without such layers).
    pub fn sliding_table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.tables.get(&seq).map(|s| &s.sliding)
    }

    /// The cache slot of token `position` of a sequence with `table`, or
    /// `None` when the table does not reach that far.
    pub fn slot(&self, table: &BlockTable, position: usize) -> Option<usize> {
        let block = *table.blocks.get(position / self.block_size)?;
        Some(block as usize * self.block_size + position % self.block_size)
    }

    /// Checks the books: each block's reference count is the number of
    /// tables holding it; an unreferenced block is in exactly one of the
    /// free and cached sets, a referenced one in neither; cached blocks and
    /// the hash index agree. Describes the first fault found.
    pub fn audit(&self) -> Result<(), String> {
        let mut counted = vec![0u32; self.num_blocks];
        for entry in self.tables.values() {
            if self.window > 0 && entry.sliding.len() != entry.table.len() {
                return Err("a sliding table is not as long as its full table".to_string());
            }
            for &b in entry.table.blocks.iter().chain(&entry.sliding.blocks) {
                if b == NO_BLOCK {
                    continue;
                }
                if b as usize >= self.num_blocks {
                    return Err(format!("a table holds block {b} of {}", self.num_blocks));
                }
                counted[b as usize] += 1;
            }
        }
        let mut in_free = vec![false; self.num_blocks];
        for &b in &self.free {
            if std::mem::replace(&mut in_free[b as usize], true) {
                return Err(format!("block {b} is free twice"));
            }
            if self.content[b as usize].is_some() {
                return Err(format!("free block {b} still has content"));
            }
        }
        let mut in_cached = vec![false; self.num_blocks];
        for (&tick, &b) in &self.cached {
            in_cached[b as usize] = true;
            if self.cached_tick[b as usize] != tick {
                return Err(format!("cached block {b} has a stale tick"));
            }
            if self.content[b as usize].is_none() {
                return Err(format!("cached block {b} has no content"));
            }
        }
        for b in 0..self.num_blocks {
            if counted[b] != self.refs[b] {
                return Err(format!(
                    "block {b}: {} references counted, {} recorded",
                    counted[b], self.refs[b]
                ));
            }
            let places = usize::from(in_free[b]) + usize::from(in_cached[b]);
            match (self.refs[b], places) {
                (0, 1) => {}
                (0, _) => return Err(format!("unreferenced block {b} is in {places} sets")),
                (_, 0) => {}
                (refs, _) => return Err(format!("block {b} has {refs} references and is free")),
            }
        }
        for (&hash, &b) in &self.by_hash {
            if self.content[b as usize].as_ref().map(|c| c.hash) != Some(hash) {
                return Err(format!(
                    "hash index points at block {b}, which holds other content"
                ));
            }
        }
        let with_content = self.content.iter().filter(|c| c.is_some()).count();
        if with_content != self.by_hash.len() {
            return Err(format!(
                "{with_content} blocks have content, {} are indexed",
                self.by_hash.len()
            ));
        }
        if self.used_blocks() + self.cached_blocks() + self.free_blocks() != self.num_blocks {
            return Err("used + cached + free is not the total".to_string());
        }
        Ok(())
    }
}
