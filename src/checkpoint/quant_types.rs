//! The number formats of a checkpoint's linear modules, once read: which
//! tool wrote the quantized tensors ([`QuantScheme`]: their names and scale
//! rules) and, per module, the format it is stored in
//! ([`QuantizationConfig::format_of`]). `quant_config` (and `quant_gptq`)
//! read them from the checkpoint's own config.

use super::glob::glob_match;
use crate::geometry::Quantization;

/// The quantizations `parse` reads, for error messages.
pub const SUPPORTED: &str = "ModelOpt NVFP4, ModelOpt FP8, ModelOpt MIXED_PRECISION (NVFP4 and \
     FP8 layers), compressed-tensors nvfp4-pack-quantized, FP8 block-wise (quant_method fp8, \
     e4m3, weight_block_size [128, 128]), MXFP4, GPTQ / AutoRound INT4 (gptq, auto-round with \
     auto_round:auto_gptq packing)";

/// The tool whose tensor layout the quantized modules follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantScheme {
    /// NVIDIA ModelOpt (`quant_method: modelopt`, or `hf_quant_config.json`):
    /// NVFP4 as `weight` (U8 codes), `weight_scale` (E4M3 per 16),
    /// `weight_scale_2` (f32); FP8 as `weight` (E4M3), `weight_scale` (f32).
    ModelOpt,
    /// gpt-oss's OCP MXFP4 experts: `_blocks` and `_scales`.
    Mxfp4,
    /// compressed-tensors (`quant_method: compressed-tensors`, written by
    /// llm-compressor): NVFP4 as `weight_packed` (U8 codes), `weight_scale`
    /// (E4M3 per 16) and `weight_global_scale` (f32), which *divides*.
    CompressedTensors,
    /// Fine-grained FP8 (`quant_method: fp8`, Qwen's `-FP8` releases,
    /// DeepSeek-V3): `weight` (E4M3) and `weight_scale_inv` per 128 × 128 block.
    Fp8Block,
    /// GPTQ-layout INT4 (`quant_method` `gptq` or `auto-round`): `qweight`,
    /// `qzeros`, `scales`, optional `g_idx` (see `quant_gptq`). `sym`: every
    /// zero point must be 8; `zero_offset`: added to a stored zero (1 for
    /// GPTQ v1, which stores zero − 1).
    Gptq { sym: bool, zero_offset: u8 },
}

impl QuantScheme {
    /// The `--quantization` values vLLM takes for checkpoints of this
    /// scheme (`serve --quantization` accepts these and refuses the rest).
    pub fn vllm_names(self) -> &'static [&'static str] {
        match self {
            QuantScheme::ModelOpt => &["modelopt", "modelopt_fp4", "modelopt_mixed"],
            QuantScheme::Mxfp4 => &["mxfp4"],
            QuantScheme::CompressedTensors => &["compressed-tensors"],
            QuantScheme::Fp8Block => &["fp8"],
            QuantScheme::Gptq { .. } => &["gptq", "gptq_marlin", "auto-round"],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantScheme::ModelOpt => "modelopt",
            QuantScheme::Mxfp4 => "mxfp4",
            QuantScheme::CompressedTensors => "compressed-tensors",
            QuantScheme::Fp8Block => "fp8",
            QuantScheme::Gptq { .. } => "gptq",
        }
    }
}

/// How the quantized weights are stored and which modules stay unquantized.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizationConfig {
    pub scheme: QuantScheme,
    /// The format the config names (the main one of a mixed checkpoint),
    /// for reports; per module, [`Self::format_of`] decides.
    pub method: Quantization,
    /// Elements per scale of `method` where the format lets the checkpoint
    /// choose (16 for NVFP4, 32 for MXFP4).
    pub group_size: usize,
    /// Modules left unquantized (`exclude_modules` / `ignore` /
    /// `modules_to_not_convert`).
    pub excluded_modules: Vec<ModulePattern>,
    /// Per-module formats (mixed precision, compressed-tensors' config
    /// groups), first match wins.
    pub module_formats: Vec<ModuleFormat>,
    /// The format of a module neither list names: `method` where the config
    /// quantizes everything it does not exclude (ModelOpt NVFP4, MXFP4),
    /// bf16 where it lists what it quantizes (compressed-tensors targets).
    pub unlisted: Quantization,
}

/// A module pattern of a quantization config, matched the way the tool that
/// wrote it matches.
#[derive(Clone, Debug, PartialEq)]
pub struct ModulePattern {
    /// As the config spells it (`model.layers.*.mlp.gate`, `re:.*mlp.gate$`).
    source: String,
    matcher: Matcher,
}

#[derive(Clone, Debug)]
enum Matcher {
    /// An fnmatch glob over the module or one of its parents (ModelOpt, HF).
    Glob,
    /// compressed-tensors' `re:` patterns: Python's `re.match`, anchored at
    /// the start of the module name only.
    Regex(regex::Regex),
    /// compressed-tensors' name targets: the module itself, exactly
    /// (`target == name`, no parents, no wildcards).
    Exact,
    /// compressed-tensors' `Linear` target: every `nn.Linear`, which the
    /// MoE routers (`mlp.gate`, gpt-oss's `mlp.router`) are not in
    /// transformers' Qwen3.5 and gpt-oss (vLLM never quantizes a router).
    AnyLinear,
}

impl PartialEq for Matcher {
    /// Patterns compare by their source; the matcher kind is what remains.
    fn eq(&self, other: &Matcher) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

impl ModulePattern {
    /// An fnmatch glob (ModelOpt's `exclude_modules`, HF's
    /// `modules_to_not_convert`).
    pub fn glob(source: impl Into<String>) -> ModulePattern {
        ModulePattern {
            source: source.into(),
            matcher: Matcher::Glob,
        }
    }

    /// A compressed-tensors target or ignore entry: `re:` + a regex, the
    /// class name `Linear`, or a module name. Errors name the pattern.
    pub fn compressed_tensors(source: &str) -> Result<ModulePattern, String> {
        let matcher = if let Some(pattern) = source.strip_prefix("re:") {
            let anchored = format!("^(?:{pattern})");
            Matcher::Regex(
                regex::Regex::new(&anchored)
                    .map_err(|e| format!("pattern `{source}` is not a regex sparkrt reads: {e}"))?,
            )
        } else if source == "Linear" {
            Matcher::AnyLinear
        } else if source.contains(|c: char| c.is_ascii_uppercase()) && !source.contains('.') {
            // A class name other than `Linear` (`Qwen3MoeSparseMoeBlock`):
            // sparkrt cannot tell which modules are of that class.
            return Err(format!(
                "target `{source}` names a module class; sparkrt reads `Linear`, module names \
                 and `re:` patterns"
            ));
        } else {
            Matcher::Exact
        };
        Ok(ModulePattern {
            source: source.to_string(),
            matcher,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the pattern covers linear module `module`.
    pub fn matches(&self, module: &str) -> bool {
        match &self.matcher {
            Matcher::Glob => module_matches(&self.source, module),
            Matcher::Regex(regex) => regex.is_match(module),
            Matcher::Exact => self.source == module,
            Matcher::AnyLinear => !is_router(module),
        }
    }

    /// compressed-tensors' precedence among the targets matching one
    /// module: an exact name, then a regex, then a class.
    pub(super) fn precedence(&self) -> u8 {
        match self.matcher {
            Matcher::Exact | Matcher::Glob => 0,
            Matcher::Regex(_) => 1,
            Matcher::AnyLinear => 2,
        }
    }
}

/// Whether `module` is an MoE router (never a quantized linear).
fn is_router(module: &str) -> bool {
    module.ends_with(".mlp.gate") || module.ends_with(".mlp.router")
}

/// One rule of a mixed-precision checkpoint: modules matching `pattern` are
/// stored as `format`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleFormat {
    pub pattern: ModulePattern,
    pub format: Quantization,
}

impl QuantizationConfig {
    /// The format linear module `module` (a module path such as
    /// `model.layers.0.mlp.experts.3.gate_proj`, no `.weight`) is stored in:
    /// bf16 when an exclusion matches the module (a glob also matches one of
    /// its parents: `model.layers.*.self_attn` excludes
    /// `model.layers.0.self_attn.q_proj`), else the first matching rule's,
    /// else `unlisted`.
    pub fn format_of(&self, module: &str) -> Quantization {
        if self.excluded_modules.iter().any(|p| p.matches(module)) {
            return Quantization::Bf16;
        }
        self.module_formats
            .iter()
            .find(|rule| rule.pattern.matches(module))
            .map_or(self.unlisted, |rule| rule.format)
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
