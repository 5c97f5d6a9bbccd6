//! `/metrics` read by the official Prometheus text parser (Python's
//! `prometheus_client`): it parses, and its histograms and request counts
//! add up to the requests of a run.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::common;
use crate::server::Server;

/// Parses Prometheus text from stdin and writes `{sample name + labels: value}`,
/// after checking that every sample carries `model_name` (left out of the
/// keys: the tests name samples by their own labels).
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        if s.labels.pop("model_name", None) != "qwen3-moe-tiny":
            sys.exit(f"{s.name} {s.labels} has no model_name=qwen3-moe-tiny")
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        out[s.name + ("{" + labels + "}" if labels else "")] = s.value
json.dump(out, sys.stdout)
"#;

fn missing_parser() -> Option<String> {
    common::missing_python_modules("prometheus_client.parser")
}

/// `/metrics` through the reference parser (which fails on malformed text).
fn parsed(text: &str) -> Value {
    let mut child = Command::new("python3")
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "prometheus_client refused /metrics: {}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn histograms_and_outcomes_count_every_request_of_a_run() {
    if !common::tool_present("/metrics parse check", missing_parser()) {
        return;
    }
    let server = Server::start(&[]);
    let ok = 5;
    for i in 0..ok {
        let body = json!({"prompt": [1, 2, 3, 4 + i], "max_tokens": 3, "ignore_eos": true,
                          "stream": i % 2 == 1});
        let reply = server.post("/v1/completions", &body);
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let bad = [
        json!({"prompt": [1, 2], "max_tokens": 0}),
        json!({"prompt": [1, 2], "n": 0}),
        json!({"prompt": [1, 2], "n": 3, "best_of": 2}),
    ];
    for body in &bad {
        server.post("/v1/completions", body).assert_error(400);
    }
    server
        .post("/v1/completions", &json!({"prompt": [1], "model": "nope"}))
        .assert_error(404);
    server.wait_until_idle();

    let m = parsed(&server.get("/metrics").body);
    let get = |name: &str| {
        m[name]
            .as_f64()
            .unwrap_or_else(|| panic!("{name} in {m:#}"))
    };
    let outcome = |o: &str| get(&format!("sparkrt_requests_total{{outcome=\"{o}\"}}"));
    assert_eq!(outcome("ok"), ok as f64);
    assert_eq!(outcome("4xx"), (bad.len() + 1) as f64);
    assert_eq!(outcome("5xx"), 0.0);
    assert_eq!(outcome("rejected"), 0.0);
    assert_eq!(outcome("cancelled"), 0.0);
    // One observation per served request; each had 3 tokens, so 2 gaps.
    for name in [
        "time_to_first_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
    ] {
        assert_eq!(get(&format!("sparkrt_{name}_count")), ok as f64, "{name}");
        // The +Inf bucket holds every observation.
        assert_eq!(
            get(&format!("sparkrt_{name}_bucket{{le=\"+Inf\"}}")),
            ok as f64,
            "{name}"
        );
    }
    assert_eq!(
        get("sparkrt_inter_token_latency_seconds_count"),
        (2 * ok) as f64
    );
    assert_eq!(get("sparkrt_request_prompt_tokens_sum"), (4 * ok) as f64);
    assert_eq!(
        get("sparkrt_request_generation_tokens_sum"),
        (3 * ok) as f64
    );
    // 4 prompt tokens each: all in the le=5 bucket, none at le=2.
    assert_eq!(get("sparkrt_request_prompt_tokens_bucket{le=\"2.0\"}"), 0.0);
    assert_eq!(
        get("sparkrt_request_prompt_tokens_bucket{le=\"5.0\"}"),
        ok as f64
    );
    // Each request ran at least one prefill step, and decode steps after.
    assert!(get("sparkrt_prefill_step_seconds_count") >= 1.0);
    assert!(get("sparkrt_decode_step_seconds_count") >= 2.0);
    // vLLM's TTFT boundaries.
    assert!(
        m.get("sparkrt_time_to_first_token_seconds_bucket{le=\"0.001\"}")
            .is_some()
    );
    assert!(
        m.get("sparkrt_time_to_first_token_seconds_bucket{le=\"2560.0\"}")
            .is_some()
    );
    // The gauges and counters that were there before still are.
    assert_eq!(get("sparkrt_generation_tokens_total"), (3 * ok) as f64);
    assert_eq!(get("sparkrt_kv_blocks_used"), 0.0);
}
