//! The CPU engine against the transformers references in tests/fixtures:
//! prompt logits within 2e-3, greedy continuations identical; and chunked
//! prefill, one-token-at-a-time decoding and batches of different prompts
//! giving the logits of a single full pass.

use crate::common;
use crate::fixture_runs;

use sparkrt::checkpoint::PageCachePolicy;
use sparkrt::checkpoint::kv_scales::KvScales;
use sparkrt::engine::FinishReason;
use sparkrt::plan::profile::{KvCacheDtype, Profile};

use fixture_runs::{FIXTURES, Outcome, max_abs_diff, profile, reference, serve_greedy};
use sparkrt::runtime::{HostSource, Loaded, Planned, plan_checkpoint};

/// Runs `prompts` together through an engine built from `profile`, greedy,
/// `max_tokens` each, and returns each request's outcome.
fn run(name: &str, profile: &Profile, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Outcome> {
    let host_root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    let dir = common::fixture(name);
    let loaded = Loaded::open_cpu(&dir, Some(profile), &host, PageCachePolicy::Keep).unwrap();
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    serve_greedy(&mut engine, prompts, max_tokens)
}

/// The CPU backend allocates exactly the plan's KV cache and step metadata
/// (the figures checked by hand here), and a whole start-up leaves every
/// planned buffer charged in full (`Loaded::engine` checks it).
#[test]
fn cpu_kv_and_step_allocations_are_the_plans_figures() {
    use sparkrt::backend::Backend;
    use sparkrt::backend::cpu::CpuBackend;
    use sparkrt::plan::PlanDevice;
    use sparkrt::plan::ledger::{Category, Ledger};
    use std::sync::Arc;

    let host_root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    for name in FIXTURES {
        let dir = common::fixture(name);
        let p = profile(name);
        let Planned { config, plan, .. } =
            plan_checkpoint(&dir, Some(&p), &host, PlanDevice::Cpu).unwrap();
        let kv = &plan.kv_cache;
        let s = &p.serving;

        // By hand: one pool of blocks shared by the full-attention and the
        // sliding-window layers, in max(full, sliding) arrays (the k-th layer
        // of each kind shares array k) of K and V for every slot.
        let width = (config.geometry.num_kv_heads * config.geometry.head_dim) as u64;
        let dtype = s.kv_cache_dtype.bytes();
        let block = s.kv_block_size as u64;
        let sliding_layers = kv.sliding.layers;
        let full_layers = config.geometry.num_layers as u64 - sliding_layers;
        let arrays = full_layers.max(sliding_layers);
        assert_eq!(kv.bytes_per_token, 2 * arrays * width * dtype, "{name}");
        assert_eq!(kv.block_bytes, kv.bytes_per_token * block, "{name}");
        // The sliding layers' reserve: per sequence the blocks of its window
        // and one more, and the blocks of one step's tokens.
        let sliding_blocks = match name {
            // No sliding layers.
            "qwen3-moe-tiny" | "qwen3-moe-tiny-nvfp4" => 0,
            // 2 of 4 layers (window 8, blocks of 16, 8 sequences, 256
            // tokens a step): 8 × (⌈7 / 16⌉ + 1 + 1) + ⌈256 / 16⌉ = 40,
            // under the cap 8 × ⌈1024 / 16⌉ = 512.
            "gpt-oss-tiny" => {
                assert_eq!((sliding_layers, arrays), (2, 2));
                40
            }
            other => panic!("no figures by hand for {other}"),
        };
        assert_eq!(kv.sliding.blocks, sliding_blocks, "{name}");
        assert_eq!(kv.sliding.bytes, sliding_blocks * kv.block_bytes, "{name}");
        // The full-attention tokens fill the rest of the pool.
        assert_eq!(kv.tokens, (kv.blocks - sliding_blocks) * block, "{name}");
        // arrays × blocks × block × width × (K, V) × dtype.
        let expected_kv = arrays * kv.blocks * block * width * 2 * dtype;
        assert_eq!(kv.bytes, expected_kv, "{name}");
        assert_eq!(
            kv.bytes,
            kv.tokens * kv.bytes_per_token + kv.sliding.bytes,
            "{name}"
        );
        // Token ids and positions; five fields and two block tables (full
        // and sliding) per sequence.
        let blocks_per_seq = s.max_model_len.div_ceil(s.kv_block_size) as u64;
        let expected_step = (2 * s.max_num_batched_tokens as u64
            + s.max_num_seqs as u64 * (2 * blocks_per_seq + 5))
            * 4;
        assert_eq!(plan.step_metadata.bytes, expected_step, "{name}");
        let planned_step = plan
            .activations
            .buffers
            .iter()
            .find(|b| b.name == "step_metadata")
            .map(|b| b.bytes);
        assert_eq!(planned_step, Some(expected_step), "{name}");

        // What the CPU backend allocates for them.
        let ledger = Ledger::from_plan(&plan);
        let cpu = CpuBackend::new(Arc::clone(&ledger));
        let cache = cpu
            .kv_cache(
                &kv.layout,
                config.geometry.num_layers,
                &KvScales::unit(config.geometry.num_layers),
            )
            .unwrap();
        assert_eq!(cache.allocated_bytes(), expected_kv, "{name}");
        assert_eq!(ledger.allocated(Category::KvCache), expected_kv, "{name}");
        let _step = cpu.step_storage(&plan.step_metadata).unwrap();
        assert_eq!(
            ledger.allocated(Category::Activations),
            expected_step,
            "{name}"
        );
        // Only those two are charged: the rest of the plan is missing.
        assert!(ledger.verify_complete().is_err(), "{name}");

        // A whole start-up: every buffer exactly its plan.
        let loaded = Loaded::open_cpu(&dir, Some(&p), &host, PageCachePolicy::Keep).unwrap();
        let source = loaded.source();
        let _engine = loaded.engine(&source).unwrap();
        assert_eq!(loaded.ledger.verify_complete(), Ok(()), "{name}");
        for row in loaded.ledger.snapshot().categories {
            assert_eq!(row.allocated, row.planned, "{name}: {}", row.name);
        }
    }
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
