//! The `qwen3` reasoning parser: `<think>…</think>` → reasoning, matched on
//! the text (Qwen3's tokenizer has `<think>` as an added token that is not
//! special, so it is in the visible text; another tokenizer may split it
//! into several tokens, and one that marks it special hands it over as a
//! hidden piece: all three work).
//!
//! Where the output starts: inside reasoning when the prompt opened
//! `<think>` itself (the Qwen3 2507 thinking templates end the generation
//! prompt with `<think>\n`; see [`starts_in_reasoning`]); otherwise a
//! `<think>` at the very start of the output (after whitespace) opens it,
//! as Qwen3's hybrid models write it. A later `<think>` is content. A
//! reasoning that never closes (`finish_reason: length`) stays reasoning.
//! Text is passed on exactly (vLLM's parser does not strip the newlines
//! around the tags either).

use super::pieces::{Segment, Staged};
use super::tags::{find_tag, safe_prefix_len};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Whether the rendered prompt leaves the output inside reasoning: the
/// generation prompt (after the last `<|im_start|>`) opens a `<think>` it
/// does not close. With `enable_thinking: false` Qwen3's template writes
/// `<think>\n\n</think>\n\n`, which is closed.
pub fn starts_in_reasoning(rendered_prompt: &str) -> bool {
    let tail = rendered_prompt
        .rfind("<|im_start|>")
        .map_or(rendered_prompt, |at| &rendered_prompt[at..]);
    tail.rfind(OPEN)
        .is_some_and(|at| !tail[at..].contains(CLOSE))
}

#[derive(Debug)]
enum State {
    /// Nothing but whitespace (and maybe the start of `<think>`) so far.
    Start,
    Reasoning,
    Content,
}

#[derive(Debug)]
pub struct ThinkParser {
    state: State,
    /// Text received but not yet passed on (a possible tag prefix).
    held: String,
}

impl ThinkParser {
    pub fn new(in_reasoning: bool) -> ThinkParser {
        ThinkParser {
            state: if in_reasoning {
                State::Reasoning
            } else {
                State::Start
            },
            held: String::new(),
        }
    }

    pub(crate) fn push(&mut self, segment: Segment<'_>, out: &mut Vec<Staged>) {
        match segment {
            Segment::Text(text) => {
                self.held.push_str(text);
                self.scan(out);
            }
            Segment::Hidden(tag) => self.hidden(tag, out),
        }
    }

    /// A special token the client does not see: only a whole tag acts.
    fn hidden(&mut self, tag: &str, out: &mut Vec<Staged>) {
        match self.state {
            State::Start if tag == OPEN => {
                // Whitespace before the tag is dropped, as when it is text.
                self.held.clear();
                self.state = State::Reasoning;
            }
            State::Reasoning if tag == CLOSE => {
                reasoning(out, std::mem::take(&mut self.held));
                self.state = State::Content;
            }
            State::Reasoning => reasoning(out, std::mem::take(&mut self.held)),
            State::Start | State::Content => {
                content(out, std::mem::take(&mut self.held));
                self.state = State::Content;
                out.push(Staged::HiddenContent(tag.to_owned()));
            }
        }
    }

    fn scan(&mut self, out: &mut Vec<Staged>) {
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.held = rest.to_owned();
                        self.state = State::Reasoning;
                    } else if OPEN.starts_with(trimmed) {
                        return; // maybe still `<think>`
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Reasoning => {
                    if let Some((at, tag)) = find_tag(&self.held, &[CLOSE]) {
                        let rest = self.held.split_off(at + tag.len());
                        self.held.truncate(at);
                        reasoning(out, std::mem::replace(&mut self.held, rest));
                        self.state = State::Content;
                    } else {
                        let keep = safe_prefix_len(&self.held, &[CLOSE]);
                        let rest = self.held.split_off(keep);
                        reasoning(out, std::mem::replace(&mut self.held, rest));
                        return;
                    }
                }
                State::Content => {
                    content(out, std::mem::take(&mut self.held));
                    return;
                }
            }
        }
    }

    pub(crate) fn finish(&mut self, out: &mut Vec<Staged>) {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Reasoning => reasoning(out, held),
            State::Start | State::Content => content(out, held),
        }
    }
}

fn reasoning(out: &mut Vec<Staged>, text: String) {
    if !text.is_empty() {
        out.push(Staged::Reasoning(text));
    }
}

fn content(out: &mut Vec<Staged>, text: String) {
    if !text.is_empty() {
        out.push(Staged::Content(text));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(in_reasoning: bool, pieces: &[&str]) -> Vec<Staged> {
        let mut p = ThinkParser::new(in_reasoning);
        let mut out = Vec::new();
        for piece in pieces {
            p.push(Segment::Text(piece), &mut out);
        }
        p.finish(&mut out);
        out
    }

    fn joined(out: &[Staged]) -> (String, String) {
        let (mut r, mut c) = (String::new(), String::new());
        for s in out {
            match s {
                Staged::Reasoning(t) => r.push_str(t),
                Staged::Content(t) => c.push_str(t),
                Staged::HiddenContent(_) => {}
            }
        }
        (r, c)
    }

    #[test]
    fn tags_split_anywhere_give_the_same_split() {
        let text = "<think>\nLet me add.\n</think>\n\n2 + 2 = 4";
        // Every way of cutting the text in two (on char boundaries).
        for cut in 0..=text.len() {
            let out = run(false, &[&text[..cut], &text[cut..]]);
            assert_eq!(
                joined(&out),
                ("\nLet me add.\n".into(), "\n\n2 + 2 = 4".into()),
                "cut at {cut}"
            );
            for s in &out {
                if let Staged::Reasoning(t) | Staged::Content(t) = s {
                    assert!(!t.contains('<'), "leaked tag piece {t:?} (cut at {cut})");
                }
            }
        }
        // One character at a time.
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(joined(&run(false, &pieces)).0, "\nLet me add.\n");
    }

    #[test]
    fn no_think_is_content_and_late_think_is_content() {
        assert_eq!(joined(&run(false, &["Hello"])), ("".into(), "Hello".into()));
        assert_eq!(
            joined(&run(false, &["Hi <think>x</think>"])),
            ("".into(), "Hi <think>x</think>".into())
        );
        // A lone `<` that turns out not to be the tag is content.
        assert_eq!(joined(&run(false, &["<", "b>"])), ("".into(), "<b>".into()));
    }

    #[test]
    fn prompt_opened_think_starts_in_reasoning_and_truncation_stays_reasoning() {
        let prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n";
        assert!(starts_in_reasoning(prompt));
        let closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
        assert!(!starts_in_reasoning(closed));
        // An earlier turn's think does not count.
        let earlier = "<|im_start|>assistant\n<think>\nx<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n";
        assert!(!starts_in_reasoning(earlier));
        assert_eq!(
            joined(&run(true, &["Thinking", " more</th", "ink>Done"])),
            ("Thinking more".into(), "Done".into())
        );
        assert_eq!(
            joined(&run(true, &["cut short</th"])),
            ("cut short</th".into(), "".into())
        );
    }

    #[test]
    fn hidden_special_tags_act_as_tags() {
        let mut p = ThinkParser::new(false);
        let mut out = Vec::new();
        p.push(Segment::Hidden(OPEN), &mut out);
        p.push(Segment::Text("why"), &mut out);
        p.push(Segment::Hidden(CLOSE), &mut out);
        p.push(Segment::Text("because"), &mut out);
        p.push(Segment::Hidden("<|other|>"), &mut out);
        p.finish(&mut out);
        assert_eq!(joined(&out), ("why".into(), "because".into()));
        assert_eq!(out.last(), Some(&Staged::HiddenContent("<|other|>".into())));
    }
}
