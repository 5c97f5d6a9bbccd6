//! Structured outputs: a grammar the output must follow (a JSON schema, a
//! regular expression, a list of choices, a Lark grammar), compiled by
//! llguidance into a matcher that gives, before each token, the set of
//! tokens that keep the output inside the grammar.
//!
//! The compiler ([`GrammarCompiler`]) holds the vocabulary as a token trie
//! (built once per server from `tokenizer.json`); compiling a request's
//! grammar happens on the preparation pool, and each sequence owns its
//! [`Constraint`]. The trie covers the tokenizer's ids: model rows past them
//! (padding) are never allowed.

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use thiserror::Error;

use crate::text::Tokenizer;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum GrammarError {
    #[error("structured outputs need a tokenizer with an end-of-sequence token")]
    NoEndOfSequence,
    #[error("cannot read the tokenizer's vocabulary for structured outputs: {0}")]
    Vocabulary(String),
    #[error("{0}")]
    Compile(String),
    #[error("the grammar rejected token {token}: {message}")]
    Rejected { token: u32, message: String },
}

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: {type: "json_object"}`).
    JsonObject,
    /// A JSON document valid against this schema.
    JsonSchema(serde_json::Value),
    /// Text matching this regular expression, whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
}

impl GrammarSpec {
    fn to_grammar(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(&serde_json::json!({"type": "object"})))
            }
            GrammarSpec::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact(schema)),
            GrammarSpec::Regex(regex) => TopLevelGrammar::from_regex(regex),
            GrammarSpec::Choice(choices) => {
                let alternatives: Vec<String> = choices.iter().map(|c| escape_regex(c)).collect();
                TopLevelGrammar::from_regex(&format!("(?:{})", alternatives.join("|")))
            }
            GrammarSpec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }

    /// A short description, for logs and `Debug`.
    fn summary(&self) -> String {
        let text = match self {
            GrammarSpec::JsonObject => "json_object".to_string(),
            GrammarSpec::JsonSchema(schema) => format!("json_schema {schema}"),
            GrammarSpec::Regex(regex) => format!("regex {regex}"),
            GrammarSpec::Choice(choices) => format!("choice {choices:?}"),
            GrammarSpec::Lark(lark) => format!("lark {lark}"),
        };
        text.chars().take(200).collect()
    }
}

/// The schema with llguidance's compact layout unless it chose one
/// (`x-guidance`): no whitespace between tokens of the JSON, as OpenAI
/// answers. Free whitespace would let a model pad its answer without end.
fn compact(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

/// Every regex metacharacter preceded by a backslash: the text matches
/// only itself.
fn escape_regex(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~/\"".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Compiles grammars against one vocabulary.
pub struct GrammarCompiler {
    factory: ParserFactory,
}

impl GrammarCompiler {
    /// Builds the token trie from the tokenizer's `tokenizer.json` (the bytes
    /// each token stands for; llguidance reads the byte-level and
    /// SentencePiece forms); generation may end at any of `eos`.
    pub fn new(tokenizer: &Tokenizer, eos: &[u32]) -> Result<GrammarCompiler, GrammarError> {
        let &first_eos = eos.first().ok_or(GrammarError::NoEndOfSequence)?;
        let json = tokenizer
            .vocabulary_json()
            .map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        // llguidance asserts on some malformed vocabularies: a checkpoint's
        // file must not take the server down.
        let words = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
            .map_err(|_| GrammarError::Vocabulary("malformed vocabulary".into()))?
            .map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        drop(json);
        let vocab = u32::try_from(words.len())
            .map_err(|_| GrammarError::Vocabulary("too many tokens".into()))?;
        if let Some(&id) = eos.iter().find(|&&id| id >= vocab) {
            return Err(GrammarError::Vocabulary(format!(
                "end-of-sequence id {id} is outside the tokenizer's {vocab} tokens"
            )));
        }
        let trie = TokTrie::from(&TokRxInfo::new(vocab, first_eos), &words).with_eos_tokens(eos);
        // Tokenizing (for forced text) greedily over the trie is enough:
        // the mask itself never tokenizes.
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            // Errors carry no copy of the grammar and the tokens.
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(GrammarCompiler { factory })
    }

    /// Compiles `spec` for one sequence; an invalid grammar is an error.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        let parser = self
            .factory
            .create_parser(spec.to_grammar())
            .map_err(|e| GrammarError::Compile(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(GrammarError::Compile(error));
        }
        // A grammar that compiles may still admit nothing at all (a regex
        // matching no string, a `$ref` that only refers to itself): its
        // first mask fails or is empty. Found here, on the preparation
        // pool, it is the request's error (a 400), not a sequence failing
        // in the engine; the mask is kept for the first step.
        let first = matcher
            .compute_mask()
            .map_err(|e| GrammarError::Compile(format!("the grammar admits no output: {e}")))?;
        if first.is_zero() {
            return Err(GrammarError::Compile(
                "the grammar admits no output: no token is allowed".into(),
            ));
        }
        Ok(Constraint {
            matcher,
            summary: spec.summary().into(),
            first_mask: Some(first.as_slice().to_vec()),
        })
    }
}

/// A [`GrammarCompiler`] built on first use (the trie of a large vocabulary
/// takes a moment to build; a server whose clients never ask for
/// structured outputs never pays it).
pub struct LazyGrammarCompiler {
    tokenizer: Option<Arc<Tokenizer>>,
    compiler: std::sync::OnceLock<Result<GrammarCompiler, GrammarError>>,
}

impl LazyGrammarCompiler {
    /// Generation may end at the tokenizer's end-of-sequence ids.
    pub fn new(tokenizer: Option<Arc<Tokenizer>>) -> LazyGrammarCompiler {
        LazyGrammarCompiler {
            tokenizer,
            compiler: std::sync::OnceLock::new(),
        }
    }

    pub fn get(&self) -> Result<&GrammarCompiler, GrammarError> {
        self.compiler
            .get_or_init(|| {
                let tokenizer = self
                    .tokenizer
                    .as_ref()
                    .ok_or(GrammarError::NoEndOfSequence)?;
                GrammarCompiler::new(tokenizer, tokenizer.eos_token_ids())
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// One sequence's grammar state.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    summary: Arc<str>,
    /// The mask computed at compile time, before any token was consumed.
    first_mask: Option<TokenMask>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint({})", self.summary)
    }
}

impl PartialEq for Constraint {
    /// Same grammar (by its description), whatever the state.
    fn eq(&self, other: &Constraint) -> bool {
        self.summary == other.summary
    }
}

/// The tokens allowed next: bit `id % 32` of word `id / 32`.
pub type TokenMask = Vec<u32>;

impl Constraint {
    /// The tokens allowed next.
    pub fn mask(&mut self) -> Result<TokenMask, GrammarError> {
        if let Some(mask) = self.first_mask.take() {
            return Ok(mask);
        }
        let mask = self
            .matcher
            .compute_mask()
            .map_err(|e| GrammarError::Compile(e.to_string()))?;
        Ok(mask.as_slice().to_vec())
    }

    /// Advances past a sampled token.
    pub fn consume(&mut self, token: u32) -> Result<(), GrammarError> {
        self.first_mask = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Rejected {
                token,
                message: e.to_string(),
            })
    }

    /// Whether the grammar is complete and allows nothing more: the output
    /// ends here.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_text_has_no_metacharacters_left() {
        assert_eq!(escape_regex("a.b"), "a\\.b");
        assert_eq!(escape_regex("(x|y)*"), "\\(x\\|y\\)\\*");
        assert_eq!(escape_regex("plain"), "plain");
    }
}
