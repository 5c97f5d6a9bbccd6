//! Prefix caching through the server: a chat's second turn takes the
//! first turn's prompt from the cache (`usage.prompt_tokens_details`),
//! `/metrics` counts queries and hits, `cache_salt` separates requests and
//! `--no-prefix-caching` turns it off.

use crate::server;

use serde_json::{Value, json};
use server::Server;

fn chat(server: &Server, messages: &Value, salt: Option<&str>) -> Value {
    let mut body = json!({"messages": messages, "max_tokens": 8, "temperature": 0});
    if let Some(salt) = salt {
        body["cache_salt"] = json!(salt);
    }
    let reply = server.post("/v1/chat/completions", &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()
}

fn cached(answer: &Value) -> u64 {
    answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_second_chat_turn_hits_the_first_turns_prompt() {
    let server = Server::start(&[]);
    let first_turn = json!([
        {"role": "system", "content": "You answer in one short sentence, politely and to the point."},
        {"role": "user", "content": "What is the capital of France, and why is it famous?"}
    ]);
    let first = chat(&server, &first_turn, None);
    assert_eq!(cached(&first), 0);
    let p1 = first["usage"]["prompt_tokens"].as_u64().unwrap();
    let reply = first["choices"][0]["message"]["content"].clone();
    let mut second_turn = first_turn.as_array().unwrap().clone();
    second_turn.push(json!({"role": "assistant", "content": reply}));
    second_turn.push(json!({"role": "user", "content": "And of Italy?"}));
    let second = chat(&server, &Value::Array(second_turn), None);
    // The template renders the first turn the same way again: all of its
    // full 16-token blocks come from the cache.
    assert!(
        cached(&second) >= p1 / 16 * 16,
        "second turn: {} cached of a first prompt of {p1}",
        cached(&second)
    );
    server.wait_until_idle();
    let m = server.metrics();
    assert_eq!(
        m.get("sparkrt_prefix_cache_hits_total"),
        cached(&second) as f64
    );
    assert!(m.get("sparkrt_prefix_cache_queries_total") >= (p1 - 1) as f64);
    assert!(m.get("sparkrt_kv_blocks_cached") > 0.0);

    // Another salt shares nothing; the same salt again does.
    let salted = chat(&server, &first_turn, Some("tenant-a"));
    assert_eq!(cached(&salted), 0);
    let again = chat(&server, &first_turn, Some("tenant-a"));
    assert_eq!(cached(&again), (p1 - 1) / 16 * 16);
    assert_eq!(
        again["choices"][0]["message"]["content"],
        salted["choices"][0]["message"]["content"]
    );
    let too_long = json!({"messages": first_turn, "max_tokens": 1,
                          "cache_salt": "x".repeat(sparkrt::limits::MAX_CACHE_SALT_BYTES + 1)});
    let reply = server.post("/v1/chat/completions", &too_long);
    assert_eq!(reply.status, 400, "{}", reply.body);
}

#[test]
fn responses_report_cached_input_tokens() {
    let server = Server::start(&[]);
    let body = json!({"input": "Describe a quiet morning by the lake in a few words, please.",
                      "max_output_tokens": 4, "temperature": 0});
    let usage = |reply: server::Reply| {
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.json()["usage"].clone()
    };
    let first = usage(server.post("/v1/responses", &body));
    let second = usage(server.post("/v1/responses", &body));
    let input = first["input_tokens"].as_u64().unwrap();
    assert!(input > 16, "the input fills a block ({input} tokens)");
    assert_eq!(first["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        second["input_tokens_details"]["cached_tokens"],
        (input - 1) / 16 * 16
    );
}

#[test]
fn no_prefix_caching_serves_every_prompt_cold() {
    let server = Server::start(&["--no-prefix-caching"]);
    let messages =
        json!([{"role": "user", "content": "Tell me something about the sea and its tides."}]);
    let first = chat(&server, &messages, None);
    let second = chat(&server, &messages, None);
    assert_eq!((cached(&first), cached(&second)), (0, 0));
    assert_eq!(
        first["choices"][0]["message"]["content"],
        second["choices"][0]["message"]["content"]
    );
    server.wait_until_idle();
    let m = server.metrics();
    assert_eq!(m.get("sparkrt_prefix_cache_queries_total"), 0.0);
    assert_eq!(m.get("sparkrt_kv_blocks_cached"), 0.0);
}

/// A completion of token ids on `server` (greedy, 8 tokens): its ids and
/// the prompt tokens it took from the cache.
fn complete_ids(server: &Server, prompt: &[u32]) -> (Value, u64) {
    let body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0,
                      "ignore_eos": true, "return_token_ids": true});
    let reply = server.post("/v1/completions", &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer = reply.json();
    (answer["choices"][0]["token_ids"].clone(), cached(&answer))
}

#[test]
fn gpt_oss_sliding_window_layers_hit_the_cache_and_answer_as_cold() {
    // gpt-oss-tiny: window 8, 16-token blocks. Two prompts share 45 tokens:
    // the second hits 2 full blocks (32 tokens) and, beside them, the
    // sliding blocks of the window before position 32.
    let model = crate::common::fixture("gpt-oss-tiny");
    let model = model.to_str().unwrap();
    let shared: Vec<u32> = (0..45).map(|i| 3 + (i * 7) % 150).collect();
    let mut first = shared.clone();
    first.extend([11, 12, 13]);
    let mut second = shared;
    second.extend([21, 22]);
    let server = Server::start(&["--model", model]);
    let (_, cold_first) = complete_ids(&server, &first);
    assert_eq!(cold_first, 0);
    let (warm, hit) = complete_ids(&server, &second);
    assert_eq!(hit, 32);
    drop(server);
    let cold = Server::start(&["--model", model, "--no-prefix-caching"]);
    let (reference, none) = complete_ids(&cold, &second);
    assert_eq!(none, 0);
    assert_eq!(warm, reference);
}

/// `scripts/load.py` ARGS, which must exit 0; its standard output.
fn load_py(args: &[&str]) -> String {
    let out = std::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/load.py"))
        .args(args)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "load.py {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn load_py_compares_the_shared_prefix_workload_with_and_without_caching() {
    let test = "load_py_compares_the_shared_prefix_workload_with_and_without_caching";
    if !crate::common::tool_present(test, crate::common::missing_command("python3")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut runs = Vec::new();
    for (name, args) in [("with", &[][..]), ("without", &["--no-prefix-caching"][..])] {
        let server = Server::start(args);
        let file = dir.path().join(format!("{name}.json"));
        let file = file.to_str().unwrap().to_string();
        let pid = server.pid().to_string();
        load_py(&[
            "--url",
            &server.url,
            "--pid",
            &pid,
            "--workload",
            "shared-prefix",
            "--clients",
            "2",
            "--requests",
            "4",
            "--system-tokens",
            "64",
            "--prompt-tokens",
            "8",
            "--output-tokens",
            "2",
            "--json-out",
            &file,
        ]);
        let figures: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        runs.push((file, figures));
    }
    // Each of the 4 measured requests (after a warm-up) takes the 64-token
    // system prompt's 4 full blocks from the cache, of 72 prompt tokens; a
    // server without caching serves none.
    let (with, without) = (&runs[0].1, &runs[1].1);
    assert_eq!(with["requests"], 4, "{with}");
    assert_eq!(with["cached_tokens"], 4 * 64, "{with}");
    assert_eq!(with["prefix_cache_hits"], 4.0 * 64.0, "{with}");
    let rate = with["hit_rate"].as_f64().unwrap();
    assert!((rate - 256.0 / 288.0).abs() < 1e-9, "{with}");
    assert_eq!(without["cached_tokens"], 0, "{without}");
    assert_eq!(with["rss_within_plan"], true, "{with}");
    let compared = load_py(&["--compare", &runs[0].0, &runs[1].0]);
    assert!(compared.contains("TTFT"), "{compared}");
    assert!(compared.to_lowercase().contains("hit rate"), "{compared}");
}

/// A hybrid (Gated DeltaNet) model through the server: a resent prompt of
/// 100 token ids starts from the snapshot at its last full block, 96
/// tokens, with the same answer; `/metrics` and `/v1/stats` count the
/// snapshot.
#[test]
fn a_hybrid_model_serves_a_resent_prompt_from_its_snapshot() {
    let model = crate::common::fixture("qwen35-moe-tiny");
    let server = Server::start(&["--model", model.to_str().unwrap()]);
    let prompt: Vec<u32> = (0..100).map(|i| 3 + (i * 37) % 500).collect();
    let body = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0});
    let complete = || {
        let reply = server.post("/v1/completions", &body);
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.json()
    };
    let first = complete();
    assert_eq!(cached(&first), 0);
    let again = complete();
    assert_eq!(cached(&again), 96, "(100 − 1) / 16 full blocks");
    assert_eq!(again["choices"][0]["text"], first["choices"][0]["text"]);
    server.wait_until_idle();
    let m = server.metrics();
    assert_eq!(m.get("sparkrt_prefix_cache_hits_total"), 96.0);
    assert_eq!(m.get("sparkrt_state_snapshots_taken_total"), 1.0);
    assert_eq!(m.get("sparkrt_state_snapshots_cached"), 1.0);
    let stats: Value = server.get("/v1/stats").json();
    assert_eq!(stats["state_snapshots_cached"], 1);
}

/// Speculative decoding through the server: a repeated prompt on the
/// qwen3_moe fixture (whose answer repeats itself) answers what the server without drafts answers, and the drafts
/// are counted in /metrics (vLLM's `spec_decode_*` families) and /v1/stats.
#[test]
fn drafts_are_counted_and_change_no_answer() {
    let model = crate::common::fixture("qwen3-moe-tiny");
    let phrase: Vec<u32> = (0..9).map(|i| 17 + (i * 37) % 480).collect();
    let prompt: Vec<u32> = phrase.iter().cycle().take(40).copied().collect();
    let body = json!({"prompt": prompt, "max_tokens": 160, "temperature": 0});
    let plain = Server::start(&["--model", model.to_str().unwrap()]);
    // A grammar too: each verify row's mask is the one of its position.
    let constrained = json!({"prompt": prompt, "max_tokens": 60, "temperature": 0, "guided_regex": "[a-z ]+( [0-9]+)*"});
    let reply = plain.post("/v1/completions", &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let expected = reply.json()["choices"][0]["text"].clone();
    let reply = plain.post("/v1/completions", &constrained);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let expected_constrained = reply.json()["choices"][0]["text"].clone();
    let spec = r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}"#;
    let server = Server::start(&[
        "--model",
        model.to_str().unwrap(),
        "--speculative-config",
        spec,
    ]);
    let reply = server.post("/v1/completions", &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["choices"][0]["text"], expected);
    server.wait_until_idle();
    let before = server
        .metrics()
        .get("sparkrt_spec_decode_num_draft_tokens_total");
    let reply = server.post("/v1/completions", &constrained);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["choices"][0]["text"], expected_constrained);
    server.wait_until_idle();
    let constrained_drafts = server
        .metrics()
        .get("sparkrt_spec_decode_num_draft_tokens_total")
        - before;
    assert!(
        constrained_drafts > 0.0,
        "{expected_constrained}: drafts under the grammar"
    );
    let m = server.metrics();
    let drafted = m.get("sparkrt_spec_decode_num_draft_tokens_total");
    let kept = m.get("sparkrt_spec_decode_num_accepted_tokens_total");
    assert!(
        drafted > 0.0 && kept > 0.0 && kept <= drafted,
        "{kept} of {drafted}"
    );
    assert!(m.get("sparkrt_spec_decode_num_drafts_total") > 0.0);
    let stats: Value = server.get("/v1/stats").json();
    assert_eq!(stats["spec_decode_num_accepted_tokens_total"], kept as u64);
    let per_pos = stats["spec_decode_num_accepted_tokens_per_pos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect::<Vec<_>>();
    assert_eq!(per_pos.iter().sum::<u64>(), kept as u64);
    assert!(per_pos[0] >= per_pos[1] && per_pos[1] >= per_pos[2]);
    assert!(
        per_pos[3..].iter().all(|&n| n == 0),
        "only 3 positions draft"
    );
}
