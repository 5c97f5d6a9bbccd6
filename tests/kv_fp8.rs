//! `--kv-cache-dtype fp8`: the E4M3 encoder against torch's conversion of
//! every f32 (tests/data/e4m3_encode_runs.txt, from
//! scripts/e4m3_reference.py) and the hand cases of tests/format_cases; the
//! checkpoint's per-layer scales; CPU runs with an FP8 cache against
//! transformers with torch's FP8 rounding of keys and values
//! (tests/data/fp8_kv_reference.safetensors, from
//! scripts/fp8-kv-reference.py) and against an f32 cache (`FP8_MAX_DIFF`,
//! `FP8_MEAN_DIFF`, greedy tokens), bitwise alone, chunked, batched and from
//! the prefix cache; the ledger and the plan's pool (twice bf16's tokens in
//! the same bytes); the CLI, and the CUDA backend's refusal.

use std::path::Path;
use std::sync::mpsc;

use rayon::prelude::*;
use safetensors::tensor::TensorView;
use sparkrt::checkpoint::kv_scales::{self, KvScale, KvScaleError};
use sparkrt::checkpoint::{self, Checkpoint, PageCachePolicy};
use sparkrt::engine::sampling::SamplingParams;
use sparkrt::engine::{Event, LogprobRequest, Request};
use sparkrt::formats::{E4M3, e4m3_to_f32, f32_to_e4m3};
use sparkrt::plan::profile::{CheckpointFacts, KvCacheDtype, Profile};
use sparkrt::runtime::{HostSource, Loaded};

use crate::common::{self, fixture, json, sparkrt, stderr, stdout};
use crate::fixture_runs::{Outcome, max_abs_diff, profile, reference, serve_greedy};
use crate::format_cases::E4M3_ENCODE;

/// What an FP8 cache (scales 1.0) may change in the fixtures' prompt logits
/// against an f32 cache: the largest and the mean |difference| (measured
/// 0.97 / 0.073 on qwen3-moe-tiny, 0.92 / 0.115 on gpt-oss-tiny, 0.062 /
/// 0.008 on qwen35-tiny, logits up to 8.6 in size: 3 mantissa bits on
/// random tiny models), and the greedy tokens that must agree (gpt-oss-tiny
/// parts at the sixth).
const FP8_MAX_DIFF: f32 = 1.25;
const FP8_MEAN_DIFF: f32 = 0.15;
const FP8_GREEDY_AGREE: usize = 5;
/// sparkrt's FP8-cache logits against transformers' with the keys and
/// values rounded by torch (scripts/fp8-kv-reference.py).
const FP8_REFERENCE_TOLERANCE: f32 = 2e-3;
/// The scales scripts/fp8-kv-reference.py gives layer l: these × (l + 1).
const REFERENCE_K_SCALE: f32 = 0.02;
const REFERENCE_V_SCALE: f32 = 0.015;

// ---- the encoder ------------------------------------------------------------

/// torch's runs: (first bit pattern, byte), ascending.
fn torch_runs() -> Vec<(u32, u8)> {
    let text = std::fs::read_to_string(common::repo().join("tests/data/e4m3_encode_runs.txt"))
        .expect("tests/data/e4m3_encode_runs.txt (scripts/e4m3_reference.py writes it)");
    let runs: Vec<(u32, u8)> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (bits, byte) = l.split_once(' ').unwrap();
            (
                u32::from_str_radix(bits, 16).unwrap(),
                u8::from_str_radix(byte, 16).unwrap(),
            )
        })
        .collect();
    assert_eq!(runs.first().map(|r| r.0), Some(0));
    assert!(runs.windows(2).all(|w| w[0].0 < w[1].0), "runs ascend");
    runs
}

#[test]
fn the_encoder_is_torchs_saturating_conversion_on_every_f32() {
    let runs = torch_runs();
    // 127 finite bytes and NaN, for each sign.
    assert_eq!(runs.len(), 256);
    let mismatches: Vec<(u32, u8, u8)> = (0u32..256)
        .into_par_iter()
        .filter_map(|chunk| {
            let start = chunk << 24;
            let mut run = runs.partition_point(|r| r.0 <= start) - 1;
            for bits in start..=start | 0x00FF_FFFF {
                while run + 1 < runs.len() && runs[run + 1].0 <= bits {
                    run += 1;
                }
                let got = f32_to_e4m3(f32::from_bits(bits));
                if got != runs[run].1 {
                    return Some((bits, got, runs[run].1));
                }
            }
            None
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "f32 bits, got, torch: {:x?}",
        &mismatches[..mismatches.len().min(8)]
    );
}

#[test]
fn the_encoder_passes_the_hand_cases() {
    for &(value, byte) in E4M3_ENCODE {
        assert_eq!(
            f32_to_e4m3(value),
            byte,
            "{value} ({:#010x})",
            value.to_bits()
        );
    }
}

#[test]
fn encoding_inverts_decoding_and_requantizing_a_cached_value_keeps_its_byte() {
    for byte in 0..=255u8 {
        let value = e4m3_to_f32(byte);
        if value.is_nan() {
            assert!(e4m3_to_f32(f32_to_e4m3(value)).is_nan(), "{byte:#04x}");
            continue;
        }
        assert_eq!(f32_to_e4m3(value), byte, "{byte:#04x}");
        // What the cache gives back for a byte, quantized again with the
        // same scale (the CPU backend appends keys already rounded).
        for scale in [1.0f32, 0.013_671_875, 0.1, 0.75, 3.3, 1.0e-30, 1.0e30] {
            let cached = E4M3[usize::from(byte)] * scale;
            assert_eq!(f32_to_e4m3(cached / scale), byte, "{byte:#04x} × {scale}");
        }
    }
}

// ---- runs ---------------------------------------------------------------------

fn host() -> std::path::PathBuf {
    fixture("hosts/box24")
}

/// The checkpoint in `dir` with `profile` on the CPU: `prompts` together,
/// greedy, `n` tokens each.
fn run(dir: &Path, profile: &Profile, prompts: &[Vec<u32>], n: usize) -> Vec<Outcome> {
    let host_root = host();
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    let loaded = Loaded::open_cpu(dir, Some(profile), &host, PageCachePolicy::Keep).unwrap();
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    serve_greedy(&mut engine, prompts, n)
}

fn with_dtype(p: &Profile, dtype: KvCacheDtype) -> Profile {
    let mut p = p.clone();
    p.serving.kv_cache_dtype = dtype;
    p
}

/// The fixture's profile; the hybrid fixtures have none, so theirs is made
/// from the checkpoint (256-token sequences, 16-token blocks).
fn fixture_profile(name: &str) -> Profile {
    if name.starts_with("qwen35") {
        let dir = fixture(name);
        let (config, _) = checkpoint::load(&dir).unwrap();
        let mut p = Profile::for_checkpoint(
            CheckpointFacts {
                geometry: &config.geometry,
                max_position_embeddings: config.max_position_embeddings,
            },
            Some(dir),
        )
        .unwrap();
        p.serving.max_model_len = 256;
        p.serving.max_num_batched_tokens = 64;
        p.serving.kv_block_size = 16;
        p
    } else {
        profile(name)
    }
}

/// Prompt logits of an FP8 cache against an f32 cache, greedy tokens
/// compared; returns the largest difference.
fn fp8_against_f32(name: &str, dir: &Path, p: &Profile) -> f32 {
    let r = reference(name);
    let prompt = std::slice::from_ref(&r.input_ids);
    let f32_run = run(dir, &with_dtype(p, KvCacheDtype::F32), prompt, 12);
    let fp8_run = run(dir, &with_dtype(p, KvCacheDtype::Fp8), prompt, 12);
    let diff = max_abs_diff(&fp8_run[0].prompt_logits, &f32_run[0].prompt_logits);
    let pairs = fp8_run[0]
        .prompt_logits
        .iter()
        .zip(&f32_run[0].prompt_logits);
    let mean = pairs.map(|(a, b)| (a - b).abs()).sum::<f32>() / r.logits.len() as f32;
    eprintln!("{name}: FP8 KV prompt logits within {diff} (mean {mean}) of f32 KV");
    assert!(
        diff < FP8_MAX_DIFF && mean < FP8_MEAN_DIFF,
        "{name}: FP8 KV logits differ from f32 KV by {diff} (mean {mean})"
    );
    assert_eq!(
        fp8_run[0].tokens[..FP8_GREEDY_AGREE],
        f32_run[0].tokens[..FP8_GREEDY_AGREE],
        "{name}: greedy tokens"
    );
    diff
}

#[test]
fn fp8_kv_logits_are_within_tolerance_of_f32_kv_and_greedy_tokens_agree() {
    for name in ["qwen3-moe-tiny", "gpt-oss-tiny", "qwen35-tiny"] {
        let diff = fp8_against_f32(name, &fixture(name), &fixture_profile(name));
        // The cache does round: a run equal to f32's would test nothing.
        assert!(diff > 0.0, "{name}: FP8 KV changed no logit");
    }
}

/// transformers' logits with torch's FP8 rounding of keys and values:
/// (input ids, unit-scale logits, scaled logits).
fn torch_fp8_reference(name: &str) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let bytes = std::fs::read(common::repo().join("tests/data/fp8_kv_reference.safetensors"))
        .expect("tests/data/fp8_kv_reference.safetensors (scripts/fp8-kv-reference.py)");
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let floats = |key: &str| -> Vec<f32> {
        let t = st.tensor(&format!("{name}.{key}")).unwrap();
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    let ids = st.tensor(&format!("{name}.input_ids")).unwrap();
    let ids = ids
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect();
    (ids, floats("logits"), floats("scaled_logits"))
}

/// The reference script's scales, in ModelOpt's spelling, for `layers` layers.
fn reference_scales(layers: usize) -> Vec<Extra> {
    (0..layers)
        .flat_map(|l| {
            let n = (l + 1) as f32;
            modelopt_scales("model", l, REFERENCE_K_SCALE * n, REFERENCE_V_SCALE * n)
        })
        .collect()
}

#[test]
fn fp8_kv_logits_are_transformers_with_torchs_fp8_keys_and_values() {
    let name = "qwen3-moe-tiny";
    let (ids, unit, scaled) = torch_fp8_reference(name);
    assert_eq!(ids, reference(name).input_ids);
    let prompt = std::slice::from_ref(&ids);
    let fp8 = with_dtype(&profile(name), KvCacheDtype::Fp8);
    let scaled_dir = with_tensors(name, &reference_scales(TINY_LAYERS));
    for (what, dir, want) in [
        ("scales 1.0", fixture(name), &unit),
        (
            "the checkpoint's scales",
            scaled_dir.path().to_path_buf(),
            &scaled,
        ),
    ] {
        let out = run(&dir, &fp8, prompt, 1);
        let diff = max_abs_diff(&out[0].prompt_logits, want);
        eprintln!("{name}, {what}: FP8 KV logits within {diff} of transformers'");
        assert!(
            diff < FP8_REFERENCE_TOLERANCE,
            "{name}, {what}: FP8 KV logits differ from transformers' by {diff}"
        );
    }
    // The scales matter: the two references differ by more than that.
    assert!(max_abs_diff(&unit, &scaled) > 10.0 * FP8_REFERENCE_TOLERANCE);
}

#[test]
fn fp8_kv_is_bitwise_alike_chunked_token_by_token_and_batched() {
    for name in ["qwen3-moe-tiny", "gpt-oss-tiny"] {
        let dir = fixture(name);
        let fp8 = with_dtype(&profile(name), KvCacheDtype::Fp8);
        let r = reference(name);
        let prompt = std::slice::from_ref(&r.input_ids);
        let full = run(&dir, &fp8, prompt, 8);

        let mut chunked = fp8.clone();
        chunked.serving.max_num_batched_tokens = 5;
        chunked.serving.max_num_seqs = 4;
        let mut single = fp8.clone();
        single.serving.max_num_batched_tokens = 1;
        single.serving.max_num_seqs = 1;
        for (what, p) in [("chunked", &chunked), ("token by token", &single)] {
            let out = run(&dir, p, prompt, 8);
            assert_eq!(
                bits(&out[0].prompt_logits),
                bits(&full[0].prompt_logits),
                "{name}: {what}"
            );
            assert_eq!(out[0].tokens, full[0].tokens, "{name}: {what}");
        }

        let prompts = vec![
            r.input_ids.clone(),
            r.input_ids[..7].to_vec(),
            r.input_ids[3..].iter().rev().copied().collect(),
        ];
        let together = run(&dir, &fp8, &prompts, 6);
        for (i, prompt) in prompts.iter().enumerate() {
            let alone = run(&dir, &fp8, std::slice::from_ref(prompt), 6);
            assert_eq!(
                bits(&together[i].prompt_logits),
                bits(&alone[0].prompt_logits),
                "{name}: prompt {i} batched"
            );
            assert_eq!(together[i].tokens, alone[0].tokens, "{name}: prompt {i}");
        }
    }
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// A greedy request's tokens and the bits of their log-probabilities, and
/// how many prompt tokens came from the prefix cache.
fn greedy_bits(
    engine: &mut sparkrt::engine::Engine<'_>,
    prompt: &[u32],
) -> (Vec<(u32, u32)>, usize) {
    let (tx, rx) = mpsc::channel();
    let request = Request::new(prompt.to_vec(), SamplingParams::greedy(6))
        .with_ignore_eos(true)
        .with_logprobs(LogprobRequest {
            sampled: Some(0),
            prompt: None,
        });
    engine.add_request(request, Box::new(tx)).unwrap();
    while engine.has_work() {
        engine.step().unwrap();
    }
    let (mut tokens, mut cached) = (Vec::new(), 0);
    for event in rx.try_iter() {
        match event {
            Event::Token { id, logprob, .. } => {
                tokens.push((id, logprob.map_or(0, |l| l.logprob.to_bits())));
            }
            Event::Finished { cached_tokens, .. } => cached = cached_tokens,
            Event::Failed { message } => panic!("failed: {message}"),
            _ => {}
        }
    }
    (tokens, cached)
}

#[test]
fn an_fp8_prefix_cache_hit_samples_the_bits_of_a_cold_run() {
    for name in ["qwen3-moe-tiny", "gpt-oss-tiny"] {
        let host_root = host();
        let host = HostSource {
            root: &host_root,
            kubelet_config: None,
        };
        let base: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 500).collect();
        let mut second = base.clone();
        second.extend([7, 8, 9, 10, 11]);
        let mut outcomes = Vec::new();
        for caching in [false, true] {
            let mut p = with_dtype(&profile(name), KvCacheDtype::Fp8);
            p.serving.enable_prefix_caching = caching;
            let loaded =
                Loaded::open_cpu(&fixture(name), Some(&p), &host, PageCachePolicy::Keep).unwrap();
            let source = loaded.source();
            let mut engine = loaded.engine(&source).unwrap();
            let _ = greedy_bits(&mut engine, &base);
            outcomes.push(greedy_bits(&mut engine, &second));
        }
        let (cold, warm) = (&outcomes[0], &outcomes[1]);
        assert_eq!(cold.1, 0, "{name}: caching off");
        assert!(
            warm.1 >= 32,
            "{name}: two blocks from the cache, got {}",
            warm.1
        );
        assert_eq!(warm.0, cold.0, "{name}: cached prefix against cold");
    }
}

// ---- the checkpoint's scales -----------------------------------------------

/// Layers of qwen3-moe-tiny, all full attention.
const TINY_LAYERS: usize = 4;

/// A tensor added to a fixture copy: name, dtype, little-endian bytes.
type Extra = (String, safetensors::Dtype, Vec<u8>);

/// A copy of fixture `name` whose safetensors also holds the `extra`
/// tensors: shape `[]` when one element, else `[n]`.
fn with_tensors(name: &str, extra: &[Extra]) -> tempfile::TempDir {
    let src = fixture(name);
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() != "model.safetensors" {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let original = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, TensorView<'_>)> = original.tensors();
    for (tensor, dtype, data) in extra {
        let elements = 8 * data.len() / dtype.bitsize();
        let shape = if elements == 1 {
            vec![]
        } else {
            vec![elements]
        };
        tensors.push((
            tensor.clone(),
            TensorView::new(*dtype, shape, data).unwrap(),
        ));
    }
    let out = safetensors::serialize(tensors, None).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), out).unwrap();
    dir
}

fn f32_scale(tensor: String, value: f32) -> Extra {
    (
        tensor,
        safetensors::Dtype::F32,
        value.to_le_bytes().to_vec(),
    )
}

/// ModelOpt's spelling of layer `layer`'s scales.
fn modelopt_scales(prefix: &str, layer: usize, k: f32, v: f32) -> Vec<Extra> {
    vec![
        f32_scale(
            format!("{prefix}.layers.{layer}.self_attn.k_proj.k_scale"),
            k,
        ),
        f32_scale(
            format!("{prefix}.layers.{layer}.self_attn.v_proj.v_scale"),
            v,
        ),
    ]
}

fn read_scales(dir: &Path) -> Result<Option<Vec<KvScale>>, KvScaleError> {
    let (config, checkpoint): (_, Checkpoint) = checkpoint::load(dir).unwrap();
    Ok(kv_scales::read(&checkpoint, &config)?.map(|s| s.layers))
}

#[test]
fn the_checkpoints_scales_are_read_in_either_spelling_for_the_attention_layers() {
    // qwen3-moe-tiny: every layer attends; ModelOpt's spelling, F32.
    let layers = TINY_LAYERS;
    let extra: Vec<_> = (0..layers)
        .flat_map(|l| modelopt_scales("model", l, 0.5 + l as f32, 0.25 * (l + 1) as f32))
        .collect();
    let dir = with_tensors("qwen3-moe-tiny", &extra);
    let scales = read_scales(dir.path()).unwrap().unwrap();
    let want: Vec<KvScale> = (0..layers)
        .map(|l| KvScale {
            k: 0.5 + l as f32,
            v: 0.25 * (l + 1) as f32,
        })
        .collect();
    assert_eq!(scales, want);
    // Without scales: none.
    assert_eq!(read_scales(&fixture("qwen3-moe-tiny")).unwrap(), None);

    // qwen35-tiny: only its full-attention layers have a KV cache; the
    // attention module's spelling, BF16.
    let (config, _) = checkpoint::load(&fixture("qwen35-tiny")).unwrap();
    let full: Vec<usize> = (0..config.geometry.num_layers)
        .filter(|&l| {
            config.layer_attention(l) != sparkrt::geometry::LayerAttention::LinearAttention
        })
        .collect();
    assert!(!full.is_empty() && full.len() < config.geometry.num_layers);
    let bf16 = |x: f32| half::bf16::from_f32(x).to_bits().to_le_bytes().to_vec();
    let extra: Vec<_> = full
        .iter()
        .flat_map(|&l| {
            let p = format!("model.language_model.layers.{l}.self_attn");
            [
                (
                    format!("{p}.k_scale"),
                    safetensors::Dtype::BF16,
                    bf16(0.125),
                ),
                (format!("{p}.v_scale"), safetensors::Dtype::BF16, bf16(2.0)),
            ]
        })
        .collect();
    let dir = with_tensors("qwen35-tiny", &extra);
    let scales = read_scales(dir.path()).unwrap().unwrap();
    assert_eq!(scales, vec![KvScale { k: 0.125, v: 2.0 }; full.len()]);
}

#[test]
fn partial_doubled_or_out_of_range_scales_are_refused_naming_the_tensor() {
    // Layer 1 has no v_scale.
    let mut extra = modelopt_scales("model", 0, 0.5, 0.5);
    extra.push(f32_scale(
        "model.layers.1.self_attn.k_proj.k_scale".into(),
        0.5,
    ));
    let err = read_scales(with_tensors("qwen3-moe-tiny", &extra).path()).unwrap_err();
    assert!(
        matches!(&err, KvScaleError::Partial { missing, .. }
            if missing == "model.layers.1.self_attn.v_proj.v_scale"),
        "{err}"
    );
    // Both spellings for layer 0's k_scale.
    let mut extra: Vec<_> = (0..TINY_LAYERS)
        .flat_map(|l| modelopt_scales("model", l, 0.5, 0.5))
        .collect();
    extra.push(f32_scale("model.layers.0.self_attn.k_scale".into(), 0.5));
    let err = read_scales(with_tensors("qwen3-moe-tiny", &extra).path()).unwrap_err();
    assert!(
        err.to_string().contains("model.layers.0.self_attn.k_scale"),
        "{err}"
    );
    // Zero, negative, NaN and infinite scales.
    for bad in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let mut extra: Vec<_> = (0..TINY_LAYERS)
            .flat_map(|l| modelopt_scales("model", l, 0.5, 0.5))
            .collect();
        extra[3] = f32_scale("model.layers.1.self_attn.v_proj.v_scale".into(), bad);
        let err = read_scales(with_tensors("qwen3-moe-tiny", &extra).path()).unwrap_err();
        assert!(
            matches!(&err, KvScaleError::Value { tensor, .. }
                if tensor == "model.layers.1.self_attn.v_proj.v_scale"),
            "{bad}: {err}"
        );
    }
    // A scale that is not a scalar is the checker's problem at load.
    let mut extra: Vec<_> = (0..TINY_LAYERS)
        .flat_map(|l| modelopt_scales("model", l, 0.5, 0.5))
        .collect();
    extra[0].2 = [0.5f32, 0.5].iter().flat_map(|x| x.to_le_bytes()).collect();
    let dir = with_tensors("qwen3-moe-tiny", &extra);
    let err = checkpoint::load(dir.path())
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.layers.0.self_attn.k_proj.k_scale"),
        "{err}"
    );
}

// ---- plan and CLI -------------------------------------------------------------

fn plan(args: &[&str]) -> serde_json::Value {
    let root = fixture("hosts/spark").display().to_string();
    let mut all = vec![
        "plan",
        "--profile",
        "qwen3-30b-a3b-nvfp4",
        "--host-root",
        &root,
        "--json",
    ];
    all.extend_from_slice(args);
    let out = sparkrt(&all);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    json(&out)
}

#[test]
fn an_fp8_pool_holds_twice_the_tokens_of_bf16_in_the_same_bytes() {
    let bf16 = plan(&["--kv-cache", "8GiB", "--kv-cache-dtype", "bf16"]);
    let fp8 = plan(&["--kv-cache", "8GiB", "--kv-cache-dtype", "fp8"]);
    let (b, f) = (&bf16["kv_cache"], &fp8["kv_cache"]);
    assert_eq!(b["dtype"], "bf16");
    assert_eq!(f["dtype"], "fp8");
    // Qwen3-30B-A3B: 48 layers × 4 KV heads × 128 × (K, V) × 1 byte.
    assert_eq!(f["bytes_per_token"], 48 * 4 * 128 * 2);
    assert_eq!(
        b["bytes_per_token"],
        2 * f["bytes_per_token"].as_u64().unwrap()
    );
    let tokens = |v: &serde_json::Value| v["tokens"].as_u64().unwrap();
    assert!(tokens(b) > 0);
    assert_eq!(tokens(f), 2 * tokens(b));
    assert_eq!(f["bytes"], b["bytes"], "the same bytes");
    assert_eq!(
        f["blocks"].as_u64().unwrap(),
        2 * b["blocks"].as_u64().unwrap()
    );
    // vLLM's spelling is the same cache.
    let e4m3 = plan(&["--kv-cache", "8GiB", "--kv-cache-dtype", "fp8_e4m3"]);
    assert_eq!(e4m3["kv_cache"], fp8["kv_cache"]);
}

#[test]
fn kv_cache_dtypes_sparkrt_does_not_store_are_exit_2_naming_them() {
    let root = fixture("hosts/spark").display().to_string();
    for bad in ["fp8_e5m2", "auto", "int8", "FP8"] {
        let out = sparkrt(&[
            "plan",
            "--profile",
            "qwen3-30b-a3b-nvfp4",
            "--host-root",
            &root,
            "--kv-cache-dtype",
            bad,
        ]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains(&format!("\"{bad}\"")), "{bad}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // In a profile too.
    let text = std::fs::read_to_string(common::profile("qwen3-moe-tiny")).unwrap();
    assert!(text.contains("kv_cache_dtype = \"f32\""));
    let dir = tempfile::tempdir().unwrap();
    for (value, ok) in [("fp8", true), ("fp8_e4m3", true), ("fp8_e5m2", false)] {
        let path = dir.path().join(format!("{value}.toml"));
        let body = text.replace(
            "kv_cache_dtype = \"f32\"",
            &format!("kv_cache_dtype = \"{value}\""),
        );
        std::fs::write(&path, body).unwrap();
        let out = sparkrt(&[
            "plan",
            "--profile",
            &path.display().to_string(),
            "--host-root",
            &root,
            "--json",
        ]);
        if ok {
            assert!(out.status.success(), "{value}: {}", stderr(&out));
            assert_eq!(json(&out)["kv_cache"]["dtype"], "fp8");
        } else {
            assert_eq!(out.status.code(), Some(2), "{value}: {}", stdout(&out));
            assert!(stderr(&out).contains(value), "{value}: {}", stderr(&out));
        }
    }
}

#[test]
fn generate_with_an_fp8_cache_warns_once_that_the_scales_are_one() {
    let root = fixture("hosts/box24").display().to_string();
    let r = reference("qwen3-moe-tiny");
    let ids: Vec<String> = r.input_ids.iter().map(u32::to_string).collect();
    let generate = |dtype: &str| {
        sparkrt(&[
            "generate",
            "--host-root",
            &root,
            "--profile",
            "qwen3-moe-tiny",
            "--backend",
            "cpu",
            "--kv-cache-dtype",
            dtype,
            "--prompt-ids",
            &ids.join(","),
            "--max-tokens",
            "8",
            "--ignore-eos",
            "--json",
        ])
    };
    let out = generate("fp8");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("scales are 1.0").count(), 1, "{err}");
    let exact = generate("f32");
    assert!(exact.status.success(), "{}", stderr(&exact));
    assert!(!stderr(&exact).contains("scales are 1.0"));
    assert_eq!(json(&out)["token_ids"], json(&exact)["token_ids"]);
    let bad = generate("fp8_e5m2");
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("\"fp8_e5m2\""), "{}", stderr(&bad));
}

#[test]
fn the_cuda_backend_refuses_an_fp8_cache_naming_the_flag() {
    use sparkrt::backend::BackendError;
    use sparkrt::backend::cuda::check_kv_dtype;
    let err = check_kv_dtype(KvCacheDtype::Fp8).unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::NotSupported {
                backend: "cuda",
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("--kv-cache-dtype fp8") && text.contains("cuda"),
        "{text}"
    );
    for dtype in [KvCacheDtype::Bf16, KvCacheDtype::F32] {
        assert!(check_kv_dtype(dtype).is_ok(), "{dtype:?}");
    }
}

#[test]
fn the_ledger_charges_the_fp8_pool_the_cpu_allocates() {
    use sparkrt::plan::ledger::Category;
    let host_root = host();
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    let p = with_dtype(&profile("qwen3-moe-tiny"), KvCacheDtype::Fp8);
    let loaded = Loaded::open_cpu(
        &fixture("qwen3-moe-tiny"),
        Some(&p),
        &host,
        PageCachePolicy::Keep,
    )
    .unwrap();
    let kv = &loaded.plan.kv_cache;
    // 4 layers × 2 KV heads × head_dim 32 × (K, V) × 1 byte.
    assert_eq!(kv.bytes_per_token, 4 * 2 * 32 * 2);
    assert_eq!(kv.bytes, kv.tokens * kv.bytes_per_token);
    let source = loaded.source();
    let _engine = loaded.engine(&source).unwrap();
    assert_eq!(loaded.ledger.allocated(Category::KvCache), kv.bytes);
}
