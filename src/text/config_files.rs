//! The small JSON side files of a Hugging Face checkpoint that say which
//! tokens are special and where the chat template is.
//!
//! Only the fields sparkrt uses are read; everything else is ignored, and a
//! missing file means "nothing said", not an error.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::TextError;
use crate::limits::MAX_SMALL_FILE_BYTES;
use crate::util::files::read_regular_to_string;

/// The special-token strings of `tokenizer_config.json`, passed to the chat
/// template as `bos_token`, `eos_token`, `pad_token` and `unk_token` (as
/// transformers does); a token the file does not set stays undefined there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub pad: Option<String>,
    pub unk: Option<String>,
}

/// What sparkrt reads from `tokenizer_config.json`.
#[derive(Clone, Debug, Default)]
pub(crate) struct TokenizerConfig {
    pub special_tokens: SpecialTokens,
    pub chat_template: Option<String>,
}

pub(crate) const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
pub(crate) const GENERATION_CONFIG: &str = "generation_config.json";
pub(crate) const MODEL_CONFIG: &str = "config.json";
/// Newer transformers versions save the chat template in its own file.
pub(crate) const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Reads a JSON file, or `None` when it does not exist.
pub(crate) fn read_json_if_exists(path: &Path) -> Result<Option<Value>, TextError> {
    let text = match read_regular_to_string(path, MAX_SMALL_FILE_BYTES) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TextError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| TextError::Json {
            path: path.to_path_buf(),
            source,
        })
}

/// Reads a text file, or `None` when it does not exist.
pub(crate) fn read_text_if_exists(path: &Path) -> Result<Option<String>, TextError> {
    match read_regular_to_string(path, MAX_SMALL_FILE_BYTES) {
        Ok(text) => Ok(Some(text)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TextError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Reads `tokenizer_config.json` in `dir` (an absent file gives defaults).
pub(crate) fn read_tokenizer_config(dir: &Path) -> Result<TokenizerConfig, TextError> {
    let path = dir.join(TOKENIZER_CONFIG);
    let Some(json) = read_json_if_exists(&path)? else {
        return Ok(TokenizerConfig::default());
    };
    Ok(TokenizerConfig {
        special_tokens: SpecialTokens {
            bos: token_string(&path, &json, "bos_token")?,
            eos: token_string(&path, &json, "eos_token")?,
            pad: token_string(&path, &json, "pad_token")?,
            unk: token_string(&path, &json, "unk_token")?,
        },
        chat_template: chat_template_field(&path, &json)?,
    })
}

/// A special token is written either as a plain string or as an
/// `AddedToken` object `{"content": "...", ...}`; `null` or absent means unset.
fn token_string(
    path: &Path,
    json: &Value,
    field: &'static str,
) -> Result<Option<String>, TextError> {
    match json.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(obj)) => match obj.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(bad_field(path, field, json.get(field))),
        },
        other => Err(bad_field(path, field, other)),
    }
}

/// `chat_template` is a string, or a list of `{"name", "template"}` of which
/// transformers uses the one named "default".
fn chat_template_field(path: &Path, json: &Value) -> Result<Option<String>, TextError> {
    const FIELD: &str = "chat_template";
    match json.get(FIELD) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(entries)) => {
            let mut names = Vec::new();
            for entry in entries {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(template)) => return Ok(Some(template.to_owned())),
                    (Some(name), Some(_)) => names.push(name.to_owned()),
                    _ => return Err(bad_field(path, FIELD, Some(entry))),
                }
            }
            Err(TextError::NoDefaultChatTemplate {
                path: path.to_path_buf(),
                names,
            })
        }
        other => Err(bad_field(path, FIELD, other)),
    }
}

/// Reads `eos_token_id` (an integer, a list of integers, or null) from a
/// JSON file in `dir`; an absent file or field gives no ids.
pub(crate) fn eos_token_ids_in(dir: &Path, file: &str) -> Result<Vec<u32>, TextError> {
    const FIELD: &str = "eos_token_id";
    let path = dir.join(file);
    let Some(json) = read_json_if_exists(&path)? else {
        return Ok(Vec::new());
    };
    let field = json.get(FIELD);
    let as_id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match field {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Number(_)) => match field.and_then(as_id) {
            Some(id) => Ok(vec![id]),
            None => Err(bad_field(&path, FIELD, field)),
        },
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| as_id(item).ok_or_else(|| bad_field(&path, FIELD, field)))
            .collect(),
        other => Err(bad_field(&path, FIELD, other)),
    }
}

fn bad_field(path: &Path, field: &'static str, found: Option<&Value>) -> TextError {
    TextError::BadField {
        path: PathBuf::from(path),
        field,
        found: found.map_or_else(|| "nothing".to_owned(), Value::to_string),
    }
}
