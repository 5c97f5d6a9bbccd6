//! A running sequence's state: its tokens, how far they are computed, its
//! sampler and grammar, its text and where its events go.

use super::drafts::Drafts;
use super::grammar::Constraint;
use super::kv_blocks::{BlockHash, root_hash};
use super::logprobs::{LogprobRequest, TokenLogprob};
use super::request::{Event, EventSink, FinishReason, Request, SeqId};
use super::sampling::{Sampler, SamplingError, SamplingParams};
use crate::text::{StopMatcher, StopStep, StreamDecoder, TextError, Tokenizer};

/// Text side of a sequence: incremental detokenizing and stop strings.
pub(crate) struct TextState {
    decoder: StreamDecoder,
    stops: StopMatcher,
}

impl TextState {
    pub(crate) fn new(params: &SamplingParams, skip_special_tokens: bool) -> TextState {
        TextState {
            decoder: StreamDecoder::new(skip_special_tokens),
            stops: StopMatcher::new(params.stop.iter().cloned())
                .with_stop_in_output(params.include_stop_str_in_output)
                .with_kept_stops(params.stop.len(), params.end_after.iter().cloned()),
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
    /// Its slot in the recurrent-state pool while it holds blocks (models
    /// with recurrent state).
    pub state_slot: Option<u32>,
    /// Its rolling recurrent-state snapshot: the state at the last block
    /// boundary it decoded past, in a held snapshot slot, registered when
    /// it finishes (the next turn of a conversation starts there).
    pub rolling: Option<Rolling>,
    /// Its draft tokens in the current step (speculative decoding).
    pub drafts: Drafts,
}

/// A sequence's own snapshot slot and the position its state is at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rolling {
    pub position: usize,
    pub slot: u32,
}

impl Sequence {
    /// A new sequence for `request` (already validated by the engine), its
    /// events going to `sink`; `eos` are the end-of-sequence ids the sampler
    /// keeps out before `min_tokens`.
    pub fn new(
        id: SeqId,
        mut request: Request,
        sink: Box<dyn EventSink>,
        tokenizer: Option<&Tokenizer>,
        eos: &[u32],
    ) -> Result<Sequence, SamplingError> {
        let sampler = Sampler::for_prompt(&request.params, &request.prompt, eos)?;
        let constraint = request.params.constraint.take();
        let text = tokenizer.map(|_| TextState::new(&request.params, request.skip_special_tokens));
        Ok(Sequence {
            id,
            prompt_len: request.prompt.len(),
            tokens: request.prompt,
            computed: 0,
            prompt_counted: 0,
            sampler,
            params: request.params,
            constraint,
            prompt_logits: request.prompt_logits,
            ignore_eos: request.ignore_eos,
            logprobs: request.logprobs,
            prompt_logprobs_next: 1,
            stop_logprob: None,
            sink,
            text,
            finished: None,
            scheduled_reported: false,
            salt_root: root_hash(request.cache_salt.as_deref()),
            cached_tokens: None,
            follows: None,
            has_followers: false,
            state_slot: None,
            rolling: None,
            drafts: Drafts::default(),
        })
    }

    /// Ends the sequence with a failure (the others go on); it leaves at the
    /// next step.
    pub fn fail(&mut self, message: &str) {
        self.sink.send(Event::Failed {
            message: message.to_string(),
        });
        self.finished = Some(FinishReason::Aborted);
    }

    /// Tells the sink the sequence is in a step, the first time only.
    pub fn report_scheduled(&mut self) {
        if !std::mem::replace(&mut self.scheduled_reported, true) {
            self.sink.scheduled();
        }
    }

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
