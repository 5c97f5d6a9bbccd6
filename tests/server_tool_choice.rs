//! `tool_choice` `required` and a named function, constrained by a grammar
//! of the hermes tool-call format on the tiny random fixture (which never
//! writes a call by itself): `scripts/tool_choice_check.py` through the
//! openai client, langchain-openai, instructor and pydantic-ai, and the
//! refusals by name.

use crate::common;
use crate::server;

use serde_json::json;
use server::Server;

fn missing_clients() -> Option<String> {
    common::missing_python_modules("openai, jsonschema, langchain_openai, instructor, pydantic_ai")
}

#[test]
fn required_and_named_tool_choice_answer_valid_calls_through_the_clients() {
    if !common::tool_present(
        "openai, jsonschema, langchain-openai, instructor, pydantic-ai-slim[openai]",
        missing_clients(),
    ) {
        return;
    }
    let server = Server::start(&[]);
    let stdout = server.run_script("tool_choice_check.py", &[]);
    assert!(stdout.contains("tool choice check passed"), "{stdout}");
}

#[test]
fn forced_tool_choice_refuses_what_it_cannot_do_by_name() {
    let server = Server::start(&[]);
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let body = |extra: serde_json::Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    for (extra, param) in [
        (
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice.function.name",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "f"}, "foo": 1}}),
            "tool_choice.foo",
        ),
    ] {
        let reply = server.post("/v1/chat/completions", &body(extra.clone()));
        let error = reply.assert_error(400);
        assert_eq!(error["param"], param, "{extra}: {error}");
    }
}

/// The Qwen3.5 / 3.6 XML format (`--tool-call-parser qwen3_coder`): a named
/// function on the random tiny model, which never writes a call unprompted,
/// comes back as that call with arguments of the schema's types.
#[test]
fn forced_tool_choice_holds_the_xml_format_to_the_schema() {
    let xml = Server::start(&["--tool-call-parser", "qwen3_coder"]);
    let tools = json!([
        {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 9}
            },
            "required": ["city", "days"]
        }}}
    ]);
    for choice in [
        json!({"type": "function", "function": {"name": "get_weather"}}),
        json!("required"),
    ] {
        let reply = xml.post(
            "/v1/chat/completions",
            &json!({
                "messages": [{"role": "user", "content": "Weather?"}],
                "tools": tools,
                "tool_choice": choice,
                "parallel_tool_calls": false,
                "max_tokens": 256,
                "temperature": 0
            }),
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
        let message = &reply.json()["choices"][0]["message"];
        let calls = message["tool_calls"]
            .as_array()
            .unwrap_or_else(|| panic!("{message}"));
        assert_eq!(calls.len(), 1, "{message}");
        let function = &calls[0]["function"];
        let arguments: serde_json::Value =
            serde_json::from_str(function["arguments"].as_str().unwrap()).unwrap();
        if choice.is_object() {
            assert_eq!(function["name"], "get_weather", "{message}");
        }
        if function["name"] == "get_weather" {
            let city = arguments["city"]
                .as_str()
                .unwrap_or_else(|| panic!("{arguments}"));
            assert!(
                city.chars().count() <= 12 && !city.contains('<'),
                "{arguments}"
            );
            let days = arguments["days"]
                .as_i64()
                .unwrap_or_else(|| panic!("{arguments}"));
            assert!((1..=9).contains(&days), "{arguments}");
        }
    }
}

#[test]
fn the_responses_api_takes_a_named_function_too() {
    let server = Server::start(&[]);
    let reply = server.post(
        "/v1/responses",
        &json!({"input": "Hi", "max_output_tokens": 200, "temperature": 0,
                "tools": [{"type": "function", "name": "add", "parameters":
                    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
                     "required": ["a"], "additionalProperties": false}}],
                "tool_choice": {"type": "function", "name": "add"}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer = reply.json();
    let calls: Vec<_> = answer["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{answer}");
    assert_eq!(calls[0]["name"], "add");
    let arguments: serde_json::Value =
        serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["a"].is_i64(), "{arguments}");
    assert_eq!(arguments.as_object().unwrap().len(), 1, "{arguments}");
}
