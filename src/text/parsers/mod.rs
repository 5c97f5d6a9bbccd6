//! Output parsers: split a chat model's generated tokens into reasoning,
//! content and tool calls, as vLLM's `--reasoning-parser` and
//! `--tool-call-parser` do.
//!
//! # The one interface (blocking answers, streams and `/v1/responses`)
//!
//! 1. At start-up, [`OutputParsers::new`] takes the parser names (from
//!    [`ParserNames::for_model`], the model family's default, or the
//!    `--reasoning-parser` / `--tool-call-parser` flags) and the tokenizer.
//! 2. Per request, [`OutputParsers::start`] takes the **rendered prompt**
//!    (it says whether the output starts inside reasoning: Qwen3 2507
//!    thinking templates open `<think>` themselves) and gives an
//!    [`OutputParser`].
//! 3. Every generated token goes to [`OutputParser::push`] as a
//!    [`TokenPiece`]: its id, the text the detokenizer produced for it as the
//!    client would see it, and `hidden`, the token's own text when it is a
//!    special token left out of that text (`skip_special_tokens`). Text the
//!    engine releases at the end (held-back characters) goes to
//!    [`OutputParser::push_text`]. [`OutputParser::finish`] flushes.
//! 4. Each call returns [`Delta`]s in order: reasoning text, content text, a
//!    tool call's start (index, `call_…` id, function name), a fragment of a
//!    tool call's arguments. A stream sends them as they come; a blocking
//!    answer folds them with [`ParsedMessage::apply`]: the final message is
//!    exactly the concatenation of the deltas.
//!
//! Guarantees: a tag or special token split across tokens is never emitted
//! as text (a possible tag prefix is held back until it is decided); a tool
//! call whose JSON does not parse is returned as content, never an error;
//! text made only of whitespace next to tool calls is dropped (as vLLM's
//! hermes parser drops it).
//!
//! # Parsers
//! - `qwen3` ([`think`]): `<think>…</think>` → reasoning, matched on the text
//!   (Qwen3's `<think>` is an added but not special token; any tokenizer
//!   works, the tag may be split over several tokens).
//! - `hermes` ([`hermes`]): `<tool_call>{"name":…,"arguments":{…}}</tool_call>`
//!   in the content → tool calls, also matched on the text.
//! - `openai_gptoss` ([`harmony`]): gpt-oss harmony over the special-token
//!   ids (`<|start|>`, `<|channel|>`, `<|message|>`, `<|end|>`, ...), looked
//!   up in the checkpoint's tokenizer by their strings. It does both jobs
//!   (reasoning and tool calls). A tokenizer without these tokens cannot
//!   speak harmony: chosen by default (`model_type: gpt_oss`) the parser is
//!   then off (with a warning); asked for by flag it is a start-up error.
//! - `none`: the text goes out as content, as without parsers.

pub mod harmony;
pub mod hermes;
mod pieces;
mod tags;
pub mod think;

use std::str::FromStr;

use crate::geometry::Architecture;

use super::tokenizer::Tokenizer;
pub use pieces::{Delta, ParsedMessage, ParsedToolCall, TokenPiece, new_call_id};
use pieces::{Segment, Staged, push_merged};

/// The reasoning parsers (vLLM's `--reasoning-parser` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningParserName {
    None,
    Qwen3,
    OpenaiGptoss,
}

/// The tool-call parsers (vLLM's `--tool-call-parser` names; `openai` is
/// vLLM's name for the harmony one, accepted as `openai_gptoss`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolParserName {
    None,
    Hermes,
    OpenaiGptoss,
}

/// A parser name that is not known.
#[derive(Debug, thiserror::Error)]
#[error("unknown parser {name:?}; known: {known}")]
pub struct UnknownParser {
    name: String,
    known: &'static str,
}

impl FromStr for ReasoningParserName {
    type Err = UnknownParser;
    fn from_str(s: &str) -> Result<Self, UnknownParser> {
        match s {
            "none" => Ok(ReasoningParserName::None),
            "qwen3" => Ok(ReasoningParserName::Qwen3),
            "openai_gptoss" | "gpt_oss" => Ok(ReasoningParserName::OpenaiGptoss),
            _ => Err(UnknownParser {
                name: s.to_owned(),
                known: "qwen3, openai_gptoss, none",
            }),
        }
    }
}

impl FromStr for ToolParserName {
    type Err = UnknownParser;
    fn from_str(s: &str) -> Result<Self, UnknownParser> {
        match s {
            "none" => Ok(ToolParserName::None),
            "hermes" => Ok(ToolParserName::Hermes),
            "openai_gptoss" | "openai" => Ok(ToolParserName::OpenaiGptoss),
            _ => Err(UnknownParser {
                name: s.to_owned(),
                known: "hermes, openai_gptoss (or openai), none",
            }),
        }
    }
}

/// Which parsers a server runs, and whether a flag chose them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParserNames {
    pub reasoning: ReasoningParserName,
    pub tool: ToolParserName,
    /// A flag named them (a harmony parser without harmony tokens is then
    /// an error, not a warning).
    pub explicit: bool,
}

impl ParserNames {
    /// The family's parsers (`qwen3_moe` → qwen3 + hermes, `gpt_oss` →
    /// openai_gptoss), each overridden by its flag when given.
    pub fn for_model(
        architecture: Option<Architecture>,
        reasoning: Option<ReasoningParserName>,
        tool: Option<ToolParserName>,
    ) -> ParserNames {
        let (default_reasoning, default_tool) = match architecture {
            Some(Architecture::Qwen3Moe | Architecture::Qwen3Next) => {
                (ReasoningParserName::Qwen3, ToolParserName::Hermes)
            }
            // Qwen3.5 thinks as Qwen3 does; its XML tool calls have no
            // parser yet.
            Some(Architecture::Qwen35Moe | Architecture::Qwen35) => {
                (ReasoningParserName::Qwen3, ToolParserName::None)
            }
            Some(Architecture::GptOss) => (
                ReasoningParserName::OpenaiGptoss,
                ToolParserName::OpenaiGptoss,
            ),
            None => (ReasoningParserName::None, ToolParserName::None),
        };
        ParserNames {
            reasoning: reasoning.unwrap_or(default_reasoning),
            tool: tool.unwrap_or(default_tool),
            explicit: reasoning.is_some() || tool.is_some(),
        }
    }
}

/// Parsers that cannot run with this tokenizer or together.
#[derive(Debug, thiserror::Error)]
pub enum ParserError {
    #[error(
        "the openai_gptoss parser needs the harmony special tokens; this tokenizer lacks {missing:?}"
    )]
    MissingHarmonyTokens { missing: Vec<&'static str> },
    #[error(
        "openai_gptoss parses reasoning and tool calls together: pair it with openai_gptoss or none, not {other}"
    )]
    MixedHarmony { other: &'static str },
}

/// The parsers a server was started with, ready to start one per request.
#[derive(Clone, Debug)]
pub enum OutputParsers {
    /// Everything is content.
    Off,
    /// Text-level: `<think>` (qwen3) and/or `<tool_call>` (hermes).
    Text { reasoning: bool, tools: bool },
    Harmony {
        tokens: harmony::HarmonyTokens,
        reasoning: bool,
        tools: bool,
    },
}

impl OutputParsers {
    /// Checks the names against the tokenizer. A harmony parser that the
    /// tokenizer cannot run is an error when a flag asked for it and off (a
    /// warning) when it was the family's default.
    pub fn new(
        names: ParserNames,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<OutputParsers, ParserError> {
        let harmony_reasoning = names.reasoning == ReasoningParserName::OpenaiGptoss;
        let harmony_tools = names.tool == ToolParserName::OpenaiGptoss;
        if harmony_reasoning || harmony_tools {
            if names.reasoning == ReasoningParserName::Qwen3 {
                return Err(ParserError::MixedHarmony { other: "qwen3" });
            }
            if names.tool == ToolParserName::Hermes {
                return Err(ParserError::MixedHarmony { other: "hermes" });
            }
            let Some(tokenizer) = tokenizer else {
                return Ok(OutputParsers::Off);
            };
            return match harmony::HarmonyTokens::look_up(tokenizer) {
                Ok(tokens) => Ok(OutputParsers::Harmony {
                    tokens,
                    reasoning: harmony_reasoning,
                    tools: harmony_tools,
                }),
                Err(missing) if names.explicit => {
                    Err(ParserError::MissingHarmonyTokens { missing })
                }
                Err(missing) => {
                    tracing::warn!(
                        "output parser openai_gptoss off: the tokenizer lacks {missing:?}; \
                         answers are plain content"
                    );
                    Ok(OutputParsers::Off)
                }
            };
        }
        let reasoning = names.reasoning == ReasoningParserName::Qwen3;
        let tools = names.tool == ToolParserName::Hermes;
        Ok(if reasoning || tools {
            OutputParsers::Text { reasoning, tools }
        } else {
            OutputParsers::Off
        })
    }

    /// A parser for one answer to `rendered_prompt`.
    pub fn start(&self, rendered_prompt: &str) -> OutputParser {
        let inner = match self {
            OutputParsers::Off => Inner::Off,
            OutputParsers::Text { reasoning, tools } => Inner::Text {
                think: reasoning
                    .then(|| think::ThinkParser::new(think::starts_in_reasoning(rendered_prompt))),
                hermes: tools.then(hermes::HermesParser::new),
            },
            OutputParsers::Harmony {
                tokens,
                reasoning,
                tools,
            } => Inner::Harmony(harmony::HarmonyParser::new(
                tokens.clone(),
                *reasoning,
                *tools,
            )),
        };
        OutputParser { inner }
    }

    /// Whether any parser runs (answers may carry reasoning or tool calls).
    pub fn is_on(&self) -> bool {
        !matches!(self, OutputParsers::Off)
    }
}

/// One answer's parser (see the module doc for the protocol).
#[derive(Debug)]
pub struct OutputParser {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Off,
    Text {
        think: Option<think::ThinkParser>,
        hermes: Option<hermes::HermesParser>,
    },
    Harmony(harmony::HarmonyParser),
}

impl OutputParser {
    /// A parser that passes everything through as content.
    pub fn off() -> OutputParser {
        OutputParser { inner: Inner::Off }
    }

    /// Feeds one generated token.
    pub fn push(&mut self, piece: TokenPiece<'_>) -> Vec<Delta> {
        let mut out = Vec::new();
        match &mut self.inner {
            Inner::Off => content_into(&mut out, piece.text),
            Inner::Text { think, hermes } => {
                text_pipeline(think, hermes, &mut out, Segment::Text(piece.text));
                if let Some(hidden) = piece.hidden {
                    text_pipeline(think, hermes, &mut out, Segment::Hidden(hidden));
                }
            }
            Inner::Harmony(parser) => parser.push(piece, &mut out),
        }
        out
    }

    /// Feeds text that belongs to no token (released at the end).
    pub fn push_text(&mut self, text: &str) -> Vec<Delta> {
        let mut out = Vec::new();
        match &mut self.inner {
            Inner::Off => content_into(&mut out, text),
            Inner::Text { think, hermes } => {
                text_pipeline(think, hermes, &mut out, Segment::Text(text));
            }
            Inner::Harmony(parser) => parser.push_text(text, &mut out),
        }
        out
    }

    /// Ends the answer: whatever was held back.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        match &mut self.inner {
            Inner::Off => {}
            Inner::Text { think, hermes } => {
                let mut staged = Vec::new();
                if let Some(t) = think {
                    t.finish(&mut staged);
                }
                route_content(hermes, staged, &mut out);
                if let Some(h) = hermes {
                    h.finish(&mut out);
                }
            }
            Inner::Harmony(parser) => parser.finish(&mut out),
        }
        out
    }
}

/// qwen3 then hermes: the think parser splits reasoning from content, and
/// the content goes through the tool-call parser.
fn text_pipeline(
    think: &mut Option<think::ThinkParser>,
    hermes: &mut Option<hermes::HermesParser>,
    out: &mut Vec<Delta>,
    segment: Segment<'_>,
) {
    let mut staged = Vec::new();
    match think {
        Some(t) => t.push(segment, &mut staged),
        None => staged.push(match segment {
            Segment::Text(text) => Staged::Content(text.to_owned()),
            Segment::Hidden(text) => Staged::HiddenContent(text.to_owned()),
        }),
    }
    route_content(hermes, staged, out);
}

/// Sends the content of `staged` through the tool-call parser (or out).
fn route_content(
    hermes: &mut Option<hermes::HermesParser>,
    staged: Vec<Staged>,
    out: &mut Vec<Delta>,
) {
    for piece in staged {
        match (piece, hermes.as_mut()) {
            (Staged::Reasoning(text), _) => push_merged(out, Delta::Reasoning(text)),
            (Staged::Content(text), Some(h)) => h.push(Segment::Text(&text), out),
            (Staged::HiddenContent(text), Some(h)) => h.push(Segment::Hidden(&text), out),
            (Staged::Content(text), None) => push_merged(out, Delta::Content(text)),
            (Staged::HiddenContent(_), None) => {}
        }
    }
}

fn content_into(out: &mut Vec<Delta>, text: &str) {
    push_merged(out, Delta::Content(text.to_owned()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(parser: &mut OutputParser, pieces: &[&str]) -> ParsedMessage {
        let mut m = ParsedMessage::default();
        for (i, piece) in pieces.iter().enumerate() {
            m.apply_all(parser.push(TokenPiece {
                id: i as u32,
                text: piece,
                hidden: None,
            }));
        }
        m.apply_all(parser.finish());
        m
    }

    #[test]
    fn qwen3_and_hermes_together_agree_however_the_text_is_cut() {
        let parsers = OutputParsers::Text {
            reasoning: true,
            tools: true,
        };
        let text = "<think>\nWeather.\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": 1}}\n</tool_call>";
        for cut in 1..text.len() {
            let m = message(
                &mut parsers.start("<|im_start|>assistant\n"),
                &[&text[..cut], &text[cut..]],
            );
            assert_eq!(m.reasoning.as_deref(), Some("\nWeather.\n"), "cut {cut}");
            assert_eq!(m.content, None, "cut {cut}");
            assert_eq!(m.tool_calls.len(), 1);
            assert_eq!(m.tool_calls[0].arguments, "{\"c\": 1}");
        }
    }

    #[test]
    fn names_and_family_defaults() {
        assert_eq!(
            "hermes".parse::<ToolParserName>().ok(),
            Some(ToolParserName::Hermes)
        );
        assert_eq!(
            "openai".parse::<ToolParserName>().ok(),
            Some(ToolParserName::OpenaiGptoss)
        );
        assert!("deepseek_r1".parse::<ReasoningParserName>().is_err());
        let names = ParserNames::for_model(Some(Architecture::GptOss), None, None);
        assert_eq!(names.reasoning, ReasoningParserName::OpenaiGptoss);
        assert!(!names.explicit);
        let names = ParserNames::for_model(
            Some(Architecture::Qwen3Moe),
            Some(ReasoningParserName::None),
            None,
        );
        assert_eq!(
            (names.reasoning, names.tool),
            (ReasoningParserName::None, ToolParserName::Hermes)
        );
        // Harmony with a text parser is refused.
        let mixed = ParserNames {
            reasoning: ReasoningParserName::Qwen3,
            tool: ToolParserName::OpenaiGptoss,
            explicit: true,
        };
        assert!(matches!(
            OutputParsers::new(mixed, None),
            Err(ParserError::MixedHarmony { .. })
        ));
    }

    #[test]
    fn call_ids_look_like_openais_and_differ() {
        let (a, b) = (new_call_id(), new_call_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), "call_".len() + 24);
        assert!(a.starts_with("call_") && a[5..].chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
