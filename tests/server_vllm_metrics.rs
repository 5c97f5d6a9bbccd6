//! `/metrics` for the stock vLLM Grafana dashboard and for sparkrt's own
//! (`deploy/grafana/sparkrt.json`), after a short load: every sample
//! carries `model_name`; the README's relabel rules, applied as Prometheus
//! applies them, yield every family the stock dashboard queries; every
//! metric sparkrt's dashboard names is exposed; `--metrics-no-auth` opens
//! `/metrics` (only) to a scraper without the key.

use std::collections::BTreeSet;

use regex::Regex;
use serde_json::{Value, json};

use crate::server::{Server, repo};

const KEY: &str = "metrics-test-key";
const MODEL: &str = "qwen3-moe-tiny";

/// The series the stock vLLM dashboard queries
/// (vllm-project/vllm `examples/online_serving/prometheus_grafana/grafana.json`),
/// with `kv_cache_usage_perc` for the older `gpu_cache_usage_perc`.
const STOCK_DASHBOARD: &[&str] = &[
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_per_output_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_count",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:kv_cache_usage_perc",
    "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket",
    "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
    "vllm:num_preemptions_total",
];

/// One `metric_relabel_configs` rule on `__name__`.
struct Rule {
    regex: Regex,
    replacement: String,
}

/// The README's rules, in order.
fn readme_rules() -> Vec<Rule> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme.find("<!-- vllm-relabel:start -->").unwrap();
    let end = readme.find("<!-- vllm-relabel:end -->").unwrap();
    let block = &readme[start..end];
    let yaml = &block[block.find("```yaml").unwrap() + 7..block.rfind("```").unwrap()];
    let config: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
    config["metric_relabel_configs"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|rule| {
            assert_eq!(rule["source_labels"][0].as_str(), Some("__name__"));
            assert_eq!(rule["target_label"].as_str(), Some("__name__"));
            // Prometheus anchors relabel regexes at both ends.
            let regex = format!("^(?:{})$", rule["regex"].as_str().unwrap());
            Rule {
                regex: Regex::new(&regex).unwrap(),
                replacement: rule["replacement"].as_str().unwrap().to_string(),
            }
        })
        .collect()
}

/// `name` after the rules, as Prometheus applies them: each in turn, on
/// the name the previous ones left; one that does not match changes nothing.
fn relabel(rules: &[Rule], name: &str) -> String {
    let mut name = name.to_string();
    for rule in rules {
        if let Some(captures) = rule.regex.captures(&name) {
            let mut out = String::new();
            captures.expand(&rule.replacement, &mut out);
            name = out;
        }
    }
    name
}

/// The sample lines of a `/metrics` text: (name, labels).
fn samples(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let (series, _) = line.rsplit_once(' ').unwrap();
            match series.split_once('{') {
                Some((name, labels)) => (name.to_string(), labels.to_string()),
                None => (series.to_string(), String::new()),
            }
        })
        .collect()
}

/// Every `expr` of a Grafana dashboard.
fn exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[test]
fn metrics_serve_the_stock_vllm_dashboard_and_sparkrts_own() {
    let mut server = Server::start_with_key(&["--api-key", KEY, "--metrics-no-auth"], Some(KEY));
    // A short load: one sequence cut at max_tokens, one that stops by
    // itself (greedy ends this prompt with end-of-sequence), one chat.
    for body in [
        json!({"prompt": "Hello there, how are you", "max_tokens": 4, "temperature": 0}),
        json!({"prompt": "Tell me a story", "max_tokens": 200, "temperature": 0}),
    ] {
        assert_eq!(server.post("/v1/completions", &body).status, 200);
    }
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3});
    assert_eq!(server.post("/v1/chat/completions", &chat).status, 200);
    server.wait_until_idle();

    // --metrics-no-auth: /metrics without the key, the API still guarded.
    server.set_key(None);
    assert_eq!(server.get("/v1/models").status, 401);
    let reply = server.get("/metrics");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let text = reply.body;

    let samples = samples(&text);
    assert!(samples.len() > 50, "{text}");
    let model_label = format!("model_name=\"{MODEL}\"");
    for (name, labels) in &samples {
        assert!(
            labels.contains(&model_label),
            "{name}{{{labels}}} has no {model_label}"
        );
    }
    let names: BTreeSet<&str> = samples.iter().map(|(n, _)| n.as_str()).collect();

    let rules = readme_rules();
    let renamed: BTreeSet<String> = names.iter().map(|n| relabel(&rules, n)).collect();
    for wanted in STOCK_DASHBOARD {
        assert!(
            renamed.contains(*wanted),
            "{wanted} missing after the README's relabel rules: {renamed:?}"
        );
    }
    // Finish reasons as vLLM labels them, both seen in the load.
    for reason in ["stop", "length"] {
        let label = format!("finished_reason=\"{reason}\"");
        assert!(
            samples
                .iter()
                .any(|(n, l)| n == "sparkrt_request_success_total" && l.contains(&label)),
            "no {label} in {text}"
        );
    }

    // sparkrt's dashboard: every metric its queries name is exposed.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grafana/sparkrt.json")).unwrap(),
    )
    .unwrap();
    let mut queries = Vec::new();
    exprs(&dashboard, &mut queries);
    assert!(queries.len() >= 20, "{queries:?}");
    let metric = Regex::new(r"sparkrt_[a-z0-9_]+").unwrap();
    for query in &queries {
        assert!(
            query.contains("model_name=\"$model_name\""),
            "{query} filters on model_name"
        );
        for found in metric.find_iter(query) {
            assert!(
                names.contains(found.as_str()),
                "{} (in {query}) is not in /metrics",
                found.as_str()
            );
        }
    }
}

#[test]
fn with_a_key_metrics_need_it_unless_metrics_no_auth() {
    let mut server = Server::start_with_key(&["--api-key", KEY], Some(KEY));
    assert_eq!(server.get("/metrics").status, 200);
    server.set_key(None);
    assert_eq!(server.get("/metrics").status, 401);
}
