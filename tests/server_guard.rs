//! The memory guard of `sparkrt serve` against a fake host whose
//! `/proc/meminfo` the test rewrites: below `eviction_hard + safety_margin`
//! the server refuses new work (503 + Retry-After, `/ready` 503) and admits
//! again only once MemAvailable is a safety margin above that line.

use crate::server;

use std::path::Path;

use serde_json::json;
use server::Server;

const GIB_KB: u64 = 1024 * 1024;
const MIB_KB: u64 = 1024;

/// A fake host below `root` whose guard is not tripped: 16 GiB MemTotal,
/// 12 GiB available, and a kubelet whose evictionHard is 1 GiB.
pub(crate) fn write_host_with_kubelet(root: &Path) {
    write_meminfo(root, 16 * GIB_KB, 12 * GIB_KB);
    std::fs::create_dir_all(root.join("var/lib/kubelet")).unwrap();
    std::fs::write(
        root.join("var/lib/kubelet/config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         evictionHard:\n  memory.available: 1Gi\n",
    )
    .unwrap();
}

/// Replaces `/proc/meminfo` below `root` in one rename, so the guard never
/// reads a half-written file.
pub(crate) fn write_meminfo(root: &Path, total_kb: u64, available_kb: u64) {
    let proc = root.join("proc");
    std::fs::create_dir_all(&proc).unwrap();
    let text = format!(
        "MemTotal: {total_kb} kB\nMemFree: {} kB\nMemAvailable: {available_kb} kB\n\
         Buffers: 1024 kB\nCached: 4096 kB\nShmem: 0 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n",
        available_kb / 2
    );
    let staging = proc.join("meminfo.new");
    std::fs::write(&staging, text).unwrap();
    std::fs::rename(&staging, proc.join("meminfo")).unwrap();
}

#[test]
fn the_guard_refuses_below_the_line_and_admits_again_above_the_resume_line() {
    let host = tempfile::tempdir().unwrap();
    let root = host.path();
    let total_kb = 16 * GIB_KB;
    write_host_with_kubelet(root);
    let server = Server::start(&[
        "--host-root",
        root.to_str().unwrap(),
        "--guard-interval-ms",
        "50",
    ]);

    // eviction_hard 1 GiB + the tiny profile's safety_margin 512 MiB; the
    // guard resumes one more safety margin above.
    let threshold = (GIB_KB + 512 * MIB_KB) * 1024;
    let resume = threshold + 512 * MIB_KB * 1024;
    let memory = server.get("/v1/memory").json();
    assert_eq!(memory["guard"]["threshold_bytes"], threshold);
    assert_eq!(memory["guard"]["resume_bytes"], resume);
    assert_eq!(memory["guard"]["tripped"], false);
    assert_eq!(memory["host"]["eviction_hard"], GIB_KB * 1024);

    let request = json!({"prompt": "Hello", "max_tokens": 2});
    let admitted = |what: &str| {
        let reply = server.post("/v1/completions", &request);
        assert_eq!(reply.status, 200, "{what}: {}", reply.body);
    };
    let refused = |what: &str| {
        let reply = server.post("/v1/completions", &request);
        let error = reply.assert_error(503);
        assert_eq!(error["code"], "memory_guard", "{what}");
        let retry: u64 = reply
            .header("retry-after")
            .expect("Retry-After on a 503")
            .parse()
            .expect("Retry-After in seconds");
        assert!(retry > 0);
        let chat = server.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
        );
        chat.assert_error(503);
    };
    admitted("plenty of memory");

    // One MiB below the line: tripped.
    let below = threshold / 1024 - MIB_KB;
    write_meminfo(root, total_kb, below);
    server.wait_until("/ready fails", || server.get("/ready").status == 503);
    refused("below the line");
    let ready = server.get("/ready").json();
    assert_eq!(ready["memory_guard_tripped"], true);
    assert_eq!(ready["loaded"], true);
    assert_eq!(server.get("/health").status, 200, "alive all the same");
    let m = server.metrics();
    assert_eq!(m.get("sparkrt_guard_tripped"), 1.0);
    assert_eq!(
        m.get("sparkrt_host_mem_available_bytes"),
        (below * 1024) as f64
    );
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"rejected\"}"), 2.0);

    // Back above the line but below the resume line: still tripped
    // (hysteresis). The guard has read the new figure once /v1/memory
    // shows it; it decides on the same reading.
    let between = (threshold + resume) / 2 / 1024;
    write_meminfo(root, total_kb, between);
    server.wait_until("the guard reads the new figure", || {
        server.get("/v1/memory").json()["host"]["mem_available"] == between * 1024
    });
    assert_eq!(server.get("/v1/memory").json()["guard"]["tripped"], true);
    assert_eq!(server.get("/ready").status, 503);
    refused("between the line and the resume line");

    // At the resume line: admits again.
    write_meminfo(root, total_kb, resume / 1024);
    server.wait_until("/ready recovers", || server.get("/ready").status == 200);
    admitted("recovered");
    let m = server.metrics();
    assert_eq!(m.get("sparkrt_guard_tripped"), 0.0);
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"ok\"}"), 2.0);
}

/// A fake host with plenty of memory and a kubelet-free tree.
fn healthy_host(root: &Path) {
    write_meminfo(root, 16 * GIB_KB, 12 * GIB_KB);
}

fn refused_by_the_guard(server: &Server) {
    let reply = server.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    );
    let error = reply.assert_error(503);
    assert_eq!(error["code"], "memory_guard");
}

#[test]
fn an_unreadable_or_garbage_meminfo_trips_the_guard_and_says_why() {
    let host = tempfile::tempdir().unwrap();
    let root = host.path();
    healthy_host(root);
    let server = Server::start(&[
        "--host-root",
        root.to_str().unwrap(),
        "--guard-interval-ms",
        "50",
    ]);
    assert_eq!(server.get("/v1/memory").json()["guard"]["tripped"], false);
    assert!(server.get("/v1/memory").json()["guard"]["reason"].is_null());

    // Garbage: fail closed, with the reason.
    let meminfo = root.join("proc/meminfo");
    std::fs::write(root.join("proc/meminfo.new"), "MemTotal: plenty\n").unwrap();
    std::fs::rename(root.join("proc/meminfo.new"), &meminfo).unwrap();
    server.wait_until("/ready fails", || server.get("/ready").status == 503);
    refused_by_the_guard(&server);
    let guard = &server.get("/v1/memory").json()["guard"];
    assert_eq!(guard["tripped"], true);
    let reason = guard["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("cannot read the host's memory") && reason.contains("meminfo"),
        "{reason}"
    );
    assert_eq!(server.metrics().get("sparkrt_guard_tripped"), 1.0);

    // Gone altogether: still tripped.
    std::fs::remove_file(&meminfo).unwrap();
    server.wait_until("the reason names the missing file", || {
        server.get("/v1/memory").json()["guard"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("cannot read") && !r.contains("plenty"))
    });
    refused_by_the_guard(&server);

    // Readable again: admits.
    healthy_host(root);
    server.wait_until("/ready recovers", || server.get("/ready").status == 200);
    assert!(server.get("/v1/memory").json()["guard"]["reason"].is_null());
    let log = server.log();
    assert_eq!(
        log.matches("memory guard tripped").count(),
        1,
        "logged once per transition: {log}"
    );
}

#[test]
fn the_servers_own_cgroup_near_its_limit_trips_the_guard() {
    let host = tempfile::tempdir().unwrap();
    let root = host.path();
    healthy_host(root);
    std::fs::create_dir_all(root.join("proc/self")).unwrap();
    std::fs::write(
        root.join("proc/self/cgroup"),
        "0::/system.slice/sparkrt.service\n",
    )
    .unwrap();
    let cgroup = root.join("sys/fs/cgroup/system.slice/sparkrt.service");
    std::fs::create_dir_all(&cgroup).unwrap();
    let max = 8 * GIB_KB * 1024;
    std::fs::write(cgroup.join("memory.max"), format!("{max}\n")).unwrap();
    let set_current = |bytes: u64| {
        std::fs::write(cgroup.join("memory.current.new"), format!("{bytes}\n")).unwrap();
        std::fs::rename(
            cgroup.join("memory.current.new"),
            cgroup.join("memory.current"),
        )
        .unwrap();
    };
    set_current(GIB_KB * 1024);
    let server = Server::start(&[
        "--host-root",
        root.to_str().unwrap(),
        "--guard-interval-ms",
        "50",
    ]);
    let guard = &server.get("/v1/memory").json()["guard"];
    assert_eq!(guard["tripped"], false);
    assert_eq!(guard["cgroup_in_use"], GIB_KB * 1024);
    assert_eq!(guard["cgroup_max"], max);

    // Within the tiny profile's safety margin (512 MiB) of memory.max.
    let near = max - 100 * MIB_KB * 1024;
    set_current(near);
    server.wait_until("/ready fails", || server.get("/ready").status == 503);
    refused_by_the_guard(&server);
    let guard = &server.get("/v1/memory").json()["guard"];
    assert_eq!(guard["cgroup_in_use"], near);
    let reason = guard["reason"].as_str().unwrap();
    assert!(reason.contains("memory.max"), "{reason}");

    set_current(GIB_KB * 1024);
    server.wait_until("/ready recovers", || server.get("/ready").status == 200);
}
