//! A Responses request into the chat template's input: `instructions` as a
//! system message, then the input items in order, as vLLM converts them —
//! a `message` item is a chat message (its text parts joined with `"\n"`),
//! `function_call` items become the tool calls of an assistant turn,
//! `function_call_output` a `tool` message, and a `reasoning` item the
//! reasoning of the assistant turn that follows it. Flat function tools
//! (`{"type": "function", "name", ...}`) become the chat form
//! (`{"type": "function", "function": {"name", ...}}`) the templates read.

use std::collections::HashMap;

use minijinja::Value;

use super::types::{InputContent, InputItem, InputPart, ResponseInput, ResponsesRequest};
use crate::server::errors::ApiError;
use crate::server::limits::RequestLimits;
use crate::server::openai::chat_prompt::{self, PreparedChat, invalid_at, refuse_unknown};
use crate::server::openai::sizes;
use crate::server::openai::types::{CommonParams, TemplateParams};
use crate::server::openai::unsupported::refuse_unknown_template_keys;
use crate::text::{ChatMessage, ToolCall};

/// What the response object repeats of its request.
#[derive(Clone)]
pub struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub tools: Vec<Value>,
    pub tool_choice: serde_json::Value,
    pub parallel_tool_calls: bool,
    pub effort: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
}

/// The request's sampling fields (with `max_output_tokens` as
/// `max_tokens`), the template's input, and what the answer repeats.
pub fn prepare(
    request: ResponsesRequest,
    limits: &RequestLimits,
) -> Result<(CommonParams, PreparedChat, Echo), ApiError> {
    if request.previous_response_id.is_some() {
        return Err(ApiError::invalid(
            "previous_response_id is not supported: this server keeps no responses; send the \
             whole conversation as `input` items",
            Some("previous_response_id"),
        ));
    }
    if request.store == Some(true) {
        return Err(ApiError::invalid(
            "store = true is not supported: this server keeps no responses",
            Some("store"),
        ));
    }
    if let Some(first) = request.include.as_ref().and_then(|v| v.first()) {
        return Err(ApiError::invalid(
            format!(
                "include = [\"{first}\", ...] is not supported: this server includes nothing extra"
            ),
            Some("include"),
        ));
    }
    if let Some(mode) = request.truncation.as_deref()
        && mode != "disabled"
    {
        return Err(ApiError::invalid(
            format!(
                "truncation = \"{mode}\" is not supported: only \"disabled\" (an input over the context is refused, never cut)"
            ),
            Some("truncation"),
        ));
    }
    if let Some(text) = &request.text
        && *text != serde_json::json!({"format": {"type": "text"}})
    {
        return Err(ApiError::invalid(
            "only text = {\"format\": {\"type\": \"text\"}} is supported on /v1/responses",
            Some("text"),
        ));
    }
    let effort = match request.reasoning {
        None => None,
        Some(reasoning) => {
            refuse_unknown(&reasoning.unsupported, || "reasoning".to_owned())?;
            reasoning.effort
        }
    };
    let mut common = request.common;
    if let Some(n) = request.max_output_tokens {
        if common.max_tokens.is_some() || common.max_completion_tokens.is_some() {
            return Err(ApiError::invalid(
                "give max_output_tokens only (max_tokens is the chat routes' name)",
                Some("max_output_tokens"),
            ));
        }
        common.max_tokens = Some(n);
    }
    let tools = request.tools.unwrap_or_default();
    let chat_tools = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| chat_tool(i, tool))
        .collect::<Result<Vec<_>, _>>()?;
    let echo = Echo {
        instructions: request.instructions.clone(),
        max_output_tokens: request.max_output_tokens,
        tools,
        tool_choice: request
            .tool_choice
            .clone()
            .unwrap_or_else(|| serde_json::Value::from("auto")),
        parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
        effort: effort.clone(),
        temperature: common.temperature,
        top_p: common.top_p,
    };
    let params = TemplateParams {
        tools: Some(chat_tools),
        tool_choice: request.tool_choice,
        parallel_tool_calls: request.parallel_tool_calls,
        reasoning_effort: effort,
        ..TemplateParams::default()
    };
    limits.check_template_arguments(&sizes::template(&params))?;
    let messages = messages(request.instructions, request.input)?;
    limits.check_input_items(&sizes::input_items(&messages))?;
    let prepared = chat_prompt::with_template_params(messages, params)?;
    Ok((common, prepared, echo))
}

/// `{"type": "function", "name", "description", "parameters", "strict"}`
/// as `{"type": "function", "function": {...}}`, the keys in their order.
fn chat_tool(i: usize, tool: &Value) -> Result<Value, ApiError> {
    let kind = tool.get_attr("type").ok().filter(|v| !v.is_undefined());
    if kind.as_ref().and_then(Value::as_str) != Some("function") {
        return Err(invalid_at(
            format!("tools[{i}].type"),
            format!(
                "only function tools are supported; tools[{i}].type is {}",
                kind.map_or("missing".to_owned(), |k| k.to_string())
            ),
        ));
    }
    refuse_unknown_template_keys(tool, RESPONSES_TOOL_KEYS, &format!("tools[{i}]"))?;
    let keys: Vec<Value> = tool
        .try_iter()
        .map_err(|_| {
            invalid_at(
                format!("tools[{i}]"),
                format!("tools[{i}] must be an object"),
            )
        })?
        .collect();
    let mut function = Vec::new();
    for key in keys {
        if key.as_str() == Some("type") {
            continue;
        }
        let value = tool.get_item(&key).unwrap_or_default();
        function.push((key, value));
    }
    if !function
        .iter()
        .any(|(k, v)| k.as_str() == Some("name") && v.as_str().is_some())
    {
        return Err(invalid_at(
            format!("tools[{i}].name"),
            format!("tools[{i}] needs a string `name`"),
        ));
    }
    Ok(Value::from_iter([
        (Value::from("type"), Value::from("function")),
        (Value::from("function"), Value::from_iter(function)),
    ]))
}

/// A flat function tool's keys (OpenAI's Responses API).
const RESPONSES_TOOL_KEYS: &[&str] = &["type", "name", "description", "parameters", "strict"];

/// The chat messages of `instructions` and the input.
fn messages(
    instructions: Option<String>,
    input: ResponseInput,
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::new();
    if let Some(instructions) = instructions {
        out.push(ChatMessage::new("system", instructions));
    }
    let items = match input {
        ResponseInput::Text(text) => {
            out.push(ChatMessage::new("user", text));
            return Ok(out);
        }
        ResponseInput::Items(items) => items,
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "`input` must not be empty",
            Some("input"),
        ));
    }
    let mut reasoning: Option<String> = None;
    let mut call_names: HashMap<String, String> = HashMap::new();
    for (i, item) in items.into_iter().enumerate() {
        let at = || format!("input[{i}]");
        refuse_unknown(&item.unsupported, at)?;
        match item.kind.as_deref().unwrap_or("message") {
            "message" => {
                only(&item, &["role", "content"], at)?;
                let role = item.role.ok_or_else(|| missing(&at(), "role"))?;
                if !["user", "assistant", "system", "developer"].contains(&role.as_str()) {
                    return Err(invalid_at(
                        format!("{}.role", at()),
                        format!("{}.role must be user, assistant, system or developer", at()),
                    ));
                }
                let content = item.content.ok_or_else(|| missing(&at(), "content"))?;
                let allowed: &[&str] = if role == "assistant" {
                    &["output_text"]
                } else {
                    &["input_text"]
                };
                let mut message =
                    ChatMessage::new(role, text(content, allowed, &format!("{}.content", at()))?);
                if message.role == "assistant" {
                    message.reasoning = reasoning.take();
                }
                out.push(message);
            }
            "function_call" => {
                only(&item, &["call_id", "name", "arguments"], at)?;
                let call_id = item.call_id.ok_or_else(|| missing(&at(), "call_id"))?;
                let name = item.name.ok_or_else(|| missing(&at(), "name"))?;
                let arguments = item.arguments.ok_or_else(|| missing(&at(), "arguments"))?;
                let arguments = serde_json::from_str::<Value>(&arguments).map_err(|e| {
                    invalid_at(
                        format!("{}.arguments", at()),
                        format!("{}.arguments is not valid JSON: {e}", at()),
                    )
                })?;
                call_names.insert(call_id.clone(), name.clone());
                let call = ToolCall {
                    id: Some(call_id),
                    name,
                    arguments,
                };
                // Calls right after an assistant message (or each other)
                // belong to that turn.
                match out.last_mut() {
                    Some(last) if last.role == "assistant" && reasoning.is_none() => {
                        last.tool_calls.get_or_insert_default().push(call);
                    }
                    _ => out.push(ChatMessage {
                        role: "assistant".to_owned(),
                        reasoning: reasoning.take(),
                        tool_calls: Some(vec![call]),
                        ..ChatMessage::default()
                    }),
                }
            }
            "function_call_output" => {
                only(&item, &["call_id", "output"], at)?;
                let call_id = item.call_id.ok_or_else(|| missing(&at(), "call_id"))?;
                let output = item.output.ok_or_else(|| missing(&at(), "output"))?;
                out.push(ChatMessage {
                    role: "tool".to_owned(),
                    content: text(
                        output,
                        &["input_text", "output_text"],
                        &format!("{}.output", at()),
                    )?,
                    name: call_names.get(&call_id).cloned(),
                    tool_call_id: Some(call_id),
                    ..ChatMessage::default()
                });
            }
            "reasoning" => {
                only(&item, &["content", "summary"], at)?;
                let mut parts = Vec::new();
                if let Some(content) = item.content {
                    parts.push(text(
                        content,
                        &["reasoning_text"],
                        &format!("{}.content", at()),
                    )?);
                } else if let Some(summary) = item.summary {
                    parts.push(text(
                        InputContent::Parts(summary),
                        &["summary_text"],
                        &format!("{}.summary", at()),
                    )?);
                }
                let joined = reasoning
                    .take()
                    .into_iter()
                    .chain(parts)
                    .collect::<Vec<_>>();
                reasoning = Some(joined.join("\n"));
            }
            other => {
                return Err(ApiError::unsupported_parameter(
                    &format!("{}.type", at()),
                    &format!(
                        "= {other:?}: input items are message, function_call, \
                         function_call_output and reasoning"
                    ),
                ));
            }
        }
    }
    // Reasoning no assistant turn followed: a turn of its own.
    if let Some(reasoning) = reasoning {
        out.push(ChatMessage {
            role: "assistant".to_owned(),
            reasoning: Some(reasoning),
            ..ChatMessage::default()
        });
    }
    Ok(out)
}

/// The text of a content field (at path `field`): a string, or parts of the
/// `allowed` types joined with `"\n"`.
fn text(content: InputContent, allowed: &[&str], field: &str) -> Result<String, ApiError> {
    let parts: Vec<InputPart> = match content {
        InputContent::Text(text) => return Ok(text),
        InputContent::Parts(parts) => parts,
    };
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.into_iter().enumerate() {
        let here = format!("{field}[{j}]");
        if !allowed.contains(&part.kind.as_str()) {
            return Err(ApiError::unsupported_parameter(
                &format!("{here}.type"),
                &format!(
                    "= {:?}: this server serves text only (image, audio, video and file parts \
                     are refused); parts here must be of type {allowed:?}",
                    part.kind
                ),
            ));
        }
        refuse_unknown(&part.unsupported, || here.clone())?;
        texts.push(part.text.ok_or_else(|| missing(&here, "text"))?);
    }
    Ok(texts.join("\n"))
}

/// The fields of an item that its type does not have are refused by name.
fn only(item: &InputItem, allowed: &[&str], at: impl Fn() -> String) -> Result<(), ApiError> {
    let present = [
        ("role", item.role.is_some()),
        ("content", item.content.is_some()),
        ("call_id", item.call_id.is_some()),
        ("name", item.name.is_some()),
        ("arguments", item.arguments.is_some()),
        ("output", item.output.is_some()),
        ("summary", item.summary.is_some()),
    ];
    match present
        .iter()
        .find(|(name, set)| *set && !allowed.contains(name))
    {
        Some((name, _)) => Err(ApiError::unsupported_parameter(
            &format!("{}.{name}", at()),
            "does not belong to this item type",
        )),
        None => Ok(()),
    }
}

fn missing(at: &str, field: &str) -> ApiError {
    invalid_at(format!("{at}.{field}"), format!("{at} needs `{field}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convert(body: &str) -> Result<(CommonParams, PreparedChat, Echo), ApiError> {
        let request: ResponsesRequest = serde_json::from_str(body).unwrap();
        prepare(request, &RequestLimits::new(4096, Some(16)))
    }

    #[test]
    fn items_become_the_chat_a_template_reads() {
        let (common, prepared, echo) = convert(
            r#"{"instructions": "Be brief.", "max_output_tokens": 9, "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                 "arguments": "{\"city\": \"Paris\", \"a\": 1}", "status": "completed"},
                {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "18C.", "annotations": []}]},
                {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]}
            ], "tools": [{"type": "function", "name": "get_weather", "description": "d",
                          "parameters": {"type": "object", "properties": {}}, "strict": true}],
               "reasoning": {"effort": "low"}}"#,
        )
        .unwrap();
        assert_eq!(common.max_tokens, Some(9));
        let m = &prepared.prompt.messages;
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(
            roles,
            ["system", "user", "assistant", "tool", "assistant", "user"]
        );
        assert_eq!(m[0].content, "Be brief.");
        assert_eq!(m[2].reasoning.as_deref(), Some("Call the tool."));
        let call = &m[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.id.as_deref(), Some("call_1"));
        assert_eq!(call.arguments.to_string(), r#"{"city": "Paris", "a": 1}"#);
        assert_eq!(
            (
                m[3].tool_call_id.as_deref(),
                m[3].name.as_deref(),
                m[3].content.as_str()
            ),
            (Some("call_1"), Some("get_weather"), "18C")
        );
        assert_eq!(m[4].content, "18C.");
        let tools = prepared.prompt.tools.as_ref().unwrap();
        assert_eq!(
            serde_json::to_string(&tools[0]).unwrap(),
            r#"{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object","properties":{}},"strict":true}}"#
        );
        assert!(prepared.tools_offered);
        assert_eq!(
            prepared.prompt.kwargs,
            [("reasoning_effort".to_owned(), Value::from("low"))]
        );
        assert_eq!(echo.instructions.as_deref(), Some("Be brief."));
        assert_eq!(echo.tool_choice, serde_json::json!("auto"));

        let (_, prepared, _) = convert(r#"{"input": "Hello"}"#).unwrap();
        assert_eq!(
            prepared.prompt.messages,
            [ChatMessage::new("user", "Hello")]
        );
        assert!(!prepared.tools_offered);
    }

    #[test]
    fn what_cannot_be_honoured_is_a_400_naming_it() {
        let cases = [
            (
                r#"{"input": "x", "previous_response_id": "resp_1"}"#,
                "previous_response_id",
            ),
            (r#"{"input": "x", "store": true}"#, "store"),
            (
                r#"{"input": "x", "reasoning": {"summary": "auto"}}"#,
                "reasoning.summary",
            ),
            (
                r#"{"input": "x", "tools": [{"type": "web_search"}]}"#,
                "tools[0].type",
            ),
            (
                r#"{"input": "x", "tools": [{"type": "function"}]}"#,
                "tools[0].name",
            ),
            (
                r#"{"input": "x", "tool_choice": {"type": "function", "name": "g"}, "tools": [{"type": "function", "name": "f"}]}"#,
                "tool_choice.function.name",
            ),
            (
                r#"{"input": "x", "max_output_tokens": 3, "max_tokens": 3}"#,
                "max_output_tokens",
            ),
            (r#"{"input": []}"#, "input"),
            (
                r#"{"input": [{"type": "item_reference", "id": "x"}]}"#,
                "input[0].type",
            ),
            (
                r#"{"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}"#,
                "input[0].content[0].type",
            ),
            (
                r#"{"input": [{"role": "tool", "content": "x"}]}"#,
                "input[0].role",
            ),
            (
                r#"{"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}"#,
                "input[0].arguments",
            ),
            (
                r#"{"input": [{"type": "function_call_output", "output": "o"}]}"#,
                "input[0].call_id",
            ),
            (
                r#"{"input": [{"role": "user", "content": "x", "output": "o"}]}"#,
                "input[0].output",
            ),
            (
                r#"{"input": [{"type": "reasoning", "summary": [], "encrypted_content": "e"}]}"#,
                "input[0].encrypted_content",
            ),
        ];
        for (body, want) in cases {
            let error = convert(body)
                .err()
                .unwrap_or_else(|| panic!("accepted: {body}"));
            assert_eq!(
                error.param.as_deref(),
                Some(want),
                "{body}: {}",
                error.message
            );
        }
    }

    /// Image, audio, video and file parts are a 400 naming the part, in a
    /// message's content and in a function call's output alike.
    #[test]
    fn media_parts_are_refused_by_name() {
        for kind in [
            "input_image",
            "input_audio",
            "input_video",
            "input_file",
            "image_url",
            "video_url",
        ] {
            let part = format!(r#"{{"type": "{kind}", "image_url": "u"}}"#);
            for (body, want) in [
                (
                    format!(
                        r#"{{"input": [{{"role": "user", "content": [{{"type": "input_text", "text": "look"}}, {part}]}}]}}"#
                    ),
                    "input[0].content[1].type",
                ),
                (
                    format!(
                        r#"{{"input": [{{"role": "user", "content": "x"}},
                            {{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{{}}"}},
                            {{"type": "function_call_output", "call_id": "c", "output": [{part}]}}]}}"#
                    ),
                    "input[2].output[0].type",
                ),
            ] {
                let error = convert(&body)
                    .err()
                    .unwrap_or_else(|| panic!("accepted: {body}"));
                assert_eq!(error.param.as_deref(), Some(want), "{body}");
                assert_eq!(error.code, Some("unsupported_parameter"));
                assert!(
                    error.message.contains(&format!("{kind:?}"))
                        && error.message.contains("text only"),
                    "{}",
                    error.message
                );
            }
        }
    }
}
