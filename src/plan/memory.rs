//! The memory formulas: every byte count sparkrt prints or allocates comes
//! from here (the plan, the allocator's ledger and the monitor all use it).

use serde::{Deserialize, Serialize};

/// Groups the plan and `inspect` report weight bytes by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightGroup {
    Embeddings,
    Attention,
    Router,
    Experts,
    DenseMlp,
    Norms,
    LmHead,
}

impl WeightGroup {
    pub const ALL: [WeightGroup; 7] = [
        WeightGroup::Embeddings,
        WeightGroup::Attention,
        WeightGroup::Router,
        WeightGroup::Experts,
        WeightGroup::DenseMlp,
        WeightGroup::Norms,
        WeightGroup::LmHead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WeightGroup::Embeddings => "embeddings",
            WeightGroup::Attention => "attention",
            WeightGroup::Router => "router",
            WeightGroup::Experts => "experts",
            WeightGroup::DenseMlp => "dense_mlp",
            WeightGroup::Norms => "norms",
            WeightGroup::LmHead => "lm_head",
        }
    }
}
