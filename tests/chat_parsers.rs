//! Reasoning and tool calls end to end: scripted checkpoints
//! (`checkpoint::scripted`, whose greedy output is a chosen token sequence)
//! served by `sparkrt serve`, for the three formats: Qwen3 (`<think>`,
//! hermes `<tool_call>`), Qwen3.5 / Qwen3.6 (`<think>` opened by the
//! template, XML `<tool_call><function=…>`) and gpt-oss (harmony over
//! special tokens). Each answer is
//! checked against the script it was built from (the independent reference:
//! the tokens are chosen here, so the expected split is known), blocking and
//! streamed, and through the official openai client and LangChain
//! (`scripts/openai_parsers_check.py`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use sparkrt::checkpoint::scripted::{Family, Script, write_scripted};

use crate::common;
use crate::server::{Server, repo};

const QWEN3_TEMPLATE: &str = "qwen3.jinja";
const QWEN36_TEMPLATE: &str = "qwen3_6.jinja";
const GPTOSS_TEMPLATE: &str = "gptoss.jinja";

fn template(name: &str) -> (PathBuf, String) {
    let path = repo().join("tests/fixtures/templates").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    (path, text)
}

/// Builds a scripted checkpoint in a fresh temporary folder.
fn scripted(family: Family, template_name: &str, output: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (path, text) = template(template_name);
    let script = Script {
        family,
        chat_template_file: path,
        output: output.iter().map(|s| s.to_string()).collect(),
        after: None,
    };
    write_scripted(&script, &text, dir.path()).unwrap();
    dir
}

/// A chatml template whose generation prompt opens `<think>` itself, as the
/// Qwen3 2507 thinking checkpoints' templates do.
const THINKING_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n\
    {{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}\
    <|im_start|>assistant\n<think>\n{% endif %}";

fn serve(dir: &Path) -> Server {
    Server::start(&["--model", dir.to_str().unwrap()])
}

/// A chat request offering a weather tool (tool calls are parsed only when
/// the request offers tools, as vLLM does).
fn chat(extra: Value) -> Value {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0,
                          "tools": tools});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// What a stream added up to, and every chunk's delta.
struct Streamed {
    reasoning: String,
    content: String,
    /// (id, name, arguments) per tool-call index.
    calls: Vec<(String, String, String)>,
    finish: Option<String>,
    deltas: Vec<Value>,
}

fn stream(server: &Server, body: &Value) -> Streamed {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let events = server.stream("/v1/chat/completions", &body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut s = Streamed {
        reasoning: String::new(),
        content: String::new(),
        calls: Vec::new(),
        finish: None,
        deltas: Vec::new(),
    };
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).unwrap();
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        // The two reasoning names always carry the same text.
        assert_eq!(delta["reasoning_content"], delta["reasoning"], "{delta}");
        s.reasoning += delta["reasoning_content"].as_str().unwrap_or("");
        s.content += delta["content"].as_str().unwrap_or("");
        for piece in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = piece["index"].as_u64().unwrap() as usize;
            if piece.get("id").is_some() {
                // A call's first piece: id, type, name and empty arguments.
                assert_eq!(index, s.calls.len(), "{piece}");
                assert_eq!(piece["type"], "function");
                assert_eq!(piece["function"]["arguments"], "");
                s.calls.push((
                    piece["id"].as_str().unwrap().to_string(),
                    piece["function"]["name"].as_str().unwrap().to_string(),
                    String::new(),
                ));
            } else {
                assert!(piece["function"].get("name").is_none(), "{piece}");
                s.calls[index].2 += piece["function"]["arguments"].as_str().unwrap();
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            s.finish = Some(f.to_string());
        }
        s.deltas.push(delta.clone());
    }
    s
}

/// No chunk shows a piece of a tag or a special token.
fn assert_no_markup(s: &Streamed) {
    for delta in &s.deltas {
        for key in ["content", "reasoning_content"] {
            let text = delta[key].as_str().unwrap_or("");
            for needle in ["<", ">", "|"] {
                assert!(!text.contains(needle), "{key} piece {text:?} leaks markup");
            }
        }
    }
}

fn parsers_check(server: &Server, expected: &Value) {
    let missing = common::missing_python_modules("openai");
    if !common::tool_present("the openai client parsers check", missing) {
        return;
    }
    let mut command = Command::new("python3");
    command
        .arg(repo().join("scripts/openai_parsers_check.py"))
        .arg(&server.url)
        .arg(expected.to_string());
    if std::env::var_os("CI").is_some() {
        command.arg("--require-langchain");
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "parsers check failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
}

// ------------------------------------------------------------------- Qwen3

/// `<think>` opened and closed, the closing tag split over two tokens.
const QWEN_REASONING: &[&str] = &[
    "<think>",
    "\nThe user greets me.\n",
    "</th",
    "ink>",
    "\n\nHello there!",
    "<|im_end|>",
];

#[test]
fn qwen3_reasoning_then_content_blocking_streamed_and_truncated() {
    let dir = scripted(Family::Qwen3, QWEN3_TEMPLATE, QWEN_REASONING);
    let server = serve(dir.path());
    let answer = server.post("/v1/chat/completions", &chat(json!({}))).json();
    let choice = &answer["choices"][0];
    let message = &choice["message"];
    assert_eq!(
        message["reasoning_content"], "\nThe user greets me.\n",
        "{answer}"
    );
    assert_eq!(message["reasoning"], "\nThe user greets me.\n");
    assert_eq!(message["content"], "\n\nHello there!");
    assert!(message.get("tool_calls").is_none());
    assert_eq!(choice["finish_reason"], "stop");

    let streamed = stream(&server, &chat(json!({})));
    assert_eq!(streamed.reasoning, "\nThe user greets me.\n");
    assert_eq!(streamed.content, "\n\nHello there!");
    assert_eq!(streamed.finish.as_deref(), Some("stop"));
    assert_no_markup(&streamed);

    // Cut inside the reasoning: reasoning so far, no content, `length`.
    let cut = chat(json!({"max_tokens": 2}));
    let answer = server.post("/v1/chat/completions", &cut).json();
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{answer}");
    assert_eq!(
        choice["message"]["reasoning_content"],
        "\nThe user greets me.\n"
    );
    assert_eq!(choice["message"]["content"], Value::Null);
    let streamed = stream(&server, &cut);
    assert_eq!(streamed.finish.as_deref(), Some("length"));
    assert_eq!(streamed.reasoning, "\nThe user greets me.\n");
    assert_eq!(streamed.content, "");
    // Cut just after half a tag: the held-back `</th` is reasoning text
    // once the output ends there.
    let streamed = stream(&server, &chat(json!({"max_tokens": 3})));
    assert_eq!(streamed.reasoning, "\nThe user greets me.\n</th");

    // The plain completions route is not parsed.
    let completion = server
        .post(
            "/v1/completions",
            &json!({"prompt": "<|im_start|>assistant\n", "max_tokens": 20}),
        )
        .json();
    assert_eq!(
        completion["choices"][0]["text"],
        "<think>\nThe user greets me.\n</think>\n\nHello there!"
    );

    parsers_check(
        &server,
        &json!({"reasoning": "\nThe user greets me.\n", "content": "\n\nHello there!",
                "tool": null}),
    );
}

const WEATHER_JSON: &str = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";

#[test]
fn qwen3_reasoning_then_tool_call_and_tool_call_only() {
    let json_token = format!("\n{WEATHER_JSON}\n");
    let with_reasoning = [
        "<think>",
        "\nNeed the weather.\n",
        "</think>",
        "\n\n",
        "<tool_call>",
        json_token.as_str(),
        "</tool_call>",
        "<|im_end|>",
    ];
    let dir = scripted(Family::Qwen3, QWEN3_TEMPLATE, &with_reasoning);
    let server = serve(dir.path());
    let answer = server.post("/v1/chat/completions", &chat(json!({}))).json();
    let choice = &answer["choices"][0];
    let message = &choice["message"];
    assert_eq!(
        message["reasoning_content"], "\nNeed the weather.\n",
        "{answer}"
    );
    assert_eq!(message["content"], Value::Null);
    let call = &message["tool_calls"][0];
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], "{\"city\": \"Paris\"}");
    assert_eq!(choice["finish_reason"], "tool_calls");
    let streamed = stream(&server, &chat(json!({})));
    assert_eq!(streamed.reasoning, "\nNeed the weather.\n");
    assert_eq!(streamed.content, "");
    assert_eq!(streamed.calls.len(), 1);
    assert_eq!(streamed.calls[0].1, "get_weather");
    assert_eq!(streamed.calls[0].2, "{\"city\": \"Paris\"}");
    assert_eq!(streamed.finish.as_deref(), Some("tool_calls"));
    assert_no_markup(&streamed);
    parsers_check(
        &server,
        &json!({"reasoning": "\nNeed the weather.\n", "content": null,
                "tool": {"name": "get_weather", "arguments": {"city": "Paris"}}}),
    );
    drop(server);

    // Only a call, and its JSON broken: content, never an error.
    let broken = [
        "<tool_call>",
        "{\"name\": get_weather}",
        "</tool_call>",
        "<|im_end|>",
    ];
    let dir = scripted(Family::Qwen3, QWEN3_TEMPLATE, &broken);
    let server = serve(dir.path());
    let answer = server.post("/v1/chat/completions", &chat(json!({}))).json();
    let choice = &answer["choices"][0];
    assert_eq!(
        choice["message"]["content"], "<tool_call>{\"name\": get_weather}</tool_call>",
        "{answer}"
    );
    assert_eq!(choice["finish_reason"], "stop");
    let streamed = stream(&server, &chat(json!({})));
    assert_eq!(
        streamed.content,
        "<tool_call>{\"name\": get_weather}</tool_call>"
    );
    assert!(streamed.calls.is_empty());
}

// ------------------------------------------------------ Qwen3.5 / Qwen3.6

/// A request offering a weather tool with a typed parameter (`days` is an
/// integer: the XML format writes it as text, the parser converts it).
fn xml_chat(extra: Value) -> Value {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                       "days": {"type": "integer"}},
                       "required": ["city"]}}}]);
    let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0,
                          "tools": tools});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// What the scripted Qwen3.6 model writes first: its reasoning closed, then
/// `get_weather(city="New York", days=3)` in XML, the tags split across
/// tokens.
const FIRST_WEATHER_CALL: [&str; 10] = [
    "I need the weather.\n",
    "</think>",
    "\n\n",
    "<tool_call>",
    "\n<function=get_",
    "weather>\n<param",
    "eter=city>\nNew York\n</para",
    "meter>\n<parameter=days>\n3\n</parameter>\n</func",
    "tion>\n",
    "</tool_call>",
];

/// Qwen3.6's official template opens `<think>` in the generation prompt;
/// the model closes it and calls two tools in XML, the tags split across
/// tokens. Its checkpoint is `qwen3_moe` (the scripted family), so the XML
/// parser is chosen by the template, not the family: no flag.
#[test]
fn qwen3_6_xml_tool_calls_blocking_streamed_and_as_content_without_tools() {
    let output: Vec<&str> = FIRST_WEATHER_CALL
        .into_iter()
        .chain([
            "\n<tool",
            "_call>\n",
            "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool",
            "_call>",
            "<|im_end|>",
        ])
        .collect();
    let dir = scripted(Family::Qwen3, QWEN36_TEMPLATE, &output);
    let server = serve(dir.path());
    let want_args = [r#"{"city": "New York", "days": 3}"#, r#"{"city": "Paris"}"#];

    let answer = server
        .post("/v1/chat/completions", &xml_chat(json!({})))
        .json();
    let choice = &answer["choices"][0];
    let message = &choice["message"];
    assert_eq!(
        message["reasoning_content"], "I need the weather.\n",
        "{answer}"
    );
    assert_eq!(message["content"], Value::Null);
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{answer}");
    for (call, want) in calls.iter().zip(want_args) {
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], want);
    }
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    // The arguments are JSON with the declared type.
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["days"], 3);
    assert_eq!(choice["finish_reason"], "tool_calls");

    let streamed = stream(&server, &xml_chat(json!({})));
    assert_eq!(streamed.reasoning, "I need the weather.\n");
    assert_eq!(streamed.content, "");
    assert_eq!(streamed.calls.len(), 2);
    for ((_, name, args), want) in streamed.calls.iter().zip(want_args) {
        assert_eq!(name, "get_weather");
        assert_eq!(args, want);
    }
    assert_eq!(streamed.finish.as_deref(), Some("tool_calls"));
    assert_no_markup(&streamed);

    // `parallel_tool_calls: false` under "auto" (vLLM's meaning): the
    // answer keeps its first call, blocking and streamed, and generation
    // ends with that call's `</tool_call>` (one token per scripted piece).
    let everything = server
        .post("/v1/chat/completions", &xml_chat(json!({})))
        .json();
    assert_eq!(
        everything["usage"]["completion_tokens"],
        output.len(),
        "{everything}"
    );
    let first_close = output.iter().position(|p| *p == "</tool_call>").unwrap() + 1;
    let single = xml_chat(json!({"parallel_tool_calls": false}));
    let answer = server.post("/v1/chat/completions", &single).json();
    assert_eq!(
        answer["usage"]["completion_tokens"], first_close,
        "{answer}"
    );
    let choice = &answer["choices"][0];
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{answer}");
    assert_eq!(calls[0]["function"]["arguments"], want_args[0]);
    assert_eq!(choice["finish_reason"], "tool_calls");
    let streamed = stream(&server, &single);
    assert_eq!(streamed.calls.len(), 1);
    assert_eq!(streamed.calls[0].2, want_args[0]);
    assert_eq!(streamed.finish.as_deref(), Some("tool_calls"));
    assert_no_markup(&streamed);

    // Without tools the answer is not parsed for calls: the XML is content.
    let mut plain = xml_chat(json!({}));
    plain.as_object_mut().unwrap().remove("tools");
    let answer = server.post("/v1/chat/completions", &plain).json();
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "I need the weather.\n");
    assert_eq!(message["content"], output[2..output.len() - 1].concat());
    assert!(message.get("tool_calls").is_none(), "{answer}");

    // The openai client offers its own schema, which does not declare
    // `days`: an undeclared parameter stays a string.
    parsers_check(
        &server,
        &json!({"reasoning": "I need the weather.\n", "content": null,
                "tools": [
                    {"name": "get_weather", "arguments": {"city": "New York", "days": "3"}},
                    {"name": "get_weather", "arguments": {"city": "Paris"}}]}),
    );
}

/// `strict: true` under `"auto"`: the calls the answer makes are held to
/// the schema (a grammar of free text, then calls), and an answer the
/// schema admits passes through unchanged. The script calls
/// `get_weather(city="New York", days=3)`.
#[test]
fn strict_functions_under_auto_hold_the_calls_to_their_schema() {
    let output: Vec<&str> = FIRST_WEATHER_CALL
        .into_iter()
        .chain(["<|im_end|>"])
        .collect();
    let dir = scripted(Family::Qwen3, QWEN36_TEMPLATE, &output);
    let server = serve(dir.path());
    let ask = |days: Value, strict: bool| {
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "strict": strict,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                           "days": days},
                           "required": ["city", "days"]}}}]);
        // One call: off its script the model would call again and again
        // (and spells what the grammar forces a byte a token).
        let body =
            xml_chat(json!({"tools": tools, "max_tokens": 200, "parallel_tool_calls": false}));
        let answer = server.post("/v1/chat/completions", &body).json();
        let choice = answer["choices"][0].clone();
        assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap().clone();
        assert_eq!(calls.len(), 1, "{answer}");
        let arguments: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        arguments
    };
    let written = json!({"city": "New York", "days": 3});
    // What the schema admits is what the model wrote, strict or not.
    let days = json!({"type": "integer", "minimum": 1, "maximum": 9});
    assert_eq!(ask(days.clone(), false), written);
    assert_eq!(ask(days, true), written);
    // `days` at most 2: without `strict` the model's 3 stands; with it the
    // grammar refused that token and the call is the schema's.
    let days = json!({"type": "integer", "minimum": 1, "maximum": 2});
    assert_eq!(ask(days.clone(), false), written);
    let held = ask(days, true);
    let n = held["days"].as_i64().unwrap_or_else(|| panic!("{held}"));
    assert!((1..=2).contains(&n), "{held}");
    assert!(held["city"].is_string(), "{held}");
}

#[test]
fn qwen3_6_xml_call_that_is_not_one_is_content() {
    // Hermes JSON where the template taught XML: content, never an error.
    let output = [
        "Let me see.\n</think>",
        "\n\nSure. ",
        "<tool_call>",
        "\n{\"name\": \"get_weather\"}\n",
        "</tool_call>",
        "<|im_end|>",
    ];
    let dir = scripted(Family::Qwen3, QWEN36_TEMPLATE, &output);
    let server = serve(dir.path());
    let want = "\n\nSure. <tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>";
    let answer = server
        .post("/v1/chat/completions", &xml_chat(json!({})))
        .json();
    let choice = &answer["choices"][0];
    assert_eq!(choice["message"]["content"], want, "{answer}");
    assert!(choice["message"].get("tool_calls").is_none());
    assert_eq!(choice["finish_reason"], "stop");
    let streamed = stream(&server, &xml_chat(json!({})));
    assert_eq!(streamed.reasoning, "Let me see.\n");
    assert_eq!(streamed.content, want);
    assert!(streamed.calls.is_empty());
}

// ----------------------------------------------------------------- gpt-oss

const HARMONY_REASONING: &[&str] = &[
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

#[test]
fn gpt_oss_harmony_reasoning_then_final_over_special_tokens() {
    let dir = scripted(Family::GptOss, GPTOSS_TEMPLATE, HARMONY_REASONING);
    let server = serve(dir.path());
    let answer = server.post("/v1/chat/completions", &chat(json!({}))).json();
    let choice = &answer["choices"][0];
    assert_eq!(
        choice["message"]["reasoning_content"], "The user says hi.",
        "{answer}"
    );
    assert_eq!(choice["message"]["content"], "Hello there!");
    assert_eq!(choice["finish_reason"], "stop");
    let streamed = stream(&server, &chat(json!({})));
    assert_eq!(streamed.reasoning, "The user says hi.");
    assert_eq!(streamed.content, "Hello there!");
    assert_no_markup(&streamed);
    // Special tokens shown on request: the parse is the same, the client
    // still sees no harmony markup in the parsed fields.
    let shown = chat(json!({"skip_special_tokens": false}));
    let answer = server.post("/v1/chat/completions", &shown).json();
    assert_eq!(
        answer["choices"][0]["message"]["content"], "Hello there!",
        "{answer}"
    );
    // Truncated inside the analysis message.
    let cut = chat(json!({"max_tokens": 4}));
    let answer = server.post("/v1/chat/completions", &cut).json();
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{answer}");
    assert_eq!(choice["message"]["reasoning_content"], "The user says hi.");
    assert_eq!(choice["message"]["content"], Value::Null);

    // Completions: special tokens left out by default, shown on request.
    let prompt = json!({"prompt": "<|start|>assistant", "max_tokens": 20});
    let text = server.post("/v1/completions", &prompt).json()["choices"][0]["text"].clone();
    assert_eq!(text, "analysisThe user says hi.assistantfinalHello there!");
    let mut shown = prompt.clone();
    shown["skip_special_tokens"] = json!(false);
    shown["spaces_between_special_tokens"] = json!(false);
    let text = server.post("/v1/completions", &shown).json()["choices"][0]["text"].clone();
    assert_eq!(
        text,
        "<|channel|>analysis<|message|>The user says hi.<|end|><|start|>assistant\
         <|channel|>final<|message|>Hello there!"
    );
    parsers_check(
        &server,
        &json!({"reasoning": "The user says hi.", "content": "Hello there!", "tool": null}),
    );
}

#[test]
fn gpt_oss_harmony_tool_calls_with_and_without_reasoning() {
    let with_reasoning = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "Need the weather.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "commentary to=functions.get_weather ",
        "<|constrain|>",
        "json",
        "<|message|>",
        "{\"city\": \"Paris\"}",
        "<|call|>",
    ];
    let dir = scripted(Family::GptOss, GPTOSS_TEMPLATE, &with_reasoning);
    let server = serve(dir.path());
    let answer = server.post("/v1/chat/completions", &chat(json!({}))).json();
    let choice = &answer["choices"][0];
    assert_eq!(
        choice["message"]["reasoning_content"], "Need the weather.",
        "{answer}"
    );
    assert_eq!(choice["message"]["content"], Value::Null);
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["arguments"],
        "{\"city\": \"Paris\"}"
    );
    assert_eq!(choice["finish_reason"], "tool_calls");
    let streamed = stream(&server, &chat(json!({})));
    assert_eq!(streamed.reasoning, "Need the weather.");
    assert_eq!(streamed.calls.len(), 1);
    assert_eq!(streamed.calls[0].2, "{\"city\": \"Paris\"}");
    assert_eq!(streamed.finish.as_deref(), Some("tool_calls"));
    parsers_check(
        &server,
        &json!({"reasoning": "Need the weather.", "content": null,
                "tool": {"name": "get_weather", "arguments": {"city": "Paris"}}}),
    );
    drop(server);

    // Three messages (reasoning, a preamble on commentary, the call): the
    // repeated `<|channel|>` needs two markers.
    let three = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "Need the weather.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "commentary",
        "<|message|>",
        "Let me look that up.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "commentary to=functions.get_weather",
        "<|message|>",
        "{\"city\": \"Paris\"}",
        "<|call|>",
    ];
    let dir = scripted(Family::GptOss, GPTOSS_TEMPLATE, &three);
    let server = serve(dir.path());
    let answer = server.post("/v1/chat/completions", &chat(json!({}))).json();
    let message = &answer["choices"][0]["message"];
    assert_eq!(
        message["reasoning_content"], "Need the weather.",
        "{answer}"
    );
    assert_eq!(message["content"], "Let me look that up.");
    assert_eq!(
        message["tool_calls"][0]["function"]["arguments"],
        "{\"city\": \"Paris\"}"
    );
    let streamed = stream(&server, &chat(json!({})));
    assert_eq!(streamed.content, "Let me look that up.");
    assert_eq!(streamed.calls.len(), 1);
    drop(server);

    // Only the call, the recipient before the channel.
    let only = [
        " to=functions.get_weather",
        "<|channel|>",
        "commentary json",
        "<|message|>",
        "{\"city\": \"Paris\"}",
        "<|call|>",
    ];
    let dir = scripted(Family::GptOss, GPTOSS_TEMPLATE, &only);
    let server = serve(dir.path());
    let answer = server.post("/v1/chat/completions", &chat(json!({}))).json();
    let choice = &answer["choices"][0];
    assert!(
        choice["message"].get("reasoning_content").is_none(),
        "{answer}"
    );
    assert_eq!(choice["message"]["content"], Value::Null);
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(choice["finish_reason"], "tool_calls");
}

/// `tool_choice` required / named on gpt-oss: a grammar of harmony calls
/// over its special tokens. The call the model writes (reasoning first,
/// then `commentary to=functions.N <|constrain|>json`) passes through
/// untouched; arguments off the schema are held to it.
#[test]
fn gptoss_forced_tool_choice_is_held_to_a_harmony_call() {
    let call = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "Need the weather.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "commentary to=functions.get_weather ",
        "<|constrain|>",
        "json",
        "<|message|>",
        "{\"city\": \"Paris\"}",
        "<|call|>",
    ];
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let dir = scripted(Family::GptOss, GPTOSS_TEMPLATE, &call);
    let server = serve(dir.path());
    for choice in [named.clone(), json!("required")] {
        let body = chat(json!({"tool_choice": choice}));
        let answer = server.post("/v1/chat/completions", &body).json();
        let first = &answer["choices"][0];
        let message = &first["message"];
        assert_eq!(
            message["reasoning_content"], "Need the weather.",
            "{answer}"
        );
        assert_eq!(message["content"], Value::Null, "{answer}");
        let calls = message["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{answer}");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(calls[0]["function"]["arguments"], "{\"city\": \"Paris\"}");
        assert_eq!(first["finish_reason"], "tool_calls");
        let streamed = stream(&server, &body);
        assert_eq!(streamed.calls.len(), 1);
        assert_eq!(streamed.calls[0].2, "{\"city\": \"Paris\"}");
        assert_no_markup(&streamed);
    }
    drop(server);

    // Arguments off the schema (a city outside its `enum`): unconstrained
    // they come back as written; under the grammar they follow the schema.
    let mut off_schema = call;
    off_schema[12] = "{\"city\": \"Berlin\"}";
    let dir = scripted(Family::GptOss, GPTOSS_TEMPLATE, &off_schema);
    let server = serve(dir.path());
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                       "required": ["city"], "additionalProperties": false}}}]);
    let free = chat(json!({"tools": tools, "max_tokens": 64}));
    let answer = server.post("/v1/chat/completions", &free).json();
    let arguments = &answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"];
    assert_eq!(arguments, "{\"city\": \"Berlin\"}", "{answer}");
    let body = chat(json!({"tools": tools, "tool_choice": named, "max_tokens": 64}));
    let answer = server.post("/v1/chat/completions", &body).json();
    let first = &answer["choices"][0];
    let calls = first["message"]["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"));
    assert_eq!(calls.len(), 1, "{answer}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        arguments == json!({"city": "Paris"}) || arguments == json!({"city": "Rome"}),
        "{arguments}"
    );
    assert_eq!(first["finish_reason"], "tool_calls");
}

#[test]
fn make_checkpoint_builds_from_a_script_file() {
    let dir = tempfile::tempdir().unwrap();
    let (template, _) = template(QWEN3_TEMPLATE);
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        json!({"family": "qwen3", "chat_template_file": template,
               "output": ["Hello", " world", "<|im_end|>"]})
        .to_string(),
    )
    .unwrap();
    let out = dir.path().join("ckpt");
    let o = common::sparkrt(&[
        "make-checkpoint",
        "--script",
        script.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    for file in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ] {
        assert!(out.join(file).is_file(), "{file}");
    }
    // A script that repeats a token in the same context is refused by name.
    std::fs::write(
        &script,
        json!({"family": "qwen3", "chat_template_file": template,
               "output": ["<think>", "a", "<think>", "b", "<|im_end|>"]})
        .to_string(),
    )
    .unwrap();
    let o = common::sparkrt(&[
        "make-checkpoint",
        "--script",
        script.to_str().unwrap(),
        "--out",
        dir.path().join("other").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        common::stderr(&o).contains("<think>"),
        "{}",
        common::stderr(&o)
    );
}

#[test]
fn parser_flags_override_the_family_and_are_checked_against_the_tokenizer() {
    let dir = scripted(Family::Qwen3, QWEN3_TEMPLATE, QWEN_REASONING);
    let model = dir.path().to_str().unwrap();
    let server = Server::start(&[
        "--model",
        model,
        "--reasoning-parser",
        "none",
        "--tool-call-parser",
        "none",
    ]);
    let answer = server.post("/v1/chat/completions", &chat(json!({}))).json();
    let message = &answer["choices"][0]["message"];
    assert_eq!(
        message["content"], "<think>\nThe user greets me.\n</think>\n\nHello there!",
        "{answer}"
    );
    assert!(message.get("reasoning_content").is_none());
    drop(server);

    // Harmony asked for on a tokenizer without its tokens: refused at start.
    let box24 = crate::server::box24();
    let serve = |flags: &[&str]| {
        let mut args = vec![
            "serve",
            "--model",
            model,
            "--port",
            "0",
            "--host-root",
            box24.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        common::sparkrt(&args)
    };
    let o = serve(&[
        "--tool-call-parser",
        "openai_gptoss",
        "--reasoning-parser",
        "none",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    assert!(
        common::stderr(&o).contains("<|channel|>"),
        "{}",
        common::stderr(&o)
    );
    let o = serve(&["--reasoning-parser", "deepseek_r1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        common::stderr(&o).contains("qwen3, openai_gptoss, none"),
        "{}",
        common::stderr(&o)
    );
}

#[test]
fn gpt_oss_without_harmony_tokens_serves_plain_content() {
    // The tiny fixture's tokenizer is chatml: the family's default parser
    // cannot run, so it is off (with a warning) and answers are content.
    let server = Server::start(&["--profile", "gpt-oss-tiny"]);
    assert!(
        server.log().contains("output parser openai_gptoss off"),
        "{}",
        server.log()
    );
    let body = chat(json!({"max_tokens": 5}));
    let answer = server.post("/v1/chat/completions", &body).json();
    let message = &answer["choices"][0]["message"];
    assert!(message["content"].is_string(), "{answer}");
    assert!(message.get("reasoning_content").is_none());
    let streamed = stream(&server, &body);
    assert_eq!(Value::String(streamed.content), message["content"]);
}

/// Why the independent reading of scripted checkpoints cannot run here.
fn missing_reference_tools() -> Option<String> {
    common::missing_python_modules("numpy, transformers")
}

/// The checkpoints are what transformers reads (config, tokenizer, chat
/// template), and their weights, run by an independent numpy forward pass
/// (`scripts/scripted_reference.py`), write the script: for Qwen3 and for a
/// harmony script whose repeated tokens need the attention markers.
#[test]
fn scripted_checkpoints_write_their_script_when_read_by_transformers_and_numpy() {
    if !common::tool_present(
        "the scripted checkpoint reference",
        missing_reference_tools(),
    ) {
        return;
    }
    let harmony = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "Need the weather.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "commentary",
        "<|message|>",
        "Let me look that up.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "commentary to=functions.get_weather",
        "<|message|>",
        "{}",
        "<|call|>",
    ];
    for (family, template, output) in [
        (Family::Qwen3, QWEN3_TEMPLATE, QWEN_REASONING),
        (Family::GptOss, GPTOSS_TEMPLATE, &harmony[..]),
    ] {
        let dir = scripted(family, template, output);
        let o = Command::new("python3")
            .arg(repo().join("scripts/scripted_reference.py"))
            .arg(dir.path())
            .arg("40")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let stdout = String::from_utf8_lossy(&o.stdout);
        let line = stdout.lines().last().unwrap_or("");
        let reference: Value = serde_json::from_str(line).unwrap();
        assert_eq!(reference["text"], output.concat(), "{family:?}");
        assert_eq!(reference["down_projections_zero"], true);
    }
}

#[test]
fn qwen3_prompt_that_opens_think_starts_the_output_in_reasoning() {
    let dir = tempfile::tempdir().unwrap();
    let script = Script {
        family: Family::Qwen3,
        chat_template_file: PathBuf::from("inline"),
        output: ["A greeting.", "\n</think>", "\n\nHello!", "<|im_end|>"]
            .map(String::from)
            .to_vec(),
        after: None,
    };
    write_scripted(&script, THINKING_TEMPLATE, dir.path()).unwrap();
    let server = serve(dir.path());
    let answer = server.post("/v1/chat/completions", &chat(json!({}))).json();
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "A greeting.\n", "{answer}");
    assert_eq!(message["content"], "\n\nHello!");
    let streamed = stream(&server, &chat(json!({})));
    assert_eq!(streamed.reasoning, "A greeting.\n");
    assert_eq!(streamed.content, "\n\nHello!");
}
