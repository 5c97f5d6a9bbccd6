//! `tool_choice: "required"` and a named function: the answer is held to
//! the server's tool-call format by a grammar built from the tools'
//! schemas (llguidance's Lark with `%json` bodies), as vLLM constrains it.
//! A named function is called once; `required` makes one call or more,
//! one with `parallel_tool_calls: false`. The sequence ends when the
//! grammar is complete.
//!
//! Under `"auto"` with a `strict: true` function the answer stays free: any
//! text without the format's call marker, optionally followed by calls,
//! each of a strict function held to its schema (a function without
//! `strict` takes any JSON object, as without a grammar).
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
    /// `"auto"` with a strict function: text, then calls or none.
    pub optional: bool,
}

impl ForcedTools {
    /// `"auto"` with these offered functions: the constraint their `strict`
    /// flags ask for, if any does.
    pub fn strict_under_auto(functions: Vec<Value>, parallel: bool) -> Option<ForcedTools> {
        functions.iter().any(is_strict).then_some(ForcedTools {
            functions,
            name: None,
            parallel,
            optional: true,
        })
    }
}

fn is_strict(function: &Value) -> bool {
    function.get("strict") == Some(&Value::Bool(true))
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
                "{} needs the server's tool-call format; this server parses no tool calls ({})",
                if forced.optional {
                    "a function with `strict: true`"
                } else {
                    "tool_choice \"required\" or a named function"
                },
                match other {
                    OutputParsers::Harmony { .. } => "start with --tool-call-parser openai_gptoss",
                    _ => "start with --tool-call-parser hermes",
                }
            ),
            Some(if forced.optional {
                "tools"
            } else {
                "tool_choice"
            }),
        )),
    }
}

/// The offered functions the answer may call, each with the schema its
/// arguments are held to (an optional call of a function that is not
/// strict: any object).
fn selected(forced: &ForcedTools) -> impl Iterator<Item = (&str, Value)> + '_ {
    forced
        .functions
        .iter()
        .filter(|f| match &forced.name {
            Some(name) => f.get("name").and_then(Value::as_str) == Some(name.as_str()),
            None => true,
        })
        .map(|f| {
            let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
            let parameters = f
                .get("parameters")
                .filter(|p| p.is_object() && (!forced.optional || is_strict(f)))
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            (name, parameters)
        })
}

/// The marker that starts a call in the `<tool_call>` formats.
const CALL_MARKER: &str = "<tool_call>";

/// The rules that start the answer, for a format whose calls are
/// `CALL_MARKER rest` (the grammar defines `rest`): one call, or several
/// separated by a newline (see [`hermes`]).
///
/// Under `"auto"` the answer is free text without the marker (`TEXT`), or
/// such text ending in the marker (`CALL_START`) and then the calls. The
/// marker is part of the text's lexeme because llguidance's lexer does not
/// backtrack: a `TEXT` lexeme followed by a `"<tool_call>"` one would be
/// ended by the `>` that no longer fits `TEXT`, one byte too late.
fn start_rules(forced: &ForcedTools) -> String {
    let more = if forced.parallel && forced.name.is_none() {
        " (\"\\n\" call)*"
    } else {
        ""
    };
    let marker = regex_text(CALL_MARKER);
    let first = if forced.optional {
        format!(
            "start: TEXT | CALL_START rest{more}\n\
             TEXT: /(?s:.*)/ & ~/(?s:.*){marker}(?s:.*)/\n\
             CALL_START: /(?s:.*){marker}/ & ~/(?s:.*){marker}(?s:.+)/\n"
        )
    } else {
        format!("start: call{more}\n")
    };
    format!("{first}call: {} rest\n", literal(CALL_MARKER))
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
    for (i, (name, parameters)) in selected(forced).enumerate() {
        let parameters = Some(&parameters);
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
            let close = "\n</parameter>\n";
            // A string and its closing tag are one lexeme: llguidance's lexer
            // does not backtrack, so a `[^<]*` lexeme of its own would take
            // the tag's leading newline and leave `<` matching nothing.
            let value = if schema.get("type").and_then(Value::as_str) == Some("string") {
                // `enum` / `const` list its values; else `maxLength` bounds
                // it (characters), as JSON Schema's does.
                let text = match (string_choices(schema), schema.get("maxLength")) {
                    (Some(choices), _) => format!("(?:{})", choices.join("|")),
                    (None, Some(most)) if most.is_u64() => format!("[^<]{{0,{most}}}"),
                    _ => "[^<]*".to_string(),
                };
                format!("/{text}{}/", regex_text(close))
            } else {
                format!("%json {schema} {}", literal(close))
            };
            let rule = format!("p{i}_{j}");
            rules.push_str(&format!(
                "{rule}: {} {value}\n",
                literal(&format!("<parameter={key}>\n")),
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
            literal(&format!("\n<function={name}>\n")),
            literal("</function>\n</tool_call>")
        ));
        calls.push(format!("f{i}"));
    }
    GrammarSpec::Lark(format!(
        "{}rest: {}\n{rules}",
        start_rules(forced),
        calls.join(" | ")
    ))
}

/// `text` matched literally inside a Lark `/…/` regex: regex syntax
/// escaped, the delimiter and newlines written as escapes.
fn regex_text(text: &str) -> String {
    regex::escape(text).replace('/', "\\/").replace('\n', "\\n")
}

/// A string schema's `enum` (every value a string) or `const`, each
/// escaped for a Lark regex; `None` when it has neither.
fn string_choices(schema: &Value) -> Option<Vec<String>> {
    if let Some(value) = schema.get("const").and_then(Value::as_str) {
        return Some(vec![regex_text(value)]);
    }
    let values = schema.get("enum")?.as_array()?;
    values
        .iter()
        .map(|v| v.as_str().map(regex_text))
        .collect::<Option<Vec<_>>>()
        .filter(|choices| !choices.is_empty())
}

/// Harmony (gpt-oss), after the generation prompt's `<|start|>assistant`:
/// an optional analysis message, then one call as the model writes it,
/// `<|channel|>commentary to=functions.N <|constrain|>json<|message|>ARGS<|call|>`
/// (the form `text::parsers::harmony` reads; `<|…|>` in the grammar is the
/// special token itself, never its text). A harmony turn ends at
/// `<|call|>`, so the answer makes one call whatever `parallel_tool_calls` says.
/// Under `"auto"` a final message (`<|channel|>final<|message|>…<|return|>`)
/// may take the call's place, and commentary preambles may precede either.
fn harmony(forced: &ForcedTools) -> GrammarSpec {
    let calls: Vec<String> = selected(forced)
        .map(|(name, parameters)| {
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
    let answer = if forced.optional {
        // A preamble (a commentary message for the user) may come before
        // the call, as gpt-oss writes them.
        "start: analysis? preamble* (call | final)\n\
         final: <|channel|> \"final\" <|message|> /(.|\\n)*/ <|return|>\n\
         preamble: <|channel|> \"commentary\" <|message|> /(.|\\n)*/ <|end|> <|start|> \"assistant\"\n"
    } else {
        "start: analysis? call\n"
    };
    GrammarSpec::Lark(format!(
        "{answer}\
         analysis: <|channel|> \"analysis\" <|message|> /(.|\\n)*/ <|end|> <|start|> \"assistant\"\n\
         call: {}\n",
        calls.join("\n    | ")
    ))
}

/// `<tool_call>\n{"name": N, "arguments": {…}}\n</tool_call>`, once or
/// several times separated by a newline (what Qwen3's template writes).
fn hermes(forced: &ForcedTools) -> GrammarSpec {
    let calls: Vec<Value> = selected(forced)
        .map(|(name, parameters)| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": name},
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
    GrammarSpec::Lark(format!(
        "{}rest: \"\\n\" %json {schema} \"\\n</tool_call>\"\n",
        start_rules(forced)
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
            optional: false,
        };
        let GrammarSpec::Lark(lark) = hermes(&forced) else {
            panic!("a Lark grammar")
        };
        assert!(
            lark.starts_with("start: call\ncall: \"<tool_call>\" rest\n"),
            "{lark}"
        );
        assert!(lark.contains(r#""const":"f""#), "{lark}");
        assert!(!lark.contains(r#""const":"g""#), "{lark}");
    }
}

#[cfg(test)]
mod walks {
    //! The grammars against real token streams: every token of an answer
    //! the format admits is allowed in turn (llguidance's lexer does not
    //! backtrack, so where one lexeme ends matters), and a wrong one is not.
    use super::*;
    use std::path::{Path, PathBuf};

    use crate::checkpoint::scripted::{Family, Script, write_scripted};
    use crate::engine::grammar::GrammarCompiler;
    use crate::text::Tokenizer;

    /// Whether `pieces`, each encoded on its own by the tokenizer in `dir`,
    /// pass the grammar token by token.
    fn admits_in(dir: &Path, spec: &GrammarSpec, pieces: &[&str]) -> bool {
        let tokenizer = Tokenizer::from_dir(dir).unwrap();
        let eos = tokenizer.eos_token_ids().to_vec();
        let compiler = GrammarCompiler::new(&tokenizer, &eos).unwrap();
        let mut constraint = compiler.compile(spec).unwrap();
        for piece in pieces {
            for token in tokenizer.encode(piece, false).unwrap() {
                let mask = constraint.mask().unwrap();
                let allowed = mask
                    .get(token as usize / 32)
                    .is_some_and(|w| w >> (token % 32) & 1 == 1);
                if !allowed || constraint.consume(token).is_err() {
                    return false;
                }
            }
        }
        true
    }

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
    }

    fn admits(spec: &GrammarSpec, pieces: &[&str]) -> bool {
        admits_in(&fixtures().join("qwen3-moe-tiny"), spec, pieces)
    }

    /// A tokenizer with harmony's special tokens: a scripted gpt-oss
    /// checkpoint's.
    fn harmony_tokenizer() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let template = std::fs::read_to_string(fixtures().join("templates/gptoss.jinja")).unwrap();
        let script = Script {
            family: Family::GptOss,
            chat_template_file: "gptoss.jinja".into(),
            output: vec!["Hi".into(), "<|return|>".into()],
            after: None,
        };
        write_scripted(&script, &template, dir.path()).unwrap();
        dir
    }

    fn weather(strict: bool, optional: bool) -> ForcedTools {
        ForcedTools {
            functions: vec![
                json!({"name": "get_weather", "strict": strict, "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 2}},
                "required": ["city", "days"]}}),
            ],
            name: None,
            parallel: true,
            optional,
        }
    }

    #[test]
    fn xml_values_end_where_the_closing_tag_starts() {
        let spec = qwen3_coder(&weather(true, false));
        let call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";
        assert!(admits(&spec, &[call]));
        assert!(admits(
            &spec,
            &[
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York",
                "\n</para",
                "meter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
            ]
        ));
        assert!(!admits(&spec, &[&call.replace(">\n2\n<", ">\n3\n<")]));
    }

    #[test]
    fn xml_string_enums_hold_their_values() {
        let mut forced = weather(true, false);
        forced.functions[0]["parameters"]["properties"]["city"] =
            json!({"type": "string", "enum": ["Rome", "San José/Costa Rica"]});
        let spec = qwen3_coder(&forced);
        let call = |city: &str| {
            format!(
                "<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
            )
        };
        assert!(admits(&spec, &[&call("Rome")]));
        assert!(admits(&spec, &[&call("San José/Costa Rica")]));
        assert!(!admits(&spec, &[&call("Oslo")]));
        assert!(!admits(&spec, &[&call("Romeo")]));
    }

    #[test]
    fn under_auto_text_then_a_call() {
        let spec = qwen3_coder(&weather(true, true));
        assert!(admits(&spec, &["Sure, let me look.\n\n"]));
        let call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n1\n</parameter>\n</function>\n</tool_call>";
        assert!(admits(&spec, &["Sure.\n\n", call]));
        assert!(!admits(
            &spec,
            &["Sure.\n\n", &call.replace(">\n1\n<", ">\n3\n<")]
        ));
        let hermes = hermes(&weather(true, true));
        assert!(admits(
            &hermes,
            &[
                "Sure.\n\n",
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"days\": 1}}\n</tool_call>"
            ]
        ));
        assert!(!admits(
            &hermes,
            &[
                "Sure.\n\n",
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"days\": 3}}\n</tool_call>"
            ]
        ));
    }

    #[test]
    fn harmony_under_auto_takes_a_final_message_or_a_held_call() {
        let spec = harmony(&weather(true, true));
        let tokenizer = harmony_tokenizer();
        let admits = |pieces: &[&str]| admits_in(tokenizer.path(), &spec, pieces);
        let think = "<|channel|>analysis<|message|>Let me see.<|end|><|start|>assistant";
        assert!(admits(&[
            think,
            "<|channel|>final<|message|>It is sunny.<|return|>"
        ]));
        let call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Rome\", \"days\": 2}<|call|>";
        assert!(admits(&[think, call]));
        let preamble =
            "<|channel|>commentary<|message|>Checking the forecast.<|end|><|start|>assistant";
        assert!(admits(&[think, preamble, call]));
        assert!(!admits(&[think, &call.replace(": 2}", ": 3}")]));
        let forced = harmony(&weather(true, false));
        assert!(!admits_in(
            tokenizer.path(),
            &forced,
            &["<|channel|>final<|message|>Hi<|return|>"]
        ));
    }
}
