//! The `openai_gptoss` parser: gpt-oss's harmony format, read over the
//! special-token ids (with `skip_special_tokens` the client never sees
//! them, so the text alone cannot be parsed).
//!
//! An answer is a list of messages, each
//! `<|start|>assistant[ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY<|end|>`
//! (the prompt already wrote the first `<|start|>assistant`; the last
//! message ends with `<|return|>` or, for a tool call, `<|call|>`: both are
//! end-of-sequence ids in gpt-oss's generation_config.json, so the engine
//! stops there). A message's body goes to:
//! - channel `analysis` → reasoning;
//! - a recipient `functions.NAME` (in either place) → tool call `NAME`, the
//!   body its arguments, streamed as they come;
//! - channel `final`, and `commentary` without a recipient (the preambles
//!   gpt-oss writes before tool calls, which vLLM also returns as content)
//!   → content;
//! - another recipient (a built-in tool such as `browser.search`) →
//!   reasoning: it is the model's own tool use, not an answer.
//!
//! Without the reasoning parser (`--reasoning-parser none`) analysis goes
//! to content; without the tool parser, calls go to content.

use super::pieces::{Delta, TokenPiece, new_call_id, push_merged};
use crate::text::tokenizer::Tokenizer;

/// The harmony special tokens of one tokenizer.
#[derive(Clone, Debug)]
pub struct HarmonyTokens {
    start: u32,
    channel: u32,
    message: u32,
    end: u32,
    constrain: Option<u32>,
    /// `<|call|>` and `<|return|>`: they end the turn.
    call: Option<u32>,
    ret: Option<u32>,
}

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";
const CONSTRAIN: &str = "<|constrain|>";

impl HarmonyTokens {
    /// Looks the tokens up by their strings; the names of the required ones
    /// that are missing otherwise.
    pub fn look_up(tokenizer: &Tokenizer) -> Result<HarmonyTokens, Vec<&'static str>> {
        HarmonyTokens::from_lookup(|s| tokenizer.token_to_id(s))
    }

    pub fn from_lookup(
        id_of: impl Fn(&str) -> Option<u32>,
    ) -> Result<HarmonyTokens, Vec<&'static str>> {
        let required = [START, CHANNEL, MESSAGE, END];
        let missing: Vec<&'static str> = required
            .into_iter()
            .filter(|s| id_of(s).is_none())
            .collect();
        match (id_of(START), id_of(CHANNEL), id_of(MESSAGE), id_of(END)) {
            (Some(start), Some(channel), Some(message), Some(end)) => Ok(HarmonyTokens {
                start,
                channel,
                message,
                end,
                constrain: id_of(CONSTRAIN),
                call: id_of(CALL),
                ret: id_of(RETURN),
            }),
            _ => Err(missing),
        }
    }
}

/// Which part of a header text belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HeaderPart {
    Role,
    Channel,
    Constrain,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Route {
    Reasoning,
    Content,
    Call(usize),
}

#[derive(Debug)]
enum State {
    Header {
        part: HeaderPart,
        role: String,
        channel: String,
    },
    Body(Route),
}

#[derive(Debug)]
pub struct HarmonyParser {
    tokens: HarmonyTokens,
    reasoning: bool,
    tools: bool,
    state: State,
    calls: usize,
    /// A message body was opened (else header text at the end is content:
    /// the model did not speak harmony).
    any_body: bool,
}

fn fresh_header() -> State {
    State::Header {
        part: HeaderPart::Role,
        role: String::new(),
        channel: String::new(),
    }
}

impl HarmonyParser {
    pub fn new(tokens: HarmonyTokens, reasoning: bool, tools: bool) -> HarmonyParser {
        HarmonyParser {
            tokens,
            reasoning,
            tools,
            // The prompt ends with `<|start|>assistant`.
            state: fresh_header(),
            calls: 0,
            any_body: false,
        }
    }

    pub(crate) fn push(&mut self, piece: TokenPiece<'_>, out: &mut Vec<Delta>) {
        let control = self.control_name(piece.id);
        let Some(name) = control else {
            // An ordinary token; a hidden special one that is not harmony's
            // is dropped, as the client would not see it.
            self.text(piece.text, out);
            return;
        };
        // With special tokens shown, the text ends with the token itself.
        let before = piece.text.strip_suffix(name).unwrap_or(piece.text);
        self.text(before, out);
        self.control(piece.id, out);
    }

    pub(crate) fn push_text(&mut self, text: &str, out: &mut Vec<Delta>) {
        self.text(text, out);
    }

    fn control_name(&self, id: u32) -> Option<&'static str> {
        let t = &self.tokens;
        if id == t.start {
            Some(START)
        } else if id == t.channel {
            Some(CHANNEL)
        } else if id == t.message {
            Some(MESSAGE)
        } else if id == t.end {
            Some(END)
        } else if Some(id) == t.constrain {
            Some(CONSTRAIN)
        } else if Some(id) == t.call {
            Some(CALL)
        } else if Some(id) == t.ret {
            Some(RETURN)
        } else {
            None
        }
    }

    fn text(&mut self, text: &str, out: &mut Vec<Delta>) {
        if text.is_empty() {
            return;
        }
        match &mut self.state {
            State::Header {
                part,
                role,
                channel,
                ..
            } => match part {
                HeaderPart::Role => role.push_str(text),
                HeaderPart::Channel => channel.push_str(text),
                // `json` after `<|constrain|>`: only says the body is JSON.
                HeaderPart::Constrain => {}
            },
            State::Body(Route::Reasoning) => push_merged(out, Delta::Reasoning(text.to_owned())),
            State::Body(Route::Content) => push_merged(out, Delta::Content(text.to_owned())),
            State::Body(Route::Call(index)) => push_merged(
                out,
                Delta::ToolCallArguments {
                    index: *index,
                    fragment: text.to_owned(),
                },
            ),
        }
    }

    fn control(&mut self, id: u32, out: &mut Vec<Delta>) {
        let t = &self.tokens;
        if id == t.start || id == t.end || Some(id) == t.call || Some(id) == t.ret {
            self.state = fresh_header();
        } else if id == t.channel {
            if let State::Header { part, .. } = &mut self.state {
                *part = HeaderPart::Channel;
            }
        } else if Some(id) == t.constrain {
            if let State::Header { part, .. } = &mut self.state {
                *part = HeaderPart::Constrain;
            }
        } else if id == t.message {
            let route = match &self.state {
                State::Header { role, channel, .. } => Some(self.route(role, channel)),
                State::Body(_) => None,
            };
            if let Some(route) = route {
                if let Route::Call(index) = route {
                    out.push(Delta::ToolCallStart {
                        index,
                        id: new_call_id(),
                        name: recipient(&self.header_text()).map_or_else(String::new, |r| {
                            r.strip_prefix("functions.").unwrap_or(r).to_owned()
                        }),
                    });
                    self.calls += 1;
                }
                self.any_body = true;
                self.state = State::Body(route);
            }
        }
    }

    fn header_text(&self) -> String {
        match &self.state {
            State::Header { role, channel, .. } => format!("{role} {channel}"),
            State::Body(_) => String::new(),
        }
    }

    /// Where the body of a message with this header goes.
    fn route(&self, role: &str, channel: &str) -> Route {
        let header = format!("{role} {channel}");
        let channel_name = channel.split_whitespace().next().unwrap_or("");
        let reasoning = if self.reasoning {
            Route::Reasoning
        } else {
            Route::Content
        };
        match recipient(&header) {
            Some(r) if r.starts_with("functions.") => {
                if self.tools {
                    Route::Call(self.calls)
                } else {
                    Route::Content
                }
            }
            Some(_) => reasoning,
            None if channel_name == "analysis" => reasoning,
            None => Route::Content,
        }
    }

    pub(crate) fn finish(&mut self, out: &mut Vec<Delta>) {
        if let State::Header { role, channel, .. } = &self.state
            && !self.any_body
        {
            // Not harmony at all: nothing is lost.
            let text = format!("{role}{channel}");
            push_merged(out, Delta::Content(text));
        }
    }
}

/// The `to=…` of a header, if any.
fn recipient(header: &str) -> Option<&str> {
    header
        .split_whitespace()
        .find_map(|word| word.strip_prefix("to="))
        .filter(|r| !r.is_empty())
}

#[cfg(test)]
mod tests {
    use super::super::pieces::ParsedMessage;
    use super::super::{OutputParser, OutputParsers};
    use super::*;

    /// A made-up vocabulary: ids 1.. are the harmony tokens, 100 + n the
    /// text pieces.
    fn tokens() -> HarmonyTokens {
        HarmonyTokens::from_lookup(|s| match s {
            START => Some(1),
            CHANNEL => Some(2),
            MESSAGE => Some(3),
            END => Some(4),
            CALL => Some(5),
            RETURN => Some(6),
            CONSTRAIN => Some(7),
            _ => None,
        })
        .unwrap()
    }

    fn name(id: u32) -> &'static str {
        [START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN][id as usize - 1]
    }

    /// Token = a control id, or text (`Err`).
    enum T {
        C(u32),
        X(&'static str),
    }
    use T::{C, X};

    /// Feeds the sequence with special tokens hidden (the default) or shown,
    /// returns the message and the deltas.
    fn run(seq: &[T], show_special: bool) -> (ParsedMessage, Vec<Delta>) {
        let parsers = OutputParsers::Harmony {
            tokens: tokens(),
            reasoning: true,
            tools: true,
        };
        let mut p: OutputParser = parsers.start("<|start|>assistant", Some(&[]));
        let mut deltas = Vec::new();
        for t in seq {
            let d = match *t {
                C(id) if show_special => p.push(TokenPiece {
                    id,
                    text: name(id),
                    hidden: None,
                }),
                C(id) => p.push(TokenPiece {
                    id,
                    text: "",
                    hidden: Some(name(id)),
                }),
                X(text) => p.push(TokenPiece {
                    id: 100,
                    text,
                    hidden: None,
                }),
            };
            deltas.extend(d);
        }
        deltas.extend(p.finish());
        let mut m = ParsedMessage::default();
        m.apply_all(deltas.clone());
        (m, deltas)
    }

    #[test]
    fn reasoning_then_final() {
        let seq = [
            C(2),
            X("analysis"),
            C(3),
            X("User says hi."),
            X(" Reply."),
            C(4),
            C(1),
            X("assistant"),
            C(2),
            X("final"),
            C(3),
            X("Hello!"),
        ];
        for show in [false, true] {
            let (m, deltas) = run(&seq, show);
            assert_eq!(m.reasoning.as_deref(), Some("User says hi. Reply."));
            assert_eq!(m.content.as_deref(), Some("Hello!"));
            assert!(m.tool_calls.is_empty());
            // One delta per text token, none for the control tokens.
            assert_eq!(deltas.len(), 3, "{deltas:?}");
        }
    }

    #[test]
    fn tool_call_recipient_in_either_place_with_constrain() {
        let after_channel = [
            C(2),
            X("analysis"),
            C(3),
            X("Need weather."),
            C(4),
            C(1),
            X("assistant"),
            C(2),
            X("commentary to=functions.get_weather "),
            C(7),
            X("json"),
            C(3),
            X("{\"city\":"),
            X(" \"Paris\"}"),
        ];
        let before_channel = [
            C(2),
            X("commentary"),
            X(" to=functions.get_weather"),
            C(3),
            X("{}"),
        ];
        let (m, deltas) = run(&after_channel, false);
        assert_eq!(m.reasoning.as_deref(), Some("Need weather."));
        assert_eq!(m.content, None);
        assert_eq!(m.tool_calls.len(), 1);
        assert_eq!(m.tool_calls[0].name, "get_weather");
        assert_eq!(m.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
        assert!(matches!(deltas[1], Delta::ToolCallStart { index: 0, .. }));
        // Recipient in the role part, tool call only.
        let role_first = [
            X(" to=functions.lookup"),
            C(2),
            X("commentary json"),
            C(3),
            X("{\"q\": 1}"),
        ];
        let (m, _) = run(&role_first, true);
        assert_eq!(m.tool_calls[0].name, "lookup");
        assert_eq!(m.tool_calls[0].arguments, "{\"q\": 1}");
        let (m, _) = run(&before_channel, false);
        assert_eq!(m.tool_calls[0].name, "get_weather");
    }

    #[test]
    fn commentary_preamble_is_content_and_non_harmony_text_is_kept() {
        let seq = [C(2), X("commentary"), C(3), X("Let me check."), C(4)];
        let (m, _) = run(&seq, false);
        assert_eq!(m.content.as_deref(), Some("Let me check."));
        let (m, _) = run(&[X("just text")], false);
        assert_eq!(m.content.as_deref(), Some("just text"));
        // Truncated inside reasoning: the reasoning so far, no content.
        let (m, _) = run(&[C(2), X("analysis"), C(3), X("Hmm")], false);
        assert_eq!((m.reasoning.as_deref(), m.content), (Some("Hmm"), None));
    }
}
