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
pub mod groups;
pub mod header;
mod layout;
pub mod linear;
pub mod load;
pub mod page_cache;
pub mod quant;
pub mod residency;
pub mod scripted;
pub mod synthetic;
pub mod view;
mod weights;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU8;

use memmap2::Mmap;

pub use check::{TensorCatalog, check_tensors};
pub use config::ModelConfig;
pub use dtype::Dtype;
pub use error::{CheckpointError, TensorProblem};
pub use files::CheckpointFiles;
pub use header::HeaderError;
pub use layout::{INDEX_FILE, SINGLE_FILE};
pub use linear::{LinearWeight, WeightData};
pub use page_cache::PageCachePolicy;
pub use view::{Element, Elements, F8E4M3, TensorView};

/// One safetensors file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardInfo {
    pub path: PathBuf,
    /// Size of the whole file.
    pub file_bytes: u64,
    /// Size of the length prefix plus the JSON header (where the data starts).
    pub header_bytes: u64,
}

/// One tensor as its header describes it (validated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub byte_len: u64,
    /// Position of its file in [`HeaderSet::files`].
    pub file: usize,
    /// Absolute offset of its first byte in that file.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> u64 {
        self.byte_len / self.dtype.size() as u64
    }
}

/// The validated headers of every file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderSet {
    pub files: Vec<ShardInfo>,
    /// Every tensor, sorted by name; names are unique across files.
    pub tensors: Vec<TensorInfo>,
}

impl HeaderSet {
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.tensors[i])
    }

    /// Bytes of tensor data (headers and gaps excluded).
    pub fn total_tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.byte_len).sum()
    }

    /// Path of the file holding `tensor`.
    pub fn path_of(&self, tensor: &TensorInfo) -> &Path {
        self.files
            .get(tensor.file)
            .map_or(Path::new(""), |f| f.path.as_path())
    }
}

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

/// A checkpoint whose files are mapped read-only, each once.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    headers: HeaderSet,
    shards: Vec<MappedShard>,
    /// The last page-cache policy applied (a `PageCachePolicy` as u8).
    policy: AtomicU8,
}

#[derive(Debug)]
struct MappedShard {
    file: File,
    map: Mmap,
}

impl Checkpoint {
    /// Maps every file of the checkpoint in `dir`, every header validated
    /// before any tensor byte can be reached ([`CheckpointFiles::open`]
    /// then [`CheckpointFiles::map`]).
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        CheckpointFiles::open(dir)?.map()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn files(&self) -> &[ShardInfo] {
        &self.headers.files
    }

    pub fn headers(&self) -> &HeaderSet {
        &self.headers
    }

    /// Tensor names, sorted.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.headers.tensors.iter().map(|t| t.name.as_str())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.headers.get(name).is_some()
    }

    /// A zero-copy view of tensor `name`.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, CheckpointError> {
        let info = self
            .headers
            .get(name)
            .ok_or_else(|| CheckpointError::NoSuchTensor(name.to_string()))?;
        let path = self.headers.path_of(info);
        // Validation put every tensor inside its mapping; `get` keeps that a
        // checked fact rather than an assumption.
        let bytes = self.shards.get(info.file).and_then(|shard| {
            let start = usize::try_from(info.offset).ok()?;
            let end = start.checked_add(usize::try_from(info.byte_len).ok()?)?;
            shard.map.get(start..end)
        });
        let bytes = bytes.ok_or_else(|| CheckpointError::Header {
            path: path.to_path_buf(),
            source: HeaderError::OffsetsPastEnd {
                tensor: info.name.clone(),
                end: info.offset + info.byte_len,
                data_len: self.files().get(info.file).map_or(0, |f| f.file_bytes),
            },
        })?;
        Ok(TensorView::new(info, path, bytes))
    }

    /// The byte ranges of the mappings the tensors lie in: each tensor's
    /// bytes, adjacent ones of the same file joined (one range per file when
    /// the file has no gaps), so their total is exactly the tensors' bytes.
    /// What a device registers or copies once to read every weight.
    pub fn tensor_regions(&self) -> Result<Vec<&[u8]>, CheckpointError> {
        // (file, start, end) of every non-empty tensor, checked in its mapping.
        let mut ranges = Vec::with_capacity(self.headers.tensors.len());
        for info in &self.headers.tensors {
            if !self.tensor(&info.name)?.bytes().is_empty() {
                ranges.push((info.file, info.offset, info.offset + info.byte_len));
            }
        }
        ranges.sort_unstable();
        let mut joined: Vec<(usize, u64, u64)> = Vec::with_capacity(ranges.len());
        for (file, start, end) in ranges {
            match joined.last_mut() {
                Some(last) if last.0 == file && last.2 == start => last.2 = end,
                _ => joined.push((file, start, end)),
            }
        }
        // Each piece was checked above, so every joined range is inside its
        // mapping: `mapped` never drops one.
        Ok(joined
            .into_iter()
            .filter_map(|(file, start, end)| self.mapped(file, start, end))
            .collect())
    }

    /// Bytes `start..end` of file `file`'s mapping, if they lie inside it.
    fn mapped(&self, file: usize, start: u64, end: u64) -> Option<&[u8]> {
        let range = usize::try_from(start).ok()?..usize::try_from(end).ok()?;
        self.shards.get(file)?.map.get(range)
    }
}
