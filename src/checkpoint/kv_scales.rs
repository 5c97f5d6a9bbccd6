//! The FP8 KV cache's per-layer scales: a cached key is `e4m3 × k_scale`,
//! a value `e4m3 × v_scale` (`formats::f32_to_e4m3` quantizes `x / scale`).
//!
//! ModelOpt writes them as F32 scalars `{layer}.self_attn.k_proj.k_scale`
//! and `{layer}.self_attn.v_proj.v_scale`; newer ModelOpt exports and
//! compressed-tensors (`kv_cache_scheme`) write
//! `{layer}.self_attn.k_scale` / `{layer}.self_attn.v_scale` (BF16 or F32).
//! vLLM reads both spellings. Only attention layers have them (a hybrid
//! model's Gated DeltaNet layers keep no KV). Without any, every scale is
//! 1.0 and the load says so once.

use thiserror::Error;

use super::config::ModelConfig;
use super::dtype::Dtype;
use super::error::CheckpointError;
use super::mapped::Checkpoint;
use super::view::TensorView;
use crate::formats::E4M3_MAX;
use crate::geometry::LayerAttention;

/// A layer's K and V scale names after `{text}.layers.{i}.`, one pair per
/// spelling: ModelOpt's, then the one on the attention module.
pub const KV_SCALE_NAMES: [[&str; 2]; 2] = [
    ["self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale"],
    ["self_attn.k_scale", "self_attn.v_scale"],
];

/// Whether `in_layer` (a tensor name after `{text}.layers.{i}.`) is a KV
/// cache scale.
pub fn is_kv_scale(in_layer: &str) -> bool {
    KV_SCALE_NAMES
        .iter()
        .flatten()
        .any(|&name| name == in_layer)
}

/// One KV layer's scales.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvScale {
    pub k: f32,
    pub v: f32,
}

impl KvScale {
    pub const UNIT: KvScale = KvScale { k: 1.0, v: 1.0 };
}

/// The scales of every KV layer, in the model's order of its KV layers.
#[derive(Clone, Debug, PartialEq)]
pub struct KvScales {
    pub layers: Vec<KvScale>,
}

impl KvScales {
    /// Scale 1.0 for each of `layers` KV layers.
    pub fn unit(layers: usize) -> KvScales {
        KvScales {
            layers: vec![KvScale::UNIT; layers],
        }
    }
}

#[derive(Debug, Error)]
pub enum KvScaleError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(
        "the checkpoint has KV cache scale `{present}` but not `{missing}`: an FP8 KV cache \
         takes a k_scale and a v_scale for every attention layer, or none"
    )]
    Partial { present: String, missing: String },
    #[error("KV cache scales `{first}` and `{second}` both name one layer's scale")]
    Twice { first: String, second: String },
    #[error(
        "KV cache scale `{tensor}` is {value}: a scale must be finite and keep every E4M3 \
         value times it a normal f32 (2^-117 to 7.5e35)"
    )]
    Value { tensor: String, value: f32 },
}

/// The checkpoint's scales of every KV layer; `None` when it has none at
/// all. Some layers with scales and others without, both spellings for one
/// layer, or a scale out of range is an error naming the tensor.
pub fn read(
    checkpoint: &Checkpoint,
    config: &ModelConfig,
) -> Result<Option<KvScales>, KvScaleError> {
    let text = config.geometry.architecture.text_prefix();
    let mut layers = Vec::new();
    // The first scale found, to name when a later layer lacks one.
    let mut first_present: Option<String> = None;
    let mut first_missing: Option<String> = None;
    for layer in 0..config.geometry.num_layers {
        if config.layer_attention(layer) == LayerAttention::LinearAttention {
            continue;
        }
        let prefix = format!("{text}.layers.{layer}");
        let mut scale = [None, None];
        for (slot, found) in scale.iter_mut().enumerate() {
            let mut seen: Option<String> = None;
            for names in KV_SCALE_NAMES {
                let name = format!("{prefix}.{}", names[slot]);
                if !checkpoint.contains(&name) {
                    continue;
                }
                if let Some(first) = seen.take() {
                    return Err(KvScaleError::Twice {
                        first,
                        second: name,
                    });
                }
                *found = Some(scalar(&checkpoint.tensor(&name)?)?);
                first_present.get_or_insert_with(|| name.clone());
                seen = Some(name);
            }
            if found.is_none() {
                first_missing
                    .get_or_insert_with(|| format!("{prefix}.{}", KV_SCALE_NAMES[0][slot]));
            }
        }
        if let [Some(k), Some(v)] = scale {
            layers.push(KvScale { k, v });
        }
    }
    match (first_present, first_missing) {
        (None, _) => Ok(None),
        (Some(_), None) => Ok(Some(KvScales { layers })),
        (Some(present), Some(missing)) => Err(KvScaleError::Partial { present, missing }),
    }
}

/// A one-element F32 or BF16 scale, checked.
fn scalar(view: &TensorView<'_>) -> Result<f32, KvScaleError> {
    let value = match view.dtype() {
        Dtype::Bf16 => {
            let elements = view.bf16()?;
            match (elements.len(), elements.get(0)) {
                (1, Some(value)) => value.to_f32(),
                _ => return Err(view.wrong_shape("a single element").into()),
            }
        }
        _ => view.scalar_f32()?,
    };
    // Every E4M3 value times the scale (2^-9 up to 448) is a normal f32, so
    // quantizing a cached value again gives back its byte.
    let in_range = value > 0.0 && (value * E4M3_MAX).is_finite() && (value / 512.0).is_normal();
    if !in_range {
        return Err(KvScaleError::Value {
            tensor: view.name().to_string(),
            value,
        });
    }
    Ok(value)
}
