//! OpenAI-compatible routes: `/v1/models`, `/v1/completions`,
//! `/v1/chat/completions`, streamed (SSE) or not; and vLLM's `/tokenize`
//! and `/detokenize`.
//!
//! - [`types`]: the request and answer structs (the wire), with the chat
//!   request's messages and template fields in [`chat_types`],
//!   [`logprob_types`], [`tokenize_types`] and [`sampling_types`] (the
//!   sampling and structured-output request fields);
//! - [`chat_prompt`]: a chat request into the chat template's input;
//! - [`handlers`]: the axum handlers (validation, submission, blocking answers);
//! - [`stream`]: the SSE stream of chunks;
//! - [`logprobs`]: a choice's log-probabilities in the answer's shape;
//! - [`tokenize`]: `/tokenize`, `/detokenize`;
//! - [`tool_types`]: the reasoning and tool-call answer shapes, from the
//!   output parsers ([`crate::text::parsers`]);
//! - [`unsupported`]: request fields refused by name;
//! - `sizes`: a request's client-sized fields counted for
//!   [`crate::server::limits`];
//! - `route` and `meta`: which route a request came from, and what every
//!   answer and chunk of it repeats.
//!
//! This file only declares and re-exports: a module here imports only
//! those below it (the types, then the helpers, then the handlers).

pub mod chat_prompt;
pub mod chat_types;
mod handlers;
pub mod logprob_types;
mod logprobs;
mod meta;
mod outcome;
pub mod responses;
mod route;
pub mod sampling_types;
mod sizes;
mod stream;
mod tokenize;
pub mod tokenize_types;
pub mod tool_grammar;
pub mod tool_types;
pub mod types;
pub mod unsupported;

pub use handlers::{
    chat_completions, check_generation_defaults, completions, method_not_allowed, model, models,
    not_found,
};
pub use responses::responses;
pub use tokenize::{detokenize, tokenize};
