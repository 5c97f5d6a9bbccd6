//! compressed-tensors NVFP4 (`nvfp4-pack-quantized`, as llm-compressor and
//! RedHatAI publish it) on the `qwen35-moe-tiny-ct-nvfp4` fixture, written
//! by compressed-tensors itself (scripts/make-ct-nvfp4-fixture.py): which
//! modules the config quantizes, the weights decoded against the tool's rule
//! `e2m1 × e4m3 ÷ weight_global_scale`, and every lie refused naming it. The
//! logits against transformers are in tests/model_qwen35.rs.

use std::path::Path;

use sparkrt::checkpoint::check::check_tensors;
use sparkrt::checkpoint::quant_config::QuantScheme;
use sparkrt::checkpoint::{
    Checkpoint, CheckpointError, ModelConfig, TensorProblem, WeightData, read_headers,
};
use sparkrt::cli::inspect::report;
use sparkrt::formats::{E2M1, E4M3, read_nibble};
use sparkrt::geometry::Quantization;

use crate::common::fixture;

const NAME: &str = "qwen35-moe-tiny-ct-nvfp4";
const EXPERT: &str = "model.language_model.layers.0.mlp.experts.5.down_proj";

#[test]
fn the_config_quantizes_every_linear_but_the_ignore_list() {
    let c = ModelConfig::load(&fixture(NAME)).unwrap();
    let q = c.quantization.clone().unwrap();
    assert_eq!(q.scheme, QuantScheme::CompressedTensors);
    assert_eq!(c.geometry.quantization, Quantization::Nvfp4);
    assert_eq!(c.geometry.attention_quantization, Quantization::Nvfp4);
    let p = "model.language_model.layers";
    for quantized in [
        EXPERT,
        "model.language_model.layers.3.self_attn.q_proj",
        "model.language_model.layers.0.linear_attn.in_proj_qkv",
        "model.language_model.layers.0.mlp.shared_expert.up_proj",
    ] {
        assert_eq!(
            c.linear_format(quantized),
            Quantization::Nvfp4,
            "{quantized}"
        );
    }
    for ignored in [
        "lm_head".to_string(),
        format!("{p}.2.mlp.gate"),
        format!("{p}.2.mlp.shared_expert_gate"),
        "model.visual.blocks.0.attn.qkv".to_string(),
        "mtp.fc".to_string(),
    ] {
        assert_eq!(c.linear_format(&ignored), Quantization::Bf16, "{ignored}");
    }
}

#[test]
fn inspect_counts_the_parameters_of_the_bf16_model_and_names_the_formats() {
    let ct = report(&fixture(NAME)).unwrap();
    let bf16 = report(&fixture("qwen35-moe-tiny")).unwrap();
    assert!(ct.problems.is_empty(), "{:?}", ct.problems);
    assert_eq!(ct.num_parameters, bf16.num_parameters);
    assert_eq!(ct.quantization, Some("nvfp4"));
    for group in ["experts", "attention", "linear_attention"] {
        assert_eq!(ct.group_formats[group], ["nvfp4"], "{group}");
    }
    // The `[1, H]` shared-expert gate is ignored, its projections are not.
    assert_eq!(ct.group_formats["shared_expert"], ["bf16", "nvfp4"]);
    assert_eq!(ct.group_formats["lm_head"], ["bf16"]);
    // Every tensor is in a group: the plan counts them all.
    let grouped: u64 = ct.groups.values().sum::<u64>() + ct.unused.values().sum::<u64>();
    assert_eq!(grouped, ct.total_bytes);
}

#[test]
fn weights_decode_as_codes_times_scales_divided_by_the_global_scale() {
    let dir = fixture(NAME);
    let config = ModelConfig::load(&dir).unwrap();
    let checkpoint = Checkpoint::open(&dir).unwrap();
    let weight = checkpoint.linear(&config, EXPERT).unwrap();
    assert_eq!((weight.rows, weight.cols), (128, 64));
    let WeightData::Nvfp4 { global, .. } = weight.data else {
        panic!("{EXPERT} is not read as NVFP4");
    };
    let packed = checkpoint
        .tensor(&format!("{EXPERT}.weight_packed"))
        .unwrap();
    let scales = checkpoint
        .tensor(&format!("{EXPERT}.weight_scale"))
        .unwrap();
    let global_scale = checkpoint
        .tensor(&format!("{EXPERT}.weight_global_scale"))
        .unwrap()
        .scalar_f32()
        .unwrap();
    assert_eq!(global, global_scale.recip());
    let mut row = vec![0.0f32; 64];
    for r in [0, 77, 127] {
        weight.decode_row(r, &mut row).unwrap();
        for (c, &value) in row.iter().enumerate() {
            let code = read_nibble(&packed.bytes()[r * 32..], c);
            let scale = E4M3[usize::from(scales.bytes()[r * 4 + c / 16])];
            let expected = E2M1[code] * scale / global_scale;
            // The one rounding apart: × (1/g) here, ÷ g in the tool.
            assert!(
                (value - expected).abs() <= expected.abs() * 2e-7,
                "[{r}, {c}]: {value} vs {expected}"
            );
        }
    }
}

#[test]
fn a_missing_or_misshaped_scale_is_named() {
    let dir = fixture(NAME);
    let config = ModelConfig::load(&dir).unwrap();
    let mut headers = read_headers(&dir).unwrap();
    headers
        .tensors
        .retain(|t| t.name != format!("{EXPERT}.weight_global_scale"));
    for t in &mut headers.tensors {
        if t.name == format!("{EXPERT}.weight_scale") {
            t.shape = vec![128, 8];
        }
    }
    let Err(CheckpointError::Tensors { problems }) = check_tensors(&config, &headers) else {
        panic!("a lying header set passed");
    };
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems
            .iter()
            .any(|p| matches!(p, TensorProblem::Missing { .. })
                && p.tensor() == format!("{EXPERT}.weight_global_scale"))
    );
    assert!(
        problems
            .iter()
            .any(|p| matches!(p, TensorProblem::WrongShape { .. })
                && p.tensor() == format!("{EXPERT}.weight_scale"))
    );
}

#[test]
fn a_zero_global_scale_is_refused_naming_the_tensor() {
    let src = fixture(NAME);
    let dir = tempfile::tempdir().unwrap();
    copy_fixture(&src, dir.path());
    let headers = read_headers(dir.path()).unwrap();
    let name = format!("{EXPERT}.weight_global_scale");
    let info = headers.tensors.iter().find(|t| t.name == name).unwrap();
    let file = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = info.offset as usize;
    bytes[at..at + 4].copy_from_slice(&0.0f32.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let config = ModelConfig::load(dir.path()).unwrap();
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    let err = checkpoint.linear(&config, EXPERT).unwrap_err();
    assert!(matches!(err, CheckpointError::BadScale { .. }), "{err}");
    assert!(err.to_string().contains(&name), "{err}");
}

/// The fixture's config with `edit` applied to its `quantization_config`.
fn config_with(edit: impl Fn(&mut serde_json::Value)) -> Result<ModelConfig, CheckpointError> {
    let path = fixture(NAME).join("config.json");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut value["quantization_config"]);
    ModelConfig::parse(&value.to_string(), &path, None)
}

#[test]
fn compressed_tensors_schemes_sparkrt_does_not_read_are_refused_by_name() {
    let refused = |edit: &dyn Fn(&mut serde_json::Value), names: &[&str]| {
        let err = config_with(edit).unwrap_err();
        assert!(
            matches!(err, CheckpointError::UnsupportedQuantization { .. }),
            "{err}"
        );
        for name in names {
            assert!(
                err.to_string().contains(name),
                "`{err}` should name `{name}`"
            );
        }
    };
    // INT4 weight-only (`pack-quantized`, W4A16).
    refused(
        &|q| {
            q["format"] = "pack-quantized".into();
            let w = &mut q["config_groups"]["group_0"]["weights"];
            w["type"] = "int".into();
            w["group_size"] = 128.into();
            w["strategy"] = "group".into();
        },
        &["pack-quantized", "group_0", "4-bit int", "128"],
    );
    // FP8 (`float-quantized`).
    refused(
        &|q| {
            q["format"] = "float-quantized".into();
            q["config_groups"]["group_0"]["weights"]["num_bits"] = 8.into();
        },
        &["float-quantized", "8-bit float"],
    );
    // Asymmetric NVFP4 would need `weight_zero_point`.
    refused(
        &|q| q["config_groups"]["group_0"]["weights"]["symmetric"] = false.into(),
        &["nvfp4-pack-quantized", "group_0"],
    );
    refused(
        &|q| q["config_groups"] = serde_json::json!({}),
        &["config_groups"],
    );
    // Online rotations would change what the weights compute.
    refused(
        &|q| q["transform_config"] = serde_json::json!({"config_groups": {}}),
        &["transform_config"],
    );
    // A class name sparkrt cannot resolve to modules.
    refused(
        &|q| q["config_groups"]["group_0"]["targets"] = serde_json::json!(["Qwen3MoeMLP"]),
        &["Qwen3MoeMLP", "module class"],
    );
    // Python regex features Rust's regex lacks: refused, not mismatched.
    refused(
        &|q| q["ignore"] = serde_json::json!(["re:(?<!x)lm_head"]),
        &["re:(?<!x)lm_head"],
    );
}

fn copy_fixture(src: &Path, dst: &Path) {
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
}
