//! `POST /v1/responses` through the official `openai` client
//! (`scripts/openai_responses_check.py`: `client.responses.create`, blocking
//! and streamed), on a server whose template renders tools (Qwen3's), and
//! the raw SSE framing (`event:` lines); and scripted checkpoints (greedy
//! output = a chosen token sequence, `checkpoint::scripted`) whose reasoning
//! and tool call must come back as `reasoning` and `function_call` items,
//! for Qwen3 and gpt-oss (harmony). Skips, saying why, where python3 or
//! the package is missing (CI installs it through `scripts/ci-deps.sh`).

use serde_json::{Value, json};
use sparkrt::checkpoint::scripted::{Family, Script, write_scripted};

use crate::common;
use crate::server::{Server, repo};

fn missing_client() -> Option<String> {
    common::missing_python_modules("openai")
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
    let stdout = server.run_script("openai_responses_check.py", &[]);
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
        (
            json!({"input": "x", "include": ["reasoning.encrypted_content"]}),
            "include",
        ),
        (json!({"input": "x", "truncation": "auto"}), "truncation"),
        (
            json!({"input": "x", "text": {"format": {"type": "json_object"}}}),
            "text",
        ),
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

    // What agent SDKs send when they want nothing extra: the same answer.
    let plain = json!({"input": "x", "max_output_tokens": 3, "temperature": 0});
    let mut explicit = plain.clone();
    explicit["include"] = json!([]);
    explicit["truncation"] = json!("disabled");
    explicit["text"] = json!({"format": {"type": "text"}});
    let a = server.post("/v1/responses", &plain);
    let b = server.post("/v1/responses", &explicit);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(b.status, 200, "{}", b.body);
    assert_eq!(
        without_ids(&a.json()["output"]),
        without_ids(&b.json()["output"])
    );
}

fn run_check(server: &Server, expected: &Value) {
    if !common::tool_present("the official openai client", missing_client()) {
        return;
    }
    server.run_script(
        "openai_responses_check.py",
        &["--expect", &expected.to_string()],
    );
}

/// A scripted checkpoint of `family` with the official template, served.
fn scripted_server(family: Family, template: &str, output: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let path = repo().join("tests/fixtures/templates").join(template);
    let text = std::fs::read_to_string(&path).unwrap();
    let script = Script {
        family,
        chat_template_file: path,
        output: output.iter().map(|s| s.to_string()).collect(),
        after: None,
    };
    write_scripted(&script, &text, dir.path()).unwrap();
    let server = Server::start(&["--model", dir.path().to_str().unwrap()]);
    (dir, server)
}

const WEATHER: &str = r#"{"type": "function", "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}"#;

/// The blocking answer's items, ids left out.
fn items(server: &Server) -> Vec<Value> {
    let tools: Value = serde_json::from_str(WEATHER).unwrap();
    let body = json!({"input": "Hi", "tools": [tools], "temperature": 0});
    let reply = server.post("/v1/responses", &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer = reply.json();
    assert_eq!(answer["status"], "completed", "{answer}");
    let mut items = answer["output"].as_array().unwrap().clone();
    for item in &mut items {
        item.as_object_mut().unwrap().remove("id");
        if let Some(call_id) = item.get("call_id") {
            assert!(call_id.as_str().unwrap().starts_with("call_"), "{item}");
            item.as_object_mut().unwrap().remove("call_id");
        }
    }
    items
}

#[test]
fn a_qwen3_answer_with_reasoning_and_a_tool_call_is_two_items() {
    let call = "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n";
    let script = [
        "<think>",
        "\nNeed the weather.\n",
        "</think>",
        "\n\n",
        "<tool_call>",
        call,
        "</tool_call>",
        "<|im_end|>",
    ];
    let (_dir, server) = scripted_server(Family::Qwen3, "qwen3.jinja", &script);
    assert_eq!(
        items(&server),
        [
            json!({"type": "reasoning", "summary": [], "status": "completed",
                   "content": [{"type": "reasoning_text", "text": "\nNeed the weather.\n"}]}),
            json!({"type": "function_call", "name": "get_weather",
                   "arguments": "{\"city\": \"Paris\"}", "status": "completed"}),
        ]
    );
    run_check(
        &server,
        &json!({"reasoning": "\nNeed the weather.\n", "content": null,
                "tool": {"name": "get_weather", "arguments": {"city": "Paris"}}}),
    );
}

/// Qwen3.6's template opens `<think>`; the XML call (qwen3_coder, chosen
/// by the template) is a `function_call` item with JSON arguments.
#[test]
fn a_qwen3_6_xml_tool_call_is_a_function_call_item() {
    let script = [
        "Need the weather.\n",
        "</think>",
        "\n\n",
        "<tool_call>",
        "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n",
        "</tool_call>",
        "<|im_end|>",
    ];
    let (_dir, server) = scripted_server(Family::Qwen3, "qwen3_6.jinja", &script);
    assert_eq!(
        items(&server),
        [
            json!({"type": "reasoning", "summary": [], "status": "completed",
                   "content": [{"type": "reasoning_text", "text": "Need the weather.\n"}]}),
            json!({"type": "function_call", "name": "get_weather",
                   "arguments": "{\"city\": \"Paris\"}", "status": "completed"}),
        ]
    );
}

#[test]
fn a_gpt_oss_harmony_answer_is_reasoning_then_a_message() {
    let script = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "The user says hi.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "final",
        "<|message|>",
        "Hello there!",
        "<|return|>",
    ];
    let (_dir, server) = scripted_server(Family::GptOss, "gptoss.jinja", &script);
    assert_eq!(
        items(&server),
        [
            json!({"type": "reasoning", "summary": [], "status": "completed",
                   "content": [{"type": "reasoning_text", "text": "The user says hi."}]}),
            json!({"type": "message", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": "Hello there!",
                                "annotations": [], "logprobs": []}]}),
        ]
    );
    run_check(
        &server,
        &json!({"reasoning": "The user says hi.", "content": "Hello there!", "tool": null}),
    );
}
