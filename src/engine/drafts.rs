//! Speculative decoding's drafts: where they come from and when a sequence
//! stops asking for them.
//!
//! A decoding sequence's step may carry up to k draft tokens after its one
//! known token; the target model computes all of them in that step (verify
//! rows, like a prompt chunk's) and the output stage samples each row as it
//! would have sampled that position, keeping drafts while they equal what
//! it draws (see `output`). Sampling exactly as without drafts makes the
//! output the target's, bit for bit under a seed: a draft that is a single
//! token (as every proposer here gives) is accepted with the probability the
//! target gives it, and a rejected one is replaced by a draw from the
//! target's distribution without it, which is the standard rejection rule
//! for such a draft.

use crate::plan::speculative::{DraftMethod, MAX_SPECULATIVE_TOKENS, SpeculativeConfig};

/// Where a sequence's drafts come from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Proposer {
    Ngram(NgramProposer),
    /// The model's MTP head: its drafts are made after each step (see
    /// `engine::mtp`) and kept in [`Drafts::head`] for the next.
    Head {
        k: usize,
    },
}

impl Proposer {
    pub fn new(config: &SpeculativeConfig) -> Proposer {
        match config.method {
            DraftMethod::Ngram => Proposer::Ngram(NgramProposer::new(config)),
            DraftMethod::Mtp => Proposer::Head {
                k: config.num_speculative_tokens,
            },
        }
    }

    /// Draft tokens per sequence and step at most.
    pub fn k(&self) -> usize {
        match self {
            Proposer::Ngram(p) => p.k,
            Proposer::Head { k } => *k,
        }
    }

    /// KV positions a sequence needs past its step's rows for the head's
    /// later passes (each recursive draft writes the position after the
    /// one before): `k − 1` for a head, none for prompt lookup.
    pub fn lookahead(&self) -> usize {
        match self {
            Proposer::Ngram(_) => 0,
            Proposer::Head { k } => k.saturating_sub(1),
        }
    }

    /// Puts at most `limit` drafts for a sequence of `tokens` into
    /// `drafts.tokens`: prompt lookup's, or those the head made when the
    /// sequence had exactly these tokens.
    pub fn propose(&self, tokens: &[u32], limit: usize, drafts: &mut Drafts) {
        match self {
            Proposer::Ngram(p) => p.propose(tokens, limit, &mut drafts.tokens),
            Proposer::Head { .. } => {
                if drafts.head_len == tokens.len() {
                    let n = limit.min(drafts.head.len());
                    drafts.tokens.extend_from_slice(&drafts.head[..n]);
                }
            }
        }
    }
}

/// Prompt lookup (vLLM's `ngram`): the tokens that followed an earlier
/// occurrence of the longest suffix of the sequence, of `min_n..=max_n`
/// tokens. Among occurrences that match as long, the one with the most
/// continuation before the sequence's end (up to the tokens asked for),
/// the latest of those: in a repeating stretch the latest occurrence sits
/// just before the end, and its continuation would be cut to a token or
/// two where an occurrence a period earlier gives all k.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NgramProposer {
    pub k: usize,
    min_n: usize,
    max_n: usize,
}

impl NgramProposer {
    pub fn new(config: &SpeculativeConfig) -> NgramProposer {
        NgramProposer {
            k: config.num_speculative_tokens,
            min_n: config.prompt_lookup_min,
            max_n: config.prompt_lookup_max,
        }
    }

    /// Appends to `out` at most `limit` tokens proposed to follow `tokens`.
    /// One backward scan: each earlier position is scored by how many
    /// tokens before it agree with the sequence's end (at most `max_n`), so
    /// the search costs at most `tokens × max_n` comparisons.
    pub fn propose(&self, tokens: &[u32], limit: usize, out: &mut Vec<u32>) {
        let len = tokens.len();
        if limit == 0 || len <= self.min_n {
            return;
        }
        let Some(&last) = tokens.last() else {
            return;
        };
        // `end`: the position just after a candidate occurrence, whose
        // continuation starts there. Scored (match length, continuation
        // length); the scan goes backwards, so a tie keeps the later.
        let mut best: Option<(usize, (usize, usize))> = None;
        for end in (1..len).rev() {
            if tokens[end - 1] != last {
                continue;
            }
            let longest = self.max_n.min(end);
            let matched = (0..longest)
                .take_while(|&t| tokens[end - 1 - t] == tokens[len - 1 - t])
                .count();
            let score = (matched, limit.min(len - end));
            if matched >= self.min_n && best.is_none_or(|(_, b)| score > b) {
                best = Some((end, score));
                if score == (self.max_n, limit) {
                    break;
                }
            }
        }
        if let Some((end, (_, continuation))) = best {
            out.extend_from_slice(&tokens[end..end + continuation]);
        }
    }
}

/// Consecutive drafting steps whose every draft was rejected make the
/// sequence skip drafting for `2^misses` steps, at most this many: where
/// drafts are wrong at most one step in 33 carries verify rows.
pub const MAX_BACKOFF_STEPS: u32 = 32;

/// How a sequence backs off from drafts that keep failing.
///
/// A skipped step can still ask a proposer that costs no model pass
/// (prompt lookup) what it would have drafted: the *shadow* draft. If the
/// following steps then sample every token of it, that draft would have
/// been kept whole, and the back-off ends. So text that starts repeating
/// after a stretch of failed drafts (a model falling into a quoted block or
/// a loop) is drafted again within k steps, not up to 32 steps later, while
/// where lookups keep failing no verify row is spent. Only a whole
/// confirmed draft ends it: a lookup whose first token holds now and then
/// (common word pairs) would otherwise bring back a failing verify step
/// every few steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// Steps still to skip.
    skip: u32,
    /// Drafting steps in a row with nothing accepted.
    misses: u32,
    /// The shadow draft being checked, if any.
    shadow: Option<Shadow>,
}

/// Tokens `tokens[..len]` proposed for positions `at ..` of a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shadow {
    at: usize,
    tokens: [u32; MAX_SPECULATIVE_TOKENS],
    len: usize,
}

/// What the sequence has sampled so far says of a shadow draft.
enum Verdict {
    /// Every token was sampled in turn.
    Kept,
    /// A sampled token differs.
    Rejected,
    /// The sequence has not reached its end yet.
    Pending,
}

impl Shadow {
    fn verdict(&self, tokens: &[u32]) -> Verdict {
        let drafted = &self.tokens[..self.len];
        let sampled = tokens.get(self.at..).unwrap_or(&[]);
        if drafted.iter().zip(sampled).any(|(d, s)| d != s) {
            Verdict::Rejected
        } else if sampled.len() >= drafted.len() {
            Verdict::Kept
        } else {
            Verdict::Pending
        }
    }
}

impl Backoff {
    /// Whether this step may draft (counts a skipped step), for a sequence
    /// now holding `tokens`: a shadow draft that `tokens` confirms whole
    /// ends the back-off first.
    pub fn allows(&mut self, tokens: &[u32]) -> bool {
        if let Some(shadow) = self.shadow {
            match shadow.verdict(tokens) {
                Verdict::Kept => *self = Backoff::default(),
                Verdict::Rejected => self.shadow = None,
                Verdict::Pending => {}
            }
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// Whether the next step may draft (what [`allows`](Self::allows) will
    /// say unless a shadow draft is confirmed), without counting a step.
    pub fn next_allows(&self) -> bool {
        self.skip == 0
    }

    /// Whether a skipped step should make a shadow draft: none is being
    /// checked.
    pub fn wants_shadow(&self) -> bool {
        self.shadow.is_none()
    }

    /// After a skipped step: the proposer would have drafted `drafted` for
    /// positions `at ..` (at most [`MAX_SPECULATIVE_TOKENS`] kept).
    pub fn shadow(&mut self, at: usize, drafted: &[u32]) {
        if drafted.is_empty() {
            return;
        }
        let len = drafted.len().min(MAX_SPECULATIVE_TOKENS);
        let mut tokens = [0; MAX_SPECULATIVE_TOKENS];
        tokens[..len].copy_from_slice(&drafted[..len]);
        self.shadow = Some(Shadow { at, tokens, len });
    }

    /// After a step that verified drafts, `accepted` of them.
    pub fn record(&mut self, accepted: usize) {
        if accepted > 0 {
            self.misses = 0;
        } else {
            self.misses = (self.misses + 1).min(MAX_BACKOFF_STEPS.ilog2());
            self.skip = 1 << self.misses;
        }
    }
}

/// A sequence's drafts in the current step and their verification.
#[derive(Clone, Debug, Default)]
pub(crate) struct Drafts {
    /// The step's draft tokens (empty: the sequence drafts nothing in it).
    pub tokens: Vec<u32>,
    /// Of them, those the step's rows confirmed so far.
    pub accepted: usize,
    /// Whether the sequence's next verify row is still to be sampled:
    /// false once a sampled token differs from its draft, the last row was
    /// sampled, or the sequence finished.
    pub open: bool,
    pub backoff: Backoff,
    /// The MTP head's drafts for the step after the one that made them,
    /// made when the sequence had `head_len` tokens (stale otherwise).
    pub head: Vec<u32>,
    pub head_len: usize,
}

impl Drafts {
    /// Starts a step with the tokens now in `tokens`.
    pub fn begin(&mut self) {
        self.accepted = 0;
        self.open = !self.tokens.is_empty();
    }

    /// After the sequence sampled `token` from one of its verify rows:
    /// the row's draft is kept if it is that token and the sequence goes on.
    pub fn settle(&mut self, token: u32, finished: bool) {
        if !self.open {
            return;
        }
        let keep = !finished && self.tokens.get(self.accepted) == Some(&token);
        if keep {
            self.accepted += 1;
        } else {
            self.open = false;
        }
    }

    /// Ends the step's drafting (its tokens dropped, capacity kept).
    pub fn end(&mut self) {
        self.tokens.clear();
        self.accepted = 0;
        self.open = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::speculative::DraftMethod;

    fn proposer(k: usize, min_n: usize, max_n: usize) -> NgramProposer {
        NgramProposer::new(&SpeculativeConfig {
            method: DraftMethod::Ngram,
            num_speculative_tokens: k,
            prompt_lookup_min: min_n,
            prompt_lookup_max: max_n,
        })
    }

    fn propose(p: &NgramProposer, tokens: &[u32], limit: usize) -> Vec<u32> {
        let mut out = Vec::new();
        p.propose(tokens, limit, &mut out);
        out
    }

    #[test]
    fn the_continuation_of_the_latest_longest_match_is_proposed() {
        let p = proposer(3, 1, 3);
        // "1 2 3" occurred twice; the latest is followed by 7 8 9.
        let tokens = [1, 2, 3, 4, 5, 1, 2, 3, 7, 8, 9, 0, 1, 2, 3];
        assert_eq!(propose(&p, &tokens, 3), [7, 8, 9]);
        assert_eq!(propose(&p, &tokens, 2), [7, 8]);
        // A longer match beats a later shorter one: "5 1 2 3" vs "x 2 3".
        let tokens = [5, 1, 2, 3, 40, 41, 6, 2, 3, 50, 5, 1, 2, 3];
        assert_eq!(propose(&proposer(2, 2, 4), &tokens, 2), [40, 41]);
    }

    #[test]
    fn nothing_is_proposed_below_the_shortest_match_or_past_the_end() {
        let p = proposer(3, 2, 3);
        assert!(
            propose(&p, &[1, 2, 3, 4, 3], 3).is_empty(),
            "only 1 token matches"
        );
        // The match's continuation is cut at the sequence's end.
        assert_eq!(propose(&p, &[1, 2, 1, 2], 3), [1, 2]);
        // In a repeating stretch an occurrence a period earlier, matching
        // as long, gives the whole continuation the latest one cuts short.
        assert_eq!(propose(&proposer(3, 2, 3), &[7; 8], 3), [7, 7, 7]);
        let cycle = [4, 5, 4, 5, 4, 5, 4, 5, 4, 5];
        assert_eq!(propose(&proposer(3, 2, 3), &cycle, 3), [4, 5, 4]);
        // A longer match still beats a longer continuation.
        let tokens = [9, 4, 5, 6, 6, 6, 1, 4, 5];
        assert_eq!(propose(&proposer(3, 1, 3), &tokens, 3), [6, 6, 6]);
        assert_eq!(
            propose(&proposer(4, 2, 3), &[8, 4, 5, 1, 2, 3, 3, 4, 5], 4),
            [1, 2, 3, 3]
        );
        assert!(propose(&p, &[1, 2, 1, 2], 0).is_empty());
        assert!(propose(&p, &[7, 7], 3).is_empty());
        assert_eq!(propose(&proposer(3, 1, 1), &[7, 7], 3), [7]);
    }

    #[test]
    fn failing_drafts_back_off_exponentially_and_a_hit_resets() {
        let mut b = Backoff::default();
        let mut skipped = Vec::new();
        for _ in 0..7 {
            assert!(b.allows(&[]));
            b.record(0);
            let mut n = 0;
            while !b.allows(&[]) {
                n += 1;
            }
            skipped.push(n);
        }
        assert_eq!(skipped, [2, 4, 8, 16, 32, 32, 32]);
        b.record(2);
        assert!(b.allows(&[]));
        b.record(0);
        assert!(!b.allows(&[]), "one miss after a hit skips 2 again");
    }

    #[test]
    fn a_shadow_draft_confirmed_whole_ends_the_back_off() {
        let mut b = Backoff::default();
        for _ in 0..3 {
            while !b.allows(&[1]) {}
            b.record(0);
        }
        assert!(!b.allows(&[1]));
        // 8 steps to skip, 1 skipped. Lookup would have drafted 7 8 at 3.
        b.shadow(3, &[7, 8]);
        assert!(!b.wants_shadow());
        assert!(!b.allows(&[1, 2, 3]), "nothing sampled yet");
        assert!(!b.allows(&[1, 2, 3, 7]), "half of it sampled");
        assert!(!b.allows(&[1, 2, 3, 7, 9]), "its second token was not");
        assert!(b.wants_shadow(), "a rejected shadow makes way");
        b.shadow(5, &[4, 5]);
        assert!(b.allows(&[1, 2, 3, 7, 9, 4, 5]), "kept whole: draft again");
        // And a later miss starts over from the shortest back-off.
        b.record(0);
        let mut n = 0;
        while !b.allows(&[]) {
            n += 1;
        }
        assert_eq!(n, 2);
    }

    #[test]
    fn settle_keeps_drafts_while_they_match() {
        let mut d = Drafts {
            tokens: vec![4, 5, 6],
            ..Default::default()
        };
        d.begin();
        d.settle(4, false);
        d.settle(5, false);
        d.settle(9, false);
        assert_eq!((d.accepted, d.open), (2, false));
        d.settle(6, false);
        assert_eq!(d.accepted, 2, "nothing after a rejection");
        d.begin();
        d.settle(4, true);
        assert_eq!(
            (d.accepted, d.open),
            (0, false),
            "a finished sequence keeps none"
        );
    }
}
