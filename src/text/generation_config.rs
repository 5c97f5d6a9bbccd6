//! The sampling defaults a checkpoint's `generation_config.json` sets, as
//! vLLM's `--generation-config auto` reads them: a request's own field
//! always wins, these fill in what it leaves unset, and OpenAI's neutral
//! values fill in the rest.
//!
//! Only the fields vLLM takes from the file are read (plus the two
//! penalties, which some checkpoints set); `do_sample` is not, as in vLLM:
//! a checkpoint that wants greedy output says `temperature: 0` or
//! `top_k: 1`.

use std::fmt;
use std::path::Path;

use serde_json::Value;

use super::config_files::{GENERATION_CONFIG, read_json_if_exists};
use super::error::TextError;

/// The defaults in force; `None` leaves a field to the neutral default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// `-1` and `0` (HF's "off") are read as `None`.
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// The default `max_tokens` of a request that gives none (still capped
    /// by the room the prompt leaves).
    pub max_new_tokens: Option<usize>,
}

impl GenerationDefaults {
    /// Reads `generation_config.json` in `dir`; an absent file gives no
    /// defaults, a field of the wrong type is an error naming it.
    pub fn read(dir: &Path) -> Result<GenerationDefaults, TextError> {
        let path = dir.join(GENERATION_CONFIG);
        let Some(json) = read_json_if_exists(&path)? else {
            return Ok(GenerationDefaults::default());
        };
        Self::from_json(&path, &json)
    }

    fn from_json(path: &Path, json: &Value) -> Result<GenerationDefaults, TextError> {
        let float = |field: &'static str| -> Result<Option<f32>, TextError> {
            match json.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .map(|x| Some(x as f32))
                    .ok_or_else(|| bad_field(path, field, v)),
            }
        };
        let count = |field: &'static str| -> Result<Option<i64>, TextError> {
            match json.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_i64()
                    .map(Some)
                    .ok_or_else(|| bad_field(path, field, v)),
            }
        };
        let top_k = match count("top_k")? {
            None | Some(-1) | Some(0) => None,
            Some(k) => {
                Some(usize::try_from(k).map_err(|_| bad_field(path, "top_k", &json["top_k"]))?)
            }
        };
        let max_new_tokens = match count("max_new_tokens")? {
            None => None,
            Some(n) => Some(
                usize::try_from(n)
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad_field(path, "max_new_tokens", &json["max_new_tokens"]))?,
            ),
        };
        Ok(GenerationDefaults {
            temperature: float("temperature")?,
            top_p: float("top_p")?,
            top_k,
            min_p: float("min_p")?,
            repetition_penalty: float("repetition_penalty")?,
            presence_penalty: float("presence_penalty")?,
            frequency_penalty: float("frequency_penalty")?,
            max_new_tokens,
        })
    }

    pub fn is_empty(&self) -> bool {
        *self == GenerationDefaults::default()
    }
}

impl fmt::Display for GenerationDefaults {
    /// `temperature=0.6 top_k=20 …`, the fields set, or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        let mut push = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                parts.push(format!("{name}={value}"));
            }
        };
        push("temperature", self.temperature.map(|v| v.to_string()));
        push("top_p", self.top_p.map(|v| v.to_string()));
        push("top_k", self.top_k.map(|v| v.to_string()));
        push("min_p", self.min_p.map(|v| v.to_string()));
        push(
            "repetition_penalty",
            self.repetition_penalty.map(|v| v.to_string()),
        );
        push(
            "presence_penalty",
            self.presence_penalty.map(|v| v.to_string()),
        );
        push(
            "frequency_penalty",
            self.frequency_penalty.map(|v| v.to_string()),
        );
        push("max_tokens", self.max_new_tokens.map(|v| v.to_string()));
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join(" "))
        }
    }
}

fn bad_field(path: &Path, field: &'static str, found: &Value) -> TextError {
    TextError::BadField {
        path: path.to_path_buf(),
        field,
        found: found.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(json: Value) -> Result<GenerationDefaults, TextError> {
        GenerationDefaults::from_json(Path::new("generation_config.json"), &json)
    }

    #[test]
    fn reads_the_sampling_fields_and_ignores_the_rest() {
        let d = parse(json!({
            "do_sample": true, "eos_token_id": [1, 2], "temperature": 0.6,
            "top_p": 0.95, "top_k": 20, "min_p": 0, "repetition_penalty": 1.05,
            "max_new_tokens": 300
        }))
        .unwrap();
        assert_eq!(d.temperature, Some(0.6));
        assert_eq!(d.top_p, Some(0.95));
        assert_eq!(d.top_k, Some(20));
        assert_eq!(d.min_p, Some(0.0));
        assert_eq!(d.repetition_penalty, Some(1.05));
        assert_eq!(d.presence_penalty, None);
        assert_eq!(d.max_new_tokens, Some(300));
        assert_eq!(
            d.to_string(),
            "temperature=0.6 top_p=0.95 top_k=20 min_p=0 repetition_penalty=1.05 max_tokens=300"
        );
    }

    #[test]
    fn top_k_off_values_and_an_empty_file_set_nothing() {
        assert_eq!(parse(json!({"top_k": -1})).unwrap().top_k, None);
        assert_eq!(parse(json!({"top_k": 0})).unwrap().top_k, None);
        let empty = parse(json!({"bos_token_id": 0})).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.to_string(), "none");
    }

    #[test]
    fn wrong_types_are_errors_naming_the_field() {
        for (field, value) in [
            ("temperature", json!("hot")),
            ("top_k", json!(1.5)),
            ("top_k", json!(-3)),
            ("max_new_tokens", json!(0)),
        ] {
            let err = parse(json!({ field: value })).unwrap_err();
            assert!(err.to_string().contains(field), "{field}: {err}");
        }
    }
}
