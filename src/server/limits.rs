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
//!
//! Everything here takes plain numbers and strings: each route counts its
//! own request into the sizes below (the OpenAI routes in
//! `openai::sizes`), so the limits know nothing of a wire format.

use super::errors::ApiError;

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
/// Tool definitions of one request (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;
/// Tool calls in one chat history, all messages together.
pub const MAX_TOOL_CALLS: usize = 2048;
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
/// Choices per prompt: `n`, and `best_of` (the candidates generated).
pub const MAX_N: u32 = 16;
/// Choices of one request, all its prompts together (prompts × `best_of`,
/// or × `n`): each is an engine sequence.
pub const MAX_CHOICES: usize = 64;
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
    pub max_tools: usize,
    pub max_tool_calls: usize,
    /// Bytes of `tools`, `documents` and `chat_template_kwargs` together,
    /// as JSON: `max_prompt_bytes` (the template writes them into the
    /// prompt, which may not be longer).
    pub max_template_arguments_bytes: usize,
    pub max_stop_strings: usize,
    pub max_stop_bytes: usize,
    pub max_role_bytes: usize,
    pub max_model_name_bytes: usize,
    pub max_n: u32,
    pub max_choices: usize,
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
            max_tools: MAX_TOOLS,
            max_tool_calls: MAX_TOOL_CALLS,
            max_template_arguments_bytes: max_prompt_bytes,
            max_stop_strings: MAX_STOP_STRINGS,
            max_stop_bytes: MAX_STOP_BYTES,
            max_role_bytes: MAX_ROLE_BYTES,
            max_model_name_bytes: MAX_MODEL_NAME_BYTES,
            max_n: MAX_N,
            max_choices: MAX_CHOICES,
            max_logit_bias: MAX_LOGIT_BIAS,
            max_stop_token_ids: MAX_STOP_TOKEN_IDS,
            max_grammar_bytes: MAX_GRAMMAR_BYTES,
            max_prompts: MAX_PROMPTS,
            max_batch_prompt_tokens: max_model_len.saturating_mul(BATCH_TOKENS_PER_MODEL_LEN),
            max_top_logprobs: MAX_TOP_LOGPROBS,
        }
    }

    /// The fields every generation route shares: model, n, max_tokens,
    /// stop strings, and the sampling fields whose size a client chooses.
    pub fn check_common(&self, sizes: &CommonSizes<'_>) -> Result<(), ApiError> {
        if let Some(model_bytes) = sizes.model_bytes {
            at_most(
                "max_model_name_bytes",
                "the `model` length in bytes",
                model_bytes,
                self.max_model_name_bytes,
                Some("model"),
            )?;
        }
        if let Some(n) = sizes.n {
            at_most("max_n", "`n`", n as usize, self.max_n as usize, Some("n"))?;
        }
        for (field, value) in [
            ("`max_tokens`", sizes.max_tokens),
            ("`max_completion_tokens`", sizes.max_completion_tokens),
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
        at_most(
            "max_stop_strings",
            "the number of stop strings",
            sizes.stop.len(),
            self.max_stop_strings,
            Some("stop"),
        )?;
        for (i, stop) in sizes.stop.iter().enumerate() {
            at_most(
                "max_stop_bytes",
                &format!("stop string {i}'s length in bytes"),
                stop.len(),
                self.max_stop_bytes,
                Some("stop"),
            )?;
        }
        if let Some(best_of) = sizes.best_of {
            at_most(
                "max_n",
                "`best_of`",
                usize::try_from(best_of).unwrap_or(0),
                self.max_n as usize,
                Some("best_of"),
            )?;
        }
        at_most(
            "max_logit_bias",
            "the number of logit_bias entries",
            sizes.logit_bias,
            self.max_logit_bias,
            Some("logit_bias"),
        )?;
        at_most(
            "max_stop_token_ids",
            "the number of stop_token_ids",
            sizes.stop_token_ids,
            self.max_stop_token_ids,
            Some("stop_token_ids"),
        )?;
        at_most(
            "max_grammar_bytes",
            "the structured-output fields' length in bytes",
            sizes.grammar_bytes,
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

    /// The engine sequences of one request: `prompts` prompts of
    /// `per_prompt` choices each (`best_of`, else `n`).
    pub fn check_choices(&self, prompts: usize, per_prompt: usize) -> Result<(), ApiError> {
        at_most(
            "max_choices",
            "the number of choices (prompts × n, or × best_of)",
            prompts.saturating_mul(per_prompt),
            self.max_choices,
            Some("n"),
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

    /// A chat's messages, before rendering: their count, their roles, their
    /// content parts and tool calls, and the bytes of all their text.
    pub fn check_messages(&self, sizes: &MessageSizes) -> Result<(), ApiError> {
        at_most(
            "max_messages",
            "the number of messages",
            sizes.messages,
            self.max_messages,
            Some("messages"),
        )?;
        for &role_bytes in &sizes.role_bytes {
            at_most(
                "max_role_bytes",
                "a message's role length in bytes",
                role_bytes,
                self.max_role_bytes,
                Some("messages"),
            )?;
        }
        at_most(
            "max_content_parts",
            "the number of content parts",
            sizes.content_parts,
            self.max_content_parts,
            Some("messages"),
        )?;
        at_most(
            "max_tool_calls",
            "the number of tool calls in the messages",
            sizes.tool_calls,
            self.max_tool_calls,
            Some("messages"),
        )?;
        at_most(
            "max_prompt_bytes",
            "the messages' length in bytes",
            sizes.text_bytes,
            self.max_prompt_bytes,
            Some("messages"),
        )
    }

    /// Input items (`/v1/responses`), counted as a chat's messages are.
    pub fn check_input_items(&self, sizes: &InputSizes) -> Result<(), ApiError> {
        at_most(
            "max_messages",
            "the number of input items",
            sizes.items,
            self.max_messages,
            Some("input"),
        )?;
        at_most(
            "max_tool_calls",
            "the number of function calls in the input",
            sizes.function_calls,
            self.max_tool_calls,
            Some("input"),
        )?;
        at_most(
            "max_prompt_bytes",
            "the input's length in bytes",
            sizes.text_bytes,
            self.max_prompt_bytes,
            Some("input"),
        )
    }

    /// The template's further inputs, before rendering: the number of
    /// tools, and the JSON bytes of tools, documents and template
    /// arguments together.
    pub fn check_template_arguments(&self, sizes: &TemplateSizes) -> Result<(), ApiError> {
        at_most(
            "max_tools",
            "the number of tools",
            sizes.tools,
            self.max_tools,
            Some("tools"),
        )?;
        at_most(
            "max_template_arguments_bytes",
            "the bytes of tools, documents and chat_template_kwargs as JSON",
            sizes.argument_bytes,
            self.max_template_arguments_bytes,
            Some("tools"),
        )
    }
}

/// The client-sized fields every generation request shares, as its route
/// read them.
#[derive(Clone, Debug, Default)]
pub struct CommonSizes<'a> {
    /// Bytes of `model`, when given.
    pub model_bytes: Option<usize>,
    pub n: Option<u32>,
    /// As sent: 0 and below are refused elsewhere, not here.
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub stop: &'a [String],
    pub best_of: Option<i64>,
    /// Entries of `logit_bias`.
    pub logit_bias: usize,
    /// Entries of `stop_token_ids`.
    pub stop_token_ids: usize,
    /// Bytes of the structured-output fields together.
    pub grammar_bytes: usize,
}

/// A chat's messages, counted.
#[derive(Clone, Debug, Default)]
pub struct MessageSizes {
    pub messages: usize,
    /// Each message's role length in bytes, in order (the first one over
    /// the limit is the one named).
    pub role_bytes: Vec<usize>,
    pub content_parts: usize,
    pub tool_calls: usize,
    /// Bytes of all their text together: contents, roles, reasoning,
    /// names, tool-call ids, names and arguments.
    pub text_bytes: usize,
}

/// `/v1/responses` input items, counted.
#[derive(Clone, Debug, Default)]
pub struct InputSizes {
    pub items: usize,
    pub function_calls: usize,
    /// Bytes of all their text together.
    pub text_bytes: usize,
}

/// The template's further inputs, counted.
#[derive(Clone, Debug, Default)]
pub struct TemplateSizes {
    pub tools: usize,
    /// JSON bytes of tools, documents and template arguments together.
    pub argument_bytes: usize,
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
            .check_common(&CommonSizes {
                stop: &many,
                ..CommonSizes::default()
            })
            .unwrap_err();
        assert_eq!(e.code, Some("max_stop_strings"));
        assert!(
            e.message.contains("17") && e.message.contains("16"),
            "{}",
            e.message
        );
        let long = ["x".repeat(257)];
        let e = l
            .check_common(&CommonSizes {
                stop: &long,
                ..CommonSizes::default()
            })
            .unwrap_err();
        assert_eq!(e.code, Some("max_stop_bytes"));
        assert!(e.message.contains("257"), "{}", e.message);
        let e = l
            .check_common(&CommonSizes {
                max_tokens: Some(1025),
                ..CommonSizes::default()
            })
            .unwrap_err();
        assert_eq!(e.code, Some("max_tokens"));
        let e = l
            .check_common(&CommonSizes {
                n: Some(17),
                ..CommonSizes::default()
            })
            .unwrap_err();
        assert_eq!(e.code, Some("max_n"));
        let mut best_of = CommonSizes {
            best_of: Some(17),
            ..CommonSizes::default()
        };
        assert_eq!(
            l.check_common(&best_of).unwrap_err().param.as_deref(),
            Some("best_of")
        );
        best_of.best_of = Some(16);
        assert!(l.check_common(&best_of).is_ok());
        assert_eq!(
            l.check_choices(5, 13).unwrap_err().code,
            Some("max_choices")
        );
        assert!(l.check_choices(4, 16).is_ok());
        let stops = vec!["y".repeat(256); 16];
        assert!(
            l.check_common(&CommonSizes {
                stop: &stops,
                max_tokens: Some(1024),
                n: Some(1),
                ..CommonSizes::default()
            })
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
}
