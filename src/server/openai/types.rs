//! The OpenAI wire types: request bodies (deserialized) and answers and
//! stream chunks (serialized). Only shapes live here; the handlers and the
//! stream fill them in.
//!
//! To add a field: add it to the struct; optional answer fields carry
//! `#[serde(skip_serializing_if = "Option::is_none")]` so clients that did not
//! ask see the same bytes as before.

use serde::{Deserialize, Serialize};

pub use super::chat_types::{
    ChatContent, ChatInput, ContentPart, FunctionCallInput, TemplateParams, ToolCallInput,
};
pub use super::logprob_types::*;
pub use super::sampling_types::SamplingFields;
pub use super::tokenize_types::*;
pub use super::tool_types::{FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta};
use super::unsupported::refuse_unknown;
pub use super::unsupported::{RequestBody, Unsupported};
use crate::engine::grammar::Constraint;
use crate::server::errors::ApiError;

// ---------------------------------------------------------------- requests

/// Either one string or a list of strings (`stop`).
#[derive(Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A prompt: text, or token ids; or a batch of either (one choice each).
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

/// Fields common to both routes. A field a route does not know lands in its
/// request's [`Unsupported`] and is refused by name (see there).
#[derive(Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    pub stop: Option<OneOrMany>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u32>,
    /// vLLM's extension: keep generating past end-of-sequence tokens
    /// (benchmarks with fixed output lengths).
    #[serde(default)]
    pub ignore_eos: bool,
    /// vLLM's extension: also answer the prompt's and the output's token ids.
    #[serde(default)]
    pub return_token_ids: bool,
    /// vLLM's extension: leave special tokens out of the answer's text
    /// (default true). Output parsers read them either way.
    pub skip_special_tokens: Option<bool>,
    /// vLLM's extension, accepted: with a `tokenizer.json` tokenizer both
    /// values give the same text (see `text::stream`).
    pub spaces_between_special_tokens: Option<bool>,
    /// vLLM's extension: requests with different salts never share
    /// prefix-cached KV blocks (at most `limits::MAX_CACHE_SALT_BYTES`).
    pub cache_salt: Option<String>,
    /// OpenAI's end-user id: accepted and not used (logged at debug).
    pub user: Option<String>,
    /// Penalties, biases, stop tokens, structured outputs: parsed by the
    /// request structs (a flattened struct inside this flattened one would
    /// hide its fields from [`Unsupported`]) and moved here.
    #[serde(skip)]
    pub sampling: SamplingFields,
    /// The grammar of the structured-output fields, compiled on the
    /// preparation pool.
    #[serde(skip)]
    pub constraint: Option<Constraint>,
    /// Where the server ends the answer itself, keeping the marker: the
    /// closing of the first tool call under `parallel_tool_calls: false`.
    #[serde(skip)]
    pub end_after: Vec<String>,
}

#[derive(Deserialize)]
pub struct StreamOptions {
    /// A last chunk with the request's usage before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
    /// vLLM's: with `include_usage`, every chunk also carries its choice's
    /// running usage (the prompt's tokens and the completion's so far).
    #[serde(default)]
    pub continuous_usage_stats: bool,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

impl CommonParams {
    /// `stream_options`' unknown keys.
    pub fn refuse_nested(&self) -> Result<(), ApiError> {
        match &self.stream_options {
            Some(options) => refuse_unknown(&options.unsupported, || "stream_options".to_owned()),
            None => Ok(()),
        }
    }

    /// Whether the stream ends with a usage chunk, and whether every chunk
    /// carries the running usage (vLLM sends it only with `include_usage`).
    pub fn usage_asked(&self) -> (bool, bool) {
        match &self.stream_options {
            Some(o) => (o.include_usage, o.include_usage && o.continuous_usage_stats),
            None => (false, false),
        }
    }
}

/// The body of `POST /v1/completions`.
#[derive(Deserialize)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: CommonParams,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    pub prompt: Prompt,
    #[serde(flatten)]
    pub logprobs: CompletionLogprobParams,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

/// The body of `POST /v1/chat/completions`.
#[derive(Deserialize)]
pub struct ChatRequest {
    #[serde(flatten)]
    pub common: CommonParams,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    pub messages: Vec<ChatInput>,
    /// Tools, template arguments and the generation prompt.
    #[serde(flatten)]
    pub template: TemplateParams,
    #[serde(flatten)]
    pub logprobs: ChatLogprobParams,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

impl RequestBody for CompletionRequest {
    fn unsupported(&self) -> &Unsupported {
        &self.unsupported
    }

    fn refuse_nested(&self) -> Result<(), ApiError> {
        self.common.refuse_nested()?;
        self.sampling.refuse_nested()
    }
}

impl RequestBody for ChatRequest {
    fn unsupported(&self) -> &Unsupported {
        &self.unsupported
    }

    fn refuse_nested(&self) -> Result<(), ApiError> {
        self.common.refuse_nested()?;
        self.sampling.refuse_nested()
    }
}

// ----------------------------------------------------------------- answers

/// The answer of `GET /v1/models`.
#[derive(Serialize)]
pub struct ModelList {
    /// Always `"list"`.
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[derive(Serialize)]
pub struct ModelCard {
    pub id: String,
    /// Always `"model"`.
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub max_model_len: usize,
}

#[derive(Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's `usage.prompt_tokens_details`.
#[derive(Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: 0 },
        }
    }

    /// With `cached` of the prompt tokens served from the prefix cache.
    pub fn with_cached_tokens(mut self, cached: usize) -> Usage {
        self.prompt_tokens_details.cached_tokens = cached;
        self
    }
}

/// A blocking answer: `C` is [`TextChoice`] (`object: "text_completion"`) or
/// [`ChatChoice`] (`object: "chat.completion"`).
#[derive(Serialize)]
pub struct CompletionResponse<C> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<C>,
    pub usage: Usage,
}

/// One streamed chunk: `C` is [`TextChoice`] (`object: "text_completion"`)
/// or [`ChatChunkChoice`] (`object: "chat.completion.chunk"`). The last chunk
/// before `[DONE]`, when the client asked for usage, has no choices and the
/// usage.
#[derive(Serialize)]
pub struct CompletionChunk<C> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// Token ids on a choice, when the request asked for them
/// (`return_token_ids`); absent otherwise.
#[derive(Serialize, Default)]
pub struct ChoiceTokenIds {
    /// The prompt's ids: on the blocking answer, and on a stream's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The ids of the tokens this choice's text came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// A `/v1/completions` choice, blocking or streamed (where `finish_reason`
/// is `null` until the last chunk).
#[derive(Serialize)]
pub struct TextChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<Logprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(flatten)]
    pub ids: ChoiceTokenIds,
    /// vLLM's `prompt_logprobs`, when asked for (on a stream's first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// A blocking `/v1/chat/completions` choice.
#[derive(Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<Logprobs>,
    pub finish_reason: &'static str,
    #[serde(flatten)]
    pub ids: ChoiceTokenIds,
}

/// The answer's message. With an output parser, reasoning and tool calls
/// are apart from the content, which is then `null` when there is none.
#[derive(Serialize)]
pub struct AssistantMessage {
    /// Always `"assistant"`.
    pub role: &'static str,
    pub content: Option<String>,
    /// The reasoning (vLLM's name, which the OpenAI clients read through
    /// `model_extra`); `reasoning` repeats it under vLLM's newer name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// A streamed `/v1/chat/completions` choice.
#[derive(Serialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    pub logprobs: Option<Logprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(flatten)]
    pub ids: ChoiceTokenIds,
}

/// What a chat chunk adds: the role on the first chunk, then content,
/// reasoning (under both names, as for [`AssistantMessage`]) or tool-call
/// pieces; the last chunk (with the finish reason) has none: `{}`.
#[derive(Serialize, Default)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// The one role answers come from.
pub const ASSISTANT: &str = "assistant";

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn optional_fields_are_absent_and_logprobs_null() {
        let choice = TextChoice {
            index: 0,
            text: "hi".into(),
            logprobs: None,
            finish_reason: None,
            ids: ChoiceTokenIds::default(),
            prompt_logprobs: None,
        };
        assert_eq!(
            serde_json::to_value(&choice).unwrap(),
            json!({"index": 0, "text": "hi", "logprobs": null, "finish_reason": null})
        );
        let last = ChatChunkChoice {
            index: 0,
            delta: ChatDelta::default(),
            logprobs: None,
            finish_reason: Some("stop"),
            ids: ChoiceTokenIds {
                prompt_token_ids: None,
                token_ids: Some(vec![]),
            },
        };
        assert_eq!(
            serde_json::to_value(&last).unwrap(),
            json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop",
                   "token_ids": []})
        );
    }

    #[test]
    fn fields_no_struct_takes_are_collected_and_nulls_are_not_set() {
        let body: ChatRequest = serde_json::from_value(json!({
            "model": "m", "temperature": 0.5, "messages": [{"role": "user", "content": "hi"}],
            "zeta_unknown": 1, "alpha_unknown": {"x": 1}, "beta_null": null
        }))
        .unwrap();
        assert_eq!(body.common.temperature, Some(0.5));
        assert_eq!(body.unsupported().first_set(), Some("alpha_unknown"));

        let body: CompletionRequest =
            serde_json::from_value(json!({"prompt": "p", "max_tokens": 3, "beta_null": null}))
                .unwrap();
        assert_eq!(body.common.max_tokens, Some(3));
        assert_eq!(body.unsupported().first_set(), None);

        // `user` is taken (and ignored), not refused.
        let body: ChatRequest = serde_json::from_value(json!({
            "messages": [{"role": "user", "content": "hi"}], "user": "ann"
        }))
        .unwrap();
        assert_eq!(body.common.user.as_deref(), Some("ann"));
        assert_eq!(body.unsupported().first_set(), None);

        // The sampling fields are taken by their struct, not left over.
        let body: CompletionRequest = serde_json::from_value(
            json!({"prompt": "p", "max_tokens": 3, "min_p": 0.1, "guided_regex": "a+", "zz": 1}),
        )
        .unwrap();
        assert_eq!(body.sampling.min_p, Some(0.1));
        assert_eq!(body.unsupported().first_set(), Some("zz"));
    }

    #[test]
    fn usage_chunk_has_no_choices_and_the_usage() {
        let chunk = CompletionChunk::<TextChoice> {
            id: "cmpl-1".into(),
            object: "text_completion",
            created: 7,
            model: "m".into(),
            choices: vec![],
            usage: Some(Usage::new(5, 3)),
        };
        assert_eq!(
            serde_json::to_value(&chunk).unwrap(),
            json!({"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m",
                   "choices": [],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                             "prompt_tokens_details": {"cached_tokens": 0}}})
        );
    }
}
