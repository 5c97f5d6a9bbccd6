//! The unified pool split into what the bar draws, left to right, and where
//! its eviction and usable lines fall. Pure arithmetic on one sample.

use sparkrt_wire::{Category, HostSnapshot, WeightsResidency};

use crate::memory::ServerMemory;

/// The eviction margin (MemAvailable − evictionHard) below this share of
/// MemTotal turns the pool yellow: on a 128 GiB Spark that is ~12.8 GiB,
/// about what one more long-context request can take.
pub const MARGIN_WARNING_FRACTION: f64 = 0.10;
/// Below this share it turns red: ~6.4 GiB on a Spark; the guard should be
/// refusing work by now.
pub const MARGIN_CRITICAL_FRACTION: f64 = 0.05;

/// How close MemAvailable is to the eviction line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarginLevel {
    Comfortable,
    Warning,
    Critical,
}

impl MarginLevel {
    pub fn of(eviction_margin: i128, mem_total: u64) -> MarginLevel {
        let share = eviction_margin as f64 / mem_total.max(1) as f64;
        if share < MARGIN_CRITICAL_FRACTION {
            MarginLevel::Critical
        } else if share < MARGIN_WARNING_FRACTION {
            MarginLevel::Warning
        } else {
            MarginLevel::Comfortable
        }
    }
}

/// What a stretch of the bar stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentKind {
    Weights,
    MoeWorkspace,
    KvUsed,
    KvFree,
    /// The recurrent-state pool of hybrid (Gated DeltaNet) models.
    RecurrentState,
    Activations,
    Overhead,
    OtherProcesses,
    PageCache,
    Free,
}

impl SegmentKind {
    pub fn label(self) -> &'static str {
        match self {
            SegmentKind::Weights => "weights",
            SegmentKind::MoeWorkspace => "moe workspace",
            SegmentKind::KvUsed => "kv used",
            SegmentKind::KvFree => "kv free",
            // Short: the legend fits 80 columns.
            SegmentKind::RecurrentState => "gdn state",
            SegmentKind::Activations => "activations",
            SegmentKind::Overhead => "overhead",
            SegmentKind::OtherProcesses => "other processes",
            SegmentKind::PageCache => "page cache",
            SegmentKind::Free => "free",
        }
    }

    pub fn is_runtime(self) -> bool {
        !matches!(
            self,
            SegmentKind::OtherProcesses | SegmentKind::PageCache | SegmentKind::Free
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub kind: SegmentKind,
    pub bytes: u64,
}

/// The pool as the bar draws it.
///
/// Order: the runtime's categories, other processes, page cache, free. The
/// memory that is not available (runtime + others) thus fills the bar from
/// the left up to MemTotal − MemAvailable, and the gap from there to the
/// eviction line is exactly the eviction margin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolBreakdown {
    pub mem_total: u64,
    /// Left to right; the bytes add up to `mem_total`.
    pub segments: Vec<Segment>,
    /// What the runtime holds, all categories (0 without a server).
    pub runtime_total: u64,
    /// Offset of the eviction line: MemTotal − evictionHard. Used memory
    /// reaching it means MemAvailable reached evictionHard.
    pub eviction_at: u64,
    /// Offset of the plan's usable line (the plan's headroom), when the
    /// host source knows it.
    pub usable_at: Option<u64>,
    /// [`HostSnapshot::eviction_margin`]: MemAvailable − evictionHard.
    pub eviction_margin: i128,
    pub level: MarginLevel,
}

impl PoolBreakdown {
    pub fn new(host: &HostSnapshot, server: Option<&ServerMemory>) -> PoolBreakdown {
        let total = host.mem_total;
        let runtime = server.map(runtime_segments).unwrap_or_default();
        let runtime_total = runtime
            .iter()
            .fold(0u64, |sum, s| sum.saturating_add(s.bytes));

        let not_available = total.saturating_sub(host.mem_available);
        let others = not_available.saturating_sub(runtime_total);
        // Mapped weights are file pages: Cached counts them, and so does the
        // weights segment. Count them once.
        let mapped_weights = server
            .filter(|s| s.ledger.weights_residency == WeightsResidency::Mapped)
            .and_then(|s| s.category(Category::Weights))
            .map_or(0, |w| w.allocated);
        let page_cache = host.page_cache().saturating_sub(mapped_weights);

        let mut wanted = runtime;
        wanted.push(Segment {
            kind: SegmentKind::OtherProcesses,
            bytes: others,
        });
        wanted.push(Segment {
            kind: SegmentKind::PageCache,
            bytes: page_cache,
        });

        // Lay the segments out within MemTotal (readings taken a moment apart
        // can overshoot it); what is left is free.
        let mut remaining = total;
        let mut segments: Vec<Segment> = wanted
            .into_iter()
            .map(|segment| {
                let bytes = segment.bytes.min(remaining);
                remaining -= bytes;
                Segment { bytes, ..segment }
            })
            .collect();
        segments.push(Segment {
            kind: SegmentKind::Free,
            bytes: remaining,
        });

        let eviction_margin = host.eviction_margin();
        PoolBreakdown {
            mem_total: total,
            segments,
            runtime_total,
            eviction_at: total.saturating_sub(host.eviction_hard),
            usable_at: host.usable.map(|u| u.min(total)),
            eviction_margin,
            level: MarginLevel::of(eviction_margin, total),
        }
    }

    pub fn bytes_of(&self, kind: SegmentKind) -> u64 {
        self.segments
            .iter()
            .filter(|s| s.kind == kind)
            .map(|s| s.bytes)
            .sum()
    }
}

/// The runtime's categories from the ledger, the KV cache split by the `kv`
/// fill. Categories the monitor does not know are drawn as overhead.
fn runtime_segments(server: &ServerMemory) -> Vec<Segment> {
    let allocated = |category| server.category(category).map_or(0, |c| c.allocated);
    let kv_allocated = server.category(Category::KvCache).map_or_else(
        || server.kv.blocks_total.saturating_mul(server.kv.block_bytes),
        |c| c.allocated,
    );
    let kv_used = server.kv_used_bytes().min(kv_allocated);
    let known = Category::ALL.map(Category::name);
    let unknown: u64 = server
        .ledger
        .categories
        .iter()
        .filter(|c| !known.contains(&c.name.as_str()))
        .fold(0, |sum, c| sum.saturating_add(c.allocated));
    let state = allocated(Category::RecurrentState);
    let mut segments = vec![
        Segment {
            kind: SegmentKind::Weights,
            bytes: allocated(Category::Weights),
        },
        Segment {
            kind: SegmentKind::MoeWorkspace,
            bytes: allocated(Category::MoeWorkspace),
        },
        Segment {
            kind: SegmentKind::KvUsed,
            bytes: kv_used,
        },
        Segment {
            kind: SegmentKind::KvFree,
            bytes: kv_allocated - kv_used,
        },
        Segment {
            kind: SegmentKind::Activations,
            bytes: allocated(Category::Activations),
        },
        Segment {
            kind: SegmentKind::Overhead,
            bytes: allocated(Category::RuntimeOverhead).saturating_add(unknown),
        },
    ];
    // Only hybrid models have the pool: no empty legend item for the others.
    if state > 0 {
        segments.insert(
            4,
            Segment {
                kind: SegmentKind::RecurrentState,
                bytes: state,
            },
        );
    }
    segments
}

/// The cell boundary for a byte offset on a bar `width` cells wide: the
/// number of cells before it, in `0..=width`.
pub fn boundary(offset: u64, total: u64, width: u16) -> u16 {
    if total == 0 {
        return 0;
    }
    let cells = u128::from(offset.min(total)) * u128::from(width) / u128::from(total);
    cells as u16
}

/// The cell a line at `offset` is drawn in (the last cell for the very end).
pub fn marker_column(offset: u64, total: u64, width: u16) -> u16 {
    boundary(offset, total, width).min(width.saturating_sub(1))
}
