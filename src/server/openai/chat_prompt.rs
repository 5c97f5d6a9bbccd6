//! A chat request's messages and template fields turned into what the chat
//! template is rendered with ([`ChatPrompt`]), the way vLLM prepares them
//! for transformers' `apply_chat_template`:
//! - text content parts are joined with `"\n"`; `content: null` is `""`;
//! - a tool call's `function.arguments`, a JSON string on the wire, is
//!   parsed into a mapping (templates write it with `tojson`);
//! - an assistant turn's `reasoning_content` / `reasoning` is given to the
//!   template under every name templates read ([`ChatMessage::reasoning`]);
//! - `reasoning_effort`, then `chat_template_kwargs` (which win), become
//!   template variables;
//! - `tool_choice: "none"` hides the tools from the template (and the output
//!   is not parsed for calls).
//!
//! What cannot be honoured is a 400 naming the field: content parts other
//! than text. `tool_choice` `required` / a named function is held to the
//! tool-call format by a grammar (`tool_grammar`), and so are the calls of
//! `strict` functions under `"auto"`. `parallel_tool_calls: false` keeps the
//! answer's first tool call (a forced choice's grammar admits only one).

use std::borrow::Cow;

use minijinja::Value;
use minijinja::value::ValueKind;

use super::chat_types::{ChatContent, ChatInput, TemplateParams, ToolCallInput};
use super::tool_grammar::ForcedTools;
pub(super) use super::unsupported::refuse_unknown;
use super::unsupported::{refuse_unknown_keys, refuse_unknown_template_keys};
use crate::server::errors::ApiError;
use crate::text::{ChatMessage, ChatPrompt, TextError, ToolCall};

/// The `reasoning_effort` values templates know (gpt-oss: `Reasoning: …`).
const REASONING_EFFORTS: [&str; 3] = ["low", "medium", "high"];

/// What the template gets, and what the answer's parsing needs to know.
pub struct PreparedChat {
    pub prompt: ChatPrompt,
    /// Tools reached the template, so the output may hold tool calls
    /// (false without tools and with `tool_choice: "none"`).
    pub tools_offered: bool,
    /// `tool_choice` `required` or a named function: the calls the answer
    /// must make; under `"auto"` with a `strict` function, the calls it may
    /// make (constrained by a grammar, see `tool_grammar`).
    pub forced: Option<ForcedTools>,
    /// `parallel_tool_calls: false` without a forced choice: the answer's
    /// parser keeps its first tool call only.
    pub first_call_only: bool,
}

/// Checks and converts a chat request's messages and template fields. The
/// sizes are checked before, by `RequestLimits`.
pub fn prepare(input: Vec<ChatInput>, params: TemplateParams) -> Result<PreparedChat, ApiError> {
    if input.is_empty() {
        return Err(ApiError::invalid(
            "`messages` must not be empty",
            Some("messages"),
        ));
    }
    let messages = input
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    with_template_params(messages, params)
}

/// Converted messages and the template fields: what `prepare` does after
/// the messages, shared with `/v1/responses` (which has its own input
/// items).
pub fn with_template_params(
    messages: Vec<ChatMessage>,
    params: TemplateParams,
) -> Result<PreparedChat, ApiError> {
    if let Some(tools) = &params.tools {
        for (i, tool) in tools.iter().enumerate() {
            check_tool(i, tool)?;
        }
    }
    let has_tools = params.tools.as_ref().is_some_and(|t| !t.is_empty());
    let choice = tool_choice(params.tool_choice.as_ref())?;
    let parallel = params.parallel_tool_calls != Some(false);
    let tools = params.tools.as_deref().unwrap_or_default();
    let forced = match &choice {
        ToolChoice::None => None,
        ToolChoice::Auto => ForcedTools::strict_under_auto(offered_functions(tools), parallel),
        ToolChoice::Required | ToolChoice::Named(_) => {
            Some(forced_tools(tools, &choice, parallel)?)
        }
    };
    let tools_offered = match choice {
        ToolChoice::Auto => has_tools,
        ToolChoice::None => false,
        ToolChoice::Required | ToolChoice::Named(_) => true,
    };
    // `false` under "auto": the answer keeps its first call (vLLM's
    // meaning); under "required" / a named function the grammar admits one.
    let first_call_only = !parallel && forced.as_ref().is_none_or(|f| f.optional);
    if let Some(documents) = &params.documents
        && documents.iter().any(|d| d.kind() != ValueKind::Map)
    {
        return Err(ApiError::invalid(
            "each document must be an object (e.g. {\"title\": ..., \"text\": ...})",
            Some("documents"),
        ));
    }

    let mut kwargs = Vec::new();
    if let Some(effort) = params.reasoning_effort {
        if !REASONING_EFFORTS.contains(&effort.as_str()) {
            return Err(ApiError::invalid(
                format!("reasoning_effort must be one of {REASONING_EFFORTS:?}, not {effort:?}"),
                Some("reasoning_effort"),
            ));
        }
        kwargs.push(("reasoning_effort".to_owned(), Value::from(effort)));
    }
    for (name, value) in params.chat_template_kwargs.unwrap_or_default() {
        kwargs.retain(|(set, _)| *set != name);
        kwargs.push((name, value));
    }

    let continue_final_message = params.continue_final_message;
    if continue_final_message && params.add_generation_prompt == Some(true) {
        return Err(ApiError::invalid(
            "continue_final_message and add_generation_prompt cannot both be true: one continues \
             the last message, the other starts a new assistant turn",
            Some("continue_final_message"),
        ));
    }
    Ok(PreparedChat {
        prompt: ChatPrompt {
            messages,
            tools: if tools_offered { params.tools } else { None },
            documents: params.documents,
            add_generation_prompt: params
                .add_generation_prompt
                .unwrap_or(!continue_final_message),
            continue_final_message,
            kwargs,
        },
        tools_offered,
        forced,
        first_call_only,
    })
}

/// The 400 a rendering failure answers: the template refused the
/// conversation, or a template argument is not allowed.
pub fn render_error(error: TextError) -> ApiError {
    match error {
        TextError::ReservedTemplateVariable { .. } => {
            ApiError::invalid(error.to_string(), Some("chat_template_kwargs"))
        }
        TextError::ContinueFinalMessage { .. } => {
            ApiError::invalid(error.to_string(), Some("continue_final_message"))
        }
        TextError::TemplateOverLimit { limit } => {
            ApiError::invalid(error.to_string(), Some("messages")).with_code(limit.name())
        }
        TextError::TemplateWorkerUnavailable { .. } => ApiError::internal(error.to_string()),
        other => ApiError::invalid(format!("chat template: {other}"), Some("messages")),
    }
}

enum ToolChoice {
    Auto,
    None,
    Required,
    /// `{"type": "function", "function": {"name": N}}` (the Responses
    /// API's flat `{"type": "function", "name": N}` too).
    Named(String),
}

fn tool_choice(value: Option<&serde_json::Value>) -> Result<ToolChoice, ApiError> {
    match value {
        None => Ok(ToolChoice::Auto),
        Some(serde_json::Value::String(s)) if s == "auto" => Ok(ToolChoice::Auto),
        Some(serde_json::Value::String(s)) if s == "none" => Ok(ToolChoice::None),
        Some(serde_json::Value::String(s)) if s == "required" => Ok(ToolChoice::Required),
        Some(object @ serde_json::Value::Object(map)) => {
            if map.get("type").and_then(serde_json::Value::as_str) != Some("function") {
                return Err(invalid_at(
                    "tool_choice.type".into(),
                    "tool_choice.type must be \"function\"".into(),
                ));
            }
            let name = match map.get("function") {
                Some(function) => {
                    refuse_unknown_keys(object, &["type", "function"], "tool_choice")?;
                    refuse_unknown_keys(function, &["name"], "tool_choice.function")?;
                    function.get("name")
                }
                None => {
                    refuse_unknown_keys(object, &["type", "name"], "tool_choice")?;
                    map.get("name")
                }
            };
            match name.and_then(serde_json::Value::as_str) {
                Some(name) => Ok(ToolChoice::Named(name.to_owned())),
                None => Err(invalid_at(
                    "tool_choice.function.name".into(),
                    "tool_choice naming a function needs its `name`".into(),
                )),
            }
        }
        Some(other) => Err(ApiError::invalid(
            format!(
                "tool_choice must be \"auto\", \"none\", \"required\" or an object, not {other}"
            ),
            Some("tool_choice"),
        )),
    }
}

/// The calls `choice` forces, from the offered tools (checked before).
fn forced_tools(
    tools: &[Value],
    choice: &ToolChoice,
    parallel: bool,
) -> Result<ForcedTools, ApiError> {
    let functions = offered_functions(tools);
    if functions.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice \"required\" or a named function needs `tools`",
            Some("tool_choice"),
        ));
    }
    let name = match choice {
        ToolChoice::Named(name) => {
            if !functions
                .iter()
                .any(|f| f.get("name").and_then(serde_json::Value::as_str) == Some(name.as_str()))
            {
                return Err(invalid_at(
                    "tool_choice.function.name".into(),
                    format!("tool_choice names {name:?}, which is not among `tools`"),
                ));
            }
            Some(name.clone())
        }
        _ => None,
    };
    Ok(ForcedTools {
        functions,
        name,
        parallel,
        optional: false,
    })
}

/// Each offered tool's `function` object (checked before).
fn offered_functions(tools: &[Value]) -> Vec<serde_json::Value> {
    tools
        .iter()
        .filter_map(|tool| tool.get_attr("function").ok())
        .filter_map(|function| serde_json::to_value(&function).ok())
        .collect()
}

/// A tool definition must be `{"type": "function", "function": {"name": ...}}`.
fn check_tool(i: usize, tool: &Value) -> Result<(), ApiError> {
    let field = |name: &str| tool.get_attr(name).ok().filter(|v| !v.is_undefined());
    let kind = field("type");
    if kind.as_ref().and_then(Value::as_str) != Some("function") {
        return Err(invalid_at(
            format!("tools[{i}].type"),
            format!(
                "tools[{i}].type must be \"function\" (found {})",
                kind.map_or("nothing".to_owned(), |k| k.to_string())
            ),
        ));
    }
    let name = field("function").and_then(|f| f.get_attr("name").ok());
    if name.as_ref().and_then(Value::as_str).is_none() {
        return Err(invalid_at(
            format!("tools[{i}].function.name"),
            format!("tools[{i}].function must be an object with a string `name`"),
        ));
    }
    refuse_unknown_template_keys(tool, TOOL_KEYS, &format!("tools[{i}]"))?;
    if let Some(function) = field("function") {
        refuse_unknown_template_keys(&function, FUNCTION_KEYS, &format!("tools[{i}].function"))?;
    }
    Ok(())
}

/// A chat tool definition's keys, and its function's (OpenAI's). The
/// `parameters` schema is the template's to write, not checked here.
const TOOL_KEYS: &[&str] = &["type", "function"];
const FUNCTION_KEYS: &[&str] = &["name", "description", "parameters", "strict"];

fn message(i: usize, m: ChatInput) -> Result<ChatMessage, ApiError> {
    refuse_unknown(&m.unsupported, || format!("messages[{i}]"))?;
    let content = match m.content {
        // Only an assistant turn may leave it out (it then calls tools).
        None if m.role != "assistant" => {
            return Err(invalid_at(
                format!("messages[{i}].content"),
                format!("messages[{i}] (role {:?}) has no content", m.role),
            ));
        }
        None => String::new(),
        Some(ChatContent::Text(text)) => text,
        Some(ChatContent::Parts(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.into_iter().enumerate() {
                if part.kind != "text" {
                    return Err(ApiError::unsupported_parameter(
                        &format!("messages[{i}].content[{j}].type"),
                        &format!(
                            "= {:?}: this server serves text only (image, audio, video and file \
                             parts are refused); content parts must be of type \"text\"",
                            part.kind
                        ),
                    ));
                }
                refuse_unknown(&part.unsupported, || format!("messages[{i}].content[{j}]"))?;
                let text = part.text.ok_or_else(|| {
                    invalid_at(
                        format!("messages[{i}].content[{j}].text"),
                        format!("messages[{i}].content[{j}] is a text part without `text`"),
                    )
                })?;
                texts.push(text);
            }
            texts.join("\n")
        }
    };
    let tool_calls = m
        .tool_calls
        .map(|calls| {
            calls
                .into_iter()
                .enumerate()
                .map(|(j, call)| tool_call(i, j, call))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    // vLLM's order of preference; an empty `reasoning_content` falls through.
    let reasoning = match (m.reasoning_content, m.reasoning) {
        (Some(r), _) if !r.is_empty() => Some(r),
        (_, r) => r,
    };
    Ok(ChatMessage {
        role: m.role,
        content,
        reasoning,
        tool_calls,
        tool_call_id: m.tool_call_id,
        name: m.name,
    })
}

fn tool_call(i: usize, j: usize, call: ToolCallInput) -> Result<ToolCall, ApiError> {
    let at = || format!("messages[{i}].tool_calls[{j}]");
    refuse_unknown(&call.unsupported, at)?;
    refuse_unknown(&call.function.unsupported, || format!("{}.function", at()))?;
    if let Some(kind) = &call.kind
        && kind != "function"
    {
        return Err(invalid_at(
            format!("{}.type", at()),
            format!("{}.type must be \"function\", not {kind:?}", at()),
        ));
    }
    let arguments = match call.function.arguments.as_str() {
        Some(text) => serde_json::from_str::<Value>(text).map_err(|e| {
            invalid_at(
                format!("{}.function.arguments", at()),
                format!("{}.function.arguments is not valid JSON: {e}", at()),
            )
        })?,
        None => call.function.arguments,
    };
    Ok(ToolCall {
        id: call.id,
        name: call.function.name,
        arguments,
    })
}

/// A 400 whose `param` is a path built from the request (`messages[2].…`).
pub(super) fn invalid_at(param: String, message: String) -> ApiError {
    let mut error = ApiError::invalid(message, None);
    error.param = Some(Cow::Owned(param));
    error
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::openai::types::ChatRequest;

    fn prepare_json(body: &str) -> Result<PreparedChat, ApiError> {
        let body: ChatRequest = serde_json::from_str(body).unwrap();
        prepare(body.messages, body.template)
    }

    #[test]
    fn parallel_tool_calls_false_keeps_one_call_under_auto_only() {
        let tools = r#"[{"type": "function", "function": {"name": "f"}}]"#;
        let hi = r#"[{"role": "user", "content": "hi"}]"#;
        let auto = prepare_json(&format!(
            r#"{{"messages": {hi}, "tools": {tools}, "parallel_tool_calls": false}}"#
        ))
        .unwrap();
        assert!(auto.first_call_only);
        let required = prepare_json(&format!(
            r#"{{"messages": {hi}, "tools": {tools}, "tool_choice": "required", "parallel_tool_calls": false}}"#
        ))
        .unwrap();
        assert!(!required.first_call_only);
        assert!(!required.forced.unwrap().parallel);
        let default = prepare_json(&format!(r#"{{"messages": {hi}, "tools": {tools}}}"#)).unwrap();
        assert!(!default.first_call_only);
    }

    fn param(error: &ApiError) -> Option<&str> {
        error.param.as_deref()
    }

    #[test]
    fn every_openai_message_shape_reaches_the_template() {
        let prepared = prepare_json(
            r#"{"messages": [
                {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "user", "content": "hi", "name": "ann"},
                {"role": "assistant", "content": null, "reasoning_content": "think",
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [2.5]}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
                {"role": "assistant", "content": "done", "reasoning_content": "", "reasoning": "r2",
                 "refusal": null}
            ], "tools": [{"type": "function", "function": {"name": "f"}}]}"#,
        )
        .unwrap();
        let m = &prepared.prompt.messages;
        assert_eq!(
            (m[0].role.as_str(), m[0].content.as_str()),
            ("developer", "a\nb")
        );
        assert_eq!(m[1].name.as_deref(), Some("ann"));
        assert_eq!(m[2].content, "");
        assert_eq!(m[2].reasoning.as_deref(), Some("think"));
        let call = &m[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!((call.id.as_deref(), call.name.as_str()), (Some("c1"), "f"));
        // Parsed into a mapping that keeps the client's key order.
        assert_eq!(call.arguments.to_string(), r#"{"z": 1, "a": [2.5]}"#);
        assert_eq!(m[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(m[4].reasoning.as_deref(), Some("r2"));
        assert!(prepared.tools_offered);
        assert!(prepared.prompt.add_generation_prompt);
        assert!(!prepared.prompt.continue_final_message);
    }

    #[test]
    fn what_cannot_be_honoured_is_a_400_naming_it() {
        let hi = r#"[{"role": "user", "content": "hi"}]"#;
        let tools = r#"[{"type": "function", "function": {"name": "f"}}]"#;
        let cases = [
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}"#.to_owned(),
                "messages[0].content[0].type",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x", "audio": {"id": "a"}}]}"#.to_owned(),
                "messages[0].audio",
            ),
            (
                r#"{"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}"#.to_owned(),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                r#"{"messages": [{"role": "assistant", "tool_calls": [{"type": "custom", "function": {"name": "f", "arguments": "{}"}}]}]}"#.to_owned(),
                "messages[0].tool_calls[0].type",
            ),
            (r#"{"messages": [{"role": "tool", "tool_call_id": "c"}]}"#.to_owned(), "messages[0].content"),
            (format!(r#"{{"messages": {hi}, "tool_choice": "required"}}"#), "tool_choice"),
            (
                format!(r#"{{"messages": {hi}, "tools": {tools}, "tool_choice": {{"type": "function", "function": {{"name": "nope"}}}}}}"#),
                "tool_choice.function.name",
            ),
            (format!(r#"{{"messages": {hi}, "tool_choice": 3}}"#), "tool_choice"),
            (format!(r#"{{"messages": {hi}, "reasoning_effort": "minimal"}}"#), "reasoning_effort"),
            (format!(r#"{{"messages": {hi}, "tools": [{{"type": "web_search"}}]}}"#), "tools[0].type"),
            (format!(r#"{{"messages": {hi}, "tools": [{{"type": "function"}}]}}"#), "tools[0].function.name"),
            (format!(r#"{{"messages": {hi}, "documents": ["text"]}}"#), "documents"),
            (
                format!(r#"{{"messages": {hi}, "continue_final_message": true, "add_generation_prompt": true}}"#),
                "continue_final_message",
            ),
        ];
        for (body, want) in cases {
            let error = prepare_json(&body)
                .err()
                .unwrap_or_else(|| panic!("accepted: {body}"));
            assert_eq!(param(&error), Some(want), "{body}: {}", error.message);
            assert_eq!(error.status, axum::http::StatusCode::BAD_REQUEST);
        }
        let error = prepare_json(
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}"#,
        )
        .err()
        .unwrap();
        assert_eq!(error.code, Some("unsupported_parameter"));
        assert!(error.message.contains("image_url"), "{}", error.message);
    }

    /// Every non-text part OpenAI's and vLLM's chat APIs take is a 400
    /// naming the part and its type, never dropped, in any message.
    #[test]
    fn media_content_parts_are_refused_by_name() {
        for kind in [
            "image_url",
            "input_image",
            "image",
            "video_url",
            "input_video",
            "video",
            "input_audio",
            "audio_url",
            "file",
            "input_file",
            "refusal",
        ] {
            let body = format!(
                r#"{{"messages": [{{"role": "system", "content": "s"}},
                    {{"role": "user", "content": [{{"type": "text", "text": "look"}},
                                                 {{"type": "{kind}", "{kind}": {{"url": "u"}}}}]}}]}}"#
            );
            let error = prepare_json(&body)
                .err()
                .unwrap_or_else(|| panic!("{kind} accepted"));
            assert_eq!(error.status, axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(param(&error), Some("messages[1].content[1].type"), "{kind}");
            assert_eq!(error.code, Some("unsupported_parameter"));
            assert!(
                error.message.contains(&format!("{kind:?}")) && error.message.contains("text only"),
                "{}",
                error.message
            );
        }
    }

    /// Chat fields of OpenAI's and vLLM's APIs this server does not
    /// implement are refused by name, never ignored.
    #[test]
    fn chat_fields_not_implemented_are_left_for_the_refusal() {
        for field in [
            "functions",
            "function_call",
            "audio",
            "modalities",
            "prediction",
            "web_search_options",
            "chat_template",
            "mm_processor_kwargs",
        ] {
            let body: ChatRequest = serde_json::from_str(&format!(
                r#"{{"messages": [{{"role": "user", "content": "hi"}}], "{field}": {{"x": 1}}}}"#
            ))
            .unwrap();
            assert_eq!(body.unsupported.first_set(), Some(field));
        }
        let body: ChatRequest = serde_json::from_str(
            r#"{"messages": [{"role": "user", "content": "hi", "thinking": "t"}]}"#,
        )
        .unwrap();
        let error = prepare(body.messages, body.template).err().unwrap();
        assert_eq!(param(&error), Some("messages[0].thinking"));
        assert_eq!(error.code, Some("unsupported_parameter"));
    }

    #[test]
    fn template_fields_become_template_variables() {
        let tools = r#"[{"type": "function", "function": {"name": "f"}}]"#;
        let prepared = prepare_json(&format!(
            r#"{{"messages": [{{"role": "user", "content": "hi"}}], "tools": {tools}, "tool_choice": "none",
                "reasoning_effort": "low", "parallel_tool_calls": true,
                "chat_template_kwargs": {{"reasoning_effort": "high", "enable_thinking": false}}}}"#
        ))
        .unwrap();
        assert!(!prepared.tools_offered);
        assert!(prepared.prompt.tools.is_none());
        assert_eq!(
            prepared.prompt.kwargs,
            [
                ("enable_thinking".to_owned(), Value::from(false)),
                ("reasoning_effort".to_owned(), Value::from("high"))
            ]
        );

        let prepared = prepare_json(
            r#"{"messages": [{"role": "assistant", "content": "The"}], "continue_final_message": true,
                "tools": [], "documents": [{"title": "t", "text": "x"}]}"#,
        )
        .unwrap();
        assert!(!prepared.tools_offered);
        assert!(prepared.prompt.continue_final_message);
        assert!(!prepared.prompt.add_generation_prompt);
        assert_eq!(prepared.prompt.documents.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn template_arguments_the_renderer_sets_are_refused() {
        let prepared = prepare_json(
            r#"{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"messages": []}}"#,
        )
        .unwrap();
        let template = crate::text::ChatTemplate::from_source(
            "{{ messages | length }}".to_owned(),
            Default::default(),
        )
        .unwrap();
        let error = render_error(template.render_prompt(&prepared.prompt).unwrap_err());
        assert_eq!(param(&error), Some("chat_template_kwargs"));
        assert!(error.message.contains("`messages`"), "{}", error.message);
    }
}
