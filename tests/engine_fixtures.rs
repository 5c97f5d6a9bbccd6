//! The CPU engine against the transformers references in tests/fixtures:
//! prompt logits within 2e-3, greedy continuations identical; and chunked
//! prefill, one-token-at-a-time decoding and batches of different prompts
//! giving the logits of a single full pass.

mod common;

use std::sync::mpsc;

use sparkrt::checkpoint::PageCachePolicy;
use sparkrt::engine::sampling::SamplingParams;
use sparkrt::engine::{Event, FinishReason, Request};
use sparkrt::plan::profile::{KvCacheDtype, Profile};
use sparkrt::runtime::{HostSource, Loaded};

const FIXTURES: [&str; 3] = ["qwen3-moe-tiny", "qwen3-moe-tiny-nvfp4", "gpt-oss-tiny"];

struct Reference {
    input_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    logits: Vec<f32>,
    vocab: usize,
}

fn reference(name: &str) -> Reference {
    let bytes = std::fs::read(common::fixture(name).join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ints = |key: &str| -> Vec<u32> {
        st.tensor(key)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect()
    };
    let logits = st.tensor("logits").unwrap();
    let vocab = logits.shape()[1];
    Reference {
        input_ids: ints("input_ids"),
        greedy_ids: ints("greedy_ids"),
        logits: logits
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        vocab,
    }
}

fn profile(name: &str) -> Profile {
    Profile::load(&common::profile(name)).unwrap()
}

/// What one request produced.
#[derive(Debug, Default)]
struct Outcome {
    prompt_logits: Vec<f32>,
    tokens: Vec<u32>,
    finish: Option<FinishReason>,
}

/// Runs `prompts` together through an engine built from `profile`, greedy,
/// `max_tokens` each, and returns each request's outcome.
fn run(name: &str, profile: &Profile, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Outcome> {
    let host_root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    let dir = common::fixture(name);
    let loaded = Loaded::open(&dir, Some(profile), &host, PageCachePolicy::Keep).unwrap();
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    let vocab = engine.vocab_size();
    let mut receivers = Vec::new();
    for prompt in prompts {
        let (tx, rx) = mpsc::channel();
        engine
            .add_request(
                Request {
                    prompt: prompt.clone(),
                    params: SamplingParams::greedy(max_tokens),
                    prompt_logits: true,
                    ignore_eos: true,
                },
                Box::new(tx),
            )
            .unwrap();
        receivers.push(rx);
    }
    while engine.has_work() {
        engine.step().unwrap();
    }
    receivers
        .into_iter()
        .zip(prompts)
        .map(|(rx, prompt)| {
            let mut out = Outcome {
                prompt_logits: vec![f32::NAN; prompt.len() * vocab],
                ..Outcome::default()
            };
            for event in rx.try_iter() {
                match event {
                    Event::PromptLogits { first, values } => {
                        out.prompt_logits[first * vocab..first * vocab + values.len()]
                            .copy_from_slice(&values);
                    }
                    Event::Token { id, .. } => out.tokens.push(id),
                    Event::Finished { reason, .. } => out.finish = Some(reason),
                    Event::Failed { message } => panic!("request failed: {message}"),
                }
            }
            out
        })
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn fixtures_match_the_transformers_reference() {
    for name in FIXTURES {
        let r = reference(name);
        let out = run(
            name,
            &profile(name),
            std::slice::from_ref(&r.input_ids),
            r.greedy_ids.len(),
        );
        assert_eq!(out[0].prompt_logits.len(), r.input_ids.len() * r.vocab);
        let diff = max_abs_diff(&out[0].prompt_logits, &r.logits);
        assert!(diff < 2e-3, "{name}: prompt logits differ by {diff}");
        assert_eq!(out[0].tokens, r.greedy_ids, "{name}: greedy continuation");
        assert_eq!(out[0].finish, Some(FinishReason::Length));
    }
}

#[test]
fn chunked_prefill_and_single_token_steps_equal_one_full_pass() {
    for name in FIXTURES {
        let r = reference(name);
        let prompt = std::slice::from_ref(&r.input_ids);
        let full = run(name, &profile(name), prompt, 8);

        // Chunks of 5 tokens (21 = 5 + 5 + 5 + 5 + 1).
        let mut chunked = profile(name);
        chunked.serving.max_num_batched_tokens = 5;
        chunked.serving.max_num_seqs = 4;
        let out = run(name, &chunked, prompt, 8);
        let diff = max_abs_diff(&out[0].prompt_logits, &full[0].prompt_logits);
        assert!(diff < 1e-4, "{name}: chunked prefill differs by {diff}");
        assert_eq!(
            out[0].tokens, full[0].tokens,
            "{name}: chunked continuation"
        );

        // One token per step, prompt included.
        let mut single = profile(name);
        single.serving.max_num_batched_tokens = 1;
        single.serving.max_num_seqs = 1;
        let out = run(name, &single, prompt, 8);
        let diff = max_abs_diff(&out[0].prompt_logits, &full[0].prompt_logits);
        assert!(diff < 1e-4, "{name}: token-at-a-time differs by {diff}");
        assert_eq!(
            out[0].tokens, full[0].tokens,
            "{name}: token-at-a-time continuation"
        );
    }
}

#[test]
fn a_batch_of_different_prompts_gives_each_its_own_logits() {
    for name in FIXTURES {
        let r = reference(name);
        let prompts: Vec<Vec<u32>> = vec![
            r.input_ids.clone(),
            r.input_ids[..7].to_vec(),
            r.input_ids[3..].iter().rev().copied().collect(),
            vec![r.input_ids[0]],
        ];
        let together = run(name, &profile(name), &prompts, 10);
        for (i, prompt) in prompts.iter().enumerate() {
            let alone = run(name, &profile(name), std::slice::from_ref(prompt), 10);
            let diff = max_abs_diff(&together[i].prompt_logits, &alone[0].prompt_logits);
            assert!(
                diff < 1e-4,
                "{name} prompt {i}: batched logits differ by {diff}"
            );
            assert_eq!(together[i].tokens, alone[0].tokens, "{name} prompt {i}");
        }
        // The first prompt is the reference one.
        assert_eq!(together[0].tokens, r.greedy_ids[..10].to_vec(), "{name}");
    }
}

#[test]
fn bf16_kv_cache_gives_the_same_logits_however_the_prompt_is_cut() {
    let name = "qwen3-moe-tiny";
    let r = reference(name);
    let mut bf16 = profile(name);
    bf16.serving.kv_cache_dtype = KvCacheDtype::Bf16;
    let full = run(name, &bf16, std::slice::from_ref(&r.input_ids), 6);
    let mut chunked = bf16.clone();
    chunked.serving.max_num_batched_tokens = 4;
    chunked.serving.max_num_seqs = 2;
    let out = run(name, &chunked, std::slice::from_ref(&r.input_ids), 6);
    let diff = max_abs_diff(&out[0].prompt_logits, &full[0].prompt_logits);
    assert!(diff < 1e-5, "bf16 KV: chunked prefill differs by {diff}");
    assert_eq!(out[0].tokens, full[0].tokens);
    // Rounding keys and values to bf16 stays close to the f32 reference.
    let diff = max_abs_diff(&full[0].prompt_logits, &r.logits);
    assert!(
        diff < 2e-2,
        "bf16 KV differs from the f32 reference by {diff}"
    );
}

#[test]
fn decoding_past_the_sliding_window_token_by_token_equals_a_full_pass() {
    // gpt-oss-tiny's window is 8; prompt and continuation run to 45 tokens.
    let name = "gpt-oss-tiny";
    let r = reference(name);
    let mut all = r.input_ids.clone();
    all.extend(&r.greedy_ids);
    let full = run(name, &profile(name), std::slice::from_ref(&all), 1);
    let mut single = profile(name);
    single.serving.max_num_batched_tokens = 1;
    single.serving.max_num_seqs = 1;
    let stepped = run(name, &single, std::slice::from_ref(&all), 1);
    let diff = max_abs_diff(&stepped[0].prompt_logits, &full[0].prompt_logits);
    assert!(
        diff < 1e-4,
        "past the window, token by token differs by {diff}"
    );
    // Each position's argmax is the next reference token (teacher forcing).
    let vocab = r.vocab;
    for (i, &next) in r.greedy_ids.iter().enumerate() {
        let row = &full[0].prompt_logits[(r.input_ids.len() - 1 + i) * vocab..][..vocab];
        let best = row
            .iter()
            .enumerate()
            .fold(0, |b, (j, &x)| if x > row[b] { j } else { b });
        assert_eq!(best as u32, next, "position {}", r.input_ids.len() + i);
    }
}
