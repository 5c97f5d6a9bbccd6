//! What every answer and chunk of one request repeats, and its usage as
//! the choices finish.

use std::sync::Arc;

use super::logprobs::{ChoiceLogprobs, LogprobsAsked};
use super::route::Route;
use super::types::{ChoiceTokenIds, Usage};
use crate::text::Tokenizer;

/// What every answer and chunk of one request repeats.
pub(super) struct ResponseMeta {
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) route: Route,
    /// One per engine sequence, by the index its events carry: prompt p's
    /// choices (`best_of` of them, else `n`) are `p * best_of ..`.
    pub(super) choices: Vec<ChoiceMeta>,
    /// Whether token ids are reported (`return_token_ids`).
    pub(super) return_token_ids: bool,
    pub(super) logprobs: LogprobsAsked,
    pub(super) tokenizer: Option<Arc<Tokenizer>>,
    pub(super) include_usage: bool,
    /// Every streamed chunk carries its choice's running usage
    /// (`stream_options.continuous_usage_stats`).
    pub(super) continuous_usage: bool,
}

/// What one choice's answer needs of its prompt.
pub(super) struct ChoiceMeta {
    /// Which prompt of the request it answers.
    pub(super) prompt: usize,
    /// That prompt's ids (shared by its choices).
    pub(super) prompt_ids: Arc<[u32]>,
    /// The prompt's text when the answer echoes it (`echo`).
    pub(super) echo: Option<String>,
}

/// A request's usage, summed as vLLM sums it: each prompt's tokens once,
/// however many choices it fanned out into, and every choice's completion
/// tokens (with `best_of`, every candidate's: they were all generated).
pub(super) struct UsageTally {
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
    pub(super) fn finished(
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

    pub(super) fn usage(&self) -> Usage {
        let cached = self.prompt_cached.iter().flatten().sum();
        Usage::new(self.prompt_tokens, self.completion_tokens).with_cached_tokens(cached)
    }
}

impl ResponseMeta {
    /// An empty tally for this request's prompts.
    pub(super) fn usage_tally(&self) -> UsageTally {
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
    pub(super) fn token_ids(&self, index: usize, ids: &[u32], with_prompt: bool) -> ChoiceTokenIds {
        if !self.return_token_ids {
            return ChoiceTokenIds::default();
        }
        ChoiceTokenIds {
            prompt_token_ids: with_prompt.then(|| self.choices[index].prompt_ids.to_vec()),
            token_ids: Some(ids.to_vec()),
        }
    }

    /// A fresh log-probability gatherer for choice `index`.
    pub(super) fn choice_logprobs(&self, index: usize) -> ChoiceLogprobs {
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
