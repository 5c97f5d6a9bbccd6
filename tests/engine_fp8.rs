//! The FP8 fixtures (`scripts/make-fp8-fixtures.py`): a qwen3_moe model in
//! Qwen's FP8 block-wise layout and in ModelOpt MIXED_PRECISION (NVFP4
//! experts, FP8 attention). The CPU engine against transformers on the
//! dequantized weights (prompt logits within 2e-3 with an f32 KV cache,
//! greedy continuations identical); what `inspect` and the plan say of them;
//! and broken copies refused naming the tensor.

use std::collections::HashMap;
use std::path::Path;

use crate::common;
use crate::fixture_runs::{
    Outcome, assert_greedy_matches, last_row, logits_tolerance, max_abs_diff, profile, reference,
    serve_greedy,
};

use sparkrt::checkpoint::groups::bytes_by_group;
use sparkrt::checkpoint::{ModelConfig, PageCachePolicy, read_headers};
use sparkrt::cli::inspect::report;
use sparkrt::engine::FinishReason;
use sparkrt::plan::memory::estimate_weights;
use sparkrt::runtime::{HostSource, Loaded};

const FP8_FIXTURES: [&str; 2] = ["qwen3-moe-tiny-fp8-block", "qwen3-moe-tiny-modelopt-mixed"];

fn run(name: &str, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Outcome> {
    let loaded = open(name);
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    serve_greedy(&mut engine, prompts, max_tokens)
}

/// Fixture `name` opened on the CPU with its profile, on the test host.
fn open(name: &str) -> Loaded<sparkrt::backend::cpu::CpuBackend> {
    let host_root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    let p = profile(name);
    Loaded::open_cpu(
        &common::fixture(name),
        Some(&p),
        &host,
        PageCachePolicy::Keep,
    )
    .unwrap()
}

/// The plan fixture `name` is served with.
fn plan_of(name: &str) -> sparkrt::plan::Plan {
    open(name).plan
}

#[test]
fn fp8_fixtures_match_transformers_on_the_dequantized_weights() {
    for name in FP8_FIXTURES {
        let r = reference(name);
        let out = run(name, std::slice::from_ref(&r.input_ids), r.greedy_ids.len());
        let diff = max_abs_diff(&out[0].prompt_logits, &r.logits);
        eprintln!("{name}: prompt logits within {diff:.2e} of transformers");
        let tolerance = logits_tolerance(&plan_of(name), 2e-3);
        assert!(diff < tolerance, "{name}: prompt logits differ by {diff}");
        assert_greedy_matches(
            name,
            &r.input_ids,
            &out[0].tokens,
            &r.greedy_ids,
            tolerance,
            2e-3,
            |ids| {
                last_row(
                    run(name, &[ids.to_vec()], 1).remove(0).prompt_logits,
                    ids.len(),
                )
            },
        );
        assert_eq!(out[0].finish, Some(FinishReason::Length));
    }
}

#[test]
fn fp8_prompts_give_the_same_logits_alone_and_in_a_batch() {
    for name in FP8_FIXTURES {
        let r = reference(name);
        let short = r.input_ids[..7].to_vec();
        let together = run(name, &[r.input_ids.clone(), short.clone()], 2);
        let alone = run(name, std::slice::from_ref(&short), 2);
        let diff = max_abs_diff(&together[1].prompt_logits, &alone[0].prompt_logits);
        assert_eq!(diff, 0.0, "{name}: batching changed the logits");
        assert_eq!(together[1].tokens, alone[0].tokens, "{name}");
    }
}

/// The fixtures' model: embed + lm_head 2 · 512·160, final norm 160; per
/// layer (2) norms 2·160 + 2·32, attention 256·160 + 2·64·160 + 160·256,
/// router 8·160, experts 8·3·64·160.
const PARAMETERS: u64 =
    2 * 512 * 160 + 160 + 2 * (2 * 160 + 2 * 32 + 102_400 + 8 * 160 + 8 * 3 * 64 * 160);

#[test]
fn inspect_names_the_fp8_formats_and_counts_one_parameter_per_byte() {
    let block = report(&common::fixture("qwen3-moe-tiny-fp8-block")).unwrap();
    assert!(block.problems.is_empty(), "{:?}", block.problems);
    assert_eq!(block.quantization, Some("fp8_block"));
    assert_eq!(block.num_parameters, PARAMETERS);
    assert_eq!(block.group_formats["experts"], ["fp8_block"]);
    assert_eq!(block.group_formats["attention"], ["fp8_block"]);
    assert_eq!(block.group_formats["lm_head"], ["bf16"]);
    // Experts: values + f32 scales of [⌈64/128⌉, ⌈160/128⌉] = 2 blocks
    // (gate, up) or [⌈160/128⌉, ⌈64/128⌉] = 2 blocks (down).
    assert_eq!(block.groups["experts"], 2 * 8 * 3 * (64 * 160 + 2 * 4));

    let mixed = report(&common::fixture("qwen3-moe-tiny-modelopt-mixed")).unwrap();
    assert!(mixed.problems.is_empty(), "{:?}", mixed.problems);
    assert_eq!(mixed.quantization, Some("nvfp4"));
    assert_eq!(mixed.num_parameters, PARAMETERS);
    assert_eq!(mixed.group_formats["experts"], ["nvfp4"]);
    assert_eq!(mixed.group_formats["attention"], ["fp8"]);
    assert_eq!(mixed.group_formats["lm_head"], ["bf16"]);
    // Attention: values + weight_scale + input_scale per projection.
    assert_eq!(mixed.groups["attention"], 2 * (102_400 + 4 * 8));
}

#[test]
fn fp8_plans_from_config_alone_equal_the_header_bytes() {
    for name in FP8_FIXTURES {
        let dir = common::fixture(name);
        let config = ModelConfig::load(&dir).unwrap();
        let headers = read_headers(&dir).unwrap();
        let exact = bytes_by_group(config.geometry.architecture, &headers.tensors);
        let estimate = estimate_weights(&config.geometry);
        assert_eq!(estimate.groups, exact.bytes, "{name}");
    }
}

/// A copy of fixture `name` whose tensors `edit` rewrote.
fn edited(
    name: &str,
    edit: impl FnOnce(&mut HashMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) -> tempfile::TempDir {
    let src = common::fixture(name);
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap();
        if file != "model.safetensors" {
            std::fs::copy(&path, dir.path().join(file)).unwrap();
        }
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: HashMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (dtype, shape, data))| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap();
            (n.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    dir
}

fn problems(dir: &Path) -> String {
    report(dir).unwrap().problems.join("\n")
}

#[test]
fn broken_fp8_tensors_are_refused_naming_the_tensor() {
    use safetensors::Dtype as D;
    let scale_inv = "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv";
    // Wrong block-scale shape: [2, 2] where [⌈160/128⌉, ⌈64/128⌉] = [2, 1].
    let dir = edited("qwen3-moe-tiny-fp8-block", |t| {
        let (_, shape, data) = t.get_mut(scale_inv).unwrap();
        *shape = vec![2, 2];
        data.extend_from_slice(&[0; 8]);
    });
    let p = problems(dir.path());
    assert!(p.contains(scale_inv) && p.contains("[2, 1]"), "{p}");
    // Missing block scale.
    let dir = edited("qwen3-moe-tiny-fp8-block", |t| {
        t.remove(scale_inv);
    });
    let p = problems(dir.path());
    assert!(p.contains(&format!("missing tensor `{scale_inv}`")), "{p}");
    // Wrong scale dtype (I32 has F32's size: only the dtype is wrong).
    let dir = edited("qwen3-moe-tiny-fp8-block", |t| {
        t.get_mut(scale_inv).unwrap().0 = D::I32;
    });
    let p = problems(dir.path());
    assert!(p.contains(scale_inv) && p.contains("I32"), "{p}");
    // BF16 block scales, as Qwen publishes some: accepted.
    let dir = edited("qwen3-moe-tiny-fp8-block", |t| {
        let (dtype, _, data) = t.get_mut(scale_inv).unwrap();
        *dtype = D::BF16;
        *data = data.chunks_exact(4).flat_map(|b| [b[2], b[3]]).collect();
    });
    assert_eq!(problems(dir.path()), "");

    let weight = "model.layers.0.self_attn.k_proj.weight";
    let scale = "model.layers.0.self_attn.k_proj.weight_scale";
    // ModelOpt FP8: the values as U8 (wrong dtype), the per-tensor scale
    // missing, the scale as a vector.
    let dir = edited("qwen3-moe-tiny-modelopt-mixed", |t| {
        t.get_mut(weight).unwrap().0 = D::U8;
    });
    let p = problems(dir.path());
    assert!(p.contains(weight) && p.contains("F8_E4M3"), "{p}");
    let dir = edited("qwen3-moe-tiny-modelopt-mixed", |t| {
        t.remove(scale);
    });
    let p = problems(dir.path());
    assert!(p.contains(&format!("missing tensor `{scale}`")), "{p}");
    let dir = edited("qwen3-moe-tiny-modelopt-mixed", |t| {
        let (_, shape, data) = t.get_mut(scale).unwrap();
        *shape = vec![2];
        data.extend_from_slice(&[0; 4]);
    });
    let p = problems(dir.path());
    assert!(p.contains(scale) && p.contains("scalar"), "{p}");
    // Without its static `input_scale` (sparkrt does not use it): accepted.
    let dir = edited("qwen3-moe-tiny-modelopt-mixed", |t| {
        t.remove("model.layers.0.self_attn.k_proj.input_scale");
    });
    assert_eq!(problems(dir.path()), "");
}

/// NVIDIA's published ModelOpt checkpoints quantize the lm_head too
/// (`nvidia/Qwen3.6-35B-A3B-NVFP4`: NVFP4 lm_head, docs QWEN35.md): a
/// synthetic copy of the mixed fixture with `lm_head` named NVFP4 in
/// `quantized_layers` records it in the geometry, its plan from config.json
/// alone is the header bytes group by group, `inspect` names the format,
/// and the engine serves it.
#[test]
fn an_nvfp4_lm_head_is_read_planned_and_served() {
    let like = tempfile::tempdir().unwrap();
    let fixture = common::fixture("qwen3-moe-tiny-modelopt-mixed");
    for file in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture.join(file), like.path().join(file)).unwrap();
    }
    let path = like.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let q = &mut config["quantization_config"];
    q["exclude_modules"] = serde_json::json!(["model.layers.*.mlp.gate"]);
    q["quantized_layers"]["lm_head"] = serde_json::json!({"quant_algo": "NVFP4", "group_size": 16});
    std::fs::write(&path, config.to_string()).unwrap();

    let config = ModelConfig::load(like.path()).unwrap();
    assert_eq!(
        config.geometry.lm_head_quantization,
        sparkrt::geometry::Quantization::Nvfp4
    );
    let dir = tempfile::tempdir().unwrap();
    sparkrt::checkpoint::synthetic::write_checkpoint(
        like.path(),
        &config,
        dir.path(),
        1,
        5,
        &mut |_, _| {},
    )
    .unwrap();
    let headers = read_headers(dir.path()).unwrap();
    let exact = bytes_by_group(config.geometry.architecture, &headers.tensors);
    assert_eq!(estimate_weights(&config.geometry).groups, exact.bytes);
    let vocab_by_hidden = 512 * 160;
    // Codes, an E4M3 scale per 16, two f32 scalars (weight_scale_2, input_scale).
    assert_eq!(
        exact.bytes[&sparkrt::geometry::WeightGroup::LmHead],
        vocab_by_hidden / 2 + vocab_by_hidden / 16 + 8
    );
    let inspected = report(dir.path()).unwrap();
    assert_eq!(inspected.group_formats["lm_head"], ["nvfp4"]);
    assert_eq!(problems(dir.path()), "");

    let host_root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    let loaded = Loaded::open_cpu(dir.path(), None, &host, PageCachePolicy::Keep).unwrap();
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    let outcomes = serve_greedy(&mut engine, &[vec![1, 2, 3, 4]], 6);
    assert_eq!(outcomes[0].tokens.len(), 6, "{:?}", outcomes[0].finish);
    let logits = &outcomes[0].prompt_logits;
    assert!(!logits.is_empty() && logits.iter().all(|l| l.is_finite()));
    assert!(logits.iter().any(|&l| l != logits[0]), "logits all alike");
}
