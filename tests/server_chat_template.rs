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
