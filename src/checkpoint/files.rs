//! The one way into a checkpoint's files: the layout located, each file
//! opened and its header read and validated, once. What comes out,
//! [`CheckpointFiles`], is what the plan reads (its [`HeaderSet`]) and what
//! is then mapped ([`CheckpointFiles::map`]) without reading a header again:
//! the mapping is of the very files whose headers were checked.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU8;

use memmap2::Mmap;

use super::error::CheckpointError;
use super::header::{self, LENGTH_PREFIX_BYTES, ParsedHeader};
use super::header_set::{HeaderSet, ShardInfo, TensorInfo};
use super::layout::{self, Layout};
use super::mapped::{Checkpoint, MappedShard};
use super::page_cache::PageCachePolicy;
use crate::limits;
use crate::util::files::open_regular;

/// A checkpoint's files, each open and its header validated; not mapped.
#[derive(Debug)]
pub struct CheckpointFiles {
    dir: PathBuf,
    headers: HeaderSet,
    /// The open files, in the order of `headers.files`.
    files: Vec<File>,
}

impl CheckpointFiles {
    /// Locates the files of the checkpoint in `dir`, opens each and reads
    /// and validates its header with plain reads (no tensor byte touched:
    /// also faster on a cold page cache than faulting it in through a
    /// mapping), then joins the headers into one set.
    pub fn open(dir: &Path) -> Result<CheckpointFiles, CheckpointError> {
        let layout = layout::locate(dir)?;
        let mut files = Vec::with_capacity(layout.files.len());
        let mut headers = Vec::with_capacity(layout.files.len());
        let mut tensors = 0;
        for path in &layout.files {
            let mut file = open_regular(path).map_err(|source| CheckpointError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            let header = read_header(&mut file, path)?;
            tensors = count_tensors(tensors, &header, path)?;
            files.push(file);
            headers.push(header);
        }
        let headers = assemble(&layout, headers)?;
        Ok(CheckpointFiles {
            dir: dir.to_path_buf(),
            headers,
            files,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn headers(&self) -> &HeaderSet {
        &self.headers
    }

    /// The headers alone; the files are closed.
    pub fn into_headers(self) -> HeaderSet {
        self.headers
    }

    /// Maps each open file, read-only, and hands out the checkpoint over
    /// the headers already validated. A file whose size is no longer the
    /// one its header was checked against is refused.
    pub fn map(self) -> Result<Checkpoint, CheckpointError> {
        let shards = self
            .files
            .into_iter()
            .zip(&self.headers.files)
            .map(|(file, info)| map_shard(file, info))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Checkpoint {
            dir: self.dir,
            headers: self.headers,
            shards,
            policy: AtomicU8::new(PageCachePolicy::Keep as u8),
        })
    }
}

/// Maps `file`, whose header `info` describes.
fn map_shard(file: File, info: &ShardInfo) -> Result<MappedShard, CheckpointError> {
    // SAFETY: the mapping is read-only and only ever read through `&[u8]`
    // slices inside its length; every tensor range was validated against the
    // file size, and the mapping is refused below unless it has exactly that
    // size. The checkpoint folder is required to stay unmodified while open
    // (documented on the module): another process truncating or rewriting a
    // file under us is outside what Rust can guard, as for any mmap reader.
    let map = unsafe { Mmap::map(&file) }.map_err(|source| CheckpointError::Io {
        path: info.path.clone(),
        source,
    })?;
    if map.len() as u64 != info.file_bytes {
        return Err(CheckpointError::FileChanged {
            path: info.path.clone(),
            validated: info.file_bytes,
            mapped: map.len() as u64,
        });
    }
    Ok(MappedShard { file, map })
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

#[cfg(test)]
thread_local! {
    /// Headers read on this thread: how tests see that start-up reads each
    /// file's header once.
    pub(crate) static HEADERS_READ: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Reads and validates the header of the open file `file` (at `path`).
fn read_header(file: &mut File, path: &Path) -> Result<ParsedHeader, CheckpointError> {
    #[cfg(test)]
    HEADERS_READ.with(|count| count.set(count.get() + 1));
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
