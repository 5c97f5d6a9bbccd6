//! The limits the engine schedules within and the counters it keeps: plain
//! figures the scheduler and the engine share and the server reads.

use std::sync::atomic::AtomicU64;

use crate::plan::speculative::{MAX_SPECULATIVE_TOKENS, SpeculativeConfig};

/// Limits the engine schedules within (from the plan).
#[derive(Clone, Debug)]
pub struct EngineLimits {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    pub kv_blocks: usize,
    pub kv_block_size: usize,
    /// Tokens a sliding-window layer attends to (0: no such layers).
    pub sliding_window: usize,
    /// Keep full KV blocks for reuse by later requests.
    pub prefix_caching: bool,
    /// Slots of the recurrent-state pool (models with Gated DeltaNet
    /// layers; 0 for attention-only models): one per running sequence.
    pub state_slots: usize,
    /// Slots after those holding the prefix cache's state snapshots (0:
    /// such models reuse no cached prefix).
    pub snapshot_slots: usize,
    /// Prompt positions between a prefill's snapshots (0: only the one at
    /// the prompt's last full block); a multiple of `kv_block_size`.
    pub snapshot_interval: usize,
    /// Speculative decoding (`None`: off).
    pub speculative: Option<SpeculativeConfig>,
}

/// Counters the server exports.
#[derive(Debug, Default)]
pub struct EngineCounters {
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub preemptions: AtomicU64,
    pub steps: AtomicU64,
    /// Tokens of starting sequences looked up in the prefix cache.
    pub prefix_cache_queries: AtomicU64,
    /// Of those, tokens served from the cache (not recomputed).
    pub prefix_cache_hits: AtomicU64,
    /// Recurrent-state snapshots written (hybrid models).
    pub state_snapshots_taken: AtomicU64,
    /// Speculative decoding: steps of a sequence that carried drafts, the
    /// draft tokens verified, those accepted, and those accepted at each
    /// draft position (vLLM's `spec_decode_*`).
    pub spec_drafts: AtomicU64,
    pub spec_draft_tokens: AtomicU64,
    pub spec_accepted_tokens: AtomicU64,
    pub spec_accepted_per_position: [AtomicU64; MAX_SPECULATIVE_TOKENS],
}

/// Speculative decoding's figures so far (`generate --json`, `bench`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct DraftStats {
    /// Steps of a sequence that carried drafts.
    pub drafts: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    /// accepted / draft tokens (0 before any draft).
    pub acceptance_rate: f64,
    /// Tokens a drafting step produced on average: 1 + accepted / drafts
    /// (vLLM's mean acceptance length).
    pub mean_accepted_length: f64,
}

impl EngineCounters {
    pub fn draft_stats(&self) -> DraftStats {
        use std::sync::atomic::Ordering::Relaxed;
        let drafts = self.spec_drafts.load(Relaxed);
        let draft_tokens = self.spec_draft_tokens.load(Relaxed);
        let accepted_tokens = self.spec_accepted_tokens.load(Relaxed);
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        DraftStats {
            drafts,
            draft_tokens,
            accepted_tokens,
            acceptance_rate: ratio(accepted_tokens, draft_tokens),
            mean_accepted_length: if drafts == 0 {
                0.0
            } else {
                1.0 + ratio(accepted_tokens, drafts)
            },
        }
    }
}
