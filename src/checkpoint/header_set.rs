//! What a checkpoint's validated headers say, across its files: each
//! file, and each tensor's dtype, shape and place.

use std::path::{Path, PathBuf};

use super::dtype::Dtype;

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
