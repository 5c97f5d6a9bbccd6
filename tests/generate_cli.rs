//! `sparkrt generate` as a user runs it: text in, the reference tokens out.

use crate::common;

use common::*;

fn reference_json(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("reference.json")).unwrap())
        .unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn generate(args: &[&str]) -> std::process::Output {
    let root = fixture("hosts/box24").display().to_string();
    let mut all = vec!["generate", "--host-root", &root];
    all.extend_from_slice(args);
    sparkrt(&all)
}

#[test]
fn prompt_text_gives_the_reference_ids_and_continuation() {
    for name in ["qwen3-moe-tiny", "qwen3-moe-tiny-nvfp4", "gpt-oss-tiny"] {
        let r = reference_json(name);
        let prompt = r["prompt"].as_str().unwrap();
        let out = generate(&[
            "--profile",
            name,
            "--prompt",
            prompt,
            "--max-tokens",
            "24",
            "--ignore-eos",
            "--json",
        ]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let v = json(&out);
        assert_eq!(ids(&v["prompt_ids"]), ids(&r["input_ids"]), "{name}");
        assert_eq!(ids(&v["token_ids"]), ids(&r["greedy_ids"]), "{name}");
        assert_eq!(v["finish_reason"], "length");
        if let Some(text) = r["greedy_text"].as_str() {
            assert_eq!(v["text"], text, "{name}");
        }
    }
}

#[test]
fn logits_out_writes_every_prompt_position() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("logits.safetensors");
    let r = reference_json("qwen3-moe-tiny");
    let prompt_ids: Vec<String> = ids(&r["input_ids"]).iter().map(u64::to_string).collect();
    let out = generate(&[
        "--prompt-ids",
        &prompt_ids.join(","),
        "--max-tokens",
        "1",
        "--logits-out",
        &file.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let written = std::fs::read(&file).unwrap();
    let written = safetensors::SafeTensors::deserialize(&written).unwrap();
    let logits = written.tensor("logits").unwrap();
    assert_eq!(logits.shape(), &[prompt_ids.len(), 512]);
    let reference = std::fs::read(fixture("qwen3-moe-tiny").join("reference.safetensors")).unwrap();
    let reference = safetensors::SafeTensors::deserialize(&reference).unwrap();
    let floats = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let (got, want) = (
        floats(logits.data()),
        floats(reference.tensor("logits").unwrap().data()),
    );
    let diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(diff < 2e-3, "logits differ by {diff}");
}

#[test]
fn chat_wraps_the_message_in_the_template() {
    let out = generate(&["--chat", "hi", "--max-tokens", "2", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    // <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n, encoded.
    let plain = generate(&[
        "--prompt",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "--max-tokens",
        "2",
        "--json",
    ]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert_eq!(v["prompt_ids"], json(&plain)["prompt_ids"]);
    assert_eq!(v["token_ids"], json(&plain)["token_ids"]);
}

/// `--chat-template FILE` replaces the checkpoint's ChatML: Qwen3's template
/// opens the assistant turn the same way, so `--chat hi` gives the same ids
/// as transformers' rendering of that message.
#[test]
fn chat_template_file_replaces_the_checkpoints() {
    let template = repo_path("tests/fixtures/templates/qwen3.jinja");
    let out = generate(&[
        "--chat",
        "hi",
        "--chat-template",
        &template,
        "--max-tokens",
        "1",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // transformers renders Qwen3's template for [user: hi] with the
    // generation prompt as exactly this.
    let plain = generate(&[
        "--prompt",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "--max-tokens",
        "1",
        "--json",
    ]);
    assert_eq!(json(&out)["prompt_ids"], json(&plain)["prompt_ids"]);
    let missing = generate(&["--chat", "hi", "--chat-template", "/nonexistent/t.jinja"]);
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
    assert!(
        stderr(&missing).contains("/nonexistent/t.jinja"),
        "{}",
        stderr(&missing)
    );
}

fn repo_path(relative: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(relative)
        .display()
        .to_string()
}

#[test]
fn bad_requests_are_exit_2_with_a_message() {
    for (args, needle) in [
        (vec!["--prompt-ids", "1,99999"], "outside the vocabulary"),
        (
            vec!["--model", "/nonexistent/model", "--prompt", "x"],
            "/nonexistent/model",
        ),
        (vec!["--threads", "0", "--prompt", "x"], "threads"),
        (vec!["--max-tokens", "1"], "prompt"),
        (vec!["--prompt", "x", "--temperature", "-1"], "temperature"),
    ] {
        let out = generate(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// `SPARKRT_ISA` forces a kernel tier: one this CPU lacks, or a name with
/// no kernels, is exit 2 naming the variable (never a silent fallback);
/// a tier it has runs.
#[test]
fn a_forced_kernel_tier_is_honoured_or_refused_by_name() {
    let with_isa = |isa: &str| {
        let root = fixture("hosts/box24").display().to_string();
        std::process::Command::new(env!("CARGO_BIN_EXE_sparkrt"))
            .args([
                "generate",
                "--host-root",
                &root,
                "--prompt",
                "Hi",
                "--max-tokens",
                "3",
            ])
            .env("SPARKRT_ISA", isa)
            .output()
            .expect("the sparkrt binary runs")
    };
    let out = with_isa("sse9");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("SPARKRT_ISA=\"sse9\""),
        "{}",
        stderr(&out)
    );
    let foreign = if cfg!(target_arch = "x86_64") {
        "neon"
    } else {
        "avx2"
    };
    let out = with_isa(foreign);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("SPARKRT_ISA={foreign}: this CPU lacks")),
        "{}",
        stderr(&out)
    );
    let out = with_isa("scalar");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
