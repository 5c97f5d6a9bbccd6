//! The `qwen3_coder` tool-call parser (Qwen3-Coder, Qwen3.5, Qwen3.6): XML
//! bodies in the `<tool_call>` frame ([`super::calls`]), as vLLM's parser of
//! that name reads them:
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//! A body is a call once `<function=NAME>` is complete (after whitespace);
//! anything else before that (JSON, a bad name) makes it content, tags
//! included. The call's start (id, name) goes out then, and each parameter
//! as soon as its `</parameter>` arrives, as a piece of the arguments'
//! JSON object: `{"city": "Paris"`, then `, "days": 3`, then `}` at
//! `</function>` (or `</tool_call>`, or the end of the output, which also
//! end a value whose `</parameter>` never came). A value loses one leading
//! and one trailing newline (the template writes them), and is converted by
//! the type its tool declares ([`json_value`]). Text between parameters
//! and after `</function>` is not part of anything and is dropped; a
//! parameter named twice keeps its first value (the pieces already went
//! out), and an unfinished parameter name at the end is dropped.
//!
//! Unlike vLLM, a `<function=…>` without `<tool_call>` around it is
//! content, and a boolean that is neither `true` nor `false` stays a string
//! (vLLM makes it `false`); values that are Python literals rather than JSON
//! (`{'a': 1}`) stay strings.

use std::sync::Arc;

use serde_json::value::RawValue;

use super::calls::{CallBody, TaggedCalls, Verdict};
use super::pieces::{Delta, new_call_id, push_merged};
use super::tags::{find_tag, safe_prefix_len};
use super::tool_schema::{ParamType, ToolSchemas, ValueKind};

const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";
/// Longest function or parameter name waited for: past it, `<function=` is
/// not a call and `<parameter=` not a parameter (nothing is held forever).
const MAX_NAME_BYTES: usize = 256;

/// The qwen3_coder tool-call parser of one answer.
pub(crate) type Qwen3CoderParser = TaggedCalls<XmlBody>;

#[derive(Debug)]
enum State {
    /// Before `<function=NAME>` is complete: not yet a call.
    Header,
    /// In the function, between parameters.
    Between,
    /// After `<parameter=`, before its `>`.
    ParamName,
    /// In the value of parameter `name`.
    Value { name: String },
    /// After `</function>`.
    Done,
}

/// One call's XML, read as it streams.
#[derive(Debug)]
pub(crate) struct XmlBody {
    schemas: Arc<ToolSchemas>,
    index: usize,
    state: State,
    /// Text not yet read (a possible tag, a name, a value).
    held: String,
    function: String,
    /// The parameters sent, in order.
    written: Vec<String>,
}

impl CallBody for XmlBody {
    type Context = Arc<ToolSchemas>;

    fn open(schemas: &Arc<ToolSchemas>, index: usize) -> XmlBody {
        XmlBody {
            schemas: Arc::clone(schemas),
            index,
            state: State::Header,
            held: String::new(),
            function: String::new(),
            written: Vec::new(),
        }
    }

    fn push(&mut self, text: &str, out: &mut Vec<Delta>) -> Verdict {
        self.held.push_str(text);
        loop {
            match &self.state {
                State::Header => match header(&self.held) {
                    Header::Wait => return Verdict::Undecided,
                    Header::NotACall => return Verdict::NotACall,
                    Header::Function { name, rest } => {
                        let name = name.to_owned();
                        self.held = self.held[rest..].to_owned();
                        out.push(Delta::ToolCallStart {
                            index: self.index,
                            id: new_call_id(),
                            name: name.clone(),
                        });
                        self.function = name;
                        self.state = State::Between;
                    }
                },
                State::Between => match find_tag(&self.held, &[PARAMETER, FUNCTION_END]) {
                    Some((at, PARAMETER)) => {
                        self.held.drain(..at + PARAMETER.len());
                        self.state = State::ParamName;
                    }
                    Some((_, _)) => {
                        self.close(out);
                        self.held.clear();
                        self.state = State::Done;
                    }
                    None => {
                        let keep = safe_prefix_len(&self.held, &[PARAMETER, FUNCTION_END]);
                        self.held.drain(..keep);
                        return Verdict::Call;
                    }
                },
                State::ParamName => match name_end(&self.held) {
                    NameEnd::Wait => return Verdict::Call,
                    // Not a parameter: what follows is read between
                    // parameters again.
                    NameEnd::Broken => self.state = State::Between,
                    NameEnd::At(at) => {
                        let name = self.held[..at].to_owned();
                        self.held.drain(..=at);
                        self.state = State::Value { name };
                    }
                },
                State::Value { name } => {
                    let Some((at, _)) = find_tag(&self.held, &[PARAMETER_END]) else {
                        return Verdict::Call;
                    };
                    let name = name.clone();
                    let value = self.held[..at].to_owned();
                    self.held.drain(..at + PARAMETER_END.len());
                    self.parameter(&name, &value, out);
                    self.state = State::Between;
                }
                State::Done => {
                    self.held.clear();
                    return Verdict::Call;
                }
            }
        }
    }

    fn end(&mut self, _closed: bool, out: &mut Vec<Delta>) -> Verdict {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Header => return Verdict::NotACall,
            State::Between | State::ParamName => self.close(out),
            State::Value { name } => {
                // `</parameter>` never came: the value runs to
                // `</function>`, or to the end.
                let held = std::mem::take(&mut self.held);
                let value = held
                    .find(FUNCTION_END)
                    .map_or(held.as_str(), |at| &held[..at]);
                self.parameter(&name, value, out);
                self.close(out);
            }
            State::Done => {}
        }
        self.held.clear();
        Verdict::Call
    }
}

impl XmlBody {
    fn parameter(&mut self, name: &str, value: &str, out: &mut Vec<Delta>) {
        if self.written.iter().any(|w| w == name) {
            return;
        }
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let ty = self.schemas.param(&self.function, name);
        let separator = if self.written.is_empty() { "{" } else { ", " };
        let fragment = format!(
            "{separator}{}: {}",
            json_string(name),
            json_value(value, ty)
        );
        self.written.push(name.to_owned());
        push_merged(
            out,
            Delta::ToolCallArguments {
                index: self.index,
                fragment,
            },
        );
    }

    fn close(&mut self, out: &mut Vec<Delta>) {
        let fragment = if self.written.is_empty() { "{}" } else { "}" };
        push_merged(
            out,
            Delta::ToolCallArguments {
                index: self.index,
                fragment: fragment.to_owned(),
            },
        );
    }
}

enum Header<'a> {
    Wait,
    NotACall,
    /// The function's name, and where the text after `>` starts.
    Function {
        name: &'a str,
        rest: usize,
    },
}

/// Reads `<function=NAME>` after whitespace at the start of a body.
fn header(held: &str) -> Header<'_> {
    let start = held.len() - held.trim_start().len();
    let text = &held[start..];
    let Some(after) = text.strip_prefix(FUNCTION) else {
        return if FUNCTION.starts_with(text) {
            Header::Wait
        } else {
            Header::NotACall
        };
    };
    match name_end(after) {
        NameEnd::Wait => Header::Wait,
        NameEnd::Broken => Header::NotACall,
        NameEnd::At(0) => Header::NotACall,
        NameEnd::At(at) => Header::Function {
            name: &after[..at],
            rest: start + FUNCTION.len() + at + 1,
        },
    }
}

enum NameEnd {
    Wait,
    /// Whitespace or `<` before `>`, or too long: not a name.
    Broken,
    /// The `>` that ends the name is at this byte.
    At(usize),
}

fn name_end(text: &str) -> NameEnd {
    for (i, c) in text.char_indices() {
        if i > MAX_NAME_BYTES {
            return NameEnd::Broken;
        }
        match c {
            '>' => return NameEnd::At(i),
            '<' => return NameEnd::Broken,
            c if c.is_whitespace() => return NameEnd::Broken,
            _ => {}
        }
    }
    if text.len() > MAX_NAME_BYTES {
        NameEnd::Broken
    } else {
        NameEnd::Wait
    }
}

fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// A parameter's text as a JSON value, by its declared type (vLLM's
/// conversion): undeclared and string parameters are strings; `null` (or
/// Python's `None`) is null where the type is not a string or admits null;
/// integers, numbers (an integral one written as an integer) and booleans
/// are parsed; objects, arrays and other types are the JSON as written when
/// it is JSON. Text that does not parse as its type stays a string.
pub fn json_value(text: &str, ty: Option<ParamType>) -> String {
    let Some(ty) = ty else {
        return json_string(text);
    };
    let trimmed = text.trim();
    let is_null = trimmed.eq_ignore_ascii_case("null") || trimmed.eq_ignore_ascii_case("none");
    if is_null && (ty.nullable || ty.kind != ValueKind::String) {
        return "null".to_owned();
    }
    let parsed = match ty.kind {
        ValueKind::String => None,
        ValueKind::Integer => trimmed
            .parse::<i64>()
            .map(|n| n.to_string())
            .or_else(|_| trimmed.parse::<u64>().map(|n| n.to_string()))
            .ok(),
        ValueKind::Number => trimmed.parse::<f64>().ok().and_then(number),
        ValueKind::Boolean => match trimmed.to_ascii_lowercase().as_str() {
            "true" => Some("true".to_owned()),
            "false" => Some("false".to_owned()),
            _ => None,
        },
        ValueKind::Json => serde_json::from_str::<&RawValue>(trimmed)
            .ok()
            .map(|raw| raw.get().to_owned()),
    };
    parsed.unwrap_or_else(|| json_string(text))
}

/// A float as JSON: integral ones as integers (vLLM writes `5.0` as `5`),
/// infinities and NaN not at all (JSON has none).
fn number(x: f64) -> Option<String> {
    // Integers this large are not exact in f64 anyway.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if !x.is_finite() {
        return None;
    }
    if x.fract() == 0.0 && x.abs() < EXACT {
        return Some(format!("{}", x as i64));
    }
    serde_json::Number::from_f64(x).map(|n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::pieces::{ParsedMessage, Segment};
    use super::*;

    fn schemas() -> Arc<ToolSchemas> {
        let tools = [minijinja::Value::from_serialize(serde_json::json!(
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {
                    "city": {"type": "string"}, "days": {"type": "integer"},
                    "metric": {"type": "boolean"}, "hours": {"type": "array"}}}}}
        ))];
        Arc::new(ToolSchemas::from_tools(&tools))
    }

    /// The message, and the deltas of each push (as a stream sends them).
    fn run(pieces: &[&str]) -> (ParsedMessage, Vec<Delta>) {
        let mut p = Qwen3CoderParser::new(schemas());
        let mut all = Vec::new();
        for piece in pieces {
            let mut out = Vec::new();
            p.push(Segment::Text(piece), &mut out);
            all.extend(out);
        }
        let mut out = Vec::new();
        p.finish(&mut out);
        all.extend(out);
        let mut m = ParsedMessage::default();
        m.apply_all(all.clone());
        (m, all)
    }

    /// Every character its own token.
    fn by_char(text: &str) -> (ParsedMessage, Vec<Delta>) {
        let pieces: Vec<String> = text.chars().map(String::from).collect();
        run(&pieces.iter().map(String::as_str).collect::<Vec<_>>())
    }

    const TWO_CALLS: &str = "Let me check.\n\n<tool_call>\n<function=get_weather>\n\
        <parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n\
        <parameter=hours>\n[9, 12]\n</parameter>\n</function>\n</tool_call>\n\
        <tool_call>\n<function=now>\n</function>\n</tool_call>";

    fn assert_two_calls(m: &ParsedMessage, what: &str) {
        assert_eq!(m.content.as_deref(), Some("Let me check."), "{what}");
        assert_eq!(m.tool_calls.len(), 2, "{what}");
        assert_eq!(m.tool_calls[0].name, "get_weather");
        assert_eq!(
            m.tool_calls[0].arguments, r#"{"city": "New York", "days": 3, "hours": [9, 12]}"#,
            "{what}"
        );
        assert_eq!(m.tool_calls[1].name, "now");
        assert_eq!(m.tool_calls[1].arguments, "{}");
        assert!(m.tool_calls[0].id.starts_with("call_"));
        assert_ne!(m.tool_calls[0].id, m.tool_calls[1].id);
    }

    #[test]
    fn calls_parse_the_same_whole_cut_anywhere_and_token_by_token() {
        let (m, _) = run(&[TWO_CALLS]);
        assert_two_calls(&m, "whole");
        for cut in 0..=TWO_CALLS.len() {
            let (m, _) = run(&[&TWO_CALLS[..cut], &TWO_CALLS[cut..]]);
            assert_two_calls(&m, &format!("cut {cut}"));
        }
        let (m, out) = by_char(TWO_CALLS);
        assert_two_calls(&m, "by char");
        // No piece of a tag went out as content, and each parameter went
        // out once complete: start, then the arguments piece by piece.
        for delta in &out {
            if let Delta::Content(text) = delta {
                assert!(!text.contains('<') && !text.contains('>'), "{text:?}");
            }
        }
        let calls: Vec<&Delta> = out
            .iter()
            .filter(|d| !matches!(d, Delta::Content(_)))
            .collect();
        assert!(
            matches!(calls[0], Delta::ToolCallStart { index: 0, name, .. } if name == "get_weather")
        );
        let fragments: Vec<&str> = calls[1..5]
            .iter()
            .map(|d| match d {
                Delta::ToolCallArguments { index: 0, fragment } => fragment.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            fragments,
            [
                r#"{"city": "New York""#,
                r#", "days": 3"#,
                r#", "hours": [9, 12]"#,
                "}"
            ]
        );
        assert!(matches!(calls[5], Delta::ToolCallStart { index: 1, .. }));
    }

    #[test]
    fn multiline_values_keep_all_but_one_newline_at_each_end() {
        let text = "<tool_call>\n<function=write>\n<parameter=code>\n\ndef f():\n    return \"</param\"\n\n\
                    </parameter>\n</function>\n</tool_call>";
        for (m, _) in [run(&[text]), by_char(text)] {
            assert_eq!(m.content, None);
            assert_eq!(
                m.tool_calls[0].arguments,
                r#"{"code": "\ndef f():\n    return \"</param\"\n"}"#
            );
        }
    }

    #[test]
    fn values_convert_by_the_declared_type() {
        let ty = |kind, nullable| Some(ParamType { kind, nullable });
        let cases = [
            ("Paris", None, r#""Paris""#),
            ("5", None, r#""5""#),
            ("5", ty(ValueKind::String, false), r#""5""#),
            ("null", ty(ValueKind::String, false), r#""null""#),
            ("None", ty(ValueKind::String, true), "null"),
            (" 42 ", ty(ValueKind::Integer, false), "42"),
            ("-7", ty(ValueKind::Integer, false), "-7"),
            ("4.5", ty(ValueKind::Integer, false), r#""4.5""#),
            ("null", ty(ValueKind::Integer, false), "null"),
            ("2.50", ty(ValueKind::Number, false), "2.5"),
            ("3.0", ty(ValueKind::Number, false), "3"),
            ("1e3", ty(ValueKind::Number, false), "1000"),
            ("inf", ty(ValueKind::Number, false), r#""inf""#),
            ("abc", ty(ValueKind::Number, false), r#""abc""#),
            ("True", ty(ValueKind::Boolean, false), "true"),
            ("false", ty(ValueKind::Boolean, false), "false"),
            ("yes", ty(ValueKind::Boolean, false), r#""yes""#),
            (
                r#"{"a": [1, "x"]}"#,
                ty(ValueKind::Json, false),
                r#"{"a": [1, "x"]}"#,
            ),
            ("[1,2]", ty(ValueKind::Json, false), "[1,2]"),
            ("{'a': 1}", ty(ValueKind::Json, false), r#""{'a': 1}""#),
            ("line \"1\"\n\tend", None, r#""line \"1\"\n\tend""#),
            ("héllo", None, r#""héllo""#),
        ];
        for (text, ty, want) in cases {
            assert_eq!(json_value(text, ty), want, "{text:?} as {ty:?}");
        }
        // Through a call: the declared types of the request's tool.
        let (m, _) = run(&[
            "<tool_call>\n<function=get_weather>\n<parameter=metric>\nTRUE\n\
                            </parameter>\n<parameter=days>\nseveral\n</parameter>\n\
                            <parameter=extra>\n7\n</parameter>\n</function>\n</tool_call>",
        ]);
        assert_eq!(
            m.tool_calls[0].arguments,
            r#"{"metric": true, "days": "several", "extra": "7"}"#
        );
        let args: serde_json::Value = serde_json::from_str(&m.tool_calls[0].arguments).unwrap();
        assert_eq!(args["metric"], true);
    }

    #[test]
    fn what_is_not_a_call_is_content_as_written() {
        for text in [
            // Hermes JSON in the XML format's frame.
            "Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n<function=bad name>\n</function>\n</tool_call> after",
            "<tool_call><function=>x</function></tool_call>",
        ] {
            for (m, out) in [run(&[text]), by_char(text)] {
                assert_eq!(m.content.as_deref(), Some(text), "{out:?}");
                assert!(m.tool_calls.is_empty());
            }
        }
        // Unclosed before the function's name: content, no closing tag.
        let (m, _) = by_char("<tool_call>\n<functi");
        assert_eq!(m.content.as_deref(), Some("<tool_call>\n<functi"));
        // A name that never ends is not waited for.
        let long = format!("<tool_call><function={}", "x".repeat(400));
        let (m, _) = run(&[&long, "> more"]);
        assert_eq!(m.content, Some(format!("{long}> more")));
        // Text after a false start is read again: a real call follows.
        let (m, _) =
            by_char("<tool_call>oops</tool_call><tool_call><function=f></function></tool_call>");
        assert_eq!(m.content.as_deref(), Some("<tool_call>oops</tool_call>"));
        assert_eq!(m.tool_calls.len(), 1);
    }

    #[test]
    fn unfinished_calls_end_with_the_output() {
        // `</parameter>` and the closing tags never came.
        let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n";
        for (m, _) in [run(&[text]), by_char(text)] {
            assert_eq!(m.tool_calls[0].arguments, r#"{"city": "Paris"}"#);
        }
        let (m, _) = by_char("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome");
        assert_eq!(m.tool_calls[0].arguments, r#"{"city": "Rome"}"#);
        // Cut inside a parameter's name: the call without it.
        let (m, _) = by_char("<tool_call>\n<function=get_weather>\n<parameter=ci");
        assert_eq!(m.tool_calls[0].arguments, "{}");
        // A parameter named twice keeps its first value.
        let (m, _) = run(&["<tool_call><function=f><parameter=a>1</parameter>\
                            <parameter=a>2</parameter></function></tool_call>"]);
        assert_eq!(m.tool_calls[0].arguments, r#"{"a": "1"}"#);
    }
}
