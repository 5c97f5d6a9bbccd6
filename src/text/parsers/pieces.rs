//! What the output parsers take and give: a generated token, the deltas of
//! a parsed answer and the final message they add up to, and the helpers
//! every parser shares.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::util::rng::SplitMix64;

/// One generated token as a parser sees it.
#[derive(Clone, Copy, Debug)]
pub struct TokenPiece<'a> {
    pub id: u32,
    /// The text this token completes, as the client sees it (it may hold
    /// text of earlier tokens that was held back, or be empty).
    pub text: &'a str,
    /// The token's own text when it is a special token the client does not
    /// see (left out of `text` by `skip_special_tokens`).
    pub hidden: Option<&'a str>,
}

/// One piece of a parsed answer, in output order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
    /// A tool call begins: `index` counts the answer's tool calls from 0.
    ToolCallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// More of tool call `index`'s arguments (a JSON text once complete).
    ToolCallArguments {
        index: usize,
        fragment: String,
    },
}

/// A parsed tool call of a final message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON text.
    pub arguments: String,
}

/// The final message: the concatenation of a parser's deltas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedMessage {
    pub reasoning: Option<String>,
    pub content: Option<String>,
    pub tool_calls: Vec<ParsedToolCall>,
}

impl ParsedMessage {
    pub fn apply(&mut self, delta: Delta) {
        match delta {
            Delta::Reasoning(text) => self.reasoning.get_or_insert_default().push_str(&text),
            Delta::Content(text) => self.content.get_or_insert_default().push_str(&text),
            Delta::ToolCallStart { id, name, .. } => self.tool_calls.push(ParsedToolCall {
                id,
                name,
                arguments: String::new(),
            }),
            Delta::ToolCallArguments { index, fragment } => {
                if let Some(call) = self.tool_calls.get_mut(index) {
                    call.arguments.push_str(&fragment);
                }
            }
        }
    }

    pub fn apply_all(&mut self, deltas: impl IntoIterator<Item = Delta>) {
        for delta in deltas {
            self.apply(delta);
        }
    }
}

/// A piece of text for the text-level parsers: visible text, or a special
/// token's text the client does not see (it can only act as a whole tag).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Segment<'a> {
    Text(&'a str),
    Hidden(&'a str),
}

/// What the think parser hands on: reasoning goes out, content (and hidden
/// special tokens in it) goes through the tool-call parser.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Staged {
    Reasoning(String),
    Content(String),
    HiddenContent(String),
}

/// Appends a delta, merging text into the previous delta of the same kind
/// (fewer, larger stream chunks); empty text is dropped.
pub(crate) fn push_merged(out: &mut Vec<Delta>, delta: Delta) {
    match (&delta, out.last_mut()) {
        (Delta::Reasoning(t) | Delta::Content(t), _) if t.is_empty() => {}
        (Delta::Reasoning(t), Some(Delta::Reasoning(prev)))
        | (Delta::Content(t), Some(Delta::Content(prev))) => prev.push_str(t),
        (
            Delta::ToolCallArguments { index, fragment },
            Some(Delta::ToolCallArguments {
                index: prev_index,
                fragment: prev,
            }),
        ) if index == prev_index => prev.push_str(fragment),
        _ => out.push(delta),
    }
}

/// A fresh tool-call id, `call_` and 24 letters and digits (OpenAI's shape),
/// unique within the process.
pub fn new_call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut rng = SplitMix64::new(nanos ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(32));
    let mut id = String::from("call_");
    for _ in 0..24 {
        id.push(char::from(
            ALPHABET[(rng.next_u64() % ALPHABET.len() as u64) as usize],
        ));
    }
    id
}
