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
//! sequence's rolling snapshot) or cached (findable by hash). Cached
//! snapshots are in one of two LRU segments: *probation* when registered,
//! *protected* once used again. A slot wanted when none is free is taken
//! from the least recently used on probation, and from the protected ones
//! only when none is on probation. Every prompt leaves snapshots of its own
//! tail (its last block, its rolling one) that are mostly never used again;
//! under one LRU they push out the shared system prompt's snapshot between
//! two of its hits (measured: 51% hit rate instead of 65% on
//! `scripts/load.py --workload shared-prefix`, see the README).

use std::collections::{BTreeMap, HashMap};

use super::kv_blocks::BlockHash;

#[derive(Debug)]
pub(crate) struct StateCache {
    /// Slots holding nothing (popped from the end).
    free: Vec<u32>,
    /// Cached slots by hash.
    by_hash: HashMap<BlockHash, u32>,
    /// Cached slots not used since registered, by the tick they were
    /// registered: the first is evicted first. `(tick, slot) → hash`.
    probation: BTreeMap<(u64, u32), BlockHash>,
    /// Cached slots used again since, by the tick of their last use.
    protected: BTreeMap<(u64, u32), BlockHash>,
    /// The LRU key of each cached slot and whether it is protected,
    /// indexed by `slot − first`.
    used_at: Vec<(u64, bool)>,
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
            probation: BTreeMap::new(),
            protected: BTreeMap::new(),
            used_at: vec![(0, false); count],
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

    /// Marks `hash`'s snapshot as just used: protected, evicted last.
    pub fn touch(&mut self, hash: BlockHash) {
        let Some(&slot) = self.by_hash.get(&hash) else {
            return;
        };
        self.unlist(slot);
        self.list(slot, hash, true);
    }

    /// Lists cached `slot` as used now, in its segment.
    fn list(&mut self, slot: u32, hash: BlockHash, protected: bool) {
        self.tick += 1;
        self.used_at[(slot - self.first) as usize] = (self.tick, protected);
        let segment = if protected {
            &mut self.protected
        } else {
            &mut self.probation
        };
        segment.insert((self.tick, slot), hash);
    }

    /// Takes cached `slot` out of its segment.
    fn unlist(&mut self, slot: u32) {
        let (tick, protected) = self.used_at[(slot - self.first) as usize];
        let segment = if protected {
            &mut self.protected
        } else {
            &mut self.probation
        };
        segment.remove(&(tick, slot));
    }

    /// A slot to write a snapshot into, held until [`register`] or
    /// [`release`]: a free one, else the least recently used cached one on
    /// probation, else the least recently used protected one (forgotten).
    /// `None` when every slot is held.
    ///
    /// [`register`]: Self::register
    /// [`release`]: Self::release
    pub fn take(&mut self) -> Option<u32> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let (&(_, slot), &hash) = self
                    .probation
                    .iter()
                    .next()
                    .or_else(|| self.protected.iter().next())?;
                self.unlist(slot);
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
        self.list(slot, hash, false);
    }

    /// Gives back held `slot` unregistered.
    pub fn release(&mut self, slot: u32) {
        self.held -= 1;
        self.free.push(slot);
    }

    /// Checks the books (tests): every slot exactly once free, held or
    /// cached, and the two segments listing exactly the cached ones.
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
        let mut listed = self.probation.iter().chain(&self.protected);
        if self.probation.len() + self.protected.len() != self.by_hash.len()
            || listed.any(|(&(tick, slot), h)| {
                self.by_hash.get(h) != Some(&slot)
                    || self.used_at[(slot - self.first) as usize].0 != tick
            })
        {
            return Err("the LRU segments and the cached snapshots disagree".to_string());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots 4..7 (after 4 live ones): fill them, use one again, and the
    /// slots wanted next come from probation, oldest first, then from the
    /// protected one.
    #[test]
    fn evicts_from_probation_first_then_the_protected() {
        let mut cache = StateCache::new(4, 3);
        let slots: Vec<u32> = (0..3).map(|_| cache.take().unwrap()).collect();
        assert_eq!(slots, [4, 5, 6]);
        assert_eq!(cache.take(), None, "all three held");
        for (&slot, hash) in slots.iter().zip([10, 11, 12]) {
            cache.register(slot, hash);
        }
        cache.touch(10);
        assert_eq!(cache.take(), Some(5), "11: the oldest on probation");
        assert_eq!(cache.get(11), None);
        assert_eq!(cache.take(), Some(6), "then 12");
        assert_eq!(cache.take(), Some(4), "then the protected 10");
        assert_eq!(cache.get(10), None);
        cache.audit().unwrap();
        for slot in [4, 5, 6] {
            cache.release(slot);
        }
        cache.audit().unwrap();
        assert_eq!(cache.cached(), 0);
    }

    /// A state registered twice keeps one slot; the other is freed.
    #[test]
    fn a_second_copy_of_a_cached_state_is_freed() {
        let mut cache = StateCache::new(0, 2);
        let (a, b) = (cache.take().unwrap(), cache.take().unwrap());
        cache.register(a, 7);
        cache.register(b, 7);
        assert_eq!((cache.cached(), cache.get(7)), (1, Some(a)));
        assert_eq!(cache.take(), Some(b), "the freed one before any eviction");
        cache.audit().unwrap();
    }
}
