//! The answer shapes of reasoning and tool calls on `/v1/chat/completions`
//! (OpenAI's, which vLLM follows), filled from the output parsers'
//! [`Delta`]s and [`ParsedMessage`].

use serde::Serialize;

use crate::text::parsers::{Delta, ParsedMessage, ParsedToolCall};

/// A tool call of a blocking answer.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ToolCall {
    /// `call_…`.
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as a JSON text.
    pub arguments: String,
}

impl From<ParsedToolCall> for ToolCall {
    fn from(call: ParsedToolCall) -> ToolCall {
        ToolCall {
            id: call.id,
            kind: "function",
            function: FunctionCall {
                name: call.name,
                arguments: call.arguments,
            },
        }
    }
}

/// A piece of a tool call in a stream: the first one of a call has its
/// `id`, `type`, `function.name` and `arguments: ""`; the next ones only the
/// `index` and more `function.arguments`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionCallDelta,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FunctionCallDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A parser delta as the tool-call part of a stream chunk, if it is one.
pub fn tool_call_delta(delta: &Delta) -> Option<ToolCallDelta> {
    match delta {
        Delta::ToolCallStart { index, id, name } => Some(ToolCallDelta {
            index: *index,
            id: Some(id.clone()),
            kind: Some("function"),
            function: FunctionCallDelta {
                name: Some(name.clone()),
                arguments: Some(String::new()),
            },
        }),
        Delta::ToolCallArguments { index, fragment } => Some(ToolCallDelta {
            index: *index,
            id: None,
            kind: None,
            function: FunctionCallDelta {
                name: None,
                arguments: Some(fragment.clone()),
            },
        }),
        Delta::Reasoning(_) | Delta::Content(_) => None,
    }
}

/// The parts of a finished message as the answer shows them: `content` is
/// `null` when the answer is only tool calls or only reasoning, `""` for an
/// answer with nothing at all.
pub fn message_parts(parsed: ParsedMessage) -> (Option<String>, Option<String>, Vec<ToolCall>) {
    let content = match parsed.content {
        Some(text) => Some(text),
        None if parsed.tool_calls.is_empty() && parsed.reasoning.is_none() => Some(String::new()),
        None => None,
    };
    let tool_calls = parsed.tool_calls.into_iter().map(ToolCall::from).collect();
    (content, parsed.reasoning, tool_calls)
}

/// OpenAI's finish reason once tool calls were made: `tool_calls` where the
/// model stopped by itself; a cut (`length`) stays what it is.
pub fn finish_reason(reason: &'static str, made_tool_calls: bool) -> &'static str {
    if made_tool_calls && reason == "stop" {
        "tool_calls"
    } else {
        reason
    }
}
