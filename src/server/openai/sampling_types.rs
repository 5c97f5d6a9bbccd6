//! The sampling and structured-output fields of both routes (flattened into
//! each request struct, then moved into [`super::types::CommonParams`]), and
//! how they become the engine's
//! [`SamplingParams`] fields and [`GrammarSpec`].
//!
//! Ranges are checked by [`SamplingParams::validate`] (one place, errors
//! name the field); this file checks only the wire shapes: token-id keys,
//! which structured-output form is used, and that only one is.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::unsupported::refuse_unknown_keys;
use crate::engine::grammar::GrammarSpec;
use crate::engine::sampling::SamplingParams;
use crate::server::errors::ApiError;
use crate::text::GenerationDefaults;

/// The fields, as sent. `null` is "not set" for every one.
#[derive(Deserialize, Default)]
pub struct SamplingFields {
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// vLLM's extension.
    pub repetition_penalty: Option<f32>,
    /// vLLM's extension.
    pub min_p: Option<f32>,
    /// Token id (as a string) → bias in [-100, 100].
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// vLLM's extension.
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM's extension.
    pub min_tokens: Option<i64>,
    /// vLLM's extension.
    pub include_stop_str_in_output: Option<bool>,
    /// Completions only: candidates generated per prompt, of which the `n`
    /// with the highest cumulative log-probability are answered (read by
    /// the handlers' fan-out, not by the sampler).
    pub best_of: Option<i64>,
    /// OpenAI's: `{type: "text" | "json_object" | "json_schema", json_schema}`.
    pub response_format: Option<Value>,
    /// vLLM's: `{json | regex | choice | grammar | json_object}`.
    pub structured_outputs: Option<Value>,
    /// vLLM's older forms of `structured_outputs`.
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
}

impl SamplingFields {
    /// Sets the processors' fields of `params`; a field left unset takes
    /// `defaults`' value, else the neutral one.
    pub fn apply_to(
        &self,
        params: &mut SamplingParams,
        defaults: &GenerationDefaults,
    ) -> Result<(), ApiError> {
        let or = |field: Option<f32>, default: Option<f32>, neutral: f32| {
            field.or(default).unwrap_or(neutral)
        };
        params.presence_penalty = or(self.presence_penalty, defaults.presence_penalty, 0.0);
        params.frequency_penalty = or(self.frequency_penalty, defaults.frequency_penalty, 0.0);
        params.repetition_penalty = or(self.repetition_penalty, defaults.repetition_penalty, 1.0);
        params.min_p = or(self.min_p, defaults.min_p, 0.0);
        params.stop_token_ids = self.stop_token_ids.clone().unwrap_or_default();
        params.include_stop_str_in_output = self.include_stop_str_in_output.unwrap_or(false);
        params.min_tokens = match self.min_tokens {
            None => 0,
            Some(n) => usize::try_from(n).map_err(|_| {
                ApiError::invalid("`min_tokens` must be at least 0", Some("min_tokens"))
            })?,
        };
        params.logit_bias = match &self.logit_bias {
            None => Vec::new(),
            Some(map) => map
                .iter()
                .map(|(key, &bias)| {
                    let id = key.parse::<u32>().map_err(|_| {
                        ApiError::invalid(
                            format!("logit_bias key {key:?} is not a token id"),
                            Some("logit_bias"),
                        )
                    })?;
                    Ok((id, bias))
                })
                .collect::<Result<_, ApiError>>()?,
        };
        Ok(())
    }

    /// `response_format`'s unknown keys (the schema itself is the
    /// grammar compiler's to judge). `strict` is accepted: the schema is
    /// enforced whether or not it is set.
    pub fn refuse_nested(&self) -> Result<(), ApiError> {
        if let Some(format) = &self.response_format {
            refuse_unknown_keys(format, &["type", "json_schema"], "response_format")?;
            if let Some(schema) = format.get("json_schema") {
                refuse_unknown_keys(
                    schema,
                    &["name", "description", "schema", "strict"],
                    "response_format.json_schema",
                )?;
            }
        }
        Ok(())
    }

    /// Bytes of every grammar-like field, for the request limit.
    pub fn grammar_bytes(&self) -> usize {
        let json_len = |v: &Option<Value>| v.as_ref().map_or(0, |v| v.to_string().len());
        let str_len = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        json_len(&self.response_format)
            + json_len(&self.structured_outputs)
            + json_len(&self.guided_json)
            + str_len(&self.guided_regex)
            + str_len(&self.guided_grammar)
            + self
                .guided_choice
                .as_ref()
                .map_or(0, |c| c.iter().map(|choice| choice.len() + 1).sum())
    }

    /// The grammar the output must follow, and the field it came from (for
    /// errors); at most one of the forms may be set.
    pub fn grammar(&self) -> Result<Option<(GrammarSpec, &'static str)>, ApiError> {
        let mut found = Vec::new();
        if let Some(format) = &self.response_format
            && let Some(spec) = response_format(format)?
        {
            found.push((spec, "response_format"));
        }
        if let Some(outputs) = &self.structured_outputs {
            found.push((structured_outputs(outputs)?, "structured_outputs"));
        }
        if let Some(json) = &self.guided_json {
            found.push((json_schema(json, "guided_json")?, "guided_json"));
        }
        if let Some(regex) = &self.guided_regex {
            found.push((GrammarSpec::Regex(regex.clone()), "guided_regex"));
        }
        if let Some(choices) = &self.guided_choice {
            found.push((choice(choices, "guided_choice")?, "guided_choice"));
        }
        if let Some(grammar) = &self.guided_grammar {
            found.push((GrammarSpec::Lark(grammar.clone()), "guided_grammar"));
        }
        if found.len() > 1 {
            return Err(ApiError::invalid(
                format!(
                    "only one structured-output form may be set; got {}",
                    found.iter().map(|(_, f)| *f).collect::<Vec<_>>().join(", ")
                ),
                Some(found[1].1),
            ));
        }
        Ok(found.pop())
    }
}

/// OpenAI's `response_format`; `text` is no constraint.
fn response_format(format: &Value) -> Result<Option<GrammarSpec>, ApiError> {
    let bad =
        |why: &str| ApiError::invalid(format!("response_format: {why}"), Some("response_format"));
    let kind = format
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("`type` must be a string"))?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            let schema = format
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .filter(|s| !s.is_null())
                .ok_or_else(|| bad("`json_schema.schema` is required for type json_schema"))?;
            json_schema(schema, "response_format").map(Some)
        }
        other => Err(bad(&format!(
            "unknown type {other:?} (text, json_object and json_schema are supported)"
        ))),
    }
}

/// vLLM's `structured_outputs`: exactly one of its forms.
fn structured_outputs(outputs: &Value) -> Result<GrammarSpec, ApiError> {
    const FIELD: &str = "structured_outputs";
    let object = outputs
        .as_object()
        .ok_or_else(|| ApiError::invalid("structured_outputs must be an object", Some(FIELD)))?;
    let mut specs = Vec::new();
    for (key, value) in object {
        if value.is_null() {
            continue;
        }
        let spec = match key.as_str() {
            "json" => json_schema(value, FIELD)?,
            "regex" => GrammarSpec::Regex(string(value, FIELD)?),
            "grammar" => GrammarSpec::Lark(string(value, FIELD)?),
            "choice" => {
                let choices: Vec<String> = serde_json::from_value(value.clone()).map_err(|_| {
                    ApiError::invalid(
                        "structured_outputs.choice must be a list of strings",
                        Some(FIELD),
                    )
                })?;
                choice(&choices, FIELD)?
            }
            "json_object" if value.as_bool() == Some(true) => GrammarSpec::JsonObject,
            "json_object" if value.as_bool() == Some(false) => continue,
            other => {
                return Err(ApiError::unsupported_parameter(
                    &format!("structured_outputs.{other}"),
                    "is not supported by this server (json, regex, choice, grammar and json_object are)",
                ));
            }
        };
        specs.push(spec);
    }
    match specs.len() {
        1 => Ok(specs.remove(0)),
        n => Err(ApiError::invalid(
            format!(
                "structured_outputs must set exactly one of json, regex, choice, grammar, json_object; got {n}"
            ),
            Some(FIELD),
        )),
    }
}

fn string(value: &Value, field: &'static str) -> Result<String, ApiError> {
    value
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| ApiError::invalid(format!("{field}: expected a string"), Some(field)))
}

/// A schema given as an object (or a boolean), or as a string holding one.
fn json_schema(value: &Value, field: &'static str) -> Result<GrammarSpec, ApiError> {
    let schema = match value {
        Value::String(text) => serde_json::from_str(text).map_err(|e| {
            ApiError::invalid(format!("{field}: the schema is not JSON: {e}"), Some(field))
        })?,
        other => other.clone(),
    };
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(ApiError::invalid(
            format!("{field}: a JSON schema is an object"),
            Some(field),
        ));
    }
    Ok(GrammarSpec::JsonSchema(schema))
}

fn choice(choices: &[String], field: &'static str) -> Result<GrammarSpec, ApiError> {
    if choices.is_empty() {
        return Err(ApiError::invalid(
            format!("{field}: the list of choices is empty"),
            Some(field),
        ));
    }
    Ok(GrammarSpec::Choice(choices.to_vec()))
}
