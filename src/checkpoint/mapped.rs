//! A checkpoint whose files are mapped: zero-copy views of its tensors and
//! the byte ranges they lie in.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU8;

use memmap2::Mmap;

use super::error::CheckpointError;
use super::header::HeaderError;
use super::header_set::{HeaderSet, ShardInfo};
use super::view::TensorView;

/// A checkpoint whose files are mapped read-only, each once.
#[derive(Debug)]
pub struct Checkpoint {
    pub(super) dir: PathBuf,
    pub(super) headers: HeaderSet,
    pub(super) shards: Vec<MappedShard>,
    /// The last page-cache policy applied (a `PageCachePolicy` as u8).
    pub(super) policy: AtomicU8,
}

#[derive(Debug)]
pub(super) struct MappedShard {
    pub(super) file: File,
    pub(super) map: Mmap,
}

impl Checkpoint {
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
