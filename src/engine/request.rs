//! What a client asks for, in tokens, and the events the engine answers
//! with.

use serde::Serialize;

use super::logprobs::{LogprobRequest, TokenLogprob};
use super::sampling::SamplingParams;

/// Engine-wide id of a request.
pub type SeqId = u64;

/// What a client asks for, in tokens. [`Request::new`] gives the defaults of
/// the OpenAI routes; the `with_*` methods change one setting each.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Also report the logits of every prompt position (`generate --logits-out`).
    pub prompt_logits: bool,
    /// Keep generating past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
    /// Log-probabilities to report, of sampled and of prompt tokens.
    pub logprobs: LogprobRequest,
    /// Leave special tokens out of the text (they are then reported apart,
    /// in [`Event::Token`]'s `hidden`); the OpenAI routes' default.
    pub skip_special_tokens: bool,
    /// Prefix-cache salt (vLLM's `cache_salt`): requests with different
    /// salts never share cached KV blocks; `None` shares with every other
    /// unsalted request.
    pub cache_salt: Option<String>,
}

impl Request {
    /// `prompt` sampled with `params`: no prompt logits or log-probabilities,
    /// stopping at end-of-sequence, special tokens left out of the text, no
    /// cache salt.
    pub fn new(prompt: Vec<u32>, params: SamplingParams) -> Request {
        Request {
            prompt,
            params,
            prompt_logits: false,
            ignore_eos: false,
            logprobs: LogprobRequest::default(),
            skip_special_tokens: true,
            cache_salt: None,
        }
    }

    /// Reports the logits of every prompt position too.
    pub fn with_prompt_logits(mut self, on: bool) -> Request {
        self.prompt_logits = on;
        self
    }

    /// Keeps generating past end-of-sequence tokens.
    pub fn with_ignore_eos(mut self, on: bool) -> Request {
        self.ignore_eos = on;
        self
    }

    pub fn with_logprobs(mut self, logprobs: LogprobRequest) -> Request {
        self.logprobs = logprobs;
        self
    }

    pub fn with_skip_special_tokens(mut self, on: bool) -> Request {
        self.skip_special_tokens = on;
        self
    }

    pub fn with_cache_salt(mut self, salt: Option<String>) -> Request {
        self.cache_salt = salt;
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End-of-sequence token, a stop token or string, or the end of the
    /// grammar the output follows.
    Stop,
    /// `max_tokens` or `max_model_len` reached.
    Length,
    /// The client went away or the request was cancelled.
    Aborted,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Aborted => "abort",
        }
    }
}

/// What the engine reports about a request, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A sampled token and the text it completes; `text` may be empty while
    /// a partial character or a possible stop string is held back. With
    /// `logprob` when the request asked for sampled tokens' log-probabilities.
    /// `hidden` is the token's own text when it is a special token left out
    /// of `text` (`skip_special_tokens`): output parsers read it, clients do not.
    Token {
        id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
        hidden: Option<String>,
    },
    /// The log-probability of prompt token `logprob.id` at `position` (1 or
    /// more: the first prompt token has no context), given the tokens
    /// before it. Sent in position order, each once, before any `Token`.
    PromptLogprob {
        position: usize,
        logprob: TokenLogprob,
    },
    /// Logits of prompt positions `first..first + values.len() / vocab`.
    PromptLogits { first: usize, values: Vec<f32> },
    /// The request ended; held-back text, if any, is in `text`. When it
    /// ended on an end-of-sequence token (which has no text and no `Token`
    /// event) and sampled log-probabilities were asked for, that token's
    /// are in `stop_logprob`.
    Finished {
        reason: FinishReason,
        text: String,
        stop_logprob: Option<TokenLogprob>,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Prompt tokens whose keys and values came from the prefix cache
        /// when the sequence first started (not recomputed).
        cached_tokens: usize,
    },
    /// The request failed inside the engine.
    Failed { message: String },
}

/// Where a request's events go. `send` returns false once nobody listens,
/// and the engine then frees the sequence at its next step.
pub trait EventSink: Send {
    fn send(&mut self, event: Event) -> bool;
    fn is_closed(&self) -> bool {
        false
    }
    /// The sequence is in a step for the first time (its queue time ends):
    /// for timing sinks, called once.
    fn scheduled(&mut self) {}
}

impl EventSink for std::sync::mpsc::Sender<Event> {
    fn send(&mut self, event: Event) -> bool {
        std::sync::mpsc::Sender::send(self, event).is_ok()
    }
}

impl EventSink for tokio::sync::mpsc::UnboundedSender<Event> {
    fn send(&mut self, event: Event) -> bool {
        tokio::sync::mpsc::UnboundedSender::send(self, event).is_ok()
    }
    fn is_closed(&self) -> bool {
        tokio::sync::mpsc::UnboundedSender::is_closed(self)
    }
}
