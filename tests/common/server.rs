//! A real `sparkrt serve` on an ephemeral port, and a small blocking HTTP
//! client for it (server-sent events parsed by hand).
//!
//! Included by the `server_*` tests with
//! `#[path = "common/server.rs"] mod server;` next to `mod common;`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// Threads each server (and each `generate` reference run) uses; the same
/// count on both sides keeps the kernels' work split identical.
pub const THREADS: &str = "2";

/// Upper bound for anything a healthy server does in a test (start-up, a
/// request, a state change); only liveness, never a measurement.
pub const LIVENESS: Duration = Duration::from_secs(300);

/// Polls between checks of a condition; with [`POLL_INTERVAL`] the bound is
/// far above what a loaded CI machine needs.
const MAX_POLLS: u32 = 3000;
const POLL_INTERVAL: Duration = Duration::from_millis(50);

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fake 24 GiB host the tiny profile plans against.
pub fn box24() -> PathBuf {
    repo().join("tests/fixtures/hosts/box24")
}

/// A running server, killed when dropped.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    log: Arc<Mutex<String>>,
    key: Option<String>,
    agent: ureq::Agent,
}

/// An HTTP answer: status, headers and body text.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Asserts the status and OpenAI's error shape:
    /// `{"error": {"message": "...", "type": "...", "param": .., "code": ..}}`.
    /// Returns the error object.
    pub fn assert_error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "status of {}", self.body);
        let body = self.json();
        let error = body
            .get("error")
            .unwrap_or_else(|| panic!("no `error` object in {body}"));
        let message = error["message"].as_str().unwrap_or("");
        assert!(!message.is_empty(), "error without a message: {body}");
        assert!(error["type"].is_string(), "error without a type: {body}");
        assert!(error.get("param").is_some(), "error without param: {body}");
        assert!(error.get("code").is_some(), "error without code: {body}");
        error.clone()
    }
}

impl Server {
    /// `sparkrt serve --port 0 --threads 2 ARGS`, with the tiny profile and
    /// the box24 host unless `args` say otherwise; returns once the model is
    /// loaded (`/ready` answers 200).
    pub fn start(args: &[&str]) -> Server {
        Server::start_with_key(args, None)
    }

    /// As [`Server::start`]; requests then send `Authorization: Bearer key`.
    pub fn start_with_key(args: &[&str], key: Option<&str>) -> Server {
        Server::start_with_env(args, key, &[])
    }

    /// As [`Server::start_with_key`], the server run with `env` set too.
    pub fn start_with_env(args: &[&str], key: Option<&str>, env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sparkrt"));
        command.envs(env.iter().copied());
        command.args(["serve", "--port", "0", "--threads", THREADS]);
        if !args.contains(&"--host-root") {
            command.arg("--host-root").arg(box24());
        }
        command
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("sparkrt serve starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(String::new()));
        let (bound_tx, bound_rx) = mpsc::channel();
        {
            let log = Arc::clone(&log);
            // Drains stderr for the whole life of the server (a full pipe
            // would block it) and reports the bound address once.
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    // Logged before the address is reported: a test that
                    // reads the log once started sees the listening line.
                    log.lock().unwrap().push_str(&format!("{line}\n"));
                    if let Some(url) = listening_on(&line) {
                        let _ = bound_tx.send(url);
                    }
                }
            });
        }
        let url = match bound_rx.recv_timeout(LIVENESS) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the server never printed its address; stderr:\n{}",
                    log.lock().unwrap()
                );
            }
        };
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(LIVENESS))
            .build()
            .into();
        let server = Server {
            child,
            url,
            log,
            key: key.map(str::to_string),
            agent,
        };
        server.wait_until("the model is loaded", || server.get("/ready").status == 200);
        server
    }

    /// The key later requests send (`None`: no `Authorization` header).
    pub fn set_key(&mut self, key: Option<&str>) {
        self.key = key.map(str::to_string);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM to the server.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits up to `limit` for the server to exit; its status, or `None`
    /// if it is still running.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().expect("the child is waited for") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// `host:port` of the server.
    pub fn address(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// Everything the server wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Runs `scripts/SCRIPT URL ARGS…` (a client check in Python) against
    /// this server; it must succeed. Returns its standard output.
    pub fn run_script(&self, script: &str, args: &[&str]) -> String {
        let output = Command::new("python3")
            .arg(repo().join("scripts").join(script))
            .arg(&self.url)
            .args(args)
            .output()
            .expect("python3 runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{script} failed:\n{stdout}\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
        stdout
    }

    fn authorize<B>(&self, request: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.key {
            Some(key) => request.header("Authorization", format!("Bearer {key}")),
            None => request,
        }
    }

    /// `headers` on the request, and the server's key unless they set
    /// `Authorization` themselves.
    fn with_headers<B>(
        &self,
        mut request: ureq::RequestBuilder<B>,
        headers: &[(&str, &str)],
    ) -> ureq::RequestBuilder<B> {
        if !headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("authorization"))
        {
            request = self.authorize(request);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
    }

    pub fn get(&self, path: &str) -> Reply {
        self.get_with(path, &[])
    }

    /// GET with extra headers (and the server's key, if any, unless
    /// `headers` set `Authorization` themselves).
    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let request = self.agent.get(format!("{}{path}", self.url));
        reply(self.with_headers(request, headers).call())
    }

    /// OPTIONS (a browser's CORS preflight) with `headers`, and no key
    /// unless they set one: browsers send none on a preflight.
    pub fn options_with(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut request = self.agent.options(format!("{}{path}", self.url));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        reply(request.call())
    }

    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_bytes(path, body.to_string().as_bytes())
    }

    pub fn post_bytes(&self, path: &str, body: &[u8]) -> Reply {
        self.post_with(path, body, &[])
    }

    pub fn post_with(&self, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Reply {
        let request = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("Content-Type", "application/json");
        reply(self.with_headers(request, headers).send(body))
    }

    /// Opens a streamed request; panics unless the server answers 200 with
    /// an event stream.
    pub fn open_stream(&self, path: &str, body: &Value) -> SseStream {
        // A fresh agent: a stream dropped half-read must close its own
        // connection, not one a pool might hand out again.
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(LIVENESS))
            .build()
            .into();
        let request = self
            .authorize(agent.post(format!("{}{path}", self.url)))
            .header("Content-Type", "application/json");
        let response = request
            .send(body.to_string().as_bytes())
            .expect("the streamed request is sent");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let (_, body) = response.into_parts();
        let mut reader = BufReader::new(body.into_reader());
        if status != 200 {
            let mut text = String::new();
            let _ = reader.read_to_string(&mut text);
            panic!("streamed request answered {status}: {text}");
        }
        assert!(
            content_type.starts_with("text/event-stream"),
            "content type {content_type:?}"
        );
        SseStream { reader }
    }

    /// A whole streamed request: the `data:` payload of every event, in
    /// order (the last one is `[DONE]` for a well-formed stream).
    pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let mut stream = self.open_stream(path, body);
        let mut events = Vec::new();
        while let Some(data) = stream.next_data() {
            events.push(data);
        }
        events
    }

    /// `/metrics` as `name{labels} -> value`.
    pub fn metrics(&self) -> Metrics {
        let reply = self.get("/metrics");
        assert_eq!(reply.status, 200, "/metrics: {}", reply.body);
        Metrics::parse(&reply.body)
    }

    /// Waits until no sequence runs or waits and every KV block is free.
    /// (The engine publishes its gauges after each step, a moment after the
    /// last answer went out.)
    pub fn wait_until_idle(&self) {
        self.wait_until("the engine is idle with every KV block free", || {
            let m = self.metrics();
            m.get("sparkrt_requests_running") == 0.0
                && m.get("sparkrt_requests_waiting") == 0.0
                && m.get("sparkrt_kv_blocks_used") == 0.0
        });
    }

    /// Polls `condition` until it holds; panics (with the server's log)
    /// after a bound far above what a loaded machine needs.
    pub fn wait_until(&self, what: &str, mut condition: impl FnMut() -> bool) {
        for _ in 0..MAX_POLLS {
            if condition() {
                return;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        panic!("never happened: {what}; server log:\n{}", self.log());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn reply(result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Reply {
    let mut response = result.expect("the server answers");
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                v.to_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let body = response
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .expect("the body is read");
    Reply {
        status,
        headers,
        body,
    }
}

/// The events of one streamed answer, read as they come.
pub struct SseStream {
    reader: BufReader<ureq::BodyReader<'static>>,
}

impl SseStream {
    /// The `data:` payload of the next event (several `data:` lines joined
    /// by newlines); comments (keep-alives) are skipped. `None` at the end.
    pub fn next_data(&mut self) -> Option<String> {
        let mut data: Option<String> = None;
        loop {
            let mut line = String::new();
            let read = self.reader.read_line(&mut line).expect("the stream reads");
            if read == 0 {
                return data;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if data.is_some() {
                    return data;
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            if let Some(value) = line.strip_prefix("data:") {
                let value = value.strip_prefix(' ').unwrap_or(value);
                match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_string()),
                }
            }
            // Other fields (event:, id:, retry:) are not used by this server.
        }
    }
}

/// Prometheus text, parsed into `name{labels}` → value.
#[derive(Debug)]
pub struct Metrics(pub Vec<(String, f64)>);

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (name, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("metric line {line:?}"));
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("metric value in {line:?}"));
            samples.push((without_model_name(name), value));
        }
        Metrics(samples)
    }

    /// The sample named exactly `name` (labels included); panics if absent.
    /// (Names are as [`without_model_name`] leaves them.)
    pub fn get(&self, name: &str) -> f64 {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no metric {name} in {:?}", self.0))
    }
}

/// `sparkrt generate --json --threads 2 --host-root box24 ARGS`: the
/// single-request reference the server's answers are compared with.
pub fn generate(args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_sparkrt"))
        .args(["generate", "--json", "--threads", THREADS, "--host-root"])
        .arg(box24())
        .args(args)
        .output()
        .expect("sparkrt generate runs");
    assert!(
        output.status.success(),
        "generate {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "generate printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Writes a profile for the tiny fixture model into `dir` with the
/// `[serving]` section replaced by `serving` (TOML lines); returns its path.
pub fn tiny_profile(dir: &Path, name: &str, serving: &str) -> PathBuf {
    let model_dir = repo().join("tests/fixtures/qwen3-moe-tiny");
    let text = std::fs::read_to_string(repo().join("profiles/qwen3-moe-tiny.toml"))
        .expect("the tiny profile reads");
    let mut out = String::new();
    let mut in_serving = false;
    for line in text.lines() {
        if line.starts_with('[') {
            in_serving = line.trim() == "[serving]";
            out.push_str(line);
            out.push('\n');
            if in_serving {
                out.push_str(serving);
                out.push('\n');
            }
            continue;
        }
        if in_serving {
            continue;
        }
        if line.starts_with("path = ") {
            out.push_str(&format!("path = {:?}\n", model_dir.display().to_string()));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, out).expect("the profile is written");
    path
}

/// Token ids `len` long, spread over the tiny vocabulary (below the
/// special tokens), different for each `seed`.
pub fn prompt_ids(len: usize, seed: u64) -> Vec<u32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % 500) as u32
        })
        .collect()
}

/// The `token_ids` array of a choice, as numbers.
pub fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("token ids are not an array: {value}"))
        .iter()
        .map(|v| v.as_u64().expect("a token id") as u32)
        .collect()
}

/// The address of `sparkrt: listening on URL`, or of the json event with a
/// `listening_on` field (`--log-format json`).
fn listening_on(line: &str) -> Option<String> {
    if let Some(url) = line.strip_prefix("sparkrt: listening on ") {
        return Some(url.trim().to_string());
    }
    let event: serde_json::Value = serde_json::from_str(line).ok()?;
    event["fields"]["listening_on"].as_str().map(str::to_string)
}

/// A sample's name without its `model_name="…"` label, which every sample
/// carries (tests/server_vllm_metrics.rs checks that); the others' tests
/// name samples by their own labels only.
pub fn without_model_name(name: &str) -> String {
    let Some(start) = name.find("model_name=\"") else {
        return name.to_string();
    };
    let value_start = start + "model_name=\"".len();
    let Some(len) = name[value_start..].find('"') else {
        return name.to_string();
    };
    let mut end = value_start + len + 1;
    let mut start = start;
    if name[end..].starts_with(',') {
        end += 1;
    } else if name[..start].ends_with(',') {
        start -= 1;
    }
    let out = format!("{}{}", &name[..start], &name[end..]);
    out.strip_suffix("{}").map_or(out.clone(), str::to_string)
}
