//! `vllm serve` command lines: generation_config.json's sampling defaults
//! (`--generation-config auto|vllm|DIR`), the positional model, and the
//! vLLM flags `serve` accepts or refuses by name.

use std::path::Path;

use serde_json::{Value, json};

use crate::common::{self, sparkrt};
use crate::server::{Server, box24, repo};

const PROMPT: &str = "Hello there, how are you";

fn fixture() -> String {
    repo()
        .join("tests/fixtures/qwen3-moe-tiny")
        .display()
        .to_string()
}

/// The text of a completion of `PROMPT` with `extra` fields.
fn complete(server: &Server, extra: Value) -> String {
    let mut body = json!({"prompt": PROMPT, "max_tokens": 16});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let reply = server.post("/v1/completions", &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A copy of the tiny fixture (its files linked) whose
/// generation_config.json is `generation`.
fn fixture_with(dir: &Path, generation: &Value) {
    let source = repo().join("tests/fixtures/qwen3-moe-tiny");
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "generation_config.json" {
            std::os::unix::fs::symlink(entry.path(), dir.join(entry.file_name())).unwrap();
        }
    }
    std::fs::write(
        dir.join("generation_config.json"),
        serde_json::to_string(generation).unwrap(),
    )
    .unwrap();
}

#[test]
fn generation_config_defaults_make_unset_requests_greedy_unless_vllm() {
    let dir = tempfile::tempdir().unwrap();
    fixture_with(
        dir.path(),
        &json!({"eos_token_id": 511, "temperature": 0.0, "top_k": 1}),
    );
    let model = dir.path().display().to_string();
    let auto = Server::start(&["--model", &model]);
    let greedy = complete(&auto, json!({"temperature": 0}));
    for seed in [1, 2, 3] {
        assert_eq!(
            complete(&auto, json!({"seed": seed})),
            greedy,
            "seed {seed}"
        );
    }
    // An explicit field still wins over the checkpoint's default.
    let sampled = complete(&auto, json!({"temperature": 1.0, "top_k": -1, "seed": 1}));
    assert_ne!(sampled, greedy);
    assert!(
        auto.log()
            .contains("temperature=0 top_k=1 (the checkpoint's generation_config.json)"),
        "{}",
        auto.log()
    );
    drop(auto);

    // vllm: the checkpoint's file is ignored; the same seeded request samples.
    let vllm = Server::start(&["--model", &model, "--generation-config", "vllm"]);
    assert_eq!(complete(&vllm, json!({"seed": 1})), sampled);
    assert!(
        vllm.log().contains("vllm's neutral defaults"),
        "{}",
        vllm.log()
    );
    drop(vllm);

    // A folder: its generation_config.json, over a checkpoint without one.
    let folder = dir.path().display().to_string();
    let from_dir = Server::start(&["--model", &fixture(), "--generation-config", &folder]);
    assert_eq!(complete(&from_dir, json!({"seed": 2})), greedy);
}

#[test]
fn vllm_flags_are_accepted_with_their_meaning() {
    let args = [
        fixture(),
        "--served-model-name".into(),
        "first".into(),
        "second".into(),
        "--enable-prefix-caching".into(),
        "--enable-auto-tool-choice".into(),
        "--trust-remote-code".into(),
        "--dtype".into(),
        "bfloat16".into(),
        "--tensor-parallel-size".into(),
        "1".into(),
        "--seed".into(),
        "5".into(),
        // The checkpoint's own method, as vLLM spells it.
        "--quantization".into(),
        "none".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = Server::start(&args);
    let models = a.get("/v1/models").json();
    assert_eq!(models["data"][0]["id"], "first", "{models}");
    assert_eq!(models["data"].as_array().unwrap().len(), 1);
    assert_eq!(a.get("/v1/models/second").json()["id"], "first");
    assert_eq!(a.get("/v1/models/third").status, 404);
    // Any of the names is accepted (complete asserts the 200).
    complete(&a, json!({"model": "second", "seed": 9}));
    let unknown = a.post(
        "/v1/completions",
        &json!({"prompt": PROMPT, "model": "third"}),
    );
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert!(a.log().contains("never runs code"), "{}", a.log());
    // vLLM's routes, and OpenAI's `user` field (accepted, not used).
    assert_eq!(a.get("/ping").status, 200);
    assert_eq!(a.post("/ping", &json!({})).status, 200);
    let version = a.get("/version");
    assert_eq!(version.status, 200, "{}", version.body);
    assert_eq!(
        version.json(),
        json!({"version": env!("CARGO_PKG_VERSION")})
    );
    let chat = a.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "user": "ann", "seed": 1}),
    );
    assert_eq!(chat.status, 200, "{}", chat.body);
    // --seed: requests without a seed are reproducible across servers, in
    // order, and two identical ones still differ.
    let first = [complete(&a, json!({})), complete(&a, json!({}))];
    drop(a);
    let b = Server::start(&args);
    complete(&b, json!({"model": "second", "seed": 9}));
    let again = [complete(&b, json!({})), complete(&b, json!({}))];
    assert_eq!(first, again);
    assert_ne!(first[0], first[1]);
}

/// `sparkrt serve ARGS` exits 2 before loading, its stderr naming `needle`.
fn refused(args: &[&str], needle: &str) {
    let mut all = vec!["serve", "--port", "0", "--host-root"];
    let host = box24().display().to_string();
    all.push(&host);
    all.extend_from_slice(args);
    let out = sparkrt(&all);
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(needle), "{args:?}: {stderr}");
}

#[test]
fn vllm_flags_sparkrt_cannot_honour_exit_2_naming_them() {
    let model = fixture();
    refused(&["--dtype", "float16"], "--dtype float16 is not supported");
    refused(
        &["--tensor-parallel-size", "2"],
        "--tensor-parallel-size 2 is not supported yet",
    );
    refused(
        &[&model, "--model", "tests/fixtures/qwen35-tiny"],
        "the model is given twice and differently",
    );
    refused(
        &["--enable-prefix-caching", "--no-prefix-caching"],
        "--no-prefix-caching",
    );
    refused(
        &["--model", &model, "--generation-config", "/no/such/folder"],
        "--generation-config /no/such/folder: not a folder",
    );
    // --quantization names the checkpoint's method or is refused: never
    // read as another format.
    refused(
        &[&model, "--quantization", "awq"],
        "--quantization awq does not match the checkpoint",
    );
    refused(&[&model, "-q", "modelopt"], "it is not quantized (bf16)");
    let nvfp4 = common::fixture("qwen3-moe-tiny-nvfp4")
        .display()
        .to_string();
    refused(
        &[&nvfp4, "--quantization", "compressed-tensors"],
        "it is stored as modelopt (give modelopt or modelopt_fp4",
    );
    // A default out of range stops the start, naming the file and field.
    let dir = tempfile::tempdir().unwrap();
    for (bad, needle) in [
        (json!({"temperature": 3.0}), "temperature must be in [0, 2]"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"top_k": "many"}), "field `top_k`"),
    ] {
        std::fs::write(dir.path().join("generation_config.json"), bad.to_string()).unwrap();
        let folder = dir.path().display().to_string();
        refused(&["--model", &model, "--generation-config", &folder], needle);
        refused(
            &["--model", &model, "--generation-config", &folder],
            "generation_config.json",
        );
    }
}

#[test]
fn ping_is_a_probe_and_version_needs_the_key() {
    let server = Server::start_with_key(&["--api-key", "k"], None);
    assert_eq!(server.get("/ping").status, 200);
    assert_eq!(server.get("/version").status, 401);
    assert_eq!(server.get("/health").status, 200);
}

#[test]
fn speculative_configs_sparkrt_does_not_serve_exit_2_naming_them() {
    let model = fixture();
    for (config, needle) in [
        (
            r#"{"method": "medusa", "num_speculative_tokens": 1}"#,
            "method \"medusa\" is not served here",
        ),
        (
            r#"{"method": "mtp", "num_speculative_tokens": 1, "prompt_lookup_min": 2}"#,
            "prompt_lookup_min is a key of the \"ngram\" method",
        ),
        (
            r#"{"method": "eagle3", "model": "x", "num_speculative_tokens": 1}"#,
            "unknown field `model`",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 12}"#,
            "num_speculative_tokens is 12; it must be between 1 and 8",
        ),
        (
            r#"{"method": "ngram"}"#,
            "missing field `num_speculative_tokens`",
        ),
    ] {
        refused(&["--model", &model, "--speculative-config", config], needle);
    }
    // The same in a profile, pointing at the key.
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.toml");
    std::fs::write(
        &profile,
        format!(
            "[model]\npath = \"{}\"\n[serving]\nspeculative_config = {{ method = \"medusa\", num_speculative_tokens = 1 }}\n",
            std::path::Path::new(&model).canonicalize().unwrap().display()
        ),
    )
    .unwrap();
    let path = profile.display().to_string();
    refused(
        &["--profile", &path],
        "p.toml:4:1: [serving] speculative_config",
    );
}
