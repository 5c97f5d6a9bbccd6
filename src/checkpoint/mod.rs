//! Safetensors checkpoints: mapped once, validated completely, viewed in place.
//!
//! Two readers share one validation path (`header` for each file, `assemble`
//! across files):
//! - [`read_headers`] reads only the length prefix and JSON header of each
//!   file (the plan's exact byte counts, no tensor data touched);
//! - [`Checkpoint::open`] validates the same way, then maps each file once
//!   and hands out zero-copy views that borrow the mapping.
//!
//! The folder is assumed not to change while it is open: a file shrunk by
//! another process after validation would still fault on access, as with any
//! memory-mapped reader.

pub mod check;
pub mod config;
pub mod dtype;
pub mod error;
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
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU8;

use memmap2::Mmap;

use crate::limits;
use crate::util::files::open_regular;

pub use check::{TensorCatalog, check_tensors};
pub use config::ModelConfig;
pub use dtype::Dtype;
pub use error::{CheckpointError, TensorProblem};
pub use header::HeaderError;
pub use layout::{INDEX_FILE, SINGLE_FILE};
pub use linear::{LinearWeight, WeightData};
pub use page_cache::PageCachePolicy;
pub use view::{Element, Elements, F8E4M3, TensorView};

use header::{LENGTH_PREFIX_BYTES, ParsedHeader};
use layout::Layout;

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
    let layout = layout::locate(dir)?;
    let mut headers = Vec::with_capacity(layout.files.len());
    let mut tensors = 0;
    for path in &layout.files {
        let header = read_file_header(path)?;
        tensors = count_tensors(tensors, &header, path)?;
        headers.push(header);
    }
    assemble(&layout, headers)
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
    /// Maps every file of the checkpoint in `dir` and validates every header
    /// before any tensor byte can be reached.
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let layout = layout::locate(dir)?;
        let mut shards = Vec::with_capacity(layout.files.len());
        let mut headers = Vec::with_capacity(layout.files.len());
        let mut tensors = 0;
        for path in &layout.files {
            let (shard, header) = map_file(path)?;
            tensors = count_tensors(tensors, &header, path)?;
            shards.push(shard);
            headers.push(header);
        }
        let headers = assemble(&layout, headers)?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            headers,
            shards,
            policy: AtomicU8::new(PageCachePolicy::Keep as u8),
        })
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

/// Tensors read so far plus those of `header` (of the file `path`), refused
/// above [`limits::MAX_TENSORS`] before the next file's header is read.
fn count_tensors(
    before: usize,
    header: &ParsedHeader,
    path: &Path,
) -> Result<usize, CheckpointError> {
    let count = before.saturating_add(header.entries.len());
    if count > limits::MAX_TENSORS {
        return Err(CheckpointError::TooMany {
            path: path.to_path_buf(),
            what: "tensors in the checkpoint up to this file",
            count,
            limit: limits::MAX_TENSORS,
        });
    }
    Ok(count)
}

/// Reads the length prefix and JSON header of one file with plain reads.
fn read_file_header(path: &Path) -> Result<ParsedHeader, CheckpointError> {
    let mut file = open_regular(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    read_header_from(&mut file, path)
}

/// Reads and validates the header of the open file `file` (at `path`).
fn read_header_from(file: &mut File, path: &Path) -> Result<ParsedHeader, CheckpointError> {
    let io_error = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let header_error = |source| CheckpointError::Header {
        path: path.to_path_buf(),
        source,
    };
    let file_len = file.metadata().map_err(io_error)?.len();
    let mut prefix = [0u8; LENGTH_PREFIX_BYTES as usize];
    let prefix_read = if file_len >= LENGTH_PREFIX_BYTES {
        file.read_exact(&mut prefix).map_err(io_error)?;
        &prefix[..]
    } else {
        &prefix[..0]
    };
    // Checked against the limit and the file size before allocating.
    let json_len = header::json_len(prefix_read, file_len).map_err(header_error)?;
    let mut start = vec![0u8; (LENGTH_PREFIX_BYTES + json_len) as usize];
    start[..prefix.len()].copy_from_slice(&prefix);
    file.read_exact(&mut start[prefix.len()..])
        .map_err(io_error)?;
    header::parse_header(&start, file_len).map_err(header_error)
}

/// Validates one file's header (plain reads, as `read_headers` does), then
/// maps the file. Reading the header rather than faulting it in through the
/// mapping is also faster on a cold page cache.
fn map_file(path: &Path) -> Result<(MappedShard, ParsedHeader), CheckpointError> {
    let io_error = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = open_regular(path).map_err(io_error)?;
    let header = read_header_from(&mut file, path)?;
    // SAFETY: the mapping is read-only and only ever read through `&[u8]`
    // slices inside its length; every tensor range was validated against the
    // file size, and the mapping is refused below unless it has exactly that
    // size. The checkpoint folder is required to stay unmodified while open
    // (documented on the module): another process truncating or rewriting a
    // file under us is outside what Rust can guard, as for any mmap reader.
    let map = unsafe { Mmap::map(&file) }.map_err(io_error)?;
    if map.len() as u64 != header.file_len {
        return Err(CheckpointError::FileChanged {
            path: path.to_path_buf(),
            validated: header.file_len,
            mapped: map.len() as u64,
        });
    }
    Ok((MappedShard { file, map }, header))
}

/// Checks that the shards hold exactly the tensors the index lists, each in
/// the file the index names. Both lists are sorted by name, so one pass
/// joins them.
fn check_against_index(
    files: &[ShardInfo],
    tensors: &[TensorInfo],
    listed: &[(String, usize)],
) -> Result<(), CheckpointError> {
    let mut listed = listed.iter().peekable();
    for tensor in tensors {
        // Listed names that sort before this tensor are in no file.
        if let Some((name, file)) = listed.next_if(|(name, _)| *name < tensor.name) {
            return Err(CheckpointError::NotInShard {
                path: files[*file].path.clone(),
                tensor: name.clone(),
            });
        }
        let listed_file = listed
            .next_if(|(name, _)| *name == tensor.name)
            .map(|&(_, file)| file);
        if listed_file != Some(tensor.file) {
            return Err(CheckpointError::NotInIndex {
                path: files[tensor.file].path.clone(),
                tensor: tensor.name.clone(),
                listed: listed_file.map(|f| files[f].path.clone()),
            });
        }
    }
    match listed.next() {
        Some((name, file)) => Err(CheckpointError::NotInShard {
            path: files[*file].path.clone(),
            tensor: name.clone(),
        }),
        None => Ok(()),
    }
}

/// Joins per-file headers into one set: names unique across files and, with an
/// index, each tensor exactly where the index puts it.
fn assemble(layout: &Layout, headers: Vec<ParsedHeader>) -> Result<HeaderSet, CheckpointError> {
    let files: Vec<ShardInfo> = layout
        .files
        .iter()
        .zip(&headers)
        .map(|(path, header)| ShardInfo {
            path: path.clone(),
            file_bytes: header.file_len,
            header_bytes: header.data_start,
        })
        .collect();
    let mut tensors: Vec<TensorInfo> = headers
        .into_iter()
        .enumerate()
        .flat_map(|(file, header)| {
            header.entries.into_iter().map(move |entry| TensorInfo {
                name: entry.name,
                dtype: entry.dtype,
                shape: entry.shape,
                byte_len: entry.byte_len,
                file,
                offset: entry.offset,
            })
        })
        .collect();
    tensors.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = tensors.windows(2).find(|pair| pair[0].name == pair[1].name) {
        return Err(CheckpointError::DuplicateTensor {
            tensor: pair[0].name.clone(),
            first: files[pair[0].file].path.clone(),
            second: files[pair[1].file].path.clone(),
        });
    }
    if let Some(index) = &layout.index {
        check_against_index(&files, &tensors, &index.tensor_file)?;
    }
    Ok(HeaderSet { files, tensors })
}
