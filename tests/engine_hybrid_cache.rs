//! Prefix caching on the hybrid (Gated DeltaNet) fixtures, through the
//! runtime and the engine on the CPU backend: a request reuses a cached
//! prefix only up to a block boundary whose recurrent state was kept, and
//! what it then computes is what a cold engine computes, bit for bit (the
//! greedy tokens and their log-probabilities), with the hit counted:
//!
//! - a resent prompt starts at its last full block (144 of 150 tokens);
//! - the next turn of a conversation (prompt + answer + more) starts at the
//!   last block boundary the answer decoded past (its rolling snapshot);
//! - a request sharing only the head of a long prompt starts at the deepest
//!   interval snapshot inside the shared part, and with interval 0 at none;
//! - random mixes of shared prefixes, aborts and a snapshot pool smaller
//!   than the demand keep the books straight and every output cold-equal.

use std::sync::mpsc;

use sparkrt::backend::cpu::CpuBackend;
use sparkrt::checkpoint::{self, PageCachePolicy};
use sparkrt::engine::sampling::SamplingParams;
use sparkrt::engine::{Engine, Event, LogprobRequest, Request};
use sparkrt::plan::profile::{CheckpointFacts, KvCacheDtype, Profile, ServingSection};
use sparkrt::runtime::{HostSource, Loaded};
use sparkrt::util::rng::SplitMix64;

use crate::common;
use crate::model_qwen35::{FIXTURES, reference};

/// Steps of at most this many tokens: the 150-token prompt takes five.
const BATCHED: usize = 32;

/// A fixture through the runtime: f32 KV, 256-token sequences, 16-token
/// blocks, `serving` adjusted by `adjust`.
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
    s.max_num_batched_tokens = BATCHED;
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

/// What one greedy request produced: its tokens and the bits of their
/// log-probabilities.
#[derive(Debug, PartialEq, Eq)]
struct Output {
    tokens: Vec<u32>,
    logprob_bits: Vec<u32>,
}

fn request(prompt: &[u32], max_tokens: usize) -> Request {
    Request::new(prompt.to_vec(), SamplingParams::greedy(max_tokens))
        .with_ignore_eos(true)
        .with_logprobs(LogprobRequest {
            sampled: Some(0),
            prompt: None,
        })
}

fn collect(rx: mpsc::Receiver<Event>) -> Output {
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

/// Serves one request to the end; returns its output and the prompt
/// tokens the prefix cache served.
fn serve(engine: &mut Engine<'_>, prompt: &[u32], max_tokens: usize) -> (Output, u64) {
    use std::sync::atomic::Ordering;
    let hits = engine.counters.prefix_cache_hits.load(Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    engine
        .add_request(request(prompt, max_tokens), Box::new(tx))
        .unwrap();
    while engine.has_work() {
        engine.step().unwrap();
        engine.audit_blocks().unwrap();
    }
    let served = engine.counters.prefix_cache_hits.load(Ordering::Relaxed) - hits;
    (collect(rx), served)
}

/// `prompt` through an engine that caches nothing.
fn cold(name: &str, prompt: &[u32], max_tokens: usize) -> Output {
    let l = loaded(name, |s| s.enable_prefix_caching = false);
    let source = l.source();
    let mut engine = l.engine(&source).unwrap();
    let (out, served) = serve(&mut engine, prompt, max_tokens);
    assert_eq!(served, 0);
    out
}

#[test]
fn a_resent_prompt_starts_from_its_last_full_block() {
    for name in FIXTURES {
        let long = reference(name, "long_");
        assert_eq!(long.input_ids.len(), 150);
        let l = loaded(name, |_| {});
        let source = l.source();
        let mut engine = l.engine(&source).unwrap();
        let (first, served) = serve(&mut engine, &long.input_ids, 8);
        assert_eq!(served, 0, "{name}: nothing cached yet");
        assert_eq!(first.tokens, long.greedy_ids[..8], "{name}");
        assert_eq!(engine.state_snapshots(), 1, "{name}: the one at 144");
        let (again, served) = serve(&mut engine, &long.input_ids, 8);
        // (150 − 1) / 16 = 9 full blocks before the last token.
        assert_eq!(served, 144, "{name}");
        assert_eq!(again, first, "{name}: the hit computes what the miss did");
    }
}

#[test]
fn the_next_turn_starts_from_the_rolling_snapshot() {
    let name = "qwen35-moe-tiny";
    let long = reference(name, "long_").input_ids;
    let l = loaded(name, |_| {});
    let source = l.source();
    let mut engine = l.engine(&source).unwrap();
    // 150 prompt tokens and 20 decoded: positions up to 168 computed, so
    // the decode passed the boundary at 160.
    let (answer, _) = serve(&mut engine, &long, 20);
    let mut next: Vec<u32> = long.clone();
    next.extend(&answer.tokens);
    next.extend([5, 6, 7, 8, 9]);
    let (warm, served) = serve(&mut engine, &next, 6);
    assert_eq!(
        served, 160,
        "the rolling snapshot at 160, not the prompt's at 144"
    );
    assert_eq!(warm, cold(name, &next, 6));
}

#[test]
fn a_shared_head_starts_at_the_deepest_interval_snapshot() {
    let name = "qwen35-tiny";
    let long = reference(name, "long_").input_ids;
    // The first 100 tokens shared, then 30 of the prompt's own reversed.
    let mut other: Vec<u32> = long[..100].to_vec();
    other.extend(long[100..130].iter().rev());
    for (interval, expected) in [(32, 96), (48, 96), (64, 64), (0, 0)] {
        let l = loaded(name, |s| s.state_snapshot_interval = interval);
        let source = l.source();
        let mut engine = l.engine(&source).unwrap();
        serve(&mut engine, &long, 2);
        let (warm, served) = serve(&mut engine, &other, 6);
        assert_eq!(served, expected, "interval {interval}");
        assert_eq!(warm, cold(name, &other, 6), "interval {interval}");
    }
}

/// A draw in `0..n`.
fn below(rng: &mut SplitMix64, n: u64) -> u64 {
    rng.next_u64() % n
}

#[test]
fn random_mixes_keep_the_books_and_compute_what_a_cold_engine_does() {
    let name = "qwen35-moe-tiny";
    let long = reference(name, "long_").input_ids;
    let mut rng = SplitMix64::new(0x5eed);
    // Prompts sharing heads of the long prompt, with tails of their own.
    let prompts: Vec<Vec<u32>> = (0..10)
        .map(|_| {
            let head = 16 + below(&mut rng, 120) as usize;
            let mut p = long[..head].to_vec();
            p.extend((0..1 + below(&mut rng, 20)).map(|_| 3 + below(&mut rng, 200) as u32));
            p
        })
        .collect();
    // Three sequences at once and three snapshot slots: snapshots are
    // evicted and slots run out.
    let l = loaded(name, |s| {
        s.max_num_seqs = 3;
        s.state_snapshots = Some(3);
        s.state_snapshot_interval = 32;
    });
    let source = l.source();
    let mut engine = l.engine(&source).unwrap();
    let mut receivers = Vec::new();
    let mut aborted = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let (tx, rx) = mpsc::channel();
        let id = engine
            .add_request(request(prompt, 4 + i % 5), Box::new(tx))
            .unwrap();
        receivers.push(rx);
        // Steps between arrivals, and now and then an abort mid-flight.
        for _ in 0..below(&mut rng, 4) {
            engine.step().unwrap();
            engine.audit_blocks().unwrap();
        }
        if i % 4 == 3 {
            engine.abort(id);
            aborted.push(i);
        }
    }
    while engine.has_work() {
        engine.step().unwrap();
        engine.audit_blocks().unwrap();
    }
    use std::sync::atomic::Ordering;
    assert!(engine.counters.prefix_cache_hits.load(Ordering::Relaxed) > 0);
    assert!(engine.state_snapshots() <= 3);
    for (i, rx) in receivers.into_iter().enumerate() {
        if aborted.contains(&i) {
            continue;
        }
        let out = collect(rx);
        assert_eq!(out, cold(name, &prompts[i], 4 + i % 5), "request {i}");
    }
}
