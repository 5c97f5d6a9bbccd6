//! The `hermes` tool-call parser (Qwen3, Hermes, many others):
//! `<tool_call>{"name": "f", "arguments": {…}}</tool_call>` in the content
//! → a tool call, matched on the text like the think tags.
//!
//! A call is held back until its closing tag (or the end of the output, as
//! vLLM accepts an unclosed last call), then checked: JSON with a string
//! `name` becomes a tool-call start and its arguments (the object as the
//! model wrote it; `{}` when absent; a string argument as is); anything else
//! goes out as content, tags included, never as an error. So a stream and a
//! blocking answer agree, and a stream never sends a call it takes back.
//! Whitespace-only content next to tool calls is dropped (Qwen3 writes
//! `\n\n` before a call and `\n` between calls).

use serde::Deserialize;
use serde_json::value::RawValue;

use super::pieces::{Delta, Segment, new_call_id, push_merged};
use super::tags::{find_tag, safe_prefix_len};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(Debug)]
pub struct HermesParser {
    in_call: bool,
    /// Outside a call: text that may still become `<tool_call>`; inside:
    /// the call's body so far.
    held: String,
    /// Whitespace-only content not yet sent: dropped if a call follows (or
    /// if calls were made), sent with the next other content.
    pending_space: String,
    calls: usize,
}

impl Default for HermesParser {
    fn default() -> Self {
        HermesParser::new()
    }
}

impl HermesParser {
    pub fn new() -> HermesParser {
        HermesParser {
            in_call: false,
            held: String::new(),
            pending_space: String::new(),
            calls: 0,
        }
    }

    pub(crate) fn push(&mut self, segment: Segment<'_>, out: &mut Vec<Delta>) {
        match segment {
            Segment::Text(text) => {
                self.held.push_str(text);
                self.scan(out);
            }
            Segment::Hidden(tag) => match (self.in_call, tag) {
                (false, OPEN) => {
                    let before = std::mem::take(&mut self.held);
                    self.content(out, before);
                    self.open_call();
                }
                (true, CLOSE) => self.close_call(out),
                (false, _) => {
                    let before = std::mem::take(&mut self.held);
                    self.content(out, before);
                }
                (true, _) => {}
            },
        }
    }

    fn scan(&mut self, out: &mut Vec<Delta>) {
        loop {
            if self.in_call {
                let Some((at, _)) = find_tag(&self.held, &[CLOSE]) else {
                    return;
                };
                let rest = self.held.split_off(at + CLOSE.len());
                self.held.truncate(at);
                self.close_call(out);
                self.held = rest;
            } else if let Some((at, _)) = find_tag(&self.held, &[OPEN]) {
                let rest = self.held.split_off(at + OPEN.len());
                self.held.truncate(at);
                let before = std::mem::replace(&mut self.held, rest);
                self.content(out, before);
                self.open_call();
            } else {
                let keep = safe_prefix_len(&self.held, &[OPEN]);
                let rest = self.held.split_off(keep);
                let before = std::mem::replace(&mut self.held, rest);
                self.content(out, before);
                return;
            }
        }
    }

    fn open_call(&mut self) {
        // Whitespace before a call is not content.
        self.pending_space.clear();
        self.in_call = true;
    }

    /// `held` is the body of a call that just closed (or the output ended in).
    fn close_call(&mut self, out: &mut Vec<Delta>) {
        let body = std::mem::take(&mut self.held);
        self.in_call = false;
        match parse_call(&body) {
            Some((name, arguments)) => {
                let index = self.calls;
                self.calls += 1;
                out.push(Delta::ToolCallStart {
                    index,
                    id: new_call_id(),
                    name,
                });
                out.push(Delta::ToolCallArguments {
                    index,
                    fragment: arguments,
                });
            }
            None => {
                let text = format!("{OPEN}{body}{CLOSE}");
                self.content(out, text);
            }
        }
    }

    fn content(&mut self, out: &mut Vec<Delta>, text: String) {
        if text.is_empty() {
            return;
        }
        if text.chars().all(char::is_whitespace) {
            self.pending_space.push_str(&text);
            return;
        }
        let mut all = std::mem::take(&mut self.pending_space);
        all.push_str(&text);
        push_merged(out, Delta::Content(all));
    }

    pub(crate) fn finish(&mut self, out: &mut Vec<Delta>) {
        if self.in_call {
            let body = std::mem::take(&mut self.held);
            self.in_call = false;
            match parse_call(&body) {
                Some(_) => {
                    self.held = body;
                    self.in_call = true;
                    self.close_call(out);
                }
                // An unclosed call that does not parse is content as written.
                None => self.content(out, format!("{OPEN}{body}")),
            }
        } else {
            let held = std::mem::take(&mut self.held);
            self.content(out, held);
        }
        let space = std::mem::take(&mut self.pending_space);
        if self.calls == 0 {
            push_merged(out, Delta::Content(space));
        }
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

    fn run(pieces: &[&str]) -> (ParsedMessage, Vec<Delta>) {
        let mut p = HermesParser::new();
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
