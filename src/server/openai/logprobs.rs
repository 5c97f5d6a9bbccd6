//! Turns the engine's [`TokenLogprob`]s into a choice's answer: OpenAI's
//! completions or chat shape, and vLLM's `prompt_logprobs`. Used by the
//! blocking answer (everything at the end) and the stream (the entries since
//! the last chunk, each chunk).

use std::sync::Arc;

use super::route::Route;
use super::types::{
    ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs, Logprobs, OrderedMap,
    PromptLogprob, PromptLogprobs,
};
use crate::engine::{LogprobRequest, TokenLogprob};
use crate::text::Tokenizer;

/// vLLM's stand-in for a log-probability of `-inf` (JSON has no infinity).
const NEG_INFINITY_LOGPROB: f32 = -9999.0;

/// What a request asked for, in the answer's terms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct LogprobsAsked {
    /// Generated tokens' log-probabilities, with this many alternatives.
    pub sampled: Option<usize>,
    /// Completions' `echo` with `logprobs`: the prompt's tokens get entries
    /// too, with this many alternatives.
    pub echo: Option<usize>,
    /// vLLM's `prompt_logprobs`, with this many alternatives.
    pub prompt: Option<usize>,
}

impl LogprobsAsked {
    /// What the engine must compute for this.
    pub fn engine(&self) -> LogprobRequest {
        LogprobRequest {
            sampled: self.sampled,
            prompt: self.echo.max(self.prompt),
        }
    }

    fn any(&self) -> bool {
        self.sampled.is_some() || self.echo.is_some()
    }
}

/// A token's string as logprobs show it: its text alone (special tokens
/// included), or `token_id:N` without a tokenizer (vLLM's form).
pub(super) fn token_name(tokenizer: Option<&Tokenizer>, id: u32) -> String {
    tokenizer
        .and_then(|t| t.decode(&[id], false).ok())
        .unwrap_or_else(|| format!("token_id:{id}"))
}

fn finite(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else {
        NEG_INFINITY_LOGPROB
    }
}

/// One choice's log-probabilities, gathered as its events arrive.
pub(super) struct ChoiceLogprobs {
    route: Route,
    asked: LogprobsAsked,
    tokenizer: Option<Arc<Tokenizer>>,
    /// Characters of the choice's text before the next entry.
    offset: usize,
    completion: CompletionLogprobs,
    chat: Vec<ChatTokenLogprob>,
    prompt: PromptLogprobs,
}

impl ChoiceLogprobs {
    /// `first_prompt_id` is the prompt's first token: with `echo` (and
    /// logprobs) and with `prompt_logprobs` it gets its `null` entry here.
    pub fn new(
        route: Route,
        asked: LogprobsAsked,
        tokenizer: Option<Arc<Tokenizer>>,
        first_prompt_id: Option<u32>,
    ) -> ChoiceLogprobs {
        let mut choice = ChoiceLogprobs {
            route,
            asked,
            tokenizer,
            offset: 0,
            completion: CompletionLogprobs::default(),
            chat: Vec::new(),
            prompt: Vec::new(),
        };
        if let Some(id) = first_prompt_id {
            if asked.echo.is_some() {
                let name = choice.name(id);
                choice.push_completion(name, None, None);
            }
            if asked.prompt.is_some() {
                choice.prompt.push(None);
            }
        }
        choice
    }

    fn name(&self, id: u32) -> String {
        token_name(self.tokenizer.as_deref(), id)
    }

    fn push_completion(
        &mut self,
        name: String,
        logprob: Option<f32>,
        top: Option<OrderedMap<f32>>,
    ) {
        let chars = name.chars().count();
        let c = &mut self.completion;
        c.tokens.push(name);
        c.token_logprobs.push(logprob);
        c.top_logprobs.push(top);
        c.text_offset.push(self.offset);
        self.offset += chars;
    }

    /// A completions entry of `t` with its `n` most likely alternatives.
    fn completion_entry(&mut self, t: &TokenLogprob, n: usize) {
        let top = t
            .top
            .iter()
            .take(n)
            .map(|&(id, lp)| (self.name(id), finite(lp)))
            .collect();
        let name = self.name(t.id);
        self.push_completion(name, Some(finite(t.logprob)), Some(OrderedMap(top)));
    }

    /// A prompt token's log-probability (engine `PromptLogprob` event).
    pub fn on_prompt(&mut self, t: &TokenLogprob) {
        if let Some(n) = self.asked.echo {
            self.completion_entry(t, n);
        }
        if let Some(n) = self.asked.prompt {
            let mut entries = vec![(
                t.id.to_string(),
                PromptLogprob {
                    logprob: finite(t.logprob),
                    rank: t.rank,
                    decoded_token: self.name(t.id),
                },
            )];
            for (i, &(id, lp)) in t.top.iter().take(n).enumerate() {
                if id != t.id {
                    entries.push((
                        id.to_string(),
                        PromptLogprob {
                            logprob: finite(lp),
                            rank: i + 1,
                            decoded_token: self.name(id),
                        },
                    ));
                }
            }
            self.prompt.push(Some(OrderedMap(entries)));
        }
    }

    /// A generated token's log-probability.
    pub fn on_token(&mut self, t: &TokenLogprob) {
        let Some(n) = self.asked.sampled else {
            return;
        };
        match self.route {
            Route::Completion => self.completion_entry(t, n),
            Route::Chat => {
                let token = self.name(t.id);
                let top_logprobs = t
                    .top
                    .iter()
                    .take(n)
                    .map(|&(id, lp)| {
                        let token = self.name(id);
                        ChatTopLogprob {
                            bytes: token.as_bytes().to_vec(),
                            token,
                            logprob: finite(lp),
                        }
                    })
                    .collect();
                self.chat.push(ChatTokenLogprob {
                    bytes: token.as_bytes().to_vec(),
                    token,
                    logprob: finite(t.logprob),
                    top_logprobs,
                });
            }
        }
    }

    /// The entries gathered since the last call, in the route's shape;
    /// `None` when the request asked for none.
    pub fn take(&mut self) -> Option<Logprobs> {
        if !self.asked.any() {
            return None;
        }
        Some(match self.route {
            Route::Completion => Logprobs::Completion(std::mem::take(&mut self.completion)),
            Route::Chat => Logprobs::Chat(ChatLogprobs {
                content: std::mem::take(&mut self.chat),
            }),
        })
    }

    /// Like [`take`](Self::take), but `None` also when no entry was
    /// gathered since the last call (a stream's chunk without tokens).
    pub fn take_nonempty(&mut self) -> Option<Logprobs> {
        let empty = match self.route {
            Route::Completion => self.completion.tokens.is_empty(),
            Route::Chat => self.chat.is_empty(),
        };
        if empty { None } else { self.take() }
    }

    /// vLLM's `prompt_logprobs` gathered since the last call; `None` when
    /// not asked for.
    pub fn take_prompt(&mut self) -> Option<PromptLogprobs> {
        self.asked.prompt.map(|_| std::mem::take(&mut self.prompt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u32, logprob: f32, rank: usize, top: &[(u32, f32)]) -> TokenLogprob {
        TokenLogprob {
            id,
            logprob,
            rank,
            top: top.to_vec(),
        }
    }

    #[test]
    fn echo_entries_start_with_null_and_offsets_count_characters() {
        let asked = LogprobsAsked {
            sampled: Some(1),
            echo: Some(1),
            prompt: Some(1),
        };
        let mut c = ChoiceLogprobs::new(Route::Completion, asked, None, Some(5));
        c.on_prompt(&t(6, -1.0, 2, &[(7, -0.5)]));
        c.on_token(&t(7, -0.5, 1, &[(7, -0.5)]));
        let Some(Logprobs::Completion(lp)) = c.take() else {
            panic!("completion shape")
        };
        assert_eq!(lp.tokens, ["token_id:5", "token_id:6", "token_id:7"]);
        assert_eq!(lp.token_logprobs, [None, Some(-1.0), Some(-0.5)]);
        assert_eq!(lp.text_offset, [0, 10, 20]);
        assert_eq!(lp.top_logprobs[0], None);
        assert_eq!(
            lp.top_logprobs[1],
            Some(OrderedMap(vec![("token_id:7".into(), -0.5)]))
        );
        let prompt = c.take_prompt().unwrap();
        assert_eq!(prompt.len(), 2);
        assert!(prompt[0].is_none());
        let entries = &prompt[1].as_ref().unwrap().0;
        assert_eq!(entries[0].0, "6");
        assert_eq!(entries[0].1.rank, 2);
        assert_eq!(entries[1].0, "7");
        assert_eq!(entries[1].1.rank, 1);
        // Taken: the next chunk starts empty, offsets go on.
        c.on_token(&t(8, f32::NEG_INFINITY, 3, &[]));
        let Some(Logprobs::Completion(lp)) = c.take() else {
            panic!("completion shape")
        };
        assert_eq!(lp.text_offset, [30]);
        assert_eq!(lp.token_logprobs, [Some(NEG_INFINITY_LOGPROB)]);
    }

    #[test]
    fn nothing_asked_gives_null() {
        let mut c = ChoiceLogprobs::new(Route::Chat, LogprobsAsked::default(), None, Some(1));
        c.on_token(&t(1, -1.0, 1, &[]));
        assert!(c.take().is_none());
        assert!(c.take_prompt().is_none());
    }
}
