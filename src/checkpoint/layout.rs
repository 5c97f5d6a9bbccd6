//! Which safetensors files make up a model folder: `model.safetensors.index.json`
//! and its shards when the index exists, else the single `model.safetensors`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::error::CheckpointError;

pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";

/// The files to read, and what the index (if any) says each should hold.
pub(crate) struct Layout {
    /// Paths of the safetensors files, sorted, each existing.
    pub files: Vec<PathBuf>,
    /// From the index: tensor name → position in `files`.
    pub index: Option<IndexMap>,
}

pub(crate) struct IndexMap {
    pub tensor_file: BTreeMap<String, usize>,
}

#[derive(Deserialize)]
struct IndexJson {
    weight_map: BTreeMap<String, String>,
}

/// Finds the weights of the model folder `dir`.
pub(crate) fn locate(dir: &Path) -> Result<Layout, CheckpointError> {
    let index_path = dir.join(INDEX_FILE);
    if index_path.is_file() {
        return from_index(dir, index_path);
    }
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return Ok(Layout {
            files: vec![single],
            index: None,
        });
    }
    Err(CheckpointError::NoWeights {
        dir: dir.to_path_buf(),
    })
}

fn from_index(dir: &Path, index_path: PathBuf) -> Result<Layout, CheckpointError> {
    let text = std::fs::read_to_string(&index_path).map_err(|source| CheckpointError::Io {
        path: index_path.clone(),
        source,
    })?;
    let index: IndexJson = serde_json::from_str(&text).map_err(|e| CheckpointError::Index {
        path: index_path.clone(),
        reason: e.to_string(),
    })?;
    if index.weight_map.is_empty() {
        return Err(CheckpointError::Index {
            path: index_path,
            reason: "weight_map is empty".to_string(),
        });
    }

    for (tensor, file) in &index.weight_map {
        if !is_plain_relative(file) {
            return Err(CheckpointError::IndexEscape {
                index: index_path,
                tensor: tensor.clone(),
                file: file.clone(),
            });
        }
    }
    let names: BTreeSet<&str> = index.weight_map.values().map(String::as_str).collect();
    let names: Vec<&str> = names.into_iter().collect();
    for name in &names {
        let path = dir.join(name);
        if !path.is_file() {
            // Name a tensor the missing shard should hold, to make the
            // message concrete ("which download failed?").
            let tensor = index
                .weight_map
                .iter()
                .find(|(_, file)| file == name)
                .map(|(tensor, _)| tensor.clone())
                .unwrap_or_default();
            return Err(CheckpointError::MissingShard { path, tensor });
        }
    }

    let tensor_file = index
        .weight_map
        .iter()
        .filter_map(|(tensor, file)| {
            let position = names.binary_search(&file.as_str()).ok()?;
            Some((tensor.clone(), position))
        })
        .collect();
    Ok(Layout {
        files: names.iter().map(|name| dir.join(name)).collect(),
        index: Some(IndexMap { tensor_file }),
    })
}

/// Whether an index entry names a file below the folder: relative, no `..`,
/// no root. The check is on the name, not the resolved path: the Hugging Face
/// cache links snapshot files into a shared `blobs/` folder, which is fine.
fn is_plain_relative(file: &str) -> bool {
    let mut components = Path::new(file).components().peekable();
    components.peek().is_some()
        && components.all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        && Path::new(file).file_name().is_some()
}

#[cfg(test)]
mod tests {
    use super::is_plain_relative;

    #[test]
    fn only_plain_relative_names_stay_inside_the_folder() {
        assert!(is_plain_relative("model-00001-of-00002.safetensors"));
        assert!(is_plain_relative("sub/model.safetensors"));
        assert!(!is_plain_relative("../outside.safetensors"));
        assert!(!is_plain_relative("sub/../../x.safetensors"));
        assert!(!is_plain_relative("/etc/passwd"));
        assert!(is_plain_relative("./model.safetensors"));
        assert!(!is_plain_relative("."));
        assert!(!is_plain_relative(""));
    }
}
