//! `serve --chat-template FILE`: the file replaces the checkpoint's template
//! (the fixture's plain ChatML), tools and the other template fields reach
//! it through the HTTP route, and the prompt the engine gets is the token ids
//! of transformers' rendering (tests/chat_templates/qwen3.json, see
//! text_chat_reference.rs). A file that is missing or does not compile stops
//! the start, naming it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;
use sparkrt::text::Tokenizer;

use crate::server::{self, Server, box24, repo};

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    request: Box<RawValue>,
    expected: Option<String>,
}

/// The reference case `name`: its request's JSON text (key order kept) and
/// transformers' rendering.
fn reference_case(name: &str) -> (String, String) {
    let text = std::fs::read_to_string(repo().join("tests/chat_templates/qwen3.json")).unwrap();
    let reference: Reference = serde_json::from_str(&text).unwrap();
    let case = reference
        .cases
        .into_iter()
        .find(|c| c.name == name)
        .unwrap();
    (case.request.get().to_owned(), case.expected.unwrap())
}

/// The request's body with the fields that make the answer carry the prompt.
fn with_prompt_ids(request: &str) -> Vec<u8> {
    let rest = request.trim_start().strip_prefix('{').unwrap();
    format!("{{\"return_token_ids\": true, \"max_tokens\": 1, {rest}").into_bytes()
}

#[test]
fn a_chat_template_file_renders_tools_and_template_fields_as_transformers() {
    let template = repo().join("tests/fixtures/templates/qwen3.jinja");
    let server = Server::start(&["--chat-template", template.to_str().unwrap()]);
    let tokenizer = Tokenizer::from_dir(&repo().join("tests/fixtures/qwen3-moe-tiny")).unwrap();
    for name in [
        "tools_with_system",
        "tool_call_and_result",
        "tool_call_reasoning_pending",
        "enable_thinking_false",
        "content_parts",
        "continue_final_message",
    ] {
        let (request, expected) = reference_case(name);
        let reply = server.post_bytes("/v1/chat/completions", &with_prompt_ids(&request));
        assert_eq!(reply.status, 200, "{name}: {}", reply.body);
        let answer = reply.json();
        let ids: Vec<u32> =
            serde_json::from_value(answer["choices"][0]["prompt_token_ids"].clone()).unwrap();
        assert_eq!(
            ids,
            tokenizer.encode(&expected, false).unwrap(),
            "{name}: the prompt is not transformers' rendering"
        );
        assert_eq!(answer["usage"]["prompt_tokens"], ids.len(), "{name}");
    }

    // The checkpoint's own ChatML template has no tools section: without the
    // flag the same request is a much shorter prompt.
    let plain = Server::start(&[]);
    let (request, expected) = reference_case("tools_with_system");
    let reply = plain.post_bytes("/v1/chat/completions", &with_prompt_ids(&request));
    assert_eq!(reply.status, 200, "{}", reply.body);
    let plain_len = reply.json()["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(
        plain_len * 4 < tokenizer.encode(&expected, false).unwrap().len(),
        "{plain_len} tokens without the tools"
    );
}

#[test]
fn a_missing_or_broken_chat_template_file_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.jinja");
    std::fs::write(&broken, "{% for m in %}").unwrap();
    let missing = dir.path().join("missing.jinja");
    for (file, why) in [(&broken, "does not compile"), (&missing, "cannot read")] {
        let output = serve_until_exit(file);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&*file.to_string_lossy()) && stderr.contains(why),
            "{stderr}"
        );
    }
}

/// `sparkrt serve --chat-template FILE`, expected to exit by itself.
fn serve_until_exit(template: &Path) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sparkrt"))
        .args(["serve", "--port", "0", "--threads", server::THREADS])
        .arg("--host-root")
        .arg(box24())
        .arg("--chat-template")
        .arg(template)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
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

/// A template whose request data (`chat_template_kwargs.mode`) makes it
/// loop 10¹⁰ times, double a string into its output, or double one without
/// writing it (2⁶⁴ bytes); plain ChatML otherwise.
const HOSTILE_TEMPLATE: &str = r#"{%- if mode == "loops" -%}
{%- for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor -%}
{%- elif mode == "double" -%}
{%- set ns = namespace(s=messages[0].content) -%}
{%- for i in range(64) %}{{ ns.s }}{% set ns.s = ns.s ~ ns.s %}{% endfor -%}
{%- elif mode == "build" -%}
{%- set ns = namespace(s=messages[0].content) -%}
{%- for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor -%}
{%- endif -%}
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"#;

/// The server's peak RSS (`VmHWM`), bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn a_runaway_template_gets_400_naming_its_limit_while_other_requests_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hostile.jinja");
    std::fs::write(&file, HOSTILE_TEMPLATE).unwrap();
    let server = std::sync::Arc::new(Server::start(&["--chat-template", file.to_str().unwrap()]));
    let chat = |mode: Option<&str>| {
        let mut body = serde_json::json!({
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 1,
        });
        if let Some(mode) = mode {
            body["chat_template_kwargs"] = serde_json::json!({"mode": mode});
        }
        body
    };
    assert_eq!(server.post("/v1/chat/completions", &chat(None)).status, 200);
    let rss_before = peak_rss(server.pid());

    // The loops run on the preparation pool; a plain completion sent
    // meanwhile is answered without waiting for them.
    let started = Instant::now();
    let looping = {
        let server = std::sync::Arc::clone(&server);
        let body = chat(Some("loops"));
        std::thread::spawn(move || {
            (
                server.post("/v1/chat/completions", &body),
                started.elapsed(),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let plain_started = Instant::now();
    let plain = server.post(
        "/v1/completions",
        &serde_json::json!({"prompt": "Hello", "max_tokens": 2}),
    );
    let plain_took = plain_started.elapsed();
    assert_eq!(plain.status, 200, "{}", plain.body);
    let (reply, took) = looping.join().unwrap();
    let error = reply.assert_error(400);
    assert_eq!(error["code"], "max_template_fuel", "{error}");
    assert!(took < Duration::from_secs(10), "the loops took {took:?}");
    eprintln!("loops refused in {took:?}; a plain completion meanwhile took {plain_took:?}");
    assert!(
        plain_took < took,
        "the plain completion waited for the loops"
    );

    // Doubling into the output: stopped at max_prompt_bytes, memory flat.
    let error = server
        .post("/v1/chat/completions", &chat(Some("double")))
        .assert_error(400);
    assert_eq!(error["code"], "max_template_output_bytes", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("max_template_output_bytes = "),
        "{error}"
    );
    let grown = peak_rss(server.pid()).saturating_sub(rss_before);
    assert!(grown < 64 << 20, "peak RSS grew by {grown} bytes");

    // Doubling without writing: no write, no call, one instruction a
    // doubling; the worker it renders in dies at its memory cap, the server
    // answers 400 and stays small.
    for _ in 0..2 {
        let error = server
            .post("/v1/chat/completions", &chat(Some("build")))
            .assert_error(400);
        assert_eq!(error["code"], "max_template_memory_bytes", "{error}");
    }
    let grown = peak_rss(server.pid()).saturating_sub(rss_before);
    assert!(grown < 64 << 20, "peak RSS grew by {grown} bytes");
    // And the server still serves chats (in a new worker).
    assert_eq!(server.post("/v1/chat/completions", &chat(None)).status, 200);
}
