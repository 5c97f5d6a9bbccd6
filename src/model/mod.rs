//! The transformer, written once over [`Backend`]: qwen3_moe, gpt_oss,
//! qwen3_5_moe, qwen3_5 and qwen3_next are the same stack of blocks with
//! different options, loaded by `qwen3_moe.rs`, `gpt_oss.rs` and
//! `qwen3_5.rs` from a [`WeightSource`]. A block mixes tokens with
//! attention or with a Gated DeltaNet ([`Mixer`]), then runs its MLP.

mod buffers;
mod error;
pub mod gpt_oss;
mod layers;
pub mod qwen3_5;
pub mod qwen3_moe;
pub mod rope;
pub mod source;
mod transformer;

use crate::backend::Backend;
use crate::checkpoint::config::ModelConfig;
use crate::geometry::Architecture;
pub use buffers::{Buffers, HybridBuffers, SharedExpertBuffers};
pub use error::ModelError;
pub use layers::{
    Attention, DeltaNet, DeltaNetInput, Layer, Mixer, Mlp, ModelSettings, MtpHead, SharedExpert,
};
pub use source::WeightSource;
pub use transformer::Transformer;

// The architecture dispatch stays here, above the loaders it chooses
// between: each loader builds a `Transformer`, so `transformer.rs` cannot
// name them without a loop.
impl<'w, B: Backend + 'w> Transformer<'w, B> {
    /// Builds the model of `config` from `source`'s weights.
    pub fn load(
        backend: &B,
        config: &ModelConfig,
        source: &'w dyn WeightSource,
    ) -> Result<Self, ModelError> {
        match config.geometry.architecture {
            Architecture::Qwen3Moe => qwen3_moe::load(backend, config, source),
            Architecture::GptOss => gpt_oss::load(backend, config, source),
            Architecture::Qwen35Moe | Architecture::Qwen35 | Architecture::Qwen3Next => {
                qwen3_5::load(backend, config, source)
            }
        }
    }
}
