//! Hostile checkpoints, profiles and flags against the real binary: each
//! must end with exit 2 and a message naming the field (or file) and the
//! limit, within seconds and with bounded memory. A regression that hangs
//! or balloons fails here instead of wedging the test run: every child is
//! killed at a deadline, and its peak RSS is its `VmHWM`, polled while it
//! runs (`wait4`'s `ru_maxrss` would count the forked copy of this test
//! process, hundreds of MB while the other tests run beside it).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{fixture, profile};

/// Longest any hostile run may take (the tiny fixture's real runs take
/// well under a second; CI machines are slow).
const DEADLINE: Duration = Duration::from_secs(30);
/// Peak RSS any hostile run may reach (a clean refusal is ~15 MB; the
/// regressions this guards against reached 2–4 GB).
const MAX_RSS_BYTES: u64 = 200 * 1024 * 1024;

struct Run {
    code: Option<i32>,
    stderr: String,
    stdout: String,
    peak_rss_bytes: u64,
    elapsed: Duration,
}

/// Runs `sparkrt args`, killing it at [`DEADLINE`]; stdout and stderr go to
/// files (a full pipe must not block the child while it is polled).
// The child is reaped by `waitpid` (polled with WNOHANG), not by `Child::wait`;
// waiting again after that could reap another test's child reusing the pid.
#[allow(clippy::zombie_processes)]
fn run_bounded(args: &[&str]) -> Run {
    let out = tempfile::tempdir().unwrap();
    let (stdout_path, stderr_path) = (out.path().join("stdout"), out.path().join("stderr"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_sparkrt"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    let start = Instant::now();
    let mut peak_rss_bytes = 0;
    let status = loop {
        // `spawn` returns once the child has exec'd, so this is sparkrt's
        // own high-water mark, not this process's.
        peak_rss_bytes = peak_rss_bytes.max(vm_hwm_bytes(pid).unwrap_or(0));
        let mut status = 0;
        // SAFETY: the pointer is to a live local; `pid` is our own child,
        // reaped only here (std's Child is never waited on).
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(reaped >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if reaped == pid {
            break status;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "sparkrt {args:?} still running after {DEADLINE:?} (killed); stderr: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    Run {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stderr: std::fs::read_to_string(&stderr_path).unwrap(),
        stdout: std::fs::read_to_string(&stdout_path).unwrap(),
        peak_rss_bytes,
        elapsed: start.elapsed(),
    }
}

/// The `VmHWM` (peak resident set) of process `pid`, while it has one.
fn vm_hwm_bytes(pid: libc::pid_t) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `sparkrt args` exits 2, fast and small, saying every one of `names`.
fn refused(args: &[&str], names: &[&str]) -> Run {
    let run = run_bounded(args);
    assert_eq!(
        run.code,
        Some(2),
        "sparkrt {args:?}: stderr {}\nstdout {}",
        run.stderr,
        run.stdout
    );
    for name in names {
        assert!(
            run.stderr.contains(name),
            "sparkrt {args:?}: stderr should name `{name}`: {}",
            run.stderr
        );
    }
    assert!(
        run.peak_rss_bytes < MAX_RSS_BYTES,
        "sparkrt {args:?} peaked at {} bytes",
        run.peak_rss_bytes
    );
    eprintln!(
        "sparkrt {args:?}: exit 2 in {:?}, peak RSS {} KiB",
        run.elapsed,
        run.peak_rss_bytes / 1024
    );
    run
}

/// A copy of the qwen3-moe-tiny fixture (weights and tokenizer linked)
/// whose config.json has `edit` applied.
fn tiny_copy(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = linked_tiny_without_config();
    let text = std::fs::read_to_string(fixture("qwen3-moe-tiny/config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

fn linked_tiny_without_config() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::os::unix::fs::symlink(fixture("qwen3-moe-tiny").join(name), dir.path().join(name))
            .unwrap();
    }
    dir
}

fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: c_path is a valid NUL-terminated string for the call.
    let rc = unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

fn dir_arg(dir: &tempfile::TempDir) -> String {
    dir.path().display().to_string()
}

fn spark_root() -> String {
    fixture("hosts/spark").display().to_string()
}

/// Each geometry edit through `inspect`, `plan --model` and `generate`.
fn refused_everywhere(dir: &tempfile::TempDir, names: &[&str]) {
    let d = dir_arg(dir);
    let tiny = profile("qwen3-moe-tiny").display().to_string();
    let host = spark_root();
    refused(&["inspect", &d], names);
    refused(
        &[
            "plan",
            "--profile",
            &tiny,
            "--model",
            &d,
            "--host-root",
            &host,
        ],
        names,
    );
    refused(
        &[
            "generate",
            "--model",
            &d,
            "--host-root",
            &host,
            "--backend",
            "cpu",
            "--prompt",
            "hi",
            "--max-tokens",
            "1",
        ],
        names,
    );
}

#[test]
fn a_million_layers_in_config_json_is_refused_before_allocating() {
    let dir = tiny_copy(|c| c["num_hidden_layers"] = 1_000_000.into());
    refused_everywhere(
        &dir,
        &["config.json", "`num_hidden_layers`", "1000000", "1024"],
    );
}

#[test]
fn a_million_experts_in_config_json_is_refused() {
    let dir = tiny_copy(|c| c["num_experts"] = 1_000_000.into());
    refused(
        &["inspect", &dir_arg(&dir)],
        &["`num_experts`", "1000000", "4096"],
    );
}

#[test]
fn huge_hidden_and_vocab_and_positions_are_refused() {
    for (key, value, limit) in [
        ("hidden_size", 1u64 << 40, "65536"),
        ("vocab_size", 1 << 40, "4194304"),
        ("max_position_embeddings", 1 << 40, "16777216"),
        ("num_attention_heads", 1 << 20, "2048"),
    ] {
        let dir = tiny_copy(|c| c[key] = value.into());
        refused(
            &["inspect", &dir_arg(&dir)],
            &[&format!("`{key}`"), &value.to_string(), limit],
        );
    }
}

#[test]
fn layers_times_experts_is_bounded_even_when_each_is_within_its_limit() {
    let dir = tiny_copy(|c| {
        c["num_hidden_layers"] = 1024.into();
        c["num_experts"] = 4096.into();
    });
    refused(
        &["inspect", &dir_arg(&dir)],
        &["`num_hidden_layers × num_experts`", "4194304", "262144"],
    );
}

#[test]
fn a_fifo_config_json_is_refused_not_waited_on() {
    let dir = linked_tiny_without_config();
    mkfifo(&dir.path().join("config.json"));
    refused_everywhere(&dir, &["config.json", "is a FIFO, not a regular file"]);
}

#[test]
fn a_directory_where_config_json_should_be_is_refused() {
    let dir = linked_tiny_without_config();
    std::fs::create_dir(dir.path().join("config.json")).unwrap();
    refused(
        &["inspect", &dir_arg(&dir)],
        &["config.json", "is a directory, not a regular file"],
    );
}

#[test]
fn a_fifo_shard_or_tokenizer_is_refused() {
    let dir = tiny_copy(|_| {});
    let shard = dir.path().join("model.safetensors");
    std::fs::remove_file(&shard).unwrap();
    mkfifo(&shard);
    refused(
        &["inspect", &dir_arg(&dir)],
        &["model.safetensors", "is a FIFO, not a regular file"],
    );

    let dir = tiny_copy(|_| {});
    let tokenizer = dir.path().join("tokenizer.json");
    std::fs::remove_file(&tokenizer).unwrap();
    mkfifo(&tokenizer);
    refused(
        &[
            "generate",
            "--model",
            &dir_arg(&dir),
            "--host-root",
            &spark_root(),
            "--backend",
            "cpu",
            "--prompt",
            "hi",
            "--max-tokens",
            "1",
        ],
        &["tokenizer.json", "is a FIFO, not a regular file"],
    );
}

/// The tiny profile with `from` replaced by `to`, written to a temp file.
fn tiny_profile_with(from: &str, to: &str) -> (tempfile::TempDir, String) {
    let text = std::fs::read_to_string(profile("qwen3-moe-tiny")).unwrap();
    assert!(text.contains(from), "{from}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.toml");
    // No model.path: plan from the geometry alone.
    let text = text
        .replace(from, to)
        .replace("path = \"../tests/fixtures/qwen3-moe-tiny\"\n", "");
    std::fs::write(&path, text).unwrap();
    let path = path.display().to_string();
    (dir, path)
}

#[test]
fn a_profile_with_a_trillion_layers_is_refused_not_planned() {
    let (_dir, path) = tiny_profile_with("num_layers = 4", "num_layers = 1000000000000");
    let host = spark_root();
    refused(
        &["plan", "--profile", &path, "--host-root", &host],
        &[
            "hostile.toml:7:1",
            "[model] `num_layers` is 1000000000000, above the limit of 1024",
        ],
    );
    let (_dir, path) = tiny_profile_with("max_num_seqs = 8", "max_num_seqs = 100000000");
    refused(
        &["plan", "--profile", &path, "--host-root", &host],
        &["[serving] `max_num_seqs` is 100000000, above the limit of 65536"],
    );
}

#[test]
fn a_fifo_profile_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.toml");
    mkfifo(&fifo);
    // find_profile only takes files: a FIFO is not found, not waited on.
    refused(
        &[
            "plan",
            "--profile",
            &fifo.display().to_string(),
            "--host-root",
            &spark_root(),
        ],
        &["fifo.toml"],
    );
}

#[test]
fn more_threads_than_cores_are_refused() {
    refused(
        &[
            "generate",
            "--threads",
            "100000",
            "--host-root",
            &spark_root(),
            "--prompt",
            "hi",
            "--max-tokens",
            "1",
        ],
        &["--threads 100000 is above the limit of", "cores available"],
    );
}

#[test]
fn an_error_chain_says_each_cause_once() {
    let dir = tiny_copy(|_| {});
    let shard = dir.path().join("model.safetensors");
    std::fs::remove_file(&shard).unwrap();
    // The length prefix claims more header than the file holds.
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&shard, bytes).unwrap();
    let run = refused(&["inspect", &dir_arg(&dir)], &["runs past the end"]);
    assert_eq!(
        run.stderr.matches("runs past the end").count(),
        1,
        "{}",
        run.stderr
    );
}

/// A copy of the spark host tree (meminfo, kubepods cgroup, kubelet config).
fn spark_copy() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for file in [
        "proc/meminfo",
        "sys/fs/cgroup/kubepods.slice/memory.current",
        "sys/fs/cgroup/kubepods.slice/memory.max",
        "var/lib/kubelet/config.yaml",
    ] {
        let to = root.path().join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(fixture("hosts/spark").join(file), to).unwrap();
    }
    root
}

/// `probe`, `plan` and `serve` with `host` (the host flags) each exit 2 at
/// once, naming every one of `names`. `serve` listens first, so its refusal
/// comes from the plan's host reading, after the port is bound.
fn host_refused_everywhere(host: &[&str], names: &[&str]) {
    let tiny = profile("qwen3-moe-tiny").display().to_string();
    refused(&[&["probe"], host].concat(), names);
    refused(&[&["probe", "--json"], host].concat(), names);
    refused(&[&["plan", "--profile", &tiny], host].concat(), names);
    let serve = [
        "serve",
        "--profile",
        &tiny,
        "--backend",
        "cpu",
        "--port",
        "0",
    ];
    refused(&[&serve[..], host].concat(), names);
}

#[test]
fn dev_zero_as_the_kubelet_config_is_refused_not_read_forever() {
    let host = spark_root();
    host_refused_everywhere(
        &["--host-root", &host, "--kubelet-config", "/dev/zero"],
        &["/dev/zero", "is a character device, not a regular file"],
    );
}

#[test]
fn a_fifo_or_a_directory_as_the_kubelet_config_is_refused_not_waited_on() {
    let root = spark_copy();
    let fifo = root.path().join("kubelet.yaml");
    mkfifo(&fifo);
    let (r, f) = (dir_arg(&root), fifo.display().to_string());
    host_refused_everywhere(
        &["--host-root", &r, "--kubelet-config", &f],
        &[&f, "is a FIFO, not a regular file"],
    );
    // Found where the kubelet keeps it (no flag) rather than named.
    let default = root.path().join("var/lib/kubelet/config.yaml");
    std::fs::remove_file(&default).unwrap();
    mkfifo(&default);
    host_refused_everywhere(
        &["--host-root", &r],
        &[
            "var/lib/kubelet/config.yaml",
            "is a FIFO, not a regular file",
        ],
    );
    std::fs::remove_file(&default).unwrap();
    std::fs::create_dir(&default).unwrap();
    host_refused_everywhere(
        &["--host-root", &r],
        &[
            "var/lib/kubelet/config.yaml",
            "is a directory, not a regular file",
        ],
    );
}

#[test]
fn a_fifo_as_proc_meminfo_or_a_cgroup_file_is_refused_not_waited_on() {
    let root = spark_copy();
    let r = dir_arg(&root);
    let meminfo = root.path().join("proc/meminfo");
    std::fs::remove_file(&meminfo).unwrap();
    mkfifo(&meminfo);
    host_refused_everywhere(
        &["--host-root", &r],
        &["proc/meminfo", "is a FIFO, not a regular file"],
    );
    std::fs::remove_file(&meminfo).unwrap();
    std::fs::copy(fixture("hosts/spark/proc/meminfo"), &meminfo).unwrap();
    let current = root
        .path()
        .join("sys/fs/cgroup/kubepods.slice/memory.current");
    std::fs::remove_file(&current).unwrap();
    mkfifo(&current);
    host_refused_everywhere(
        &["--host-root", &r],
        &["memory.current", "is a FIFO, not a regular file"],
    );
}

#[test]
fn a_huge_kubelet_config_is_refused_at_the_host_file_cap() {
    let root = spark_copy();
    let big = root.path().join("kubelet.yaml");
    // A valid YAML comment, one byte over the cap.
    let mut text = b"#".to_vec();
    text.resize(1024 * 1024 + 1, b'x');
    std::fs::write(&big, text).unwrap();
    let (r, b) = (dir_arg(&root), big.display().to_string());
    host_refused_everywhere(
        &["--host-root", &r, "--kubelet-config", &b],
        &[&b, "1048577 bytes", "1048576 bytes"],
    );
}
