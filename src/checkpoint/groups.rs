//! Which plan group (`WeightGroup`) each checkpoint tensor belongs to, for
//! both architectures, unquantized and quantized.

use std::collections::BTreeMap;

use super::header_set::TensorInfo;
use crate::geometry::{Architecture, WeightGroup};

/// Parameters of a linear module: the weight and bias, and the codes and
/// scales of each quantized layout (ModelOpt, compressed-tensors, FP8 block,
/// GPTQ). KV-cache scales are `kv_scales`' (the attention group).
const LINEAR_PARAMS: [&str; 13] = [
    "weight",
    "bias",
    "weight_scale",
    "weight_scale_2",
    "input_scale",
    "weight_packed",
    "weight_global_scale",
    "input_global_scale",
    "weight_scale_inv",
    "qweight",
    "qzeros",
    "scales",
    "g_idx",
];

/// The group of tensor `name`, or `None` if the architecture has no such
/// tensor.
pub fn group_of(architecture: Architecture, name: &str) -> Option<WeightGroup> {
    if let Some(param) = name.strip_prefix("lm_head.") {
        return LINEAR_PARAMS
            .contains(&param)
            .then_some(WeightGroup::LmHead);
    }
    let text = name
        .strip_prefix(architecture.text_prefix())?
        .strip_prefix('.')?;
    match text {
        "embed_tokens.weight" => return Some(WeightGroup::Embeddings),
        "norm.weight" => return Some(WeightGroup::Norms),
        _ => {}
    }
    let in_layer = strip_layer_prefix(text)?;
    if super::kv_scales::is_kv_scale(in_layer) {
        return Some(WeightGroup::Attention);
    }
    match architecture {
        Architecture::Qwen3Moe => qwen3_moe_group(in_layer),
        Architecture::GptOss => gpt_oss_group(in_layer),
        Architecture::Qwen35Moe | Architecture::Qwen35 | Architecture::Qwen3Next => {
            hybrid_group(in_layer)
        }
    }
}

/// The prefix (`model.visual.`, `mtp.`) of a tensor the checkpoint carries
/// but text serving never reads, if `name` is one.
pub fn unused_prefix(architecture: Architecture, name: &str) -> Option<&'static str> {
    architecture
        .unused_prefixes()
        .iter()
        .copied()
        .find(|prefix| name.starts_with(prefix))
}

/// Bytes per group, the bytes text serving never reads (by prefix), and
/// the tensors no group claims.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupBytes {
    pub bytes: BTreeMap<WeightGroup, u64>,
    pub unused: BTreeMap<&'static str, u64>,
    pub ungrouped: Vec<String>,
}

/// Sums tensor bytes by group (every group present, zero if empty).
pub fn bytes_by_group(architecture: Architecture, tensors: &[TensorInfo]) -> GroupBytes {
    let mut sums = GroupBytes {
        bytes: WeightGroup::ALL.iter().map(|&g| (g, 0)).collect(),
        unused: BTreeMap::new(),
        ungrouped: Vec::new(),
    };
    for tensor in tensors {
        match group_of(architecture, &tensor.name) {
            Some(group) => *sums.bytes.entry(group).or_default() += tensor.byte_len,
            None => match unused_prefix(architecture, &tensor.name) {
                Some(prefix) => *sums.unused.entry(prefix).or_default() += tensor.byte_len,
                None => sums.ungrouped.push(tensor.name.clone()),
            },
        }
    }
    sums
}

/// `layers.{i}.rest` → `rest`.
fn strip_layer_prefix(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("layers.")?;
    let (index, rest) = rest.split_once('.')?;
    is_index(index).then_some(rest)
}

fn is_index(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// `module.param` with `param` a linear parameter → `module`.
fn linear_module(rest: &str) -> Option<&str> {
    let (module, param) = rest.rsplit_once('.')?;
    LINEAR_PARAMS.contains(&param).then_some(module)
}

fn is_layer_norm(rest: &str) -> bool {
    matches!(
        rest,
        "input_layernorm.weight" | "post_attention_layernorm.weight"
    )
}

fn is_attention_projection(module: &str) -> bool {
    matches!(
        module,
        "self_attn.q_proj" | "self_attn.k_proj" | "self_attn.v_proj" | "self_attn.o_proj"
    )
}

fn qwen3_moe_group(rest: &str) -> Option<WeightGroup> {
    if is_layer_norm(rest) || matches!(rest, "self_attn.q_norm.weight" | "self_attn.k_norm.weight")
    {
        return Some(WeightGroup::Norms);
    }
    let module = linear_module(rest)?;
    if is_attention_projection(module) {
        return Some(WeightGroup::Attention);
    }
    if module == "mlp.gate" {
        return Some(WeightGroup::Router);
    }
    if matches!(module, "mlp.gate_proj" | "mlp.up_proj" | "mlp.down_proj") {
        return Some(WeightGroup::DenseMlp);
    }
    let (expert, projection) = module.strip_prefix("mlp.experts.")?.split_once('.')?;
    (is_index(expert) && matches!(projection, "gate_proj" | "up_proj" | "down_proj"))
        .then_some(WeightGroup::Experts)
}

/// qwen3_5_moe, qwen3_5, qwen3_next: Gated DeltaNet or gated attention,
/// then experts with a shared expert, or a dense MLP.
fn hybrid_group(rest: &str) -> Option<WeightGroup> {
    if is_layer_norm(rest) || matches!(rest, "self_attn.q_norm.weight" | "self_attn.k_norm.weight")
    {
        return Some(WeightGroup::Norms);
    }
    if let Some(gdn) = rest.strip_prefix("linear_attn.") {
        let linear = linear_module(gdn).is_some_and(|module| {
            matches!(
                module,
                "in_proj_qkv"
                    | "in_proj_z"
                    | "in_proj_b"
                    | "in_proj_a"
                    | "in_proj_qkvz"
                    | "in_proj_ba"
                    | "out_proj"
            )
        });
        let other = matches!(gdn, "conv1d.weight" | "A_log" | "dt_bias" | "norm.weight");
        return (linear || other).then_some(WeightGroup::LinearAttention);
    }
    if matches!(rest, "mlp.experts.gate_up_proj" | "mlp.experts.down_proj") {
        return Some(WeightGroup::Experts);
    }
    let module = linear_module(rest)?;
    if is_attention_projection(module) {
        return Some(WeightGroup::Attention);
    }
    match module {
        "mlp.gate" => return Some(WeightGroup::Router),
        "mlp.shared_expert_gate"
        | "mlp.shared_expert.gate_proj"
        | "mlp.shared_expert.up_proj"
        | "mlp.shared_expert.down_proj" => return Some(WeightGroup::SharedExpert),
        "mlp.gate_proj" | "mlp.up_proj" | "mlp.down_proj" => return Some(WeightGroup::DenseMlp),
        _ => {}
    }
    let (expert, projection) = module.strip_prefix("mlp.experts.")?.split_once('.')?;
    (is_index(expert) && matches!(projection, "gate_proj" | "up_proj" | "down_proj"))
        .then_some(WeightGroup::Experts)
}

fn gpt_oss_group(rest: &str) -> Option<WeightGroup> {
    if is_layer_norm(rest) {
        return Some(WeightGroup::Norms);
    }
    match rest {
        "self_attn.sinks" => return Some(WeightGroup::Attention),
        "mlp.router.weight" | "mlp.router.bias" => return Some(WeightGroup::Router),
        _ => {}
    }
    if let Some(module) = rest.strip_suffix(".weight").or(rest.strip_suffix(".bias"))
        && is_attention_projection(module)
    {
        return Some(WeightGroup::Attention);
    }
    // Stacked experts: MXFP4 `_blocks` / `_scales`, biases, or the plain
    // (dequantized) stacked weights.
    let stacked = rest.strip_prefix("mlp.experts.")?;
    let projection = ["gate_up_proj", "down_proj"]
        .into_iter()
        .find(|p| stacked.starts_with(p))?;
    matches!(
        &stacked[projection.len()..],
        "" | "_blocks" | "_scales" | "_bias"
    )
    .then_some(WeightGroup::Experts)
}
