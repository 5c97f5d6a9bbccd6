//! The request limits of `sparkrt serve`: every size a client chooses is
//! refused with a 400 naming the limit before it costs work (the prompt
//! before it is tokenized), the memory guard refuses before any of that,
//! `/health` stays fast and the server's memory bounded while clients send
//! the largest prompts, and a client that leaves mid-stream is counted.

use crate::server;
use crate::server_guard::{write_host_with_kubelet, write_meminfo};

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use server::{Server, box24, repo};

/// The tiny profile's `max_model_len`.
const MAX_MODEL_LEN: usize = 1024;

/// `max_model_len ×` the fixture tokenizer's longest token: the largest
/// text prompt the server tokenizes.
fn max_prompt_bytes() -> usize {
    let tokenizer =
        sparkrt::text::Tokenizer::from_dir(&repo().join("tests/fixtures/qwen3-moe-tiny")).unwrap();
    MAX_MODEL_LEN * tokenizer.longest_token_bytes()
}

/// `3 × max_prompt_bytes + 1 MiB` (see `server::limits`).
fn max_body_bytes() -> usize {
    3 * max_prompt_bytes() + (1 << 20)
}

/// A `key: N kB` line of `/proc/PID/status`, in bytes.
fn proc_status_bytes(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    let kb: u64 = line
        .trim_start_matches(key)
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

/// Text of exactly `len` bytes that tokenizes into many tokens (a worst
/// case for the tokenizer: short words, punctuation, digits).
fn text(len: usize, seed: usize) -> String {
    let pieces = ["a ", "7", "!", "xy ", "q", ". ", "\n", "z9"];
    let mut out = String::with_capacity(len + 4);
    let mut i = seed;
    while out.len() < len {
        out.push_str(pieces[i % pieces.len()]);
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out.truncate(len);
    out
}

/// 400 (413 for the body) with the limit as `code`, and the limit, the value
/// and the maximum in the message.
fn assert_over_limit(reply: &server::Reply, limit: &str, value: usize, max: usize) -> Value {
    let status = if limit == "max_body_bytes" { 413 } else { 400 };
    let error = reply.assert_error(status);
    assert_eq!(error["code"], limit, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(limit)
            && message.contains(&value.to_string())
            && message.contains(&max.to_string()),
        "the message names the limit, the value and the maximum: {message}"
    );
    error
}

#[test]
fn oversize_prompts_get_400_naming_the_limit_without_costing_memory() {
    let server = Server::start(&[]);
    let limit = max_prompt_bytes();
    // Warm up (the first request maps the weights' pages).
    let ok = server.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(ok.status, 200, "{}", ok.body);
    let before = proc_status_bytes(server.pid(), "VmHWM:");

    // One byte over: refused before tokenizing, naming the limit.
    let over = text(limit + 1, 1);
    let reply = server.post("/v1/completions", &json!({"prompt": over}));
    let error = assert_over_limit(&reply, "max_prompt_bytes", limit + 1, limit);
    assert_eq!(error["param"], "prompt");
    // At the limit it is tokenized (and then too many tokens for the model).
    let at = text(limit, 1);
    let reply = server.post("/v1/completions", &json!({"prompt": at}));
    assert_eq!(reply.assert_error(400)["param"], "prompt");
    assert!(
        reply.body.contains("tokens"),
        "refused on its token count: {}",
        reply.body
    );
    // Chat: the messages' bytes, before the template renders.
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": over}]}),
    );
    assert_eq!(
        reply.assert_error(400)["code"],
        "max_prompt_bytes",
        "{}",
        reply.body
    );

    // The largest body: refused quickly, memory flat.
    let big = max_body_bytes() - 64;
    let started = Instant::now();
    let reply = server.post("/v1/completions", &json!({"prompt": "a".repeat(big)}));
    let elapsed = started.elapsed();
    assert_over_limit(&reply, "max_prompt_bytes", big, limit);
    println!("a {big}-byte prompt was refused in {elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    // The issue's 7.9 MB prompt: over the body limit, 413.
    let started = Instant::now();
    let huge = format!("{{\"prompt\": \"{}\"}}", "a".repeat(7_900_000));
    let reply = server.post_bytes("/v1/completions", huge.as_bytes());
    assert_over_limit(&reply, "max_body_bytes", huge.len(), max_body_bytes());
    assert_eq!(reply.status, 413);
    println!("a 7.9 MB body was refused in {:?}", started.elapsed());

    let after = proc_status_bytes(server.pid(), "VmHWM:");
    println!(
        "server peak RSS {} MiB before the oversize prompts, {} MiB after",
        before >> 20,
        after >> 20
    );
    assert!(
        after < before + (32 << 20),
        "peak RSS grew from {before} to {after} bytes"
    );
}

#[test]
fn stop_strings_messages_and_sizes_over_the_limits_get_400() {
    let server = Server::start(&[]);
    let completions = |body: Value| server.post("/v1/completions", &body);

    let seventeen: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    let reply = completions(json!({"prompt": "Hi", "stop": seventeen}));
    assert_eq!(
        assert_over_limit(&reply, "max_stop_strings", 17, 16)["param"],
        "stop"
    );
    let reply = completions(json!({"prompt": "Hi", "stop": "x".repeat(257)}));
    assert_over_limit(&reply, "max_stop_bytes", 257, 256);
    // The issue's abuse, 11,000 stop strings of 700 characters, is over
    // the body limit; a thousand of them are not.
    let abuse = vec!["y".repeat(700); 11_000];
    let reply = completions(json!({"prompt": "Hi", "stop": abuse}));
    assert_eq!(reply.assert_error(413)["code"], "max_body_bytes");
    let reply = completions(json!({"prompt": "Hi", "stop": vec!["y".repeat(700); 1000]}));
    assert_over_limit(&reply, "max_stop_strings", 1000, 16);
    // At the limits: served.
    let reply = completions(json!({"prompt": "Hi", "max_tokens": 2,
                                   "stop": vec!["\u{1}".repeat(256); 16]}));
    assert_eq!(reply.status, 200, "{}", reply.body);

    let reply = completions(json!({"prompt": "Hi", "max_tokens": MAX_MODEL_LEN + 1}));
    assert_over_limit(&reply, "max_tokens", MAX_MODEL_LEN + 1, MAX_MODEL_LEN);
    let reply = completions(json!({"prompt": "Hi", "n": 17}));
    assert_over_limit(&reply, "max_n", 17, 16);
    let reply = completions(json!({"prompt": vec![1u32; MAX_MODEL_LEN]}));
    assert_over_limit(
        &reply,
        "max_prompt_tokens",
        MAX_MODEL_LEN,
        MAX_MODEL_LEN - 1,
    );
    let reply = completions(json!({"prompt": "Hi", "model": "m".repeat(300)}));
    assert_over_limit(&reply, "max_model_name_bytes", 300, 256);

    let chat = |body: Value| server.post("/v1/chat/completions", &body);
    let one = json!({"role": "user", "content": "hi"});
    let reply = chat(json!({"messages": vec![one.clone(); 2049]}));
    assert_eq!(
        assert_over_limit(&reply, "max_messages", 2049, 2048)["param"],
        "messages"
    );
    let part = json!({"type": "text", "text": "a"});
    let reply = chat(json!({"messages": [{"role": "user", "content": vec![part; 2049]}]}));
    assert_over_limit(&reply, "max_content_parts", 2049, 2048);
    let reply = chat(json!({"messages": [{"role": "r".repeat(65), "content": "hi"}]}));
    assert_over_limit(&reply, "max_role_bytes", 65, 64);
    let reply = chat(json!({"messages": [one], "stop": seventeen}));
    assert_over_limit(&reply, "max_stop_strings", 17, 16);

    // The twelve refusals above counted as 4xx; none as served, failed or
    // cancelled.
    let m = server.metrics();
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"4xx\"}"), 12.0);
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"ok\"}"), 1.0);
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"5xx\"}"), 0.0);
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"cancelled\"}"), 0.0);
}

#[test]
fn a_tripped_guard_answers_503_before_parsing_rendering_or_tokenizing() {
    const GIB_KB: u64 = 1024 * 1024;
    let host = tempfile::tempdir().unwrap();
    let root = host.path();
    write_host_with_kubelet(root);
    let server = Server::start(&[
        "--host-root",
        root.to_str().unwrap(),
        "--guard-interval-ms",
        "50",
    ]);
    // Below eviction_hard (1 GiB) + the safety margin: tripped.
    write_meminfo(root, 16 * GIB_KB, GIB_KB / 2);
    server.wait_until("/ready fails", || server.get("/ready").status == 503);

    // Each of these would be a 400 with the guard open (over
    // max_prompt_bytes, too many stop strings, not JSON at all): the
    // guard answers first.
    let over = text(max_prompt_bytes() + 1, 3);
    let refusals = [
        ("/v1/completions", json!({"prompt": over}).to_string()),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": over}]}).to_string(),
        ),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "stop": vec!["s"; 40]}).to_string(),
        ),
        ("/v1/completions", "{\"prompt\": ".to_string()),
    ];
    for (path, body) in &refusals {
        let reply = server.post_bytes(path, body.as_bytes());
        assert_eq!(
            reply.assert_error(503)["code"],
            "memory_guard",
            "{path}: {}",
            reply.body
        );
    }
    let m = server.metrics();
    assert_eq!(
        m.get("sparkrt_requests_total{outcome=\"rejected\"}"),
        refusals.len() as f64
    );
}

#[test]
fn a_client_that_leaves_mid_stream_is_counted_cancelled() {
    let server = Server::start(&[]);
    let mut stream = server.open_stream(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 1000, "ignore_eos": true, "stream": true}),
    );
    assert!(stream.next_data().is_some(), "a first chunk");
    drop(stream);
    server.wait_until("the dropped stream is counted", || {
        server
            .metrics()
            .get("sparkrt_requests_total{outcome=\"cancelled\"}")
            == 1.0
    });
    // Its sequence ended and gave back its KV blocks.
    server.wait_until_idle();
    let m = server.metrics();
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"ok\"}"), 0.0);
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"5xx\"}"), 0.0);
    assert!(m.get("sparkrt_generation_tokens_total") < 1000.0);
    let stats = server.get("/v1/stats").json();
    assert_eq!(stats["requests"]["cancelled"], 1);
}

#[test]
fn health_stays_fast_and_memory_bounded_while_clients_send_maximal_prompts() {
    let server = Server::start(&[]);
    let ok = server.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(ok.status, 200, "{}", ok.body);
    let before = proc_status_bytes(server.pid(), "VmHWM:");
    let limit = max_prompt_bytes();
    let body_max = max_body_bytes();
    const CLIENTS: usize = 4;
    const REQUESTS: usize = 6;
    let mut latencies = Vec::new();
    std::thread::scope(|scope| {
        let server = &server;
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                scope.spawn(move || {
                    for r in 0..REQUESTS {
                        // Alternately: the largest prompt that is tokenized,
                        // the largest body, a chat at the byte limit.
                        let (path, body) = match r % 3 {
                            0 => ("/v1/completions", json!({"prompt": text(limit, c + r)})),
                            1 => (
                                "/v1/completions",
                                json!({"prompt": "b".repeat(body_max - 64)}),
                            ),
                            _ => (
                                "/v1/chat/completions",
                                json!({"messages": [{"role": "user",
                                                     "content": text(limit / 2, c * r)}]}),
                            ),
                        };
                        let reply = server.post(path, &body);
                        assert_eq!(reply.status, 400, "{}", reply.body);
                    }
                })
            })
            .collect();
        while !clients.iter().all(|c| c.is_finished()) {
            let started = Instant::now();
            let reply = server.get("/health");
            latencies.push(started.elapsed());
            assert_eq!(reply.status, 200);
            std::thread::sleep(Duration::from_millis(5));
        }
        for c in clients {
            c.join().unwrap();
        }
    });
    latencies.sort();
    let worst = *latencies.last().unwrap();
    println!(
        "/health while {CLIENTS} clients sent maximal prompts: {} probes, median {:?}, worst {worst:?}",
        latencies.len(),
        latencies[latencies.len() / 2]
    );
    assert!(worst < Duration::from_secs(2), "{worst:?}");
    let after = proc_status_bytes(server.pid(), "VmHWM:");
    println!(
        "server peak RSS {} MiB before, {} MiB after",
        before >> 20,
        after >> 20
    );
    assert!(
        after < before + (64 << 20),
        "peak RSS grew from {before} to {after} bytes"
    );
}

#[test]
fn a_broken_chat_template_is_a_start_up_error_naming_the_file() {
    let model = tempfile::tempdir().unwrap();
    let fixture = repo().join("tests/fixtures/qwen3-moe-tiny");
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model.path().join(entry.file_name())).unwrap();
    }
    std::fs::write(model.path().join("chat_template.jinja"), "{% for m in %}").unwrap();
    let output = serve_until_exit(model.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("chat_template.jinja") && stderr.contains("does not compile"),
        "{stderr}"
    );
}

/// `sparkrt serve` on `model` that is expected to exit by itself.
fn serve_until_exit(model: &Path) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sparkrt"))
        .args(["serve", "--port", "0", "--threads", server::THREADS])
        .arg("--host-root")
        .arg(box24())
        .arg("--profile")
        .arg(repo().join("profiles/qwen3-moe-tiny.toml"))
        .arg("--model")
        .arg(model)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > server::LIVENESS {
            let _ = child.kill();
            panic!("serve did not exit");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}
