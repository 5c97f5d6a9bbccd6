//! Requests, the events they produce, and a running sequence's state.

use serde::Serialize;

use super::grammar::Constraint;
use super::kv_blocks::BlockHash;
use super::logprobs::{LogprobRequest, TokenLogprob};
use super::sampling::{Sampler, SamplingParams};
use crate::text::{StopMatcher, StopStep, StreamDecoder, TextError, Tokenizer};

/// Engine-wide id of a request.
pub type SeqId = u64;

/// What a client asks for, in tokens.
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

/// Text side of a sequence: incremental detokenizing and stop strings.
pub(crate) struct TextState {
    decoder: StreamDecoder,
    stops: StopMatcher,
}

impl TextState {
    pub(crate) fn new(
        tokenizer: &Tokenizer,
        params: &SamplingParams,
        skip_special_tokens: bool,
    ) -> TextState {
        TextState {
            decoder: tokenizer.stream_decoder(skip_special_tokens),
            stops: StopMatcher::new(params.stop.iter().cloned())
                .with_stop_in_output(params.include_stop_str_in_output),
        }
    }

    /// The text to emit for `id`, the special token's text left out of it
    /// (if so), and whether a stop string completed.
    pub(crate) fn push(
        &mut self,
        tokenizer: &Tokenizer,
        id: u32,
    ) -> Result<(String, Option<String>, bool), TextError> {
        let piece = self.decoder.push(tokenizer, id)?;
        Ok(match self.stops.push(&piece.text) {
            StopStep::Continue { emit } => (emit, piece.hidden, false),
            // The token comes after the stop string: nothing of it is sent.
            StopStep::Stopped { emit, .. } => (emit, None, true),
        })
    }

    /// Whatever is still held back, at the end of the sequence.
    pub(crate) fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, TextError> {
        let rest = self.decoder.finish(tokenizer)?;
        let mut text = match self.stops.push(&rest) {
            StopStep::Continue { emit } => emit,
            StopStep::Stopped { emit, .. } => return Ok(emit),
        };
        text.push_str(&self.stops.finish());
        Ok(text)
    }
}

/// A request being served.
pub(crate) struct Sequence {
    pub id: SeqId,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose keys and values are in the cache.
    pub computed: usize,
    /// Prompt tokens counted in the engine's counters (they count once,
    /// however often a preempted sequence is recomputed).
    pub prompt_counted: usize,
    pub sampler: Sampler,
    pub params: SamplingParams,
    /// The grammar the output follows (taken out of `params`), if any.
    pub constraint: Option<Constraint>,
    pub prompt_logits: bool,
    pub ignore_eos: bool,
    pub logprobs: LogprobRequest,
    /// The next prompt position whose log-probability is to be reported
    /// (each once, even when a preempted sequence is recomputed).
    pub prompt_logprobs_next: usize,
    /// The log-probabilities of the end-of-sequence token that ended it.
    pub stop_logprob: Option<TokenLogprob>,
    pub sink: Box<dyn EventSink>,
    pub text: Option<TextState>,
    /// Set when the sequence is done; it leaves the engine at the next step.
    pub finished: Option<FinishReason>,
    /// Whether its sink was told it is scheduled ([`EventSink::scheduled`]).
    pub scheduled_reported: bool,
    /// Root of its blocks' hash chain (from the request's `cache_salt`).
    pub salt_root: BlockHash,
    /// Prompt tokens served from the prefix cache when it first started.
    pub cached_tokens: Option<usize>,
    /// Another choice of the same request (`n > 1`) that computes the
    /// prompt: this one waits until that one samples, then is forked from
    /// it (or hits the blocks it cached).
    pub follows: Option<SeqId>,
    /// Whether later choices follow this one (it is their leader).
    pub has_followers: bool,
}

impl Sequence {
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Whether prompt log-probabilities are still to be reported.
    pub fn wants_prompt_logprobs(&self) -> bool {
        self.logprobs.prompt.is_some() && self.prompt_logprobs_next < self.prompt_len
    }

    /// Tokens still to run through the model before the next sample.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }
}
