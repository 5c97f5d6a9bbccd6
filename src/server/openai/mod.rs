//! OpenAI-compatible routes: `/v1/models`, `/v1/completions`,
//! `/v1/chat/completions`, streamed (SSE) or not.
//!
//! - [`types`]: the request and answer structs (the wire);
//! - [`sampling_types`]: the sampling and structured-output request fields;
//! - [`handlers`]: the axum handlers (validation, submission, blocking answers);
//! - [`stream`]: the SSE stream of chunks.

mod handlers;
mod outcome;
pub mod sampling_types;
mod stream;
pub mod types;

pub use handlers::{chat_completions, completions, method_not_allowed, models, not_found};

use types::{ChoiceTokenIds, Usage};

/// Which route a request came from (answer shapes differ).
#[derive(Clone, Copy, PartialEq, Eq)]
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
    prompt_len: usize,
    /// The prompt's token ids when the client asked for token ids
    /// (`return_token_ids`); output ids are then reported too.
    prompt_ids: Option<Vec<u32>>,
    include_usage: bool,
}

impl ResponseMeta {
    fn usage(&self, completion: usize) -> Usage {
        Usage::new(self.prompt_len, completion)
    }

    /// The token ids a choice carries: none unless asked for; the prompt's
    /// only where `with_prompt`.
    fn token_ids(&self, ids: &[u32], with_prompt: bool) -> ChoiceTokenIds {
        match &self.prompt_ids {
            None => ChoiceTokenIds::default(),
            Some(prompt) => ChoiceTokenIds {
                prompt_token_ids: with_prompt.then(|| prompt.clone()),
                token_ids: Some(ids.to_vec()),
            },
        }
    }
}
