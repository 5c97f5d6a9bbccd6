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
//!    (it says whether the output starts inside reasoning: Qwen3 2507,
//!    Qwen3.5 and Qwen3.6 thinking templates open `<think>` themselves) and
//!    the **tools offered** (`None` when the request offers none or says
//!    `tool_choice: "none"`: the answer is then not parsed for calls, as
//!    vLLM does; `qwen3_coder` reads the parameter types from them), and
//!    gives an [`OutputParser`].
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
//! call that does not parse is returned as content, never an error;
//! text made only of whitespace next to tool calls is dropped (as vLLM's
//! hermes parser drops it).
//!
//! # Parsers
//! - `qwen3` ([`think`]): `<think>…</think>` → reasoning, matched on the text
//!   (Qwen3's `<think>` is an added but not special token; any tokenizer
//!   works, the tag may be split over several tokens).
//! - `hermes` ([`hermes`]): `<tool_call>{"name":…,"arguments":{…}}</tool_call>`
//!   in the content → tool calls, also matched on the text.
//! - `qwen3_coder` ([`qwen3_coder`]): `<tool_call><function=NAME>
//!   <parameter=P>value</parameter>…</function></tool_call>` (Qwen3-Coder,
//!   Qwen3.5, Qwen3.6) → tool calls whose arguments are a JSON object, each
//!   value converted by the type the request's tool declares
//!   ([`tool_schema`]). It shares the `<tool_call>` frame with hermes
//!   ([`calls`]).
//! - `openai_gptoss` ([`harmony`]): gpt-oss harmony over the special-token
//!   ids (`<|start|>`, `<|channel|>`, `<|message|>`, `<|end|>`, ...), looked
//!   up in the checkpoint's tokenizer by their strings. It does both jobs
//!   (reasoning and tool calls). A tokenizer without these tokens cannot
//!   speak harmony: chosen by default (`model_type: gpt_oss`) the parser is
//!   then off (with a warning); asked for by flag it is a start-up error.
//! - `none`: the text goes out as content, as without parsers.

mod calls;
pub mod harmony;
pub mod hermes;
mod pieces;
pub mod qwen3_coder;
mod tags;
pub mod think;
pub mod tool_schema;

use std::str::FromStr;
use std::sync::Arc;

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
    Qwen3Coder,
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
            "qwen3_coder" => Ok(ToolParserName::Qwen3Coder),
            "openai_gptoss" | "openai" => Ok(ToolParserName::OpenaiGptoss),
            _ => Err(UnknownParser {
                name: s.to_owned(),
                known: "hermes, qwen3_coder, openai_gptoss (or openai), none",
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
    /// The family's parsers, each overridden by its flag when given:
    /// `gpt_oss` → openai_gptoss; the Qwen families (`qwen3_moe`,
    /// `qwen3_next`, `qwen3_5_moe`, `qwen3_5`) → qwen3, and the tool-call
    /// format their chat template writes (`template_tools`: XML →
    /// qwen3_coder, JSON → hermes), which differs within a family
    /// (Qwen3-Coder is `qwen3_moe` and writes XML; Qwen3-Next's own
    /// checkpoints write JSON, Qwen3-Coder-Next XML). Without a template
    /// that says: hermes for `qwen3_moe`, qwen3_coder for the others.
    pub fn for_model(
        architecture: Option<Architecture>,
        template_tools: Option<TextTools>,
        reasoning: Option<ReasoningParserName>,
        tool: Option<ToolParserName>,
    ) -> ParserNames {
        let by_template = |otherwise| match template_tools {
            Some(TextTools::Hermes) => ToolParserName::Hermes,
            Some(TextTools::Qwen3Coder) => ToolParserName::Qwen3Coder,
            None => otherwise,
        };
        let (default_reasoning, default_tool) = match architecture {
            Some(Architecture::Qwen3Moe) => (
                ReasoningParserName::Qwen3,
                by_template(ToolParserName::Hermes),
            ),
            Some(Architecture::Qwen35Moe | Architecture::Qwen35 | Architecture::Qwen3Next) => (
                ReasoningParserName::Qwen3,
                by_template(ToolParserName::Qwen3Coder),
            ),
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

/// The text-level tool-call formats (both in the `<tool_call>` frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextTools {
    Hermes,
    Qwen3Coder,
}

/// The parsers a server was started with, ready to start one per request.
#[derive(Clone, Debug)]
pub enum OutputParsers {
    /// Everything is content.
    Off,
    /// Text-level: `<think>` (qwen3) and/or `<tool_call>` (hermes or
    /// qwen3_coder).
    Text {
        reasoning: bool,
        tools: Option<TextTools>,
    },
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
        let tools = match names.tool {
            ToolParserName::Hermes => Some(TextTools::Hermes),
            ToolParserName::Qwen3Coder => Some(TextTools::Qwen3Coder),
            ToolParserName::None | ToolParserName::OpenaiGptoss => None,
        };
        Ok(if reasoning || tools.is_some() {
            OutputParsers::Text { reasoning, tools }
        } else {
            OutputParsers::Off
        })
    }

    /// A parser for one answer to `rendered_prompt`, looking for tool calls
    /// only when `tools` were offered (the chat-form tool definitions the
    /// template got).
    pub fn start(&self, rendered_prompt: &str, tools: Option<&[minijinja::Value]>) -> OutputParser {
        let inner = match self {
            OutputParsers::Off => Inner::Off,
            OutputParsers::Text {
                reasoning,
                tools: format,
            } => Inner::Text {
                think: reasoning
                    .then(|| think::ThinkParser::new(think::starts_in_reasoning(rendered_prompt))),
                tools: tools.and_then(|tools| {
                    Some(match format.as_ref()? {
                        TextTools::Hermes => ToolCalls::Hermes(hermes::HermesParser::new(())),
                        TextTools::Qwen3Coder => {
                            ToolCalls::Qwen3Coder(qwen3_coder::Qwen3CoderParser::new(Arc::new(
                                tool_schema::ToolSchemas::from_tools(tools),
                            )))
                        }
                    })
                }),
            },
            OutputParsers::Harmony {
                tokens,
                reasoning,
                tools: harmony_tools,
            } => Inner::Harmony(harmony::HarmonyParser::new(
                tokens.clone(),
                *reasoning,
                *harmony_tools && tools.is_some(),
            )),
        };
        OutputParser {
            inner,
            first_call_only: false,
        }
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
    /// `parallel_tool_calls: false`: calls after the first are dropped.
    first_call_only: bool,
}

#[derive(Debug)]
enum Inner {
    Off,
    Text {
        think: Option<think::ThinkParser>,
        tools: Option<ToolCalls>,
    },
    Harmony(harmony::HarmonyParser),
}

/// A text-level tool-call parser of one answer.
#[derive(Debug)]
enum ToolCalls {
    Hermes(hermes::HermesParser),
    Qwen3Coder(qwen3_coder::Qwen3CoderParser),
}

impl ToolCalls {
    fn push(&mut self, segment: Segment<'_>, out: &mut Vec<Delta>) {
        match self {
            ToolCalls::Hermes(p) => p.push(segment, out),
            ToolCalls::Qwen3Coder(p) => p.push(segment, out),
        }
    }

    fn finish(&mut self, out: &mut Vec<Delta>) {
        match self {
            ToolCalls::Hermes(p) => p.finish(out),
            ToolCalls::Qwen3Coder(p) => p.finish(out),
        }
    }
}

impl OutputParser {
    /// A parser that passes everything through as content.
    pub fn off() -> OutputParser {
        OutputParser {
            inner: Inner::Off,
            first_call_only: false,
        }
    }

    /// Keeps the answer's first tool call only (`parallel_tool_calls:
    /// false` under `tool_choice: "auto"`, as vLLM does): the deltas of
    /// later calls are dropped, so a stream and a blocking answer both
    /// carry one call.
    pub fn first_call_only(mut self) -> OutputParser {
        self.first_call_only = true;
        self
    }

    /// The text after which the answer may end when it keeps its first tool
    /// call only: the text formats' `</tool_call>`. `None` when every call
    /// is kept, without a text tool-call parser, and for harmony (a call
    /// ends the message with `<|call|>`, which ends generation).
    pub fn first_call_end(&self) -> Option<&'static str> {
        match &self.inner {
            Inner::Text { tools: Some(_), .. } if self.first_call_only => Some(calls::CLOSE),
            _ => None,
        }
    }

    /// `out` less the later calls' deltas when only the first is kept.
    fn kept(&self, mut out: Vec<Delta>) -> Vec<Delta> {
        if self.first_call_only {
            out.retain(|d| match d {
                Delta::ToolCallStart { index, .. } | Delta::ToolCallArguments { index, .. } => {
                    *index == 0
                }
                Delta::Reasoning(_) | Delta::Content(_) => true,
            });
        }
        out
    }

    /// Feeds one generated token.
    pub fn push(&mut self, piece: TokenPiece<'_>) -> Vec<Delta> {
        let mut out = Vec::new();
        match &mut self.inner {
            Inner::Off => content_into(&mut out, piece.text),
            Inner::Text { think, tools } => {
                text_pipeline(think, tools, &mut out, Segment::Text(piece.text));
                if let Some(hidden) = piece.hidden {
                    text_pipeline(think, tools, &mut out, Segment::Hidden(hidden));
                }
            }
            Inner::Harmony(parser) => parser.push(piece, &mut out),
        }
        self.kept(out)
    }

    /// Feeds text that belongs to no token (released at the end).
    pub fn push_text(&mut self, text: &str) -> Vec<Delta> {
        let mut out = Vec::new();
        match &mut self.inner {
            Inner::Off => content_into(&mut out, text),
            Inner::Text { think, tools } => {
                text_pipeline(think, tools, &mut out, Segment::Text(text));
            }
            Inner::Harmony(parser) => parser.push_text(text, &mut out),
        }
        self.kept(out)
    }

    /// Ends the answer: whatever was held back.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        match &mut self.inner {
            Inner::Off => {}
            Inner::Text { think, tools } => {
                let mut staged = Vec::new();
                if let Some(t) = think {
                    t.finish(&mut staged);
                }
                route_content(tools, staged, &mut out);
                if let Some(t) = tools {
                    t.finish(&mut out);
                }
            }
            Inner::Harmony(parser) => parser.finish(&mut out),
        }
        self.kept(out)
    }
}

/// qwen3 then hermes or qwen3_coder: the think parser splits reasoning
/// from content, and the content goes through the tool-call parser.
fn text_pipeline(
    think: &mut Option<think::ThinkParser>,
    tools: &mut Option<ToolCalls>,
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
    route_content(tools, staged, out);
}

/// Sends the content of `staged` through the tool-call parser (or out).
fn route_content(tools: &mut Option<ToolCalls>, staged: Vec<Staged>, out: &mut Vec<Delta>) {
    for piece in staged {
        match (piece, tools.as_mut()) {
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
            tools: Some(TextTools::Hermes),
        };
        let text = "<think>\nWeather.\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": 1}}\n</tool_call>";
        for cut in 1..text.len() {
            let m = message(
                &mut parsers.start("<|im_start|>assistant\n", Some(&[])),
                &[&text[..cut], &text[cut..]],
            );
            assert_eq!(m.reasoning.as_deref(), Some("\nWeather.\n"), "cut {cut}");
            assert_eq!(m.content, None, "cut {cut}");
            assert_eq!(m.tool_calls.len(), 1);
            assert_eq!(m.tool_calls[0].arguments, "{\"c\": 1}");
        }
    }

    /// `parallel_tool_calls: false`: of two hermes calls only the first
    /// reaches the message, however the text is cut; without the flag both do.
    #[test]
    fn first_call_only_keeps_the_first_of_two_calls() {
        let parsers = OutputParsers::Text {
            reasoning: false,
            tools: Some(TextTools::Hermes),
        };
        let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\": 2}}\n</tool_call>";
        for cut in 1..text.len() {
            let pieces = [&text[..cut], &text[cut..]];
            let both = message(&mut parsers.start("", Some(&[])), &pieces);
            assert_eq!(both.tool_calls.len(), 2, "cut {cut}");
            let m = message(&mut parsers.start("", Some(&[])).first_call_only(), &pieces);
            assert_eq!(m.tool_calls.len(), 1, "cut {cut}");
            assert_eq!(m.tool_calls[0].name, "a");
            assert_eq!(m.tool_calls[0].arguments, "{\"x\": 1}");
        }
        // Where the answer may end: after the first call, only when the
        // first call alone is kept and a text tool format is parsed.
        let start = || parsers.start("", Some(&[]));
        assert_eq!(
            start().first_call_only().first_call_end(),
            Some("</tool_call>")
        );
        assert_eq!(start().first_call_end(), None);
        let no_tools = parsers.start("", None).first_call_only();
        assert_eq!(no_tools.first_call_end(), None);
        assert_eq!(OutputParser::off().first_call_only().first_call_end(), None);
    }

    /// Qwen3.5 / Qwen3.6: the template opens `<think>`, the model closes it
    /// and calls a tool in XML; without tools offered the XML is content.
    #[test]
    fn qwen3_and_qwen3_coder_together_agree_however_the_text_is_cut() {
        let parsers = OutputParsers::Text {
            reasoning: true,
            tools: Some(TextTools::Qwen3Coder),
        };
        let prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n";
        let tools = [minijinja::Value::from_serialize(serde_json::json!(
            {"type": "function", "function": {"name": "w", "parameters": {
                "properties": {"c": {"type": "integer"}}}}}
        ))];
        let text = "Weather.\n</think>\n\n<tool_call>\n<function=w>\n<parameter=c>\n1\n</parameter>\n</function>\n</tool_call>";
        for cut in 1..text.len() {
            let m = message(
                &mut parsers.start(prompt, Some(&tools)),
                &[&text[..cut], &text[cut..]],
            );
            assert_eq!(m.reasoning.as_deref(), Some("Weather.\n"), "cut {cut}");
            assert_eq!(m.content, None, "cut {cut}");
            assert_eq!(m.tool_calls.len(), 1);
            assert_eq!(m.tool_calls[0].name, "w");
            assert_eq!(m.tool_calls[0].arguments, "{\"c\": 1}");
        }
        let m = message(&mut parsers.start(prompt, None), &[text]);
        assert!(m.tool_calls.is_empty());
        assert_eq!(
            m.content.as_deref(),
            Some(&text["Weather.\n</think>".len()..])
        );
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
        assert_eq!(
            "qwen3_coder".parse::<ToolParserName>().ok(),
            Some(ToolParserName::Qwen3Coder)
        );
        for qwen35 in [
            Architecture::Qwen35Moe,
            Architecture::Qwen35,
            Architecture::Qwen3Next,
        ] {
            let names = ParserNames::for_model(Some(qwen35), None, None, None);
            assert_eq!(
                (names.reasoning, names.tool),
                (ReasoningParserName::Qwen3, ToolParserName::Qwen3Coder)
            );
        }
        // The template's format wins over the family's: Qwen3-Coder is
        // `qwen3_moe`, Qwen3-Next's own templates write hermes JSON.
        let tool = |arch, format| ParserNames::for_model(Some(arch), format, None, None).tool;
        assert_eq!(
            tool(Architecture::Qwen3Moe, Some(TextTools::Qwen3Coder)),
            ToolParserName::Qwen3Coder
        );
        assert_eq!(
            tool(Architecture::Qwen3Next, Some(TextTools::Hermes)),
            ToolParserName::Hermes
        );
        assert_eq!(tool(Architecture::Qwen3Moe, None), ToolParserName::Hermes);
        assert_eq!(
            tool(Architecture::GptOss, Some(TextTools::Hermes)),
            ToolParserName::OpenaiGptoss
        );
        let names = ParserNames::for_model(Some(Architecture::GptOss), None, None, None);
        assert_eq!(names.reasoning, ReasoningParserName::OpenaiGptoss);
        assert!(!names.explicit);
        let names = ParserNames::for_model(
            Some(Architecture::Qwen3Moe),
            None,
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
