//! Random checkpoints with a real model's geometry (`--load-format dummy`,
//! `sparkrt make-checkpoint`): the tensor list is the one the checkpoint
//! checker expects for the config, so dummy and real weights load through
//! the same code path. A config with `mtp_num_hidden_layers` also gets a
//! random MTP head (`check::expected_mtp_tensors`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::json;

use crate::checkpoint::check::{Expected, ExpectedShape, expected_mtp_tensors, expected_tensors};
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::error::CheckpointError;
use crate::util::rng::SplitMix64;

/// Files copied next to the weights when present (config, tokenizer).
const COMPANION_FILES: [&str; 5] = [
    "config.json",
    "hf_quant_config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
];

/// Writes a random checkpoint for `config` (read from `like`) into `out`, in
/// `shards` safetensors files with an index when `shards > 1`.
pub fn write_checkpoint(
    like: &Path,
    config: &ModelConfig,
    out: &Path,
    shards: usize,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), CheckpointError> {
    let io = |path: &Path, source: std::io::Error| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    for name in COMPANION_FILES {
        let from = like.join(name);
        if from.is_file() {
            std::fs::copy(&from, out.join(name)).map_err(|e| io(&from, e))?;
        }
    }
    // The MTP head after the decoder's tensors (when the config names one),
    // so the decoder's random values do not depend on it. Optional tensors
    // are left out but for ModelOpt's `input_scale` scalars, which its
    // exporter writes (the plan counts them).
    let tensors: Vec<(String, Dtype, Vec<usize>)> = expected_tensors(config)
        .into_iter()
        .chain(expected_mtp_tensors(config))
        .filter(|(name, e)| e.required || name.ends_with(".input_scale"))
        .map(|(name, e)| {
            let shape = shape_of(&e);
            (name, e.dtype, shape)
        })
        .collect();
    let bytes_of = |(_, dtype, shape): &(String, Dtype, Vec<usize>)| {
        shape.iter().product::<usize>() as u64 * dtype.size() as u64
    };
    let total: u64 = tensors.iter().map(bytes_of).sum();
    let shards = shards.max(1);
    let per_shard = total.div_ceil(shards as u64).max(1);

    // Split in order, closing a shard once it reaches its share.
    let mut groups: Vec<Vec<&(String, Dtype, Vec<usize>)>> = vec![Vec::new()];
    let mut filled = 0u64;
    for t in &tensors {
        if filled >= per_shard && groups.len() < shards {
            groups.push(Vec::new());
            filled = 0;
        }
        filled += bytes_of(t);
        if let Some(group) = groups.last_mut() {
            group.push(t);
        }
    }

    let mut rng = SplitMix64::new(seed);
    let mut written = 0u64;
    let mut weight_map = BTreeMap::new();
    let count = groups.len();
    for (index, group) in groups.iter().enumerate() {
        let file_name = if count == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", index + 1)
        };
        let path = out.join(&file_name);
        let mut header = serde_json::Map::new();
        let mut offset = 0u64;
        for t in group {
            let len = bytes_of(t);
            header.insert(
                t.0.clone(),
                json!({"dtype": t.1.name(), "shape": t.2, "data_offsets": [offset, offset + len]}),
            );
            weight_map.insert(t.0.clone(), file_name.clone());
            offset += len;
        }
        let mut header_text = serde_json::Value::Object(header).to_string();
        // Pad so the data starts 8-byte aligned, as the reference writer does.
        while !(8 + header_text.len()).is_multiple_of(8) {
            header_text.push(' ');
        }
        let file = File::create(&path).map_err(|e| io(&path, e))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        w.write_all(&(header_text.len() as u64).to_le_bytes())
            .and_then(|_| w.write_all(header_text.as_bytes()))
            .map_err(|e| io(&path, e))?;
        let mut chunk = Vec::with_capacity(1 << 20);
        for t in group {
            let mut left = bytes_of(t);
            while left > 0 {
                let n = left.min(1 << 20) as usize;
                chunk.clear();
                fill(&mut chunk, n, &t.0, t.1, &mut rng);
                w.write_all(&chunk).map_err(|e| io(&path, e))?;
                left -= n as u64;
                written += n as u64;
                progress(written, total);
            }
        }
        w.flush().map_err(|e| io(&path, e))?;
    }
    if count > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = out.join("model.safetensors.index.json");
        std::fs::write(&path, index.to_string()).map_err(|e| io(&path, e))?;
    }
    Ok(())
}

/// Writes one safetensors file of `tensors` (name, dtype, shape, raw
/// little-endian bytes), the header laid out as [`write_checkpoint`] does.
pub(crate) fn write_tensor_file(
    path: &Path,
    tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)],
) -> Result<(), CheckpointError> {
    let io = |source: std::io::Error| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape, bytes) in tensors {
        let len = bytes.len() as u64;
        header.insert(
            name.clone(),
            json!({"dtype": dtype.name(), "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut header_text = serde_json::Value::Object(header).to_string();
    while !(8 + header_text.len()).is_multiple_of(8) {
        header_text.push(' ');
    }
    let file = File::create(path).map_err(io)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(&(header_text.len() as u64).to_le_bytes())
        .and_then(|_| w.write_all(header_text.as_bytes()))
        .map_err(io)?;
    for (_, _, _, bytes) in tensors {
        w.write_all(bytes).map_err(io)?;
    }
    w.flush().map_err(io)
}

/// The shape of an expected tensor (a scalar has none).
pub(crate) fn shape_of(expected: &Expected) -> Vec<usize> {
    match &expected.shape {
        ExpectedShape::Exact(shape) => shape.clone(),
        ExpectedShape::Scalar => Vec::new(),
    }
}

/// Appends `n` random bytes of tensor `name` in `dtype`, with magnitudes
/// that keep activations in a sane range through many layers.
fn fill(out: &mut Vec<u8>, n: usize, name: &str, dtype: Dtype, rng: &mut SplitMix64) {
    let is_norm = name.ends_with("norm.weight");
    match dtype {
        Dtype::Bf16 => {
            for _ in 0..n / 2 {
                let u = rng.next_f64() as f32 * 2.0 - 1.0;
                let v = if is_norm { 1.0 + 0.1 * u } else { 0.03 * u };
                out.extend_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        Dtype::F32 => {
            // NVFP4 global scales (weight_scale_2, input_scale), FP8
            // scales (weight_scale, weight_scale_inv).
            for _ in 0..n / 4 {
                out.extend_from_slice(&0.005f32.to_le_bytes());
            }
        }
        Dtype::F8E4M3 if name.ends_with(".weight") => {
            // FP8 weight values of magnitude 0.75..1.9 (times the f32
            // scale below), either sign.
            out.extend((0..n).map(|_| {
                let r = rng.next_u64();
                (0x34 + (r % 12) as u8) | ((r >> 8) as u8 & 0x80)
            }));
        }
        Dtype::F8E4M3 => {
            // Block scales near 1.0 (0x38) in E4M3.
            out.extend((0..n).map(|_| 0x34 + (rng.next_u64() % 8) as u8));
        }
        Dtype::F16 => {
            // GPTQ INT4 scales: (code − 8) × 0.004 spans ±0.03, as the bf16 weights do.
            for _ in 0..n / 2 {
                let v = 0.003 + 0.002 * rng.next_f64() as f32;
                out.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        Dtype::I32 if name.ends_with(".qzeros") => {
            // Every stored zero 7: the zero point 8 of a symmetric GPTQ v1
            // checkpoint (AutoRound's auto_gptq packing).
            out.extend(std::iter::repeat_n(0x77u8, n));
        }
        Dtype::U8 if name.ends_with("_scales") => {
            // MXFP4 exponents near 2^-6.
            out.extend((0..n).map(|_| 120 + (rng.next_u64() % 3) as u8));
        }
        _ => out.extend((0..n).map(|_| rng.next_u64() as u8)),
    }
}
