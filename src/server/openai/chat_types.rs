//! The chat request's messages and the fields that reach the chat template:
//! OpenAI's shapes (every form its SDKs send back in a history), and vLLM's
//! extensions (`chat_template_kwargs`, `add_generation_prompt`,
//! `continue_final_message`, `documents`).
//!
//! Values a template writes into the prompt (tool definitions, tool-call
//! arguments, template arguments) are kept as [`minijinja::Value`]: it keeps
//! the client's key order, which `serde_json::Value` would sort, and a
//! template's `tojson` must write them as the client wrote them.

use std::collections::BTreeMap;

use minijinja::Value;
use serde::Deserialize;

use super::unsupported::Unsupported;

/// One message of a chat request.
#[derive(Deserialize)]
pub struct ChatInput {
    pub role: String,
    /// A string or content parts; `null` (an assistant turn that only
    /// calls tools) is the same as absent.
    #[serde(default)]
    pub content: Option<ChatContent>,
    pub name: Option<String>,
    /// An assistant turn's calls, as the API answered them.
    pub tool_calls: Option<Vec<ToolCallInput>>,
    /// A `tool` turn: which call it answers.
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning (vLLM's two names for it).
    pub reasoning_content: Option<String>,
    pub reasoning: Option<String>,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum ChatContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part: only `{"type": "text", "text": ...}` is supported.
#[derive(Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Deserialize)]
pub struct ToolCallInput {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionCallInput,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

#[derive(Deserialize)]
pub struct FunctionCallInput {
    pub name: String,
    /// A JSON string on the wire (some clients send the object itself).
    pub arguments: Value,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

/// The chat fields, besides the messages, that the template reads.
#[derive(Deserialize, Default)]
pub struct TemplateParams {
    /// `[{"type": "function", "function": {"name", "description",
    /// "parameters"}}]`, given to the template as sent.
    pub tools: Option<Vec<Value>>,
    /// `"auto"` or `"none"` (see `chat_prompt` for what is refused).
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `low`, `medium` or `high`: the template variable of that name.
    pub reasoning_effort: Option<String>,
    /// Any further template variables (`enable_thinking`, `builtin_tools`,
    /// `model_identity`, ...).
    pub chat_template_kwargs: Option<BTreeMap<String, Value>>,
    /// Default true (false with `continue_final_message`).
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub continue_final_message: bool,
    /// Retrieval documents (`[{"title", "text"}]`) for templates that read them.
    pub documents: Option<Vec<Value>>,
}
