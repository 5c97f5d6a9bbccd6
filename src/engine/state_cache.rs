//! The prefix cache's recurrent-state snapshots (models with Gated DeltaNet
//! layers).
//!
//! A KV block holds the keys of its tokens, which a later request with the
//! same prefix can attend to; a recurrent layer has no such per-token
//! record, only the state after the last token it read. So a cached prefix
//! is reusable on a hybrid model only up to a position whose state was kept:
//! a snapshot, the state of every linear-attention layer after a full block,
//! in a slot of the recurrent-state pool, known by the chain hash of the
//! block it ends (the same hash that finds the KV blocks, so a snapshot
//! stands for exactly the tokens up to it and the request's salt).
//!
//! A snapshot slot is free, held (being written by a step, or a running
//! sequence's rolling snapshot) or cached (findable by hash, least recently
//! used evicted first when a slot is wanted and none is free).

use std::collections::{BTreeMap, HashMap};

use super::kv_blocks::BlockHash;

#[derive(Debug)]
pub(crate) struct StateCache {
    /// Slots holding nothing (popped from the end).
    free: Vec<u32>,
    /// Cached slots by hash.
    by_hash: HashMap<BlockHash, u32>,
    /// Cached slots by the tick they were last used: the first is evicted
    /// first. `(tick, slot) → hash`.
    lru: BTreeMap<(u64, u32), BlockHash>,
    /// The LRU key of each cached slot, indexed by `slot − first`.
    used_at: Vec<u64>,
    /// Number of the first snapshot slot in the pool (after the live ones).
    first: u32,
    held: usize,
    tick: u64,
}

impl StateCache {
    /// Snapshot slots `first..first + count` of the pool.
    pub fn new(first: u32, count: usize) -> StateCache {
        StateCache {
            free: (first..first + count as u32).rev().collect(),
            by_hash: HashMap::new(),
            lru: BTreeMap::new(),
            used_at: vec![0; count],
            first,
            held: 0,
            tick: 0,
        }
    }

    /// Whether there are snapshot slots at all.
    pub fn enabled(&self) -> bool {
        !self.used_at.is_empty()
    }

    /// Snapshots findable by hash.
    pub fn cached(&self) -> usize {
        self.by_hash.len()
    }

    /// The slot holding the state after the block that hashed to `hash`.
    pub fn get(&self, hash: BlockHash) -> Option<u32> {
        self.by_hash.get(&hash).copied()
    }

    /// Marks `hash`'s snapshot as just used (it is evicted last).
    pub fn touch(&mut self, hash: BlockHash) {
        let Some(&slot) = self.by_hash.get(&hash) else {
            return;
        };
        let at = (slot - self.first) as usize;
        self.lru.remove(&(self.used_at[at], slot));
        self.tick += 1;
        self.used_at[at] = self.tick;
        self.lru.insert((self.tick, slot), hash);
    }

    /// A slot to write a snapshot into, held until [`register`] or
    /// [`release`]: a free one, else the least recently used cached one
    /// (forgotten). `None` when every slot is held.
    ///
    /// [`register`]: Self::register
    /// [`release`]: Self::release
    pub fn take(&mut self) -> Option<u32> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let (&(tick, slot), &hash) = self.lru.iter().next()?;
                self.lru.remove(&(tick, slot));
                self.by_hash.remove(&hash);
                slot
            }
        };
        self.held += 1;
        Some(slot)
    }

    /// Makes held `slot`, now holding the state after the block hashed
    /// `hash`, findable; if that state is cached already, the slot is freed.
    pub fn register(&mut self, slot: u32, hash: BlockHash) {
        if self.by_hash.contains_key(&hash) {
            self.release(slot);
            self.touch(hash);
            return;
        }
        self.held -= 1;
        self.by_hash.insert(hash, slot);
        self.tick += 1;
        self.used_at[(slot - self.first) as usize] = self.tick;
        self.lru.insert((self.tick, slot), hash);
    }

    /// Gives back held `slot` unregistered.
    pub fn release(&mut self, slot: u32) {
        self.held -= 1;
        self.free.push(slot);
    }

    /// Checks the books (tests): every slot exactly once free, held or
    /// cached, and the LRU order listing exactly the cached ones.
    pub fn audit(&self) -> Result<(), String> {
        let count = self.used_at.len();
        if self.free.len() + self.held + self.by_hash.len() != count {
            return Err(format!(
                "{} free + {} held + {} cached snapshot slots, of {count}",
                self.free.len(),
                self.held,
                self.by_hash.len()
            ));
        }
        if self.lru.len() != self.by_hash.len()
            || self.lru.values().any(|h| !self.by_hash.contains_key(h))
        {
            return Err("the LRU order and the cached snapshots disagree".to_string());
        }
        let mut seen = vec![false; count];
        for &slot in self.free.iter().chain(self.by_hash.values()) {
            let at = slot.checked_sub(self.first).map(|i| i as usize);
            match at.and_then(|i| seen.get_mut(i)) {
                Some(s) if !*s => *s = true,
                _ => return Err(format!("snapshot slot {slot} listed twice or outside")),
            }
        }
        Ok(())
    }
}
