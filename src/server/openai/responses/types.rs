//! The wire types of `POST /v1/responses` (OpenAI's Responses API): the
//! request, its input items, the response object, its output items and the
//! streamed events.

use minijinja::Value;
use serde::{Deserialize, Serialize};

use crate::server::errors::ApiError;
use crate::server::openai::types::{CommonParams, RequestBody, Unsupported};

// ---------------------------------------------------------------- requests

/// The body of `POST /v1/responses`. The sampling fields (`model`,
/// `temperature`, `top_p`, `stream`, ...) are the other routes'.
#[derive(Deserialize)]
pub struct ResponsesRequest {
    #[serde(flatten)]
    pub common: CommonParams,
    pub input: ResponseInput,
    /// A system message before the input.
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    /// Flat function tools: `{"type": "function", "name", "description",
    /// "parameters", "strict"}`.
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    pub reasoning: Option<ReasoningParams>,
    /// Refused when set: this server keeps no responses.
    pub previous_response_id: Option<String>,
    /// Only `false` (or absent): nothing is stored.
    pub store: Option<bool>,
    /// Extra output to include: only the empty list (what agent SDKs send
    /// when they want nothing extra); anything else is refused by name.
    pub include: Option<Vec<String>>,
    /// Only `"disabled"`, what this server does: a prompt over the context
    /// is a 400, never cut.
    pub truncation: Option<String>,
    /// Only `{"format": {"type": "text"}}`, the one output format here.
    pub text: Option<serde_json::Value>,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

impl RequestBody for ResponsesRequest {
    fn unsupported(&self) -> &Unsupported {
        &self.unsupported
    }

    /// `stream_options`: the Responses API's own key, `include_obfuscation`,
    /// only `false` (no obfuscation padding is written); the chat routes'
    /// keys are refused by path (a Responses stream always ends with the
    /// usage, in `response.completed`).
    fn refuse_nested(&self) -> Result<(), ApiError> {
        let Some(options) = &self.common.stream_options else {
            return Ok(());
        };
        let chat_key = [
            ("include_usage", options.include_usage),
            ("continuous_usage_stats", options.continuous_usage_stats),
        ]
        .into_iter()
        .find(|(_, set)| *set);
        if let Some((key, _)) = chat_key {
            return Err(ApiError::unsupported_parameter(
                &format!("stream_options.{key}"),
                "is not supported on /v1/responses: its stream always ends with the usage \
                 (response.completed)",
            ));
        }
        if let Some(value) = options.unsupported.get("include_obfuscation")
            && value != &serde_json::Value::Bool(false)
        {
            return Err(ApiError::unsupported_parameter(
                "stream_options.include_obfuscation",
                "= true is not supported: this server writes no obfuscation padding",
            ));
        }
        refuse_unknown_except(&options.unsupported, &["include_obfuscation"])
    }
}

/// `stream_options`' unknown keys but `known`, by path.
fn refuse_unknown_except(unsupported: &Unsupported, known: &[&str]) -> Result<(), ApiError> {
    match unsupported.first_set_except(known) {
        None => Ok(()),
        Some(field) => Err(ApiError::unsupported_parameter(
            &format!("stream_options.{field}"),
            "is not supported by this server",
        )),
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum ResponseInput {
    Text(String),
    Items(Vec<InputItem>),
}

/// One input item. Which fields it has depends on `type` (absent: a
/// message); the conversion checks them.
#[derive(Deserialize)]
pub struct InputItem {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub id: Option<String>,
    pub status: Option<String>,
    /// message
    pub role: Option<String>,
    pub content: Option<InputContent>,
    /// function_call, function_call_output
    pub call_id: Option<String>,
    pub name: Option<String>,
    pub arguments: Option<String>,
    pub output: Option<InputContent>,
    /// reasoning
    pub summary: Option<Vec<InputPart>>,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum InputContent {
    Text(String),
    Parts(Vec<InputPart>),
}

/// `input_text`, `output_text`, `reasoning_text`, `summary_text`: text
/// parts; other types are refused.
#[derive(Deserialize)]
pub struct InputPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// On `output_text` parts the API answered (always empty here).
    pub annotations: Option<Vec<serde_json::Value>>,
    pub logprobs: Option<Vec<serde_json::Value>>,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

#[derive(Deserialize)]
pub struct ReasoningParams {
    /// `low`, `medium` or `high`: the template's `reasoning_effort`.
    pub effort: Option<String>,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

// ----------------------------------------------------------------- answers

/// The response object: the blocking answer, and the `response` of the
/// `response.created` / `.in_progress` / `.completed` / `.incomplete` events.
#[derive(Clone, Serialize)]
pub struct ResponseObject {
    pub id: String,
    /// Always `"response"`.
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress`, `completed` or `incomplete`.
    pub status: &'static str,
    pub incomplete_details: Option<IncompleteDetails>,
    pub error: Option<serde_json::Value>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: ReasoningEcho,
    pub store: bool,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub tool_choice: serde_json::Value,
    pub tools: Vec<Value>,
    pub truncation: &'static str,
    pub metadata: serde_json::Map<String, serde_json::Value>,
    pub text: TextFormatEcho,
    pub usage: Option<ResponseUsage>,
}

#[derive(Clone, Serialize)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: &'static str,
}

#[derive(Clone, Serialize)]
pub struct ReasoningEcho {
    pub effort: Option<String>,
    pub summary: Option<String>,
}

/// `{"format": {"type": "text"}}`: the only output format.
#[derive(Clone, Serialize)]
pub struct TextFormatEcho {
    pub format: TextFormat,
}

#[derive(Clone, Serialize)]
pub struct TextFormat {
    #[serde(rename = "type")]
    pub kind: &'static str,
}

#[derive(Clone, Serialize)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Clone, Serialize)]
pub struct InputTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Clone, Serialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: usize,
}

/// One item of `output`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Reasoning {
        id: String,
        summary: Vec<OutputPart>,
        content: Vec<OutputPart>,
        status: &'static str,
    },
    Message {
        id: String,
        role: &'static str,
        status: &'static str,
        content: Vec<OutputPart>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
}

/// A content part of an output item.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputPart {
    OutputText {
        text: String,
        annotations: Vec<serde_json::Value>,
        logprobs: Vec<serde_json::Value>,
    },
    ReasoningText {
        text: String,
    },
}

/// One streamed event; the SSE `event:` line is its `type`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent {
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputPart,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputPart,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: Vec<serde_json::Value>,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: Vec<serde_json::Value>,
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
}

impl StreamEvent {
    /// The event's `type`, for the SSE `event:` line.
    pub fn kind(&self) -> &'static str {
        match self {
            StreamEvent::OutputItemAdded { .. } => "response.output_item.added",
            StreamEvent::OutputItemDone { .. } => "response.output_item.done",
            StreamEvent::ContentPartAdded { .. } => "response.content_part.added",
            StreamEvent::ContentPartDone { .. } => "response.content_part.done",
            StreamEvent::OutputTextDelta { .. } => "response.output_text.delta",
            StreamEvent::OutputTextDone { .. } => "response.output_text.done",
            StreamEvent::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            StreamEvent::ReasoningTextDone { .. } => "response.reasoning_text.done",
            StreamEvent::FunctionCallArgumentsDelta { .. } => {
                "response.function_call_arguments.delta"
            }
            StreamEvent::FunctionCallArgumentsDone { .. } => {
                "response.function_call_arguments.done"
            }
        }
    }
}

/// The events that carry the whole response object.
#[derive(Serialize)]
pub struct ResponseEvent<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub sequence_number: u64,
    pub response: &'a ResponseObject,
}

/// An output event with its place in the stream.
#[derive(Serialize)]
pub struct NumberedEvent<'a> {
    #[serde(flatten)]
    pub event: &'a StreamEvent,
    pub sequence_number: u64,
}
