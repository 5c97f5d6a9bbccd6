//! The binary's host source against stand-in probes (shell scripts): it
//! passes the probe its flags, reads one snapshot, and turns every way a
//! probe can go wrong (fails, hangs, writes too much or garbage, is missing)
//! into an error that says so. The real `sparkrt probe --json --snapshot` is
//! tested in the root crate (tests/plan_cli.rs) and end to end by
//! tests/top_tmux.rs.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::canned_host;
use sparkrt_tui::HostSource;
use sparkrt_tui::probe::{ProbeCommand, ProbeError, ProbeTarget};
use sparkrt_wire::PROBE_SNAPSHOT_ARGS;

/// The stand-in probes, written once before any test runs one: a script
/// being written while another thread forks could not be executed
/// (ETXTBSY), so no test writes its own.
struct Probes {
    dir: tempfile::TempDir,
}

impl Probes {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Where the `answers` probe records the arguments it got.
    fn recorded_args(&self) -> PathBuf {
        self.path("args.txt")
    }
}

fn probes() -> &'static Probes {
    static PROBES: OnceLock<Probes> = OnceLock::new();
    PROBES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let answer = dir.path().join("answer.json");
        std::fs::write(&answer, serde_json::to_string(&canned_host()).unwrap()).unwrap();
        let args = dir.path().join("args.txt");
        let scripts = [
            (
                "answers",
                format!(
                    "printf '%s\\n' \"$@\" > '{}'\ncat '{}'",
                    args.display(),
                    answer.display()
                ),
            ),
            (
                "fails",
                "echo 'error: reading the host below /nowhere: no /proc/meminfo' >&2\nexit 2"
                    .to_string(),
            ),
            ("hangs", "sleep 30".to_string()),
            ("garbage", "echo 'MemTotal: 12 kB'".to_string()),
            ("floods", "head -c 20000 /dev/zero | tr '\\0' x".to_string()),
        ];
        for (name, body) in scripts {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Probes { dir }
    })
}

fn target() -> ProbeTarget {
    ProbeTarget {
        host_root: PathBuf::from("/srv/fake-host"),
        kubelet_config: Some(PathBuf::from("/srv/kubelet.yaml")),
        profile: Some("qwen3-moe-tiny".to_string()),
    }
}

fn probe(name: &str) -> ProbeCommand {
    ProbeCommand::new(probes().path(name), &target())
}

#[test]
fn the_probe_gets_its_flags_and_its_snapshot_is_the_reading() {
    let snapshot = probe("answers").snapshot().unwrap();
    // `usable` too: the pool's usable line comes from the probe.
    assert_eq!(snapshot, canned_host());
    let args = std::fs::read_to_string(probes().recorded_args()).unwrap();
    let mut expected: Vec<&str> = PROBE_SNAPSHOT_ARGS.to_vec();
    expected.extend([
        "--host-root",
        "/srv/fake-host",
        "--kubelet-config",
        "/srv/kubelet.yaml",
        "--profile",
        "qwen3-moe-tiny",
    ]);
    assert_eq!(args.lines().collect::<Vec<_>>(), expected);
}

#[test]
fn a_failing_probe_says_why_with_its_exit_code() {
    let error = probe("fails").snapshot().unwrap_err();
    assert_eq!(error.exit_code(), Some(2));
    let text = error.to_string();
    assert!(
        text.ends_with(": reading the host below /nowhere: no /proc/meminfo"),
        "{text}"
    );
    // The host panel shows the same text.
    assert_eq!(probe("fails").read(), Err(text));
}

#[test]
fn a_hanging_probe_is_killed_at_the_deadline() {
    let started = Instant::now();
    let error = probe("hangs")
        .with_timeout(Duration::from_millis(200))
        .snapshot()
        .unwrap_err();
    assert!(matches!(error, ProbeError::TimedOut { .. }), "{error}");
    // Far below the script's 30 s: it was killed, not waited for.
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(error.exit_code(), None);
}

#[test]
fn garbage_and_floods_are_refused() {
    let error = probe("garbage").snapshot().unwrap_err();
    assert!(matches!(error, ProbeError::Json { .. }), "{error}");
    let error = probe("floods").snapshot().unwrap_err();
    assert!(matches!(error, ProbeError::TooLarge { .. }), "{error}");
}

#[test]
fn a_missing_probe_is_named() {
    let missing = Path::new("/nonexistent/sparkrt");
    let error = ProbeCommand::new(missing.to_path_buf(), &target())
        .snapshot()
        .unwrap_err();
    assert!(matches!(error, ProbeError::Spawn { .. }), "{error}");
    assert!(
        error.to_string().contains("/nonexistent/sparkrt"),
        "{error}"
    );
}
