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
use super::openai::types::{
    ChatContent, ChatInput, CommonParams, OneOrMany, SamplingFields, TemplateParams,
};
use crate::text::ChatMessage;

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
        if let Some(best_of) = sampling.best_of {
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

    /// A chat's messages, before rendering: their count, their content
    /// parts and tool calls, their roles, and the bytes of all their text
    /// (contents, reasoning, names, tool-call arguments) together.
    pub fn check_messages(&self, messages: &[ChatInput]) -> Result<(), ApiError> {
        at_most(
            "max_messages",
            "the number of messages",
            messages.len(),
            self.max_messages,
            Some("messages"),
        )?;
        let mut parts = 0usize;
        let mut calls = 0usize;
        let mut bytes = 0usize;
        let mut add = |n: usize| bytes = bytes.saturating_add(n);
        for m in messages {
            at_most(
                "max_role_bytes",
                "a message's role length in bytes",
                m.role.len(),
                self.max_role_bytes,
                Some("messages"),
            )?;
            add(m.role.len());
            match &m.content {
                None => {}
                Some(ChatContent::Text(t)) => add(t.len()),
                Some(ChatContent::Parts(p)) => {
                    parts = parts.saturating_add(p.len());
                    for part in p {
                        add(part.kind.len());
                        add(part.text.as_ref().map_or(0, String::len));
                    }
                }
            }
            for text in [&m.name, &m.tool_call_id, &m.reasoning_content, &m.reasoning]
                .into_iter()
                .flatten()
            {
                add(text.len());
            }
            for call in m.tool_calls.iter().flatten() {
                calls += 1;
                add(call.id.as_ref().map_or(0, String::len));
                add(call.function.name.len());
                add(json_bytes(&call.function.arguments));
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
            "max_tool_calls",
            "the number of tool calls in the messages",
            calls,
            self.max_tool_calls,
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

    /// Messages built from another input shape (`/v1/responses` items), as
    /// [`RequestLimits::check_messages`] counts a chat's.
    pub fn check_chat_messages(&self, messages: &[ChatMessage]) -> Result<(), ApiError> {
        at_most(
            "max_messages",
            "the number of input items",
            messages.len(),
            self.max_messages,
            Some("input"),
        )?;
        let mut calls = 0usize;
        let mut bytes = 0usize;
        for m in messages {
            bytes = bytes
                .saturating_add(m.role.len())
                .saturating_add(m.content.len())
                .saturating_add(m.reasoning.as_ref().map_or(0, String::len));
            for call in m.tool_calls.iter().flatten() {
                calls += 1;
                bytes = bytes
                    .saturating_add(call.name.len())
                    .saturating_add(json_bytes(&call.arguments));
            }
        }
        at_most(
            "max_tool_calls",
            "the number of function calls in the input",
            calls,
            self.max_tool_calls,
            Some("input"),
        )?;
        at_most(
            "max_prompt_bytes",
            "the input's length in bytes",
            bytes,
            self.max_prompt_bytes,
            Some("input"),
        )
    }

    /// The template's further inputs, before rendering: the number of
    /// tools, and the JSON bytes of tools, documents and template
    /// arguments together.
    pub fn check_template_params(&self, params: &TemplateParams) -> Result<(), ApiError> {
        let tools = params.tools.as_deref().unwrap_or_default();
        at_most(
            "max_tools",
            "the number of tools",
            tools.len(),
            self.max_tools,
            Some("tools"),
        )?;
        let documents = params.documents.as_deref().unwrap_or_default();
        let kwargs = params.chat_template_kwargs.iter().flatten();
        let bytes = tools
            .iter()
            .chain(documents)
            .map(json_bytes)
            .chain(kwargs.map(|(name, value)| name.len() + json_bytes(value)))
            .fold(0usize, usize::saturating_add);
        at_most(
            "max_template_arguments_bytes",
            "the bytes of tools, documents and chat_template_kwargs as JSON",
            bytes,
            self.max_template_arguments_bytes,
            Some("tools"),
        )
    }
}

/// The length of a value written as compact JSON, without writing it out.
fn json_bytes(value: &minijinja::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // A value parsed from JSON always serializes; an error counts as huge.
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
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
            .check_common(&common(serde_json::json!({"n": 17})))
            .unwrap_err();
        assert_eq!(e.code, Some("max_n"));
        let mut best_of = common(serde_json::json!({}));
        best_of.sampling.best_of = Some(17);
        assert_eq!(
            l.check_common(&best_of).unwrap_err().param.as_deref(),
            Some("best_of")
        );
        best_of.sampling.best_of = Some(16);
        assert!(l.check_common(&best_of).is_ok());
        assert_eq!(
            l.check_choices(5, 13).unwrap_err().code,
            Some("max_choices")
        );
        assert!(l.check_choices(4, 16).is_ok());
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
        // Tool-call arguments count as message bytes, and calls are counted.
        let call = serde_json::json!({"id": "c", "type": "function",
            "function": {"name": "f", "arguments": "y".repeat(16 * 1024)}});
        let big_call = messages(serde_json::json!([{"role": "assistant", "tool_calls": [call]}]));
        assert_eq!(
            l.check_messages(&big_call).unwrap_err().code,
            Some("max_prompt_bytes")
        );
        let small = serde_json::json!({"function": {"name": "f", "arguments": "{}"}});
        let calls =
            messages(serde_json::json!([{"role": "assistant", "tool_calls": vec![small; 2049]}]));
        assert_eq!(
            l.check_messages(&calls).unwrap_err().code,
            Some("max_tool_calls")
        );
    }

    #[test]
    fn tools_and_template_arguments_are_bounded() {
        let l = RequestLimits::new(1024, Some(16));
        let params =
            |v: serde_json::Value| -> TemplateParams { serde_json::from_value(v).unwrap() };
        let tool = serde_json::json!({"type": "function", "function": {"name": "f"}});
        assert!(
            l.check_template_params(&params(
                serde_json::json!({"tools": vec![tool.clone(); 128]})
            ))
            .is_ok()
        );
        assert_eq!(
            l.check_template_params(&params(serde_json::json!({"tools": vec![tool; 129]})))
                .unwrap_err()
                .code,
            Some("max_tools")
        );
        // 16 KiB of JSON in any of tools, documents or kwargs, together.
        let half = "d".repeat(8 * 1024);
        let over = params(serde_json::json!({
            "documents": [{"text": half}], "chat_template_kwargs": {"k": half}
        }));
        let e = l.check_template_params(&over).unwrap_err();
        assert_eq!(e.code, Some("max_template_arguments_bytes"));
        let under = params(serde_json::json!({"chat_template_kwargs": {"k": half}}));
        assert!(l.check_template_params(&under).is_ok());
    }
}
