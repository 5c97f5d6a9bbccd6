//! Every size a client chooses, bounded in one place and checked before any
//! work is done for it (before the template renders or the tokenizer runs).
//!
//! The prompt's bound comes from the model: a text longer than
//! `max_model_len ×` the tokenizer's longest token cannot fit the context,
//! whatever it encodes to, so it is refused without being tokenized. The
//! body limit follows from that bound (JSON may escape a character into up
//! to three times its bytes) plus room for everything else a request holds.
//! The fixed limits are generous for any real client and small enough that
//! the engine thread's per-token work (stop strings) stays negligible.

use super::errors::ApiError;
use super::openai::types::{ChatContent, ChatInput, CommonParams, OneOrMany, SamplingFields};

/// Stop strings per request (OpenAI allows 4; vLLM has no limit).
pub const MAX_STOP_STRINGS: usize = 16;
/// Bytes of one stop string.
pub const MAX_STOP_BYTES: usize = 256;
/// Messages of one chat request.
pub const MAX_MESSAGES: usize = 2048;
/// Content parts of one chat request, all messages together.
pub const MAX_CONTENT_PARTS: usize = 2048;
/// Bytes of a message's `role`.
pub const MAX_ROLE_BYTES: usize = 64;
/// Bytes of the `model` field.
pub const MAX_MODEL_NAME_BYTES: usize = 256;
/// Entries of `logit_bias` (OpenAI sets no bound; the engine's per-token
/// work is proportional to it).
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Entries of `stop_token_ids`.
pub const MAX_STOP_TOKEN_IDS: usize = 256;
/// Bytes of a request's structured-output fields (schema, regex, grammar,
/// choices): bounds the grammar's compile time on the preparation pool.
pub const MAX_GRAMMAR_BYTES: usize = 64 << 10;
/// Choices per request (`n`): one.
pub const MAX_N: u32 = 1;
/// Prompts of one batched completions request (`prompt` as a list); each is
/// its own engine request and choice.
pub const MAX_PROMPTS: usize = 64;
/// The prompts of a batch hold at most this many times `max_model_len`
/// tokens together.
pub const BATCH_TOKENS_PER_MODEL_LEN: usize = 4;
/// Alternatives per position (`logprobs`, `top_logprobs`,
/// `prompt_logprobs`): OpenAI's limit.
pub const MAX_TOP_LOGPROBS: usize = crate::engine::MAX_TOP_LOGPROBS;
/// The body may hold the largest prompt this many times over (JSON's
/// `\uXXXX` escapes: six bytes for a two- or three-byte character).
const BODY_PER_PROMPT_BYTE: usize = 3;
/// Body room for everything but the prompt: stop strings, message
/// envelopes, token-id lists (at most 11 bytes an id), sampling fields.
const BODY_SLACK_BYTES: usize = 1 << 20;

/// The bounds of one server, built from the model's `max_model_len` and its
/// tokenizer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Bytes of a request body (413 beyond):
    /// `3 × max_prompt_bytes + 1 MiB`.
    pub max_body_bytes: usize,
    /// Bytes of a text prompt, or of a chat's contents and of its rendered
    /// prompt: `max_model_len × longest token` (0 without a tokenizer:
    /// text cannot be encoded at all then).
    pub max_prompt_bytes: usize,
    /// Token ids of a prompt: `max_model_len - 1` (one token must be generated).
    pub max_prompt_tokens: usize,
    /// `max_tokens` / `max_completion_tokens`: `max_model_len`.
    pub max_tokens: usize,
    pub max_messages: usize,
    pub max_content_parts: usize,
    pub max_stop_strings: usize,
    pub max_stop_bytes: usize,
    pub max_role_bytes: usize,
    pub max_model_name_bytes: usize,
    pub max_n: u32,
    pub max_logit_bias: usize,
    pub max_stop_token_ids: usize,
    pub max_grammar_bytes: usize,
    pub max_prompts: usize,
    /// Token ids of all the prompts of a batch together:
    /// `4 × max_model_len`.
    pub max_batch_prompt_tokens: usize,
    pub max_top_logprobs: usize,
}

impl RequestLimits {
    /// `longest_token_bytes` is `None` for a model without a tokenizer.
    pub fn new(max_model_len: usize, longest_token_bytes: Option<usize>) -> RequestLimits {
        let max_prompt_bytes = longest_token_bytes.map_or(0, |b| max_model_len.saturating_mul(b));
        RequestLimits {
            max_body_bytes: max_prompt_bytes
                .saturating_mul(BODY_PER_PROMPT_BYTE)
                .saturating_add(BODY_SLACK_BYTES),
            max_prompt_bytes,
            max_prompt_tokens: max_model_len.saturating_sub(1),
            max_tokens: max_model_len,
            max_messages: MAX_MESSAGES,
            max_content_parts: MAX_CONTENT_PARTS,
            max_stop_strings: MAX_STOP_STRINGS,
            max_stop_bytes: MAX_STOP_BYTES,
            max_role_bytes: MAX_ROLE_BYTES,
            max_model_name_bytes: MAX_MODEL_NAME_BYTES,
            max_n: MAX_N,
            max_logit_bias: MAX_LOGIT_BIAS,
            max_stop_token_ids: MAX_STOP_TOKEN_IDS,
            max_grammar_bytes: MAX_GRAMMAR_BYTES,
            max_prompts: MAX_PROMPTS,
            max_batch_prompt_tokens: max_model_len.saturating_mul(BATCH_TOKENS_PER_MODEL_LEN),
            max_top_logprobs: MAX_TOP_LOGPROBS,
        }
    }

    /// The fields both routes share: model, n, max_tokens, stop strings.
    pub fn check_common(&self, common: &CommonParams) -> Result<(), ApiError> {
        if let Some(model) = &common.model {
            at_most(
                "max_model_name_bytes",
                "the `model` length in bytes",
                model.len(),
                self.max_model_name_bytes,
                Some("model"),
            )?;
        }
        if let Some(n) = common.n {
            at_most("max_n", "`n`", n as usize, self.max_n as usize, Some("n"))?;
        }
        for (field, value) in [
            ("`max_tokens`", common.max_tokens),
            ("`max_completion_tokens`", common.max_completion_tokens),
        ] {
            if let Some(v) = value
                && v > 0
            {
                at_most(
                    "max_tokens",
                    field,
                    usize::try_from(v).unwrap_or(usize::MAX),
                    self.max_tokens,
                    Some("max_tokens"),
                )?;
            }
        }
        let stops: &[String] = match &common.stop {
            None => &[],
            Some(OneOrMany::One(s)) => std::slice::from_ref(s),
            Some(OneOrMany::Many(v)) => v,
        };
        at_most(
            "max_stop_strings",
            "the number of stop strings",
            stops.len(),
            self.max_stop_strings,
            Some("stop"),
        )?;
        for (i, stop) in stops.iter().enumerate() {
            at_most(
                "max_stop_bytes",
                &format!("stop string {i}'s length in bytes"),
                stop.len(),
                self.max_stop_bytes,
                Some("stop"),
            )?;
        }
        self.check_sampling(&common.sampling)
    }

    /// The sampling fields whose size a client chooses.
    fn check_sampling(&self, sampling: &SamplingFields) -> Result<(), ApiError> {
        at_most(
            "max_logit_bias",
            "the number of logit_bias entries",
            sampling.logit_bias.as_ref().map_or(0, |m| m.len()),
            self.max_logit_bias,
            Some("logit_bias"),
        )?;
        at_most(
            "max_stop_token_ids",
            "the number of stop_token_ids",
            sampling.stop_token_ids.as_ref().map_or(0, Vec::len),
            self.max_stop_token_ids,
            Some("stop_token_ids"),
        )?;
        at_most(
            "max_grammar_bytes",
            "the structured-output fields' length in bytes",
            sampling.grammar_bytes(),
            self.max_grammar_bytes,
            None,
        )
    }

    /// A prompt given as token ids.
    pub fn check_prompt_ids(&self, len: usize) -> Result<(), ApiError> {
        at_most(
            "max_prompt_tokens",
            "the prompt's number of token ids",
            len,
            self.max_prompt_tokens,
            Some("prompt"),
        )
    }

    /// The number of prompts of a batch, before any is tokenized.
    pub fn check_prompt_count(&self, count: usize) -> Result<(), ApiError> {
        at_most(
            "max_prompts",
            "the number of prompts",
            count,
            self.max_prompts,
            Some("prompt"),
        )
    }

    /// The token ids of a batch's prompts so far, together.
    pub fn check_batch_tokens(&self, total: usize) -> Result<(), ApiError> {
        at_most(
            "max_batch_prompt_tokens",
            "the prompts' number of tokens together",
            total,
            self.max_batch_prompt_tokens,
            Some("prompt"),
        )
    }

    /// A count of log-probability alternatives, in `field`: 0 to 20.
    pub fn check_top_logprobs(&self, field: &'static str, value: i64) -> Result<usize, ApiError> {
        if value < 0 {
            return Err(ApiError::invalid(
                format!("`{field}` must be at least 0, got {value}"),
                Some(field),
            ));
        }
        let value = usize::try_from(value).unwrap_or(usize::MAX);
        at_most(
            "max_top_logprobs",
            &format!("`{field}`"),
            value,
            self.max_top_logprobs,
            Some(field),
        )?;
        Ok(value)
    }

    /// A text prompt (or a rendered chat prompt), before tokenizing.
    pub fn check_prompt_bytes(&self, len: usize) -> Result<(), ApiError> {
        at_most(
            "max_prompt_bytes",
            "the prompt's length in bytes",
            len,
            self.max_prompt_bytes,
            Some("prompt"),
        )
    }

    /// A chat's messages, before rendering: their count, their content
    /// parts, their roles, and the bytes of all contents together.
    pub fn check_messages(&self, messages: &[ChatInput]) -> Result<(), ApiError> {
        at_most(
            "max_messages",
            "the number of messages",
            messages.len(),
            self.max_messages,
            Some("messages"),
        )?;
        let mut parts = 0usize;
        let mut bytes = 0usize;
        for m in messages {
            at_most(
                "max_role_bytes",
                "a message's role length in bytes",
                m.role.len(),
                self.max_role_bytes,
                Some("messages"),
            )?;
            bytes = bytes.saturating_add(m.role.len());
            match &m.content {
                ChatContent::Text(t) => bytes = bytes.saturating_add(t.len()),
                ChatContent::Parts(p) => {
                    parts = parts.saturating_add(p.len());
                    for part in p {
                        bytes = bytes
                            .saturating_add(part.kind.len())
                            .saturating_add(part.text.as_ref().map_or(0, String::len));
                    }
                }
            }
        }
        at_most(
            "max_content_parts",
            "the number of content parts",
            parts,
            self.max_content_parts,
            Some("messages"),
        )?;
        at_most(
            "max_prompt_bytes",
            "the messages' length in bytes",
            bytes,
            self.max_prompt_bytes,
            Some("messages"),
        )
    }
}

fn at_most(
    limit: &'static str,
    what: &str,
    value: usize,
    max: usize,
    param: Option<&'static str>,
) -> Result<(), ApiError> {
    if value > max {
        Err(ApiError::over_limit(limit, what, value, max, param))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(json: serde_json::Value) -> CommonParams {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn limits_follow_the_model() {
        let l = RequestLimits::new(1024, Some(16));
        assert_eq!(l.max_prompt_bytes, 16 * 1024);
        assert_eq!(l.max_body_bytes, 3 * 16 * 1024 + (1 << 20));
        assert_eq!(l.max_prompt_tokens, 1023);
        assert_eq!(l.max_tokens, 1024);
        let none = RequestLimits::new(1024, None);
        assert_eq!(none.max_prompt_bytes, 0);
        assert_eq!(none.max_body_bytes, 1 << 20);
        let huge = RequestLimits::new(usize::MAX, Some(usize::MAX));
        assert_eq!(huge.max_body_bytes, usize::MAX);
    }

    #[test]
    fn each_refusal_names_its_limit_and_the_value() {
        let l = RequestLimits::new(1024, Some(16));
        let many: Vec<String> = (0..17).map(|i| i.to_string()).collect();
        let e = l
            .check_common(&common(serde_json::json!({"stop": many})))
            .unwrap_err();
        assert_eq!(e.code, Some("max_stop_strings"));
        assert!(
            e.message.contains("17") && e.message.contains("16"),
            "{}",
            e.message
        );
        let long = "x".repeat(257);
        let e = l
            .check_common(&common(serde_json::json!({"stop": long})))
            .unwrap_err();
        assert_eq!(e.code, Some("max_stop_bytes"));
        assert!(e.message.contains("257"), "{}", e.message);
        let e = l
            .check_common(&common(serde_json::json!({"max_tokens": 1025})))
            .unwrap_err();
        assert_eq!(e.code, Some("max_tokens"));
        let e = l
            .check_common(&common(serde_json::json!({"n": 3})))
            .unwrap_err();
        assert_eq!(e.code, Some("max_n"));
        assert!(
            l.check_common(&common(serde_json::json!({
                "stop": vec!["y".repeat(256); 16], "max_tokens": 1024, "n": 1
            })))
            .is_ok()
        );
        assert_eq!(
            l.check_prompt_bytes(16 * 1024 + 1).unwrap_err().code,
            Some("max_prompt_bytes")
        );
        assert!(l.check_prompt_bytes(16 * 1024).is_ok());
        assert_eq!(
            l.check_prompt_ids(1024).unwrap_err().code,
            Some("max_prompt_tokens")
        );
        assert!(l.check_prompt_ids(1023).is_ok());
        assert_eq!(
            l.check_prompt_count(65).unwrap_err().code,
            Some("max_prompts")
        );
        assert!(l.check_prompt_count(64).is_ok());
        assert_eq!(
            l.check_batch_tokens(4097).unwrap_err().code,
            Some("max_batch_prompt_tokens")
        );
        let e = l.check_top_logprobs("top_logprobs", 21).unwrap_err();
        assert_eq!(e.code, Some("max_top_logprobs"));
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        assert!(l.check_top_logprobs("logprobs", -1).is_err());
        assert_eq!(l.check_top_logprobs("logprobs", 20).unwrap(), 20);
    }

    #[test]
    fn messages_are_counted_with_their_parts_and_bytes() {
        let l = RequestLimits::new(1024, Some(16));
        let messages =
            |v: serde_json::Value| -> Vec<ChatInput> { serde_json::from_value(v).unwrap() };
        let one = serde_json::json!({"role": "user", "content": "hi"});
        let too_many = messages(serde_json::Value::Array(vec![one.clone(); 2049]));
        assert_eq!(
            l.check_messages(&too_many).unwrap_err().code,
            Some("max_messages")
        );
        let part = serde_json::json!({"type": "text", "text": "a"});
        let parts = messages(serde_json::json!([{"role": "user", "content": vec![part; 2049]}]));
        assert_eq!(
            l.check_messages(&parts).unwrap_err().code,
            Some("max_content_parts")
        );
        let big = messages(serde_json::json!([{"role": "user", "content": "z".repeat(16 * 1024)}]));
        assert_eq!(
            l.check_messages(&big).unwrap_err().code,
            Some("max_prompt_bytes")
        );
        let role = messages(serde_json::json!([{"role": "r".repeat(65), "content": "hi"}]));
        assert_eq!(
            l.check_messages(&role).unwrap_err().code,
            Some("max_role_bytes")
        );
        assert!(
            l.check_messages(&messages(serde_json::json!([one])))
                .is_ok()
        );
    }
}
