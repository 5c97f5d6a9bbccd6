//! config.json of the three fixtures (and edited copies with the other key
//! spellings), quantization exclusions, weight groups and the architecture
//! check.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sparkrt::checkpoint::groups::{bytes_by_group, group_of};
use sparkrt::checkpoint::quant_config::{QuantScheme, QuantizationConfig};
use sparkrt::checkpoint::{
    CheckpointError, HeaderSet, ModelConfig, TensorProblem, check_tensors, read_headers,
};
use sparkrt::geometry::{Architecture, LayerAttention, Quantization, WeightGroup};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn fixture_config(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).unwrap())
        .unwrap()
}

/// Loads `config` written as `config.json` into a fresh folder.
fn load_edited(config: &Value) -> Result<ModelConfig, CheckpointError> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    ModelConfig::load(dir.path())
}

#[test]
fn qwen3_moe_fixture_config() {
    let c = ModelConfig::load(&fixture("qwen3-moe-tiny")).unwrap();
    assert_eq!(c.geometry.architecture, Architecture::Qwen3Moe);
    assert_eq!(
        (
            c.geometry.hidden_size,
            c.geometry.num_layers,
            c.geometry.num_attention_heads,
            c.geometry.num_kv_heads
        ),
        (128, 4, 8, 2)
    );
    assert_eq!((c.geometry.head_dim, c.geometry.vocab_size), (32, 512));
    assert_eq!((c.geometry.num_experts, c.geometry.top_k), (16, 4));
    assert_eq!(
        (
            c.geometry.moe_intermediate_size,
            c.geometry.intermediate_size
        ),
        (64, 256)
    );
    assert!(c.geometry.mlp_only_layers.is_empty());
    assert_eq!(c.geometry.decoder_sparse_step, 1);
    assert!(c.norm_topk_prob);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert_eq!(c.rope_scaling, None);
    assert!(!c.geometry.tie_word_embeddings && !c.geometry.attention_bias);
    assert!(c.geometry.layer_types.is_empty());
    assert_eq!(c.quantization, None);
    assert!(!c.is_quantized("model.layers.0.mlp.experts.0.gate_proj"));

    let g = &c.geometry;
    assert_eq!(g.quantization, Quantization::Bf16);
    assert_eq!((g.num_layers, g.num_kv_heads, g.top_k), (4, 2, 4));
    assert_eq!(g.num_moe_layers(), 4);
}

#[test]
fn nvfp4_fixture_config_and_its_exclusions() {
    let c = ModelConfig::load(&fixture("qwen3-moe-tiny-nvfp4")).unwrap();
    let q = c.quantization.clone().unwrap();
    assert_eq!(q.method, Quantization::Nvfp4);
    assert_eq!(q.group_size, 16);
    assert_eq!(
        q.excluded_modules,
        [
            "lm_head",
            "model.layers.*.mlp.gate",
            "model.layers.*.self_attn*"
        ]
    );
    assert_eq!(c.geometry.quantization, Quantization::Nvfp4);
    for quantized in [
        "model.layers.0.mlp.experts.0.gate_proj",
        "model.layers.3.mlp.experts.15.down_proj",
        // `mlp.gate` excludes the router, not a dense MLP's `gate_proj`.
        "model.layers.1.mlp.gate_proj",
    ] {
        assert!(c.is_quantized(quantized), "{quantized}");
    }
    for excluded in [
        "lm_head",
        "model.layers.2.mlp.gate",
        "model.layers.0.self_attn.q_proj",
        "model.layers.12.self_attn.o_proj",
    ] {
        assert!(!c.is_quantized(excluded), "{excluded}");
    }
}

#[test]
fn nvfp4_exclusions_also_come_from_hf_quant_config() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = fixture_config("qwen3-moe-tiny-nvfp4");
    config
        .as_object_mut()
        .unwrap()
        .remove("quantization_config");
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    std::fs::copy(
        fixture("qwen3-moe-tiny-nvfp4").join("hf_quant_config.json"),
        dir.path().join("hf_quant_config.json"),
    )
    .unwrap();
    let from_hf = ModelConfig::load(dir.path()).unwrap();
    let original = ModelConfig::load(&fixture("qwen3-moe-tiny-nvfp4")).unwrap();
    assert_eq!(from_hf, original);
}

#[test]
fn modelopt_ignore_list_spelling_is_accepted() {
    let mut config = fixture_config("qwen3-moe-tiny");
    config["quantization_config"] = json!({
        "quant_method": "modelopt", "quant_algo": "NVFP4",
        "ignore": ["lm_head", "model.layers.*.self_attn*"],
    });
    let c = load_edited(&config).unwrap();
    assert_eq!(
        c.quantization,
        Some(QuantizationConfig {
            scheme: QuantScheme::ModelOpt,
            method: Quantization::Nvfp4,
            group_size: 16,
            excluded_modules: vec!["lm_head".into(), "model.layers.*.self_attn*".into()],
            module_formats: Vec::new(),
            quantized_blocks: Vec::new(),
        })
    );
    assert!(!c.is_quantized("model.layers.0.self_attn.k_proj"));
    assert!(c.is_quantized("model.layers.0.mlp.gate"));
}

#[test]
fn unsupported_quantizations_are_named() {
    for (q, expected) in [
        (json!({"quant_method": "awq", "bits": 4}), "awq"),
        (
            json!({"quant_method": "modelopt", "quant_algo": "FP8"}),
            "modelopt FP8",
        ),
        (
            json!({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}),
            "group_size 32",
        ),
    ] {
        let mut config = fixture_config("qwen3-moe-tiny");
        config["quantization_config"] = q;
        let err = load_edited(&config).unwrap_err();
        assert!(
            matches!(err, CheckpointError::UnsupportedQuantization { .. }),
            "{err}"
        );
        assert!(err.to_string().contains(expected), "{err}");
    }
}

#[test]
fn gpt_oss_fixture_config() {
    let c = ModelConfig::load(&fixture("gpt-oss-tiny")).unwrap();
    assert_eq!(c.geometry.architecture, Architecture::GptOss);
    assert_eq!(
        (
            c.geometry.hidden_size,
            c.geometry.num_layers,
            c.geometry.head_dim
        ),
        (64, 4, 16)
    );
    assert_eq!(
        (c.geometry.num_attention_heads, c.geometry.num_kv_heads),
        (8, 2)
    );
    assert_eq!((c.geometry.num_experts, c.geometry.top_k), (8, 4));
    // gpt_oss's `intermediate_size` is the expert size; there are no dense MLPs.
    assert_eq!(
        (
            c.geometry.moe_intermediate_size,
            c.geometry.intermediate_size
        ),
        (64, 0)
    );
    assert!(c.geometry.attention_bias);
    assert_eq!(c.geometry.sliding_window, Some(8));
    assert_eq!(c.swiglu_limit, Some(7.0));
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.rope_theta, 150_000.0);
    use LayerAttention::{FullAttention as F, SlidingAttention as S};
    assert_eq!(c.geometry.layer_types, [S, F, S, F]);
    let yarn = c.rope_scaling.clone().unwrap();
    assert_eq!(
        (yarn.factor, yarn.beta_fast, yarn.beta_slow),
        (32.0, 32.0, 1.0)
    );
    assert!(!yarn.truncate);
    assert_eq!(yarn.original_max_position_embeddings, 4096);
    assert_eq!(yarn.attention_factor, None);

    let q = c.quantization.clone().unwrap();
    assert_eq!(q.method, Quantization::Mxfp4);
    assert!(c.is_quantized("model.layers.0.mlp.experts"));
    assert!(!c.is_quantized("model.layers.0.self_attn.q_proj"));
    assert!(!c.is_quantized("model.layers.3.mlp.router"));
    assert!(!c.is_quantized("lm_head"));

    let g = &c.geometry;
    assert_eq!(g.quantization, Quantization::Mxfp4);
    assert_eq!((g.moe_intermediate_size, g.intermediate_size), (64, 0));
    assert_eq!(g.num_moe_layers(), 4);
    assert_eq!(g.layer_attention(0), S);
    assert_eq!(g.sliding_window, Some(8));
}

#[test]
fn both_spellings_of_expert_count_and_top_k_are_read() {
    // qwen3 with gpt-oss spellings.
    let mut config = fixture_config("qwen3-moe-tiny");
    let object = config.as_object_mut().unwrap();
    object.remove("num_experts");
    object.remove("num_experts_per_tok");
    object.insert("num_local_experts".into(), json!(16));
    object.insert("experts_per_token".into(), json!(4));
    let edited = load_edited(&config).unwrap();
    assert_eq!(
        edited,
        ModelConfig::load(&fixture("qwen3-moe-tiny")).unwrap()
    );

    // gpt-oss with only one spelling of each.
    let mut config = fixture_config("gpt-oss-tiny");
    let object = config.as_object_mut().unwrap();
    object.remove("num_local_experts");
    object.remove("experts_per_token");
    object.insert("num_experts".into(), json!(8));
    let edited = load_edited(&config).unwrap();
    assert_eq!(edited, ModelConfig::load(&fixture("gpt-oss-tiny")).unwrap());

    // Two spellings that disagree are an error naming both keys.
    let mut config = fixture_config("gpt-oss-tiny");
    config["experts_per_token"] = json!(2);
    let err = load_edited(&config).unwrap_err().to_string();
    assert!(
        err.contains("num_experts_per_tok") && err.contains("experts_per_token"),
        "{err}"
    );
    assert!(err.contains("config.json"), "{err}");
}

#[test]
fn rope_parameters_spelling_is_read() {
    // transformers v5 folds rope_theta into rope_parameters.
    let mut config = fixture_config("qwen3-moe-tiny");
    let object = config.as_object_mut().unwrap();
    object.remove("rope_theta");
    object.remove("rope_scaling");
    object.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "rope_theta": 1000000.0}),
    );
    let edited = load_edited(&config).unwrap();
    assert_eq!(
        edited,
        ModelConfig::load(&fixture("qwen3-moe-tiny")).unwrap()
    );

    // gpt-oss's yarn parameters under rope_parameters, `type` spelling.
    let mut config = fixture_config("gpt-oss-tiny");
    let object = config.as_object_mut().unwrap();
    let mut scaling = object.remove("rope_scaling").unwrap();
    let theta = object.remove("rope_theta").unwrap();
    let scaling_object = scaling.as_object_mut().unwrap();
    scaling_object.remove("rope_type");
    scaling_object.insert("type".into(), json!("yarn"));
    scaling_object.insert("rope_theta".into(), theta);
    object.insert("rope_parameters".into(), scaling);
    let edited = load_edited(&config).unwrap();
    assert_eq!(edited, ModelConfig::load(&fixture("gpt-oss-tiny")).unwrap());

    // Disagreeing thetas are refused.
    let mut config = fixture_config("qwen3-moe-tiny");
    config["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 10000.0});
    let err = load_edited(&config).unwrap_err().to_string();
    assert!(err.contains("rope_theta"), "{err}");

    // A RoPE variant the engines do not implement is refused by name.
    let mut config = fixture_config("qwen3-moe-tiny");
    config["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0});
    let err = load_edited(&config).unwrap_err().to_string();
    assert!(err.contains("llama3"), "{err}");
}

#[test]
fn dense_layers_from_mlp_only_layers_and_sparse_step() {
    let mut config = fixture_config("qwen3-moe-tiny");
    config["mlp_only_layers"] = json!([0]);
    config["decoder_sparse_step"] = json!(2);
    let c = load_edited(&config).unwrap();
    // Layer 0 is listed; layer 2 fails (i + 1) % 2 == 0; layers 1 and 3 are sparse.
    let moe: Vec<bool> = (0..4).map(|i| c.geometry.is_moe_layer(i)).collect();
    assert_eq!(moe, [false, true, false, true]);
    assert_eq!(c.geometry.num_moe_layers(), 2);

    // Defaults where the keys are absent: every layer sparse, untied.
    let mut config = fixture_config("qwen3-moe-tiny");
    let object = config.as_object_mut().unwrap();
    for key in [
        "mlp_only_layers",
        "decoder_sparse_step",
        "tie_word_embeddings",
        "head_dim",
    ] {
        object.remove(key);
    }
    let c = load_edited(&config).unwrap();
    assert_eq!(
        (c.geometry.decoder_sparse_step, c.geometry.head_dim),
        (1, 128 / 8)
    );
    assert!(!c.geometry.tie_word_embeddings);
    assert!((0..4).all(|i| c.geometry.is_moe_layer(i)));
}

#[test]
fn broken_configs_are_refused_with_the_key_named() {
    type Edit = fn(&mut Value);
    let cases: [(Edit, &str); 9] = [
        (|c| c["model_type"] = json!("llama"), "llama"),
        (
            |c| {
                c.as_object_mut().unwrap().remove("hidden_size");
            },
            "hidden_size",
        ),
        (
            |c| {
                c.as_object_mut().unwrap().remove("model_type");
            },
            "model_type",
        ),
        (
            |c| c["num_experts_per_tok"] = json!(17),
            "experts per token",
        ),
        (|c| c["mlp_only_layers"] = json!([9]), "mlp_only_layers"),
        (
            |c| c["num_key_value_heads"] = json!(3),
            "num_key_value_heads",
        ),
        (|c| c["hidden_size"] = json!("wide"), "config.json"),
        (
            |c| c["decoder_sparse_step"] = json!(0),
            "decoder_sparse_step",
        ),
        (
            |c| c["use_sliding_window"] = json!(true),
            "use_sliding_window",
        ),
    ];
    for (edit, expected) in cases {
        let mut config = fixture_config("qwen3-moe-tiny");
        edit(&mut config);
        let err = load_edited(&config).unwrap_err().to_string();
        assert!(
            err.contains(expected),
            "`{err}` should mention `{expected}`"
        );
    }
    let mut config = fixture_config("gpt-oss-tiny");
    config["layer_types"] = json!(["sliding_attention", "full_attention"]);
    let err = load_edited(&config).unwrap_err().to_string();
    assert!(err.contains("layer_types"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let err = ModelConfig::load(dir.path()).unwrap_err();
    assert!(matches!(err, CheckpointError::Io { ref path, .. } if path.ends_with("config.json")));
}

#[test]
fn every_fixture_tensor_has_a_group_and_bytes_add_up() {
    // Hand-computed from the configs (bytes = elements × 2 for BF16).
    // qwen3-moe-tiny: embed and lm_head 512·128; per layer norms 2·128 + 2·32,
    // attention 256·128 + 2·64·128 + 128·256, router 16·128, experts
    // 16 · 3 · 64·128.
    let h = read_headers(&fixture("qwen3-moe-tiny")).unwrap();
    let g = bytes_by_group(Architecture::Qwen3Moe, &h.tensors);
    assert!(g.ungrouped.is_empty(), "{:?}", g.ungrouped);
    let layers = 4;
    assert_eq!(g.bytes[&WeightGroup::Embeddings], 512 * 128 * 2);
    assert_eq!(g.bytes[&WeightGroup::LmHead], 512 * 128 * 2);
    assert_eq!(
        g.bytes[&WeightGroup::Norms],
        (128 + layers * (2 * 128 + 2 * 32)) * 2
    );
    assert_eq!(
        g.bytes[&WeightGroup::Attention],
        layers * (256 * 128 + 2 * 64 * 128 + 128 * 256) * 2
    );
    assert_eq!(g.bytes[&WeightGroup::Router], layers * 16 * 128 * 2);
    assert_eq!(
        g.bytes[&WeightGroup::Experts],
        layers * 16 * 3 * 64 * 128 * 2
    );
    assert_eq!(g.bytes[&WeightGroup::DenseMlp], 0);
    assert_eq!(g.bytes.values().sum::<u64>(), h.total_tensor_bytes());

    // NVFP4: an expert projection of r × c elements is r·c/2 packed bytes,
    // r·c/16 scale bytes and two f32 scalars; the rest stays BF16.
    let h = read_headers(&fixture("qwen3-moe-tiny-nvfp4")).unwrap();
    let g = bytes_by_group(Architecture::Qwen3Moe, &h.tensors);
    assert!(g.ungrouped.is_empty(), "{:?}", g.ungrouped);
    let projection = 64 * 128 / 2 + 64 * 128 / 16 + 4 + 4;
    assert_eq!(g.bytes[&WeightGroup::Experts], layers * 16 * 3 * projection);
    assert_eq!(g.bytes[&WeightGroup::Router], layers * 16 * 128 * 2);
    assert_eq!(g.bytes.values().sum::<u64>(), h.total_tensor_bytes());

    // gpt-oss-tiny: H = 64, I = 64, E = 8, 8 heads of 16, 2 KV heads.
    let h = read_headers(&fixture("gpt-oss-tiny")).unwrap();
    let g = bytes_by_group(Architecture::GptOss, &h.tensors);
    assert!(g.ungrouped.is_empty(), "{:?}", g.ungrouped);
    let attention = (128 * 64 + 2 * 32 * 64 + 64 * 128) * 2 + (128 + 32 + 32 + 64) * 2 + 8 * 2;
    assert_eq!(g.bytes[&WeightGroup::Attention], layers * attention);
    assert_eq!(g.bytes[&WeightGroup::Router], layers * (8 * 64 + 8) * 2);
    // Blocks: rows × cols / 2 bytes; scales: rows × cols / 32; biases BF16.
    let experts =
        8 * (128 * 64 / 2 + 128 * 64 / 32 + 128 * 2) + 8 * (64 * 64 / 2 + 64 * 64 / 32 + 64 * 2);
    assert_eq!(g.bytes[&WeightGroup::Experts], layers * experts);
    assert_eq!(g.bytes[&WeightGroup::Norms], (64 + layers * 2 * 64) * 2);
    assert_eq!(g.bytes.values().sum::<u64>(), h.total_tensor_bytes());
}

#[test]
fn group_of_names_each_kind_of_tensor() {
    use Architecture::{GptOss, Qwen3Moe};
    use WeightGroup::*;
    let cases = [
        (Qwen3Moe, "model.embed_tokens.weight", Some(Embeddings)),
        (Qwen3Moe, "lm_head.weight", Some(LmHead)),
        (Qwen3Moe, "lm_head.weight_scale", Some(LmHead)),
        (Qwen3Moe, "model.norm.weight", Some(Norms)),
        (
            Qwen3Moe,
            "model.layers.7.input_layernorm.weight",
            Some(Norms),
        ),
        (
            Qwen3Moe,
            "model.layers.7.self_attn.q_norm.weight",
            Some(Norms),
        ),
        (
            Qwen3Moe,
            "model.layers.7.self_attn.k_proj.weight",
            Some(Attention),
        ),
        (
            Qwen3Moe,
            "model.layers.7.self_attn.o_proj.input_scale",
            Some(Attention),
        ),
        (Qwen3Moe, "model.layers.7.mlp.gate.weight", Some(Router)),
        (
            Qwen3Moe,
            "model.layers.7.mlp.experts.127.up_proj.weight_scale_2",
            Some(Experts),
        ),
        (
            Qwen3Moe,
            "model.layers.7.mlp.experts.0.down_proj.input_scale",
            Some(Experts),
        ),
        (
            Qwen3Moe,
            "model.layers.0.mlp.gate_proj.weight",
            Some(DenseMlp),
        ),
        (
            Qwen3Moe,
            "model.layers.0.mlp.down_proj.weight_scale",
            Some(DenseMlp),
        ),
        (
            Qwen3Moe,
            "model.layers.0.mlp.experts.x.up_proj.weight",
            None,
        ),
        (Qwen3Moe, "model.layers.a.mlp.gate.weight", None),
        (Qwen3Moe, "model.layers.0.mlp.router.weight", None),
        (Qwen3Moe, "model.layers.0.self_attn.sinks", None),
        (Qwen3Moe, "model.rotary_emb.inv_freq", None),
        (GptOss, "model.layers.3.self_attn.sinks", Some(Attention)),
        (
            GptOss,
            "model.layers.3.self_attn.q_proj.bias",
            Some(Attention),
        ),
        (GptOss, "model.layers.3.mlp.router.weight", Some(Router)),
        (GptOss, "model.layers.3.mlp.router.bias", Some(Router)),
        (
            GptOss,
            "model.layers.3.mlp.experts.gate_up_proj_blocks",
            Some(Experts),
        ),
        (
            GptOss,
            "model.layers.3.mlp.experts.down_proj_scales",
            Some(Experts),
        ),
        (
            GptOss,
            "model.layers.3.mlp.experts.down_proj_bias",
            Some(Experts),
        ),
        (
            GptOss,
            "model.layers.3.mlp.experts.gate_up_proj",
            Some(Experts),
        ),
        (
            GptOss,
            "model.layers.3.post_attention_layernorm.weight",
            Some(Norms),
        ),
        (GptOss, "model.layers.3.mlp.gate.weight", None),
        (GptOss, "model.layers.3.self_attn.q_norm.weight", None),
        (
            GptOss,
            "model.layers.3.mlp.experts.gate_up_proj_blocks2",
            None,
        ),
    ];
    for (architecture, name, expected) in cases {
        assert_eq!(group_of(architecture, name), expected, "{name}");
    }
}

#[test]
fn fixtures_hold_exactly_the_tensors_their_architecture_needs() {
    for name in ["qwen3-moe-tiny", "qwen3-moe-tiny-nvfp4", "gpt-oss-tiny"] {
        let config = ModelConfig::load(&fixture(name)).unwrap();
        let headers = read_headers(&fixture(name)).unwrap();
        check_tensors(&config, &headers).unwrap();
    }
    // The BF16 headers do not satisfy the NVFP4 config: every expert
    // projection is named (dtype and scales), nothing else.
    let nvfp4 = ModelConfig::load(&fixture("qwen3-moe-tiny-nvfp4")).unwrap();
    let bf16_headers = read_headers(&fixture("qwen3-moe-tiny")).unwrap();
    let Err(CheckpointError::Tensors { problems }) = check_tensors(&nvfp4, &bf16_headers) else {
        panic!("BF16 experts do not pass as NVFP4");
    };
    let projections = 4 * 16 * 3;
    let wrong_dtype = problems
        .iter()
        .filter(|p| matches!(p, TensorProblem::WrongDtype { .. }))
        .count();
    let missing = problems
        .iter()
        .filter(|p| matches!(p, TensorProblem::Missing { .. }))
        .count();
    assert_eq!(wrong_dtype, projections);
    assert_eq!(
        missing,
        2 * projections,
        "weight_scale and weight_scale_2 of each"
    );
    assert_eq!(problems.len(), 3 * projections, "input_scale is optional");
}

/// Rewrites the fixture's header set: `edit` may rename, drop or reshape.
fn edited_headers(name: &str, edit: impl Fn(&mut HeaderSet)) -> HeaderSet {
    let mut headers = read_headers(&fixture(name)).unwrap();
    edit(&mut headers);
    headers.tensors.sort_by(|a, b| a.name.cmp(&b.name));
    headers
}

#[test]
fn each_missing_unexpected_or_misshaped_tensor_is_named() {
    let config = ModelConfig::load(&fixture("qwen3-moe-tiny")).unwrap();
    let headers = edited_headers("qwen3-moe-tiny", |h| {
        h.tensors
            .retain(|t| t.name != "model.layers.2.mlp.experts.9.up_proj.weight");
        h.tensors
            .retain(|t| t.name != "model.layers.0.self_attn.k_norm.weight");
        for t in &mut h.tensors {
            if t.name == "model.layers.1.self_attn.q_proj.weight" {
                t.shape = vec![128, 256];
            }
            if t.name == "model.norm.weight" {
                t.name = "model.final_norm.weight".to_string();
            }
            if t.name == "lm_head.weight" {
                t.dtype = sparkrt::checkpoint::Dtype::F16;
            }
        }
    });
    let err = check_tensors(&config, &headers).unwrap_err();
    let CheckpointError::Tensors { problems } = &err else {
        panic!("{err}");
    };
    let names: Vec<&str> = problems.iter().map(TensorProblem::tensor).collect();
    assert_eq!(
        names,
        [
            "lm_head.weight",
            "model.final_norm.weight",
            "model.layers.0.self_attn.k_norm.weight",
            "model.layers.1.self_attn.q_proj.weight",
            "model.layers.2.mlp.experts.9.up_proj.weight",
            "model.norm.weight",
        ]
    );
    assert!(matches!(problems[0], TensorProblem::WrongDtype { .. }));
    assert!(matches!(problems[1], TensorProblem::Unexpected { .. }));
    assert!(matches!(problems[2], TensorProblem::Missing { .. }));
    assert!(matches!(problems[3], TensorProblem::WrongShape { .. }));
    let message = err.to_string();
    assert!(message.contains("6 tensor problem(s)"), "{message}");
    assert!(
        message.contains("has shape [128, 256], expected [256, 128]"),
        "{message}"
    );
    assert!(
        message.contains("missing tensor `model.norm.weight` (BF16 [128])"),
        "{message}"
    );
    assert!(message.contains("model.safetensors: unexpected tensor `model.final_norm.weight`"));
}

#[test]
fn tied_embeddings_make_lm_head_optional() {
    let mut config = ModelConfig::load(&fixture("qwen3-moe-tiny")).unwrap();
    config.geometry.tie_word_embeddings = true;
    let with_head = read_headers(&fixture("qwen3-moe-tiny")).unwrap();
    check_tensors(&config, &with_head).unwrap();
    let without_head = edited_headers("qwen3-moe-tiny", |h| {
        h.tensors.retain(|t| t.name != "lm_head.weight");
    });
    check_tensors(&config, &without_head).unwrap();
    config.geometry.tie_word_embeddings = false;
    assert!(check_tensors(&config, &without_head).is_err());
}

#[test]
fn gpt_oss_check_names_mxfp4_problems() {
    let config = ModelConfig::load(&fixture("gpt-oss-tiny")).unwrap();
    let headers = edited_headers("gpt-oss-tiny", |h| {
        h.tensors
            .retain(|t| t.name != "model.layers.1.mlp.experts.down_proj_scales");
        h.tensors
            .retain(|t| t.name != "model.layers.2.self_attn.sinks");
        for t in &mut h.tensors {
            if t.name == "model.layers.0.mlp.experts.gate_up_proj_blocks" {
                t.shape = vec![8, 128, 4, 8];
            }
        }
    });
    let Err(CheckpointError::Tensors { problems }) = check_tensors(&config, &headers) else {
        panic!("problems expected");
    };
    let names: Vec<&str> = problems.iter().map(TensorProblem::tensor).collect();
    assert_eq!(
        names,
        [
            "model.layers.0.mlp.experts.gate_up_proj_blocks",
            "model.layers.1.mlp.experts.down_proj_scales",
            "model.layers.2.self_attn.sinks",
        ]
    );
}

#[test]
fn qwen35_moe_fixture_config_from_its_text_config() {
    let c = ModelConfig::load(&fixture("qwen35-moe-tiny")).unwrap();
    assert_eq!(c.geometry.architecture, Architecture::Qwen35Moe);
    assert_eq!(
        (
            c.geometry.hidden_size,
            c.geometry.num_layers,
            c.geometry.head_dim
        ),
        (128, 4, 64)
    );
    assert_eq!(
        c.geometry.layer_types,
        [
            LayerAttention::LinearAttention,
            LayerAttention::LinearAttention,
            LayerAttention::LinearAttention,
            LayerAttention::FullAttention
        ]
    );
    assert_eq!(
        (
            c.geometry.linear_num_key_heads,
            c.geometry.linear_num_value_heads,
            c.geometry.linear_key_head_dim,
            c.geometry.linear_value_head_dim,
            c.geometry.linear_conv_kernel_dim
        ),
        (2, 4, 32, 32, 4)
    );
    assert_eq!(c.geometry.shared_expert_intermediate_size, 64);
    // partial_rotary_factor 0.25 of a 64-wide head; mrope_section [4, 2, 2]
    // covers those 16 dims.
    assert_eq!(c.rotary_dim(), 16);
    assert_eq!(c.rope_theta, 10_000_000.0);
    assert!(c.norm_topk_prob);
    let g = &c.geometry;
    assert_eq!((g.num_kv_layers(), g.num_linear_layers()), (1, 3));
    // The vision tower is mapped but neither expected nor checked.
    let headers = read_headers(&fixture("qwen35-moe-tiny")).unwrap();
    check_tensors(&c, &headers).unwrap();
    let groups = bytes_by_group(c.geometry.architecture, &headers.tensors);
    assert!(groups.ungrouped.is_empty(), "{:?}", groups.ungrouped);
    assert!(groups.unused["model.visual."] > 0);
    assert!(groups.bytes[&WeightGroup::LinearAttention] > 0);
    assert!(groups.bytes[&WeightGroup::SharedExpert] > 0);
}

#[test]
fn qwen35_and_qwen3_next_fixture_configs() {
    let dense = ModelConfig::load(&fixture("qwen35-tiny")).unwrap();
    assert_eq!(dense.geometry.architecture, Architecture::Qwen35);
    assert_eq!(
        (dense.geometry.num_experts, dense.geometry.intermediate_size),
        (0, 256)
    );
    assert!((0..4).all(|i| !dense.geometry.is_moe_layer(i)));
    let next = ModelConfig::load(&fixture("qwen3-next-tiny")).unwrap();
    assert_eq!(next.geometry.architecture, Architecture::Qwen3Next);
    assert_eq!(next.rotary_dim(), 16);
    for name in ["qwen35-tiny", "qwen3-next-tiny", "qwen35-moe-tiny-r4"] {
        let c = ModelConfig::load(&fixture(name)).unwrap();
        check_tensors(&c, &read_headers(&fixture(name)).unwrap()).unwrap();
    }
    assert_eq!(
        group_of(
            Architecture::Qwen3Next,
            "model.layers.0.linear_attn.in_proj_qkvz.weight"
        ),
        Some(WeightGroup::LinearAttention)
    );
    assert_eq!(
        group_of(
            Architecture::Qwen35Moe,
            "model.language_model.layers.0.mlp.experts.gate_up_proj"
        ),
        Some(WeightGroup::Experts)
    );
}

#[test]
fn hybrid_configs_refuse_what_they_cannot_run() {
    let base = fixture_config("qwen35-moe-tiny");
    let refused = |edit: &dyn Fn(&mut Value), needle: &str| {
        let mut c = base.clone();
        edit(&mut c);
        let err = load_edited(&c).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    };
    refused(
        &|c| c["text_config"]["layer_types"][0] = json!("sliding_attention"),
        "unknown layer type `sliding_attention`",
    );
    refused(
        &|c| c["text_config"]["linear_num_value_heads"] = json!(3),
        "not a multiple of `linear_num_key_heads`",
    );
    refused(
        &|c| c["text_config"]["linear_num_value_heads"] = json!(1_000_000),
        "`linear_num_value_heads` is 1000000, above the limit",
    );
    refused(
        &|c| c["text_config"]["linear_conv_kernel_dim"] = json!(100),
        "`linear_conv_kernel_dim` is 100, above the limit of 64",
    );
    refused(
        &|c| c["text_config"]["rope_parameters"]["mrope_section"] = json!([4, 4, 4]),
        "does not cover the 16 rotary dims",
    );
    refused(
        &|c| c["text_config"]["hidden_act"] = json!("gelu"),
        "`hidden_act` `gelu` is not supported",
    );
    refused(
        &|c| c["text_config"]["layer_types"] = json!(["full_attention"]),
        "`layer_types` has 1 entries for 4 layers",
    );
}
