//! Log-probabilities, `echo`, `prompt_logprobs` and batched prompts through
//! a real server, against the transformers references of every fixture
//! (`log_softmax` of `reference.safetensors`' logits, computed here in
//! f64), and `/tokenize`, `/detokenize`, `/v1/models/{id}`.

use serde_json::{Value, json};

use crate::common;
use crate::fixture_runs::{FIXTURES, Reference, reference};
use crate::server::Server;

/// Prompt logprobs against the reference: the engine's logits are within
/// 2e-3 of transformers', so log-softmax values are well within this.
const TOLERANCE: f64 = 1e-3;

/// `log_softmax` of row `row` of the reference logits, in f64.
fn log_softmax(r: &Reference, row: usize) -> Vec<f64> {
    let logits = &r.logits[row * r.vocab..(row + 1) * r.vocab];
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

/// The reference row's values, most likely first.
fn sorted_desc(row: &[f64]) -> Vec<f64> {
    let mut v = row.to_vec();
    v.sort_by(|a, b| b.partial_cmp(a).unwrap());
    v
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn prompt_text(name: &str) -> String {
    let text = std::fs::read_to_string(common::fixture(name).join("reference.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["prompt"].as_str().unwrap().to_string()
}

fn ok(reply: crate::server::Reply) -> Value {
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()
}

#[test]
fn echoed_prompt_logprobs_equal_the_reference_log_softmax() {
    for name in FIXTURES {
        let r = reference(name);
        let server = Server::start(&["--profile", name]);
        let n = 5;
        let body = ok(server.post(
            "/v1/completions",
            &json!({"prompt": r.input_ids, "max_tokens": 1, "temperature": 0,
                    "echo": true, "logprobs": n, "prompt_logprobs": n}),
        ));
        let choice = &body["choices"][0];
        assert!(
            choice["text"]
                .as_str()
                .unwrap()
                .starts_with(&prompt_text(name)),
            "{name}: the prompt is echoed: {}",
            choice["text"]
        );
        let lp = &choice["logprobs"];
        let tokens = lp["tokens"].as_array().unwrap();
        let values = lp["token_logprobs"].as_array().unwrap();
        let tops = lp["top_logprobs"].as_array().unwrap();
        let offsets = lp["text_offset"].as_array().unwrap();
        let len = r.input_ids.len();
        // The prompt's tokens, then the one generated.
        for list in [tokens, values, tops, offsets] {
            assert_eq!(list.len(), len + 1, "{name}: {lp}");
        }
        assert!(values[0].is_null() && tops[0].is_null(), "{name}: {lp}");
        let prompt_logprobs = choice["prompt_logprobs"].as_array().unwrap();
        assert_eq!(prompt_logprobs.len(), len, "{name}");
        assert!(prompt_logprobs[0].is_null(), "{name}");
        let mut worst = 0f64;
        for i in 1..=len {
            // Position i is predicted by row i - 1.
            let row = log_softmax(&r, i - 1);
            let actual = if i < len {
                r.input_ids[i]
            } else {
                r.greedy_ids[0]
            };
            let got = f(&values[i]);
            worst = worst.max((got - row[actual as usize]).abs());
            // The alternatives: n of them, most likely first, the
            // reference's n largest values.
            // (A JSON object's order is not kept by serde_json's `Value`:
            // the chat list and the ranks below check the order.)
            let top = sorted_desc(
                &tops[i]
                    .as_object()
                    .unwrap()
                    .values()
                    .map(f)
                    .collect::<Vec<_>>(),
            );
            let want = sorted_desc(&row);
            assert!(top.len() <= n, "{name} {i}: {}", tops[i]);
            // Token strings may repeat (several ids decode to U+FFFD), so a
            // map may hold fewer keys; vLLM's id-keyed map has them all.
            if i < len {
                let entries = prompt_logprobs[i].as_object().unwrap();
                let own = &entries[&actual.to_string()];
                assert!((f(&own["logprob"]) - got).abs() < 1e-6, "{name} {i}");
                let mut alternatives: Vec<(usize, u32, f64)> = entries
                    .iter()
                    .map(|(id, e)| {
                        let rank = e["rank"].as_u64().unwrap() as usize;
                        (rank, id.parse().unwrap(), f(&e["logprob"]))
                    })
                    .collect();
                alternatives.sort_by_key(|a| a.0);
                let ranked: Vec<_> = alternatives.iter().filter(|a| a.0 <= n).collect();
                assert_eq!(ranked.len(), n, "{name} {i}: {entries:?}");
                for (j, (rank, id, value)) in ranked.iter().enumerate() {
                    assert_eq!(*rank, j + 1, "{name} {i}");
                    // Its value is the reference's for that id, and the
                    // reference's j-th largest (robust to near ties).
                    worst = worst.max((value - row[*id as usize]).abs());
                    worst = worst.max((value - want[j]).abs());
                }
            } else {
                // The greedy token is the reference's top-1.
                assert_eq!(f(&values[i]), top[0], "{name}: greedy is top-1");
                worst = worst.max((got - want[0]).abs());
            }
        }
        eprintln!("{name}: largest logprob difference to the reference {worst:.2e}");
        assert!(worst < TOLERANCE, "{name}: logprobs differ by {worst}");
        // Offsets count characters of the echoed text.
        let mut offset = 0;
        for (token, at) in tokens.iter().zip(offsets) {
            assert_eq!(at.as_u64().unwrap() as usize, offset, "{name}");
            offset += token.as_str().unwrap().chars().count();
        }
    }
}

#[test]
fn greedy_tokens_logprobs_are_their_rows_top_one_streamed_or_not() {
    let name = "qwen3-moe-tiny";
    let r = reference(name);
    let server = Server::start(&[]);
    let request = json!({"prompt": r.input_ids, "max_tokens": 6, "temperature": 0,
                         "ignore_eos": true, "logprobs": 3});
    let body = ok(server.post("/v1/completions", &request));
    let lp = &body["choices"][0]["logprobs"];
    let values = lp["token_logprobs"].as_array().unwrap();
    let tops = lp["top_logprobs"].as_array().unwrap();
    assert_eq!(values.len(), 6);
    let first_row = sorted_desc(&log_softmax(&r, r.input_ids.len() - 1));
    assert!((f(&values[0]) - first_row[0]).abs() < TOLERANCE);
    for (value, top) in values.iter().zip(tops) {
        let top = sorted_desc(&top.as_object().unwrap().values().map(f).collect::<Vec<_>>());
        assert_eq!(f(value), top[0], "greedy: the token is its row's top-1");
        assert!(top.iter().all(|&t| t <= 0.0));
    }

    // Streamed: the same entries, spread over the chunks.
    let mut streamed = (Vec::new(), Vec::new());
    for event in server.stream(
        "/v1/completions",
        &json!({"prompt": r.input_ids, "max_tokens": 6, "temperature": 0,
                "ignore_eos": true, "logprobs": 3, "stream": true}),
    ) {
        if event == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&event).unwrap();
        let lp = &chunk["choices"][0]["logprobs"];
        if !lp.is_null() {
            streamed.0.extend(lp["tokens"].as_array().unwrap().clone());
            streamed
                .1
                .extend(lp["token_logprobs"].as_array().unwrap().clone());
        }
    }
    assert_eq!(&streamed.0, lp["tokens"].as_array().unwrap());
    assert_eq!(&streamed.1, values);

    // Echo streamed: the first chunk carries the prompt's text, its entries
    // (the first null) and vLLM's prompt_logprobs; the rest as blocking.
    let echo = json!({"prompt": prompt_text(name), "max_tokens": 3, "temperature": 0,
                      "ignore_eos": true, "logprobs": 2, "echo": true, "prompt_logprobs": 1});
    let blocking = ok(server.post("/v1/completions", &echo));
    let mut stream_echo = echo.clone();
    stream_echo["stream"] = json!(true);
    let (mut text, mut values, mut prompt_logprobs) = (String::new(), Vec::new(), Vec::new());
    for event in server.stream("/v1/completions", &stream_echo) {
        if event == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&event).unwrap();
        let c = &chunk["choices"][0];
        text += c["text"].as_str().unwrap();
        if let Some(v) = c["logprobs"]["token_logprobs"].as_array() {
            values.extend(v.clone());
        }
        if let Some(p) = c["prompt_logprobs"].as_array() {
            assert!(prompt_logprobs.is_empty(), "prompt_logprobs come once");
            prompt_logprobs = p.clone();
        }
    }
    let choice = &blocking["choices"][0];
    assert!(text.starts_with(&prompt_text(name)));
    assert_eq!(text, choice["text"].as_str().unwrap());
    assert_eq!(
        &values,
        choice["logprobs"]["token_logprobs"].as_array().unwrap()
    );
    assert_eq!(values.len(), r.input_ids.len() + 3);
    assert!(values[0].is_null());
    assert_eq!(
        &prompt_logprobs,
        choice["prompt_logprobs"].as_array().unwrap()
    );
    assert_eq!(prompt_logprobs.len(), r.input_ids.len());

    // Chat: OpenAI's shape, streamed equals blocking.
    let chat = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5,
                      "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 2});
    let body = ok(server.post("/v1/chat/completions", &chat));
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 5);
    for entry in content {
        let token = entry["token"].as_str().unwrap();
        let bytes: Vec<u8> = entry["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(bytes, token.as_bytes());
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["logprob"], entry["logprob"], "greedy is top-1");
        assert!(f(&top[0]["logprob"]) >= f(&top[1]["logprob"]));
    }
    let mut streamed = Vec::new();
    let mut stream_body = chat.clone();
    stream_body["stream"] = json!(true);
    for event in server.stream("/v1/chat/completions", &stream_body) {
        if event == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&event).unwrap();
        if let Some(c) = chunk["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(c.clone());
        }
    }
    assert_eq!(&streamed, content);
}

#[test]
fn batched_prompts_equal_separate_requests() {
    let server = Server::start(&[]);
    let texts = [
        "The licensee may convey",
        "Hello there",
        "A third prompt, longer than the others",
    ];
    let alone: Vec<Value> = texts
        .iter()
        .map(|t| {
            ok(server.post(
                "/v1/completions",
                &json!({"prompt": t, "max_tokens": 5, "temperature": 0, "ignore_eos": true,
                        "return_token_ids": true, "logprobs": 1}),
            ))
        })
        .collect();
    let ids: Vec<Value> = alone
        .iter()
        .map(|a| a["choices"][0]["prompt_token_ids"].clone())
        .collect();
    for prompt in [json!(texts), json!(ids)] {
        let body = ok(server.post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": true,
                    "return_token_ids": true, "logprobs": 1}),
        ));
        let choices = body["choices"].as_array().unwrap();
        assert_eq!(choices.len(), texts.len());
        let mut prompt_tokens = 0;
        for (i, (choice, one)) in choices.iter().zip(&alone).enumerate() {
            let one = &one["choices"][0];
            assert_eq!(choice["index"], i);
            assert_eq!(choice["text"], one["text"], "prompt {i}");
            assert_eq!(choice["token_ids"], one["token_ids"], "prompt {i}");
            assert_eq!(choice["logprobs"], one["logprobs"], "prompt {i}");
            prompt_tokens += one["prompt_token_ids"].as_array().unwrap().len();
        }
        assert_eq!(body["usage"]["prompt_tokens"], prompt_tokens);
        assert_eq!(body["usage"]["completion_tokens"], 5 * texts.len());

        // Streamed: each index's pieces make up its text.
        let mut streamed = vec![String::new(); texts.len()];
        let mut usage = Value::Null;
        for event in server.stream(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": true,
                    "stream": true, "stream_options": {"include_usage": true}}),
        ) {
            if event == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(&event).unwrap();
            for c in chunk["choices"].as_array().unwrap() {
                streamed[c["index"].as_u64().unwrap() as usize] += c["text"].as_str().unwrap();
            }
            if !chunk["usage"].is_null() {
                usage = chunk["usage"].clone();
            }
        }
        for (i, one) in alone.iter().enumerate() {
            assert_eq!(streamed[i], one["choices"][0]["text"].as_str().unwrap());
        }
        assert_eq!(usage["prompt_tokens"], prompt_tokens);
    }
}

#[test]
fn out_of_range_counts_and_batches_are_refused_by_name() {
    let server = Server::start(&[]);
    let cases = [
        (
            "/v1/completions",
            json!({"prompt": "hi", "logprobs": 21}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "prompt_logprobs": -1}),
            "prompt_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true,
                   "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "echo": true}),
            "echo",
        ),
        (
            "/v1/completions",
            json!({"prompt": vec!["a"; 65]}),
            "prompt",
        ),
        ("/v1/completions", json!({"prompt": []}), "prompt"),
        // Processed log-probabilities (vLLM's server-wide --logprobs-mode)
        // are not offered: the field is refused, not ignored.
        (
            "/v1/completions",
            json!({"prompt": "hi", "logprobs": 1, "logprobs_mode": "processed_logprobs"}),
            "logprobs_mode",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 1}),
            "prompt_logprobs",
        ),
    ];
    for (path, body, field) in cases {
        let error = server.post(path, &body).assert_error(400);
        assert_eq!(error["param"], field, "{body}: {error}");
    }
    let error = server
        .post("/v1/completions", &json!({"prompt": vec!["a"; 65]}))
        .assert_error(400);
    assert_eq!(error["code"], "max_prompts");
}

#[test]
fn tokenize_detokenize_and_model_by_id() {
    let name = "qwen3-moe-tiny";
    let r = reference(name);
    let text = prompt_text(name);
    let server = Server::start(&[]);
    let body = ok(server.post("/tokenize", &json!({"prompt": text})));
    assert_eq!(body["tokens"], json!(r.input_ids));
    assert_eq!(body["count"], r.input_ids.len());
    assert!(body["max_model_len"].as_u64().unwrap() > 0);
    let body = ok(server.post("/detokenize", &json!({"tokens": r.input_ids})));
    assert_eq!(body["prompt"], text);

    // Messages go through the template: as many tokens as the chat route counts.
    let messages = json!([{"role": "user", "content": "Hello"}]);
    let body = ok(server.post("/tokenize", &json!({"messages": messages})));
    let chat = ok(server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 1}),
    ));
    assert_eq!(body["count"], chat["usage"]["prompt_tokens"]);
    let without = ok(server.post(
        "/tokenize",
        &json!({"messages": messages, "add_generation_prompt": false}),
    ));
    assert!(without["count"].as_u64() < body["count"].as_u64());

    server
        .post("/tokenize", &json!({"prompt": "a", "messages": messages}))
        .assert_error(400);
    let error = server
        .post("/tokenize", &json!({"prompt": "a", "bogus": 1}))
        .assert_error(400);
    assert_eq!(error["param"], "bogus");

    let models = ok(server.get("/v1/models"));
    let id = models["data"][0]["id"].as_str().unwrap().to_string();
    let card = ok(server.get(&format!("/v1/models/{id}")));
    assert_eq!(card["id"], id);
    assert_eq!(card["object"], "model");
    let error = server.get("/v1/models/no-such-model").assert_error(404);
    assert_eq!(error["code"], "model_not_found");
}

/// A batch of `max_prompts` prompts is one submission: on an idle server it
/// is admitted whatever the queue's length (the default, 4 × max_num_seqs
/// = 32, and a queue of 4), not cut off with 429 at the queue's end.
#[test]
fn a_batch_at_the_prompt_cap_is_admitted_on_an_idle_server() {
    for args in [&[][..], &["--max-queue", "4"][..]] {
        let server = Server::start(args);
        let prompts: Vec<String> = (0..64).map(|i| format!("Prompt number {i}")).collect();
        let body = ok(server.post(
            "/v1/completions",
            &json!({"prompt": prompts, "max_tokens": 2, "temperature": 0}),
        ));
        let choices = body["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 64, "{args:?}");
        for (i, choice) in choices.iter().enumerate() {
            assert_eq!(choice["index"], i, "{args:?}");
        }
        // n = 2 on 32 prompts: the same 64 choices.
        let body = ok(server.post(
            "/v1/completions",
            &json!({"prompt": &prompts[..32], "n": 2, "max_tokens": 1}),
        ));
        assert_eq!(body["choices"].as_array().unwrap().len(), 64, "{args:?}");
    }
}

#[test]
fn detokenize_refuses_ids_outside_the_vocabulary_like_completions() {
    let server = Server::start(&[]);
    let vocab = 512; // the tiny fixture's tokenizer
    let error = server
        .post("/detokenize", &json!({"tokens": [1, 2, vocab + 7]}))
        .assert_error(400);
    assert_eq!(error["param"], "tokens", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("token id {}", vocab + 7)) && message.contains("512"),
        "{message}"
    );
    let completion = server
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 2, vocab + 7], "max_tokens": 1}),
        )
        .assert_error(400);
    assert_eq!(
        completion["message"].as_str().unwrap(),
        message,
        "the same refusal on both routes"
    );
    let ok_ids = ok(server.post("/detokenize", &json!({"tokens": [vocab - 1]})));
    assert!(ok_ids["prompt"].is_string());
}
