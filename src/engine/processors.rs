//! The logits processors of one request: what changes a row of logits
//! before a token is drawn from it.
//!
//! Applied in vLLM's order, each a function of the request's own logits,
//! prompt and output so far (so a request's tokens are the same alone or in
//! a batch):
//!
//! 1. the grammar's mask (structured outputs): disallowed tokens → -inf;
//! 2. `logit_bias`: added to the listed tokens;
//! 3. `min_tokens`: end-of-sequence and `stop_token_ids` → -inf until that
//!    many tokens were generated;
//! 4. `repetition_penalty` (transformers / vLLM) over every token of the
//!    prompt and the output: a positive logit is divided by it, a negative
//!    one multiplied;
//! 5. `frequency_penalty` and `presence_penalty` (OpenAI) over the output:
//!    `logit -= frequency × count + presence × (count > 0)`;
//! 6. `min_p` (after temperature, as vLLM): tokens whose probability is
//!    below `min_p ×` the most likely one's → -inf. With temperature `T`,
//!    `p_i / p_max = exp((l_i - l_max) / T)`, so that is the logit cut
//!    `l_i < l_max + T ln(min_p)`, applied here on the logits; the sampler
//!    then divides by `T` and applies top-k and top-p.
//!
//! Cost: one copy of the row, then work only on the tokens named: the bias
//! entries, the end tokens, and the tokens seen (a count map of the
//! output, a set of the prompt's distinct ids), never an O(V) pass per
//! penalty. `min_p` is one more pass.

use std::collections::{HashMap, HashSet};

/// The request fields the processors read (from the engine's
/// `SamplingParams`, which this module does not depend on).
pub struct ProcessorSettings<'a> {
    pub logit_bias: &'a [(u32, f32)],
    pub stop_token_ids: &'a [u32],
    pub min_tokens: usize,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub min_p: f32,
    pub temperature: f32,
}

/// The processors' state for one request.
#[derive(Clone, Debug, Default)]
pub struct LogitProcessors {
    /// `(token, bias)`, as given.
    bias: Vec<(u32, f32)>,
    /// End-of-sequence and stop ids, masked while fewer than `min_tokens`
    /// tokens were generated.
    end_tokens: Vec<u32>,
    min_tokens: usize,
    repetition_penalty: f32,
    frequency_penalty: f32,
    presence_penalty: f32,
    min_p: f32,
    temperature: f32,
    /// Distinct prompt ids (only kept when `repetition_penalty` is set).
    prompt_ids: HashSet<u32>,
    /// How often each token was generated (only kept when a penalty is set).
    output_counts: HashMap<u32, u32>,
    /// Tokens generated so far.
    generated: usize,
}

impl LogitProcessors {
    /// `eos` is the model's end-of-sequence ids (for `min_tokens`).
    pub fn new(params: ProcessorSettings<'_>, prompt: &[u32], eos: &[u32]) -> LogitProcessors {
        let repetition = params.repetition_penalty != 1.0;
        let mut end_tokens: Vec<u32> = eos.iter().chain(params.stop_token_ids).copied().collect();
        end_tokens.sort_unstable();
        end_tokens.dedup();
        LogitProcessors {
            bias: params.logit_bias.to_vec(),
            end_tokens,
            min_tokens: params.min_tokens,
            repetition_penalty: params.repetition_penalty,
            frequency_penalty: params.frequency_penalty,
            presence_penalty: params.presence_penalty,
            min_p: params.min_p,
            temperature: params.temperature,
            prompt_ids: if repetition {
                prompt.iter().copied().collect()
            } else {
                HashSet::new()
            },
            output_counts: HashMap::new(),
            generated: 0,
        }
    }

    fn penalizes(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
    }

    /// Whether [`apply`](Self::apply) would change anything now (when not,
    /// the sampler reads the model's row without copying it).
    pub fn is_active(&self) -> bool {
        !self.bias.is_empty()
            || (self.generated < self.min_tokens && !self.end_tokens.is_empty())
            || self.penalizes()
            || (self.min_p > 0.0 && self.temperature > 0.0)
    }

    /// Applies steps 2 to 6 (the grammar's mask is the sampler's) to `logits`.
    pub fn apply(&self, logits: &mut [f32]) {
        let vocab = logits.len();
        for &(id, bias) in &self.bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if self.generated < self.min_tokens {
            for &id in &self.end_tokens {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        if self.repetition_penalty != 1.0 {
            let seen_in_output = self
                .output_counts
                .keys()
                .filter(|id| !self.prompt_ids.contains(id));
            for &id in self.prompt_ids.iter().chain(seen_in_output) {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / self.repetition_penalty
                    } else {
                        *l * self.repetition_penalty
                    };
                }
            }
        }
        if self.frequency_penalty != 0.0 || self.presence_penalty != 0.0 {
            for (&id, &count) in &self.output_counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= self.frequency_penalty * count as f32 + self.presence_penalty;
                }
            }
        }
        if self.min_p > 0.0 && self.temperature > 0.0 && vocab > 0 {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let cut = max + self.temperature * self.min_p.ln();
            for l in logits.iter_mut() {
                if *l < cut {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Counts a generated token.
    pub fn record(&mut self, token: u32) {
        self.generated += 1;
        if self.penalizes() {
            *self.output_counts.entry(token).or_insert(0) += 1;
        }
    }
}
