//! `tool_choice: "required"` and a named function: the answer is held to
//! the server's tool-call format by a grammar built from the tools'
//! schemas (llguidance's Lark with `%json` bodies), as vLLM constrains it.
//! A named function is called once; `required` makes one call or more,
//! one with `parallel_tool_calls: false`. The sequence ends when the
//! grammar is complete.
//!
//! Built for the hermes format (`<tool_call>\n{"name", "arguments"}\n</tool_call>`,
//! Qwen3's), the Qwen3.5 / 3.6 XML one (`qwen3_coder`) and harmony
//! (gpt-oss, over its special tokens); without a tool-call format the
//! request is refused naming `tool_choice`, never served unconstrained.

use serde_json::{Value, json};

use crate::engine::grammar::GrammarSpec;
use crate::server::errors::ApiError;
use crate::text::parsers::{OutputParsers, TextTools};

/// Which calls the answer must make.
#[derive(Clone, Debug, PartialEq)]
pub struct ForcedTools {
    /// Each offered tool's `function` object (`name`, `parameters`).
    pub functions: Vec<Value>,
    /// A named function: only it; `None`: any offered one (`required`).
    pub name: Option<String>,
    /// `parallel_tool_calls` (default true): several calls, else one.
    pub parallel: bool,
}

/// The grammar of the answer under `forced`, in the server's format.
pub fn grammar(parsers: &OutputParsers, forced: &ForcedTools) -> Result<GrammarSpec, ApiError> {
    match parsers {
        OutputParsers::Text {
            tools: Some(TextTools::Hermes),
            ..
        } => Ok(hermes(forced)),
        OutputParsers::Text {
            tools: Some(TextTools::Qwen3Coder),
            ..
        } => Ok(qwen3_coder(forced)),
        OutputParsers::Harmony { tools: true, .. } => Ok(harmony(forced)),
        other => Err(ApiError::invalid(
            format!(
                "tool_choice \"required\" or a named function needs the server's tool-call \
                 format; this server parses no tool calls ({})",
                match other {
                    OutputParsers::Harmony { .. } => "start with --tool-call-parser openai_gptoss",
                    _ => "start with --tool-call-parser hermes",
                }
            ),
            Some("tool_choice"),
        )),
    }
}

/// The offered functions the answer may call.
fn selected(forced: &ForcedTools) -> impl Iterator<Item = &Value> + '_ {
    forced.functions.iter().filter(|f| match &forced.name {
        Some(name) => f.get("name").and_then(Value::as_str) == Some(name.as_str()),
        None => true,
    })
}

/// The Lark rule that starts the answer: one call of `call`, or several
/// separated by a newline (see [`hermes`]).
fn start_rule(forced: &ForcedTools) -> &'static str {
    if forced.parallel && forced.name.is_none() {
        "start: call (\"\\n\" call)*"
    } else {
        "start: call"
    }
}

/// A Lark string literal of `text` (JSON's escapes are Lark's).
fn literal(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_string())
}

/// The Qwen3.5 / 3.6 XML call (what their template writes and
/// `text::parsers::qwen3_coder` reads):
/// `<tool_call>\n<function=N>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>`.
/// Parameters come in the schema's order, the required ones always, the
/// others optionally; a string's value is any text without `<` (at most
/// `maxLength` characters), any other value JSON of its own schema.
fn qwen3_coder(forced: &ForcedTools) -> GrammarSpec {
    let mut rules = String::new();
    let mut calls = Vec::new();
    for (i, f) in selected(forced).enumerate() {
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        let parameters = f.get("parameters");
        let required: Vec<&str> = parameters
            .and_then(|p| p.get("required"))
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut body = String::new();
        let properties = parameters
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object);
        for (j, (key, schema)) in properties.into_iter().flatten().enumerate() {
            let value = if schema.get("type").and_then(Value::as_str) == Some("string") {
                // `maxLength` bounds it (characters), as JSON Schema's does.
                match schema.get("maxLength").and_then(Value::as_u64) {
                    Some(most) => format!("/[^<]{{0,{most}}}/"),
                    None => "/[^<]*/".to_string(),
                }
            } else {
                format!("%json {schema}")
            };
            let rule = format!("p{i}_{j}");
            rules.push_str(&format!(
                "{rule}: {} {value} {}\n",
                literal(&format!("<parameter={key}>\n")),
                literal("\n</parameter>\n")
            ));
            let optional = if required.contains(&key.as_str()) {
                ""
            } else {
                "?"
            };
            body.push_str(&format!(" {rule}{optional}"));
        }
        rules.push_str(&format!(
            "f{i}: {}{body} {}\n",
            literal(&format!("<tool_call>\n<function={name}>\n")),
            literal("</function>\n</tool_call>")
        ));
        calls.push(format!("f{i}"));
    }
    GrammarSpec::Lark(format!(
        "{}\ncall: {}\n{rules}",
        start_rule(forced),
        calls.join(" | ")
    ))
}

/// Harmony (gpt-oss), after the generation prompt's `<|start|>assistant`:
/// an optional analysis message, then one call as the model writes it,
/// `<|channel|>commentary to=functions.N <|constrain|>json<|message|>ARGS<|call|>`
/// (the form `text::parsers::harmony` reads; `<|…|>` in the grammar is the
/// special token itself, never its text). A harmony turn ends at
/// `<|call|>`, so the answer makes one call whatever `parallel_tool_calls` says.
fn harmony(forced: &ForcedTools) -> GrammarSpec {
    let calls: Vec<String> = selected(forced)
        .map(|f| {
            let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
            let parameters = f
                .get("parameters")
                .filter(|p| p.is_object())
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            // JSON as the model writes it (`", "`, `": "`), no free whitespace.
            let mut parameters = parameters;
            if let Some(object) = parameters.as_object_mut() {
                object.insert(
                    "x-guidance".into(),
                    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
                );
            }
            format!(
                "<|channel|> {} <|constrain|> \"json\" <|message|> %json {parameters} <|call|>",
                literal(&format!("commentary to=functions.{name} "))
            )
        })
        .collect();
    GrammarSpec::Lark(format!(
        "start: analysis? call\n\
         analysis: <|channel|> \"analysis\" <|message|> /(.|\\n)*/ <|end|> <|start|> \"assistant\"\n\
         call: {}\n",
        calls.join("\n    | ")
    ))
}

/// `<tool_call>\n{"name": N, "arguments": {…}}\n</tool_call>`, once or
/// several times separated by a newline (what Qwen3's template writes).
fn hermes(forced: &ForcedTools) -> GrammarSpec {
    let calls: Vec<Value> = selected(forced)
        .map(|f| {
            let parameters = f
                .get("parameters")
                .filter(|p| p.is_object())
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": f.get("name").cloned().unwrap_or(Value::Null)},
                    "arguments": parameters,
                },
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let mut schema = match calls.len() {
        1 => calls.into_iter().next().unwrap_or_default(),
        _ => json!({"anyOf": calls}),
    };
    // JSON as Qwen3's template writes a call (Python's `json.dumps`): no
    // free whitespace, `", "` and `": "` between items and after keys.
    if let Some(object) = schema.as_object_mut() {
        object.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    // A named function is called once (as vLLM, whose named choice is the
    // function's arguments alone); `required` makes one or more calls
    // unless `parallel_tool_calls` is false.
    let start = start_rule(forced);
    GrammarSpec::Lark(format!(
        "{start}\ncall: \"<tool_call>\\n\" %json {schema} \"\\n</tool_call>\"\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_function_keeps_only_its_schema_and_one_call_without_parallel() {
        let forced = ForcedTools {
            functions: vec![
                json!({"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}),
                json!({"name": "g"}),
            ],
            name: Some("f".into()),
            parallel: false,
        };
        let GrammarSpec::Lark(lark) = hermes(&forced) else {
            panic!("a Lark grammar")
        };
        assert!(lark.starts_with("start: call\n"), "{lark}");
        assert!(lark.contains(r#""const":"f""#), "{lark}");
        assert!(!lark.contains(r#""const":"g""#), "{lark}");
    }
}
