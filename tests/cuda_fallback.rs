//! Choosing the device: `--backend auto` runs on the CPU with one log line
//! saying why when there is no usable GPU (and on CUDA, with the same greedy
//! ids, when there is); `--backend cuda` without a GPU is a clear error, not
//! a panic.

use crate::common;

fn generate(backend: &str) -> std::process::Output {
    generate_with(backend, &[])
}

fn generate_with(backend: &str, extra: &[&str]) -> std::process::Output {
    let host = common::fixture("hosts/box24");
    let mut args = vec![
        "generate",
        "--profile",
        "qwen3-moe-tiny",
        "--prompt-ids",
        "1,2,3,4,5",
        "--max-tokens",
        "6",
        "--json",
        "--backend",
        backend,
        "--host-root",
        host.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    common::sparkrt(&args)
}

fn token_ids(out: &std::process::Output) -> Vec<u64> {
    common::json(out)["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn auto_falls_back_to_the_cpu_with_one_line_or_uses_the_gpu() {
    let cpu = generate("cpu");
    assert!(cpu.status.success(), "{}", common::stderr(&cpu));
    let auto = generate("auto");
    assert!(auto.status.success(), "{}", common::stderr(&auto));
    let stderr = common::stderr(&auto);
    let fallback_lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("backend auto"))
        .collect();
    match cuda_gpu() {
        None => {
            assert_eq!(fallback_lines.len(), 1, "{stderr}");
            assert!(fallback_lines[0].contains("running on the CPU"), "{stderr}");
        }
        Some(name) => eprintln!("a GPU is present ({name}): auto ran on it"),
    }
    // Greedy ids are the same on either device.
    assert_eq!(token_ids(&auto), token_ids(&cpu));
    assert!(!stderr.contains("panicked"));
}

#[test]
fn cuda_without_a_gpu_is_a_clear_error() {
    if let Some(name) = cuda_gpu() {
        eprintln!("skipping: a GPU is present ({name})");
        return;
    }
    let out = generate("cuda");
    let stderr = common::stderr(&out);
    assert!(
        matches!(out.status.code(), Some(1 | 2)),
        "{:?}: {stderr}",
        out.status
    );
    assert!(stderr.contains("CUDA backend cannot start"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_weights_policy_is_a_cuda_request_never_dropped_on_the_cpu() {
    let refused = |out: &std::process::Output, policy: &str| {
        let stderr = common::stderr(out);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "--weights-policy {policy} applies to the CUDA backend"
            )),
            "{stderr}"
        );
    };
    for policy in ["copy", "register", "map"] {
        refused(&generate_with("cpu", &["--weights-policy", policy]), policy);
    }
    // `auto` on a host without a GPU would run on the CPU: refused too.
    let auto = generate_with("auto", &["--weights-policy", "copy"]);
    match cuda_gpu() {
        None => refused(&auto, "copy"),
        Some(name) => {
            assert!(auto.status.success(), "{name}: {}", common::stderr(&auto));
            assert_eq!(token_ids(&auto), token_ids(&generate("cpu")));
        }
    }
    assert!(
        generate_with("cpu", &["--weights-policy", "auto"])
            .status
            .success()
    );
}

fn cuda_gpu() -> Option<String> {
    sparkrt::host::gpu::probe().first().map(|g| g.name.clone())
}
