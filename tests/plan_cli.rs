//! `sparkrt probe` and `sparkrt plan` against fake host trees, with the
//! expected figures derived by hand from the formulas in the issue.

use crate::common;

use common::*;
use sparkrt_wire::{HostSnapshot, PROBE_SNAPSHOT_ARGS};

const GIB: i64 = 1 << 30;
const MIB: i64 = 1 << 20;

fn spark_root() -> String {
    fixture("hosts/spark").display().to_string()
}

fn box24_root() -> String {
    fixture("hosts/box24").display().to_string()
}

fn plan_json(profile_path: &str, host_root: &str) -> (serde_json::Value, i32) {
    let out = sparkrt(&[
        "plan",
        "--profile",
        profile_path,
        "--host-root",
        host_root,
        "--json",
    ]);
    (json(&out), out.status.code().unwrap_or(-1))
}

#[test]
fn probe_reads_the_spark_tree() {
    let out = sparkrt(&["probe", "--host-root", &spark_root(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    // tests/fixtures/hosts/spark/proc/meminfo, kB × 1024
    assert_eq!(v["meminfo"]["mem_total"], 127_605_452u64 * 1024);
    assert_eq!(v["meminfo"]["mem_available"], 118_000_000u64 * 1024);
    assert_eq!(v["meminfo"]["cached"], 15_728_640u64 * 1024);
    assert_eq!(v["meminfo"]["buffers"], 204_800u64 * 1024);
    assert_eq!(v["meminfo"]["shmem"], 524_288u64 * 1024);
    assert_eq!(v["kubelet"]["system_reserved"], 2u64 << 30);
    assert_eq!(v["kubelet"]["kube_reserved"], 1u64 << 30);
    // 5% of MemTotal, truncated: 130,667,982,848 × 0.05 = 6,533,399,142.4
    assert_eq!(v["eviction_hard_bytes"], 6_533_399_142u64);
    assert_eq!(v["kubepods"]["current"], 3u64 << 30);
    assert_eq!(v["kubepods"]["max"], serde_json::Value::Null);
}

/// `sparkrt probe --json --snapshot` on the Spark tree: the monitor's host
/// reading, `usable` from the plan's headroom rule with the reserves given.
fn probe_snapshot(extra: &[&str]) -> HostSnapshot {
    let root = spark_root();
    let mut args: Vec<&str> = PROBE_SNAPSHOT_ARGS.to_vec();
    args.extend(["--host-root", root.as_str()]);
    args.extend(extra);
    let out = sparkrt(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn probe_snapshot_is_the_monitors_reading_with_the_plans_headroom() {
    let snapshot = probe_snapshot(&[]);
    let kb = |k: u64| k * 1024;
    let mem_total = kb(127_605_452);
    let mem_available = kb(118_000_000);
    let eviction = 6_533_399_142u64; // 5% of MemTotal, truncated
    let g = |n: u64| n << 30;
    let mut expected = HostSnapshot {
        mem_total,
        mem_available,
        mem_free: kb(101_234_567),
        cached: kb(15_728_640),
        buffers: kb(204_800),
        shmem: kb(524_288),
        swap_total: 0,
        swap_free: 0,
        kubepods_current: Some(g(3)),
        kubepods_max: None,
        system_reserved: g(2),
        kube_reserved: g(1),
        eviction_hard: eviction,
        usable: None,
        gpu_processes: Vec::new(),
    };
    // Built-in reserves: os 2 GiB, safety 1 GiB. The host's own limit binds:
    // the kubelet's is MemTotal − 2 − 1 GiB reserved − eviction − 3 GiB of
    // pods − 1 GiB safety, larger.
    let host_limit = mem_available - eviction - g(2) - g(1);
    let kube_limit = mem_total - g(2) - g(1) - eviction - g(3) - g(1);
    assert!(host_limit < kube_limit);
    expected.usable = Some(host_limit);
    assert_eq!(snapshot, expected);

    // A profile's [host] reserves: os 4 GiB, safety 2 GiB.
    let snapshot = probe_snapshot(&["--profile", "qwen3-30b-a3b-nvfp4"]);
    expected.usable = Some(mem_available - eviction - g(4) - g(2));
    assert_eq!(snapshot, expected);
}

#[test]
fn probe_snapshot_flags_need_their_mode() {
    let root = spark_root();
    expect_bad_input(&["probe", "--snapshot", "--host-root", &root], "--json");
    expect_bad_input(
        &[
            "probe",
            "--json",
            "--profile",
            "qwen3-moe-tiny",
            "--host-root",
            &root,
        ],
        "--snapshot",
    );
}

#[test]
fn spark_plan_for_qwen3_30b_nvfp4_uses_the_headroom_rule() {
    let (v, code) = plan_json(
        &profile("qwen3-30b-a3b-nvfp4").display().to_string(),
        &spark_root(),
    );
    let h = &v["host"];
    let mem_total: i64 = 127_605_452 * 1024;
    let mem_available: i64 = 118_000_000 * 1024;
    let eviction = mem_total / 20; // 5%, truncated
    let (os_reserve, safety) = (4 * GIB, 2 * GIB); // the profile's [host]
    let host_limit = mem_available - eviction - os_reserve - safety;
    let kube_limit = mem_total - 2 * GIB - GIB - eviction - 3 * GIB - safety;
    assert_eq!(h["eviction_hard"], eviction);
    assert_eq!(h["host_limit"], host_limit);
    assert_eq!(h["kube_limit"], kube_limit);
    assert_eq!(h["usable"], host_limit.min(kube_limit));
    assert_eq!(h["binding"], "host");
    assert_eq!(v["estimated"], true);
    assert_eq!(v["fits"], true);
    assert_eq!(code, 0);

    // bf16 KV: 2 × 48 layers × 4 KV heads × 128 × 2 bytes
    assert_eq!(v["kv_cache"]["bytes_per_token"], 98_304);
    // auto KV: what remains of usable, in whole 16-token blocks
    let fixed = v["weights"]["total"].as_i64().unwrap()
        + v["moe_workspace"]["bytes"].as_i64().unwrap()
        + v["activations"]["bytes"].as_i64().unwrap()
        + v["runtime_overhead"]["bytes"].as_i64().unwrap();
    let tokens = (host_limit - fixed) / (98_304 * 16) * 16;
    assert_eq!(v["kv_cache"]["tokens"], tokens);
    assert_eq!(v["total"], fixed + tokens * 98_304);

    // One MoE workspace: 8192 tokens × top-8 routed rows.
    let ws = &v["moe_workspace"];
    assert_eq!(ws["instances"], 1);
    assert_eq!(ws["capacity_tokens"], 8192);
    assert_eq!(ws["routed_rows"], 8192 * 8);
    let rows: i64 = 8192 * 8;
    let expected_ws = rows * 4 * 3 // ids, weights, sorted rows
        + 129 * 4 // expert offsets
        + rows * 2048 * 4 * 2 // gathered input, down output
        + rows * 2 * 768 * 4 // gate/up output
        + rows * 768 * 4 // activation
        // NVFP4 experts read their inputs quantized on the CPU: an int16
        // per value of the wider input (hidden), an f32 per 32 values.
        + rows * 2048 * 2
        + rows * 2048 / 32 * 4;
    assert_eq!(ws["bytes"], expected_ws);
    assert_eq!(ws["per_layer_total_bytes"], expected_ws * 48);
    assert_eq!(ws["buffers"].as_array().unwrap().len(), 10);

    // NVFP4 experts: per [768, 2048] matrix 768·2048/2 codes + 768·128 F8
    // scales + two f32 scalars; 3 matrices × 128 experts × 48 layers.
    let per_matrix: i64 = 768 * 2048 / 2 + 768 * 128 + 8;
    assert_eq!(v["weights"]["groups"]["experts"], per_matrix * 3 * 128 * 48);
    assert_eq!(v["model"]["num_moe_layers"], 48);
}

#[test]
fn the_cuda_plan_holds_only_the_workspace_buffers_the_cuda_kernels_use() {
    // The same profile on CUDA: no gathered input and no gate/up output
    // (the CUDA experts read rows in place and fuse gate/up with the
    // activation), a 4-byte route counter and 1,024 attention partials of
    // head_dim 128 + 2 f32.
    let text = std::fs::read_to_string(profile("qwen3-30b-a3b-nvfp4")).unwrap();
    let cuda = text.replace("device = \"auto\"", "device = \"cuda\"");
    assert_ne!(cuda, text, "the profile names its device");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cuda.toml");
    std::fs::write(&path, cuda).unwrap();
    let (v, _) = plan_json(&path.display().to_string(), &spark_root());
    assert_eq!(v["device"], "cuda");
    let ws = &v["moe_workspace"];
    let rows: i64 = 8192 * 8;
    let expected = rows * 4 * 3 // ids, weights, sorted rows
        + 129 * 4 // expert offsets
        + 1024 * (128 + 2) * 4 // attention partials
        + 4 // route counter
        + rows * 768 * 4 // activation
        + rows * 2048 * 4; // down output
    assert_eq!(ws["bytes"], expected);
    let names: Vec<&str> = ws["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "topk_ids",
            "topk_weights",
            "expert_offsets",
            "sorted_rows",
            "attention_partials",
            "route_counter",
            "activation",
            "down_output"
        ]
    );
}

#[test]
fn box24_without_kubelet_binds_on_the_host() {
    let (v, code) = plan_json(
        &profile("qwen3-moe-tiny").display().to_string(),
        &box24_root(),
    );
    let h = &v["host"];
    // 22 GiB available − 0 eviction − 1 GiB OS reserve − 512 MiB margin
    assert_eq!(h["host_limit"], 22 * GIB - GIB - 512 * MIB);
    assert_eq!(h["kube_limit"], serde_json::Value::Null);
    assert_eq!(h["binding"], "host");
    assert_eq!(code, 0);
    // The tiny profile's cache is capped at 8 seqs × 1024 tokens, f32:
    // 2 × 4 layers × 2 KV heads × 32 × 4 bytes = 2048 bytes per token.
    assert_eq!(v["kv_cache"]["bytes_per_token"], 2048);
    assert_eq!(v["kv_cache"]["tokens"], 8 * 1024);
    assert_eq!(v["kv_cache"]["bytes"], 8 * 1024 * 2048);
    // Workspace: 256 tokens × top-4 = 1024 rows, hidden 128, expert intermediate 64.
    let rows = 1024;
    assert_eq!(
        v["moe_workspace"]["bytes"],
        rows * 4 * 3 + 17 * 4 + rows * 128 * 4 * 2 + rows * 128 * 4 + rows * 64 * 4
    );
}

#[test]
fn the_text_plan_scales_each_figure_to_its_magnitude() {
    let out = sparkrt(&[
        "plan",
        "--profile",
        &profile("qwen3-moe-tiny").display().to_string(),
        "--host-root",
        &box24_root(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // Each row's label and figure with the padding squeezed to one space.
    let rows: Vec<String> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    for row in [
        // box24: MemTotal 24 GiB, MemAvailable 22 GiB, no eviction threshold,
        // 22 − 1 − 0.5 = 20.5 GiB usable.
        "MemTotal 24.0 GiB",
        "MemAvailable 22.0 GiB",
        "eviction hard 0 B",
        "OS reserve 1.00 GiB",
        "safety margin 512 MiB",
        "usable (bound by host) 20.5 GiB",
        // Experts: 4 layers × 16 × 3 matrices × 128 × 64 × 2 bytes = 3 MiB.
        "experts 3.00 MiB",
        // Embeddings: 512 vocab × 128 hidden × 2 bytes (bf16) = 128 KiB.
        "embeddings 128 KiB",
        // expert_offsets: 17 × 4 bytes.
        "expert_offsets 68 B",
        // 8192 tokens × 2048 bytes = 16 MiB.
        "KV cache (8192 tokens, f32) 16.0 MiB",
        "runtime overhead 256 MiB",
    ] {
        assert!(rows.iter().any(|r| r == row), "{row:?} in\n{text}");
    }
}

#[test]
fn dp_size_two_doubles_the_workspace_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(profile("qwen3-30b-a3b-bf16"))
        .unwrap()
        .replace("dp_size = 1", "dp_size = 2");
    let path = dir.path().join("dp2.toml");
    std::fs::write(&path, text).unwrap();
    let (one, _) = plan_json(
        &profile("qwen3-30b-a3b-bf16").display().to_string(),
        &spark_root(),
    );
    let (two, _) = plan_json(&path.display().to_string(), &spark_root());
    assert_eq!(one["moe_workspace"]["capacity_tokens"], 8192);
    assert_eq!(two["moe_workspace"]["capacity_tokens"], 16384);
    assert_eq!(two["moe_workspace"]["routed_rows"], 16384 * 8);
}

#[test]
fn qwen3_235b_nvfp4_does_not_fit_a_spark() {
    let out = sparkrt(&[
        "plan",
        "--profile",
        &profile("qwen3-235b-a22b-nvfp4").display().to_string(),
        "--host-root",
        &spark_root(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(text.contains("DOES NOT FIT"), "{text}");
    assert!(text.contains("weights alone"), "{text}");
    let (v, code) = plan_json(
        &profile("qwen3-235b-a22b-nvfp4").display().to_string(),
        &spark_root(),
    );
    assert_eq!(code, 3);
    assert_eq!(v["fits"], false);
    assert!(v["shortfall"]["bytes"].as_u64().unwrap() > 0);
}

#[test]
fn a_fixed_kv_cache_that_is_too_big_names_the_knobs() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(profile("qwen3-30b-a3b-bf16"))
        .unwrap()
        .replace("kv_cache = \"auto\"", "kv_cache = \"200GiB\"");
    let path = dir.path().join("big-kv.toml");
    std::fs::write(&path, text).unwrap();
    let out = sparkrt(&[
        "plan",
        "--profile",
        &path.display().to_string(),
        "--host-root",
        &spark_root(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    let text = stdout(&out);
    for knob in ["kv_cache", "max_num_batched_tokens", "max_model_len"] {
        assert!(text.contains(knob), "advice names {knob}: {text}");
    }
}

fn expect_bad_input(args: &[&str], needle: &str) {
    let out = sparkrt(args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout {} stderr {}",
        stdout(&out),
        stderr(&out)
    );
    let err = stderr(&out);
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_host_trees_are_exit_2_never_a_panic() {
    let tiny = profile("qwen3-moe-tiny").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("proc")).unwrap();

    std::fs::write(root.join("proc/meminfo"), "MemTotal: 1000 kB\nMemAvail").unwrap();
    expect_bad_input(
        &[
            "plan",
            "--profile",
            &tiny,
            "--host-root",
            &root.display().to_string(),
        ],
        "meminfo",
    );
    std::fs::write(root.join("proc/meminfo"), "").unwrap();
    expect_bad_input(
        &["probe", "--host-root", &root.display().to_string()],
        "MemTotal",
    );
    std::fs::remove_file(root.join("proc/meminfo")).unwrap();
    expect_bad_input(
        &["probe", "--host-root", &root.display().to_string()],
        "cannot read",
    );

    let host = |yaml: &str| {
        let d = tempfile::tempdir().unwrap();
        FakeHost {
            mem_total_kb: 1 << 24,
            mem_available_kb: 1 << 23,
            kubelet_yaml: Some(yaml.to_string()),
            kubepods_current: None,
        }
        .write(d.path());
        d
    };
    let d = host("systemReserved:\n  memory: 2Zi\n");
    expect_bad_input(
        &[
            "plan",
            "--profile",
            &tiny,
            "--host-root",
            &d.path().display().to_string(),
        ],
        "unknown suffix",
    );
    let d = host("systemReserved: {memory: [\n");
    expect_bad_input(
        &["probe", "--host-root", &d.path().display().to_string()],
        "not valid YAML",
    );
    let d = host("evictionHard:\n  memory.available: \"-5%\"\n");
    expect_bad_input(
        &["probe", "--host-root", &d.path().display().to_string()],
        "percentage",
    );
}

#[test]
fn bad_profiles_are_exit_2_with_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read_to_string(profile("qwen3-moe-tiny")).unwrap();
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let box24 = box24_root();

    let unknown = write(
        "unknown.toml",
        original.replace("top_k = 4", "top_k = 4\ntop_p = 4"),
    );
    expect_bad_input(
        &["plan", "--profile", &unknown, "--host-root", &box24],
        &format!("{unknown}:"),
    );
    expect_bad_input(
        &["plan", "--profile", &unknown, "--host-root", &box24],
        "top_p",
    );

    let wrong_type = write(
        "type.toml",
        original.replace("num_experts = 16", "num_experts = \"many\""),
    );
    expect_bad_input(
        &["plan", "--profile", &wrong_type, "--host-root", &box24],
        "num_experts",
    );

    let missing = write("missing.toml", original.replace("hidden_size = 128\n", ""));
    expect_bad_input(
        &["plan", "--profile", &missing, "--host-root", &box24],
        "hidden_size",
    );

    let bad_size = write(
        "size.toml",
        original.replace("os_reserve = \"1GiB\"", "os_reserve = \"1 gallon\""),
    );
    expect_bad_input(
        &["plan", "--profile", &bad_size, "--host-root", &box24],
        "gallon",
    );

    expect_bad_input(
        &[
            "plan",
            "--profile",
            "no-such-profile",
            "--host-root",
            &box24,
        ],
        "no profile",
    );
}

#[test]
fn gpt_oss_120b_counts_sliding_layers_at_their_window() {
    let (v, code) = plan_json(
        &profile("gpt-oss-120b").display().to_string(),
        &spark_root(),
    );
    assert_eq!(code, 0, "gpt-oss-120b fits a Spark: {v}");
    let kv = &v["kv_cache"];
    // 36 layers alternate sliding/full: the k-th of each kind share array k
    // of the pool, so a slot holds 18 layers' K and V, 2 × 8 KV heads ×
    // 64 head_dim × 2 bytes (bf16) each.
    let per_layer_token = 2 * 8 * 64 * 2;
    assert_eq!(kv["bytes_per_token"], 18 * per_layer_token);
    assert_eq!(kv["block_bytes"], 16 * 18 * per_layer_token);
    // The 18 sliding layers hold the blocks of their 128-token window:
    // ⌈127 / 16⌉ + 1 = 9 a sequence, one more each for a step's chunks and
    // ⌈8192 / 16⌉ = 512 for its tokens: 16 × (9 + 1) + 512 = 672 blocks.
    assert_eq!(kv["sliding"]["layers"], 18);
    assert_eq!(kv["sliding"]["window_tokens"], 128);
    assert_eq!(kv["sliding"]["blocks_per_seq"], 9);
    assert_eq!(kv["sliding"]["step_blocks"], 512);
    assert_eq!(kv["sliding"]["blocks"], 672);
    assert_eq!(kv["sliding"]["bytes"], 672 * 16 * 18 * per_layer_token);
    // They come on top of the full-attention tokens, in the same pool.
    let tokens = kv["tokens"].as_i64().unwrap();
    assert_eq!(kv["blocks"], tokens / 16 + 672);
    assert_eq!(kv["bytes"], (tokens + 672 * 16) * 18 * per_layer_token);
    let text = common::stdout(&common::sparkrt(&[
        "plan",
        "--profile",
        &profile("gpt-oss-120b").display().to_string(),
        "--host-root",
        &spark_root(),
    ]));
    assert!(
        text.contains("sliding layers (18, window 128: 672 blocks)"),
        "{text}"
    );
    // top-4 of 128 experts, hidden 2880: 8192 × 4 routed rows.
    assert_eq!(v["moe_workspace"]["routed_rows"], 8192 * 4);
    assert_eq!(v["model"]["hidden_size"], 2880);
    // MXFP4 experts: per [5760, 2880] gate_up and [2880, 2880] down matrix,
    // codes at half a byte plus one E8M0 scale per 32, and bf16 biases.
    let experts: i64 = 36
        * 128
        * ((5760 * 2880 / 2 + 5760 * 90 + 5760 * 2) + (2880 * 2880 / 2 + 2880 * 90 + 2880 * 2));
    assert_eq!(v["weights"]["groups"]["experts"], experts);
}

/// On the CPU, MXFP4 experts read their inputs quantized (an int16 code per
/// value, an f32 scale per 32) from two more workspace buffers, sized for
/// the larger of the gate/up input (hidden) and the down input
/// (moe_intermediate) over every routed row; a CUDA plan has neither.
#[test]
fn gpt_oss_on_the_cpu_plans_the_quantized_activations() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(profile("gpt-oss-120b")).unwrap();
    let buffers = |device: &str| {
        let path = dir.path().join(format!("{device}.toml"));
        let edited = text.replace("device = \"auto\"", &format!("device = \"{device}\""));
        assert_ne!(edited, text, "the profile names its device");
        std::fs::write(&path, edited).unwrap();
        let (v, code) = plan_json(&path.display().to_string(), &spark_root());
        assert_eq!(code, 0, "{v}");
        let ws = &v["moe_workspace"];
        let named: std::collections::BTreeMap<String, i64> = ws["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["name"].as_str().unwrap().to_string(),
                    b["bytes"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(ws["bytes"].as_i64().unwrap(), named.values().sum::<i64>());
        named
    };
    // 8192 batched tokens × top-4 routed rows; hidden = moe_intermediate = 2880.
    let values: i64 = 8192 * 4 * 2880;
    let cpu = buffers("cpu");
    assert_eq!(cpu["quantized_input"], values * 2);
    assert_eq!(cpu["quantized_scales"], values / 32 * 4);
    let cuda = buffers("cuda");
    assert!(!cuda.contains_key("quantized_input"));
    assert!(!cuda.contains_key("quantized_scales"));
    assert_eq!(cpu.len(), cuda.len() + 2);
}

#[test]
fn plans_with_a_checkpoint_use_exact_header_bytes() {
    for name in ["qwen3-moe-tiny", "qwen3-moe-tiny-nvfp4", "gpt-oss-tiny"] {
        let out = sparkrt(&[
            "plan",
            "--profile",
            &profile(name).display().to_string(),
            "--model",
            &fixture(name).display().to_string(),
            "--host-root",
            &box24_root(),
            "--json",
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let v = json(&out);
        assert_eq!(v["estimated"], false);
        // The data section of the single safetensors file is exactly the weights.
        let file = std::fs::read(fixture(name).join("model.safetensors")).unwrap();
        let header = u64::from_le_bytes(file[..8].try_into().unwrap());
        let data = file.len() as u64 - 8 - header;
        assert_eq!(v["weights"]["total"], data, "{name}");
        // And the geometry-only estimate, made without the checkpoint, agrees
        // byte for byte: the formulas count what the files hold.
        let (estimate, _) = plan_json(&profile(name).display().to_string(), &box24_root());
        assert_eq!(
            estimate["weights"]["groups"], v["weights"]["groups"],
            "{name}"
        );
    }
}

#[test]
fn a_checkpoint_that_disagrees_with_the_profile_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture("qwen3-moe-tiny")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let config = dir.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("\"num_experts_per_tok\": 4", "\"num_experts_per_tok\": 2"),
    )
    .unwrap();
    let tiny = profile("qwen3-moe-tiny").display().to_string();
    let model = dir.path().display().to_string();
    expect_bad_input(
        &[
            "plan",
            "--profile",
            &tiny,
            "--model",
            &model,
            "--host-root",
            &box24_root(),
        ],
        "top_k",
    );

    std::fs::remove_file(&config).unwrap();
    expect_bad_input(
        &[
            "plan",
            "--profile",
            &tiny,
            "--model",
            &model,
            "--host-root",
            &box24_root(),
        ],
        "config.json",
    );
}

#[test]
fn an_explicit_kv_cache_above_what_the_sequences_use_is_reported_as_capped() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(profile("qwen3-moe-tiny"))
        .unwrap()
        .replace("kv_cache = \"auto\"", "kv_cache = \"1GiB\"");
    let path = dir.path().join("capped.toml");
    std::fs::write(&path, text).unwrap();
    let path = path.display().to_string();
    let (v, code) = plan_json(&path, &spark_root());
    assert_eq!(code, 0);
    // 8 sequences × 1024 tokens, 2048 bytes per token (f32, 4 layers, 2 × 32).
    assert_eq!(v["kv_cache"]["tokens"], 8 * 1024);
    assert_eq!(v["kv_cache"]["capped_from"], 1u64 << 30);
    let out = sparkrt(&["plan", "--profile", &path, "--host-root", &spark_root()]);
    let text = stdout(&out);
    assert!(
        text.contains("kv_cache = 1.00 GiB capped: max_num_seqs 8 × max_model_len 1024"),
        "{text}"
    );
    // "auto" is capped by design and says nothing.
    let (v, _) = plan_json(
        &profile("qwen3-moe-tiny").display().to_string(),
        &spark_root(),
    );
    assert_eq!(v["kv_cache"]["capped_from"], serde_json::Value::Null);
}

#[test]
fn reserves_above_mem_available_print_no_negative_figure() {
    let dir = tempfile::tempdir().unwrap();
    FakeHost {
        mem_total_kb: 4 << 20,
        mem_available_kb: 1 << 20,
        kubelet_yaml: None,
        kubepods_current: None,
    }
    .write(dir.path());
    let out = sparkrt(&[
        "plan",
        "--profile",
        &profile("qwen3-moe-tiny").display().to_string(),
        "--host-root",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("nothing is usable: the eviction threshold, OS reserve and safety margin exceed MemAvailable by"),
        "{text}"
    );
    // A figure that starts with a minus ("top-4" is no figure).
    let negative = text
        .as_bytes()
        .windows(3)
        .any(|w| matches!(w[0], b' ' | b'(') && w[1] == b'-' && w[2].is_ascii_digit());
    assert!(!negative, "a negative figure: {text}");
}

#[test]
fn the_queue_bound_is_a_quarter_of_the_safety_margin_over_a_worst_case_sequence() {
    // qwen3-30b-a3b-bf16: safety_margin 2 GiB, max_model_len 32768. A
    // queued sequence: 2 × 32768 ids × 4 B + 64 KiB = 320 KiB; 512 MiB of
    // them is 1638.
    let profile = profile("qwen3-30b-a3b-bf16").display().to_string();
    let (v, _) = plan_json(&profile, &spark_root());
    assert_eq!(v["queue"]["bytes_per_sequence"], 2 * 32768 * 4 + 65536);
    assert_eq!(v["queue"]["budget"], 512 * MIB);
    assert_eq!(v["queue"]["max_queue"], 1638);
    let out = sparkrt(&["plan", "--profile", &profile, "--host-root", &spark_root()]);
    assert!(
        stdout(&out).contains(
            "queue: 1638 sequences may wait (default --max-queue): 512 MiB of the safety margin \
             (2.00 GiB) over 320 KiB per queued sequence"
        ),
        "{}",
        stdout(&out)
    );
}

#[test]
fn state_dtype_bf16_from_the_profile_or_the_flag_halves_the_state_pool() {
    let name = profile("qwen3.6-35b-a3b-bf16").display().to_string();
    let text = std::fs::read_to_string(&name).unwrap();
    assert!(text.contains("[serving]\n"), "{name}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bf16-state.toml");
    std::fs::write(
        &path,
        text.replace("[serving]\n", "[serving]\nstate_dtype = \"bf16\"\n"),
    )
    .unwrap();
    let (f32_plan, _) = plan_json(&name, &spark_root());
    let (from_profile, _) = plan_json(&path.display().to_string(), &spark_root());
    let out = sparkrt(&[
        "plan",
        "--profile",
        &name,
        "--host-root",
        &spark_root(),
        "--json",
        "--state-dtype",
        "bf16",
    ]);
    let from_flag = json(&out);
    let state = &f32_plan["recurrent_state"];
    assert_eq!(state["dtype"], "f32");
    // 30 layers × (24,576 + 524,288) values × 4 B, × 48 slots.
    assert_eq!(state["bytes"], 48 * 30 * (24_576 + 524_288) * 4_i64);
    for bf16 in [&from_profile, &from_flag] {
        assert_eq!(bf16["recurrent_state"]["dtype"], "bf16");
        assert_eq!(
            bf16["recurrent_state"]["bytes"],
            48 * 30 * (24_576 + 524_288) * 2_i64
        );
    }
    expect_bad_input(
        &[
            "plan",
            "--profile",
            &name,
            "--host-root",
            &spark_root(),
            "--state-dtype",
            "f16",
        ],
        "not a recurrent-state dtype",
    );
}
