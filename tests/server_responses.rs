//! `POST /v1/responses` through the official `openai` client
//! (`scripts/openai_responses_check.py`: `client.responses.create`, blocking
//! and streamed), on a server whose template renders tools (Qwen3's), and
//! the raw SSE framing (`event:` lines). Reasoning and function-call items
//! come from the output parsers; the events they make are checked in
//! `responses::output`'s unit tests. Skips, saying why, where python3 or
//! the package is missing (CI installs it through `scripts/ci-deps.sh`).

use std::process::Command;

use serde_json::json;

use crate::common;
use crate::server::{Server, repo};

fn missing_client() -> Option<String> {
    match Command::new("python3")
        .args(["-c", "import openai"])
        .output()
    {
        Err(e) => Some(format!("no python3 ({e})")),
        Ok(o) if !o.status.success() => Some(format!(
            "python3 cannot import openai: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    }
}

fn qwen3_server() -> Server {
    let template = repo().join("tests/fixtures/templates/qwen3.jinja");
    Server::start(&["--chat-template", template.to_str().unwrap()])
}

#[test]
fn the_official_openai_client_uses_the_responses_api() {
    if !common::tool_present("the official openai client", missing_client()) {
        return;
    }
    let server = qwen3_server();
    let output = Command::new("python3")
        .arg(repo().join("scripts/openai_responses_check.py"))
        .arg(&server.url)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the responses check failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
    assert!(stdout.contains("openai responses check passed"), "{stdout}");
}

#[test]
fn responses_stream_named_events_and_refuse_what_they_cannot_do() {
    let server = qwen3_server();
    let body = json!({"input": "Hi", "max_output_tokens": 3, "temperature": 0, "stream": true});
    // Each event is `event: TYPE` then `data: {"type": TYPE, ...}`.
    let raw = server.post("/v1/responses", &body);
    assert_eq!(raw.status, 200, "{}", raw.body);
    let mut events = Vec::new();
    let mut lines = raw
        .body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with(':'));
    while let Some(line) = lines.next() {
        let kind = line
            .strip_prefix("event: ")
            .unwrap_or_else(|| panic!("{line}"));
        let data = lines.next().and_then(|l| l.strip_prefix("data: ")).unwrap();
        let event: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(event["type"], kind);
        events.push(event);
    }
    assert_eq!(events[0]["type"], "response.created");
    assert_eq!(events[0]["response"]["status"], "in_progress");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.incomplete");
    assert_eq!(last["response"]["usage"]["output_tokens"], 3);

    // The blocking answer has the same output (greedy), but for item ids.
    let blocking = server.post(
        "/v1/responses",
        &json!({"input": "Hi", "max_output_tokens": 3, "temperature": 0}),
    );
    assert_eq!(blocking.status, 200, "{}", blocking.body);
    let without_ids = |output: &serde_json::Value| -> Vec<serde_json::Value> {
        let mut items = output.as_array().unwrap().clone();
        for item in &mut items {
            item.as_object_mut().unwrap().remove("id");
        }
        items
    };
    assert_eq!(
        without_ids(&blocking.json()["output"]),
        without_ids(&last["response"]["output"])
    );
    assert_eq!(blocking.json()["status"], "incomplete");

    for (body, param) in [
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"input": "x", "store": true}), "store"),
        (json!({"input": "x", "background": true}), "background"),
        (
            json!({"input": "x", "tools": [{"type": "web_search_preview"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
            "input[0].content[0].type",
        ),
    ] {
        let reply = server.post("/v1/responses", &body);
        let error = reply.assert_error(400);
        assert_eq!(error["param"], param, "{body}: {}", reply.body);
    }
}
