//! The `hermes` tool-call parser (Qwen3, Hermes, many others):
//! `<tool_call>{"name": "f", "arguments": {…}}</tool_call>` in the content
//! → a tool call, matched on the text like the think tags.
//!
//! The tags, the whitespace around calls and what is not a call are the
//! shared frame's ([`super::calls`]). A call is held back until its closing
//! tag (or the end of the output, as vLLM accepts an unclosed last call),
//! then checked: JSON with a string `name` becomes a tool-call start and
//! its arguments (the object as the model wrote it; `{}` when absent; a
//! string argument as is); anything else goes out as content, tags
//! included, never as an error.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::calls::{CallBody, TaggedCalls, Verdict};
use super::pieces::{Delta, new_call_id};

/// The hermes tool-call parser: JSON bodies in the `<tool_call>` frame.
pub(crate) type HermesParser = TaggedCalls<HermesBody>;

/// One call's JSON, held until it ends.
#[derive(Debug)]
pub(crate) struct HermesBody {
    index: usize,
    text: String,
}

impl CallBody for HermesBody {
    type Context = ();

    fn open(_: &(), index: usize) -> HermesBody {
        HermesBody {
            index,
            text: String::new(),
        }
    }

    fn push(&mut self, text: &str, _: &mut Vec<Delta>) -> Verdict {
        self.text.push_str(text);
        Verdict::Undecided
    }

    fn end(&mut self, _closed: bool, out: &mut Vec<Delta>) -> Verdict {
        let Some((name, arguments)) = parse_call(&self.text) else {
            return Verdict::NotACall;
        };
        out.push(Delta::ToolCallStart {
            index: self.index,
            id: new_call_id(),
            name,
        });
        out.push(Delta::ToolCallArguments {
            index: self.index,
            fragment: arguments,
        });
        Verdict::Call
    }
}

#[derive(Deserialize)]
struct CallJson<'a> {
    name: String,
    #[serde(default, alias = "parameters", borrow)]
    arguments: Option<&'a RawValue>,
}

/// The function name and the arguments as a JSON text, or `None` when the
/// body is not a call.
fn parse_call(body: &str) -> Option<(String, String)> {
    let call: CallJson<'_> = serde_json::from_str(body.trim()).ok()?;
    if call.name.is_empty() {
        return None;
    }
    let arguments = match call.arguments.map(RawValue::get) {
        None | Some("null") => "{}".to_owned(),
        Some(raw) if raw.starts_with('{') => raw.to_owned(),
        Some(raw) if raw.starts_with('"') => serde_json::from_str::<String>(raw).ok()?,
        Some(_) => return None,
    };
    Some((call.name, arguments))
}

#[cfg(test)]
mod tests {
    use super::super::pieces::ParsedMessage;
    use super::*;

    use super::super::pieces::Segment;

    fn run(pieces: &[&str]) -> (ParsedMessage, Vec<Delta>) {
        let mut p = HermesParser::new(());
        let mut out = Vec::new();
        for piece in pieces {
            p.push(Segment::Text(piece), &mut out);
        }
        p.finish(&mut out);
        let mut m = ParsedMessage::default();
        m.apply_all(out.clone());
        (m, out)
    }

    #[test]
    fn calls_split_anywhere_parse_the_same() {
        let text = "\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        for cut in 0..=text.len() {
            let (m, out) = run(&[&text[..cut], &text[cut..]]);
            assert_eq!(m.content, None, "cut {cut}: {out:?}");
            assert_eq!(m.tool_calls.len(), 2);
            assert_eq!(m.tool_calls[0].name, "get_weather");
            assert_eq!(m.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
            assert_eq!(m.tool_calls[1].arguments, "{}");
            assert!(m.tool_calls[0].id.starts_with("call_"));
            assert_ne!(m.tool_calls[0].id, m.tool_calls[1].id);
        }
    }

    #[test]
    fn invalid_json_is_content_with_its_tags() {
        let (m, _) = run(&["Sure. <tool_call>{\"name\": oops}</tool_call>"]);
        assert_eq!(
            m.content.as_deref(),
            Some("Sure. <tool_call>{\"name\": oops}</tool_call>")
        );
        assert!(m.tool_calls.is_empty());
        // Unclosed and invalid: content as written.
        let (m, _) = run(&["<tool_call>{\"name\""]);
        assert_eq!(m.content.as_deref(), Some("<tool_call>{\"name\""));
        // Unclosed but complete JSON: a call, as vLLM accepts it.
        let (m, _) = run(&["<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}"]);
        assert_eq!(m.tool_calls[0].arguments, "{\"a\": 1}");
    }

    #[test]
    fn plain_text_passes_and_keeps_whitespace() {
        let (m, _) = run(&["Hello <tool", " friend\n"]);
        assert_eq!(m.content.as_deref(), Some("Hello <tool friend\n"));
        let (m, _) = run(&["  "]);
        assert_eq!(m.content.as_deref(), Some("  "));
    }
}
