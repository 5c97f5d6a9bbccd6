//! `--seed N`: the seeds of requests that give none, as vLLM's global seed
//! makes a server's run reproducible. Each such request takes the next
//! value of one SplitMix64 stream seeded with N, in the order requests are
//! submitted, so two identical requests still draw different tokens (as
//! they would without `--seed`), while the same sequence of requests to a
//! fresh server gives the same answers.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::util::rng::SplitMix64;

#[derive(Debug)]
pub struct SeedSequence {
    base: u64,
    taken: AtomicU64,
}

impl SeedSequence {
    pub fn new(base: u64) -> SeedSequence {
        SeedSequence {
            base,
            taken: AtomicU64::new(0),
        }
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    /// The next request's seed: the i-th value of the stream, found by
    /// seeding at `base + i` (SplitMix64's own step) and mixing once.
    pub fn next(&self) -> u64 {
        let i = self.taken.fetch_add(1, Ordering::Relaxed);
        SplitMix64::new(self.base.wrapping_add(i)).next_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_base_gives_the_same_distinct_seeds() {
        let a = SeedSequence::new(7);
        let b = SeedSequence::new(7);
        let first: Vec<u64> = (0..4).map(|_| a.next()).collect();
        let again: Vec<u64> = (0..4).map(|_| b.next()).collect();
        assert_eq!(first, again);
        let mut unique = first.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 4);
        assert_ne!(SeedSequence::new(8).next(), first[0]);
    }
}
