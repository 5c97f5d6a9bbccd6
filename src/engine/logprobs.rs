//! Log-probabilities of tokens, from one row of logits.
//!
//! The values are the log-softmax of the **raw** logits, as the model
//! produced them: before temperature, penalties, biases or masks (vLLM's
//! default, `raw_logprobs`). They are computed where the engine samples (or
//! walks a prompt), while the row is still in the planned `logits` buffer,
//! and reduced at once to what the client asked for: the token's own
//! log-probability and rank, and the `n` most likely alternatives. Nothing
//! of size `vocab` is kept or copied.
//!
//! Ranking is by (logit descending, id ascending), the total order sampling
//! uses, so ties always resolve the same way. The top `n` (at most
//! [`MAX_TOP_LOGPROBS`]) are kept in a small sorted array during one pass
//! over the row: O(vocab + vocab·n) worst case, O(vocab) in practice, and no
//! sort of the whole vocabulary.

use std::cmp::Ordering;

/// The most alternatives a request may ask for per position (OpenAI's
/// limit for `top_logprobs`, vLLM's default `max_logprobs` is 20 too).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// What a request asks of the engine besides its tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogprobRequest {
    /// Report each sampled token's log-probability with this many
    /// alternatives (0: the token's own only).
    pub sampled: Option<usize>,
    /// Report each prompt token's log-probability (from the second on: the
    /// first has no context) with this many alternatives.
    pub prompt: Option<usize>,
}

impl LogprobRequest {
    pub fn is_empty(&self) -> bool {
        self.sampled.is_none() && self.prompt.is_none()
    }

    /// The first count above [`MAX_TOP_LOGPROBS`], if any.
    pub fn too_many(&self) -> Option<usize> {
        [self.sampled, self.prompt]
            .into_iter()
            .flatten()
            .find(|&n| n > MAX_TOP_LOGPROBS)
    }
}

/// One token's log-probability, its rank in its row (1 = most likely), and
/// the most likely tokens of the row, most likely first.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub rank: usize,
    pub top: Vec<(u32, f32)>,
}

/// Whether token `a` (with logit `la`) ranks above token `b`.
fn ranks_above(a: u32, la: f32, b: u32, lb: f32) -> bool {
    match la.partial_cmp(&lb) {
        Some(Ordering::Greater) => true,
        Some(Ordering::Less) => false,
        // Equal (or NaN, which the sampler refuses before we get here).
        _ => a < b,
    }
}

/// `log Σ exp(logits)`, shifted by the maximum for stability and summed in
/// f64. Returns `-inf` for an empty row or one of only `-inf`.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let max = f64::from(max);
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    max + sum.ln()
}

/// The `n` tokens of `logits` ranked highest, most likely first, as (id,
/// logit).
pub fn top_n(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let n = n.min(logits.len());
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for (id, &logit) in logits.iter().enumerate() {
        let id = id as u32;
        if top.len() == n {
            let (last_id, last) = top[n - 1];
            if !ranks_above(id, logit, last_id, last) {
                continue;
            }
            top.pop();
        }
        // Ids arrive ascending, so among equal logits a newcomer goes after.
        let at = top.partition_point(|&(tid, tl)| ranks_above(tid, tl, id, logit));
        top.insert(at, (id, logit));
    }
    top
}

/// 1-based rank of `id` in `logits`: one plus the number of tokens ranked
/// above it.
pub fn rank_of(logits: &[f32], id: u32) -> usize {
    let own = logits[id as usize];
    1 + logits
        .iter()
        .enumerate()
        .filter(|&(other, &l)| ranks_above(other as u32, l, id, own))
        .count()
}

/// `id`'s log-probability in `logits` with the `n` most likely alternatives.
/// `id` must index `logits`.
pub fn token_logprob(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let lse = log_sum_exp(logits);
    let logprob = |logit: f32| (f64::from(logit) - lse) as f32;
    TokenLogprob {
        id,
        logprob: logprob(logits[id as usize]),
        rank: rank_of(logits, id),
        top: top_n(logits, n)
            .into_iter()
            .map(|(tid, l)| (tid, logprob(l)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, by brute force: a full sort and a direct softmax.
    fn reference(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let lp = |l: f32| (f64::from(l) - z.ln()) as f32;
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| {
            logits[b as usize]
                .partial_cmp(&logits[a as usize])
                .unwrap()
                .then(a.cmp(&b))
        });
        TokenLogprob {
            id,
            logprob: lp(logits[id as usize]),
            rank: order.iter().position(|&t| t == id).unwrap() + 1,
            top: order
                .iter()
                .take(n)
                .map(|&t| (t, lp(logits[t as usize])))
                .collect(),
        }
    }

    #[test]
    fn matches_a_full_sort_with_ties_broken_by_id() {
        let mut rng = crate::util::rng::SplitMix64::new(7);
        for round in 0..50 {
            let vocab = 1 + round * 7;
            // Few distinct values, so ties are common.
            let logits: Vec<f32> = (0..vocab)
                .map(|_| (rng.next_f64() * 6.0).floor() as f32 - 3.0)
                .collect();
            for n in [0, 1, 3, 20] {
                let id = (round * 13 % vocab) as u32;
                let got = token_logprob(&logits, id, n);
                let want = reference(&logits, id, n);
                assert_eq!(got.rank, want.rank, "round {round} n {n}");
                assert_eq!(got.top.len(), want.top.len());
                for (g, w) in got.top.iter().zip(&want.top) {
                    assert_eq!(g.0, w.0, "round {round} n {n}");
                    assert!((g.1 - w.1).abs() < 1e-5);
                }
                assert!((got.logprob - want.logprob).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn hand_computed_row() {
        // log_softmax([0, ln 3]) = [ln 1/4, ln 3/4].
        let logits = [0.0, 3f32.ln()];
        let t = token_logprob(&logits, 0, 2);
        assert!((t.logprob - 0.25f32.ln()).abs() < 1e-6);
        assert_eq!(t.rank, 2);
        assert_eq!(t.top[0].0, 1);
        assert!((t.top[0].1 - 0.75f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn large_logits_do_not_overflow() {
        let logits = [1000.0, 1000.0, -1000.0];
        let t = token_logprob(&logits, 1, 1);
        assert!((t.logprob - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(t.top, vec![(0, 0.5f32.ln())]);
        assert_eq!(t.rank, 2);
    }

    #[test]
    fn counts_above_the_limit_are_found() {
        let r = LogprobRequest {
            sampled: Some(20),
            prompt: Some(21),
        };
        assert_eq!(r.too_many(), Some(21));
        assert!(LogprobRequest::default().is_empty());
    }
}
