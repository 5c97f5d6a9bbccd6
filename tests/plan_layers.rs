//! Profiles laid over the checkpoint and flags over the profile (issue 18,
//! part A): a `[serving]`-only profile plans and generates like the full
//! one, a disagreeing geometry value is bad input, each flag overrides its
//! profile key and the plan says so, `k8s` plans for the GB10 node, and
//! `generate` sizes its KV cache to the request.

use crate::common;
use crate::server::Server;

use std::path::PathBuf;

use common::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;

/// A scratch folder for profile files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("sparkrt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tiny() -> String {
    fixture("qwen3-moe-tiny").display().to_string()
}

fn box24() -> String {
    fixture("hosts/box24").display().to_string()
}

/// `[model]` of the shipped tiny profile, written by hand from the
/// fixture's config.json: the whole geometry, without `path` and `name`.
fn tiny_geometry() -> String {
    let text = std::fs::read_to_string(profile("qwen3-moe-tiny")).unwrap();
    let model = text.split("[serving]").next().unwrap();
    model
        .lines()
        .filter(|l| !l.starts_with("path =") && !l.starts_with("name ="))
        .collect::<Vec<_>>()
        .join("\n")
}

fn plan(args: &[&str]) -> (serde_json::Value, std::process::Output) {
    let host = box24();
    let mut all = vec!["plan", "--host-root", &host, "--json"]
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
    all.extend(args.iter().map(|s| s.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let out = sparkrt(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    (json(&out), out)
}

fn without_source(mut plan: serde_json::Value) -> serde_json::Value {
    plan.as_object_mut().unwrap().remove("profile");
    plan
}

#[test]
fn a_serving_only_profile_plans_and_generates_like_the_full_profile() {
    let scratch = Scratch::new("layers");
    let serving = "[serving]\nkv_cache_dtype = \"f32\"\n";
    let only = scratch.write("only.toml", serving);
    let full = scratch.write("full.toml", &format!("{}\n{serving}", tiny_geometry()));
    let (layered, _) = plan(&["--profile", &only, "--model", &tiny()]);
    let (whole, _) = plan(&["--profile", &full, "--model", &tiny()]);
    assert_eq!(without_source(layered.clone()), without_source(whole));
    // The geometry came from config.json, the dtype from the profile.
    assert_eq!(layered["sources"]["model"], "checkpoint");
    assert_eq!(layered["sources"]["kv_cache_dtype"], "profile");
    assert_eq!(layered["sources"]["max_model_len"], "default");
    assert_eq!(layered["model"]["num_layers"], 4);
    // 4 layers × 2 KV heads × 32 dims × (K, V) × 4 bytes.
    assert_eq!(layered["kv_cache"]["bytes_per_token"], 4 * 2 * 32 * 2 * 4);

    // It generates, and greedily the same tokens as the shipped profile
    // (same geometry, f32 KV cache).
    let run = |profile: &str| {
        let out = sparkrt(&[
            "generate",
            "--profile",
            profile,
            "--model",
            &tiny(),
            "--host-root",
            &box24(),
            "--prompt-ids",
            "1,2,3,4,5",
            "--max-tokens",
            "12",
            "--threads",
            "2",
            "--json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)["token_ids"].clone()
    };
    let shipped = profile("qwen3-moe-tiny").display().to_string();
    let tokens = run(&only);
    assert_eq!(tokens.as_array().unwrap().len(), 12);
    assert_eq!(tokens, run(&shipped));

    // `profile init` writes a profile that plans the same as the full one
    // once its serving values are the same.
    let init = sparkrt(&["profile", "init", "--model", &tiny()]);
    assert!(init.status.success(), "{}", stderr(&init));
    let text = stdout(&init).replace("kv_cache_dtype = \"bf16\"", "kv_cache_dtype = \"f32\"");
    let written = scratch.write("init.toml", &text);
    let (from_init, _) = plan(&["--profile", &written]);
    let mut reference = plan(&["--profile", &full, "--model", &tiny()]).0;
    // Same plan; only the name (the folder's) and where values came from
    // (init writes every key) differ.
    reference["model"]["name"] = from_init["model"]["name"].clone();
    for key in ["sources", "profile"] {
        reference.as_object_mut().unwrap().remove(key);
    }
    let mut from_init = from_init;
    for key in ["sources", "profile"] {
        from_init.as_object_mut().unwrap().remove(key);
    }
    assert_eq!(from_init, reference);
}

#[test]
fn the_default_max_model_len_is_at_most_the_checkpoints_context() {
    let scratch = Scratch::new("context");
    let dir = scratch.0.join("short");
    std::fs::create_dir_all(&dir).unwrap();
    for name in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(fixture("qwen3-moe-tiny").join(name), dir.join(name)).unwrap();
    }
    let config = std::fs::read_to_string(fixture("qwen3-moe-tiny/config.json")).unwrap();
    assert!(config.contains("\"max_position_embeddings\": 4096"));
    let config = config.replace(
        "\"max_position_embeddings\": 4096",
        "\"max_position_embeddings\": 2048",
    );
    std::fs::write(dir.join("config.json"), config).unwrap();
    let short = dir.display().to_string();
    let (p, _) = plan(&["--model", &short]);
    assert_eq!(p["serving"]["max_model_len"], 2048);
    assert_eq!(p["sources"]["max_model_len"], "checkpoint");
    // The tiny fixture's 4096 is the default itself.
    let (p, _) = plan(&["--model", &tiny()]);
    assert_eq!(p["serving"]["max_model_len"], 4096);
    assert_eq!(p["sources"]["max_model_len"], "default");
    // A flag is kept as given.
    let (p, _) = plan(&["--model", &short, "--max-model-len", "3000"]);
    assert_eq!(p["serving"]["max_model_len"], 3000);
    assert_eq!(p["sources"]["max_model_len"], "flag");
}

#[test]
fn a_geometry_value_that_disagrees_with_the_checkpoint_is_exit_2_naming_it() {
    let scratch = Scratch::new("disagree");
    let wrong = scratch.write("wrong.toml", "[model]\nnum_layers = 3\n");
    let out = sparkrt(&[
        "plan",
        "--profile",
        &wrong,
        "--model",
        &tiny(),
        "--host-root",
        &box24(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("num_layers is 4 in the checkpoint's config.json but 3"),
        "{err}"
    );
    // Without a checkpoint the geometry is still required.
    let only = scratch.write("only.toml", "[serving]\nmax_model_len = 512\n");
    let out = sparkrt(&["plan", "--profile", &only, "--host-root", &box24()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("[model] architecture: missing"), "{err}");
}

#[test]
fn each_flag_overrides_its_profile_key_and_the_plan_names_the_source() {
    let shipped = profile("qwen3-moe-tiny").display().to_string();
    let (base, _) = plan(&["--profile", &shipped]);
    for key in [
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "kv_cache_dtype",
    ] {
        assert_eq!(base["sources"][key], "profile", "{key}");
    }
    assert_eq!(base["sources"]["dp_size"], "default");
    assert_eq!(base["serving"]["max_model_len"], 1024);
    let cases: [(&str, &str, &str, serde_json::Value); 6] = [
        ("--max-model-len", "512", "max_model_len", 512.into()),
        ("--max-num-seqs", "4", "max_num_seqs", 4.into()),
        (
            "--max-num-batched-tokens",
            "128",
            "max_num_batched_tokens",
            128.into(),
        ),
        ("--kv-cache-dtype", "bf16", "kv_cache_dtype", "bf16".into()),
        (
            "--kv-cache",
            "8MiB",
            "kv_cache",
            serde_json::json!({"bytes": 8 * MIB}),
        ),
        ("--dp-size", "2", "dp_size", 2.into()),
    ];
    for (flag, value, key, expected) in cases {
        let (p, _) = plan(&["--profile", &shipped, flag, value]);
        assert_eq!(p["serving"][key], expected, "{flag}");
        assert_eq!(p["sources"][key], "flag", "{flag}");
    }
    // The figures follow: bf16 halves the bytes per token, dp_size 2
    // doubles the MoE workspace's capacity, 1 MiB of KV is 1 MiB / 1 KiB
    // per token = 1024 tokens.
    let (bf16, _) = plan(&["--profile", &shipped, "--kv-cache-dtype", "bf16"]);
    assert_eq!(bf16["kv_cache"]["bytes_per_token"], 4 * 2 * 32 * 2 * 2);
    let (kv, _) = plan(&[
        "--profile",
        &shipped,
        "--kv-cache-dtype",
        "bf16",
        "--kv-cache",
        "1MiB",
    ]);
    assert_eq!(kv["kv_cache"]["tokens"], 1024);
    let (dp, _) = plan(&["--profile", &shipped, "--dp-size", "2"]);
    assert_eq!(
        dp["moe_workspace"]["capacity_tokens"].as_u64().unwrap(),
        2 * base["moe_workspace"]["capacity_tokens"].as_u64().unwrap()
    );
    let (named, out) = plan(&["--profile", &shipped, "--served-model-name", "tiny-served"]);
    assert_eq!(named["model"]["name"], "tiny-served");
    assert_eq!(named["sources"]["name"], "flag");
    let _ = out;

    // The text plan says where each value came from.
    let out = sparkrt(&[
        "plan",
        "--profile",
        &shipped,
        "--host-root",
        &box24(),
        "--max-model-len",
        "512",
    ]);
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("max_model_len"))
        .unwrap();
    assert!(line.contains("512") && line.ends_with("(flag)"), "{line}");

    // A flag's value is held to the profile's rules, named as the flag.
    let out = sparkrt(&[
        "plan",
        "--profile",
        &shipped,
        "--host-root",
        &box24(),
        "--max-model-len",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--max-model-len: must be at least 1"),
        "{}",
        stderr(&out)
    );
    // vLLM's --gpu-memory-utilization is refused with the reason.
    let out = sparkrt(&[
        "plan",
        "--model",
        &tiny(),
        "--host-root",
        &box24(),
        "--gpu-memory-utilization",
        "0.9",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unified memory"), "{}", stderr(&out));
}

#[test]
fn serve_takes_the_api_key_and_name_flags() {
    let mut server = Server::start_with_key(
        &["--api-key", "flag-key", "--served-model-name", "from-flag"],
        Some("flag-key"),
    );
    let models = server.get("/v1/models").json();
    assert_eq!(models["data"][0]["id"], "from-flag");
    server.set_key(None);
    assert_eq!(server.get("/v1/models").status, 401);
    server.set_key(Some("another"));
    assert_eq!(server.get("/v1/models").status, 401);
}

#[test]
fn serve_reads_the_api_key_from_the_environment() {
    // An empty $SPARKRT_API_KEY is refused before the model loads: proof
    // that serve reads it when neither flag is given.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sparkrt"))
        .args(["serve", "--port", "0", "--host-root", &box24()])
        .env("SPARKRT_API_KEY", " ")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("$SPARKRT_API_KEY is empty"),
        "{}",
        stderr(&out)
    );
    // --api-key and --api-key-file together are refused by name.
    let out = sparkrt(&["serve", "--api-key", "k", "--api-key-file", "/dev/null"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--api-key-file"), "{}", stderr(&out));
}

/// The memory request of the first manifest that has one.
fn memory_request(yaml: &str) -> u64 {
    let line = yaml
        .lines()
        .find(|l| l.trim_start().starts_with("memory: '"))
        .unwrap_or_else(|| panic!("no memory request in\n{yaml}"));
    line.trim()
        .trim_start_matches("memory: '")
        .trim_end_matches('\'')
        .parse()
        .unwrap()
}

#[test]
fn k8s_plans_for_the_gb10_node_not_this_machine() {
    let bf16 = profile("qwen3-30b-a3b-bf16").display().to_string();
    let k8s = |extra: &[&str]| {
        let mut args = vec![
            "k8s",
            "--profile",
            &bf16,
            "--model-dir",
            "/srv/models/qwen3-30b",
        ];
        args.extend_from_slice(extra);
        sparkrt(&args)
    };
    let out = k8s(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("planning for the built-in GB10 node"),
        "{}",
        stderr(&out)
    );
    let request = memory_request(&stdout(&out));
    // The GB10 headroom by hand: MemAvailable 118000000 kB less the
    // kubelet's default eviction threshold (100 MiB), the profile's
    // os_reserve (4 GiB) and safety margin (2 GiB); the kubelet's limit
    // (MemTotal 127605452 kB less eviction and margin) is higher.
    let usable = 118_000_000 * KIB - 100 * MIB - 4 * GIB - 2 * GIB;
    assert!(usable < 127_605_452 * KIB - 100 * MIB - 2 * GIB);
    // kv_cache = "auto" fills what remains, to within one block (16 tokens
    // of 48 layers × 4 KV heads × 128 dims × (K, V) × 2 bytes).
    let block = 16 * 48 * 4 * 128 * 2 * 2;
    assert!(
        request <= usable && usable - request < block,
        "{request} vs {usable}"
    );
    // A node spec file with the same figures plans the same.
    let scratch = Scratch::new("node");
    let spec = scratch.write(
        "gb10.toml",
        &format!(
            "mem_total = {}\nmem_available = {}\neviction_hard = \"100Mi\"\n",
            127_605_452 * KIB,
            118_000_000 * KIB
        ),
    );
    let out = k8s(&["--node-spec", &spec]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(memory_request(&stdout(&out)), request);
    // --host-root keeps its meaning: this machine (here the 24 GiB tree).
    let out = k8s(&["--host-root", &box24()]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // The 235B profile does not fit the GB10 node either.
    let big = profile("qwen3-235b-a22b-nvfp4").display().to_string();
    let out = sparkrt(&["k8s", "--profile", &big, "--model-dir", "/srv/models/q235"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stdout(&out).is_empty());
}

#[test]
fn generate_sizes_the_kv_cache_to_the_request() {
    let (model, host) = (tiny(), box24());
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            &model,
            "--host-root",
            &host,
            "--prompt-ids",
            "1,2,3,4,5",
            "--max-tokens",
            "20",
            "--threads",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = sparkrt(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)
    };
    // 5 prompt + 20 new tokens, rounded up to blocks of 16: 32.
    let sized = run(&[]);
    assert_eq!(sized["kv_cache_tokens"], 32);
    assert_eq!(sized["kv_cache_source"], "request");
    assert_eq!(sized["token_ids"].as_array().unwrap().len(), 20);
    // A flag says otherwise: what remains (far more than the request).
    let auto = run(&["--kv-cache", "auto"]);
    assert_eq!(auto["kv_cache_source"], "flag");
    assert!(auto["kv_cache_tokens"].as_u64().unwrap() > 32);
    // The same tokens either way.
    assert_eq!(sized["token_ids"], auto["token_ids"]);
}
