//! Speculative decoding through the runtime and the engine on the CPU
//! backend, n-gram drafts on every fixture family and the MTP head's on
//! `qwen35-moe-tiny-mtp` and `qwen35-tiny-mtp` (their random heads draft
//! mostly wrong, so rejection and rollback are exercised hard): the output with drafts is
//! the output without them, bit for bit (tokens and the bits of their
//! log-probabilities) — greedy and seeded sampling, alone, batched, after
//! prefix-cache hits and under preemption — while drafts are proposed,
//! some kept and some rejected. On the hybrid fixtures a rejected draft has
//! run through the Gated DeltaNet layers, so equal outputs after
//! rejections show the state rolled back to the kept rows exactly.

use std::sync::atomic::Ordering;
use std::sync::mpsc;

use sparkrt::backend::cpu::CpuBackend;
use sparkrt::checkpoint::{self, PageCachePolicy};
use sparkrt::engine::sampling::SamplingParams;
use sparkrt::engine::{Engine, Event, LogprobRequest, Request};
use sparkrt::plan::profile::{CheckpointFacts, KvCacheDtype, Profile, ServingSection};
use sparkrt::plan::speculative::{DraftMethod, SpeculativeConfig};
use sparkrt::runtime::{HostSource, Loaded};

use crate::common;

const FIXTURES: [&str; 4] = [
    "qwen3-moe-tiny",
    "gpt-oss-tiny",
    "qwen35-moe-tiny",
    "qwen35-tiny",
];

fn ngram(k: usize) -> SpeculativeConfig {
    SpeculativeConfig {
        method: DraftMethod::Ngram,
        num_speculative_tokens: k,
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
    }
}

/// The checkpoint's MTP head, `k` drafts a step.
fn mtp(k: usize) -> SpeculativeConfig {
    SpeculativeConfig {
        method: DraftMethod::Mtp,
        num_speculative_tokens: k,
        prompt_lookup_min: 0,
        prompt_lookup_max: 0,
    }
}

/// The fixtures with an MTP head (scripts/make-mtp-fixture.py), MoE and dense.
const MTP_FIXTURES: [&str; 2] = ["qwen35-moe-tiny-mtp", "qwen35-tiny-mtp"];

/// Every fixture and proposer the tests run, `k` drafts a step: n-grams on
/// each family, the MTP head on the fixtures that have one.
fn drafters(k: usize) -> Vec<(&'static str, SpeculativeConfig)> {
    let mut all: Vec<_> = FIXTURES.iter().map(|&name| (name, ngram(k))).collect();
    all.extend(MTP_FIXTURES.map(|name| (name, mtp(k))));
    all
}

/// A fixture through the runtime: f32 KV, 256-token sequences, 16-token
/// blocks, then `adjust`.
fn loaded(name: &str, adjust: impl FnOnce(&mut ServingSection)) -> Loaded<CpuBackend> {
    let dir = common::fixture(name);
    let (config, _) = checkpoint::load(&dir).unwrap();
    let mut profile = Profile::for_checkpoint(
        CheckpointFacts {
            geometry: &config.geometry,
            max_position_embeddings: config.max_position_embeddings,
        },
        Some(dir.clone()),
    )
    .unwrap();
    let s = &mut profile.serving;
    s.max_model_len = 256;
    s.max_num_batched_tokens = 64;
    s.max_num_seqs = 4;
    s.kv_block_size = 16;
    s.kv_cache_dtype = KvCacheDtype::F32;
    adjust(s);
    let host_root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    Loaded::open_cpu(&dir, Some(&profile), &host, PageCachePolicy::Keep).unwrap()
}

/// A prompt that repeats itself, so that prompt lookup has something to
/// propose; `salt` varies it.
fn prompt(salt: u32) -> Vec<u32> {
    let phrase: Vec<u32> = (0..9).map(|i| 17 + (i * 37 + salt * 11) % 480).collect();
    phrase.iter().cycle().take(40).copied().collect()
}

#[derive(Debug, PartialEq, Eq)]
struct Output {
    tokens: Vec<u32>,
    logprob_bits: Vec<u32>,
}

fn request(prompt: &[u32], params: SamplingParams) -> Request {
    Request::new(prompt.to_vec(), params)
        .with_ignore_eos(true)
        .with_logprobs(LogprobRequest {
            sampled: Some(0),
            prompt: None,
        })
}

fn collect(rx: &mpsc::Receiver<Event>) -> Output {
    let mut out = Output {
        tokens: Vec::new(),
        logprob_bits: Vec::new(),
    };
    for event in rx.try_iter() {
        match event {
            Event::Token { id, logprob, .. } => {
                out.tokens.push(id);
                out.logprob_bits
                    .push(logprob.map_or(u32::MAX, |l| l.logprob.to_bits()));
            }
            Event::Failed { message } => panic!("request failed: {message}"),
            _ => {}
        }
    }
    out
}

/// Serves `requests` together to the end, checking the books every step.
fn serve(engine: &mut Engine<'_>, requests: Vec<Request>) -> Vec<Output> {
    let receivers: Vec<_> = requests
        .into_iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            engine.add_request(r, Box::new(tx)).unwrap();
            rx
        })
        .collect();
    while engine.has_work() {
        engine.step().unwrap();
        engine.audit_blocks().unwrap();
    }
    receivers.iter().map(collect).collect()
}

/// Draft tokens verified and kept so far.
fn drafts(engine: &Engine<'_>) -> (u64, u64) {
    let c = &engine.counters;
    (
        c.spec_draft_tokens.load(Ordering::Relaxed),
        c.spec_accepted_tokens.load(Ordering::Relaxed),
    )
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams::greedy(max_tokens)
}

fn seeded(max_tokens: usize, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(seed),
        max_tokens,
        ..SamplingParams::default()
    }
}

/// `requests` (made by the closure, each time anew) with and without
/// drafts by `spec`; returns both outputs and the drafts (verified, kept).
fn both(
    name: &str,
    spec: SpeculativeConfig,
    adjust: impl Fn(&mut ServingSection),
    requests: impl Fn() -> Vec<Request>,
) -> (Vec<Output>, Vec<Output>, (u64, u64)) {
    let plain = loaded(name, |s| adjust(s));
    let source = plain.source();
    let mut engine = plain.engine(&source).unwrap();
    let without = serve(&mut engine, requests());
    assert_eq!(drafts(&engine), (0, 0));
    let fast = loaded(name, |s| {
        adjust(s);
        s.speculative = Some(spec);
    });
    let source = fast.source();
    let mut engine = fast.engine(&source).unwrap();
    let with = serve(&mut engine, requests());
    (without, with, drafts(&engine))
}

#[test]
fn greedy_output_is_the_same_with_drafts_on_every_family() {
    let (mut verified, mut kept) = (0, 0);
    for k in [1, 3] {
        for (name, spec) in drafters(k) {
            let (without, with, (v, a)) =
                both(name, spec, |_| {}, || vec![request(&prompt(0), greedy(48))]);
            assert_eq!(with, without, "{name}, k = {k}");
            assert_eq!(without[0].tokens.len(), 48);
            assert!(v > 0, "{name}, k = {k}: drafts are made");
            assert!(a <= v);
            verified += v;
            kept += a;
        }
    }
    assert!(kept > 0, "some drafts are kept ({kept} of {verified})");
    assert!(
        kept < verified,
        "some drafts are rejected ({kept} of {verified})"
    );
}

#[test]
fn batched_sequences_with_and_without_drafts_equal_their_solo_runs() {
    for (name, spec) in drafters(3) {
        let requests = || {
            vec![
                request(&prompt(1), greedy(30)),
                request(&prompt(2), seeded(25, 7)),
                // No repetition to look up: it drafts rarely, beside the others.
                request(
                    &(0..23).map(|i| (i * 89 + 5) % 500).collect::<Vec<_>>(),
                    greedy(20),
                ),
            ]
        };
        let (without, with, (v, _)) = both(name, spec, |_| {}, requests);
        assert_eq!(with, without, "{name}");
        assert!(v > 0, "{name}");
        // Each equals the same request served alone without drafts.
        let solo = loaded(name, |_| {});
        let source = solo.source();
        let mut engine = solo.engine(&source).unwrap();
        for (i, r) in requests().into_iter().enumerate() {
            assert_eq!(
                serve(&mut engine, vec![r]).remove(0),
                with[i],
                "{name}: request {i}"
            );
        }
    }
}

#[test]
fn seeded_sampling_draws_the_same_tokens_with_drafts() {
    for (name, spec) in drafters(2) {
        let requests = || {
            (0..3)
                .map(|seed| request(&prompt(3), seeded(40, seed)))
                .collect()
        };
        let (without, with, (v, _)) = both(name, spec, |_| {}, requests);
        assert_eq!(with, without, "{name}");
        assert!(v > 0, "{name}");
    }
}

#[test]
fn drafts_after_a_prefix_cache_hit_change_nothing() {
    for (name, spec) in drafters(3) {
        // Turn 2 resends turn 1's prompt and answer: it starts from the cache.
        let turn1 = prompt(4);
        let cold = loaded(name, |s| s.enable_prefix_caching = false);
        let source = cold.source();
        let mut engine = cold.engine(&source).unwrap();
        let answer = serve(&mut engine, vec![request(&turn1, greedy(40))]).remove(0);
        let mut turn2 = turn1.clone();
        turn2.extend(&answer.tokens);
        turn2.extend(prompt(5).iter().take(9));
        let expected = serve(&mut engine, vec![request(&turn2, greedy(24))]).remove(0);

        let warm = loaded(name, |s| s.speculative = Some(spec));
        let source = warm.source();
        let mut engine = warm.engine(&source).unwrap();
        assert_eq!(
            serve(&mut engine, vec![request(&turn1, greedy(40))])[0],
            answer,
            "{name}"
        );
        let hits = engine.counters.prefix_cache_hits.load(Ordering::Relaxed);
        assert_eq!(
            serve(&mut engine, vec![request(&turn2, greedy(24))])[0],
            expected,
            "{name}"
        );
        assert!(
            engine.counters.prefix_cache_hits.load(Ordering::Relaxed) > hits,
            "{name}: turn 2 hits the cache"
        );
    }
}

#[test]
fn drafts_under_preemption_change_nothing() {
    use sparkrt::plan::profile::KvCacheSize;
    for (name, spec) in drafters(3) {
        // A pool of 12 full-attention blocks (192 tokens; the plan gives a
        // block's bytes): six 40-token prompts growing to 80 tokens (5
        // blocks each) are preempted and recomputed.
        // (With the MTP head a block also holds the head's KV layer.)
        let probe = loaded(name, |s| {
            s.max_model_len = 128;
            s.speculative = Some(spec);
        });
        let bytes = probe.plan.kv_cache.block_bytes * 12;
        let small = move |s: &mut ServingSection| {
            s.kv_cache = KvCacheSize::Bytes(bytes);
            s.max_num_seqs = 6;
            s.max_model_len = 128;
        };
        let requests = || {
            (0..6)
                .map(|i| request(&prompt(10 + i), greedy(40)))
                .collect()
        };
        let fast = loaded(name, |s| {
            small(s);
            s.speculative = Some(spec);
        });
        let source = fast.source();
        let mut engine = fast.engine(&source).unwrap();
        let with = serve(&mut engine, requests());
        assert!(
            engine.counters.preemptions.load(Ordering::Relaxed) > 0,
            "{name}: the pool is small enough to preempt"
        );
        assert!(drafts(&engine).0 > 0, "{name}");
        let (without, ..) = both(name, spec, small, requests);
        assert_eq!(with, without, "{name}");
    }
}

#[test]
fn accepted_drafts_follow_the_targets_distribution() {
    use crate::engine_plans::{Plans, Scripted, VOCAB, limits};
    // Every row's logits are the same six-token distribution, whatever the
    // context: the target's tokens are independent draws from it, so with
    // drafts (which the prompt's repetition makes frequent) every generated
    // token must still be one (a chi-square test over 4800 draws).
    let weights: Vec<f64> = (0..6).map(|i| (-0.5 * i as f64).exp()).collect();
    let total: f64 = weights.iter().sum();
    let row = |_: &StepPlanRef, _: usize| {
        let mut logits = vec![-40.0f32; VOCAB];
        for (i, logit) in logits.iter_mut().take(6).enumerate() {
            *logit = -0.5 * i as f32;
        }
        logits
    };
    let mut l = limits(8, 64, 256);
    l.speculative = Some(ngram(3));
    let executor = Scripted {
        vocab: VOCAB,
        row,
        plans: Plans::default(),
    };
    let mut engine = Engine::new(executor, l, None, vec![]).unwrap();
    let requests = || {
        (0..600u64)
            .map(|seed| {
                let params = SamplingParams {
                    temperature: 1.0,
                    seed: Some(seed),
                    max_tokens: 8,
                    ..SamplingParams::default()
                };
                Request::new(vec![0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1], params).with_ignore_eos(true)
            })
            .collect::<Vec<_>>()
    };
    let outputs = serve_plain(&mut engine, requests());
    let mut counts = [0u64; 6];
    for tokens in &outputs {
        assert_eq!(tokens.len(), 8);
        for &t in tokens {
            counts[t as usize] += 1;
        }
    }
    let n: u64 = counts.iter().sum();
    let chi2: f64 = counts
        .iter()
        .zip(&weights)
        .map(|(&c, &w)| {
            let expected = n as f64 * w / total;
            (c as f64 - expected).powi(2) / expected
        })
        .sum();
    // 5 degrees of freedom: P(chi2 > 20.5) = 0.001.
    assert!(chi2 < 20.5, "chi-square {chi2:.2} over {counts:?}");
    let (verified, kept) = drafts(&engine);
    assert!(
        verified > 1000 && kept > 0 && kept < verified,
        "{kept} of {verified}"
    );
}

type StepPlanRef = sparkrt::engine::StepPlan;

/// Serves requests without log-probabilities; each one's tokens.
fn serve_plain(engine: &mut Engine<'_>, requests: Vec<Request>) -> Vec<Vec<u32>> {
    let receivers: Vec<_> = requests
        .into_iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            engine.add_request(r, Box::new(tx)).unwrap();
            rx
        })
        .collect();
    while engine.has_work() {
        engine.step().unwrap();
        engine.audit_blocks().unwrap();
    }
    receivers
        .iter()
        .map(|rx| {
            rx.try_iter()
                .filter_map(|e| match e {
                    Event::Token { id, .. } => Some(id),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn n_choices_draft_each_on_their_own_and_change_nothing() {
    for (name, spec) in drafters(3) {
        // One request, three seeded choices forked from one prompt pass.
        let run = |drafting: bool| {
            let l = loaded(name, |s| {
                if drafting {
                    s.speculative = Some(spec);
                }
            });
            let source = l.source();
            let mut engine = l.engine(&source).unwrap();
            let (sinks, receivers): (Vec<_>, Vec<_>) = (0..3)
                .map(|_| {
                    let (tx, rx) = mpsc::channel();
                    (Box::new(tx) as Box<dyn sparkrt::engine::EventSink>, rx)
                })
                .unzip();
            engine
                .add_request_group(request(&prompt(6), seeded(40, 11)), sinks)
                .unwrap();
            while engine.has_work() {
                engine.step().unwrap();
                engine.audit_blocks().unwrap();
            }
            let outputs: Vec<Output> = receivers.iter().map(collect).collect();
            (outputs, drafts(&engine))
        };
        let (without, _) = run(false);
        let (with, (verified, _)) = run(true);
        assert_eq!(with, without, "{name}");
        assert!(verified > 0, "{name}");
        assert_ne!(with[0], with[1], "{name}: the choices differ");
    }
}

/// The checkpoint in `dir` opened drafting with the MTP head: the
/// refusal's message.
fn mtp_refusal(dir: &std::path::Path) -> String {
    let (config, _) = checkpoint::load(dir).unwrap();
    let mut profile = Profile::for_checkpoint(
        CheckpointFacts {
            geometry: &config.geometry,
            max_position_embeddings: config.max_position_embeddings,
        },
        Some(dir.to_path_buf()),
    )
    .unwrap();
    profile.serving.speculative = Some(mtp(2));
    let host_root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    match Loaded::open_cpu(dir, Some(&profile), &host, PageCachePolicy::Keep) {
        Ok(_) => panic!("{}: opened without an MTP head", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn mtp_drafts_without_a_head_are_refused_by_name() {
    // A config naming a head whose tensors the export dropped.
    let headless = std::env::temp_dir().join(format!("sparkrt-headless-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&headless);
    std::fs::create_dir_all(&headless).unwrap();
    let source = common::fixture("qwen35-moe-tiny");
    for file in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(source.join(file), headless.join(file)).unwrap();
    }
    let config = std::fs::read_to_string(source.join("config.json")).unwrap();
    let config = config.replacen(
        "\"text_config\": {",
        "\"text_config\": {\"mtp_num_hidden_layers\": 1,",
        1,
    );
    assert!(config.contains("mtp_num_hidden_layers"));
    std::fs::write(headless.join("config.json"), config).unwrap();
    let cases = [
        (
            common::fixture("qwen3-moe-tiny"),
            "qwen3_moe checkpoints have no MTP head",
        ),
        (source, "its config has no mtp_num_hidden_layers"),
        (headless.clone(), "files hold no `mtp.*` tensors"),
    ];
    let messages: Vec<String> = cases.iter().map(|(dir, _)| mtp_refusal(dir)).collect();
    let _ = std::fs::remove_dir_all(&headless);
    for ((_, reason), message) in cases.iter().zip(&messages) {
        assert!(message.contains(reason), "{message}");
        assert!(
            message.contains("draft with \"ngram\" instead"),
            "{message}"
        );
    }
}
