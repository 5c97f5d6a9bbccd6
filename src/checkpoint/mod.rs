//! Safetensors checkpoints: mapped once, validated completely, viewed in place.
//!
//! One path in ([`files`]): [`CheckpointFiles::open`] locates the files,
//! opens each and reads and validates its header once (`header` for each
//! file, `assemble` across files), touching no tensor byte; its
//! [`HeaderSet`] is what the plan counts, and [`CheckpointFiles::map`] then
//! maps those same open files into a [`Checkpoint`], whose zero-copy views
//! borrow the mapping. [`read_headers`] and [`Checkpoint::open`] are the two
//! halves taken alone.
//!
//! The folder is assumed not to change while it is open: a file shrunk by
//! another process after validation would still fault on access, as with any
//! memory-mapped reader.

pub mod check;
pub mod config;
pub mod dtype;
pub mod error;
pub mod files;
pub mod fp8;
pub mod glob;
pub mod groups;
pub mod header;
mod header_set;
pub mod kv_scales;
mod layout;
pub mod linear;
pub mod load;
mod mapped;
pub mod page_cache;
pub mod quant;
pub mod quant_config;
mod quant_gptq;
pub mod quant_types;
pub mod residency;
pub mod scripted;
pub mod synthetic;
pub mod view;
mod weights;
mod weights_int4;

use std::path::Path;

pub use check::{TensorCatalog, check_tensors};
pub use config::ModelConfig;
pub use dtype::Dtype;
pub use error::{CheckpointError, TensorProblem};
pub use files::CheckpointFiles;
pub use header::HeaderError;
pub use header_set::{HeaderSet, ShardInfo, TensorInfo};
pub use layout::{INDEX_FILE, SINGLE_FILE};
pub use linear::{LinearWeight, WeightData};
pub use mapped::Checkpoint;
pub use page_cache::PageCachePolicy;
pub use view::{Element, Elements, F8E4M3, TensorView};

/// Reads and validates the headers of the checkpoint in `dir` without mapping
/// or reading any tensor data.
pub fn read_headers(dir: &Path) -> Result<HeaderSet, CheckpointError> {
    Ok(CheckpointFiles::open(dir)?.into_headers())
}

/// Loads `config.json`, opens the checkpoint and checks that it holds exactly
/// the tensors the architecture needs: what an engine calls before running.
pub fn load(dir: &Path) -> Result<(ModelConfig, Checkpoint), CheckpointError> {
    let config = ModelConfig::load(dir)?;
    let checkpoint = Checkpoint::open(dir)?;
    check_tensors(&config, &checkpoint)?;
    Ok((config, checkpoint))
}

// Opening stays here, above both halves: `files` builds the `Checkpoint`
// that `mapped` defines, so neither can name the other's entry.
impl Checkpoint {
    /// Maps every file of the checkpoint in `dir`, every header validated
    /// before any tensor byte can be reached ([`CheckpointFiles::open`]
    /// then [`CheckpointFiles::map`]).
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        CheckpointFiles::open(dir)?.map()
    }
}
