//! `install.sh` run into staging trees (`--root`), against the fake Spark host
//! tree: what it writes, with which modes, the unit's text, idempotence,
//! `--uninstall`, `--dry-run`, a plan that does not fit, and the linters
//! (shellcheck, `systemd-analyze verify`) where they are installed.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

const BINARY: &str = env!("CARGO_BIN_EXE_sparkrt");
/// What the stand-in `sparkrt-top` holds: install.sh copies the monitor's
/// binary but never runs it.
const MONITOR_STAND_IN: &str = "#!/bin/sh\necho 'stand-in for sparkrt-top'\n";

/// A folder laid out like `target/release/`: `sparkrt` (a hard link to the
/// test build's, so the folder is in the target's file system) and
/// `sparkrt-top` beside it, the stand-in. Without a monitor, only `sparkrt`.
fn binaries(with_monitor: bool) -> tempfile::TempDir {
    let build = Path::new(BINARY).parent().unwrap();
    let dir = tempfile::tempdir_in(build).unwrap();
    std::fs::hard_link(BINARY, dir.path().join("sparkrt")).unwrap();
    if with_monitor {
        let monitor = dir.path().join("sparkrt-top");
        std::fs::write(&monitor, MONITOR_STAND_IN).unwrap();
        std::fs::set_permissions(&monitor, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

fn spark_root() -> String {
    fixture("hosts/spark").display().to_string()
}

fn tiny_model() -> String {
    fixture("qwen3-moe-tiny").display().to_string()
}

/// Runs install.sh with a staging root, the fake Spark host and the test
/// build's binaries, plus `args`.
fn install(root: &Path, args: &[&str]) -> Output {
    let binaries = binaries(true);
    Command::new(repo().join("install.sh"))
        .arg("--root")
        .arg(root)
        .arg("--binary")
        .arg(binaries.path().join("sparkrt"))
        .args(["--host-root", &spark_root()])
        .args(args)
        .output()
        .expect("install.sh runs")
}

fn install_tiny(root: &Path, extra: &[&str]) -> Output {
    let model = tiny_model();
    let mut args = vec!["--profile", "qwen3-moe-tiny", "--model-dir", &model];
    args.extend_from_slice(extra);
    install(root, &args)
}

fn uninstall(root: &Path, extra: &[&str]) -> Output {
    Command::new(repo().join("install.sh"))
        .arg("--uninstall")
        .arg("--root")
        .arg(root)
        .args(extra)
        .output()
        .expect("install.sh runs")
}

fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
}

/// One entry of a tree: its kind and mode, its content or link target, and
/// its inode and (for files) mtime, so a rewrite with identical bytes shows.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    kind: &'static str,
    mode: u32,
    content: Vec<u8>,
    inode: u64,
    mtime_ns: i128,
}

/// Every path below `root` (relative, starting with `/`), with its entry.
fn snapshot(root: &Path) -> BTreeMap<String, Entry> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Entry>) {
        for item in std::fs::read_dir(dir).unwrap() {
            let path = item.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let (kind, content) = if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                ("link", target.into_os_string().into_encoded_bytes())
            } else if meta.is_dir() {
                ("dir", Vec::new())
            } else {
                ("file", std::fs::read(&path).unwrap())
            };
            let relative = format!("/{}", path.strip_prefix(root).unwrap().display());
            out.insert(
                relative,
                Entry {
                    kind,
                    mode: meta.permissions().mode() & 0o7777,
                    content,
                    inode: meta.ino(),
                    // A folder's mtime moves whenever an entry comes or goes.
                    mtime_ns: if kind == "dir" {
                        0
                    } else {
                        meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128
                    },
                },
            );
            if kind == "dir" {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn read(root: &Path, path: &str) -> String {
    std::fs::read_to_string(root.join(path.trim_start_matches('/')))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn mode(root: &Path, path: &str) -> u32 {
    let meta = std::fs::metadata(root.join(path.trim_start_matches('/'))).unwrap();
    meta.permissions().mode() & 0o7777
}

/// The unit's `Key=value` lines (several values per key kept in order).
fn unit_directives(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.starts_with('[') {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            out.entry(key.to_string())
                .or_default()
                .push(value.to_string());
        }
    }
    out
}

fn repo_profiles() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("profiles"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn installs_the_binaries_profiles_config_and_a_hardened_unit() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let passwd_before = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let out = install_tiny(root, &[]);
    assert_ok(&out);
    let text = stdout(&out);

    // The binary, byte for byte, executable.
    assert_eq!(
        std::fs::read(root.join("usr/local/bin/sparkrt")).unwrap(),
        std::fs::read(BINARY).unwrap()
    );
    assert_eq!(mode(root, "/usr/local/bin/sparkrt"), 0o755);
    // The monitor `sparkrt top` runs, beside it.
    assert_eq!(read(root, "/usr/local/bin/sparkrt-top"), MONITOR_STAND_IN);
    assert_eq!(mode(root, "/usr/local/bin/sparkrt-top"), 0o755);

    // Every shipped profile.
    for profile in repo_profiles() {
        let name = profile.file_name().unwrap().to_str().unwrap();
        let installed = format!("/etc/sparkrt/profiles/{name}");
        assert_eq!(
            read(root, &installed),
            std::fs::read_to_string(&profile).unwrap()
        );
        assert_eq!(mode(root, &installed), 0o644);
    }

    // The config names the profile and the model folder; loopback by default.
    let env = read(root, "/etc/sparkrt/sparkrt.env");
    assert_eq!(mode(root, "/etc/sparkrt/sparkrt.env"), 0o644);
    for line in [
        "SPARKRT_PROFILE=/etc/sparkrt/profiles/qwen3-moe-tiny.toml".to_string(),
        format!("SPARKRT_MODEL_DIR={}", tiny_model()),
        "SPARKRT_HOST=127.0.0.1".to_string(),
        "SPARKRT_PORT=8000".to_string(),
        // The fake Spark has a kubelet: the preflight must not ignore it.
        "SPARKRT_PLAN_ARGS=--kubelet-config /var/lib/kubelet/config.yaml".to_string(),
        "SPARKRT_SERVE_ARGS=".to_string(),
    ] {
        assert!(env.lines().any(|l| l == line), "{line:?} in:\n{env}");
    }

    // The unit.
    let unit_text = read(root, "/etc/systemd/system/sparkrt.service");
    assert_eq!(mode(root, "/etc/systemd/system/sparkrt.service"), 0o644);
    let unit = unit_directives(&unit_text);
    let one = |key: &str| -> &str {
        let values = unit
            .get(key)
            .unwrap_or_else(|| panic!("no {key}= in:\n{unit_text}"));
        assert_eq!(values.len(), 1, "{key}: {values:?}");
        &values[0]
    };
    assert_eq!(one("User"), "sparkrt");
    assert_eq!(one("Group"), "sparkrt");
    assert_eq!(one("Restart"), "on-failure");
    assert!(one("StartLimitBurst").parse::<u32>().unwrap() > 0);
    assert!(one("StartLimitIntervalSec").parse::<u32>().unwrap() > 0);
    assert_eq!(one("NoNewPrivileges"), "yes");
    assert_eq!(one("ProtectSystem"), "strict");
    assert_eq!(one("ProtectHome"), "tmpfs");
    assert_eq!(one("PrivateTmp"), "yes");
    assert_eq!(one("BindReadOnlyPaths"), tiny_model());
    assert_eq!(one("CacheDirectory"), "sparkrt");
    assert_eq!(one("Environment"), "SPARKRT_CACHE_DIR=%C/sparkrt");
    assert_eq!(one("EnvironmentFile"), "/etc/sparkrt/sparkrt.env");
    assert_eq!(
        one("ExecStartPre"),
        "/usr/local/bin/sparkrt plan --profile ${SPARKRT_PROFILE} --model ${SPARKRT_MODEL_DIR} $SPARKRT_PLAN_ARGS"
    );
    assert_eq!(
        one("ExecStart"),
        "/usr/local/bin/sparkrt serve --profile ${SPARKRT_PROFILE} --model ${SPARKRT_MODEL_DIR} --host ${SPARKRT_HOST} --port ${SPARKRT_PORT} $SPARKRT_SERVE_ARGS"
    );
    assert_eq!(one("WantedBy"), "multi-user.target");
    assert!(
        !unit.contains_key("PrivateDevices"),
        "the GPU lives in /dev"
    );

    // Enabled the way `systemctl enable` does it, inside the staging tree.
    assert_eq!(
        std::fs::read_link(root.join("etc/systemd/system/multi-user.target.wants/sparkrt.service"))
            .unwrap(),
        Path::new("/etc/systemd/system/sparkrt.service")
    );

    // Allocatable memory from the fake kubelet config, computed by hand:
    // MemTotal 127,605,452 kB − 2 GiB − 1 GiB − 5% of MemTotal (truncated).
    let mem_total: u64 = 127_605_452 * 1024;
    let allocatable = mem_total - (3 << 30) - mem_total / 20;
    let expected = format!(
        "node allocatable memory {:.2} GiB",
        allocatable as f64 / (1u64 << 30) as f64
    );
    assert!(text.contains(&expected), "{expected:?} in:\n{text}");
    assert!(text.contains("preflight: FITS"), "{text}");

    // Nothing happened on the real host: the user is only announced.
    assert!(text.contains("would run on the host: useradd"), "{text}");
    assert_eq!(
        std::fs::read_to_string("/etc/passwd").unwrap_or_default(),
        passwd_before
    );

    // The manifest lists exactly what is in the tree.
    let manifest = read(root, "/etc/sparkrt/install-manifest");
    let listed: BTreeSet<String> = manifest
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_once(' ').unwrap().1.to_string())
        .collect();
    let present: BTreeSet<String> = snapshot(root).into_keys().collect();
    assert_eq!(listed, present);
}

#[test]
fn a_second_run_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    assert_ok(&install_tiny(dir.path(), &[]));
    let first = snapshot(dir.path());
    let out = install_tiny(dir.path(), &[]);
    assert_ok(&out);
    assert_eq!(snapshot(dir.path()), first);
    assert!(
        stdout(&out).contains("done: 0 change(s)"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_changed_option_rewrites_only_the_config() {
    let dir = tempfile::tempdir().unwrap();
    assert_ok(&install_tiny(dir.path(), &[]));
    let first = snapshot(dir.path());
    let out = install_tiny(
        dir.path(),
        &[
            "--listen",
            "0.0.0.0",
            "--port",
            "9000",
            "--api-key-file",
            "/etc/sparkrt/api-key",
        ],
    );
    assert_ok(&out);
    let second = snapshot(dir.path());
    let changed: Vec<&String> = first
        .iter()
        .filter(|(path, entry)| second.get(*path) != Some(entry))
        .map(|(path, _)| path)
        .collect();
    assert_eq!(changed, ["/etc/sparkrt/sparkrt.env"]);
    let env = read(dir.path(), "/etc/sparkrt/sparkrt.env");
    assert!(env.contains("\nSPARKRT_HOST=0.0.0.0\n"), "{env}");
    assert!(env.contains("\nSPARKRT_PORT=9000\n"), "{env}");
    assert!(
        env.contains("\nSPARKRT_SERVE_ARGS=--api-key-file /etc/sparkrt/api-key\n"),
        "{env}"
    );
}

#[test]
fn uninstall_removes_everything_it_added_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A host that already has some of the folders, and files of its own.
    std::fs::create_dir_all(root.join("usr/local/bin")).unwrap();
    std::fs::write(root.join("usr/local/bin/other-tool"), "#!/bin/sh\n").unwrap();
    std::fs::create_dir_all(root.join("etc/systemd/system")).unwrap();
    std::fs::write(root.join("etc/hostname"), "spark-01\n").unwrap();
    std::fs::create_dir_all(root.join("var/cache")).unwrap();
    let before = snapshot(root);

    assert_ok(&install_tiny(root, &[]));
    // The service would have filled its cache directory.
    std::fs::create_dir_all(root.join("var/cache/sparkrt/nvrtc")).unwrap();
    std::fs::write(root.join("var/cache/sparkrt/nvrtc/k.cubin"), [0u8; 16]).unwrap();

    let out = uninstall(root, &[]);
    assert_ok(&out);
    assert_eq!(snapshot(root), before);
    assert!(
        stdout(&out).contains("would run on the host: systemctl disable --now sparkrt.service"),
        "{}",
        stdout(&out)
    );

    // Nothing left to do the second time.
    let again = uninstall(root, &[]);
    assert_ok(&again);
    assert!(stdout(&again).contains("nothing to uninstall"));
}

#[test]
fn dry_run_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let out = install_tiny(root, &["--dry-run"]);
    assert_ok(&out);
    assert!(snapshot(root).is_empty(), "{:?}", snapshot(root));
    let text = stdout(&out);
    for action in [
        "would write /usr/local/bin/sparkrt (mode 0755)",
        "would write /usr/local/bin/sparkrt-top (mode 0755)",
        "would write /etc/systemd/system/sparkrt.service (mode 0644)",
        "would enable",
    ] {
        assert!(text.contains(action), "{action:?} in:\n{text}");
    }

    // Over an existing install, with other options, and when uninstalling.
    assert_ok(&install_tiny(root, &[]));
    let installed = snapshot(root);
    assert_ok(&install_tiny(root, &["--dry-run", "--port", "9999"]));
    assert_ok(&uninstall(root, &["--dry-run"]));
    assert_eq!(snapshot(root), installed);
}

#[test]
fn a_plan_that_does_not_fit_installs_and_enables_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = install(
        dir.path(),
        &[
            "--profile",
            "qwen3-235b-a22b-nvfp4",
            "--model-dir",
            "/srv/models/qwen3-235b",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    assert!(snapshot(dir.path()).is_empty());
    let text = stdout(&out);
    assert!(text.contains("DOES NOT FIT"), "the plan is printed: {text}");
    assert!(!text.contains("enable"), "{text}");
    assert!(stderr(&out).contains("nothing was installed or enabled"));
}

#[test]
fn bad_options_are_exit_2_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model();
    let without_monitor = binaries(false);
    let alone = without_monitor.path().join("sparkrt");
    let alone = alone.to_str().unwrap();
    for (args, needle) in [
        (vec!["--model-dir", model.as_str()], "--profile is required"),
        (
            vec!["--profile", "qwen3-moe-tiny"],
            "--model-dir is required",
        ),
        (
            vec!["--profile", "qwen3-moe-tiny", "--model-dir", "models/tiny"],
            "absolute path",
        ),
        (
            vec![
                "--profile",
                "qwen3-moe-tiny",
                "--model-dir",
                "/srv/my models",
            ],
            "cannot carry",
        ),
        (
            vec![
                "--profile",
                "qwen3-moe-tiny",
                "--model-dir",
                &model,
                "--port",
                "70000",
            ],
            "--port",
        ),
        (
            vec!["--profile", "no-such-profile", "--model-dir", &model],
            "no profile",
        ),
        (vec!["--frobnicate"], "unknown option"),
        (
            vec![
                "--profile",
                "qwen3-moe-tiny",
                "--model-dir",
                &model,
                "--binary",
                alone,
            ],
            "no executable sparkrt-top beside it",
        ),
        (
            vec![
                "--profile",
                "qwen3-moe-tiny",
                "--model-dir",
                &model,
                "--listen",
                "0.0.0.0",
            ],
            "not loopback",
        ),
    ] {
        let out = install(dir.path(), &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(needle),
            "{needle:?} in {}",
            stderr(&out)
        );
    }
    assert!(snapshot(dir.path()).is_empty());
}

#[test]
fn shellcheck_passes() {
    if !tool_present("shellcheck_passes", missing_command("shellcheck")) {
        return;
    }
    let out = Command::new("shellcheck")
        .current_dir(repo())
        .args(["install.sh", "scripts/ci-deps.sh"])
        .output()
        .unwrap();
    assert_ok(&out);
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    if !tool_present(
        "systemd_analyze_verifies_the_unit",
        missing_command("systemd-analyze"),
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    assert_ok(&install_tiny(root, &[]));
    // verify checks that ExecStart's program exists: point it at the staged copy.
    let staged = root.join("usr/local/bin/sparkrt");
    let unit = read(root, "/etc/systemd/system/sparkrt.service")
        .replace("/usr/local/bin/sparkrt", staged.to_str().unwrap());
    let check = tempfile::tempdir().unwrap();
    let unit_path = check.path().join("sparkrt.service");
    std::fs::write(&unit_path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit_path)
        .output()
        .unwrap();
    assert_ok(&out);
    // Unknown keys and bad values are warnings with exit 0: there must be none.
    assert_eq!(stderr(&out).trim(), "", "systemd-analyze verify warned");
}

#[test]
fn a_public_listen_address_without_a_key_needs_the_insecure_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = install_tiny(
        dir.path(),
        &["--listen", "0.0.0.0", "--insecure-no-api-key"],
    );
    assert_ok(&out);
    assert!(
        stderr(&out).contains("--insecure-no-api-key"),
        "{}",
        stderr(&out)
    );
    let env = read(dir.path(), "/etc/sparkrt/sparkrt.env");
    assert!(
        env.contains("\nSPARKRT_SERVE_ARGS=--insecure-no-api-key\n"),
        "{env}"
    );
    // Loopback in every spelling serve accepts needs neither.
    for listen in ["::1", "[::1]", "localhost", "127.0.0.2"] {
        let dir = tempfile::tempdir().unwrap();
        let out = install_tiny(dir.path(), &["--listen", listen]);
        assert_ok(&out);
        assert!(
            !stderr(&out).contains("api-key"),
            "{listen}: {}",
            stderr(&out)
        );
        let env = read(dir.path(), "/etc/sparkrt/sparkrt.env");
        assert!(env.contains("\nSPARKRT_SERVE_ARGS=\n"), "{listen}: {env}");
    }
}
