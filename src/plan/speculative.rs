//! Speculative decoding's settings: which proposer drafts tokens and how
//! many per step, in vLLM's `--speculative-config` form
//! (`{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}`)
//! or a profile's `[serving] speculative_config` table. What they cost is
//! `plan::memory::speculative`; how drafts are checked is `engine::drafts`.

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use sparkrt_wire::MAX_SPECULATIVE_TOKENS;
/// Longest n-gram the prompt-lookup proposer matches: its search costs
/// `context × n` comparisons per sequence and step.
pub const MAX_PROMPT_LOOKUP: usize = 64;
/// The n-gram lengths when neither is given (vLLM leaves them to the user;
/// 2–5 catches code and quoted text without matching every common pair).
pub const DEFAULT_PROMPT_LOOKUP_MIN: usize = 2;
pub const DEFAULT_PROMPT_LOOKUP_MAX: usize = 5;

/// Where draft tokens come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftMethod {
    /// Prompt lookup: the tokens that followed the latest earlier
    /// occurrence of the sequence's last n tokens.
    Ngram,
    /// The checkpoint's multi-token-prediction head (`mtp.*`), applied
    /// recursively for k > 1.
    Mtp,
}

impl DraftMethod {
    pub fn name(self) -> &'static str {
        match self {
            DraftMethod::Ngram => "ngram",
            DraftMethod::Mtp => "mtp",
        }
    }
}

/// A validated speculative configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpeculativeConfig {
    pub method: DraftMethod,
    /// Draft tokens per sequence and step (k).
    pub num_speculative_tokens: usize,
    /// Shortest and longest suffix the n-gram proposer looks up.
    pub prompt_lookup_min: usize,
    pub prompt_lookup_max: usize,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SpeculativeError {
    #[error("speculative config: {0}")]
    Syntax(String),
    #[error(
        "speculative config: method \"{0}\" is not served here; sparkrt drafts with \"ngram\" (prompt lookup) or \"mtp\" (the checkpoint's MTP head)"
    )]
    Method(String),
    #[error("speculative config: {0} is a key of the \"ngram\" method; \"mtp\" does not read it")]
    NotForMtp(&'static str),
    #[error("speculative config: {key} is {value}; it must be between {min} and {max}")]
    Range {
        key: &'static str,
        value: usize,
        min: usize,
        max: usize,
    },
    #[error(
        "speculative config: prompt_lookup_min ({min}) must not exceed prompt_lookup_max ({max})"
    )]
    LookupOrder { min: usize, max: usize },
}

/// The configuration as written: vLLM's keys, every other one refused.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeDraft {
    method: String,
    num_speculative_tokens: usize,
    #[serde(default)]
    prompt_lookup_min: Option<usize>,
    #[serde(default)]
    prompt_lookup_max: Option<usize>,
}

impl SpeculativeConfig {
    /// `--speculative-config`'s JSON object.
    pub fn from_json(text: &str) -> Result<SpeculativeConfig, SpeculativeError> {
        let draft: SpeculativeDraft =
            serde_json::from_str(text).map_err(|e| SpeculativeError::Syntax(e.to_string()))?;
        draft.validate()
    }

    /// Tokens a step's verify rows add per sequence: the drafts (the
    /// sequence's own next token is its one decode row anyway).
    pub fn draft_rows(&self) -> usize {
        self.num_speculative_tokens
    }
}

impl SpeculativeDraft {
    pub fn validate(&self) -> Result<SpeculativeConfig, SpeculativeError> {
        let method = match self.method.as_str() {
            "ngram" | "[ngram]" => DraftMethod::Ngram,
            // vLLM's names for a checkpoint's own MTP head.
            "mtp" | "qwen3_5_mtp" | "qwen3_next_mtp" => DraftMethod::Mtp,
            other => return Err(SpeculativeError::Method(other.to_string())),
        };
        if method == DraftMethod::Mtp {
            for (key, given) in [
                ("prompt_lookup_min", self.prompt_lookup_min),
                ("prompt_lookup_max", self.prompt_lookup_max),
            ] {
                if given.is_some() {
                    return Err(SpeculativeError::NotForMtp(key));
                }
            }
        }
        let range = |key, value, min, max| {
            if (min..=max).contains(&value) {
                Ok(value)
            } else {
                Err(SpeculativeError::Range {
                    key,
                    value,
                    min,
                    max,
                })
            }
        };
        let k = range(
            "num_speculative_tokens",
            self.num_speculative_tokens,
            1,
            MAX_SPECULATIVE_TOKENS,
        )?;
        // One given: the other is the same (a single n).
        let (min, max) = match (self.prompt_lookup_min, self.prompt_lookup_max) {
            (None, None) => (DEFAULT_PROMPT_LOOKUP_MIN, DEFAULT_PROMPT_LOOKUP_MAX),
            (Some(n), None) | (None, Some(n)) => (n, n),
            (Some(min), Some(max)) => (min, max),
        };
        let min = range("prompt_lookup_min", min, 1, MAX_PROMPT_LOOKUP)?;
        let max = range("prompt_lookup_max", max, 1, MAX_PROMPT_LOOKUP)?;
        if min > max {
            return Err(SpeculativeError::LookupOrder { min, max });
        }
        Ok(SpeculativeConfig {
            method,
            num_speculative_tokens: k,
            prompt_lookup_min: min,
            prompt_lookup_max: max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_json_is_read_with_its_defaults() {
        let c = SpeculativeConfig::from_json(r#"{"method": "ngram", "num_speculative_tokens": 3}"#)
            .unwrap();
        assert_eq!(c.num_speculative_tokens, 3);
        assert_eq!(
            (c.prompt_lookup_min, c.prompt_lookup_max),
            (DEFAULT_PROMPT_LOOKUP_MIN, DEFAULT_PROMPT_LOOKUP_MAX)
        );
        let one = SpeculativeConfig::from_json(
            r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}"#,
        )
        .unwrap();
        assert_eq!((one.prompt_lookup_min, one.prompt_lookup_max), (4, 4));
    }

    #[test]
    fn what_is_not_served_is_refused_by_name() {
        let err = |t: &str| SpeculativeConfig::from_json(t).unwrap_err().to_string();
        let mtp = SpeculativeConfig::from_json(r#"{"method": "mtp", "num_speculative_tokens": 2}"#)
            .unwrap();
        assert_eq!(
            (mtp.method, mtp.num_speculative_tokens),
            (DraftMethod::Mtp, 2)
        );
        assert!(
            err(r#"{"method": "mtp", "num_speculative_tokens": 1, "prompt_lookup_max": 3}"#)
                .contains("prompt_lookup_max is a key of the \"ngram\" method")
        );
        assert!(err(r#"{"method": "eagle", "num_speculative_tokens": 1}"#).contains("\"eagle\""));
        assert!(
            err(r#"{"method": "ngram", "num_speculative_tokens": 1, "model": "x"}"#)
                .contains("model")
        );
        assert!(
            err(r#"{"method": "ngram", "num_speculative_tokens": 9}"#)
                .contains("num_speculative_tokens is 9")
        );
        assert!(
            err(r#"{"method": "ngram", "num_speculative_tokens": 0}"#).contains("between 1 and 8")
        );
        assert!(
            err(
                r#"{"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_min": 5, "prompt_lookup_max": 3}"#
            )
            .contains("must not exceed")
        );
        assert!(err("not json").starts_with("speculative config:"));
    }
}
