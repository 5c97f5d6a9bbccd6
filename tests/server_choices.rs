//! `n` and `best_of` over HTTP: a seeded request's `n` choices are the
//! answers of `n` separate requests seeded `seed, seed + 1, ...` (vLLM's
//! rule), token for token, on both routes, blocking and streamed; indexes
//! follow OpenAI's order; usage counts each prompt once; `best_of` answers
//! the candidates whose sampled tokens have the highest cumulative
//! log-probability, recomputed here from the logprobs of separate requests.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::server::{Server, ids};

const PROMPT: &str = "Hello there, how are you";
const SEED: u64 = 11;

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn post(server: &Server, route: &str, body: &Value) -> Value {
    let reply = server.post(route, body);
    assert_eq!(reply.status, 200, "{route} {body}: {}", reply.body);
    reply.json()
}

/// A sampled (temperature 1) request of fixed length: seeds matter.
fn completion_body(extra: Value) -> Value {
    with(
        json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "ignore_eos": true,
               "return_token_ids": true}),
        extra,
    )
}

fn chat_body(extra: Value) -> Value {
    with(
        json!({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 6,
               "temperature": 1.0, "ignore_eos": true, "return_token_ids": true}),
        extra,
    )
}

/// One streamed choice, put together from its chunks.
#[derive(Default, Debug)]
struct Streamed {
    ids: Vec<u32>,
    finish: Option<String>,
}

/// A stream's choices by index, and its usage chunks.
fn streamed(server: &Server, route: &str, body: &Value) -> (BTreeMap<u64, Streamed>, Vec<Value>) {
    let events = server.stream(route, body);
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let mut choices: BTreeMap<u64, Streamed> = BTreeMap::new();
    let mut usages = Vec::new();
    for data in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(data).unwrap();
        assert!(chunk.get("error").is_none(), "{chunk}");
        if let Some(usage) = chunk.get("usage") {
            usages.push(usage.clone());
        }
        for choice in chunk["choices"].as_array().unwrap() {
            let entry = choices
                .entry(
                    choice["index"]
                        .as_u64()
                        .expect("every chunk names its choice"),
                )
                .or_default();
            if let Some(t) = choice.get("token_ids") {
                entry.ids.extend(ids(t));
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                assert!(
                    entry.finish.is_none(),
                    "one finish reason per choice: {data}"
                );
                entry.finish = Some(f.to_string());
            }
        }
    }
    (choices, usages)
}

#[test]
fn n_choices_equal_separate_seeded_requests_on_both_routes() {
    let server = Server::start(&[]);
    let n = 4;
    for (route, body) in [
        ("/v1/completions", completion_body as fn(Value) -> Value),
        ("/v1/chat/completions", chat_body),
    ] {
        let separate: Vec<Value> = (0..n)
            .map(|j| post(&server, route, &body(json!({"seed": SEED + j}))))
            .collect();
        let expected: Vec<Vec<u32>> = separate
            .iter()
            .map(|r| ids(&r["choices"][0]["token_ids"]))
            .collect();
        // The seeds give different answers, so the comparison means something.
        assert!(
            expected.iter().any(|e| *e != expected[0]),
            "{route}: {expected:?}"
        );
        let prompt_tokens = separate[0]["usage"]["prompt_tokens"].as_u64().unwrap();

        let answer = post(&server, route, &body(json!({"seed": SEED, "n": n})));
        let choices = answer["choices"].as_array().unwrap();
        assert_eq!(choices.len(), n as usize, "{route}: {answer}");
        for (j, choice) in choices.iter().enumerate() {
            assert_eq!(choice["index"], j, "{route}: {answer}");
            assert_eq!(ids(&choice["token_ids"]), expected[j], "{route} choice {j}");
            assert_eq!(choice["finish_reason"], "length");
            if route == "/v1/completions" {
                assert_eq!(choice["text"], separate[j]["choices"][0]["text"]);
            } else {
                assert_eq!(choice["message"], separate[j]["choices"][0]["message"]);
            }
        }
        // The prompt counts once, every choice's tokens count.
        let usage = &answer["usage"];
        assert_eq!(usage["prompt_tokens"], prompt_tokens, "{route}: {usage}");
        assert_eq!(usage["completion_tokens"], 6 * n, "{route}: {usage}");
        assert_eq!(
            usage["total_tokens"],
            prompt_tokens + 6 * n,
            "{route}: {usage}"
        );

        let stream = body(json!({"seed": SEED, "n": n, "stream": true,
                                 "stream_options": {"include_usage": true}}));
        let (streamed, usages) = streamed(&server, route, &stream);
        assert_eq!(streamed.len(), n as usize, "{route}: {streamed:?}");
        for (j, choice) in streamed.values().enumerate() {
            assert_eq!(choice.ids, expected[j], "{route} streamed choice {j}");
            assert_eq!(choice.finish.as_deref(), Some("length"));
        }
        assert_eq!(usages.len(), 1, "{route}: one usage chunk: {usages:?}");
        assert_eq!(&usages[0], usage, "{route}");
    }
}

#[test]
fn a_batch_of_prompts_fans_out_in_openai_order() {
    let server = Server::start(&[]);
    let prompts = [PROMPT, "Tell me a story"];
    let route = "/v1/completions";
    let mut prompt_tokens = 0;
    let mut expected = Vec::new();
    for prompt in prompts {
        for j in 0..2 {
            let reply = post(
                &server,
                route,
                &completion_body(json!({"prompt": prompt, "seed": SEED + j})),
            );
            expected.push(ids(&reply["choices"][0]["token_ids"]));
            if j == 0 {
                prompt_tokens += reply["usage"]["prompt_tokens"].as_u64().unwrap();
            }
        }
    }
    // Choice index = prompt index × n + j.
    let body = completion_body(json!({"prompt": prompts, "seed": SEED, "n": 2}));
    let answer = post(&server, route, &body);
    let choices = answer["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        assert_eq!(ids(&choice["token_ids"]), expected[i], "choice {i}");
    }
    assert_eq!(answer["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(answer["usage"]["completion_tokens"], 4 * 6);
    let (streamed, _) = streamed(&server, route, &with(body, json!({"stream": true})));
    let streamed: Vec<Vec<u32>> = streamed.into_values().map(|c| c.ids).collect();
    assert_eq!(streamed, expected);
}

/// The sum of a completion's token log-probabilities, as the server sums
/// them: each value read back as the f32 it was, added in f64.
fn cumulative_logprob(choice: &Value) -> f64 {
    choice["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| f64::from(v.as_f64().unwrap() as f32))
        .sum()
}

#[test]
fn best_of_answers_the_candidates_of_highest_cumulative_logprob() {
    let server = Server::start(&[]);
    let route = "/v1/completions";
    let (n, best_of) = (2usize, 4u64);
    // Seeds until one where the pick is not simply the first n candidates
    // (each tried seed is checked).
    let mut reordered = false;
    for seed in SEED..SEED + 8 {
        let candidates: Vec<Value> = (0..best_of)
            .map(|j| {
                let body = completion_body(json!({"seed": seed + j, "logprobs": 0}));
                post(&server, route, &body)["choices"][0].clone()
            })
            .collect();
        let mut ranked: Vec<(f64, usize)> = candidates
            .iter()
            .enumerate()
            .map(|(j, c)| (cumulative_logprob(c), j))
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let best: Vec<usize> = ranked[..n].iter().map(|&(_, j)| j).collect();

        let body = completion_body(json!({"seed": seed, "n": n, "best_of": best_of}));
        let answer = post(&server, route, &body);
        let choices = answer["choices"].as_array().unwrap();
        assert_eq!(choices.len(), n, "{answer}");
        for (i, choice) in choices.iter().enumerate() {
            assert_eq!(choice["index"], i);
            assert_eq!(
                ids(&choice["token_ids"]),
                ids(&candidates[best[i]]["token_ids"]),
                "seed {seed}: answer {i} should be candidate {} of {ranked:?}",
                best[i]
            );
            // Not asked for: the logprobs the pick used are not shown.
            assert!(choice["logprobs"].is_null(), "{choice}");
        }
        // Every candidate was generated and counts.
        assert_eq!(answer["usage"]["completion_tokens"], 6 * best_of);
        // Asked for: each answered choice's are its candidate's.
        let shown = post(&server, route, &with(body, json!({"logprobs": 0})));
        for (i, choice) in shown["choices"].as_array().unwrap().iter().enumerate() {
            assert_eq!(choice["logprobs"], candidates[best[i]]["logprobs"]);
        }
        if best != [0, 1] {
            reordered = true;
            break;
        }
    }
    assert!(
        reordered,
        "no seed made best_of pick other than the first n"
    );
}

#[test]
fn n_and_best_of_out_of_range_are_400s_naming_the_field() {
    let server = Server::start(&[]);
    let completions = |extra: Value| server.post("/v1/completions", &completion_body(extra));
    let cases = [
        (json!({"n": 17}), "n", Some("max_n")),
        (json!({"n": 0}), "n", None),
        (json!({"best_of": 17}), "best_of", Some("max_n")),
        (json!({"n": 3, "best_of": 2}), "best_of", None),
        (json!({"best_of": 0}), "best_of", None),
        (json!({"best_of": 2, "stream": true}), "best_of", None),
        (
            json!({"prompt": [PROMPT, PROMPT, PROMPT, PROMPT, PROMPT], "n": 16}),
            "n",
            Some("max_choices"),
        ),
    ];
    for (extra, param, code) in cases {
        let error = completions(extra.clone()).assert_error(400);
        assert_eq!(error["param"], param, "{extra}: {error}");
        if let Some(code) = code {
            assert_eq!(error["code"], code, "{extra}: {error}");
        }
    }
    // The chat API has no best_of; n too many is refused there as well.
    let chat = |extra: Value| server.post("/v1/chat/completions", &chat_body(extra));
    let error = chat(json!({"best_of": 2})).assert_error(400);
    assert_eq!(error["code"], "unsupported_parameter");
    assert_eq!(error["param"], "best_of");
    assert_eq!(chat(json!({"n": 17})).assert_error(400)["param"], "n");
    // /v1/responses answers one choice.
    let reply = server.post("/v1/responses", &json!({"input": "hi", "n": 2}));
    assert_eq!(reply.assert_error(400)["param"], "n");
}

#[test]
fn a_client_that_leaves_ends_every_choice() {
    let server = Server::start(&[]);
    let max_tokens = 1000;
    let body = completion_body(json!({"n": 4, "max_tokens": max_tokens, "stream": true}));
    let mut stream = server.open_stream("/v1/completions", &body);
    assert!(stream.next_data().is_some());
    drop(stream);
    // Every choice's sequence ends and frees its blocks, long before the
    // choices could have generated their 4 × 1000 tokens (half is far
    // above what a loaded machine makes before it sees the client leave).
    server.wait_until_idle();
    let generated = server.metrics().get("sparkrt_generation_tokens_total");
    assert!(
        generated < f64::from(2 * max_tokens),
        "{generated} tokens generated"
    );
}

#[test]
fn each_choice_follows_the_grammar_with_its_own_state() {
    let server = Server::start(&[]);
    let words = ["yes", "no", "maybe", "perhaps"];
    let body = |extra: Value| {
        with(
            json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0,
                   "guided_choice": words}),
            extra,
        )
    };
    let n = 6;
    let answer = post(
        &server,
        "/v1/completions",
        &body(json!({"seed": SEED, "n": n})),
    );
    let texts: Vec<&str> = answer["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts.len(), n as usize);
    for (j, text) in texts.iter().enumerate() {
        assert!(words.contains(text), "choice {j}: {text:?}");
        let alone = post(
            &server,
            "/v1/completions",
            &body(json!({"seed": SEED + j as u64})),
        );
        assert_eq!(alone["choices"][0]["text"], *text, "choice {j}");
    }
}
