//! The reader on the transformers fixtures, checked against the `safetensors`
//! crate as an independent reader, plus sharded copies and misaligned data.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::bf16;
use safetensors::SafeTensors;
use sparkrt::checkpoint::{
    Checkpoint, CheckpointError, CheckpointFiles, Dtype, ModelConfig, PageCachePolicy, WeightData,
    read_headers,
};
use sparkrt::formats::e4m3_to_f32;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

const FIXTURES: [&str; 3] = ["qwen3-moe-tiny", "qwen3-moe-tiny-nvfp4", "gpt-oss-tiny"];

#[test]
fn every_view_matches_the_safetensors_crate() {
    for name in FIXTURES {
        let dir = fixture(name);
        let file_bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let reference = SafeTensors::deserialize(&file_bytes).unwrap();
        let checkpoint = Checkpoint::open(&dir).unwrap();
        assert_eq!(checkpoint.tensor_names().count(), reference.len(), "{name}");
        for (tensor, expected) in reference.tensors() {
            let view = checkpoint.tensor(&tensor).unwrap();
            assert_eq!(
                view.dtype().name(),
                format!("{:?}", expected.dtype()),
                "{tensor}"
            );
            assert_eq!(view.shape(), expected.shape(), "{tensor}");
            assert_eq!(view.bytes(), expected.data(), "{tensor}");
        }
    }
}

#[test]
fn header_only_reader_agrees_with_the_mapped_reader() {
    for name in FIXTURES {
        let dir = fixture(name);
        let headers = read_headers(&dir).unwrap();
        let checkpoint = Checkpoint::open(&dir).unwrap();
        assert_eq!(&headers, checkpoint.headers(), "{name}");
        let file_len = std::fs::metadata(dir.join("model.safetensors"))
            .unwrap()
            .len();
        assert_eq!(headers.files.len(), 1);
        assert_eq!(headers.files[0].file_bytes, file_len);
        // The fixtures are densely packed: data = file − header.
        assert_eq!(
            headers.total_tensor_bytes(),
            file_len - headers.files[0].header_bytes,
            "{name}"
        );
    }
}

#[test]
fn tensor_names_are_sorted_and_unknown_names_are_an_error() {
    let checkpoint = Checkpoint::open(&fixture("qwen3-moe-tiny")).unwrap();
    let names: Vec<&str> = checkpoint.tensor_names().collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert!(checkpoint.contains("model.norm.weight"));
    let err = checkpoint.tensor("model.nope.weight").unwrap_err();
    assert!(matches!(err, CheckpointError::NoSuchTensor(ref n) if n == "model.nope.weight"));
}

#[test]
fn typed_views_decode_like_the_reference_bytes() {
    let dir = fixture("qwen3-moe-tiny");
    let file_bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let reference = SafeTensors::deserialize(&file_bytes).unwrap();
    let expected = reference.tensor("model.norm.weight").unwrap();
    let checkpoint = Checkpoint::open(&dir).unwrap();
    let view = checkpoint.tensor("model.norm.weight").unwrap();
    let values = view.bf16().unwrap();
    assert_eq!(values.len(), 128);
    for (i, chunk) in expected.data().chunks_exact(2).enumerate() {
        let want = bf16::from_bits(u16::from(chunk[0]) | (u16::from(chunk[1]) << 8));
        assert_eq!(values.get(i), Some(want));
    }
    assert_eq!(values.get(128), None);
    assert_eq!(values.iter().len(), 128);
    // Wrong dtype is an error naming the tensor and the file.
    let err = view.f32().unwrap_err().to_string();
    assert!(
        err.contains("model.norm.weight") && err.contains("model.safetensors"),
        "{err}"
    );
    assert!(err.contains("BF16") && err.contains("F32"), "{err}");

    let reference = fixture("qwen3-moe-tiny").join("reference.safetensors");
    let ref_dir = tempfile::tempdir().unwrap();
    std::fs::copy(reference, ref_dir.path().join("model.safetensors")).unwrap();
    let refs = Checkpoint::open(ref_dir.path()).unwrap();
    let ids = refs.tensor("input_ids").unwrap().i64().unwrap();
    assert!(!ids.is_empty());
    assert!(
        ids.iter().all(|id| (0..512).contains(&id)),
        "token ids within the vocab"
    );
    let logits = refs.tensor("logits").unwrap();
    assert_eq!(logits.shape(), [ids.len(), 512]);
    assert!(logits.f32().unwrap().iter().all(f32::is_finite));
}

/// Writes a safetensors file from (name, dtype, shape, bytes).
fn write_safetensors(path: &Path, tensors: &[(String, safetensors::Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap();
            (name.clone(), view)
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// Copies a fixture into `dest` as `shards` files plus an index.
fn write_sharded_copy(source: &Path, dest: &Path, shards: usize) {
    let bytes = std::fs::read(source.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort();
    let mut weight_map = serde_json::Map::new();
    for shard in 0..shards {
        let file = format!("model-{:05}-of-{:05}.safetensors", shard + 1, shards);
        let mut tensors = Vec::new();
        for (i, name) in names.iter().enumerate() {
            if i % shards == shard {
                let t = st.tensor(name).unwrap();
                tensors.push((
                    name.to_string(),
                    t.dtype(),
                    t.shape().to_vec(),
                    t.data().to_vec(),
                ));
                weight_map.insert(name.to_string(), file.clone().into());
            }
        }
        write_safetensors(&dest.join(&file), &tensors);
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dest.join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::copy(source.join("config.json"), dest.join("config.json")).unwrap();
}

#[test]
fn sharded_and_single_file_give_identical_views() {
    for name in ["qwen3-moe-tiny", "qwen3-moe-tiny-nvfp4"] {
        let single_dir = fixture(name);
        let sharded_dir = tempfile::tempdir().unwrap();
        write_sharded_copy(&single_dir, sharded_dir.path(), 3);
        let single = Checkpoint::open(&single_dir).unwrap();
        let sharded = Checkpoint::open(sharded_dir.path()).unwrap();
        assert_eq!(sharded.files().len(), 3);
        assert!(single.tensor_names().eq(sharded.tensor_names()));
        for tensor in single.tensor_names() {
            let (a, b) = (
                single.tensor(tensor).unwrap(),
                sharded.tensor(tensor).unwrap(),
            );
            assert_eq!(a.dtype(), b.dtype(), "{tensor}");
            assert_eq!(a.shape(), b.shape(), "{tensor}");
            assert_eq!(a.bytes(), b.bytes(), "{tensor}");
        }
        // Every file holds a third of the tensors, none twice.
        let headers = read_headers(sharded_dir.path()).unwrap();
        for file in 0..3 {
            let held = headers.tensors.iter().filter(|t| t.file == file).count();
            assert!(held.abs_diff(headers.tensors.len() / 3) <= 1);
        }
        assert_eq!(
            headers.total_tensor_bytes(),
            single.headers().total_tensor_bytes()
        );
        // Linear weights decode identically too.
        let config = ModelConfig::load(&single_dir).unwrap();
        for module in [
            "model.layers.1.mlp.experts.7.down_proj",
            "model.layers.2.self_attn.o_proj",
        ] {
            let (a, b) = (
                single.linear(&config, module).unwrap(),
                sharded.linear(&config, module).unwrap(),
            );
            assert_eq!((a.rows, a.cols), (b.rows, b.cols));
            let (mut ra, mut rb) = (vec![0.0; a.cols], vec![0.0; b.cols]);
            for row in 0..a.rows {
                a.decode_row(row, &mut ra).unwrap();
                b.decode_row(row, &mut rb).unwrap();
                assert_eq!(ra, rb, "{module} row {row}");
            }
        }
    }
}

/// Start-up reads each header once: what is mapped is the files opened for
/// the plan, with the headers the plan read. A shard replaced on disk in
/// between (a new file renamed over it, with other tensors) is not looked
/// at again: mapping by path, or reading a header twice, would see it.
#[test]
fn mapping_uses_the_files_and_headers_read_for_the_plan() {
    let single_dir = fixture("qwen3-moe-tiny");
    let sharded = tempfile::tempdir().unwrap();
    write_sharded_copy(&single_dir, sharded.path(), 3);
    let files = CheckpointFiles::open(sharded.path()).unwrap();
    let planned = files.headers().clone();

    let shard = sharded.path().join("model-00002-of-00003.safetensors");
    let other = sharded.path().join("other.safetensors");
    write_safetensors(
        &other,
        &[(
            "not.in.the.index".to_string(),
            safetensors::Dtype::F32,
            vec![4],
            vec![7; 16],
        )],
    );
    std::fs::rename(&other, &shard).unwrap();
    // Read anew, the folder is now refused: the index names tensors the
    // second shard no longer holds.
    assert!(matches!(
        read_headers(sharded.path()),
        Err(CheckpointError::NotInShard { .. } | CheckpointError::NotInIndex { .. })
    ));

    let checkpoint = files.map().unwrap();
    assert_eq!(checkpoint.headers(), &planned);
    let single = Checkpoint::open(&single_dir).unwrap();
    for name in single.tensor_names() {
        assert_eq!(
            checkpoint.tensor(name).unwrap().bytes(),
            single.tensor(name).unwrap().bytes(),
            "{name}"
        );
    }
}

/// A file whose size changed after its header was validated is refused
/// when mapped, naming both sizes.
#[test]
fn a_file_grown_after_its_header_was_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::copy(fixture("qwen3-moe-tiny").join("model.safetensors"), &path).unwrap();
    let validated = std::fs::metadata(&path).unwrap().len();
    let files = CheckpointFiles::open(dir.path()).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(validated + 4096)
        .unwrap();
    match files.map().unwrap_err() {
        CheckpointError::FileChanged {
            path: named,
            validated: v,
            mapped,
        } => {
            assert_eq!(named, path);
            assert_eq!((v, mapped), (validated, validated + 4096));
        }
        other => panic!("expected a changed file, got {other}"),
    }
}

/// The ranges a device reads the weights from: one per file when its
/// tensors are back to back, every tensor byte in exactly one range.
#[test]
fn tensor_regions_join_adjacent_tensors_per_file() {
    let single_dir = fixture("qwen3-moe-tiny");
    let sharded_dir = tempfile::tempdir().unwrap();
    write_sharded_copy(&single_dir, sharded_dir.path(), 3);
    for (dir, files) in [(single_dir.as_path(), 1), (sharded_dir.path(), 3)] {
        let checkpoint = Checkpoint::open(dir).unwrap();
        let regions = checkpoint.tensor_regions().unwrap();
        assert_eq!(regions.len(), files, "{}", dir.display());
        let total: usize = regions.iter().map(|r| r.len()).sum();
        assert_eq!(total as u64, checkpoint.headers().total_tensor_bytes());
        for name in checkpoint.tensor_names() {
            let bytes = checkpoint.tensor(name).unwrap().bytes();
            if bytes.is_empty() {
                continue;
            }
            let inside = |r: &[u8]| {
                let (start, end) = (r.as_ptr() as usize, r.as_ptr() as usize + r.len());
                bytes.as_ptr() as usize >= start && bytes.as_ptr() as usize + bytes.len() <= end
            };
            assert_eq!(regions.iter().filter(|r| inside(r)).count(), 1, "{name}");
        }
    }
}

#[test]
fn misaligned_tensors_are_read_without_reinterpreting_pointers() {
    // Data offsets 1, 3, 7, … put every multi-byte tensor at an odd address.
    let bf16_values = [1.5f32, -2.0, 0.0078125];
    let f32_values = [3.25f32, -1.0e-3];
    let f16_values = [0.5f32, -65504.0];
    let i64_values = [-7i64, 1 << 40];
    let e4m3_bytes = [0x38u8, 0xB8, 0x7E];
    let mut data = vec![0xAAu8]; // one pad byte, then the tensors back to back
    let mut entries = Vec::new();
    let mut push = |name: &str, dtype: &str, shape: usize, bytes: Vec<u8>, data: &mut Vec<u8>| {
        let begin = data.len();
        data.extend_from_slice(&bytes);
        entries.push(format!(
            r#""{name}":{{"dtype":"{dtype}","shape":[{shape}],"data_offsets":[{begin},{}]}}"#,
            data.len()
        ));
    };
    let bytes_of = |values: &[f32]| -> Vec<u8> {
        values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect()
    };
    push("b", "BF16", 3, bytes_of(&bf16_values), &mut data);
    push(
        "f",
        "F32",
        2,
        f32_values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        &mut data,
    );
    push(
        "h",
        "F16",
        2,
        f16_values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        &mut data,
    );
    push(
        "i",
        "I64",
        2,
        i64_values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        &mut data,
    );
    push("e", "F8_E4M3", 3, e4m3_bytes.to_vec(), &mut data);
    let mut json = format!("{{{}}}", entries.join(","));
    // Pad the header so the data starts on a multiple of 8 (then offset 1
    // is odd), as writers do.
    while (8 + json.len()) % 8 != 0 {
        json.push(' ');
    }
    let dir = tempfile::tempdir().unwrap();
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(json.as_bytes());
    file.extend_from_slice(&data);
    std::fs::write(dir.path().join("model.safetensors"), file).unwrap();

    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    for name in ["b", "f", "h", "i"] {
        let address = checkpoint.tensor(name).unwrap().bytes().as_ptr() as usize;
        assert_eq!(address % 2, 1, "tensor {name} should sit at an odd address");
    }
    let b: Vec<f32> = checkpoint
        .tensor("b")
        .unwrap()
        .bf16()
        .unwrap()
        .iter()
        .map(bf16::to_f32)
        .collect();
    assert_eq!(b, bf16_values);
    assert_eq!(
        checkpoint.tensor("f").unwrap().f32().unwrap().to_vec(),
        f32_values
    );
    let h: Vec<f32> = checkpoint
        .tensor("h")
        .unwrap()
        .f16()
        .unwrap()
        .iter()
        .map(half::f16::to_f32)
        .collect();
    assert_eq!(h, f16_values);
    assert_eq!(
        checkpoint.tensor("i").unwrap().i64().unwrap().to_vec(),
        i64_values
    );
    let e: Vec<f32> = checkpoint
        .tensor("e")
        .unwrap()
        .f8_e4m3()
        .unwrap()
        .iter()
        .map(|x| x.to_f32())
        .collect();
    // 0x38 = 1.0, 0xB8 = −1.0, 0x7E = 448 (largest finite e4m3fn).
    assert_eq!(e, [1.0, -1.0, 448.0]);
}

#[test]
fn linear_picks_the_stored_format_per_module() {
    let dir = fixture("qwen3-moe-tiny-nvfp4");
    let config = ModelConfig::load(&dir).unwrap();
    let checkpoint = Checkpoint::open(&dir).unwrap();

    let expert = checkpoint
        .linear(&config, "model.layers.0.mlp.experts.3.gate_proj")
        .unwrap();
    assert_eq!((expert.rows, expert.cols), (64, 128));
    let WeightData::Nvfp4 {
        packed,
        scales,
        global,
    } = expert.data
    else {
        panic!("experts are NVFP4");
    };
    assert_eq!(packed.len(), 64 * 64);
    assert_eq!(scales.len(), 64 * 8);
    let stored = checkpoint
        .tensor("model.layers.0.mlp.experts.3.gate_proj.weight_scale_2")
        .unwrap();
    assert_eq!(global.to_le_bytes(), stored.bytes());

    // Excluded modules (`model.layers.*.self_attn*`, `model.layers.*.mlp.gate`,
    // `lm_head`) stay BF16.
    for (module, rows, cols) in [
        ("model.layers.0.self_attn.q_proj", 256, 128),
        ("model.layers.3.mlp.gate", 16, 128),
        ("lm_head", 512, 128),
    ] {
        let w = checkpoint.linear(&config, module).unwrap();
        assert!(matches!(w.data, WeightData::Bf16(_)), "{module}");
        assert_eq!((w.rows, w.cols), (rows, cols), "{module}");
    }

    // The BF16 checkpoint's experts are BF16, with the values of the file.
    let bf16_dir = fixture("qwen3-moe-tiny");
    let bf16_config = ModelConfig::load(&bf16_dir).unwrap();
    let bf16_checkpoint = Checkpoint::open(&bf16_dir).unwrap();
    let w = bf16_checkpoint
        .linear(&bf16_config, "model.layers.2.mlp.experts.5.down_proj")
        .unwrap();
    assert_eq!((w.rows, w.cols), (128, 64));
    let values = bf16_checkpoint
        .tensor("model.layers.2.mlp.experts.5.down_proj.weight")
        .unwrap()
        .bf16()
        .unwrap();
    let mut row = vec![0.0; 64];
    w.decode_row(5, &mut row).unwrap();
    for (c, v) in row.iter().enumerate() {
        assert_eq!(*v, values.get(5 * 64 + c).unwrap().to_f32());
    }
    // Asking the NVFP4 reader for a module the config does not quantize but
    // whose weight is packed is a dtype error, not garbage.
    let err = checkpoint
        .linear(&bf16_config, "model.layers.0.mlp.experts.0.up_proj")
        .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::WrongDtype {
                found: Dtype::U8,
                ..
            }
        ),
        "{err}"
    );
}

/// ModelOpt's NVFP4 recipe: global = amax(W) / (6 · 448), block scale =
/// amax(block) / (6 · global) rounded to E4M3. So every block's largest code
/// is ±6, the largest block scale of each tensor is 448, and the decoded
/// block maximum is 6 × scale × global. (The NVFP4 fixture is not a
/// quantization of the BF16 fixture's weights — they are different random
/// models — so these structural facts are what can be checked here.)
#[test]
fn nvfp4_fixture_dequantizes_like_a_modelopt_export() {
    let dir = fixture("qwen3-moe-tiny-nvfp4");
    let config = ModelConfig::load(&dir).unwrap();
    let checkpoint = Checkpoint::open(&dir).unwrap();
    let mut checked = 0;
    for layer in 0..config.geometry.num_layers {
        for expert in 0..config.geometry.num_experts {
            for projection in ["gate_proj", "up_proj", "down_proj"] {
                let module = format!("model.layers.{layer}.mlp.experts.{expert}.{projection}");
                let w = checkpoint.linear(&config, &module).unwrap();
                let WeightData::Nvfp4 { scales, global, .. } = w.data else {
                    panic!("{module} is NVFP4");
                };
                let largest_scale = scales.iter().map(|&s| e4m3_to_f32(s)).fold(0.0, f32::max);
                assert_eq!(largest_scale, 448.0, "{module}");
                let groups = w.cols / 16;
                let mut row = vec![0.0f32; w.cols];
                let mut tensor_max = 0.0f32;
                for r in 0..w.rows {
                    w.decode_row(r, &mut row).unwrap();
                    for (g, block) in row.chunks_exact(16).enumerate() {
                        let block_max = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                        let scale = e4m3_to_f32(scales[r * groups + g]);
                        let expected = 6.0 * scale * global;
                        assert!(
                            (block_max - expected).abs() <= expected * 1e-6,
                            "{module} row {r} block {g}: {block_max} vs {expected}"
                        );
                        tensor_max = tensor_max.max(block_max);
                    }
                }
                let amax = 6.0 * 448.0 * global;
                assert!((tensor_max - amax).abs() <= amax * 1e-6, "{module}");
                // Weights of a plausible model: bounded, not all zero.
                assert!(
                    tensor_max > 0.01 && tensor_max < 10.0,
                    "{module}: {tensor_max}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 4 * 16 * 3);
}

#[test]
fn mxfp4_experts_are_zero_copy_slices_of_the_stacked_tensors() {
    let dir = fixture("gpt-oss-tiny");
    let checkpoint = Checkpoint::open(&dir).unwrap();
    let prefix = "model.layers.1.mlp.experts.gate_up_proj";
    let all_blocks = checkpoint.tensor(&format!("{prefix}_blocks")).unwrap();
    let all_scales = checkpoint.tensor(&format!("{prefix}_scales")).unwrap();
    assert_eq!(all_blocks.shape(), [8, 128, 2, 16]);
    for expert in 0..8 {
        let w = checkpoint.mxfp4_expert(prefix, expert).unwrap();
        assert_eq!((w.rows, w.cols), (128, 64));
        let WeightData::Mxfp4 { blocks, scales } = w.data else {
            panic!("gpt-oss experts are MXFP4");
        };
        let per_expert = 128 * 2 * 16;
        // Same memory, not a copy: the slice points into the stacked tensor.
        assert_eq!(
            blocks.as_ptr(),
            all_blocks.bytes()[expert * per_expert..].as_ptr()
        );
        assert_eq!(blocks.len(), per_expert);
        assert_eq!(
            scales,
            &all_scales.bytes()[expert * 256..(expert + 1) * 256]
        );
        // Decoded values are codes times the block's power of two.
        let mut row = vec![0.0f32; 64];
        w.decode_row(127, &mut row).unwrap();
        for (k, value) in row.iter().enumerate() {
            let scale = 2f32.powi(i32::from(scales[127 * 2 + k / 32]) - 127);
            let byte = blocks[127 * 32 + k / 2];
            let code = if k % 2 == 0 { byte & 0xF } else { byte >> 4 };
            assert_eq!(*value, sparkrt::formats::e2m1_to_f32(code) * scale);
        }
    }
    let down = checkpoint
        .mxfp4_expert("model.layers.3.mlp.experts.down_proj", 7)
        .unwrap();
    assert_eq!((down.rows, down.cols), (64, 64));
    let err = checkpoint.mxfp4_expert(prefix, 8).unwrap_err();
    assert!(matches!(
        err,
        CheckpointError::ExpertOutOfRange {
            expert: 8,
            num_experts: 8,
            ..
        }
    ));
    assert!(
        checkpoint
            .mxfp4_expert("model.layers.1.mlp.router", 0)
            .is_err()
    );
}

#[test]
fn released_ranges_read_back_the_same_and_foreign_slices_are_left_alone() {
    let checkpoint = Checkpoint::open(&fixture("qwen3-moe-tiny")).unwrap();
    let regions = checkpoint.tensor_regions().unwrap();
    let before: Vec<Vec<u8>> = regions.iter().map(|r| r.to_vec()).collect();
    // Chunks as a device copy takes them, some not page-aligned.
    for region in &regions {
        for chunk in region.chunks(10_000) {
            assert!(checkpoint.release_range(chunk).unwrap());
        }
    }
    for (region, bytes) in regions.iter().zip(&before) {
        assert_eq!(*region, bytes.as_slice());
    }
    let elsewhere = vec![0u8; 8192];
    assert!(!checkpoint.release_range(&elsewhere).unwrap());
    // Policy unchanged: only `release` records one.
    assert_eq!(checkpoint.page_cache_policy(), PageCachePolicy::Keep);
}

#[test]
fn page_cache_policy_is_recorded_and_views_survive_release() {
    let checkpoint = Checkpoint::open(&fixture("qwen3-moe-tiny")).unwrap();
    assert_eq!(checkpoint.page_cache_policy(), PageCachePolicy::Keep);
    let before: HashMap<String, Vec<u8>> = checkpoint
        .tensor_names()
        .map(|n| {
            (
                n.to_string(),
                checkpoint.tensor(n).unwrap().bytes().to_vec(),
            )
        })
        .collect();
    checkpoint.prefetch().unwrap();
    assert_eq!(checkpoint.page_cache_policy(), PageCachePolicy::WillNeed);
    let view = checkpoint.tensor("lm_head.weight").unwrap();
    checkpoint.release().unwrap();
    assert_eq!(checkpoint.page_cache_policy(), PageCachePolicy::DontNeed);
    // Dropped pages come back from the file with the same contents.
    assert_eq!(view.bytes(), before["lm_head.weight"].as_slice());
    for name in checkpoint.tensor_names() {
        assert_eq!(
            checkpoint.tensor(name).unwrap().bytes(),
            before[name].as_slice()
        );
    }
    assert_eq!(
        serde_json::to_string(&PageCachePolicy::DontNeed).unwrap(),
        "\"dontneed\""
    );
    assert_eq!(
        serde_json::to_string(&PageCachePolicy::WillNeed).unwrap(),
        "\"willneed\""
    );
}

#[test]
fn load_checks_the_checkpoint_against_its_config() {
    for name in FIXTURES {
        let (config, checkpoint) = sparkrt::checkpoint::load(&fixture(name)).unwrap();
        assert_eq!(
            checkpoint.tensor_names().count(),
            checkpoint.headers().tensors.len()
        );
        assert_eq!(config, ModelConfig::load(&fixture(name)).unwrap());
    }
    // BF16 weights behind an NVFP4 config: refused, with the problems listed.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("qwen3-moe-tiny").join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    std::fs::copy(
        fixture("qwen3-moe-tiny-nvfp4").join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let err = sparkrt::checkpoint::load(dir.path()).unwrap_err();
    assert!(matches!(err, CheckpointError::Tensors { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("model.layers.0.mlp.experts.0.down_proj.weight_scale")
    );
}
