//! `sparkrt inspect`'s report on the fixtures, against figures computed by
//! hand from their configs.

use std::path::{Path, PathBuf};

use sparkrt::checkpoint::CheckpointError;
use sparkrt::cli::inspect::{InspectArgs, report, run};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// qwen3-moe-tiny: embed + lm_head 2 · 512·128, final norm 128; per layer
/// norms 2·128 + 2·32, attention 256·128 + 2·64·128 + 128·256, router
/// 16·128, experts 16·3·64·128.
const QWEN3_TINY_PARAMETERS: u64 =
    2 * 512 * 128 + 128 + 4 * (2 * 128 + 2 * 32 + 81_920 + 16 * 128 + 16 * 3 * 64 * 128);

#[test]
fn bf16_and_nvfp4_fixtures_have_the_same_parameters() {
    assert_eq!(QWEN3_TINY_PARAMETERS, 2_041_216);
    let bf16 = report(&fixture("qwen3-moe-tiny")).unwrap();
    assert_eq!(bf16.architecture, "qwen3_moe");
    assert_eq!(bf16.num_parameters, QWEN3_TINY_PARAMETERS);
    assert_eq!(bf16.total_bytes, 2 * QWEN3_TINY_PARAMETERS);
    assert_eq!(bf16.num_tensors, 3 + 4 * (2 + 2 + 4 + 1 + 16 * 3));
    assert_eq!(bf16.quantization, None);
    assert!(bf16.problems.is_empty(), "{:?}", bf16.problems);

    let nvfp4 = report(&fixture("qwen3-moe-tiny-nvfp4")).unwrap();
    assert_eq!(
        nvfp4.num_parameters, QWEN3_TINY_PARAMETERS,
        "two codes per packed byte"
    );
    assert_eq!(nvfp4.quantization, Some("nvfp4"));
    // Each expert projection becomes 4 tensors (weight, two scales, input scale).
    assert_eq!(nvfp4.num_tensors, bf16.num_tensors + 4 * 16 * 3 * 3);
    assert_eq!(nvfp4.groups["attention"], bf16.groups["attention"]);
    assert_eq!(
        nvfp4.groups["experts"],
        4 * 16 * 3 * (64 * 128 / 2 + 64 * 128 / 16 + 8)
    );
    assert_eq!(nvfp4.dtypes["F8_E4M3"].tensors, 4 * 16 * 3);
    assert_eq!(nvfp4.dtypes["F32"].bytes, 4 * 16 * 3 * 2 * 4);
    assert_eq!(nvfp4.excluded_modules.len(), 3);
    // The experts are NVFP4; what the config excludes stays bf16.
    assert_eq!(nvfp4.group_formats["experts"], ["nvfp4"]);
    assert_eq!(nvfp4.group_formats["attention"], ["bf16"]);
    assert_eq!(nvfp4.group_formats["embeddings"], ["bf16"]);
    assert_eq!(bf16.group_formats["experts"], ["bf16"]);
    let file_len = std::fs::metadata(fixture("qwen3-moe-tiny-nvfp4/model.safetensors"))
        .unwrap()
        .len();
    assert_eq!(nvfp4.shards.len(), 1);
    assert_eq!(nvfp4.shards[0].file, "model.safetensors");
    assert_eq!(nvfp4.shards[0].bytes, file_len);
    assert_eq!(nvfp4.shards[0].tensors, nvfp4.num_tensors);
}

#[test]
fn gpt_oss_report() {
    let r = report(&fixture("gpt-oss-tiny")).unwrap();
    assert_eq!(r.architecture, "gpt_oss");
    assert_eq!(r.quantization, Some("mxfp4"));
    // Per layer: norms 2·64; attention 128·64 + 2·32·64 + 64·128 weights,
    // 128 + 32 + 32 + 64 biases, 8 sinks; router 8·64 + 8; experts
    // 8·128·64 + 8·64·64 FP4 values plus 8·128 + 8·64 biases.
    let per_layer = 128 + (20_480 + 256 + 8) + 520 + (65_536 + 32_768 + 1_024 + 512);
    assert_eq!(r.num_parameters, 2 * 512 * 64 + 64 + 4 * per_layer);
    assert_eq!(r.num_parameters, 550_528);
    assert_eq!(r.groups.values().sum::<u64>(), r.total_bytes);
    assert_eq!(r.dtypes["U8"].tensors, 4 * 4);
    assert_eq!(r.group_formats["experts"], ["mxfp4"]);
    assert_eq!(r.group_formats["attention"], ["bf16"]);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

#[test]
fn json_has_the_documented_keys() {
    let r = report(&fixture("qwen3-moe-tiny-nvfp4")).unwrap();
    let value = serde_json::to_value(&r).unwrap();
    // Nothing the checkpoint carries goes unread.
    assert_eq!(value["unused"], serde_json::json!({}));
    for key in [
        "architecture",
        "num_tensors",
        "total_bytes",
        "groups",
        "quantization",
        "shards",
    ] {
        assert!(value.get(key).is_some(), "missing key {key}");
    }
    assert_eq!(value["quantization"], "nvfp4");
    let groups = value["groups"].as_object().unwrap();
    let names: Vec<&str> = groups.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "attention",
            "dense_mlp",
            "embeddings",
            "experts",
            "linear_attention",
            "lm_head",
            "norms",
            "router",
            "shared_expert",
        ]
    );
    let bf16 = serde_json::to_value(report(&fixture("qwen3-moe-tiny")).unwrap()).unwrap();
    assert!(bf16["quantization"].is_null());
}

#[test]
fn broken_folders_are_errors_naming_file_and_tensor() {
    // A header lie: the error names file and tensor.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("qwen3-moe-tiny/config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let json = r#"{"model.norm.weight":{"dtype":"BF16","shape":[128],"data_offsets":[0,256]}}"#;
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json.as_bytes());
    bytes.extend_from_slice(&[0; 100]);
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    let args = InspectArgs {
        dir: dir.path().to_path_buf(),
        json: true,
    };
    let message = run(&args).unwrap_err().to_string();
    assert!(message.contains("model.safetensors"), "{message}");
    assert!(message.contains("`model.norm.weight`"), "{message}");

    // Sound headers but the wrong tensors: the report lists the problems and
    // `run` fails with them.
    let json = r#"{"model.norm.weight":{"dtype":"BF16","shape":[128],"data_offsets":[0,256]}}"#;
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json.as_bytes());
    bytes.extend_from_slice(&[0; 256]);
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    let r = report(dir.path()).unwrap();
    assert_eq!(r.num_tensors, 1);
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("missing tensor `lm_head.weight`"))
    );
    let err = run(&args).unwrap_err();
    assert!(
        matches!(err, CheckpointError::Tensors { ref problems } if problems.len() == r.problems.len())
    );

    // No config.json: named.
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let message = run(&args).unwrap_err().to_string();
    assert!(message.contains("config.json"), "{message}");
}

#[test]
fn a_qwen35_checkpoint_counts_its_vision_tower_as_unused() {
    let r = report(&fixture("qwen35-moe-tiny")).unwrap();
    assert_eq!(r.architecture, "qwen3_5_moe");
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    // Every byte is in a group or under an unused prefix.
    let grouped: u64 = r.groups.values().sum();
    assert_eq!(grouped + r.unused.values().sum::<u64>(), r.total_bytes);
    assert!(r.unused["model.visual."] > 0);
    // 3 GDN layers: in_proj_qkv 256 × 128, z 128 × 128, b and a 4 × 128,
    // out_proj 128 × 128, conv 256 × 4, A_log and dt_bias 4, norm 32, bf16.
    let gdn = (256 * 128 + 128 * 128 + 2 * 4 * 128 + 128 * 128 + 256 * 4 + 8 + 32) * 2;
    assert_eq!(r.groups["linear_attention"], 3 * gdn);
    // The shared expert (3 × 64 × 128) and its [1, 128] gate in 4 layers.
    assert_eq!(r.groups["shared_expert"], 4 * (3 * 64 * 128 + 128) * 2);
}
