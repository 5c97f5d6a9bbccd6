//! The load phase of `serve`: the server listens while the weights are read
//! in, `/ready` is 503 with the reason until they are, `/health` and
//! `/v1/memory` carry the `loading` section, a shard truncated during
//! loading is an error naming it, and SIGTERM during loading ends the
//! process. Loading is slowed with the test-only
//! `--load-throttle-bytes-per-s` (documented in README "Cold start").

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::server::{LIVENESS, THREADS, box24, repo};

/// The tiny fixture's weights: 4 MB, read in one piece.
fn tiny_model() -> PathBuf {
    repo().join("tests/fixtures/qwen3-moe-tiny")
}

/// A `serve` seen from before its weights are loaded.
struct Loading {
    child: Child,
    url: String,
    log: Arc<Mutex<String>>,
    agent: ureq::Agent,
}

impl Loading {
    /// Starts `serve ARGS` and returns once it says where it answers while
    /// loading.
    fn start(args: &[&str]) -> Loading {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sparkrt"))
            .args(["serve", "--port", "0", "--threads", THREADS, "--host-root"])
            .arg(box24())
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (url_tx, url_rx) = mpsc::channel();
        {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some((_, url)) = line.split_once("/v1/memory answer on ") {
                        let _ = url_tx.send(url.to_string());
                    }
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        let url = url_rx.recv_timeout(LIVENESS).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("no loading line; stderr:\n{}", log.lock().unwrap())
        });
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(LIVENESS))
            .build()
            .into();
        Loading {
            child,
            url,
            log,
            agent,
        }
    }

    fn get(&self, path: &str) -> (u16, Value) {
        let mut response = self
            .agent
            .get(&format!("{}{path}", self.url))
            .call()
            .unwrap();
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().unwrap();
        let json = serde_json::from_str(&body).unwrap_or(Value::String(body));
        (status, json)
    }

    /// Polls `/health` until the loading phase is `phase`.
    fn wait_for_phase(&self, phase: &str) -> Value {
        let start = Instant::now();
        loop {
            let (_, health) = self.get("/health");
            if health["loading"]["phase"] == phase {
                return health;
            }
            assert!(
                start.elapsed() < LIVENESS,
                "never reached phase {phase}: {health}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Loading {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes of the folder's `.safetensors` weights files.
fn weights_file_bytes(dir: &Path) -> u64 {
    ["model.safetensors"]
        .iter()
        .map(|f| std::fs::metadata(dir.join(f)).unwrap().len())
        .sum()
}

#[test]
fn ready_is_503_with_the_progress_while_loading_then_200_with_the_weights_resident() {
    // 4 MB at 1 MB/s: about four seconds of loading to look at.
    let server = Loading::start(&["--load-throttle-bytes-per-s", "1000000"]);
    let health = server.wait_for_phase("reading");
    assert_eq!(health["status"], "loading", "{health}");
    let total = health["loading"]["total_bytes"].as_u64().unwrap();
    assert!(
        total > 0 && total <= weights_file_bytes(&tiny_model()),
        "{health}"
    );

    let (status, ready) = server.get("/ready");
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["ready"], false);
    let reason = ready["reason"].as_str().unwrap();
    assert!(reason.starts_with("loading weights: "), "{reason}");
    assert!(
        reason.contains(" of 4.1 MB, "),
        "the fixture's 4.1 MB: {reason}"
    );

    let (status, memory) = server.get("/v1/memory");
    assert_eq!(status, 503, "{memory}");
    assert_eq!(memory["error"]["code"], "loading", "{memory}");
    assert_eq!(memory["loading"]["phase"], "reading", "{memory}");
    let (status, _) = server.get("/v1/models");
    assert_eq!(status, 503, "the API waits for the weights");

    let start = Instant::now();
    while server.get("/ready").0 != 200 {
        assert!(start.elapsed() < LIVENESS, "never ready:\n{}", server.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, health) = server.get("/health");
    assert_eq!((status, &health["status"]), (200, &Value::from("ok")));
    let (status, memory) = server.get("/v1/memory");
    assert_eq!(status, 200, "{memory}");
    let loading = &memory["loading"];
    assert_eq!(loading["phase"], "ready", "{memory}");
    // The residency is the mapping's, measured: the whole file is mapped,
    // and the pages just read are in the page cache.
    assert_eq!(
        loading["mapped_bytes"].as_u64(),
        Some(weights_file_bytes(&tiny_model())),
        "{loading}"
    );
    let resident = loading["resident_bytes"].as_u64().unwrap();
    assert!(
        resident > 0 && resident <= loading["mapped_bytes"].as_u64().unwrap(),
        "{loading}"
    );
    assert!(
        server.log().contains("weights read in: "),
        "{}",
        server.log()
    );
}

#[test]
fn sigterm_while_loading_ends_the_process() {
    // About an hour of loading at this rate: only the signal ends it.
    let mut server = Loading::start(&["--load-throttle-bytes-per-s", "1000"]);
    server.wait_for_phase("reading");
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // A correctness bound (the loader stops between reads), not a timing.
    let exit = server.wait_exit(Duration::from_secs(10));
    let log = server.log();
    let exit = exit.unwrap_or_else(|| panic!("still running 10 s after SIGTERM:\n{log}"));
    assert!(exit.success(), "{exit:?}\n{log}");
    assert!(log.contains("stopped while loading"), "{log}");
}

#[test]
fn a_shard_truncated_while_loading_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(tiny_model()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let shard = dir.path().join("model.safetensors");
    let model = dir.path().to_str().unwrap();
    let mut server = Loading::start(&["--model", model, "--load-throttle-bytes-per-s", "1000000"]);
    server.wait_for_phase("reading");
    // Validated and mapped at its full size; now half of it is gone before
    // the (throttled) read reaches it.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap();
    file.set_len(weights_file_bytes(dir.path()) / 2).unwrap();
    let exit = server.wait_exit(LIVENESS);
    let log = server.log();
    let exit = exit.unwrap_or_else(|| panic!("no exit:\n{log}"));
    assert!(!exit.success(), "{log}");
    assert!(
        log.contains(&format!("{}: the file is ", shard.display())) && log.contains("shorter"),
        "{log}"
    );
}

#[test]
fn a_weight_page_evicted_after_ready_shows_in_v1_memory() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(tiny_model()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let shard = dir.path().join("model.safetensors");
    std::fs::File::open(&shard).unwrap().sync_all().unwrap();
    let server = Loading::start(&["--model", dir.path().to_str().unwrap()]);
    server.wait_for_phase("ready");
    let resident = |server: &Loading| {
        let (status, memory) = server.get("/v1/memory");
        assert_eq!(status, 200, "{memory}");
        memory["loading"]["resident_bytes"].as_u64().unwrap()
    };
    let before = resident(&server);
    // Pages no process has mapped in (the server read them with pread and
    // has run no request) can be dropped by anyone, as memory pressure would.
    let file = std::fs::File::open(&shard).unwrap();
    // SAFETY: plain FFI on a descriptor this test owns.
    let rc = unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    assert_eq!(rc, 0);
    // The reading is cached for a second.
    std::thread::sleep(Duration::from_millis(1100));
    let after = resident(&server);
    if after >= before {
        eprintln!(
            "skipped: the kernel kept the pages after POSIX_FADV_DONTNEED ({after} of \
             {before} bytes; tmpfs or an overlay that ignores it)"
        );
        return;
    }
    assert!(
        after < before / 2,
        "{after} resident after eviction, {before} before"
    );
}
