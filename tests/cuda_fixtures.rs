//! The three reference fixtures through the CUDA backend: prompt logits
//! against the transformers reference and the CPU backend, greedy ids
//! identical; chunked prefill, token-at-a-time decoding (past gpt-oss-tiny's
//! sliding window) and batches equal to one full pass; the ledger exactly
//! the plan. Skipped, with the reason printed, without a usable GPU.

use crate::common;
use crate::cuda_common;
use crate::fixture_runs;

use sparkrt::backend::Backend;
use sparkrt::backend::cuda::TENSOR_CORE_MIN_ROWS;
use sparkrt::checkpoint::PageCachePolicy;
use sparkrt::engine::FinishReason;
use sparkrt::plan::ledger::WeightsResidency;
use sparkrt::plan::profile::{DeviceKind, KvCacheDtype, Profile};
use sparkrt::runtime::{DeviceOptions, HostSource, Loaded, LoadedModel};

use fixture_runs::{FIXTURES, Outcome, max_abs_diff, profile, reference, serve_greedy};

/// Runs `prompts` together, greedy, on `device`; checks the ledger.
fn run(
    name: &str,
    profile: &Profile,
    device: DeviceKind,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<Outcome> {
    let host_root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    let options = DeviceOptions {
        device: Some(device),
        cache_dir: cuda_common::cuda_options().cache_dir,
        ..DeviceOptions::default()
    };
    let loaded = LoadedModel::open_with(
        &common::fixture(name),
        Some(profile),
        &host,
        PageCachePolicy::Keep,
        &options,
    )
    .unwrap();
    let greedy = Greedy {
        name,
        device,
        prompts,
        max_tokens,
    };
    match &loaded {
        LoadedModel::Cpu(loaded) => greedy.run(loaded.as_ref()),
        LoadedModel::Cuda(loaded) => greedy.run(loaded.as_ref()),
    }
}

/// Greedy requests through an engine on the loaded model.
struct Greedy<'a> {
    name: &'a str,
    device: DeviceKind,
    prompts: &'a [Vec<u32>],
    max_tokens: usize,
}

impl Greedy<'_> {
    fn run<B: Backend>(self, loaded: &Loaded<B>) -> Vec<Outcome> {
        let Greedy {
            name,
            device,
            prompts,
            max_tokens,
        } = self;
        let source = loaded.source();
        let mut engine = loaded.engine(&source).unwrap();
        if device == DeviceKind::Cuda {
            assert_eq!(loaded.backend.name(), "cuda");
            // Every planned byte is allocated, none more.
            let snapshot = loaded.ledger.snapshot();
            for row in &snapshot.categories {
                assert_eq!(row.allocated, row.planned, "{name}: ledger {}", row.name);
            }
            assert!(matches!(
                snapshot.weights_residency,
                Some(
                    WeightsResidency::DeviceCopy
                        | WeightsResidency::HostRegistered
                        | WeightsResidency::Mapped
                )
            ));
        }
        serve_greedy(&mut engine, prompts, max_tokens)
    }
}

#[test]
fn fixtures_through_cuda_match_the_reference_and_the_cpu() {
    if cuda_common::skip("cuda fixtures") {
        return;
    }
    for name in FIXTURES {
        let r = reference(name);
        // The prompt's prefill (all its rows in one step) runs the
        // tensor-core kernels, its decode steps (one row) the warp-per-row
        // ones: the crossover is a rule on a step's rows, checked by
        // tests/cuda_kernels.rs.
        assert!(
            r.input_ids.len() >= TENSOR_CORE_MIN_ROWS,
            "{name}: a {}-token prompt would not reach the tensor cores",
            r.input_ids.len()
        );
        let prompt = std::slice::from_ref(&r.input_ids);
        let cuda = run(
            name,
            &profile(name),
            DeviceKind::Cuda,
            prompt,
            r.greedy_ids.len(),
        );
        let cpu = run(
            name,
            &profile(name),
            DeviceKind::Cpu,
            prompt,
            r.greedy_ids.len(),
        );
        let to_reference = max_abs_diff(&cuda[0].prompt_logits, &r.logits);
        let to_cpu = max_abs_diff(&cuda[0].prompt_logits, &cpu[0].prompt_logits);
        eprintln!(
            "{name}: CUDA logits differ by {to_reference} from the reference, {to_cpu} from the CPU"
        );
        // f32 accumulation throughout, activations exact (f32 in the GEMV,
        // three BF16 terms on the tensor cores): the CPU's tolerance to the
        // reference holds. The CPU quantizes MXFP4
        // experts' activations to int16 (gpt-oss-tiny: about 1e-3 from the
        // reference), so the two backends are held to the reference's
        // tolerance, not a tighter one.
        assert!(
            to_reference < 2e-3,
            "{name}: prompt logits differ by {to_reference}"
        );
        assert!(
            to_cpu < 2e-3,
            "{name}: CUDA and CPU logits differ by {to_cpu}"
        );
        assert_eq!(cuda[0].tokens, r.greedy_ids, "{name}: greedy continuation");
        assert_eq!(cuda[0].finish, Some(FinishReason::Length));
    }
}

#[test]
fn cuda_chunked_prefill_single_steps_and_batches_equal_one_full_pass() {
    if cuda_common::skip("cuda chunking") {
        return;
    }
    for name in FIXTURES {
        let r = reference(name);
        let prompt = std::slice::from_ref(&r.input_ids);
        let full = run(name, &profile(name), DeviceKind::Cuda, prompt, 8);

        // Chunks of 5 rows and single rows run the GEMV, the full prompt
        // the tensor cores: the two paths agree to 1e-4 on the logits.
        let mut chunked = profile(name);
        chunked.serving.max_num_batched_tokens = 5;
        chunked.serving.max_num_seqs = 4;
        let out = run(name, &chunked, DeviceKind::Cuda, prompt, 8);
        let diff = max_abs_diff(&out[0].prompt_logits, &full[0].prompt_logits);
        assert!(diff < 1e-4, "{name}: chunked prefill differs by {diff}");
        assert_eq!(
            out[0].tokens, full[0].tokens,
            "{name}: chunked continuation"
        );

        // One token per step: gpt-oss-tiny's window (8) is shorter than the
        // prompt, so its sliding layers decode through sliding tables whose
        // early blocks have been released.
        let mut single = profile(name);
        single.serving.max_num_batched_tokens = 1;
        single.serving.max_num_seqs = 1;
        let out = run(name, &single, DeviceKind::Cuda, prompt, 8);
        let diff = max_abs_diff(&out[0].prompt_logits, &full[0].prompt_logits);
        assert!(diff < 1e-4, "{name}: token-at-a-time differs by {diff}");
        assert_eq!(
            out[0].tokens, full[0].tokens,
            "{name}: token-at-a-time continuation"
        );

        let prompts: Vec<Vec<u32>> = vec![
            r.input_ids.clone(),
            r.input_ids[..7].to_vec(),
            r.input_ids[3..].iter().rev().copied().collect(),
            vec![r.input_ids[0]],
        ];
        let together = run(name, &profile(name), DeviceKind::Cuda, &prompts, 6);
        for (i, p) in prompts.iter().enumerate() {
            let alone = run(
                name,
                &profile(name),
                DeviceKind::Cuda,
                std::slice::from_ref(p),
                6,
            );
            let diff = max_abs_diff(&together[i].prompt_logits, &alone[0].prompt_logits);
            assert!(
                diff < 1e-4,
                "{name} prompt {i}: batched logits differ by {diff}"
            );
            assert_eq!(together[i].tokens, alone[0].tokens, "{name} prompt {i}");
        }
    }
}

#[test]
fn cuda_bf16_kv_cache_matches_the_cpu_one() {
    if cuda_common::skip("cuda bf16 kv") {
        return;
    }
    let name = "qwen3-moe-tiny";
    let r = reference(name);
    let mut bf16 = profile(name);
    bf16.serving.kv_cache_dtype = KvCacheDtype::Bf16;
    let prompt = std::slice::from_ref(&r.input_ids);
    let cuda = run(name, &bf16, DeviceKind::Cuda, prompt, 6);
    let cpu = run(name, &bf16, DeviceKind::Cpu, prompt, 6);
    let diff = max_abs_diff(&cuda[0].prompt_logits, &cpu[0].prompt_logits);
    assert!(diff < 1e-3, "bf16 KV: CUDA and CPU differ by {diff}");
    assert_eq!(cuda[0].tokens, cpu[0].tokens);
}

/// What one greedy request (or choice) of [`HitsAndForks`] sampled.
#[derive(Debug, PartialEq)]
struct Choice {
    tokens: Vec<u32>,
    cached_tokens: usize,
}

/// On one engine: a request that warms the cache, then `target` (a hit),
/// then `target` again as a group of three greedy choices (forked).
struct HitsAndForks<'a> {
    warm: &'a [u32],
    target: &'a [u32],
}

impl HitsAndForks<'_> {
    fn run<B: Backend>(self, loaded: &Loaded<B>) -> (Choice, Vec<Choice>) {
        use sparkrt::engine::sampling::SamplingParams;
        use sparkrt::engine::{Event, EventSink, Request};
        use std::sync::mpsc;

        let source = loaded.source();
        let mut engine = loaded.engine(&source).unwrap();
        let greedy = |prompt: &[u32]| {
            Request::new(prompt.to_vec(), SamplingParams::greedy(6)).with_ignore_eos(true)
        };
        let mut serve = |prompt: &[u32], choices: usize| -> Vec<Choice> {
            let (sinks, receivers): (Vec<Box<dyn EventSink>>, Vec<_>) = (0..choices)
                .map(|_| {
                    let (tx, rx) = mpsc::channel::<Event>();
                    (Box::new(tx) as Box<dyn EventSink>, rx)
                })
                .unzip();
            engine.add_request_group(greedy(prompt), sinks).unwrap();
            while engine.has_work() {
                engine.step().unwrap();
            }
            engine.audit_blocks().unwrap();
            receivers
                .into_iter()
                .map(|rx| {
                    let mut choice = Choice {
                        tokens: Vec::new(),
                        cached_tokens: usize::MAX,
                    };
                    for event in rx.try_iter() {
                        match event {
                            Event::Token { id, .. } => choice.tokens.push(id),
                            Event::Finished { cached_tokens, .. } => {
                                choice.cached_tokens = cached_tokens;
                            }
                            Event::Failed { message } => panic!("request failed: {message}"),
                            _ => {}
                        }
                    }
                    choice
                })
                .collect()
        };
        serve(self.warm, 1);
        let hit = serve(self.target, 1).remove(0);
        let group = serve(self.target, 3);
        (hit, group)
    }
}

#[test]
fn cuda_cache_hits_and_forked_choices_give_the_cold_greedy_tokens() {
    if cuda_common::skip("cuda prefix cache") {
        return;
    }
    let host_root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    for name in FIXTURES {
        // 40 shared tokens (2 full blocks of 16; on gpt-oss-tiny, window 8,
        // the sliding blocks of the first blocks leave the window), then
        // different tails; the target's 45 tokens end in a partial block.
        let shared: Vec<u32> = (0..40).map(|i| 3 + (i * 11) % 200).collect();
        let mut warm = shared.clone();
        warm.extend([7, 8, 9, 10]);
        let mut target = shared;
        target.extend([20, 21, 22, 23, 24]);
        let cold = run(
            name,
            &profile(name),
            DeviceKind::Cuda,
            std::slice::from_ref(&target),
            6,
        );
        let options = DeviceOptions {
            device: Some(DeviceKind::Cuda),
            cache_dir: cuda_common::cuda_options().cache_dir,
            ..DeviceOptions::default()
        };
        let loaded = LoadedModel::open_with(
            &common::fixture(name),
            Some(&profile(name)),
            &host,
            PageCachePolicy::Keep,
            &options,
        )
        .unwrap();
        let hits = HitsAndForks {
            warm: &warm,
            target: &target,
        };
        let (hit, group) = match &loaded {
            LoadedModel::Cpu(loaded) => hits.run(loaded.as_ref()),
            LoadedModel::Cuda(loaded) => hits.run(loaded.as_ref()),
        };
        assert_eq!(hit.cached_tokens, 32, "{name}: two full blocks hit");
        assert_eq!(hit.tokens, cold[0].tokens, "{name}: the hit's tokens");
        // The first choice hits the cache (now three blocks of the target's
        // own); the others are forked from it: no prompt token computed,
        // the partial block (positions 32..45) copied on the device.
        assert_eq!(group[0].cached_tokens, 32, "{name}");
        for (j, choice) in group.iter().enumerate() {
            assert_eq!(choice.tokens, cold[0].tokens, "{name}: choice {j}");
            if j > 0 {
                assert_eq!(choice.cached_tokens, target.len(), "{name}: choice {j}");
            }
        }
    }
}

#[test]
fn cuda_drafts_change_no_greedy_token() {
    if cuda_common::skip("cuda speculative decoding") {
        return;
    }
    // A prompt that repeats a phrase: prompt lookup drafts from it, and the
    // verify rows run on the device as a chunk of several rows per sequence.
    let phrase: Vec<u32> = (0..9).map(|i| 17 + (i * 37) % 480).collect();
    let prompts = [
        phrase
            .iter()
            .cycle()
            .take(40)
            .copied()
            .collect::<Vec<u32>>(),
        phrase.iter().rev().cycle().take(30).copied().collect(),
    ];
    for name in FIXTURES {
        let off = run(name, &profile(name), DeviceKind::Cuda, &prompts, 24);
        let mut drafting = profile(name);
        drafting.serving.speculative = Some(
            sparkrt::plan::speculative::SpeculativeConfig::from_json(
                r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}"#,
            )
            .unwrap(),
        );
        let on = run(name, &drafting, DeviceKind::Cuda, &prompts, 24);
        for (i, (a, b)) in on.iter().zip(&off).enumerate() {
            assert_eq!(a.tokens, b.tokens, "{name}: prompt {i}");
        }
    }
}
