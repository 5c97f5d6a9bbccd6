//! A kernel fault is fatal and named (issue 30): the emulator's
//! EMU_FAULT_KERNEL makes one kernel fault as an illegal address does on a
//! GPU (a sticky error, reported at the next call that waits); `generate`
//! then exits non-zero saying the device is lost, and with
//! SPARKRT_CUDA_SYNC=1 names the kernel. Needs the emulator (a real GPU
//! cannot be made to fault on demand); scripts/cuda-emulator-check.sh runs it.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common;
use crate::cuda_common;
use crate::server::Server;
use crate::server_engine_failure::{exits_with_failure, wait_not_ready};

/// What kernels/emu/driver.cpp's cuDeviceGetName answers.
const EMULATOR: &str = "sparkrt CPU emulator";

fn generate_with_fault(kernel: &str, sync: bool) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_sparkrt"));
    command
        .args([
            "generate",
            "--profile",
            "qwen3-moe-tiny",
            "--prompt-ids",
            "1,2,3,4,5",
            "--max-tokens",
            "4",
            "--json",
            "--backend",
            "cuda",
            "--host-root",
        ])
        .arg(common::fixture("hosts/box24"))
        .env("EMU_FAULT_KERNEL", kernel)
        .env_remove("SPARKRT_CUDA_SYNC");
    if sync {
        command.env("SPARKRT_CUDA_SYNC", "1");
    }
    command.output().expect("the sparkrt binary runs")
}

/// Whether faults can be injected here (the emulator is the libcuda), after
/// printing why not; no GPU at all fails under SPARKRT_REQUIRE_GPU.
fn emulated(test: &str) -> bool {
    if cuda_common::skip(test) {
        return false;
    }
    let name = sparkrt::host::gpu::probe()
        .first()
        .map(|g| g.name.clone())
        .unwrap_or_default();
    if name != EMULATOR {
        eprintln!("skipping {test}: faults are injected by the emulator only, this is {name}");
        return false;
    }
    true
}

#[test]
fn a_kernel_fault_fails_generate_and_sync_names_the_kernel() {
    if !emulated("cuda faults in generate") {
        return;
    }
    for sync in [false, true] {
        let out = generate_with_fault("rmsnorm", sync);
        let stderr = common::stderr(&out);
        assert!(
            !out.status.success(),
            "sync {sync}: a faulting kernel still succeeded: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stderr.contains("the device is lost"), "{stderr}");
        assert!(stderr.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{stderr}");
        if sync {
            assert!(stderr.contains("in kernel rmsnorm"), "{stderr}");
        } else {
            // Without the sync the fault surfaces at a later wait.
            assert!(
                stderr.contains("SPARKRT_CUDA_SYNC names the kernel"),
                "{stderr}"
            );
        }
    }
}

#[test]
fn a_kernel_fault_in_serve_turns_ready_503_and_exits_1() {
    if !emulated("cuda faults in serve") {
        return;
    }
    let mut server = Server::start_with_env(
        &["--backend", "cuda", "--engine-failure-grace-ms", "1500"],
        None,
        &[("EMU_FAULT_KERNEL", "rmsnorm"), ("SPARKRT_CUDA_SYNC", "1")],
    );
    let reply = server.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 4}),
    );
    assert_ne!(reply.status, 200, "{}", reply.body);
    let lost = Instant::now();
    // The first failed step ends the engine (not three in a row).
    let reason = wait_not_ready(&server, "the device is lost");
    assert!(reason.contains("in kernel rmsnorm"), "{reason}");
    assert!(reason.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{reason}");
    assert!(!reason.contains("consecutive"), "{reason}");
    exits_with_failure(
        &mut server,
        lost,
        Duration::from_millis(1000),
        Duration::from_secs(20),
    );
}
