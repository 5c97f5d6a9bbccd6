//! KV block bookkeeping: hand-worked cases and a randomised run checked
//! against a simple model.

use std::collections::{HashMap, HashSet};

use sparkrt::engine::kv_blocks::{BlockAllocator, BlockTable, KvBlocksError, SeqId};
use sparkrt::util::rng::SplitMix64;

#[test]
fn construction_is_validated() {
    assert_eq!(
        BlockAllocator::new(4, 0).err(),
        Some(KvBlocksError::ZeroBlockSize)
    );
    let too_many = u32::MAX as usize + 1;
    assert_eq!(
        BlockAllocator::new(too_many, 16).err(),
        Some(KvBlocksError::TooManyBlocks {
            requested: too_many
        })
    );
    let a = BlockAllocator::new(0, 16).unwrap();
    assert_eq!((a.free_blocks(), a.used_blocks()), (0, 0));
}

#[test]
fn tables_grow_and_slots_address_the_blocks() {
    let mut a = BlockAllocator::new(10, 16).unwrap();
    a.allocate_for(1, 20).unwrap();
    assert_eq!(a.table(1).unwrap().blocks(), &[0, 1]);
    a.allocate_for(2, 1).unwrap();
    assert_eq!(a.table(2).unwrap().blocks(), &[2]);
    // Still within two blocks: nothing new.
    a.allocate_for(1, 32).unwrap();
    assert_eq!(a.table(1).unwrap().blocks(), &[0, 1]);
    a.allocate_for(1, 33).unwrap();
    assert_eq!(a.table(1).unwrap().blocks(), &[0, 1, 3]);
    assert_eq!((a.used_blocks(), a.free_blocks(), a.num_seqs()), (4, 6, 2));

    let t1 = a.table(1).unwrap();
    assert_eq!(a.slot(t1, 0), Some(0));
    assert_eq!(a.slot(t1, 17), Some(17));
    assert_eq!(a.slot(t1, 32), Some(3 * 16));
    assert_eq!(a.slot(t1, 47), Some(3 * 16 + 15));
    assert_eq!(a.slot(t1, 48), None);
    assert_eq!(a.slot(a.table(2).unwrap(), 5), Some(2 * 16 + 5));

    assert_eq!(a.blocks_for_tokens(0), 0);
    assert_eq!(a.blocks_for_tokens(16), 1);
    assert_eq!(a.blocks_for_tokens(17), 2);
    assert_eq!(a.blocks_needed(1, 100), 7 - 3);
    assert_eq!(a.blocks_needed(99, 100), 7);
    assert!(a.can_allocate(6));
    assert!(!a.can_allocate(7));
}

#[test]
fn failed_allocation_changes_nothing() {
    let mut a = BlockAllocator::new(4, 4).unwrap();
    a.allocate_for(1, 8).unwrap();
    let before = a.table(1).unwrap().clone();
    assert_eq!(
        a.allocate_for(1, 8 + 3 * 4),
        Err(KvBlocksError::OutOfBlocks { needed: 3, free: 2 })
    );
    assert_eq!(a.table(1).unwrap(), &before);
    assert_eq!((a.used_blocks(), a.free_blocks()), (2, 2));
    // A new sequence that does not fit gets no table at all.
    assert!(a.allocate_for(2, 100).is_err());
    assert!(a.table(2).is_none());
    assert_eq!(a.num_seqs(), 1);
    // What does fit still works.
    a.allocate_for(2, 8).unwrap();
    assert_eq!(a.free_blocks(), 0);
}

#[test]
fn free_returns_every_block() {
    let mut a = BlockAllocator::new(8, 2).unwrap();
    a.allocate_for(1, 5).unwrap();
    a.allocate_for(2, 4).unwrap();
    assert_eq!(a.free(1), 3);
    assert_eq!(a.free(1), 0, "freeing twice returns nothing more");
    assert_eq!(a.free(42), 0);
    assert_eq!((a.used_blocks(), a.free_blocks()), (2, 6));
    // Freed blocks are reused, lowest first.
    a.allocate_for(3, 6).unwrap();
    assert_eq!(a.table(3).unwrap().blocks(), &[0, 1, 2]);
    assert_eq!(a.free(2) + a.free(3), 5);
    assert_eq!(a.free_blocks(), 8);
    assert_eq!(a.num_seqs(), 0);
}

#[test]
fn sliding_blocks_leave_the_window_and_stay_cached() {
    // 16 blocks of 4 tokens, window 8: each position takes a full block and
    // a sliding twin, handed out alternately (free blocks go out 0, 1, 2…).
    let mut a = BlockAllocator::new(16, 4).unwrap().with_sliding_window(8);
    assert_eq!(a.blocks_needed(1, 20), 10);
    a.allocate_for(1, 20).unwrap();
    assert_eq!(a.table(1).unwrap().blocks(), &[0, 2, 4, 6, 8]);
    assert_eq!(a.sliding_table(1).unwrap().blocks(), &[1, 3, 5, 7, 9]);
    // After 7 tokens the next one (position 7) sees positions 0..=7.
    assert_eq!(a.release_out_of_window(1, 7), 0);
    // After 12: position 12 sees 5..=12, so block 0 (0..4) goes.
    assert_eq!(a.release_out_of_window(1, 12), 1);
    // After 18: position 18 sees 11..=18; block 1 (4..8) goes, 2 (8..12) stays.
    assert_eq!(a.release_out_of_window(1, 18), 1);
    let no = sparkrt::engine::kv_blocks::NO_BLOCK;
    assert_eq!(a.sliding_table(1).unwrap().blocks(), &[no, no, 5, 7, 9]);
    assert_eq!(a.free_blocks(), 8);
    a.audit().unwrap();

    // Registered first, a released twin is cached, not free, and a second
    // sequence with the same tokens hits the full blocks and the last
    // window's twins only.
    let tokens: Vec<u32> = (100..120).collect();
    let mut b = BlockAllocator::new(32, 4).unwrap().with_sliding_window(8);
    b.allocate_for(1, 20).unwrap();
    b.register_computed(1, &tokens, 20);
    assert_eq!(b.release_out_of_window(1, 20), 3);
    assert_eq!(b.cached_blocks(), 3);
    b.free(1);
    b.audit().unwrap();
    // 19 tokens known: 4 full blocks; position 16 sees 9..=16, so the twins
    // of blocks 2 and 3 are needed and cached (0 and 1 are not needed).
    let hit = b.lookup(0, &tokens[..19]);
    assert_eq!(hit.blocks, vec![0, 2, 4, 6]);
    assert_eq!(hit.sliding, vec![no, no, 5, 7]);
    // Other tokens from position 9: blocks 0 and 1 match; a hit of 2
    // blocks needs the twins of both (position 8 sees 1..=8), released
    // out of the window but cached: it stands.
    let mut other = tokens.clone();
    other[9] = 0;
    let hit = b.lookup(0, &other[..19]);
    assert_eq!(hit.blocks, vec![0, 2]);
    assert_eq!(hit.sliding, vec![1, 3]);
    b.audit().unwrap();
}

#[test]
fn a_fork_shares_full_blocks_and_copies_the_partial_one() {
    let no = sparkrt::engine::kv_blocks::NO_BLOCK;
    let mut a = BlockAllocator::new(16, 4).unwrap().with_sliding_window(4);
    a.allocate_for(1, 10).unwrap();
    assert_eq!(a.table(1).unwrap().blocks(), &[0, 2, 4]);
    assert_eq!(a.release_out_of_window(1, 10), 1);
    assert_eq!(a.sliding_table(1).unwrap().blocks(), &[no, 3, 5]);
    let pairs = a.fork(1, 2, 10).unwrap();
    // Block 2 of each table (positions 8..10) is partial: copied, into
    // the block released last (1), then the next free one (6).
    assert_eq!(pairs, vec![(4, 1), (5, 6)]);
    assert_eq!(a.table(2).unwrap().blocks(), &[0, 2, 1]);
    assert_eq!(a.sliding_table(2).unwrap().blocks(), &[no, 3, 6]);
    a.audit().unwrap();
    a.free(1);
    a.audit().unwrap();
    // Blocks 0, 2, 1 and 3, 6 are the fork's.
    assert_eq!(a.used_blocks(), 5);
    a.free(2);
    assert_eq!(a.free_blocks(), 16);
    // A block-aligned fork copies nothing.
    a.allocate_for(3, 8).unwrap();
    assert_eq!(a.fork(3, 4, 8).unwrap(), vec![]);
    a.audit().unwrap();
}

/// Checks every invariant of the allocator against the model (sequence →
/// tokens it asked for).
fn check(a: &BlockAllocator, model: &HashMap<SeqId, usize>, block_size: usize) {
    let mut seen = HashSet::new();
    let mut held = 0;
    for (&seq, &tokens) in model {
        let table = a.table(seq).unwrap();
        assert_eq!(table.len(), tokens.div_ceil(block_size), "seq {seq}");
        for &block in table.blocks() {
            assert!((block as usize) < a.num_blocks());
            assert!(seen.insert(block), "block {block} handed out twice");
        }
        held += table.len();
        // Every position maps to a distinct slot inside its block.
        for pos in 0..tokens {
            let slot = a.slot(table, pos).unwrap();
            assert_eq!(slot / block_size, table.blocks()[pos / block_size] as usize);
        }
    }
    assert_eq!(a.num_seqs(), model.len());
    assert_eq!(a.used_blocks(), held);
    assert_eq!(a.used_blocks() + a.free_blocks(), a.num_blocks());
}

#[test]
fn random_allocations_and_frees_keep_the_books_straight() {
    let (num_blocks, block_size) = (64, 4);
    let mut a = BlockAllocator::new(num_blocks, block_size).unwrap();
    let mut model: HashMap<SeqId, usize> = HashMap::new();
    let mut rng = SplitMix64::new(2024);
    let (mut failures, mut successes) = (0, 0);
    for _ in 0..20_000 {
        let seq = rng.next_u64() % 12;
        if rng.next_u64().is_multiple_of(4) {
            let want = model.remove(&seq).map_or(0, |t| t.div_ceil(block_size));
            assert_eq!(a.free(seq), want);
        } else {
            let tokens = (rng.next_u64() % 80) as usize;
            let have = model.get(&seq).copied().unwrap_or(0);
            let needed = tokens
                .div_ceil(block_size)
                .saturating_sub(have.div_ceil(block_size));
            let free_before = a.free_blocks();
            let tables_before: Vec<Option<BlockTable>> =
                (0..12).map(|s| a.table(s).cloned()).collect();
            match a.allocate_for(seq, tokens) {
                Ok(()) => {
                    assert!(needed <= free_before);
                    model.insert(seq, have.max(tokens));
                    successes += 1;
                }
                Err(err) => {
                    assert_eq!(
                        err,
                        KvBlocksError::OutOfBlocks {
                            needed,
                            free: free_before
                        }
                    );
                    let tables_after: Vec<Option<BlockTable>> =
                        (0..12).map(|s| a.table(s).cloned()).collect();
                    assert_eq!(tables_after, tables_before);
                    assert_eq!(a.free_blocks(), free_before);
                    failures += 1;
                }
            }
        }
        check(&a, &model, block_size);
    }
    // The run exercised both outcomes.
    assert!(
        failures > 100 && successes > 1000,
        "{failures} failures, {successes} successes"
    );
    for seq in 0..12 {
        a.free(seq);
    }
    assert_eq!(a.free_blocks(), num_blocks);
}

/// Prefix caching by hand, blocks of 2 tokens: a sequence's full computed
/// blocks are registered, outlive it as cached blocks, are found by a later
/// sequence with the same tokens (and salt) and are evicted least recently
/// used first when no free block is left.
#[test]
fn cached_blocks_are_shared_then_evicted_least_recently_used_first() {
    use sparkrt::engine::kv_blocks::root_hash;
    let mut a = BlockAllocator::new(6, 2).unwrap();
    let root = root_hash(None);
    let tokens = [1, 2, 3, 4, 5];
    a.start(1, root, Default::default());
    a.allocate_for(1, 5).unwrap();
    a.register_computed(1, &tokens, 5);
    assert_eq!(a.table(1).unwrap().blocks(), &[0, 1, 2]);
    // Nothing is cached while the sequence holds its blocks.
    assert_eq!(
        (a.used_blocks(), a.cached_blocks(), a.free_blocks()),
        (3, 0, 3)
    );
    let hit = a.lookup(root, &tokens);
    assert_eq!(
        hit.blocks,
        vec![0, 1],
        "the two full blocks, not the partial third"
    );
    assert_eq!(a.unreferenced_in(&hit), 0);
    assert_eq!(a.free(1), 3);
    // Its full blocks stay cached; the partial one is free.
    assert_eq!(
        (a.used_blocks(), a.cached_blocks(), a.free_blocks()),
        (0, 2, 4)
    );
    a.audit().unwrap();

    // Another salt, or other tokens, find nothing.
    assert!(a.lookup(root_hash(Some("s")), &tokens).blocks.is_empty());
    assert_eq!(a.lookup(root, &[1, 2, 9, 9]).blocks, vec![0]);
    // The same tokens share both blocks.
    let hit = a.lookup(root, &[1, 2, 3, 4, 7]);
    assert_eq!(a.unreferenced_in(&hit), 2);
    a.start(2, root, hit.clone());
    a.start(3, root, hit);
    assert_eq!((a.used_blocks(), a.cached_blocks()), (2, 0));
    a.allocate_for(2, 5).unwrap();
    a.audit().unwrap();
    assert_eq!(a.free(3), 2);
    assert_eq!(
        a.used_blocks(),
        3,
        "sequence 2 still references the shared blocks"
    );
    assert_eq!(a.free(2), 3);
    assert_eq!(
        (a.used_blocks(), a.cached_blocks(), a.free_blocks()),
        (0, 2, 4)
    );

    // Free blocks go first; then the cached ones, the chain's tail (block 1,
    // dropped first) before its head.
    a.allocate_for(4, 8).unwrap();
    assert_eq!(a.cached_blocks(), 2);
    a.allocate_for(4, 10).unwrap();
    assert_eq!(a.table(4).unwrap().blocks().last(), Some(&1));
    assert_eq!(
        a.lookup(root, &tokens).blocks,
        vec![0],
        "block 1 was evicted"
    );
    a.allocate_for(4, 12).unwrap();
    assert!(a.lookup(root, &tokens).blocks.is_empty());
    assert_eq!(a.cached_blocks(), 0);
    a.audit().unwrap();
}

#[test]
fn without_prefix_caching_nothing_is_kept() {
    use sparkrt::engine::kv_blocks::root_hash;
    let mut a = BlockAllocator::new(4, 2)
        .unwrap()
        .with_prefix_caching(false);
    a.allocate_for(1, 4).unwrap();
    a.register_computed(1, &[1, 2, 3, 4], 4);
    a.free(1);
    assert_eq!((a.cached_blocks(), a.free_blocks()), (0, 4));
    assert!(a.lookup(root_hash(None), &[1, 2, 3, 4]).blocks.is_empty());
    a.audit().unwrap();
}
