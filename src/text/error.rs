//! What can go wrong reading tokenizer files or rendering text.

use std::path::PathBuf;

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
    #[error("`{name}` is set by the server and cannot be a chat template argument")]
    ReservedTemplateVariable { name: String },
    #[error("continue_final_message: {why}")]
    ContinueFinalMessage { why: String },
    #[error("{limit}")]
    TemplateOverLimit {
        limit: super::render_limits::TemplateLimit,
    },
    #[error("chat template failed: {source}")]
    TemplateRender {
        #[source]
        source: minijinja::Error,
    },
    /// A rendering in a worker process failed (the worker's message, as
    /// the in-process error would read) or the worker could not run.
    #[error("{message}")]
    TemplateWorker { message: String },
    /// No worker process could render (it could not start, or died for a
    /// reason that is not the template's): the server's fault.
    #[error("the chat template cannot be rendered: {why}")]
    TemplateWorkerUnavailable { why: String },
}
