//! Text in and out: the tokenizer, the chat template, streaming detokenization
//! and stop strings.
//!
//! Everything here reads the files a Hugging Face checkpoint ships
//! (`tokenizer.json`, `tokenizer_config.json`, `generation_config.json`,
//! `config.json`) and nothing else.
//!
//! How the pieces fit in a generation loop:
//! 1. [`ChatTemplate::render`] turns chat messages into a prompt string;
//! 2. [`Tokenizer::encode`] turns it into ids (with `add_special_tokens =
//!    false` for a rendered chat prompt: the template already wrote them);
//! 3. each sampled id goes through a [`StreamDecoder`], which yields only text
//!    that no later token can change;
//! 4. that text goes through a [`StopMatcher`], which holds back what could
//!    still become a stop string and says when one completed.
mod chat;
mod config_files;
pub mod parsers;
mod python_json;
mod stop;
mod stream;
mod tokenizer;

use std::path::PathBuf;

pub use chat::{ChatMessage, ChatTemplate};
pub use config_files::SpecialTokens;
pub use stop::{StopMatcher, StopStep};
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;

/// Everything that can go wrong reading tokenizer files or rendering text.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot load tokenizer {path}: {source}")]
    TokenizerLoad {
        path: PathBuf,
        #[source]
        source: tokenizers::Error,
    },
    #[error("{path}: field `{field}` has an unexpected form: {found}")]
    BadField {
        path: PathBuf,
        field: &'static str,
        found: String,
    },
    #[error("{path}: eos_token {token:?} is not in the tokenizer's vocabulary")]
    UnknownEosToken { path: PathBuf, token: String },
    #[error("cannot encode text: {source}")]
    Encode {
        #[source]
        source: tokenizers::Error,
    },
    #[error("cannot decode token ids: {source}")]
    Decode {
        #[source]
        source: tokenizers::Error,
    },
    #[error(
        "no chat template in {dir}: neither chat_template.jinja nor a `chat_template` \
         in tokenizer_config.json; use a plain completion prompt instead"
    )]
    NoChatTemplate { dir: PathBuf },
    #[error("{path}: no chat template named \"default\" among {names:?}")]
    NoDefaultChatTemplate { path: PathBuf, names: Vec<String> },
    #[error("chat template does not compile: {source}")]
    TemplateSyntax {
        #[source]
        source: minijinja::Error,
    },
    #[error("the chat template in {path} does not compile: {source}")]
    TemplateSyntaxIn {
        path: PathBuf,
        #[source]
        source: minijinja::Error,
    },
    #[error("chat template failed: {source}")]
    TemplateRender {
        #[source]
        source: minijinja::Error,
    },
}
