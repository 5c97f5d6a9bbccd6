//! `quantization_config` of GPTQ-layout INT4 checkpoints: `quant_method`
//! `gptq` (AutoGPTQ / GPTQModel) and `auto-round` (Intel AutoRound exported
//! in its `auto_round:auto_gptq` / `auto_round:gptq` packing). Both store a
//! module as `qweight` I32 `[in/8, out]`, `qzeros` I32 `[in/group, out/8]`,
//! `scales` F16 `[in/group, out]` and optionally `g_idx` I32 `[in]`.
//!
//! Read: 4 bits, a group size dividing the input dimension, symmetric or
//! not, `desc_act` false, zero points in the v1 (stored minus one) or v2
//! convention. Refused, naming the option: other bit widths, `desc_act`
//! true (columns permuted by `g_idx`), group size -1, other packings
//! (AutoRound's native `auto_round` and `auto_awq` layouts), per-layer
//! overrides to a width other than 4 or 16 bits.

use std::path::Path;

use serde_json::Value;

use super::error::CheckpointError;
use super::quant_types::{ModuleFormat, ModulePattern, QuantScheme, QuantizationConfig, SUPPORTED};
use crate::geometry::Quantization;

/// Bit widths at or above which AutoRound leaves a layer unquantized.
const UNQUANTIZED_BITS: u64 = 16;

/// The GPTQ keys of a `quantization_config`.
#[derive(Clone, Default, serde::Deserialize)]
pub(super) struct RawGptq {
    bits: Option<u64>,
    sym: Option<bool>,
    desc_act: Option<bool>,
    checkpoint_format: Option<String>,
    packing_format: Option<String>,
    /// AutoRound: per-module overrides, `{module: {"bits": 16, ...}}`.
    extra_config: Option<serde_json::Map<String, Value>>,
    /// AutoRound: the block prefixes it quantized (a string, comma-separated
    /// or not, or a list); everything else stays 16-bit.
    block_name_to_quantize: Option<Value>,
}

/// Interprets a `gptq` / `auto-round` config; `method` is `quant_method`.
pub(super) fn parse(
    method: &str,
    group_size: Option<i64>,
    gptq: &RawGptq,
    excluded_modules: Vec<ModulePattern>,
    path: &Path,
) -> Result<QuantizationConfig, CheckpointError> {
    let unsupported = |what: String| CheckpointError::UnsupportedQuantization {
        path: path.to_path_buf(),
        method: format!("{method} {what}"),
        supported: SUPPORTED,
    };
    let bits = gptq.bits.unwrap_or(4);
    if bits != 4 {
        return Err(unsupported(format!("with bits {bits} (INT4 only)")));
    }
    let group_size = match group_size {
        Some(g) if g > 0 => g as usize,
        Some(g) => {
            return Err(unsupported(format!(
                "with group_size {g} (a positive group size only)"
            )));
        }
        None => return Err(unsupported("without group_size".to_string())),
    };
    if gptq.desc_act == Some(true) {
        return Err(unsupported(
            "with desc_act true (act-order g_idx permutation)".to_string(),
        ));
    }
    let zero_offset = zero_offset(method, gptq).map_err(unsupported)?;
    let sym = gptq.sym.unwrap_or(true);

    let mut excluded = excluded_modules;
    if let Some(extra) = &gptq.extra_config {
        for (module, rule) in extra {
            match rule.get("bits").and_then(Value::as_u64) {
                None | Some(4) => {
                    if let Some(g) = rule.get("group_size").and_then(Value::as_i64)
                        && g != group_size as i64
                    {
                        return Err(unsupported(format!(
                            "extra_config `{module}` with group_size {g}"
                        )));
                    }
                }
                Some(b) if b >= UNQUANTIZED_BITS => {
                    excluded.push(ModulePattern::glob(module.clone()))
                }
                Some(b) => {
                    return Err(unsupported(format!(
                        "extra_config `{module}` with bits {b}"
                    )));
                }
            }
        }
    }
    let quantized_blocks = match &gptq.block_name_to_quantize {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => s
            .split(',')
            .map(|b| b.trim().to_string())
            .filter(|b| !b.is_empty())
            .collect(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| unsupported("block_name_to_quantize of non-strings".to_string()))?,
        Some(other) => return Err(unsupported(format!("block_name_to_quantize {other}"))),
    };
    // AutoRound quantizes only the blocks it names: those are INT4 and
    // every other module bf16; without the key every module not excluded is.
    let unlisted = if quantized_blocks.is_empty() {
        Quantization::Int4
    } else {
        Quantization::Bf16
    };
    let module_formats = quantized_blocks
        .into_iter()
        .map(|block| ModuleFormat {
            pattern: ModulePattern::glob(block),
            format: Quantization::Int4,
        })
        .collect();
    Ok(QuantizationConfig {
        scheme: QuantScheme::Gptq { sym, zero_offset },
        method: Quantization::Int4,
        group_size,
        excluded_modules: excluded,
        module_formats,
        unlisted,
    })
}

/// The offset between a stored `qzeros` code and the zero point it means.
fn zero_offset(method: &str, gptq: &RawGptq) -> Result<u8, String> {
    if method == "gptq" {
        return match gptq.checkpoint_format.as_deref().unwrap_or("gptq") {
            // AutoGPTQ's v1 format stores zero − 1.
            "gptq" => Ok(1),
            "gptq_v2" => Ok(0),
            other => Err(format!(
                "checkpoint_format `{other}` (gptq or gptq_v2 only)"
            )),
        };
    }
    // AutoRound names its export layout in `packing_format`; the GPTQ ones
    // are AutoGPTQ-compatible (v1 zeros).
    match gptq.packing_format.as_deref() {
        Some("auto_round:auto_gptq" | "auto_round:gptq") => Ok(1),
        Some(other) => Err(format!(
            "packing_format `{other}` (auto_round:auto_gptq or auto_round:gptq only)"
        )),
        None => Err("without packing_format (auto_round:auto_gptq only)".to_string()),
    }
}
