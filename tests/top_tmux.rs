//! End to end: `sparkrt top` in a real terminal (tmux) against a real
//! `sparkrt serve` on the tiny model. `sparkrt top` runs the monitor's own
//! binary, `sparkrt-top`, which reads the host through `sparkrt probe`.
//! Skips with a reason where tmux or `sparkrt-top` is missing, and fails
//! under CI (scripts/ci-deps.sh installs tmux; `cargo test --workspace`
//! builds `sparkrt-top`).

use crate::common;
use crate::server;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use server::Server;

/// The monitor's binary where `sparkrt top` looks first: beside `sparkrt`,
/// where cargo builds it for the tui package's tests (`cargo test
/// --workspace`) and for `cargo build`.
fn monitor_binary() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_sparkrt")).with_file_name("sparkrt-top")
}

/// Whether `sparkrt-top` is built: skips locally with the reason, fails
/// under CI, where `cargo test --workspace` builds it.
fn monitor_built(test: &str) -> bool {
    let monitor = monitor_binary();
    if monitor.is_file() {
        return true;
    }
    let why = format!(
        "no {} (`cargo test --workspace` or `cargo build` builds it)",
        monitor.display()
    );
    assert!(std::env::var_os("CI").is_none(), "{test}: {why}");
    eprintln!("skipped {test}: {why}");
    false
}

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("tmux runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `check` until it returns true or `limit` passes (liveness only).
fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn top_shows_the_pool_and_the_ledger_of_a_running_server() {
    if !common::tool_present("top_tmux", common::missing_command("tmux"))
        || !monitor_built("top_tmux")
    {
        return;
    }
    let server = Server::start(&["--profile", "qwen3-moe-tiny"]);
    let url = server.url.clone();
    let session = format!("sparkrt-top-{}", std::process::id());
    let socket = format!("sparkrt-test-{}", std::process::id());
    let done = std::env::temp_dir().join(format!("{session}.stty"));
    let _ = std::fs::remove_file(&done);
    // After top exits, the shell records the terminal mode: `icanon` means
    // restored. Written aside and renamed, so the file appears complete.
    let command = format!(
        "{} top --url {url} --host-root {} --interval 200ms; stty -a > {done}.tmp; mv {done}.tmp {done}; sleep 30",
        env!("CARGO_BIN_EXE_sparkrt"),
        server::box24().display(),
        done = done.display()
    );
    tmux(&[
        "-L",
        &socket,
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "140",
        "-y",
        "45",
        &command,
    ]);
    let capture = || tmux(&["-L", &socket, "capture-pane", "-p", "-t", &session]);
    let shown = wait_until(Duration::from_secs(30), || {
        let screen = capture();
        screen.contains("server: connected") && screen.contains("kv_cache")
    });
    let screen = capture();
    assert!(shown, "top never showed a connected server:\n{screen}");
    for label in [
        "pool",
        // The plan's headroom, which only the probe's snapshot carries.
        "usable",
        "MemTotal",
        "eviction",
        "weights",
        "moe_workspace",
        "activations",
        "kv_cache",
        "runtime_overhead",
        "page cache",
    ] {
        assert!(screen.contains(label), "{label:?} missing from:\n{screen}");
    }
    // Figures scale to their magnitude: box24's 24 GiB, and the tiny
    // model's plan in MiB (8192 tokens × 2048 bytes = 16 MiB of KV cache;
    // 256 MiB of runtime overhead), never `0.0`.
    assert!(screen.contains("MemTotal 24.0 GiB"), "{screen}");
    let ledger_row = |category: &str| {
        screen
            .lines()
            .find(|l| l.contains(&format!("│{category} ")))
            .unwrap_or_else(|| panic!("no {category} ledger row in:\n{screen}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    for (category, planned) in [("kv_cache", "16.0 MiB"), ("runtime_overhead", "256 MiB")] {
        let row = ledger_row(category);
        assert!(
            row.contains(&format!("{category} {planned} ")),
            "{category} planned {planned}: {row:?} in:\n{screen}"
        );
    }
    tmux(&["-L", &socket, "send-keys", "-t", &session, "q"]);
    let exited = wait_until(Duration::from_secs(15), || done.exists());
    tmux(&["-L", &socket, "kill-server"]);
    assert!(exited, "top did not exit on q");
    let stty = std::fs::read_to_string(&done).unwrap_or_default();
    let _ = std::fs::remove_file(&done);
    assert!(
        stty.split_whitespace().any(|w| w == "icanon") && stty.contains(" echo"),
        "terminal not restored after q: {stty}"
    );
}

#[test]
fn top_fails_before_the_screen_on_bad_flags_and_hosts() {
    if !monitor_built("top_fails_before_the_screen_on_bad_flags_and_hosts") {
        return;
    }
    let out = common::sparkrt(&["top", "--host-root", "/nonexistent-host"]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    let err = common::stderr(&out);
    assert!(
        err.contains("reading the host below /nonexistent-host"),
        "{err}"
    );
    let out = common::sparkrt(&["top", "--interval", "10ms"]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(
        common::stderr(&out).contains("too short"),
        "{}",
        common::stderr(&out)
    );
    let out = common::sparkrt(&["top", "--frobnicate"]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(
        common::stderr(&out).contains("--frobnicate"),
        "{}",
        common::stderr(&out)
    );
}

#[test]
fn top_without_the_monitor_binary_says_how_to_build_it() {
    // sparkrt alone in a folder, and a PATH without sparkrt-top. A hard
    // link, not a copy: a file being written cannot be executed while
    // another test forks (ETXTBSY), and the link is in the same file system.
    let binary = Path::new(env!("CARGO_BIN_EXE_sparkrt"));
    let dir = tempfile::tempdir_in(binary.parent().unwrap()).unwrap();
    let alone = dir.path().join("sparkrt");
    std::fs::hard_link(binary, &alone).unwrap();
    let out = Command::new(&alone)
        .arg("top")
        .env("PATH", dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));
    let err = common::stderr(&out);
    assert!(err.contains("sparkrt-top"), "{err}");
    assert!(err.contains("cargo build --release"), "{err}");
}
