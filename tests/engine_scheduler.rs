//! The scheduling policy on the tiny fixture with a KV cache of 32
//! blocks of 16 tokens (two sequences of max_model_len 256): when
//! sequences preempt, how often, and that recomputing changes nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sparkrt::backend::cpu::CpuBackend;
use sparkrt::checkpoint::PageCachePolicy;
use sparkrt::engine::sampling::SamplingParams;
use sparkrt::engine::{Engine, Event, FinishReason, Request};
use sparkrt::plan::profile::{KvCacheSize, Profile};
use sparkrt::runtime::{HostSource, Loaded};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn loaded() -> Loaded<CpuBackend> {
    let mut profile = Profile::load(&repo().join("profiles/qwen3-moe-tiny.toml")).unwrap();
    profile.serving.max_model_len = 256;
    profile.serving.max_num_batched_tokens = 64;
    // 1 MiB of f32 KV at 2048 bytes per token: 512 tokens, 32 blocks.
    profile.serving.kv_cache = KvCacheSize::Bytes(1 << 20);
    let root = repo().join("tests/fixtures/hosts/box24");
    let host = HostSource {
        root: &root,
        kubelet_config: None,
    };
    let dir = repo().join("tests/fixtures/qwen3-moe-tiny");
    Loaded::open_cpu(&dir, Some(&profile), &host, PageCachePolicy::Keep).unwrap()
}

/// A greedy request of `prompt_len` made-up tokens that generates
/// exactly `max_tokens`.
fn request(prompt_len: usize, seed: u32, max_tokens: usize) -> Request {
    Request::new(
        (0..prompt_len as u32)
            .map(|i| (i * 37 + seed * 101) % 500)
            .collect(),
        SamplingParams::greedy(max_tokens),
    )
    .with_ignore_eos(true)
}

/// Serves `requests` together; returns each one's generated tokens.
fn serve(engine: &mut Engine<'_>, requests: &[Request]) -> Vec<Vec<u32>> {
    let receivers = crate::fixture_runs::submit(engine, requests);
    while engine.has_work() {
        engine.step().unwrap();
        assert!(engine.kv_blocks_used() <= engine.kv_blocks_total());
    }
    assert_eq!(engine.kv_blocks_used(), 0, "every block is back");
    receivers
        .into_iter()
        .zip(requests)
        .map(|(rx, r)| {
            let mut tokens = Vec::new();
            for event in rx.try_iter() {
                match event {
                    Event::Token { id, .. } => tokens.push(id),
                    Event::Finished { reason, .. } => {
                        assert_eq!(reason, FinishReason::Length)
                    }
                    Event::PromptLogits { .. } | Event::PromptLogprob { .. } => {}
                    Event::Failed { message } => panic!("failed: {message}"),
                }
            }
            assert_eq!(tokens.len(), r.params.max_tokens);
            tokens
        })
        .collect()
}

fn counter(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

#[test]
fn the_newest_sequence_is_preempted_once_and_recomputed_exactly() {
    let loaded = loaded();
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    assert_eq!(engine.kv_blocks_total(), 32);
    // Three sequences of 60 + 190 = 250 tokens (16 blocks each at the
    // end). They start together (4 blocks each) and decode in step, the
    // third a little behind; at 161 tokens each needs an 11th block and
    // 3 x 11 > 32, so the third, the newest, is preempted. It holds 11
    // blocks' worth of tokens, more than the 10 then free, so it waits
    // until the first finishes, and the two others (16 + 16 = 32
    // blocks) never run short again: exactly one preemption.
    let requests: Vec<Request> = (0..3).map(|i| request(60, i, 190)).collect();
    let alone: Vec<Vec<u32>> = requests
        .iter()
        .flat_map(|r| serve(&mut engine, std::slice::from_ref(r)))
        .collect();
    let counters = Arc::clone(&engine.counters);
    assert_eq!(counter(&counters.preemptions), 0);
    let prompt_before = counter(&counters.prompt_tokens);
    assert_eq!(prompt_before, 180);

    let together = serve(&mut engine, &requests);
    assert_eq!(together, alone, "recomputing changes no token");
    assert_eq!(counter(&counters.preemptions), 1);
    assert_eq!(
        counter(&counters.prompt_tokens) - prompt_before,
        180,
        "a recomputed prompt counts once"
    );
    assert_eq!(counter(&counters.generation_tokens), 2 * 3 * 190);
}

#[test]
fn a_sequence_that_cannot_have_all_its_blocks_waits_instead_of_starting() {
    let loaded = loaded();
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    // Two sequences of 200 + 8 tokens take 13 blocks each, 26 of 32.
    // The third one's 100 prompt tokens need 7 blocks: it waits for the
    // first two to finish rather than start into a preemption.
    let requests = vec![request(200, 0, 8), request(200, 1, 8), request(100, 2, 8)];
    let alone: Vec<Vec<u32>> = requests
        .iter()
        .flat_map(|r| serve(&mut engine, std::slice::from_ref(r)))
        .collect();
    let together = serve(&mut engine, &requests);
    assert_eq!(together, alone);
    assert_eq!(counter(&engine.counters.preemptions), 0);
    assert_eq!(counter(&engine.counters.prompt_tokens), 2 * 500);
}
