//! Choosing the next token from a row of logits.
//!
//! First the request's logits processors ([`super::processors`]: the
//! grammar's mask, `logit_bias`, `min_tokens`, the penalties, `min_p`, in
//! vLLM's order) rewrite a copy of the row; a request that sets none of
//! them reads the model's row directly. Then: greedy when
//! `temperature == 0` (argmax, lowest id on ties); otherwise the logits are
//! divided by the temperature, cut to the `top_k` most likely tokens, cut
//! again to the smallest set of those whose probability reaches `top_p`
//! (nucleus), and one token is drawn from what is left (the order
//! transformers and vLLM apply them in).
//!
//! Tokens are ranked by (logit descending, id ascending), a total order, so
//! both cuts keep exactly the tokens ranked at or above one *threshold*
//! token. The draw then scans the row in id order, adding the weights of the
//! kept tokens. The result depends only on the row, the parameters and the
//! random number, not on how the threshold was found.
//!
//! Reproducibility: each request owns its random generator, seeded from its
//! `seed`, and each sampled token consumes exactly one draw, so a request's
//! tokens depend only on its own logits, prompt, output and seed, never on
//! which other requests share its batch.
//!
//! Cost, with V ≈ 152k: a few O(V) passes and no O(V log V) sort. Top-k is
//! one `select_nth_unstable` (and then only k exponentials); top-p first
//! drops the tokens too light to matter, then finds its threshold by a
//! weighted quickselect over what is left (`nucleus_threshold`).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::SystemTime;

use super::grammar::Constraint;
use super::processors::{LogitProcessors, ProcessorSettings};
use crate::util::rng::SplitMix64;

/// Where the nucleus search splits the candidates first (see
/// [`nucleus_threshold`]).
const FIRST_NUCLEUS_GUESS: usize = 64;

/// Per-request sampling settings (the OpenAI request fields).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy; otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens; `None` keeps all.
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches `top_p`;
    /// 1.0 keeps all.
    pub top_p: f32,
    /// Seed of the request's random generator; `None` picks a fresh one.
    pub seed: Option<u64>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation ends before any of these strings.
    pub stop: Vec<String>,
    /// Strings after which the sequence ends, kept in the output: the
    /// server's own (the closing marker of the one tool call
    /// `parallel_tool_calls: false` allows), never a request field.
    pub end_after: Vec<String>,
    /// Also emit the stop string (or stop token's text) that ended the text.
    pub include_stop_str_in_output: bool,
    /// Generation ends at any of these token ids (besides end-of-sequence).
    pub stop_token_ids: Vec<u32>,
    /// End-of-sequence and `stop_token_ids` are masked until this many
    /// tokens were generated.
    pub min_tokens: usize,
    /// OpenAI's: subtracted once from every token the output holds; in [-2, 2].
    pub presence_penalty: f32,
    /// OpenAI's: subtracted per occurrence in the output; in [-2, 2].
    pub frequency_penalty: f32,
    /// transformers' and vLLM's, over prompt and output: positive logits are
    /// divided by it, negative ones multiplied; > 0, 1 is off.
    pub repetition_penalty: f32,
    /// Drop tokens whose probability is below `min_p ×` the top one's; in
    /// [0, 1], 0 is off.
    pub min_p: f32,
    /// `(token id, bias)` added to the logits; biases in [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
    /// A grammar the output must follow (structured outputs).
    pub constraint: Option<Constraint>,
}

/// OpenAI's bounds of the two penalties.
pub const PENALTY_RANGE: (f32, f32) = (-2.0, 2.0);
/// OpenAI's bound of a logit bias.
pub const LOGIT_BIAS_RANGE: (f32, f32) = (-100.0, 100.0);
/// OpenAI's highest temperature (the server's bound; the engine takes any).
pub const MAX_TEMPERATURE: f32 = 2.0;

impl Default for SamplingParams {
    /// OpenAI's defaults: temperature 1, no cuts, 16 tokens.
    fn default() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
            seed: None,
            max_tokens: 16,
            stop: Vec::new(),
            end_after: Vec::new(),
            include_stop_str_in_output: false,
            stop_token_ids: Vec::new(),
            min_tokens: 0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            min_p: 0.0,
            logit_bias: Vec::new(),
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// The fields the logits processors read.
    fn processor_settings(&self) -> ProcessorSettings<'_> {
        ProcessorSettings {
            logit_bias: &self.logit_bias,
            stop_token_ids: &self.stop_token_ids,
            min_tokens: self.min_tokens,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            min_p: self.min_p,
            temperature: self.temperature,
        }
    }

    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            max_tokens,
            ..SamplingParams::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks every field; the first problem found is returned.
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() {
            return Err(SamplingError::NonFiniteTemperature(self.temperature));
        }
        if self.temperature < 0.0 {
            return Err(SamplingError::NegativeTemperature(self.temperature));
        }
        // Written so that NaN fails too.
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopPOutOfRange(self.top_p));
        }
        if self.top_k == Some(0) {
            return Err(SamplingError::ZeroTopK);
        }
        if self.max_tokens == 0 {
            return Err(SamplingError::ZeroMaxTokens);
        }
        if let Some(index) = self.stop.iter().position(String::is_empty) {
            return Err(SamplingError::EmptyStopString { index });
        }
        let in_range = |v: f32, (low, high): (f32, f32)| v >= low && v <= high;
        for (field, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !in_range(value, PENALTY_RANGE) {
                return Err(SamplingError::PenaltyOutOfRange { field, value });
            }
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(SamplingError::RepetitionPenaltyOutOfRange(
                self.repetition_penalty,
            ));
        }
        if !in_range(self.min_p, (0.0, 1.0)) {
            return Err(SamplingError::MinPOutOfRange(self.min_p));
        }
        if let Some(&(id, bias)) = self
            .logit_bias
            .iter()
            .find(|(_, bias)| !in_range(*bias, LOGIT_BIAS_RANGE))
        {
            return Err(SamplingError::LogitBiasOutOfRange { id, bias });
        }
        if self.min_tokens > self.max_tokens {
            return Err(SamplingError::MinTokensAboveMaxTokens {
                min_tokens: self.min_tokens,
                max_tokens: self.max_tokens,
            });
        }
        Ok(())
    }

    /// Checks the token ids the fields name against the model's vocabulary.
    pub fn validate_ids(&self, vocab: usize) -> Result<(), SamplingError> {
        let outside = |id: &u32| *id as usize >= vocab;
        if let Some(&(id, _)) = self.logit_bias.iter().find(|(id, _)| outside(id)) {
            return Err(SamplingError::TokenOutsideVocab {
                field: "logit_bias",
                id,
                vocab,
            });
        }
        if let Some(&id) = self.stop_token_ids.iter().find(|id| outside(id)) {
            return Err(SamplingError::TokenOutsideVocab {
                field: "stop_token_ids",
                id,
                vocab,
            });
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("temperature must be >= 0, got {0}")]
    NegativeTemperature(f32),
    #[error("temperature must be a finite number, got {0}")]
    NonFiniteTemperature(f32),
    #[error("{field} must be in [-2, 2], got {value}")]
    PenaltyOutOfRange { field: &'static str, value: f32 },
    #[error("repetition_penalty must be a finite number > 0, got {0}")]
    RepetitionPenaltyOutOfRange(f32),
    #[error("min_p must be in [0, 1], got {0}")]
    MinPOutOfRange(f32),
    #[error("logit_bias of token {id} must be in [-100, 100], got {bias}")]
    LogitBiasOutOfRange { id: u32, bias: f32 },
    #[error("min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})")]
    MinTokensAboveMaxTokens {
        min_tokens: usize,
        max_tokens: usize,
    },
    #[error("{field} names token {id}, outside the vocabulary of {vocab} tokens")]
    TokenOutsideVocab {
        field: &'static str,
        id: u32,
        vocab: usize,
    },
    #[error("top_p must be in (0, 1], got {0}")]
    TopPOutOfRange(f32),
    #[error("top_k must be at least 1 (leave it unset to keep every token)")]
    ZeroTopK,
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("stop string {index} is empty")]
    EmptyStopString { index: usize },
    #[error("cannot sample from an empty row of logits")]
    EmptyLogits,
    #[error("logit {index} is {value}: the model produced NaN or +infinity")]
    NonFiniteLogit { index: usize, value: f32 },
    #[error("every logit is -infinity: no token can be chosen")]
    AllTokensMasked,
    #[error("the logits row has {vocab} entries but the sampling workspace holds only {capacity}")]
    WorkspaceTooSmall { vocab: usize, capacity: usize },
}

impl SamplingError {
    /// The request field the error is about, if it is about one.
    pub fn field(&self) -> Option<&'static str> {
        use SamplingError::*;
        Some(match self {
            NegativeTemperature(_) | NonFiniteTemperature(_) => "temperature",
            TopPOutOfRange(_) => "top_p",
            ZeroTopK => "top_k",
            ZeroMaxTokens => "max_tokens",
            EmptyStopString { .. } => "stop",
            PenaltyOutOfRange { field, .. } | TokenOutsideVocab { field, .. } => field,
            RepetitionPenaltyOutOfRange(_) => "repetition_penalty",
            MinPOutOfRange(_) => "min_p",
            LogitBiasOutOfRange { .. } => "logit_bias",
            MinTokensAboveMaxTokens { .. } => "min_tokens",
            EmptyLogits | NonFiniteLogit { .. } | AllTokensMasked | WorkspaceTooSmall { .. } => {
                return None;
            }
        })
    }
}

/// Rank of a vocabulary entry as one integer: a larger key is a more likely
/// token, and among equal logits the lower id has the larger key. Integer
/// comparisons keep the selections fast.
fn rank_key(id: u32, logit: f32) -> u64 {
    // `+ 0.0` turns -0.0 into +0.0, so the two zeros tie as they do for `>`.
    let bits = (logit + 0.0).to_bits();
    // Flip the bits of negatives and set the sign bit of positives: unsigned
    // order of the result is numeric order of the floats.
    let ordered = if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    (u64::from(ordered) << 32) | u64::from(!id)
}

fn key_id(key: u64) -> usize {
    !(key as u32) as usize
}

/// Most likely first.
fn descending(a: &u64, b: &u64) -> std::cmp::Ordering {
    b.cmp(a)
}

/// Scratch space for sampling one row, sized for the vocabulary once and
/// shared by every request of an engine (rows are sampled one at a time), so
/// that sampling allocates nothing per token.
#[derive(Debug)]
pub struct SamplingWorkspace {
    /// The row as the logits processors left it.
    processed: Vec<f32>,
    /// Unnormalised probability of each token, in id order.
    weights: Vec<f32>,
    /// Rank keys of the candidates, reordered by the selections.
    keys: Vec<u64>,
}

impl SamplingWorkspace {
    pub fn new(vocab_size: usize) -> SamplingWorkspace {
        SamplingWorkspace {
            processed: Vec::with_capacity(vocab_size),
            weights: Vec::with_capacity(vocab_size),
            keys: Vec::with_capacity(vocab_size),
        }
    }

    /// Bytes this workspace holds, for the memory ledger.
    pub fn bytes(&self) -> usize {
        (self.weights.capacity() + self.processed.capacity()) * std::mem::size_of::<f32>()
            + self.keys.capacity() * std::mem::size_of::<u64>()
    }

    fn capacity(&self) -> usize {
        self.weights.capacity().min(self.keys.capacity())
    }
}

/// The sampling state of one request.
#[derive(Clone, Debug)]
pub struct Sampler {
    temperature: f32,
    top_k: Option<usize>,
    top_p: f32,
    seed: u64,
    rng: SplitMix64,
    processors: LogitProcessors,
}

impl Sampler {
    /// Validates `params` and seeds the generator (a fresh seed when the
    /// request gives none; [`seed`](Self::seed) tells which). No prompt
    /// (for `repetition_penalty`) and no end-of-sequence ids (for
    /// `min_tokens`): see [`for_prompt`](Self::for_prompt).
    pub fn new(params: &SamplingParams) -> Result<Sampler, SamplingError> {
        Sampler::for_prompt(params, &[], &[])
    }

    /// As [`new`](Self::new), for a request with this prompt on a model with
    /// these end-of-sequence ids.
    pub fn for_prompt(
        params: &SamplingParams,
        prompt: &[u32],
        eos: &[u32],
    ) -> Result<Sampler, SamplingError> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(fresh_seed);
        Ok(Sampler {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            seed,
            rng: SplitMix64::new(seed),
            processors: LogitProcessors::new(params.processor_settings(), prompt, eos),
        })
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Picks the next token from one row of logits.
    pub fn sample(
        &mut self,
        logits: &[f32],
        workspace: &mut SamplingWorkspace,
    ) -> Result<u32, SamplingError> {
        self.sample_masked(logits, None, workspace)
    }

    /// Picks the next token from one row of logits, among the tokens
    /// `allowed` has a bit set for (bit `id % 32` of word `id / 32`; ids
    /// past its end are not allowed) when it is given (a grammar's mask).
    pub fn sample_masked(
        &mut self,
        logits: &[f32],
        allowed: Option<&[u32]>,
        workspace: &mut SamplingWorkspace,
    ) -> Result<u32, SamplingError> {
        if workspace.capacity() < logits.len() {
            return Err(SamplingError::WorkspaceTooSmall {
                vocab: logits.len(),
                capacity: workspace.capacity(),
            });
        }
        let token = if allowed.is_none() && !self.processors.is_active() {
            self.choose(logits, workspace)?
        } else {
            let mut row = std::mem::take(&mut workspace.processed);
            let chosen = self
                .process(logits, allowed, &mut row)
                .and_then(|()| self.choose(&row, workspace));
            workspace.processed = row;
            chosen?
        };
        self.processors.record(token);
        Ok(token)
    }

    /// Copies `logits` into `row` (refusing NaN and +inf) and applies the
    /// mask and the processors to it.
    fn process(
        &self,
        logits: &[f32],
        allowed: Option<&[u32]>,
        row: &mut Vec<f32>,
    ) -> Result<(), SamplingError> {
        if let Some((index, &value)) = logits
            .iter()
            .enumerate()
            .find(|(_, v)| v.is_nan() || **v == f32::INFINITY)
        {
            return Err(SamplingError::NonFiniteLogit { index, value });
        }
        row.clear();
        match allowed {
            None => row.extend_from_slice(logits),
            Some(bits) => row.extend(logits.iter().enumerate().map(|(id, &logit)| {
                let word = bits.get(id / 32).copied().unwrap_or(0);
                if word >> (id % 32) & 1 == 1 {
                    logit
                } else {
                    f32::NEG_INFINITY
                }
            })),
        }
        self.processors.apply(row);
        Ok(())
    }

    /// Greedy, or temperature, top-k, top-p and one draw.
    fn choose(
        &mut self,
        logits: &[f32],
        workspace: &mut SamplingWorkspace,
    ) -> Result<u32, SamplingError> {
        let (best, max_logit) = checked_argmax(logits)?;
        if self.temperature == 0.0 {
            return Ok(best);
        }
        let draw = self.rng.next_f64();
        let threshold = self.cut(logits, max_logit, workspace);

        let weights = &workspace.weights;
        let kept_ids = || {
            (0..logits.len())
                .filter(move |&id| threshold.is_none_or(|t| rank_key(id as u32, logits[id]) >= t))
        };
        let kept_mass: f64 = kept_ids().map(|id| f64::from(weights[id])).sum();
        // The first kept token whose running weight passes the target; if
        // rounding leaves the target at the very end, the last kept token
        // with any weight.
        let target = draw * kept_mass;
        let mut cumulative = 0.0;
        let mut chosen = best;
        for id in kept_ids() {
            let w = f64::from(weights[id]);
            if w > 0.0 {
                cumulative += w;
                chosen = id as u32;
                if cumulative > target {
                    break;
                }
            }
        }
        Ok(chosen)
    }

    /// Applies top-k and top-p: returns the rank key of the least likely
    /// token kept (`None` when nothing is cut), and leaves in
    /// `workspace.weights` the softmax numerator of every kept token.
    fn cut(
        &self,
        logits: &[f32],
        max_logit: f32,
        workspace: &mut SamplingWorkspace,
    ) -> Option<u64> {
        // Shifted by the maximum so that no exponential overflows.
        let weight = |id: usize| ((logits[id] - max_logit) / self.temperature).exp();
        let SamplingWorkspace { weights, keys, .. } = workspace;
        let vocab = logits.len();
        weights.clear();
        weights.resize(vocab, 0.0);

        let top_k = self.top_k.unwrap_or(vocab).min(vocab);
        if top_k == vocab && self.top_p >= 1.0 {
            fill_weights(weights, 0..vocab, weight);
            return None;
        }

        keys.clear();
        let mut threshold = None;
        let mass = if top_k < vocab {
            keys.extend(
                logits
                    .iter()
                    .enumerate()
                    .map(|(id, &logit)| rank_key(id as u32, logit)),
            );
            keys.select_nth_unstable_by(top_k - 1, descending);
            keys.truncate(top_k);
            threshold = keys.last().copied();
            // Only these can be kept: their weights are all that is needed.
            fill_weights(weights, keys.iter().map(|&key| key_id(key)), weight)
        } else {
            let total = fill_weights(weights, 0..vocab, weight);
            // Tokens lighter than this cannot be in the nucleus: together
            // they weigh less than `(1 - top_p) * total`, so the heavier
            // ones alone reach `top_p * total`. Leaving them out makes the
            // usual peaked distribution a short list.
            let floor = (1.0 - f64::from(self.top_p)) * total / vocab as f64;
            keys.extend(
                (0..vocab)
                    .filter(|&id| f64::from(weights[id]) >= floor)
                    .map(|id| rank_key(id as u32, logits[id])),
            );
            total
        };
        if self.top_p < 1.0 {
            let target = f64::from(self.top_p) * mass;
            if let Some(nucleus) = nucleus_threshold(keys, weights, target) {
                threshold = Some(nucleus);
            }
        }
        threshold
    }
}

/// Writes the weight of each id in `ids` into `weights`; returns their sum.
fn fill_weights(
    weights: &mut [f32],
    ids: impl Iterator<Item = usize>,
    weight: impl Fn(usize) -> f32,
) -> f64 {
    let mut total = 0.0;
    for id in ids {
        weights[id] = weight(id);
        total += f64::from(weights[id]);
    }
    total
}

/// Index of the largest logit (lowest index on ties) and its value; rejects
/// NaN and +inf (a broken model) and rows with nothing to choose.
///
/// Two branch-free passes the compiler vectorizes (the lanes' maxima with a
/// flag for non-finite values, then the first index holding the maximum):
/// a row is 150–250 k logits and every sampled row of every step is
/// scanned (`benches/sampling.rs`: 1.2–2.2× the one-pass loop with early
/// exits on this project's 2-core EPYC). Only a broken row takes the slow
/// scan that names the first bad index.
pub(crate) fn checked_argmax(logits: &[f32]) -> Result<(u32, f32), SamplingError> {
    // NaN or +inf, without a branch (`|`, not `||`), so the loop vectorizes.
    let breaks_the_row = |v: f32| v.is_nan() | (v == f32::INFINITY);
    const LANES: usize = 16;
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    let mut lane_bad = [false; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for lane in 0..LANES {
            let value = chunk[lane];
            lane_bad[lane] |= breaks_the_row(value);
            lane_max[lane] = if value > lane_max[lane] {
                value
            } else {
                lane_max[lane]
            };
        }
    }
    let mut best_logit = f32::NEG_INFINITY;
    let mut bad = lane_bad.contains(&true);
    for &value in lane_max.iter().chain(tail) {
        bad |= breaks_the_row(value);
        if value > best_logit {
            best_logit = value;
        }
    }
    if bad {
        let (index, &value) = logits
            .iter()
            .enumerate()
            .find(|(_, v)| breaks_the_row(**v))
            .unwrap_or((0, &f32::NAN));
        return Err(SamplingError::NonFiniteLogit { index, value });
    }
    if best_logit == f32::NEG_INFINITY {
        return Err(SamplingError::AllTokensMasked);
    }
    let best = logits.iter().position(|&v| v == best_logit).unwrap_or(0);
    Ok((best as u32, best_logit))
}

/// Rank key of the last token of the smallest most-likely-first prefix of
/// `candidates` whose weight reaches `target`; `None` if rounding kept the
/// total just short of it (then every candidate stays).
///
/// A weighted quickselect: split the candidates around the median, then
/// either the better half alone reaches the target (look inside it) or it
/// does not (count it whole, look in the worse half). Each round halves the
/// slice, so the whole search is O(n). The first split is at the
/// [`FIRST_NUCLEUS_GUESS`]-th candidate instead of the median: a language
/// model's distribution is usually peaked, and then one selection suffices.
fn nucleus_threshold(candidates: &mut [u64], weights: &[f32], target: f64) -> Option<u64> {
    let weight = |key: u64| f64::from(weights[key_id(key)]);
    let mut rest = candidates;
    // Weight of the candidates already known to be in the prefix; always
    // below `target`.
    let mut counted = 0.0;
    let mut guess = FIRST_NUCLEUS_GUESS;
    while !rest.is_empty() {
        let mid = (rest.len() / 2).min(guess);
        guess = usize::MAX;
        rest.select_nth_unstable_by(mid, descending);
        let better: f64 = rest[..mid].iter().map(|&key| weight(key)).sum();
        if counted + better >= target {
            rest = &mut rest[..mid];
            continue;
        }
        counted += better + weight(rest[mid]);
        if counted >= target {
            return Some(rest[mid]);
        }
        rest = &mut rest[mid + 1..];
    }
    None
}

/// A seed for requests that give none: std's per-process random hash keys
/// mixed with the clock (no dependency needed for this).
fn fresh_seed() -> u64 {
    RandomState::new().hash_one(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass scan this replaced: the first strictly larger value
    /// wins, the first NaN or +inf is an error.
    fn sequential_argmax(logits: &[f32]) -> Result<(u32, f32), SamplingError> {
        let mut best = (0, f32::NEG_INFINITY);
        for (index, &value) in logits.iter().enumerate() {
            if value.is_nan() || value == f32::INFINITY {
                return Err(SamplingError::NonFiniteLogit { index, value });
            }
            if value > best.1 {
                best = (index as u32, value);
            }
        }
        match best.1 {
            _ if logits.is_empty() => Err(SamplingError::EmptyLogits),
            f32::NEG_INFINITY => Err(SamplingError::AllTokensMasked),
            _ => Ok(best),
        }
    }

    fn same(a: Result<(u32, f32), SamplingError>, b: Result<(u32, f32), SamplingError>) -> bool {
        match (a, b) {
            (Ok(x), Ok(y)) => x == y,
            (
                Err(SamplingError::NonFiniteLogit { index: i, value: v }),
                Err(SamplingError::NonFiniteLogit { index: j, value: w }),
            ) => i == j && v.to_bits() == w.to_bits(),
            (Err(x), Err(y)) => std::mem::discriminant(&x) == std::mem::discriminant(&y),
            _ => false,
        }
    }

    /// Lengths around the lane width, ties (coarse values), masked rows,
    /// NaN / +inf anywhere, -0.0 beside 0.0: the lane scan answers as the
    /// sequential one.
    #[test]
    fn the_lane_scan_answers_as_the_sequential_one() {
        let mut rng = SplitMix64::new(3);
        for len in [0, 1, 2, 15, 16, 17, 31, 33, 100, 1000] {
            for case in 0..40 {
                let mut row: Vec<f32> = (0..len)
                    .map(|_| match case % 4 {
                        0 => (rng.next_f64() * 4.0).floor() as f32,
                        1 => f32::NEG_INFINITY,
                        2 => [0.0, -0.0][(rng.next_f64() * 2.0) as usize],
                        _ => (rng.next_f64() * 8.0 - 4.0) as f32,
                    })
                    .collect();
                if len > 0 && case % 5 == 0 {
                    let at = (rng.next_f64() * len as f64) as usize;
                    row[at] = [f32::NAN, f32::INFINITY][case % 2];
                }
                if len > 0 && case % 7 == 0 {
                    let at = (rng.next_f64() * len as f64) as usize;
                    row[at] = 1.0;
                }
                let (got, want) = (checked_argmax(&row), sequential_argmax(&row));
                assert!(
                    same(got.clone(), want.clone()),
                    "{row:?}: {got:?} vs {want:?}"
                );
            }
        }
    }

    /// The nucleus found by weighted quickselect ends at the same token as
    /// a full sort's, on distributions from flat to sharply peaked.
    #[test]
    fn nucleus_matches_full_sort() {
        let mut rng = SplitMix64::new(7);
        for scale in [0.5, 8.0, 40.0] {
            let logits: Vec<f32> = (0..20_000)
                .map(|_| (rng.next_f64() * scale) as f32)
                .collect();
            let weights: Vec<f32> = logits.iter().map(|&l| (l - scale as f32).exp()).collect();
            let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
            let mut sorted: Vec<u64> = logits
                .iter()
                .enumerate()
                .map(|(id, &logit)| rank_key(id as u32, logit))
                .collect();
            sorted.sort_unstable_by(descending);
            for top_p in [1e-6, 0.05, 0.5, 0.9, 0.999] {
                let mut cumulative = 0.0;
                let want = sorted.iter().copied().find(|&key| {
                    cumulative += f64::from(weights[key_id(key)]);
                    cumulative >= top_p * total
                });
                let mut candidates = sorted.clone();
                candidates.reverse();
                let got = nucleus_threshold(&mut candidates, &weights, top_p * total);
                assert_eq!(got, want, "scale {scale}, top_p {top_p}");
            }
        }
    }

    /// Both cuts together pick the same threshold token as a full sort, with
    /// and without top-k (the top-p-only path skips light tokens first).
    #[test]
    fn cuts_match_a_full_sort() {
        let mut rng = SplitMix64::new(11);
        let vocab = 30_000;
        for scale in [0.5, 8.0, 40.0] {
            let logits: Vec<f32> = (0..vocab)
                .map(|_| (rng.next_f64() * scale) as f32)
                .collect();
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let temperature = 0.7;
            let mut sorted: Vec<u64> = logits
                .iter()
                .enumerate()
                .map(|(id, &logit)| rank_key(id as u32, logit))
                .collect();
            sorted.sort_unstable_by(descending);
            let weight = |key: u64| f64::from(((logits[key_id(key)] - max) / temperature).exp());
            for top_k in [None, Some(100), Some(5000)] {
                for top_p in [1e-6, 0.3, 0.9, 0.999, 1.0] {
                    let kept = &sorted[..top_k.unwrap_or(vocab)];
                    let mass: f64 = kept.iter().map(|&k| weight(k)).sum();
                    let mut cumulative = 0.0;
                    let want = if top_p < 1.0 {
                        kept.iter().copied().find(|&key| {
                            cumulative += weight(key);
                            cumulative >= f64::from(top_p) * mass
                        })
                    } else {
                        top_k.map(|k| sorted[k - 1])
                    };
                    let params = SamplingParams {
                        temperature,
                        top_k,
                        top_p,
                        ..SamplingParams::default()
                    };
                    let sampler = Sampler::new(&params).unwrap();
                    let mut workspace = SamplingWorkspace::new(vocab);
                    let got = sampler.cut(&logits, max, &mut workspace);
                    assert_eq!(got, want, "scale {scale}, top_k {top_k:?}, top_p {top_p}");
                }
            }
        }
    }

    #[test]
    fn rank_keys_order_like_logits_then_ids() {
        // Strictly increasing rank.
        let entries = [
            (3, f32::NEG_INFINITY),
            (0, -2.5),
            (2, 0.0),
            (1, -0.0),
            (0, 0.0),
            (9, 1e-30),
            (5, 3.0),
        ];
        for pair in entries.windows(2) {
            let (lower, higher) = (pair[0], pair[1]);
            assert!(
                rank_key(lower.0, lower.1) < rank_key(higher.0, higher.1),
                "{lower:?} vs {higher:?}"
            );
        }
        // -0.0 and 0.0 tie on the logit, so the lower id ranks higher.
        assert!(rank_key(0, -0.0) > rank_key(1, 0.0));
        assert_eq!(key_id(rank_key(12345, 1.5)), 12345);
    }
}
