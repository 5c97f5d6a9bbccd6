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
//! - [`tokenize`]: `/tokenize`, `/detokenize`.
//! - [`tool_types`]: the reasoning and tool-call answer shapes, from the
//!   output parsers ([`crate::text::parsers`]).

pub mod chat_prompt;
pub mod chat_types;
mod handlers;
pub mod logprob_types;
mod logprobs;
mod outcome;
pub mod responses;
pub mod sampling_types;
mod stream;
mod tokenize;
pub mod tokenize_types;
pub mod tool_types;
pub mod types;

pub use handlers::{chat_completions, completions, method_not_allowed, model, models, not_found};
pub use responses::responses;
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
    /// One per engine sequence, by the index its events carry: prompt p's
    /// choices (`best_of` of them, else `n`) are `p * best_of ..`.
    choices: Vec<ChoiceMeta>,
    /// Whether token ids are reported (`return_token_ids`).
    return_token_ids: bool,
    logprobs: LogprobsAsked,
    tokenizer: Option<Arc<Tokenizer>>,
    include_usage: bool,
}

/// What one choice's answer needs of its prompt.
struct ChoiceMeta {
    /// Which prompt of the request it answers.
    prompt: usize,
    /// That prompt's ids (shared by its choices).
    prompt_ids: Arc<[u32]>,
    /// The prompt's text when the answer echoes it (`echo`).
    echo: Option<String>,
}

/// A request's usage, summed as vLLM sums it: each prompt's tokens once,
/// however many choices it fanned out into, and every choice's completion
/// tokens (with `best_of`, every candidate's: they were all generated).
struct UsageTally {
    /// Whether each prompt's tokens are counted yet.
    prompt_counted: Vec<bool>,
    /// Each prompt's tokens served from the prefix cache: the fewest any of
    /// its choices got (with n > 1 the first choice computes the prompt and
    /// the others reuse its blocks; that reuse is not the client's hit).
    prompt_cached: Vec<Option<usize>>,
    prompt_tokens: usize,
    completion_tokens: usize,
}

impl UsageTally {
    /// A choice of prompt `prompt` ended: the counts of its
    /// `Event::Finished` (the prompt's are the same for all its choices).
    fn finished(
        &mut self,
        prompt: usize,
        prompt_tokens: usize,
        cached_tokens: usize,
        completion_tokens: usize,
    ) {
        if let Some(counted) = self.prompt_counted.get_mut(prompt)
            && !std::mem::replace(counted, true)
        {
            self.prompt_tokens += prompt_tokens;
        }
        if let Some(cached) = self.prompt_cached.get_mut(prompt) {
            *cached = Some(cached.map_or(cached_tokens, |c| c.min(cached_tokens)));
        }
        self.completion_tokens += completion_tokens;
    }

    fn usage(&self) -> Usage {
        let cached = self.prompt_cached.iter().flatten().sum();
        Usage::new(self.prompt_tokens, self.completion_tokens).with_cached_tokens(cached)
    }
}

impl ResponseMeta {
    /// An empty tally for this request's prompts.
    fn usage_tally(&self) -> UsageTally {
        let prompts = self.choices.last().map_or(0, |c| c.prompt + 1);
        UsageTally {
            prompt_counted: vec![false; prompts],
            prompt_cached: vec![None; prompts],
            prompt_tokens: 0,
            completion_tokens: 0,
        }
    }

    /// The token ids choice `index` carries: none unless asked for; the
    /// prompt's only where `with_prompt`.
    fn token_ids(&self, index: usize, ids: &[u32], with_prompt: bool) -> ChoiceTokenIds {
        if !self.return_token_ids {
            return ChoiceTokenIds::default();
        }
        ChoiceTokenIds {
            prompt_token_ids: with_prompt.then(|| self.choices[index].prompt_ids.to_vec()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_each_prompt_once_and_every_choice() {
        let mut tally = UsageTally {
            prompt_counted: vec![false; 2],
            prompt_cached: vec![None; 2],
            prompt_tokens: 0,
            completion_tokens: 0,
        };
        // Prompt 0 (5 tokens, 4 cached for one choice, 0 for the other) and
        // prompt 1 (3 tokens, 2 cached for both), two choices each.
        for (prompt, prompt_tokens, cached, completion) in
            [(0, 5, 4, 4), (1, 3, 2, 2), (0, 5, 0, 1), (1, 3, 2, 7)]
        {
            tally.finished(prompt, prompt_tokens, cached, completion);
        }
        let usage = tally.usage();
        assert_eq!(usage.prompt_tokens_details.cached_tokens, 2);
        assert_eq!(usage.prompt_tokens, 8);
        assert_eq!(usage.completion_tokens, 14);
        assert_eq!(usage.total_tokens, 22);
    }
}
