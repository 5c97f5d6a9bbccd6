//! Which safetensors files make up a model folder: `model.safetensors.index.json`
//! and its shards when the index exists, else the single `model.safetensors`.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;
use std::marker::PhantomData;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};

use super::error::CheckpointError;
use crate::limits;
use crate::util::files::read_regular_to_string;

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
    /// (tensor name, position in `files`), sorted by name, names unique.
    pub tensor_file: Vec<(String, usize)>,
}

#[derive(Deserialize)]
struct IndexJson<'a> {
    #[serde(borrow)]
    weight_map: WeightMap<'a>,
}

/// `weight_map` as written, duplicates kept (a map type would silently keep
/// the last of two entries for one tensor). File names are borrowed from
/// the text: thousands of entries repeat a handful of names.
struct WeightMap<'a>(Vec<(String, Cow<'a, str>)>);

impl<'de: 'a, 'a> Deserialize<'de> for WeightMap<'a> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(WeightMapVisitor(PhantomData))
    }
}

struct WeightMapVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for WeightMapVisitor<'a> {
    type Value = WeightMap<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object mapping tensor names to file names")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WeightMap<'a>, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(limits::MAX_TENSORS));
        while let Some(tensor) = map.next_key::<String>()? {
            if entries.len() >= limits::MAX_TENSORS {
                return Err(de::Error::custom(format_args!(
                    "more than {} tensors, the limit",
                    limits::MAX_TENSORS
                )));
            }
            let file: BorrowedName<'a> = map.next_value()?;
            entries.push((tensor, file.0));
        }
        Ok(WeightMap(entries))
    }
}

/// A string borrowed from the JSON text when it has no escapes.
#[derive(Deserialize)]
struct BorrowedName<'a>(#[serde(borrow)] Cow<'a, str>);

/// Finds the weights of the model folder `dir`. A name that exists but is
/// no regular file (a FIFO, a directory) is taken, so that opening it says
/// why it is refused rather than "no weights".
pub(crate) fn locate(dir: &Path) -> Result<Layout, CheckpointError> {
    let index_path = dir.join(INDEX_FILE);
    if index_path.exists() {
        return from_index(dir, index_path);
    }
    let single = dir.join(SINGLE_FILE);
    if single.exists() {
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
    let invalid = |reason: String| CheckpointError::Index {
        path: index_path.clone(),
        reason,
    };
    let text =
        read_regular_to_string(&index_path, limits::MAX_INDEX_FILE_BYTES).map_err(|source| {
            CheckpointError::Io {
                path: index_path.clone(),
                source,
            }
        })?;
    let index: IndexJson = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let mut entries = index.weight_map.0;
    if entries.is_empty() {
        return Err(invalid("weight_map is empty".to_string()));
    }
    if let Some((tensor, file)) = entries.iter().find(|(_, file)| !is_plain_relative(file)) {
        return Err(CheckpointError::IndexEscape {
            index: index_path.clone(),
            tensor: tensor.clone(),
            file: file.to_string(),
        });
    }
    // Sorted by name, the entries can be joined with the sorted tensors of
    // the shards in one pass (see `assemble`).
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    if let Some(pair) = entries.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(invalid(format!("tensor `{}` is listed twice", pair[0].0)));
    }

    let files: BTreeSet<&str> = entries.iter().map(|(_, file)| file.as_ref()).collect();
    let files: Vec<String> = files.into_iter().map(str::to_string).collect();
    if files.len() > limits::MAX_SHARDS {
        return Err(CheckpointError::TooMany {
            path: index_path.clone(),
            what: "shard files in weight_map",
            count: files.len(),
            limit: limits::MAX_SHARDS,
        });
    }
    for file in &files {
        let path = dir.join(file);
        // Present but not a regular file is refused when it is opened.
        if !path.exists() {
            // Name a tensor the missing shard should hold, to make the
            // message concrete ("which download failed?").
            let tensor = entries
                .iter()
                .find(|(_, f)| f == file)
                .map(|(tensor, _)| tensor.clone())
                .unwrap_or_default();
            return Err(CheckpointError::MissingShard { path, tensor });
        }
    }
    let tensor_file = entries
        .into_iter()
        .map(|(tensor, file)| {
            // Every file name is in `files`, which was built from them.
            let position = files
                .binary_search_by(|f| f.as_str().cmp(&file))
                .unwrap_or_default();
            (tensor, position)
        })
        .collect();
    Ok(Layout {
        files: files.iter().map(|file| dir.join(file)).collect(),
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
