//! End to end: `sparkrt top` in a real terminal (tmux) against a real
//! `sparkrt serve` on the tiny model. Skips with a reason where tmux is
//! missing (scripts/ci-deps.sh installs it in CI).

use crate::common;
use crate::server;

use std::process::Command;
use std::time::{Duration, Instant};

use server::Server;

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
    if !common::tool_present("top_tmux", common::missing_command("tmux")) {
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
