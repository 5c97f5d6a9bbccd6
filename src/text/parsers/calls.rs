//! The `<tool_call>…</tool_call>` frame the text tool-call formats share
//! (`hermes` writes JSON between the tags, `qwen3_coder` XML): finding the
//! tags in streamed content, the whitespace around calls, and what a body
//! that is not a call becomes. What is between the tags is the format's
//! [`CallBody`].
//!
//! A body is handed over as it streams (never holding a piece of
//! `</tool_call>`), and says when it knows: a call (it has sent the call's
//! start), not a call (nothing sent; the tags and the body go out as
//! content, never an error), or not yet. A body still undecided when it
//! ends is asked once more, at `</tool_call>` or at the end of the output
//! (an unclosed last call counts, as vLLM accepts it). So a stream and a
//! blocking answer agree, and a stream never sends a call it takes back.
//! Whitespace right before a call, and at the end of an answer that made
//! calls, is dropped (Qwen3 writes `\n\n` before a call and `\n` between
//! calls), as vLLM's parsers drop it; other whitespace is content.

use super::pieces::{Delta, Segment, push_merged};
use super::tags::{find_tag, safe_prefix_len};

pub(crate) const OPEN: &str = "<tool_call>";
pub(crate) const CLOSE: &str = "</tool_call>";

/// What a body knows about itself so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing sent; it may still be either.
    Undecided,
    /// A call: its start has been sent.
    Call,
    /// Not a call: nothing was sent, it is content.
    NotACall,
}

/// One format's reading of what is between the tags.
pub(crate) trait CallBody: Sized {
    /// What every call of an answer shares (the request's tools).
    type Context;
    /// A body for the answer's call number `index` (counting calls made).
    fn open(context: &Self::Context, index: usize) -> Self;
    /// More of the body.
    fn push(&mut self, text: &str, out: &mut Vec<Delta>) -> Verdict;
    /// The body ended, `closed` by `</tool_call>` or else by the end of the
    /// output: whatever it holds is sent. Never [`Verdict::Undecided`].
    fn end(&mut self, closed: bool, out: &mut Vec<Delta>) -> Verdict;
}

#[derive(Debug)]
struct InCall<B> {
    body: B,
    /// The body's text while it is undecided (content if it is not a call).
    raw: String,
    /// The whitespace before the opening tag: dropped if this is a call.
    space_before: String,
    verdict: Verdict,
}

/// The tool-call parser of a text format: content with `<tool_call>`
/// bodies in it.
#[derive(Debug)]
pub(crate) struct TaggedCalls<B: CallBody> {
    context: B::Context,
    call: Option<InCall<B>>,
    /// Outside a call: text that may still become `<tool_call>`; inside:
    /// text that may still become `</tool_call>`.
    held: String,
    /// Trailing whitespace of the content not yet sent: dropped if a call
    /// follows (or at the end if calls were made), sent with the next
    /// other content.
    pending_space: String,
    calls: usize,
}

impl<B: CallBody> TaggedCalls<B> {
    pub(crate) fn new(context: B::Context) -> TaggedCalls<B> {
        TaggedCalls {
            context,
            call: None,
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
            // A special token the client does not see: only a whole tag
            // acts; another one breaks a tag being spelt outside a call and
            // is ignored inside one.
            Segment::Hidden(tag) => match (self.call.is_some(), tag) {
                (false, OPEN) => {
                    let before = std::mem::take(&mut self.held);
                    self.content(out, before);
                    self.open_call();
                }
                (true, CLOSE) => {
                    let rest = std::mem::take(&mut self.held);
                    self.feed_body(&rest, out);
                    self.end_call(true, out);
                }
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
            if self.call.is_some() {
                let (body, rest, closed) = match find_tag(&self.held, &[CLOSE]) {
                    Some((at, _)) => (
                        self.held[..at].to_owned(),
                        self.held[at + CLOSE.len()..].to_owned(),
                        true,
                    ),
                    None => {
                        let keep = safe_prefix_len(&self.held, &[CLOSE]);
                        (
                            self.held[..keep].to_owned(),
                            self.held[keep..].to_owned(),
                            false,
                        )
                    }
                };
                self.held = rest;
                self.feed_body(&body, out);
                match (closed, self.call.is_some()) {
                    (true, true) => self.end_call(true, out),
                    (false, true) => return,
                    // Not a call after all: the rest is content again, the
                    // closing tag included.
                    (true, false) => self.held.insert_str(0, CLOSE),
                    (false, false) => {}
                }
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
        // Whitespace before a call is not content (kept until it is known
        // to be a call).
        self.call = Some(InCall {
            body: B::open(&self.context, self.calls),
            raw: String::new(),
            space_before: std::mem::take(&mut self.pending_space),
            verdict: Verdict::Undecided,
        });
    }

    /// Body text to the open call; a body that turns out not to be a call
    /// goes out as content with its opening tag.
    fn feed_body(&mut self, text: &str, out: &mut Vec<Delta>) {
        let Some(call) = self.call.as_mut() else {
            return;
        };
        if text.is_empty() {
            return;
        }
        let verdict = call.body.push(text, out);
        if call.verdict != Verdict::Undecided {
            return;
        }
        call.raw.push_str(text);
        match verdict {
            Verdict::Undecided => {}
            Verdict::Call => self.made_call(),
            Verdict::NotACall => {
                if let Some(call) = self.call.take() {
                    self.not_a_call(call, false, out);
                }
            }
        }
    }

    /// The open call's body ended (`closed` by its tag).
    fn end_call(&mut self, closed: bool, out: &mut Vec<Delta>) {
        let Some(mut call) = self.call.take() else {
            return;
        };
        let verdict = call.body.end(closed, out);
        match (call.verdict, verdict) {
            (Verdict::Undecided, Verdict::Call) => self.made_call(),
            (Verdict::Undecided, _) => self.not_a_call(call, closed, out),
            _ => {}
        }
    }

    fn made_call(&mut self) {
        if let Some(call) = self.call.as_mut() {
            call.verdict = Verdict::Call;
            call.raw = String::new();
            call.space_before = String::new();
        }
        self.calls += 1;
    }

    /// A body that is not a call: content as written, tags included, after
    /// the whitespace before it.
    fn not_a_call(&mut self, call: InCall<B>, closed: bool, out: &mut Vec<Delta>) {
        self.pending_space.insert_str(0, &call.space_before);
        let close = if closed { CLOSE } else { "" };
        self.content(out, format!("{OPEN}{}{close}", call.raw));
    }

    fn content(&mut self, out: &mut Vec<Delta>, text: String) {
        if text.is_empty() {
            return;
        }
        // Trailing whitespace waits for what follows, so that however the
        // text was cut into tokens, the whitespace before a call is dropped.
        let end = text.trim_end().len();
        if end > 0 {
            let mut all = std::mem::take(&mut self.pending_space);
            all.push_str(&text[..end]);
            push_merged(out, Delta::Content(all));
        }
        self.pending_space.push_str(&text[end..]);
    }

    pub(crate) fn finish(&mut self, out: &mut Vec<Delta>) {
        let rest = std::mem::take(&mut self.held);
        if self.call.is_some() {
            self.feed_body(&rest, out);
            self.end_call(false, out);
        } else {
            self.content(out, rest);
        }
        let space = std::mem::take(&mut self.pending_space);
        if self.calls == 0 {
            push_merged(out, Delta::Content(space));
        }
    }
}
