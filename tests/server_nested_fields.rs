//! Item by item, the rule *refuse, don't ignore* at every depth of a
//! request: the README's table of nested keys sent to each route it names
//! (an unknown key is a 400 naming its JSON path), and vLLM's
//! `stream_options.continuous_usage_stats` through the official `openai`
//! client (`scripts/openai_vllm_check.py`).

use crate::common;
use crate::server;

use serde_json::{Value, json};
use server::{Server, repo};

/// One row of the README's nested-fields table.
struct NestedRow {
    path: String,
    sent: Value,
    routes: Vec<String>,
    answer: String,
}

fn readme_rows() -> Vec<NestedRow> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme.find("<!-- nested-fields:start -->").unwrap();
    let end = readme.find("<!-- nested-fields:end -->").unwrap();
    readme[start..end]
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let unquote = |cell: &str| cell.trim_matches('`').to_string();
            NestedRow {
                path: unquote(cells[1]),
                sent: serde_json::from_str(&unquote(cells[2]))
                    .unwrap_or_else(|e| panic!("row {}: {e}", cells[1])),
                routes: cells[3].split(", ").map(str::to_string).collect(),
                answer: cells[4].to_string(),
            }
        })
        .collect()
}

/// A small valid request of `route`, with `sent` merged over it.
fn request(route: &str, sent: &Value) -> (&'static str, Value) {
    let (path, mut body) = match route {
        "completions" => ("/v1/completions", json!({"prompt": "Hi", "max_tokens": 2})),
        "chat" => (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
        ),
        "responses" => (
            "/v1/responses",
            json!({"input": "Hi", "max_output_tokens": 2}),
        ),
        other => panic!("unknown route {other:?} in the README's table"),
    };
    for (k, v) in sent.as_object().unwrap() {
        body[k] = v.clone();
    }
    body["temperature"] = json!(0);
    (path, body)
}

#[test]
fn the_readme_table_of_nested_keys_holds() {
    let rows = readme_rows();
    assert!(rows.len() >= 10, "the table has {} rows", rows.len());
    let server = Server::start(&[]);
    for row in &rows {
        for route in &row.routes {
            let (path, body) = request(route, &row.sent);
            let reply = server.post(path, &body);
            match row.answer.as_str() {
                "supported" => assert_eq!(
                    reply.status, 200,
                    "{route}: `{}` is supported by the README: {}",
                    row.path, reply.body
                ),
                "refused" => {
                    let error = reply.assert_error(400);
                    assert_eq!(error["code"], "unsupported_parameter", "{route}: {error}");
                    assert_eq!(error["param"], row.path.as_str(), "{route}: {error}");
                }
                other => panic!("`{}`: unknown answer {other:?}", row.path),
            }
        }
    }
}

/// Why the openai client cannot run here, if it cannot.
fn missing_client() -> Option<String> {
    common::missing_python_modules("openai")
}

#[test]
fn continuous_usage_and_nested_refusals_through_the_openai_client() {
    if !common::tool_present("the official openai client", missing_client()) {
        return;
    }
    let server = Server::start(&[]);
    let stdout = server.run_script("openai_vllm_check.py", &[]);
    assert!(stdout.contains("openai vllm check passed"), "{stdout}");
}
