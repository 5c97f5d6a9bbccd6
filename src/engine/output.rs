//! The output stage: a step's logits rows into what the clients see.
//! Prompt logits and prompt log-probabilities are reported, the next token
//! of each sampling row is drawn (under its grammar mask), appended and
//! checked against end-of-sequence, stop tokens, stop strings, the grammar's
//! end and the length limits, and its text and log-probabilities are sent.
//! Forked choices draw their first token from their leader's row.
//!
//! A chunk with draft tokens (speculative decoding) has a sampling row for
//! its known token and a verify row for each draft: each row is sampled in
//! turn, exactly as that position would be without drafts (its grammar
//! mask computed then, from the tokens kept so far), and the next row is
//! used only while the token drawn equals the draft the row was computed
//! with (`drafts`).
//!
//! The grammar masks of the constrained sequences that sample in a step
//! depend only on the tokens so far, so they are computed on another thread
//! while the forward pass runs; a row waits for them only when it needs one.

use std::sync::Arc;
use std::thread::{Scope, ScopedJoinHandle};

use rayon::prelude::*;

use super::grammar::{Constraint, GrammarError, TokenMask};
use super::logprobs::{TokenLogprob, token_logprob};
use super::request::{Event, FinishReason};
use super::sampling::{SamplingError, SamplingWorkspace};
use super::sequence::Sequence;
use super::step_plan::{RowRole, StepPlan};
use crate::model::ModelError;
use crate::text::Tokenizer;

/// Feeds a step's logits to the output stage: `(first, values)` holds rows
/// `first..` of the plan's logits rows, `vocab` values each.
pub type LogitsSink<'a> = dyn FnMut(usize, &[f32]) + 'a;

/// What the output stage did in one step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepOutcome {
    /// Sequences that sampled a token (forked choices included).
    pub sampled: usize,
    /// A sampling failure no request's settings explain: every running
    /// sequence is to fail with it.
    pub failure: Option<String>,
}

pub(crate) struct OutputStage {
    vocab: usize,
    sampling: SamplingWorkspace,
    tokenizer: Option<Arc<Tokenizer>>,
    eos: Vec<u32>,
    max_model_len: usize,
}

impl OutputStage {
    pub fn new(
        vocab: usize,
        tokenizer: Option<Arc<Tokenizer>>,
        eos: Vec<u32>,
        max_model_len: usize,
    ) -> OutputStage {
        OutputStage {
            vocab,
            sampling: SamplingWorkspace::new(vocab),
            tokenizer,
            eos,
            max_model_len,
        }
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_deref()
    }

    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// Runs one step's output: `execute` is handed the sink its logits rows
    /// go to, in order (the forward pass); the grammar masks are computed
    /// beside it. Returns `execute`'s error, if any, after every grammar
    /// constraint is back with its sequence.
    pub fn process(
        &mut self,
        plan: &StepPlan,
        running: &mut [Sequence],
        execute: impl FnOnce(&mut LogitsSink<'_>) -> Result<(), ModelError>,
    ) -> Result<StepOutcome, ModelError> {
        let to_mask: Vec<(usize, Constraint)> = plan
            .logit_rows
            .iter()
            .filter(|row| row.role == RowRole::Sample)
            .filter_map(|row| Some((row.seq, running[row.seq].constraint.take()?)))
            .collect();
        std::thread::scope(|scope| {
            let mut rows = StepRows {
                stage: self,
                plan,
                running,
                masks: Masks::spawn(scope, to_mask),
                outcome: StepOutcome::default(),
            };
            let forward = execute(&mut |first, values| rows.consume(first, values));
            rows.masks.restore(rows.running);
            forward.map(|()| rows.outcome)
        })
    }

    /// The `Finished` event of a sequence leaving the engine.
    pub fn finish(&self, mut seq: Sequence) {
        let reason = seq.finished.unwrap_or(FinishReason::Aborted);
        let text = match (&mut seq.text, &self.tokenizer) {
            (Some(text), Some(tokenizer)) if reason != FinishReason::Aborted => {
                text.finish(tokenizer).unwrap_or_default()
            }
            _ => String::new(),
        };
        let completion_tokens = seq.generated();
        seq.sink.send(Event::Finished {
            reason,
            text,
            stop_logprob: seq.stop_logprob.take(),
            prompt_tokens: seq.prompt_len,
            completion_tokens,
            cached_tokens: seq.cached_tokens.unwrap_or(0),
        });
    }

    /// Samples `seq`'s next token from its logits `row` (only `allowed` ids,
    /// when given) and appends it.
    fn sample_into(
        &mut self,
        seq: &mut Sequence,
        row: &[f32],
        allowed: Option<&[u32]>,
    ) -> Result<(), SamplingError> {
        let token = seq
            .sampler
            .sample_masked(row, allowed, &mut self.sampling)?;
        // From the raw row, before any processing (vLLM's default).
        let logprob = seq.logprobs.sampled.map(|n| token_logprob(row, token, n));
        accept_token(
            seq,
            token,
            logprob,
            self.tokenizer.as_deref(),
            &self.eos,
            self.max_model_len,
        );
        Ok(())
    }
}

/// One step's logits rows as they arrive.
struct StepRows<'a, 'scope> {
    stage: &'a mut OutputStage,
    plan: &'a StepPlan,
    running: &'a mut [Sequence],
    masks: Masks<'scope>,
    outcome: StepOutcome,
}

impl StepRows<'_, '_> {
    /// Rows `first..` of the plan's logits rows.
    fn consume(&mut self, first: usize, values: &[f32]) {
        let vocab = self.stage.vocab;
        for (offset, logits) in values.chunks_exact(vocab).enumerate() {
            let Some(&row) = self.plan.logit_rows.get(first + offset) else {
                break;
            };
            let seq = &mut self.running[row.seq];
            if seq.prompt_logits && row.position < seq.prompt_len {
                seq.sink.send(Event::PromptLogits {
                    first: row.position,
                    values: logits.to_vec(),
                });
            }
            report_prompt_logprob(seq, row.position, logits);
            if row.role == RowRole::Verify {
                self.verify(row.seq, logits);
                continue;
            }
            if row.role == RowRole::Sample {
                let before = self.running[row.seq].tokens.len();
                self.sample(row.seq, logits);
                settle_draft(&mut self.running[row.seq], before);
                for fork in self.plan.forks_of(row.seq) {
                    let choice = &mut self.running[fork.choice];
                    match self.stage.sample_into(choice, logits, None) {
                        Ok(()) => self.outcome.sampled += 1,
                        Err(e) => choice.fail(&format!("sampling failed: {e}")),
                    }
                }
            }
        }
    }

    /// A verify row of running sequence `index`: sampled, under a grammar
    /// mask computed now, while every earlier draft of its chunk was kept.
    fn verify(&mut self, index: usize, logits: &[f32]) {
        let seq = &mut self.running[index];
        if !seq.drafts.open || seq.finished.is_some() {
            return;
        }
        let before = seq.tokens.len();
        let mask = match seq.constraint.as_mut().map(|c| c.mask()) {
            None => None,
            Some(Ok(bits)) => Some(bits),
            Some(Err(e)) => return seq.fail(&format!("structured output: {e}")),
        };
        match self.stage.sample_into(seq, logits, mask.as_deref()) {
            Ok(()) => self.outcome.sampled += 1,
            Err(SamplingError::AllTokensMasked) if mask.is_some() => {
                seq.fail("sampling failed: the grammar and min_tokens leave no token")
            }
            Err(e) => self.outcome.failure = Some(format!("sampling failed: {e}")),
        }
        settle_draft(seq, before);
    }

    /// Samples running sequence `index`'s next token from `logits`, under
    /// its grammar mask if it has one.
    fn sample(&mut self, index: usize, logits: &[f32]) {
        let seq = &mut self.running[index];
        let mut mask = None;
        match self.masks.take(index) {
            MaskFor::Unconstrained => {}
            MaskFor::Ready(constraint, Ok(bits)) => {
                seq.constraint = Some(constraint);
                mask = Some(bits);
            }
            MaskFor::Ready(_, Err(e)) => return seq.fail(&format!("structured output: {e}")),
            MaskFor::Missing => {
                return seq.fail("structured output: the mask was not computed");
            }
        }
        match self.stage.sample_into(seq, logits, mask.as_deref()) {
            Ok(()) => self.outcome.sampled += 1,
            // The request's own settings left nothing to choose (a grammar
            // and `min_tokens` at odds): it alone fails.
            Err(SamplingError::AllTokensMasked) if mask.is_some() => {
                seq.fail("sampling failed: the grammar and min_tokens leave no token")
            }
            Err(e) => self.outcome.failure = Some(format!("sampling failed: {e}")),
        }
    }
}

type Masked = (usize, Constraint, Result<TokenMask, GrammarError>);

/// The grammar masks of one step, computed on a scoped thread.
struct Masks<'scope> {
    /// Running indices of the constrained sequences.
    constrained: Vec<usize>,
    handle: Option<ScopedJoinHandle<'scope, Vec<Masked>>>,
    /// By running index, once joined.
    ready: Vec<Option<(Constraint, Result<TokenMask, GrammarError>)>>,
}

// Moved once per constrained row: boxing the big variant would buy nothing.
#[allow(clippy::large_enum_variant)]
enum MaskFor {
    Unconstrained,
    Ready(Constraint, Result<TokenMask, GrammarError>),
    /// The thread computing it went away (it panicked).
    Missing,
}

impl<'scope> Masks<'scope> {
    fn spawn<'env>(scope: &'scope Scope<'scope, 'env>, to_mask: Vec<(usize, Constraint)>) -> Self {
        let constrained = to_mask.iter().map(|&(index, _)| index).collect();
        let handle = (!to_mask.is_empty()).then(|| {
            scope.spawn(move || {
                to_mask
                    .into_par_iter()
                    .map(|(index, mut constraint)| {
                        let mask = constraint.mask();
                        (index, constraint, mask)
                    })
                    .collect::<Vec<_>>()
            })
        });
        Masks {
            constrained,
            handle,
            ready: Vec::new(),
        }
    }

    fn join(&mut self) {
        if let Some(handle) = self.handle.take() {
            let len = self.constrained.iter().max().map_or(0, |&i| i + 1);
            self.ready.resize_with(len, || None);
            for (index, constraint, mask) in handle.join().unwrap_or_default() {
                self.ready[index] = Some((constraint, mask));
            }
        }
    }

    fn take(&mut self, index: usize) -> MaskFor {
        if !self.constrained.contains(&index) {
            return MaskFor::Unconstrained;
        }
        self.join();
        match self.ready.get_mut(index).and_then(Option::take) {
            Some((constraint, mask)) => MaskFor::Ready(constraint, mask),
            None => MaskFor::Missing,
        }
    }

    /// Gives the constraints of rows that were not reached (a forward pass
    /// that failed) back to their sequences.
    fn restore(&mut self, running: &mut [Sequence]) {
        self.join();
        for (index, slot) in self.ready.iter_mut().enumerate() {
            if let Some((constraint, _)) = slot.take() {
                running[index].constraint = Some(constraint);
            }
        }
    }
}

/// After a row of `seq` was sampled (it had `before` tokens): whether its
/// chunk's next verify row is still to be used.
fn settle_draft(seq: &mut Sequence, before: usize) {
    if !seq.drafts.open {
        return;
    }
    match seq.tokens.get(before) {
        Some(&token) if seq.tokens.len() == before + 1 => {
            seq.drafts.settle(token, seq.finished.is_some())
        }
        // Nothing was appended (sampling failed).
        _ => seq.drafts.open = false,
    }
}

/// Reports the log-probability of the prompt token after `position`, whose
/// logits `row` holds, if the request asked for it and it was not reported
/// before: the row is reduced here and nothing of it is kept.
fn report_prompt_logprob(seq: &mut Sequence, position: usize, row: &[f32]) {
    let Some(n) = seq.logprobs.prompt else {
        return;
    };
    let next = position + 1;
    if next < seq.prompt_len && next == seq.prompt_logprobs_next {
        let logprob = token_logprob(row, seq.tokens[next], n);
        seq.prompt_logprobs_next = next + 1;
        seq.sink.send(Event::PromptLogprob {
            position: next,
            logprob,
        });
    }
}

/// Appends a sampled token, emits its text, and decides whether the
/// sequence is done.
fn accept_token(
    seq: &mut Sequence,
    token: u32,
    logprob: Option<TokenLogprob>,
    tokenizer: Option<&Tokenizer>,
    eos: &[u32],
    max_model_len: usize,
) {
    seq.tokens.push(token);
    let stop_token = seq.params.stop_token_ids.contains(&token);
    if (!seq.ignore_eos && eos.contains(&token)) || stop_token {
        seq.stop_logprob = logprob;
        // The token that ended the text is not part of it, unless asked for.
        if stop_token && seq.params.include_stop_str_in_output {
            let (text, hidden, _) = match (&mut seq.text, tokenizer) {
                (Some(state), Some(t)) => state.push(t, token).unwrap_or_default(),
                _ => (String::new(), None, false),
            };
            seq.sink.send(Event::Token {
                id: token,
                text,
                logprob: seq.stop_logprob.take(),
                hidden,
            });
        }
        seq.finished = Some(FinishReason::Stop);
        return;
    }
    let mut grammar_done = false;
    if let Some(constraint) = &mut seq.constraint {
        if let Err(e) = constraint.consume(token) {
            seq.fail(&format!("structured output: {e}"));
            return;
        }
        grammar_done = constraint.is_finished();
    }
    let (text, hidden, stopped) = match (&mut seq.text, tokenizer) {
        (Some(state), Some(t)) => state.push(t, token).unwrap_or_default(),
        _ => (String::new(), None, false),
    };
    if !seq.sink.send(Event::Token {
        id: token,
        text,
        logprob,
        hidden,
    }) {
        seq.finished = Some(FinishReason::Aborted);
    } else if stopped || grammar_done {
        seq.finished = Some(FinishReason::Stop);
    } else if seq.generated() >= seq.params.max_tokens || seq.tokens.len() >= max_model_len {
        seq.finished = Some(FinishReason::Length);
    }
}
