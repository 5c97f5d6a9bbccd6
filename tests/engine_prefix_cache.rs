//! Prefix caching on the CPU engine: a request whose prefix comes from the
//! cache samples bitwise what a cold engine (caching off) samples, on the
//! qwen3 and gpt-oss fixtures (gpt-oss's sliding-window layers hit their
//! last window's blocks), at block-aligned and unaligned prefix lengths, alone and in batches, under preemption and
//! eviction; `cache_salt` separates requests; `n = 4` equals four seeded
//! requests with the prompt computed once; and over random schedules the
//! block books stay straight.

use std::sync::atomic::Ordering;
use std::sync::mpsc;

use sparkrt::checkpoint::PageCachePolicy;
use sparkrt::engine::sampling::SamplingParams;
use sparkrt::engine::{Engine, Event, EventSink, LogprobRequest, Request};
use sparkrt::plan::profile::{KvCacheSize, Profile};
use sparkrt::runtime::{HostSource, Loaded};
use sparkrt::util::rng::SplitMix64;

use crate::common;
use crate::fixture_runs::{FIXTURES, profile};

const BLOCK: usize = 16;

/// Builds `name`'s engine from `profile` and hands it to `f`.
fn with_engine<R>(name: &str, profile: &Profile, f: impl FnOnce(&mut Engine<'_>) -> R) -> R {
    let host_root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    let loaded = Loaded::open_cpu(
        &common::fixture(name),
        Some(profile),
        &host,
        PageCachePolicy::Keep,
    )
    .unwrap();
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    assert_eq!(engine.limits().kv_block_size, BLOCK);
    f(&mut engine)
}

fn caching(name: &str, on: bool) -> Profile {
    let mut p = profile(name);
    p.serving.enable_prefix_caching = on;
    p
}

/// A profile whose KV pool holds `blocks` blocks (found by asking an engine
/// how many a MiB holds), 256 tokens a sequence, 64 a step.
fn tiny_pool(name: &str, blocks: u64, on: bool) -> Profile {
    let mut p = caching(name, on);
    p.serving.max_model_len = 256;
    p.serving.max_num_batched_tokens = 64;
    p.serving.kv_cache = KvCacheSize::Bytes(1 << 20);
    let per_mib = with_engine(name, &p, |e| e.kv_blocks_total()) as u64;
    p.serving.kv_cache = KvCacheSize::Bytes(((1u64 << 20) * blocks).div_ceil(per_mib));
    p
}

/// Made-up prompt tokens: `len` of them from stream `seed`.
fn tokens(len: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    (0..len).map(|_| (rng.next_u64() % 500) as u32).collect()
}

/// A seeded sampled request reporting each token's log-probability with 5
/// alternatives: its tokens and those figures depend on every bit of the
/// logits rows they come from.
fn request(prompt: Vec<u32>, seed: u64, max_tokens: usize) -> Request {
    Request::new(
        prompt,
        SamplingParams {
            temperature: 0.9,
            seed: Some(seed),
            max_tokens,
            ..SamplingParams::default()
        },
    )
    .with_ignore_eos(true)
    .with_logprobs(LogprobRequest {
        sampled: Some(5),
        prompt: None,
    })
}

/// A sampled token, its log-probability's bits and its alternatives' (id, bits).
type TokenBits = (u32, u32, Vec<(u32, u32)>);

/// What a request sampled, as bits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Sampled {
    tokens: Vec<TokenBits>,
    cached_tokens: usize,
}

fn collect(rx: mpsc::Receiver<Event>) -> Sampled {
    let mut out = Sampled::default();
    for event in rx.try_iter() {
        match event {
            Event::Token { id, logprob, .. } => {
                let l = logprob.expect("log-probabilities were asked for");
                let top = l.top.iter().map(|&(t, v)| (t, v.to_bits())).collect();
                out.tokens.push((id, l.logprob.to_bits(), top));
            }
            Event::Finished { cached_tokens, .. } => out.cached_tokens = cached_tokens,
            Event::Failed { message } => panic!("failed: {message}"),
            Event::PromptLogits { .. } | Event::PromptLogprob { .. } => {}
        }
    }
    out
}

/// Serves `requests` together, checking the block books after every step.
fn serve(engine: &mut Engine<'_>, requests: &[Request]) -> Vec<Sampled> {
    let receivers = crate::fixture_runs::submit(engine, requests);
    run_to_end(engine);
    receivers.into_iter().map(collect).collect()
}

fn run_to_end(engine: &mut Engine<'_>) {
    while engine.has_work() {
        engine.step().unwrap();
        engine.audit_blocks().unwrap();
        let (used, cached, free) = (
            engine.kv_blocks_used(),
            engine.kv_blocks_cached(),
            engine.kv_blocks_free(),
        );
        assert_eq!(used + cached + free, engine.kv_blocks_total());
    }
    assert_eq!(engine.kv_blocks_used(), 0, "every block is back");
}

/// Each request served alone by an engine with caching off.
fn cold(name: &str, profile: &Profile, requests: &[Request]) -> Vec<Sampled> {
    let mut p = profile.clone();
    p.serving.enable_prefix_caching = false;
    with_engine(name, &p, |e| {
        requests
            .iter()
            .map(|r| {
                let out = serve(e, std::slice::from_ref(r)).remove(0);
                assert_eq!(out.cached_tokens, 0);
                out
            })
            .collect()
    })
}

/// Tokens a hit on `full_blocks` cached blocks serves (on gpt-oss the
/// sliding layers' blocks of the last window are cached beside them).
fn served(full_blocks: usize) -> usize {
    full_blocks * BLOCK
}

/// Asserts each request sampled the same tokens with the same bits as its
/// reference, naming the first difference.
fn assert_same(got: &[Sampled], want: &[Sampled], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.tokens.len(), w.tokens.len(), "{what}: request {r} length");
        if let Some(t) = (0..g.tokens.len()).find(|&t| g.tokens[t] != w.tokens[t]) {
            panic!(
                "{what}: request {r} (cached {}) differs at token {t}: {:?} vs cold {:?}",
                g.cached_tokens, g.tokens[t], w.tokens[t]
            );
        }
    }
}

#[test]
fn cache_hits_give_bitwise_the_cold_tokens_and_logprobs_on_every_fixture() {
    let base = tokens(80, 7);
    // Block-aligned and not, one block to several.
    let lengths = [16, 32, 37, 50, 64, 71];
    for name in FIXTURES {
        let targets: Vec<Request> = lengths
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                let mut prompt = base[..l].to_vec();
                prompt.extend(tokens(5, 100 + i as u64));
                request(prompt, 40 + i as u64, 6)
            })
            .collect();
        let reference = cold(name, &caching(name, false), &targets);
        with_engine(name, &caching(name, true), |engine| {
            // Alone: a request sharing the prefix warms the cache first.
            for (i, (&l, target)) in lengths.iter().zip(&targets).enumerate() {
                let mut warm = base[..l].to_vec();
                warm.extend(tokens(5, 900 + i as u64));
                serve(engine, &[request(warm, 1, 6)]);
                let out = serve(engine, std::slice::from_ref(target)).remove(0);
                assert_eq!(out.cached_tokens, served(l / BLOCK), "{name} prefix {l}");
                assert_same(
                    &[out],
                    &reference[i..=i],
                    &format!("{name}: prefix {l} from the cache"),
                );
            }
            // In a batch, all from the cache at once (and again, now that
            // each target's own blocks are cached too).
            for round in 0..2 {
                let together = serve(engine, &targets);
                assert_same(
                    &together,
                    &reference,
                    &format!("{name}: batch round {round}"),
                );
            }
            let c = &engine.counters;
            assert_eq!(
                c.prefix_cache_hits.load(Ordering::Relaxed) > 0,
                served(1) > 0,
                "{name}"
            );
            assert!(
                c.prefix_cache_hits.load(Ordering::Relaxed)
                    <= c.prefix_cache_queries.load(Ordering::Relaxed)
            );
        });
    }
}

#[test]
fn preemption_under_a_tiny_pool_keeps_cache_hits_exact() {
    for name in ["qwen3-moe-tiny", "gpt-oss-tiny"] {
        let profile = tiny_pool(name, 32, true);
        let shared = tokens(64, 3);
        // 8 requests of 100 to 170 tokens sharing 64: 7 to 11 blocks
        // each, more than 32 at once.
        let requests: Vec<Request> = (0..8u64)
            .map(|i| {
                let mut prompt = shared.clone();
                prompt.extend(tokens(36 + 10 * i as usize, 50 + i));
                request(prompt, i, 40)
            })
            .collect();
        let reference = cold(name, &profile, &requests);
        with_engine(name, &profile, |engine| {
            let together = serve(engine, &requests);
            assert!(
                engine.counters.preemptions.load(Ordering::Relaxed) > 0,
                "{name}: the pool is small enough to preempt"
            );
            let hits = engine.counters.prefix_cache_hits.load(Ordering::Relaxed);
            assert_eq!(hits > 0, served(1) > 0, "{name}");
            assert_same(&together, &reference, name);
        });
    }
}

#[test]
fn many_distinct_prefixes_evict_the_least_recently_used() {
    for name in ["qwen3-moe-tiny", "gpt-oss-tiny"] {
        evict_least_recently_used(name);
    }
}

fn evict_least_recently_used(name: &str) {
    let profile = tiny_pool(name, 32, true);
    // 12 prefixes of 4 blocks, each request 5 blocks: 60 blocks > 32.
    let prefixes: Vec<Vec<u32>> = (0..12).map(|i| tokens(64, 500 + i)).collect();
    let ask = |i: usize, tail: u64| {
        let mut prompt = prefixes[i].clone();
        prompt.extend(tokens(6, tail));
        request(prompt, tail, 4)
    };
    let again = [ask(0, 77), ask(11, 78)];
    let reference = cold(name, &profile, &again);
    with_engine(name, &profile, |engine| {
        for i in 0..12 {
            serve(engine, &[ask(i, 1000 + i as u64)]);
        }
        assert!(engine.kv_blocks_cached() <= engine.kv_blocks_total());
        let out: Vec<Sampled> = again
            .iter()
            .map(|r| serve(engine, std::slice::from_ref(r)).remove(0))
            .collect();
        assert_eq!(
            out[0].cached_tokens, 0,
            "{name}: the oldest prefix was evicted"
        );
        assert_eq!(
            out[1].cached_tokens, 64,
            "{name}: the newest is still cached"
        );
        assert_same(&out, &reference, &format!("{name}: after eviction"));
        engine.audit_blocks().unwrap();
    });
}

#[test]
fn different_salts_never_share_and_prompt_rows_skip_the_cache() {
    let name = "qwen3-moe-tiny";
    with_engine(name, &caching(name, true), |engine| {
        let prompt = tokens(40, 9);
        let salted = |salt: Option<&str>| Request {
            cache_salt: salt.map(str::to_string),
            ..request(prompt.clone(), 5, 3)
        };
        let first = serve(engine, &[salted(Some("alice"))]).remove(0);
        assert_eq!(first.cached_tokens, 0);
        let other = serve(engine, &[salted(Some("bob"))]).remove(0);
        assert_eq!(other.cached_tokens, 0, "another salt shares nothing");
        let unsalted = serve(engine, &[salted(None)]).remove(0);
        assert_eq!(unsalted.cached_tokens, 0, "no salt is a salt of its own");
        let same = serve(engine, &[salted(Some("alice"))]).remove(0);
        assert_eq!(same.cached_tokens, 32, "the same salt hits");
        assert_same(&[same], &[first], "the same salt");
        // Prompt log-probabilities need every prompt row: no hit.
        let mut rows = salted(Some("alice"));
        rows.logprobs.prompt = Some(1);
        assert_eq!(serve(engine, &[rows]).remove(0).cached_tokens, 0);
        let too_long = Request {
            cache_salt: Some("x".repeat(sparkrt::limits::MAX_CACHE_SALT_BYTES + 1)),
            ..request(prompt.clone(), 5, 3)
        };
        let (tx, _rx) = mpsc::channel();
        assert!(engine.add_request(too_long, Box::new(tx)).is_err());
    });
}

#[test]
fn n_choices_equal_separately_seeded_requests_with_the_prompt_computed_once() {
    for name in ["qwen3-moe-tiny", "gpt-oss-tiny"] {
        let prompt = tokens(53, 21);
        let seed = 1234;
        let separate: Vec<Request> = (0..4)
            .map(|j| request(prompt.clone(), seed + j, 8))
            .collect();
        let reference = cold(name, &caching(name, true), &separate);
        // Room for all four at once: the three later choices are forked
        // from the first when it samples; 2 sequences at most: one fork,
        // the other two start later from the cached full blocks.
        for max_num_seqs in [4, 2] {
            let mut profile = caching(name, true);
            profile.serving.max_num_seqs = max_num_seqs;
            with_engine(name, &profile, |engine| {
                let (sinks, receivers): (Vec<Box<dyn EventSink>>, Vec<_>) = (0..4)
                    .map(|_| {
                        let (tx, rx) = mpsc::channel::<Event>();
                        (Box::new(tx) as Box<dyn EventSink>, rx)
                    })
                    .unzip();
                let ids = engine
                    .add_request_group(request(prompt.clone(), seed, 8), sinks)
                    .unwrap();
                assert_eq!(ids.len(), 4);
                run_to_end(engine);
                engine.audit_blocks().unwrap();
                let out: Vec<Sampled> = receivers.into_iter().map(collect).collect();
                let what = format!("{name}, {max_num_seqs} sequences");
                assert_same(&out, &reference, &what);
                // A forked choice computed none of the prompt; one started
                // later computed the partial last block only.
                let forked = max_num_seqs - 1;
                let full = served((prompt.len() - 1) / BLOCK);
                assert_eq!(out[0].cached_tokens, 0, "{what}");
                for choice in &out[1..=forked] {
                    assert_eq!(choice.cached_tokens, prompt.len(), "{what}");
                }
                for choice in &out[forked + 1..] {
                    assert_eq!(choice.cached_tokens, full, "{what}");
                }
                assert_eq!(
                    engine.counters.prefix_cache_hits.load(Ordering::Relaxed),
                    ((3 - forked) * full) as u64,
                    "{what}"
                );
            });
        }
    }
}

#[test]
fn random_schedules_keep_the_block_books_straight() {
    for name in ["qwen3-moe-tiny", "gpt-oss-tiny"] {
        random_schedule(name);
    }
}

/// 400 steps of random arrivals (some as `n = 2` groups, forked), aborts
/// and the preemptions a 24-block pool forces, with a full audit after
/// every step; then every request that was not aborted must have sampled
/// what it samples alone, cold.
fn random_schedule(name: &str) {
    let profile = tiny_pool(name, 24, true);
    let prefixes: Vec<Vec<u32>> = (0..3).map(|i| tokens(48, 70 + i)).collect();
    let mut rng = SplitMix64::new(17);
    let mut served_requests: Vec<(Request, mpsc::Receiver<Event>, bool)> = Vec::new();
    with_engine(name, &profile, |engine| {
        let mut ids = Vec::new();
        for step in 0..400 {
            let kind = rng.next_u64() % 8;
            match kind {
                0..=3 => {
                    let p = &prefixes[(rng.next_u64() % 3) as usize];
                    let keep = (rng.next_u64() % 49) as usize;
                    let mut prompt = p[..keep].to_vec();
                    prompt.extend(tokens(1 + (rng.next_u64() % 40) as usize, step));
                    let r = request(prompt, step, 1 + (rng.next_u64() % 30) as usize);
                    let choices = if kind == 3 { 2 } else { 1 };
                    let (sinks, receivers): (Vec<Box<dyn EventSink>>, Vec<_>) = (0..choices)
                        .map(|_| {
                            let (tx, rx) = mpsc::channel::<Event>();
                            (Box::new(tx) as Box<dyn EventSink>, rx)
                        })
                        .unzip();
                    let group = engine.add_request_group(r.clone(), sinks).unwrap();
                    for (j, (id, rx)) in group.into_iter().zip(receivers).enumerate() {
                        let mut choice = r.clone();
                        choice.params.seed = Some(step + j as u64);
                        ids.push(id);
                        served_requests.push((choice, rx, false));
                    }
                }
                4 if !ids.is_empty() => {
                    let i = (rng.next_u64() % ids.len() as u64) as usize;
                    engine.abort(ids[i]);
                    served_requests[i].2 = true;
                }
                _ => {}
            }
            engine.step().unwrap();
            engine.audit_blocks().unwrap();
            assert_eq!(
                engine.kv_blocks_used() + engine.kv_blocks_cached() + engine.kv_blocks_free(),
                engine.kv_blocks_total()
            );
        }
        run_to_end(engine);
        engine.audit_blocks().unwrap();
        assert_eq!(engine.kv_blocks_used(), 0, "{name}: every block back");
        assert!(
            engine.counters.preemptions.load(Ordering::Relaxed) > 0,
            "{name}"
        );
        assert!(
            engine.counters.prefix_cache_hits.load(Ordering::Relaxed) > 0,
            "{name}"
        );
    });
    let finished: Vec<(Request, Sampled)> = served_requests
        .into_iter()
        .filter(|(_, _, aborted)| !aborted)
        .map(|(r, rx, _)| (r, collect(rx)))
        .collect();
    let requests: Vec<Request> = finished.iter().map(|(r, _)| r.clone()).collect();
    let reference = cold(name, &profile, &requests);
    for (i, ((_, got), want)) in finished.into_iter().zip(reference).enumerate() {
        assert_same(&[got], &[want], &format!("{name}: request {i}"));
    }
}
