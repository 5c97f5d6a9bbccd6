//! The `quantization_config` of a checkpoint (or its `hf_quant_config.json`):
//! which tool wrote the quantized tensors (their names and scale rules, the
//! [`QuantScheme`]) and, per linear module, the number format it is stored
//! in ([`QuantizationConfig::format_of`]). One checkpoint may mix formats:
//! ModelOpt's mixed precision keeps the experts in NVFP4 and the attention
//! projections in FP8.
//!
//! Every method sparkrt does not read (AWQ, bitsandbytes, GGUF, ...) is an
//! error naming it: never a silent BF16 fallback.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::error::CheckpointError;
pub use super::quant_types::{
    ModuleFormat, ModulePattern, QuantScheme, QuantizationConfig, SUPPORTED,
};
use crate::formats::{FP8_BLOCK, NVFP4_GROUP};
use crate::geometry::Quantization;

/// The keys of a `quantization_config` object that any supported method uses.
#[derive(Clone, Default, Deserialize)]
pub(super) struct RawQuant {
    pub quant_method: Option<String>,
    quant_algo: Option<String>,
    pub(super) group_size: Option<i64>,
    exclude_modules: Option<Vec<String>>,
    ignore: Option<Vec<String>>,
    modules_to_not_convert: Option<Vec<String>>,
    /// compressed-tensors: the checkpoint's compression format and its
    /// config groups (targets and weight quantization each).
    format: Option<String>,
    config_groups: Option<std::collections::BTreeMap<String, RawGroup>>,
    transform_config: Option<serde_json::Value>,
    sparsity_config: Option<serde_json::Value>,
    /// ModelOpt MIXED_PRECISION: module path → its algorithm.
    quantized_layers: Option<BTreeMap<String, RawLayerQuant>>,
    /// FP8 block-wise: the element format (`e4m3`).
    fmt: Option<String>,
    /// FP8 block-wise: how activations are scaled (`dynamic`). sparkrt
    /// multiplies with f32 activations, so only the weights' side matters.
    activation_scheme: Option<String>,
    /// FP8 block-wise: `[rows, cols]` of a scale's block.
    weight_block_size: Option<Vec<usize>>,
    /// GPTQ / AutoRound INT4 keys.
    #[serde(flatten)]
    pub(super) gptq: super::quant_gptq::RawGptq,
}

/// One compressed-tensors config group.
#[derive(Clone, Deserialize)]
struct RawGroup {
    targets: Vec<String>,
    weights: Option<RawWeightArgs>,
    /// A group's own compression format (else the config's `format`).
    format: Option<String>,
}

/// compressed-tensors' `QuantizationArgs` of a group's weights.
#[derive(Clone, Deserialize)]
struct RawWeightArgs {
    num_bits: Option<u32>,
    #[serde(rename = "type")]
    kind: Option<String>,
    group_size: Option<usize>,
    strategy: Option<String>,
    symmetric: Option<bool>,
}

/// One entry of ModelOpt's `quantized_layers`.
#[derive(Clone, Default, Deserialize)]
pub(super) struct RawLayerQuant {
    quant_algo: Option<String>,
    group_size: Option<usize>,
}

/// `hf_quant_config.json`: ModelOpt's `quantization` object.
#[derive(Deserialize)]
pub(super) struct RawHfQuant {
    pub quantization: RawQuant,
}

/// Interprets a `quantization_config` object (or `hf_quant_config.json`'s
/// `quantization`, with the method filled in) read from `path`.
pub(super) fn parse(raw: &RawQuant, path: &Path) -> Result<QuantizationConfig, CheckpointError> {
    let unsupported = |method: String| CheckpointError::UnsupportedQuantization {
        path: path.to_path_buf(),
        method,
        supported: SUPPORTED,
    };
    let method = raw.quant_method.clone().unwrap_or_default();
    let globs: Vec<ModulePattern> = [
        &raw.exclude_modules,
        &raw.ignore,
        &raw.modules_to_not_convert,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .map(ModulePattern::glob)
    .collect();
    match method.to_ascii_lowercase().as_str() {
        "modelopt" => modelopt(raw, globs, &unsupported),
        "mxfp4" => Ok(QuantizationConfig {
            scheme: QuantScheme::Mxfp4,
            method: Quantization::Mxfp4,
            group_size: crate::formats::MXFP4_GROUP,
            excluded_modules: globs,
            module_formats: Vec::new(),
            unlisted: Quantization::Mxfp4,
        }),
        "compressed-tensors" => compressed_tensors(raw).map_err(unsupported),
        "fp8" => fp8_block(raw, globs, &unsupported),
        lower @ ("gptq" | "auto-round" | "auto_round") => {
            let lower = if lower == "gptq" {
                "gptq"
            } else {
                "auto-round"
            };
            super::quant_gptq::parse(lower, raw.group_size, &raw.gptq, globs, path)
        }
        _ => Err(unsupported(method)),
    }
}

/// compressed-tensors: each config group quantizes the modules its targets
/// name; `ignore` wins over every group. Only NVFP4 groups
/// (`nvfp4-pack-quantized`: 4-bit float weights in groups of 16) are read;
/// the error names anything else.
fn compressed_tensors(raw: &RawQuant) -> Result<QuantizationConfig, String> {
    let name = |f: Option<&String>| f.map_or("(no format)", String::as_str).to_string();
    // Rotations applied online (QuIP, SpinQuant) or sparse weights would
    // change the model's function with tensors sparkrt does not apply.
    for (key, value) in [
        ("transform_config", &raw.transform_config),
        ("sparsity_config", &raw.sparsity_config),
    ] {
        if value.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(format!("compressed-tensors with a `{key}`"));
        }
    }
    let groups = raw
        .config_groups
        .as_ref()
        .filter(|g| !g.is_empty())
        .ok_or_else(|| "compressed-tensors without `config_groups`".to_string())?;
    let mut module_formats = Vec::new();
    for (group_name, group) in groups {
        let format = group.format.as_ref().or(raw.format.as_ref());
        let weights = group.weights.as_ref().ok_or_else(|| {
            format!("compressed-tensors group `{group_name}` without weight quantization")
        })?;
        let nvfp4 = format.is_some_and(|f| f == "nvfp4-pack-quantized")
            && weights.num_bits == Some(4)
            && weights.kind.as_deref() == Some("float")
            && weights.group_size == Some(NVFP4_GROUP)
            && weights
                .strategy
                .as_deref()
                .is_none_or(|s| s == "tensor_group")
            && weights.symmetric != Some(false);
        if !nvfp4 {
            return Err(format!(
                "compressed-tensors {} (group `{group_name}`: {}-bit {} weights, group size {}; \
                 sparkrt reads nvfp4-pack-quantized)",
                name(format),
                weights.num_bits.map_or("?".to_string(), |b| b.to_string()),
                weights.kind.as_deref().unwrap_or("?"),
                weights
                    .group_size
                    .map_or("?".to_string(), |g| g.to_string()),
            ));
        }
        for target in &group.targets {
            module_formats.push(ModuleFormat {
                pattern: ModulePattern::compressed_tensors(target)?,
                format: Quantization::Nvfp4,
            });
        }
    }
    // The most specific target decides, as in compressed-tensors (the
    // order of the groups in the file does not).
    module_formats.sort_by_key(|rule| rule.pattern.precedence());
    let excluded_modules = raw
        .ignore
        .iter()
        .flatten()
        .map(|p| ModulePattern::compressed_tensors(p))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(QuantizationConfig {
        scheme: QuantScheme::CompressedTensors,
        method: Quantization::Nvfp4,
        group_size: NVFP4_GROUP,
        excluded_modules,
        module_formats,
        unlisted: Quantization::Bf16,
    })
}

/// ModelOpt's `quant_algo`: uniform NVFP4 or FP8, or MIXED_PRECISION with a
/// format per module. `input_scale` (static activation scales) is accepted
/// and unused: sparkrt multiplies with f32 activations. `kv_cache_quant_algo`
/// is the KV cache's business, not the weights'.
fn modelopt(
    raw: &RawQuant,
    excluded_modules: Vec<ModulePattern>,
    unsupported: &dyn Fn(String) -> CheckpointError,
) -> Result<QuantizationConfig, CheckpointError> {
    let algo = raw.quant_algo.clone().unwrap_or_default();
    let uniform = |method, group_size| QuantizationConfig {
        scheme: QuantScheme::ModelOpt,
        method,
        group_size,
        excluded_modules: excluded_modules.clone(),
        module_formats: Vec::new(),
        unlisted: method,
    };
    match algo.to_ascii_uppercase().as_str() {
        "NVFP4" => {
            let group_size = raw.group_size.unwrap_or(NVFP4_GROUP as i64);
            if group_size != NVFP4_GROUP as i64 {
                return Err(unsupported(format!("NVFP4 with group_size {group_size}")));
            }
            Ok(uniform(Quantization::Nvfp4, NVFP4_GROUP))
        }
        "FP8" => Ok(uniform(Quantization::Fp8, 0)),
        "MIXED_PRECISION" => modelopt_mixed(raw, excluded_modules, unsupported),
        _ => Err(unsupported(format!("modelopt {algo}"))),
    }
}

/// ModelOpt MIXED_PRECISION: `quantized_layers` names each quantized module
/// (a projection, or a parent such as `model.layers.0.mlp.experts`) with its
/// algorithm; a module it does not name is unquantized (as in vLLM):
/// `unlisted` is bf16. `method` is the routed experts' format.
fn modelopt_mixed(
    raw: &RawQuant,
    excluded_modules: Vec<ModulePattern>,
    unsupported: &dyn Fn(String) -> CheckpointError,
) -> Result<QuantizationConfig, CheckpointError> {
    let Some(layers) = raw.quantized_layers.as_ref().filter(|l| !l.is_empty()) else {
        return Err(unsupported(
            "modelopt MIXED_PRECISION without `quantized_layers`".to_string(),
        ));
    };
    let mut module_formats = Vec::with_capacity(layers.len() + 1);
    for (module, layer) in layers {
        let algo = layer.quant_algo.clone().unwrap_or_default();
        let format = match algo.to_ascii_uppercase().as_str() {
            "NVFP4" => match layer.group_size.unwrap_or(NVFP4_GROUP) {
                NVFP4_GROUP => Quantization::Nvfp4,
                group => {
                    return Err(unsupported(format!(
                        "modelopt MIXED_PRECISION layer {module}: NVFP4 with group_size {group}"
                    )));
                }
            },
            "FP8" => Quantization::Fp8,
            _ => {
                return Err(unsupported(format!(
                    "modelopt MIXED_PRECISION layer {module}: quant_algo {algo:?}"
                )));
            }
        };
        module_formats.push(ModuleFormat {
            pattern: ModulePattern::glob(module.clone()),
            format,
        });
    }
    let experts = module_formats
        .iter()
        .find(|rule| rule.pattern.source().contains(".experts"))
        .or_else(|| {
            module_formats
                .iter()
                .find(|rule| rule.format == Quantization::Nvfp4)
        })
        .map_or(Quantization::Fp8, |rule| rule.format);
    Ok(QuantizationConfig {
        scheme: QuantScheme::ModelOpt,
        method: experts,
        group_size: if experts == Quantization::Nvfp4 {
            NVFP4_GROUP
        } else {
            0
        },
        excluded_modules,
        module_formats,
        unlisted: Quantization::Bf16,
    })
}

/// Fine-grained FP8 (`quant_method: fp8`): E4M3 weights with one scale per
/// 128 × 128 block. Another element format, block shape or a static
/// activation scheme (which adds activation scales) is refused by name.
fn fp8_block(
    raw: &RawQuant,
    excluded_modules: Vec<ModulePattern>,
    unsupported: &dyn Fn(String) -> CheckpointError,
) -> Result<QuantizationConfig, CheckpointError> {
    let fmt = raw.fmt.clone().unwrap_or_else(|| "e4m3".to_string());
    if !fmt.eq_ignore_ascii_case("e4m3") {
        return Err(unsupported(format!("fp8 with fmt {fmt:?}")));
    }
    let activations = raw
        .activation_scheme
        .clone()
        .unwrap_or_else(|| "dynamic".to_string());
    if !activations.eq_ignore_ascii_case("dynamic") {
        return Err(unsupported(format!(
            "fp8 with activation_scheme {activations:?}"
        )));
    }
    match raw.weight_block_size.as_deref() {
        Some([FP8_BLOCK, FP8_BLOCK]) => {}
        Some(other) => {
            return Err(unsupported(format!("fp8 with weight_block_size {other:?}")));
        }
        None => {
            return Err(unsupported(
                "fp8 per-tensor (no weight_block_size)".to_string(),
            ));
        }
    }
    Ok(QuantizationConfig {
        scheme: QuantScheme::Fp8Block,
        method: Quantization::Fp8Block,
        group_size: FP8_BLOCK,
        excluded_modules,
        module_formats: Vec::new(),
        unlisted: Quantization::Fp8Block,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusions_then_rules_then_the_method_decide_a_module_format() {
        let config = QuantizationConfig {
            scheme: QuantScheme::ModelOpt,
            method: Quantization::Nvfp4,
            group_size: NVFP4_GROUP,
            excluded_modules: vec![
                ModulePattern::glob("lm_head"),
                ModulePattern::glob("model.layers.*.mlp.gate"),
            ],
            module_formats: vec![ModuleFormat {
                pattern: ModulePattern::glob("model.layers.*.self_attn"),
                format: Quantization::Fp8,
            }],
            unlisted: Quantization::Nvfp4,
        };
        let format = |m: &str| config.format_of(m);
        assert_eq!(format("lm_head"), Quantization::Bf16);
        assert_eq!(format("model.layers.3.mlp.gate"), Quantization::Bf16);
        // A rule on a parent module covers its projections.
        assert_eq!(format("model.layers.3.self_attn.q_proj"), Quantization::Fp8);
        assert_eq!(
            format("model.layers.3.mlp.experts.7.down_proj"),
            Quantization::Nvfp4
        );
        // `mlp.gate` excludes the router, not `mlp.gate_proj`.
        assert_eq!(format("model.layers.3.mlp.gate_proj"), Quantization::Nvfp4);
    }

    #[test]
    fn compressed_tensors_regexes_match_from_the_start_like_python_re_match() {
        let gate = ModulePattern::compressed_tensors("re:.*mlp.gate$").unwrap();
        assert!(gate.matches("model.layers.0.mlp.gate"));
        assert!(!gate.matches("model.layers.0.mlp.gate_proj"));
        let experts = ModulePattern::compressed_tensors("re:model.*experts").unwrap();
        // Anchored at the start, open at the end (re.match).
        assert!(experts.matches("model.layers.1.mlp.experts.3.up_proj"));
        assert!(!experts.matches("x.model.layers.1.mlp.experts.3.up_proj"));
        assert!(
            ModulePattern::compressed_tensors("Linear")
                .unwrap()
                .matches("lm_head")
        );
        let exact = ModulePattern::compressed_tensors("lm_head").unwrap();
        assert!(exact.matches("lm_head") && !exact.matches("lm_head_2"));
        // A name is exact: no parents, no wildcards.
        let attn = ModulePattern::compressed_tensors("model.layers.0.self_attn").unwrap();
        assert!(!attn.matches("model.layers.0.self_attn.q_proj"));
        let star = ModulePattern::compressed_tensors("model.layers.*.q_proj").unwrap();
        assert!(!star.matches("model.layers.0.q_proj"));
        // `Linear` is every linear but the routers.
        let linear = ModulePattern::compressed_tensors("Linear").unwrap();
        assert!(linear.matches("model.layers.0.mlp.gate_proj"));
        assert!(!linear.matches("model.layers.0.mlp.gate"));
        let class = ModulePattern::compressed_tensors("Qwen3MoeSparseMoeBlock").unwrap_err();
        assert!(class.contains("module class"), "{class}");
        let bad = ModulePattern::compressed_tensors("re:(?<=x)y").unwrap_err();
        assert!(bad.contains("re:(?<=x)y"), "{bad}");
    }

    fn parsed(json: &str) -> Result<QuantizationConfig, CheckpointError> {
        let raw: RawQuant =
            serde_json::from_str(json).map_err(|source| CheckpointError::ConfigJson {
                path: "config.json".into(),
                source,
            })?;
        parse(&raw, Path::new("config.json"))
    }

    fn refusal(json: &str) -> String {
        match parsed(json) {
            Err(CheckpointError::UnsupportedQuantization { method, .. }) => method,
            other => panic!("{json}: expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn modelopt_fp8_is_per_tensor_fp8() {
        let q = parsed(
            r#"{"quant_method": "modelopt", "quant_algo": "FP8",
                "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}"#,
        )
        .unwrap();
        assert_eq!(q.scheme, QuantScheme::ModelOpt);
        assert_eq!(
            q.format_of("model.layers.0.self_attn.q_proj"),
            Quantization::Fp8
        );
        assert_eq!(q.format_of("lm_head"), Quantization::Bf16);
    }

    #[test]
    fn modelopt_mixed_precision_takes_each_module_from_quantized_layers() {
        let q = parsed(
            r#"{"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                "kv_cache_quant_algo": "FP8",
                "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"],
                "quantized_layers": {
                    "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"},
                    "model.layers.0.linear_attn.in_proj_qkv": {"quant_algo": "FP8"},
                    "model.layers.0.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16},
                    "model.layers.0.mlp.shared_expert.up_proj": {"quant_algo": "NVFP4", "group_size": 16}
                }}"#,
        )
        .unwrap();
        assert_eq!(q.method, Quantization::Nvfp4, "the experts' format");
        let f = |m: &str| q.format_of(m);
        assert_eq!(f("model.layers.0.self_attn.q_proj"), Quantization::Fp8);
        assert_eq!(
            f("model.layers.0.linear_attn.in_proj_qkv"),
            Quantization::Fp8
        );
        // A parent module's entry covers its experts.
        assert_eq!(
            f("model.layers.0.mlp.experts.5.down_proj"),
            Quantization::Nvfp4
        );
        assert_eq!(
            f("model.layers.0.mlp.shared_expert.up_proj"),
            Quantization::Nvfp4
        );
        // Named nowhere: unquantized, as are the exclusions.
        assert_eq!(f("model.layers.0.self_attn.k_proj"), Quantization::Bf16);
        assert_eq!(
            f("model.layers.1.mlp.experts.0.up_proj"),
            Quantization::Bf16
        );
        assert_eq!(f("model.layers.0.mlp.gate"), Quantization::Bf16);
        assert_eq!(f("lm_head"), Quantization::Bf16);
    }

    #[test]
    fn fp8_block_wise_is_read_and_its_variants_refused_by_name() {
        let q = parsed(
            r#"{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128],
                "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"]}"#,
        )
        .unwrap();
        assert_eq!(q.scheme, QuantScheme::Fp8Block);
        assert_eq!(
            q.format_of("model.layers.3.mlp.experts.1.up_proj"),
            Quantization::Fp8Block
        );
        assert_eq!(q.format_of("model.layers.0.mlp.gate"), Quantization::Bf16);
        assert!(
            refusal(r#"{"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}"#)
                .contains("e5m2")
        );
        assert!(
            refusal(r#"{"quant_method": "fp8", "weight_block_size": [64, 64]}"#)
                .contains("[64, 64]")
        );
        assert!(refusal(r#"{"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}"#).contains("static"));
        assert!(refusal(r#"{"quant_method": "fp8"}"#).contains("per-tensor"));
    }

    #[test]
    fn modelopt_algorithms_sparkrt_does_not_read_are_refused_by_name() {
        assert!(
            refusal(r#"{"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}"#)
                .contains("W4A8_AWQ")
        );
        assert!(
            refusal(r#"{"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}"#)
                .contains("quantized_layers")
        );
        let m = refusal(
            r#"{"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                "quantized_layers": {"model.layers.0.mlp.experts": {"quant_algo": "W4A16_AWQ"}}}"#,
        );
        assert!(
            m.contains("model.layers.0.mlp.experts") && m.contains("W4A16_AWQ"),
            "{m}"
        );
        let m = refusal(
            r#"{"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                "quantized_layers": {"x": {"quant_algo": "NVFP4", "group_size": 32}}}"#,
        );
        assert!(m.contains("group_size 32"), "{m}");
    }
}
