//! Log-probabilities in the engine: prompt rows computed in chunks of the
//! planned `prompt_logits` buffer (150 prompt tokens: chunks of 64, 64, 22)
//! equal the log-softmax of the logits of a token-at-a-time run (every row
//! alone in `logits`), computed here in f64; each prompt position is
//! reported once, in order; and counts over 20 are refused at admission.

use std::sync::mpsc;

use sparkrt::checkpoint::PageCachePolicy;
use sparkrt::engine::sampling::SamplingParams;
use sparkrt::engine::{AdmissionError, Event, LogprobRequest, Request, TokenLogprob};
use sparkrt::plan::profile::Profile;
use sparkrt::runtime::{HostSource, Loaded};

use crate::common;
use crate::fixture_runs::profile;

const NAME: &str = "qwen3-moe-tiny";
const PROMPT_LEN: usize = 150;
const TOP: usize = 5;

fn prompt() -> Vec<u32> {
    (0..PROMPT_LEN as u32)
        .map(|i| (i * 37 + 11) % 500)
        .collect()
}

fn request(logprobs: LogprobRequest, prompt_logits: bool) -> Request {
    Request::new(prompt(), SamplingParams::greedy(3))
        .with_prompt_logits(prompt_logits)
        .with_ignore_eos(true)
        .with_logprobs(logprobs)
}

/// Runs one request alone on an engine of `profile`; returns its events.
fn events(profile: &Profile, request: Request) -> Vec<Event> {
    let root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &root,
        kubelet_config: None,
    };
    let dir = common::fixture(NAME);
    let loaded = Loaded::open_cpu(&dir, Some(profile), &host, PageCachePolicy::Keep).unwrap();
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    let (tx, rx) = mpsc::channel();
    engine.add_request(request, Box::new(tx)).unwrap();
    while engine.has_work() {
        engine.step().unwrap();
    }
    rx.try_iter().collect()
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

fn check_against(t: &TokenLogprob, row: &[f64], what: &str) -> f64 {
    let mut worst = (t.logprob as f64 - row[t.id as usize]).abs();
    let mut sorted = row.to_vec();
    sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
    assert_eq!(t.top.len(), TOP, "{what}");
    for (j, &(id, lp)) in t.top.iter().enumerate() {
        // The id's own value, and the j-th largest (robust to near ties).
        worst = worst.max((lp as f64 - row[id as usize]).abs());
        worst = worst.max((lp as f64 - sorted[j]).abs());
    }
    assert!(t.top.windows(2).all(|w| w[0].1 >= w[1].1), "{what}: sorted");
    // The rank counts the tokens above it.
    let above = row
        .iter()
        .filter(|&&v| v > row[t.id as usize] + 1e-4)
        .count();
    assert!(t.rank > above, "{what}: rank {} with {above} above", t.rank);
    worst
}

#[test]
fn chunked_prompt_logprobs_equal_log_softmax_of_single_row_logits() {
    // Token at a time: each row alone, all its logits reported.
    let mut single = profile(NAME);
    single.serving.max_num_batched_tokens = 1;
    single.serving.max_num_seqs = 1;
    let reference = events(&single, request(LogprobRequest::default(), true));
    let vocab = 512;
    let mut logits = vec![f32::NAN; PROMPT_LEN * vocab];
    let mut greedy = Vec::new();
    for e in &reference {
        match e {
            Event::PromptLogits { first, values } => {
                logits[first * vocab..first * vocab + values.len()].copy_from_slice(values)
            }
            Event::Token { id, .. } => greedy.push(*id),
            _ => {}
        }
    }
    assert!(logits.iter().all(|v| v.is_finite()));

    // The default profile: 256 tokens a step, prompt rows 64 at a time.
    let asked = LogprobRequest {
        sampled: Some(TOP),
        prompt: Some(TOP),
    };
    let out = events(&profile(NAME), request(asked, false));
    let prompt = prompt();
    let mut positions = Vec::new();
    let mut sampled = Vec::new();
    let mut worst = 0f64;
    for e in out {
        match e {
            Event::PromptLogprob { position, logprob } => {
                assert!(sampled.is_empty(), "prompt entries come first");
                assert_eq!(logprob.id, prompt[position]);
                let row = log_softmax(&logits[(position - 1) * vocab..position * vocab]);
                worst = worst.max(check_against(&logprob, &row, "prompt"));
                positions.push(position);
            }
            Event::Token { id, logprob, .. } => {
                let t = logprob.expect("sampled logprobs asked for");
                assert_eq!(t.id, id);
                assert_eq!(t.rank, 1, "greedy: rank 1");
                assert_eq!(t.top[0], (id, t.logprob), "greedy: its own top-1");
                sampled.push(t);
            }
            Event::PromptLogits { .. } => panic!("not asked for"),
            _ => {}
        }
    }
    assert_eq!(positions, (1..PROMPT_LEN).collect::<Vec<_>>());
    assert_eq!(
        sampled.iter().map(|t| t.id).collect::<Vec<_>>(),
        greedy,
        "the same greedy tokens"
    );
    let last = log_softmax(&logits[(PROMPT_LEN - 1) * vocab..]);
    worst = worst.max(check_against(&sampled[0], &last, "first sampled"));
    eprintln!("largest difference to the single-row reference: {worst:.2e}");
    assert!(worst < 1e-4, "logprobs differ by {worst}");
}

#[test]
fn more_than_twenty_alternatives_are_refused_at_admission() {
    let root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &root,
        kubelet_config: None,
    };
    let dir = common::fixture(NAME);
    let p = profile(NAME);
    let loaded = Loaded::open_cpu(&dir, Some(&p), &host, PageCachePolicy::Keep).unwrap();
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    let (tx, _rx) = mpsc::channel();
    let asked = LogprobRequest {
        sampled: None,
        prompt: Some(21),
    };
    assert_eq!(
        engine
            .add_request(request(asked, false), Box::new(tx))
            .err(),
        Some(AdmissionError::TooManyLogprobs { count: 21 })
    );
}
