//! CORS under vLLM's flags: without `--allowed-origins` no answer carries
//! a CORS header; with it, a browser's preflight is answered before the API
//! key check (it carries no key), disallowed origins, methods and headers
//! are refused, and the real requests' answers (errors too) name the
//! allowed origin.

use crate::common::{self, sparkrt};
use crate::server::{Server, box24};

use serde_json::json;

const KEY: &str = "cors-test-key";
const UI: &str = "http://ui.example";

fn preflight<'a>(method: &'a str, headers: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("Origin", UI),
        ("Access-Control-Request-Method", method),
        ("Access-Control-Request-Headers", headers),
    ]
}

fn cors_headers(reply: &crate::server::Reply) -> Vec<&str> {
    reply
        .headers
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| n.to_ascii_lowercase().starts_with("access-control-"))
        .collect()
}

#[test]
fn without_allowed_origins_no_answer_carries_cors_headers() {
    let server = Server::start_with_key(&["--api-key", KEY], Some(KEY));
    let reply = server.options_with(
        "/v1/chat/completions",
        &preflight("POST", "authorization, content-type"),
    );
    assert_ne!(reply.status, 200, "{}", reply.body);
    assert!(cors_headers(&reply).is_empty(), "{:?}", reply.headers);
    let reply = server.get_with("/v1/models", &[("Origin", UI)]);
    assert_eq!(reply.status, 200);
    assert!(cors_headers(&reply).is_empty(), "{:?}", reply.headers);
}

#[test]
fn allowed_origins_answer_preflights_before_the_key_and_mark_answers() {
    let origins = format!(r#"["{UI}"]"#);
    let server = Server::start_with_key(
        &[
            "--api-key",
            KEY,
            "--allowed-origins",
            &origins,
            "--allowed-methods",
            "GET,POST",
            "--allowed-headers",
            r#"["Authorization"]"#,
        ],
        Some(KEY),
    );
    // The preflight: answered without a key.
    let reply = server.options_with(
        "/v1/chat/completions",
        &preflight("POST", "authorization, content-type"),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("access-control-allow-origin"), Some(UI));
    assert_eq!(
        reply.header("access-control-allow-methods"),
        Some("GET, POST")
    );
    let allowed = reply.header("access-control-allow-headers").unwrap();
    assert!(allowed.contains("authorization") && allowed.contains("content-type"));
    assert!(reply.header("access-control-max-age").is_some());
    // What the policy does not allow is refused, with no allow header.
    for (headers, what) in [
        (
            vec![
                ("Origin", "http://evil.example"),
                ("Access-Control-Request-Method", "POST"),
            ],
            "origin",
        ),
        (preflight("DELETE", ""), "method"),
        (preflight("POST", "x-custom"), "header"),
    ] {
        let reply = server.options_with("/v1/chat/completions", &headers);
        let error = reply.assert_error(400);
        assert!(error["message"].as_str().unwrap().contains(what), "{error}");
        assert!(reply.header("access-control-allow-origin").is_none());
    }
    // The real request: its answer names the origin; so does a 401.
    let body = json!({"prompt": "Hi", "max_tokens": 2}).to_string();
    let reply = server.post_with("/v1/completions", body.as_bytes(), &[("Origin", UI)]);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("access-control-allow-origin"), Some(UI));
    assert_eq!(reply.header("vary"), Some("Origin"));
    let reply = server.post_with(
        "/v1/completions",
        body.as_bytes(),
        &[("Origin", UI), ("Authorization", "Bearer wrong")],
    );
    assert_eq!(reply.status, 401);
    assert_eq!(reply.header("access-control-allow-origin"), Some(UI));
    // Another origin's answer carries none.
    let reply = server.get_with("/v1/models", &[("Origin", "http://evil.example")]);
    assert_eq!(reply.status, 200);
    assert!(cors_headers(&reply).is_empty(), "{:?}", reply.headers);
}

#[test]
fn cors_flags_without_origins_or_malformed_exit_2_naming_them() {
    let host = box24().display().to_string();
    for (args, needle) in [
        (
            vec!["--allowed-methods", "GET"],
            "--allowed-methods needs --allowed-origins",
        ),
        (
            vec!["--allowed-origins", "[1]"],
            "--allowed-origins: not a JSON list",
        ),
    ] {
        let mut all = vec!["serve", "--port", "0", "--host-root", &host];
        all.extend_from_slice(&args);
        let out = sparkrt(&all);
        let stderr = common::stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
