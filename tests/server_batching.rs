//! The engine behind `sparkrt serve`, seen over HTTP: requests served
//! together (continuous batching, chunked prefill, preemption when KV blocks
//! run out) get exactly the tokens each gets alone, and every block comes
//! back, also from clients that leave mid-stream.

use crate::server;

use std::io::{Read, Write};
use std::net::TcpStream;

use serde_json::{Value, json};
use server::{Server, ids, prompt_ids, tiny_profile};

/// One request's result: token ids, text, finish reason, usage.
#[derive(Debug, PartialEq)]
struct Outcome {
    token_ids: Vec<u32>,
    text: String,
    finish_reason: String,
    usage: Value,
}

fn complete(server: &Server, request: &Value) -> Outcome {
    let reply = server.post("/v1/completions", request);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    let choice = &body["choices"][0];
    Outcome {
        token_ids: ids(&choice["token_ids"]),
        text: choice["text"].as_str().unwrap().to_string(),
        finish_reason: choice["finish_reason"].as_str().unwrap().to_string(),
        usage: without_cached(&body["usage"]),
    }
}

/// Usage without `prompt_tokens_details`: how much of a prompt the prefix
/// cache served depends on what ran before, the rest must not.
fn without_cached(usage: &Value) -> Value {
    let mut usage = usage.clone();
    if let Some(object) = usage.as_object_mut() {
        object.remove("prompt_tokens_details");
    }
    usage
}

/// Streams `request` and adds up the chunks.
fn complete_streamed(server: &Server, request: &Value) -> Outcome {
    let mut request = request.clone();
    request["stream"] = json!(true);
    request["stream_options"] = json!({"include_usage": true});
    let events = server.stream("/v1/completions", &request);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut outcome = Outcome {
        token_ids: Vec::new(),
        text: String::new(),
        finish_reason: String::new(),
        usage: Value::Null,
    };
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).unwrap();
        assert!(chunk.get("error").is_none(), "error in the stream: {chunk}");
        if let Some(choice) = chunk["choices"].get(0) {
            outcome.text.push_str(choice["text"].as_str().unwrap());
            outcome.token_ids.extend(ids(&choice["token_ids"]));
            if let Some(reason) = choice["finish_reason"].as_str() {
                outcome.finish_reason = reason.to_string();
            }
        } else {
            outcome.usage = without_cached(&chunk["usage"]);
        }
    }
    outcome
}

/// Sends every request at once (one thread each, half of them streamed)
/// and returns the outcomes in the requests' order.
fn all_at_once(server: &Server, requests: &[Value]) -> Vec<Outcome> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = requests
            .iter()
            .enumerate()
            .map(|(i, request)| {
                scope.spawn(move || {
                    if i % 2 == 0 {
                        complete(server, request)
                    } else {
                        complete_streamed(server, request)
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn concurrent_greedy_requests_get_the_tokens_each_gets_alone() {
    // The tiny profile: 8 sequences at a time, 256 tokens per step, so 32
    // requests queue, join between steps and prompts over 256 tokens are
    // prefilled in chunks next to other sequences' decodes.
    let server = Server::start(&["--max-queue", "64"]);
    let requests: Vec<Value> = (0..32u64)
        .map(|i| {
            let prompt = prompt_ids(1 + (i as usize * 97) % 600, i);
            json!({"prompt": prompt, "max_tokens": 8 + (i % 5) * 4, "temperature": 0,
                   "ignore_eos": i % 3 == 0, "return_token_ids": true})
        })
        .collect();
    let alone: Vec<Outcome> = requests.iter().map(|r| complete(&server, r)).collect();
    server.wait_until_idle();

    let together = all_at_once(&server, &requests);
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, t, "request {i} served with 31 others");
        let prompt_len = requests[i]["prompt"].as_array().unwrap().len();
        assert_eq!(a.usage["prompt_tokens"], prompt_len);
    }
    server.wait_until_idle();
    let m = server.metrics();
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"ok\"}"), 64.0);
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"5xx\"}"), 0.0);
    assert_eq!(m.get("sparkrt_kv_blocks_used"), 0.0);
    // Whatever the prefix cache keeps is reclaimable: used + cached + free.
    assert_eq!(
        m.get("sparkrt_kv_blocks_free") + m.get("sparkrt_kv_blocks_cached"),
        512.0
    );
}

#[test]
fn a_tiny_kv_cache_queues_and_preempts_and_every_block_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    // 2 sequences of max_model_len: 2 × 256 tokens × 2048 bytes (4 layers ×
    // K and V × 2 heads × 32 dims × 4 bytes) = 1 MiB = 32 blocks of 16.
    let profile = tiny_profile(
        dir.path(),
        "tiny-kv",
        "max_model_len = 256\nmax_num_seqs = 8\nmax_num_batched_tokens = 64\n\
         kv_cache_dtype = \"f32\"\nkv_cache = \"1MiB\"\nkv_block_size = 16",
    );
    let server = Server::start(&["--profile", profile.to_str().unwrap()]);
    let memory = server.get("/v1/memory").json();
    assert_eq!(memory["kv"]["blocks_total"], 32);

    // 16 requests of 150 to 240 tokens: 10 to 15 blocks each, 8 running at
    // once want more than the 32 there are.
    let requests: Vec<Value> = (0..16u64)
        .map(|i| {
            let prompt = prompt_ids(30 + (i as usize * 7) % 100, 100 + i);
            json!({"prompt": prompt, "max_tokens": 120, "temperature": 0,
                   "ignore_eos": true, "return_token_ids": true})
        })
        .collect();
    let alone: Vec<Outcome> = requests.iter().map(|r| complete(&server, r)).collect();
    server.wait_until_idle();
    assert_eq!(server.metrics().get("sparkrt_preemptions_total"), 0.0);

    let together = all_at_once(&server, &requests);
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.finish_reason, "length");
        assert_eq!(a.token_ids.len(), 120);
        assert_eq!(a, t, "request {i} served under KV pressure");
    }
    server.wait_until_idle();
    let m = server.metrics();
    assert!(
        m.get("sparkrt_preemptions_total") > 0.0,
        "16 sequences of 10-15 blocks in 32 blocks preempt"
    );
    assert_eq!(
        m.get("sparkrt_kv_blocks_free") + m.get("sparkrt_kv_blocks_cached"),
        32.0
    );
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"ok\"}"), 32.0);
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"5xx\"}"), 0.0);
    // Each prompt counts once (twice served), recomputed or not.
    let prompt_tokens: usize = requests
        .iter()
        .map(|r| r["prompt"].as_array().unwrap().len())
        .sum();
    assert_eq!(
        m.get("sparkrt_prompt_tokens_total"),
        (2 * prompt_tokens) as f64
    );
    assert_eq!(
        m.get("sparkrt_generation_tokens_total"),
        (2 * 16 * 120) as f64
    );
    let memory = server.get("/v1/memory").json();
    assert_eq!(memory["kv"]["blocks_used"], 0);
}

#[test]
fn a_client_that_leaves_mid_stream_frees_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    // Requests far longer than the test: one that is not freed would still
    // be generating when it ends (checked by counting generated tokens).
    let profile = tiny_profile(
        dir.path(),
        "long",
        "max_model_len = 32768\nmax_num_seqs = 2\nmax_num_batched_tokens = 256\n\
         kv_cache_dtype = \"f32\"\nkv_cache = \"auto\"\nkv_block_size = 16",
    );
    let server = Server::start(&["--profile", profile.to_str().unwrap()]);
    const LONG: u64 = 32000;
    let long = json!({"prompt": "Hello", "max_tokens": LONG, "ignore_eos": true,
                      "stream": true});
    let mut stream = server.open_stream("/v1/completions", &long);
    for _ in 0..3 {
        assert!(stream.next_data().is_some());
    }
    server.wait_until("the stream holds KV blocks", || {
        server.metrics().get("sparkrt_kv_blocks_used") > 0.0
    });
    drop(stream);
    server.wait_until("the dropped stream's blocks are free", || {
        let m = server.metrics();
        m.get("sparkrt_kv_blocks_used") == 0.0 && m.get("sparkrt_requests_running") == 0.0
    });
    let generated = server.metrics().get("sparkrt_generation_tokens_total");
    assert!(
        generated < LONG as f64,
        "the sequence ended early: {generated}"
    );

    // The same for a blocking request whose client closes the connection.
    let body = json!({"prompt": "Hello", "max_tokens": LONG, "ignore_eos": true}).to_string();
    let mut socket = TcpStream::connect(server.url.trim_start_matches("http://")).unwrap();
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    server.wait_until("the blocking request runs", || {
        server.metrics().get("sparkrt_requests_running") == 1.0
    });
    drop(socket);
    server.wait_until("the abandoned request's blocks are free", || {
        let m = server.metrics();
        m.get("sparkrt_kv_blocks_used") == 0.0 && m.get("sparkrt_requests_running") == 0.0
    });
    let generated = server.metrics().get("sparkrt_generation_tokens_total") - generated;
    assert!(
        generated < LONG as f64,
        "the sequence ended early: {generated}"
    );

    // Still serving.
    let mut socket = TcpStream::connect(server.url.trim_start_matches("http://")).unwrap();
    let body = json!({"prompt": "Hello", "max_tokens": 2}).to_string();
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    socket.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
