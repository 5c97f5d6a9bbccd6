//! The `quantization_config` of a checkpoint (or its `hf_quant_config.json`):
//! which tool wrote the quantized tensors (their names and scale rules, the
//! [`QuantScheme`]) and, per linear module, the number format it is stored
//! in ([`QuantizationConfig::format_of`]). One checkpoint may mix formats:
//! ModelOpt's mixed precision keeps the experts in NVFP4 and the attention
//! projections in FP8.
//!
//! Every method sparkrt does not read (AWQ, bitsandbytes, GGUF, ...) is an
//! error naming it: never a silent BF16 fallback.

use std::path::Path;

use serde::Deserialize;

use super::error::CheckpointError;
use super::glob::glob_match;
use crate::formats::NVFP4_GROUP;
use crate::geometry::Quantization;

/// The quantizations `parse` reads, for error messages.
pub const SUPPORTED: &str = "ModelOpt NVFP4, MXFP4, GPTQ / AutoRound INT4 (auto_round:auto_gptq)";

/// The tool whose tensor layout the quantized modules follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantScheme {
    /// NVIDIA ModelOpt (`quant_method: modelopt`, or `hf_quant_config.json`):
    /// NVFP4 as `weight` (U8 codes), `weight_scale` (E4M3 per 16),
    /// `weight_scale_2` (f32); FP8 as `weight` (E4M3), `weight_scale` (f32).
    ModelOpt,
    /// gpt-oss's OCP MXFP4 experts: `_blocks` and `_scales`.
    Mxfp4,
    /// GPTQ-layout INT4 (`quant_method` `gptq` or `auto-round`): `qweight`,
    /// `qzeros`, `scales`, optional `g_idx` (see `quant_gptq`). `sym`: every
    /// zero point must be 8; `zero_offset`: added to a stored zero (1 for
    /// GPTQ v1, which stores zero − 1).
    Gptq { sym: bool, zero_offset: u8 },
}

impl QuantScheme {
    pub fn name(self) -> &'static str {
        match self {
            QuantScheme::ModelOpt => "modelopt",
            QuantScheme::Mxfp4 => "mxfp4",
            QuantScheme::Gptq { .. } => "gptq",
        }
    }
}

/// How the quantized weights are stored and which modules stay unquantized.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizationConfig {
    pub scheme: QuantScheme,
    /// The format of every quantized module no rule of `module_formats`
    /// names: the routed experts' format.
    pub method: Quantization,
    /// Elements per scale of `method` where the format lets the checkpoint
    /// choose (16 for NVFP4, 32 for MXFP4).
    pub group_size: usize,
    /// Module patterns left unquantized (`exclude_modules` / `ignore` /
    /// `modules_to_not_convert`), fnmatch-style globs.
    pub excluded_modules: Vec<String>,
    /// Per-module formats (mixed precision), first match wins; a module
    /// matched here takes its format from the rule, not from `method`.
    pub module_formats: Vec<ModuleFormat>,
    /// Module prefixes the tool quantized (AutoRound's
    /// `block_name_to_quantize`); empty: every module not excluded.
    pub quantized_blocks: Vec<String>,
}

/// One rule of a mixed-precision checkpoint: modules matching `pattern`
/// (an fnmatch glob over the module path) are stored as `format`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleFormat {
    pub pattern: String,
    pub format: Quantization,
}

impl QuantizationConfig {
    /// The format linear module `module` (a module path such as
    /// `model.layers.0.mlp.experts.3.gate_proj`, no `.weight`) is stored in:
    /// bf16 when an exclude pattern matches the module or one of its parents
    /// (`model.layers.*.self_attn` excludes `model.layers.0.self_attn.q_proj`),
    /// else the first matching mixed-precision rule's, else `method`.
    pub fn format_of(&self, module: &str) -> Quantization {
        let outside_blocks = !self.quantized_blocks.is_empty()
            && !self
                .quantized_blocks
                .iter()
                .any(|block| module_matches(block, module));
        if outside_blocks
            || self
                .excluded_modules
                .iter()
                .any(|pattern| module_matches(pattern, module))
        {
            return Quantization::Bf16;
        }
        self.module_formats
            .iter()
            .find(|rule| module_matches(&rule.pattern, module))
            .map_or(self.method, |rule| rule.format)
    }
}

/// The keys of a `quantization_config` object that any supported method uses.
#[derive(Clone, Default, Deserialize)]
pub(super) struct RawQuant {
    pub quant_method: Option<String>,
    quant_algo: Option<String>,
    pub(super) group_size: Option<i64>,
    exclude_modules: Option<Vec<String>>,
    ignore: Option<Vec<String>>,
    modules_to_not_convert: Option<Vec<String>>,
    #[serde(flatten)]
    pub(super) gptq: super::quant_gptq::RawGptq,
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
    };
    let method = raw.quant_method.clone().unwrap_or_default();
    let excluded_modules: Vec<String> = [
        &raw.exclude_modules,
        &raw.ignore,
        &raw.modules_to_not_convert,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .cloned()
    .collect();
    match method.to_ascii_lowercase().as_str() {
        "modelopt" => {
            let algo = raw.quant_algo.clone().unwrap_or_default();
            if !algo.eq_ignore_ascii_case("NVFP4") {
                return Err(unsupported(format!("modelopt {algo}")));
            }
            let group_size = raw.group_size.unwrap_or(NVFP4_GROUP as i64);
            if group_size != NVFP4_GROUP as i64 {
                return Err(unsupported(format!("NVFP4 with group_size {group_size}")));
            }
            Ok(QuantizationConfig {
                scheme: QuantScheme::ModelOpt,
                method: Quantization::Nvfp4,
                group_size: NVFP4_GROUP,
                excluded_modules,
                module_formats: Vec::new(),
                quantized_blocks: Vec::new(),
            })
        }
        "mxfp4" => Ok(QuantizationConfig {
            scheme: QuantScheme::Mxfp4,
            method: Quantization::Mxfp4,
            group_size: crate::formats::MXFP4_GROUP,
            excluded_modules,
            module_formats: Vec::new(),
            quantized_blocks: Vec::new(),
        }),
        lower @ ("gptq" | "auto-round" | "auto_round") => {
            let lower = if lower == "gptq" {
                "gptq"
            } else {
                "auto-round"
            };
            super::quant_gptq::parse(lower, raw, &raw.gptq, excluded_modules, path)
        }
        _ => Err(unsupported(method)),
    }
}

/// Whether the pattern covers `module` itself or one of its parent modules
/// (matching at `.` boundaries).
pub(super) fn module_matches(pattern: &str, module: &str) -> bool {
    if glob_match(pattern, module) {
        return true;
    }
    module
        .match_indices('.')
        .any(|(dot, _)| glob_match(pattern, &module[..dot]))
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
            excluded_modules: vec!["lm_head".into(), "model.layers.*.mlp.gate".into()],
            module_formats: vec![ModuleFormat {
                pattern: "model.layers.*.self_attn".into(),
                format: Quantization::Fp8,
            }],
            quantized_blocks: Vec::new(),
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
}
