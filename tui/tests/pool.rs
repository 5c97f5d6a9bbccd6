//! The pool breakdown against figures worked out by hand from the canned
//! host (128 GiB total, 40 GiB available, Cached+Buffers 25 GiB, evictionHard
//! 16 GiB, usable 96 GiB) and ledger (84 GiB held, KV 5 of 20 GiB used).

use crate::common;

use common::{GIB, canned_host, canned_memory};
use sparkrt_tui::pool::{
    MARGIN_CRITICAL_FRACTION, MARGIN_WARNING_FRACTION, MarginLevel, PoolBreakdown, SegmentKind,
    boundary, marker_column,
};
use sparkrt_wire::{LedgerEntry, WeightsResidency};

fn layout(pool: &PoolBreakdown) -> Vec<(SegmentKind, u64)> {
    pool.segments.iter().map(|s| (s.kind, s.bytes)).collect()
}

#[test]
fn canned_pool_splits_as_worked_out_by_hand() {
    let pool = PoolBreakdown::new(&canned_host(), Some(&canned_memory()));
    // Not available: 128 − 40 = 88 GiB, of which the runtime holds 84, so
    // other processes hold 4. Free: 128 − 84 − 4 − 25 = 15.
    assert_eq!(
        layout(&pool),
        vec![
            (SegmentKind::Weights, 60 * GIB),
            (SegmentKind::MoeWorkspace, 2 * GIB),
            (SegmentKind::KvUsed, 5 * GIB),
            (SegmentKind::KvFree, 15 * GIB),
            (SegmentKind::Activations, GIB),
            (SegmentKind::Overhead, GIB),
            (SegmentKind::OtherProcesses, 4 * GIB),
            (SegmentKind::PageCache, 25 * GIB),
            (SegmentKind::Free, 15 * GIB),
        ]
    );
    assert_eq!(pool.runtime_total, 84 * GIB);
    assert_eq!(pool.eviction_at, 112 * GIB);
    assert_eq!(pool.usable_at, Some(96 * GIB));
    assert_eq!(pool.eviction_margin, i128::from(24 * GIB));
    // 24 / 128 = 18.75 % ≥ 10 %.
    assert_eq!(pool.level, MarginLevel::Comfortable);
}

#[test]
fn used_memory_ends_where_the_eviction_margin_begins() {
    // Runtime + others end at MemTotal − MemAvailable = 88 GiB; the eviction
    // line is at 112 GiB; the gap is the 24 GiB eviction margin.
    let pool = PoolBreakdown::new(&canned_host(), Some(&canned_memory()));
    let used: u64 = pool
        .segments
        .iter()
        .filter(|s| s.kind.is_runtime() || s.kind == SegmentKind::OtherProcesses)
        .map(|s| s.bytes)
        .sum();
    assert_eq!(used, 88 * GIB);
    assert_eq!(i128::from(pool.eviction_at - used), pool.eviction_margin);
}

#[test]
fn without_a_server_the_pool_is_host_only() {
    let pool = PoolBreakdown::new(&canned_host(), None);
    assert_eq!(
        layout(&pool),
        vec![
            (SegmentKind::OtherProcesses, 88 * GIB),
            (SegmentKind::PageCache, 25 * GIB),
            (SegmentKind::Free, 15 * GIB),
        ]
    );
    assert_eq!(pool.runtime_total, 0);
}

#[test]
fn mapped_weights_are_not_counted_twice() {
    let mut memory = canned_memory();
    memory.ledger.weights_residency = WeightsResidency::Mapped;
    let pool = PoolBreakdown::new(&canned_host(), Some(&memory));
    // Cached+Buffers 25 GiB minus 60 GiB of mapped weights floors at 0.
    assert_eq!(pool.bytes_of(SegmentKind::PageCache), 0);
    assert_eq!(pool.bytes_of(SegmentKind::Weights), 60 * GIB);
    // Free takes what is left: 128 − 84 − 4.
    assert_eq!(pool.bytes_of(SegmentKind::Free), 40 * GIB);
}

#[test]
fn runtime_larger_than_used_floors_others_and_stays_within_total() {
    let mut host = canned_host();
    host.mem_available = 100 * GIB; // only 28 GiB "used", runtime says 84
    let pool = PoolBreakdown::new(&host, Some(&canned_memory()));
    assert_eq!(pool.bytes_of(SegmentKind::OtherProcesses), 0);
    // 84 + 0 + 25 = 109; free 19.
    assert_eq!(pool.bytes_of(SegmentKind::Free), 19 * GIB);
    let sum: u64 = pool.segments.iter().map(|s| s.bytes).sum();
    assert_eq!(sum, 128 * GIB);
}

#[test]
fn overshooting_readings_are_clipped_to_mem_total() {
    let mut host = canned_host();
    host.cached = 200 * GIB;
    let pool = PoolBreakdown::new(&host, Some(&canned_memory()));
    // 84 runtime + 4 others leave 40 for page cache, none free.
    assert_eq!(pool.bytes_of(SegmentKind::PageCache), 40 * GIB);
    assert_eq!(pool.bytes_of(SegmentKind::Free), 0);
}

#[test]
fn kv_split_follows_the_fill_within_the_allocation() {
    let mut memory = canned_memory();
    memory.kv.blocks_used = memory.kv.blocks_total;
    let pool = PoolBreakdown::new(&canned_host(), Some(&memory));
    assert_eq!(pool.bytes_of(SegmentKind::KvUsed), 20 * GIB);
    assert_eq!(pool.bytes_of(SegmentKind::KvFree), 0);

    // No kv_cache ledger row: the allocation is blocks_total × block_bytes.
    let mut memory = canned_memory();
    memory.ledger.categories.retain(|c| c.name != "kv_cache");
    let pool = PoolBreakdown::new(&canned_host(), Some(&memory));
    assert_eq!(pool.bytes_of(SegmentKind::KvUsed), 5 * GIB);
    assert_eq!(pool.bytes_of(SegmentKind::KvFree), 15 * GIB);
}

#[test]
fn unknown_categories_are_drawn_as_overhead() {
    let mut memory = canned_memory();
    memory.ledger.categories.push(LedgerEntry {
        name: "future_thing".to_string(),
        planned: 3 * GIB,
        allocated: 3 * GIB,
    });
    let pool = PoolBreakdown::new(&canned_host(), Some(&memory));
    assert_eq!(pool.bytes_of(SegmentKind::Overhead), 4 * GIB);
    assert_eq!(pool.runtime_total, 87 * GIB);
}

#[test]
fn margin_levels_change_at_the_thresholds() {
    let total = 1000u64;
    let warn = (MARGIN_WARNING_FRACTION * total as f64) as i128;
    let critical = (MARGIN_CRITICAL_FRACTION * total as f64) as i128;
    assert_eq!(MarginLevel::of(warn, total), MarginLevel::Comfortable);
    assert_eq!(MarginLevel::of(warn - 1, total), MarginLevel::Warning);
    assert_eq!(MarginLevel::of(critical, total), MarginLevel::Warning);
    assert_eq!(MarginLevel::of(critical - 1, total), MarginLevel::Critical);
    assert_eq!(MarginLevel::of(-5, total), MarginLevel::Critical);
    assert_eq!(MarginLevel::of(0, 0), MarginLevel::Critical);
}

#[test]
fn margin_past_the_line_is_negative_and_critical() {
    let mut host = canned_host();
    host.mem_available = 10 * GIB;
    let pool = PoolBreakdown::new(&host, None);
    assert_eq!(pool.eviction_margin, -i128::from(6 * GIB));
    assert_eq!(pool.level, MarginLevel::Critical);
}

#[test]
fn columns_are_proportional_and_stay_on_the_bar() {
    // 112 of 128 on 120 cells: 105.
    assert_eq!(boundary(112, 128, 120), 105);
    assert_eq!(marker_column(112, 128, 120), 105);
    assert_eq!(boundary(128, 128, 120), 120);
    assert_eq!(marker_column(128, 128, 120), 119);
    assert_eq!(marker_column(0, 128, 120), 0);
    assert_eq!(boundary(5, 0, 120), 0);
    assert_eq!(marker_column(5, 128, 0), 0);
    // Offsets past the total are clamped, and u64::MAX does not overflow.
    assert_eq!(boundary(u64::MAX, u64::MAX, 200), 200);
    assert_eq!(boundary(500, 128, 120), 120);
}
