//! OpenAI-compatible routes: `/v1/models`, `/v1/completions`,
//! `/v1/chat/completions`, streamed (SSE) or not; and vLLM's `/tokenize`
//! and `/detokenize`.
//!
//! - [`types`]: the request and answer structs (the wire), with
//!   [`logprob_types`], [`tokenize_types`] and [`sampling_types`] (the
//!   sampling and structured-output request fields);
//! - [`handlers`]: the axum handlers (validation, submission, blocking answers);
//! - [`stream`]: the SSE stream of chunks;
//! - [`logprobs`]: a choice's log-probabilities in the answer's shape;
//! - [`tokenize`]: `/tokenize`, `/detokenize`.
//! - [`tool_types`]: the reasoning and tool-call answer shapes, from the
//!   output parsers ([`crate::text::parsers`]).

mod handlers;
pub mod logprob_types;
mod logprobs;
mod outcome;
pub mod sampling_types;
mod stream;
mod tokenize;
pub mod tokenize_types;
pub mod tool_types;
pub mod types;

pub use handlers::{chat_completions, completions, method_not_allowed, model, models, not_found};
pub use tokenize::{detokenize, tokenize};

use std::sync::Arc;

use logprobs::{ChoiceLogprobs, LogprobsAsked};
use types::{ChoiceTokenIds, Usage};

use crate::text::Tokenizer;

/// Which route a request came from (answer shapes differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Completion,
    Chat,
}

/// What every answer and chunk of one request repeats.
struct ResponseMeta {
    id: String,
    created: u64,
    model: String,
    route: Route,
    /// One per choice (a completions request may batch prompts), by index.
    choices: Vec<ChoiceMeta>,
    /// Whether token ids are reported (`return_token_ids`).
    return_token_ids: bool,
    logprobs: LogprobsAsked,
    tokenizer: Option<Arc<Tokenizer>>,
    include_usage: bool,
}

/// What one choice's answer needs of its prompt.
struct ChoiceMeta {
    prompt_ids: Vec<u32>,
    /// The prompt's text when the answer echoes it (`echo`).
    echo: Option<String>,
}

impl ResponseMeta {
    /// Usage summed over the choices, from each one's completion tokens.
    fn usage(&self, completion: usize) -> Usage {
        let prompt = self.choices.iter().map(|c| c.prompt_ids.len()).sum();
        Usage::new(prompt, completion)
    }

    /// The token ids choice `index` carries: none unless asked for; the
    /// prompt's only where `with_prompt`.
    fn token_ids(&self, index: usize, ids: &[u32], with_prompt: bool) -> ChoiceTokenIds {
        if !self.return_token_ids {
            return ChoiceTokenIds::default();
        }
        ChoiceTokenIds {
            prompt_token_ids: with_prompt.then(|| self.choices[index].prompt_ids.clone()),
            token_ids: Some(ids.to_vec()),
        }
    }

    /// A fresh log-probability gatherer for choice `index`.
    fn choice_logprobs(&self, index: usize) -> ChoiceLogprobs {
        ChoiceLogprobs::new(
            self.route,
            self.logprobs,
            self.tokenizer.clone(),
            self.choices[index].prompt_ids.first().copied(),
        )
    }
}
