//! `sparkrt serve` with the tiny fixture, over HTTP: the OpenAI routes answer
//! exactly what `sparkrt generate` computes for one request, blocking and
//! streamed; bad input gets a 4xx OpenAI error object and the server keeps
//! serving; a full queue gets 429; the API key guards all but
//! `/health` and `/ready`.

use crate::server;

use serde_json::{Value, json};
use server::{Reply, Server, generate, ids, prompt_ids, tiny_profile};
use sparkrt_wire::{
    MemoryReport, PageCachePolicy, RequestOutcomes, ServingStats, WeightsResidency,
};

/// Greedy continues for `max_tokens` on this prompt (checked against
/// `generate` in the test, not assumed).
const PROMPT: &str = "Hello there, how are you";
/// Greedy ends with the end-of-sequence token after 84 tokens.
const PROMPT_ENDING: &str = "Tell me a story";
const MODEL: &str = "qwen3-moe-tiny";

/// The streamed chunks of an answer (everything before `[DONE]`, parsed),
/// after checking that `[DONE]` comes last and only there.
fn chunks(events: &[String]) -> Vec<Value> {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "the stream ends with [DONE]: {events:?}"
    );
    events[..events.len() - 1]
        .iter()
        .map(|e| {
            assert_ne!(e, "[DONE]", "[DONE] only at the end");
            serde_json::from_str(e).unwrap_or_else(|err| panic!("chunk {e:?}: {err}"))
        })
        .collect()
}

/// What a stream of chunks adds up to.
#[derive(Debug, Default)]
struct Streamed {
    text: String,
    token_ids: Vec<u32>,
    prompt_token_ids: Option<Vec<u32>>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    role: Option<String>,
}

/// Adds up `chunks` of one request, checking their shape on the way: one
/// id and object for all, one finish reason on the last choice chunk, the
/// usage chunk (if any) after it with no choices.
fn add_up(chunks: &[Value], object: &str) -> Streamed {
    let mut out = Streamed::default();
    let id = chunks[0]["id"].clone();
    for (i, chunk) in chunks.iter().enumerate() {
        assert_eq!(chunk["id"], id, "one id per stream");
        assert_eq!(chunk["object"], object);
        assert_eq!(chunk["model"], MODEL);
        let choices = chunk["choices"].as_array().expect("choices");
        if choices.is_empty() {
            assert!(out.usage.is_none(), "one usage chunk");
            assert!(out.finish_reason.is_some(), "usage comes after the finish");
            out.usage = Some(chunk["usage"].clone());
            continue;
        }
        assert!(
            out.finish_reason.is_none(),
            "nothing after the finish but usage"
        );
        let choice = &choices[0];
        assert_eq!(choice["index"], 0);
        let piece = if object == "chat.completion.chunk" {
            if let Some(role) = choice["delta"]["role"].as_str() {
                assert_eq!(i, 0, "the role comes in the first chunk");
                out.role = Some(role.to_string());
            }
            choice["delta"]["content"].as_str().unwrap_or("")
        } else {
            choice["text"].as_str().expect("text")
        };
        out.text.push_str(piece);
        if let Some(prompt) = choice.get("prompt_token_ids") {
            assert!(out.prompt_token_ids.is_none(), "prompt ids once");
            out.prompt_token_ids = Some(ids(prompt));
        }
        if let Some(tokens) = choice.get("token_ids") {
            out.token_ids.extend(ids(tokens));
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            out.finish_reason = Some(reason.to_string());
        }
    }
    assert!(
        out.finish_reason.is_some(),
        "the stream has a finish reason"
    );
    out
}

fn usage(prompt: usize, completion: usize) -> Value {
    usage_cached(prompt, completion, 0)
}

/// Usage of a request `cached` of whose prompt tokens the prefix cache served.
fn usage_cached(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

/// Asserts a blocking completion equals the reference `generate` printed;
/// `completion_tokens` is what usage must count.
fn assert_completion(reply: &Reply, reference: &Value, completion_tokens: usize) {
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["id"].as_str().is_some_and(|id| !id.is_empty()));
    let choice = &body["choices"][0];
    assert_eq!(
        ids(&choice["prompt_token_ids"]),
        ids(&reference["prompt_ids"])
    );
    assert_eq!(ids(&choice["token_ids"]), ids(&reference["token_ids"]));
    assert_eq!(choice["text"], reference["text"]);
    assert_eq!(choice["finish_reason"], reference["finish_reason"]);
    let prompt_len = reference["prompt_ids"].as_array().unwrap().len();
    assert_eq!(body["usage"], usage(prompt_len, completion_tokens));
}

#[test]
fn completions_equal_generate_blocking_and_streamed() {
    let server = Server::start(&[]);

    // A text prompt that runs to max_tokens: 24 completion tokens.
    let reference = generate(&["--prompt", PROMPT, "--max-tokens", "24"]);
    assert_eq!(reference["finish_reason"], "length");
    let request = json!({"model": MODEL, "prompt": PROMPT, "max_tokens": 24,
                         "temperature": 0, "return_token_ids": true});
    assert_completion(&server.post("/v1/completions", &request), &reference, 24);

    let mut streamed_request = request.clone();
    streamed_request["stream"] = json!(true);
    streamed_request["stream_options"] = json!({"include_usage": true});
    let streamed = add_up(
        &chunks(&server.stream("/v1/completions", &streamed_request)),
        "text_completion",
    );
    assert_eq!(streamed.text, reference["text"].as_str().unwrap());
    assert_eq!(streamed.token_ids, ids(&reference["token_ids"]));
    assert_eq!(
        streamed.prompt_token_ids,
        Some(ids(&reference["prompt_ids"]))
    );
    assert_eq!(streamed.finish_reason.as_deref(), Some("length"));
    assert_eq!(streamed.usage, Some(usage(11, 24)));

    // Token ids in, and a prompt whose greedy run ends with the
    // end-of-sequence token: usage counts that token, the text does not
    // show it, finish_reason is "stop".
    let ending = generate(&["--prompt", PROMPT_ENDING, "--max-tokens", "200"]);
    assert_eq!(ending["finish_reason"], "stop");
    let generated = ending["token_ids"].as_array().unwrap().len();
    assert!(generated < 200);
    let request = json!({"prompt": ending["prompt_ids"], "max_tokens": 200,
                         "temperature": 0, "return_token_ids": true});
    assert_completion(
        &server.post("/v1/completions", &request),
        &ending,
        generated + 1,
    );
    let mut streamed_request = request.clone();
    streamed_request["stream"] = json!(true);
    let streamed = add_up(
        &chunks(&server.stream("/v1/completions", &streamed_request)),
        "text_completion",
    );
    assert_eq!(streamed.text, ending["text"].as_str().unwrap());
    assert_eq!(streamed.token_ids, ids(&ending["token_ids"]));
    assert_eq!(streamed.finish_reason.as_deref(), Some("stop"));
    assert_eq!(streamed.usage, None, "usage only when asked for");

    // Without return_token_ids the answer carries no ids, only text.
    let reply = server.post(
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0}),
    );
    let choice = &reply.json()["choices"][0];
    assert_eq!(choice["text"], reference["text"]);
    assert!(choice.get("token_ids").is_none());

    // A stop string: the text ends before it, finish_reason "stop", and
    // the tokens up to the one that completed it are counted.
    let stopped = generate(&["--prompt", PROMPT, "--max-tokens", "24", "--stop", " or"]);
    assert_eq!(stopped["finish_reason"], "stop");
    let count = stopped["token_ids"].as_array().unwrap().len();
    assert!(count < 24, "the stop string ends the run early");
    assert!(!stopped["text"].as_str().unwrap().contains(" or"));
    assert_completion(
        &server.post(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                    "stop": " or", "return_token_ids": true}),
        ),
        &stopped,
        count,
    );
    let streamed = add_up(
        &chunks(&server.stream(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                    "stop": [" or"], "stream": true}),
        )),
        "text_completion",
    );
    assert_eq!(streamed.text, stopped["text"].as_str().unwrap());
    assert_eq!(streamed.finish_reason.as_deref(), Some("stop"));

    let metrics = server.metrics();
    assert_eq!(metrics.get("sparkrt_requests_total{outcome=\"ok\"}"), 7.0);
    assert_eq!(metrics.get("sparkrt_requests_total{outcome=\"5xx\"}"), 0.0);
}

#[test]
fn chat_equals_generate_blocking_and_streamed() {
    let server = Server::start(&[]);
    let message = "Hello";
    let reference = generate(&["--chat", message, "--max-tokens", "32"]);
    assert_eq!(reference["finish_reason"], "length");
    let prompt_len = reference["prompt_ids"].as_array().unwrap().len();
    // The first request computes the whole prompt; the later ones (the same
    // prompt) take its full 16-token blocks from the prefix cache.
    let mut cached = 0;
    let reused = (prompt_len - 1) / 16 * 16;
    assert!(reused > 0, "the prompt fills a block");

    for content in [json!(message), json!([{"type": "text", "text": message}])] {
        let request = json!({"model": MODEL, "max_tokens": 32, "temperature": 0,
                             "messages": [{"role": "user", "content": content}],
                             "return_token_ids": true});
        let reply = server.post("/v1/chat/completions", &request);
        assert_eq!(reply.status, 200, "{}", reply.body);
        let body = reply.json();
        assert_eq!(body["object"], "chat.completion");
        let choice = &body["choices"][0];
        assert_eq!(choice["message"]["role"], "assistant");
        assert_eq!(choice["message"]["content"], reference["text"]);
        assert_eq!(ids(&choice["token_ids"]), ids(&reference["token_ids"]));
        assert_eq!(
            ids(&choice["prompt_token_ids"]),
            ids(&reference["prompt_ids"])
        );
        assert_eq!(choice["finish_reason"], "length");
        assert_eq!(body["usage"], usage_cached(prompt_len, 32, cached));
        cached = reused;

        let mut streamed_request = request.clone();
        streamed_request["stream"] = json!(true);
        streamed_request["stream_options"] = json!({"include_usage": true});
        let streamed = add_up(
            &chunks(&server.stream("/v1/chat/completions", &streamed_request)),
            "chat.completion.chunk",
        );
        assert_eq!(streamed.role.as_deref(), Some("assistant"));
        assert_eq!(streamed.text, reference["text"].as_str().unwrap());
        assert_eq!(streamed.token_ids, ids(&reference["token_ids"]));
        assert_eq!(
            streamed.prompt_token_ids,
            Some(ids(&reference["prompt_ids"]))
        );
        assert_eq!(streamed.finish_reason.as_deref(), Some("length"));
        assert_eq!(streamed.usage, Some(usage_cached(prompt_len, 32, cached)));
    }

    // Without max_tokens a chat may run to the end of the context.
    let stopped = generate(&["--chat", message, "--max-tokens", "1000", "--stop", " such"]);
    assert_eq!(stopped["finish_reason"], "stop");
    let reply = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": message}], "temperature": 0,
                "stop": " such"}),
    );
    let body = reply.json();
    assert_eq!(body["choices"][0]["message"]["content"], stopped["text"]);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
}

#[test]
fn seeded_sampling_equals_generate_alone_and_together() {
    let server = Server::start(&[]);
    let reference = generate(&[
        "--prompt",
        PROMPT,
        "--max-tokens",
        "24",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--seed",
        "7",
        "--ignore-eos",
    ]);
    let request = json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0.8,
                         "top_p": 0.9, "seed": 7, "ignore_eos": true,
                         "return_token_ids": true});
    // Four at once: each sequence samples from its own seeded generator.
    let replies: Vec<Reply> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| server.post("/v1/completions", &request)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for reply in &replies {
        assert_completion(reply, &reference, 24);
    }
    // Another seed draws other tokens (the same ones on every run).
    let mut other = request.clone();
    other["seed"] = json!(8);
    let body = server.post("/v1/completions", &other).json();
    assert_ne!(
        ids(&body["choices"][0]["token_ids"]),
        ids(&reference["token_ids"])
    );
}

#[test]
fn a_model_without_a_tokenizer_takes_and_streams_token_ids() {
    // The tiny checkpoint without its tokenizer files.
    let dir = tempfile::tempdir().unwrap();
    let fixture = server::repo().join("tests/fixtures/qwen3-moe-tiny");
    for file in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(file), dir.path().join(file)).unwrap();
    }
    let model = dir.path().to_str().unwrap();
    let served = dir
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let prompt = prompt_ids(12, 3);
    let prompt_arg = prompt
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let reference = generate(&[
        "--model",
        model,
        "--prompt-ids",
        &prompt_arg,
        "--max-tokens",
        "10",
        "--ignore-eos",
    ]);
    assert_eq!(ids(&reference["token_ids"]).len(), 10);

    let server = Server::start(&["--model", model]);
    let request = json!({"prompt": prompt, "max_tokens": 10, "ignore_eos": true,
                         "temperature": 0, "return_token_ids": true});
    let reply = server.post("/v1/completions", &request);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    // Served under the folder's name; no text without a tokenizer.
    assert_eq!(body["model"], served);
    assert_eq!(body["choices"][0]["text"], "");
    assert_eq!(
        ids(&body["choices"][0]["token_ids"]),
        ids(&reference["token_ids"])
    );

    // Streamed: a chunk per token, as it is generated.
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let events = server.stream("/v1/completions", &streamed);
    let chunks = chunks(&events);
    let per_chunk: Vec<Vec<u32>> = chunks
        .iter()
        .filter(|c| c["choices"][0]["finish_reason"].is_null())
        .map(|c| ids(&c["choices"][0]["token_ids"]))
        .collect();
    let expected: Vec<Vec<u32>> = ids(&reference["token_ids"])
        .into_iter()
        .map(|id| vec![id])
        .collect();
    assert_eq!(per_chunk, expected);

    // Text needs the tokenizer, chat the template.
    let error = server
        .post("/v1/completions", &json!({"prompt": "Hello"}))
        .assert_error(400);
    assert_eq!(error["param"], "prompt");
    server
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}]}),
        )
        .assert_error(400);
}

#[test]
fn models_lists_the_served_model() {
    let server = Server::start(&[]);
    let reply = server.get("/v1/models");
    assert_eq!(reply.status, 200);
    let body = reply.json();
    assert_eq!(body["object"], "list");
    let models = body["data"].as_array().unwrap();
    assert_eq!(models.len(), 1);
    assert_eq!(models[0]["id"], MODEL);
    assert_eq!(models[0]["object"], "model");
    // profiles/qwen3-moe-tiny.toml: max_model_len = 1024.
    assert_eq!(models[0]["max_model_len"], 1024);
    assert_eq!(server.get("/health").status, 200);
}

#[test]
fn memory_and_metrics_follow_the_contract() {
    let server = Server::start(&[]);
    // Some traffic first, so the counters have something to count.
    let reply = server.post(
        "/v1/completions",
        &json!({"prompt": [1, 2, 3, 4, 5], "max_tokens": 3, "ignore_eos": true}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    server.wait_until_idle();

    let memory = server.get("/v1/memory").json();
    let plan = &memory["plan"];
    assert_eq!(plan["fits"], true);
    let categories = memory["ledger"]["categories"].as_array().unwrap();
    let names: Vec<&str> = categories
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "weights",
            "moe_workspace",
            "activations",
            "kv_cache",
            "recurrent_state",
            "runtime_overhead"
        ]
    );
    // Start-up allocates exactly the plan, category by category.
    let mut planned_sum = 0;
    for c in categories {
        assert_eq!(c["planned"], c["allocated"], "{c}");
        planned_sum += c["planned"].as_u64().unwrap();
    }
    assert_eq!(plan["total"].as_u64().unwrap(), planned_sum);
    assert_eq!(memory["ledger"]["page_cache_policy"], "willneed");
    assert_eq!(memory["ledger"]["weights_residency"], "mapped");
    // f32 KV: 4 layers x K and V x 2 heads x 32 dims x 4 bytes = 2048 bytes
    // a token, 16 tokens a block; "auto" is capped at max_num_seqs (8) x
    // 1024 / 16 = 512 blocks.
    assert_eq!(
        memory["kv"],
        json!({"block_size_tokens": 16, "block_bytes": 32768, "blocks_total": 512,
               "blocks_used": 0, "blocks_cached": 0})
    );
    // tests/fixtures/hosts/box24/proc/meminfo, in bytes; no kubelet there.
    let host = &memory["host"];
    assert_eq!(host["mem_total"], 25_165_824u64 * 1024);
    assert_eq!(host["mem_available"], 23_068_672u64 * 1024);
    assert_eq!(host["mem_free"], 20_971_520u64 * 1024);
    assert_eq!(host["cached"], 2_097_152u64 * 1024);
    assert_eq!(host["buffers"], 102_400u64 * 1024);
    assert_eq!(host["shmem"], 10_240u64 * 1024);
    assert_eq!(host["swap_total"], 0);
    assert_eq!(host["eviction_hard"], 0);
    assert_eq!(host["kubepods_current"], Value::Null);
    // No kubelet: the guard trips below the safety margin (512 MiB) and
    // resumes one margin above; on the CPU nothing is hidden from the host.
    assert_eq!(
        memory["guard"],
        json!({"tripped": false, "threshold_bytes": 512u64 << 20, "resume_bytes": 1024u64 << 20,
               "pinned_weights_bytes": 0, "driver_allocations_bytes": 0})
    );
    let rss = memory["process_rss"].as_u64().unwrap();
    assert!(
        rss > 0 && rss <= planned_sum,
        "RSS {rss} within the plan {planned_sum}"
    );

    let m = server.metrics();
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"ok\"}"), 1.0);
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"5xx\"}"), 0.0);
    assert_eq!(m.get("sparkrt_requests_total{outcome=\"rejected\"}"), 0.0);
    assert_eq!(m.get("sparkrt_requests_running"), 0.0);
    assert_eq!(m.get("sparkrt_requests_waiting"), 0.0);
    assert_eq!(m.get("sparkrt_prompt_tokens_total"), 5.0);
    assert_eq!(m.get("sparkrt_generation_tokens_total"), 3.0);
    assert_eq!(m.get("sparkrt_preemptions_total"), 0.0);
    assert_eq!(m.get("sparkrt_kv_blocks_free"), 512.0);
    for c in categories {
        let name = c["name"].as_str().unwrap();
        for kind in ["planned", "allocated"] {
            assert_eq!(
                m.get(&format!(
                    "sparkrt_ledger_bytes{{category=\"{name}\",kind=\"{kind}\"}}"
                )),
                c[kind].as_u64().unwrap() as f64
            );
        }
    }
    assert_eq!(
        m.get("sparkrt_host_mem_available_bytes"),
        (23_068_672u64 * 1024) as f64
    );
    assert_eq!(m.get("sparkrt_guard_tripped"), 0.0);

    // /v1/stats: the same figures as JSON, read with the wire types the
    // monitor reads it with.
    let reply = server.get("/v1/stats");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let stats: ServingStats = serde_json::from_str(&reply.body).unwrap();
    // One request: one TTFT sample; its 3 tokens: two inter-token gaps.
    let ttft = stats
        .ttft_seconds
        .expect("the request's time to first token");
    assert!(ttft.p50 > 0.0 && ttft.p50 == ttft.p99, "{ttft:?}");
    let itl = stats.itl_seconds.expect("its inter-token latencies");
    assert!(itl.p50 > 0.0 && itl.p50 <= itl.p99, "{itl:?}");
    assert_eq!(
        stats,
        ServingStats {
            requests: RequestOutcomes {
                ok: 1,
                error: 0,
                rejected: 0,
                cancelled: 0,
            },
            requests_running: 0,
            requests_waiting: 0,
            prompt_tokens_total: 5,
            generation_tokens_total: 3,
            preemptions_total: 0,
            kv_blocks_used: 0,
            kv_blocks_free: 512,
            kv_blocks_cached: 0,
            prefix_cache_queries_total: 4,
            prefix_cache_hits_total: 0,
            state_snapshots_cached: 0,
            state_snapshots_taken_total: 0,
            spec_decode_num_drafts_total: 0,
            spec_decode_num_draft_tokens_total: 0,
            spec_decode_num_accepted_tokens_total: 0,
            spec_decode_num_accepted_tokens_per_pos: [0; sparkrt_wire::MAX_SPECULATIVE_TOKENS],
            guard_tripped: false,
            ttft_seconds: Some(ttft),
            itl_seconds: Some(itl),
        }
    );
    // The monitor reads /v1/memory with the types the server wrote it with
    // (the plan kept as untyped JSON, as the monitor keeps it).
    let report: MemoryReport<Value> = serde_json::from_str(&server.get("/v1/memory").body).unwrap();
    assert_eq!(report.ledger.page_cache_policy, PageCachePolicy::WillNeed);
    assert_eq!(report.ledger.weights_residency, WeightsResidency::Mapped);
    assert_eq!(report.kv.blocks_total, 512);
    assert_eq!(report.runtime_allocated(), planned_sum);
}

/// What is sent, where, and the status and `param` expected back.
struct BadRequest(
    &'static str,
    &'static str,
    Vec<u8>,
    u16,
    Option<&'static str>,
);

#[test]
fn bad_input_gets_openai_errors_and_the_server_keeps_serving() {
    let server = Server::start(&[]);
    let completions = "/v1/completions";
    let chat = "/v1/chat/completions";
    let text = |body: &str| body.as_bytes().to_vec();
    let mut over_limit = b"{\"prompt\": \"".to_vec();
    over_limit.resize(8 * 1024 * 1024 + 1, b'a');
    over_limit.extend_from_slice(b"\"}");
    let too_long: Vec<u32> = prompt_ids(1024, 7);
    let cases: Vec<BadRequest> = vec![
        BadRequest(
            "malformed JSON",
            completions,
            text("{\"prompt\": "),
            400,
            None,
        ),
        BadRequest("not an object", completions, text("[1, 2]"), 400, None),
        BadRequest("empty body", completions, Vec::new(), 400, None),
        BadRequest(
            "prompt of the wrong type",
            completions,
            text("{\"prompt\": 7}"),
            400,
            None,
        ),
        BadRequest(
            "max_tokens of the wrong type",
            completions,
            text("{\"prompt\": \"hi\", \"max_tokens\": \"ten\"}"),
            400,
            None,
        ),
        BadRequest(
            "temperature of the wrong type",
            completions,
            text("{\"prompt\": \"hi\", \"temperature\": \"hot\"}"),
            400,
            None,
        ),
        BadRequest(
            "stream of the wrong type",
            completions,
            text("{\"prompt\": \"hi\", \"stream\": \"yes\"}"),
            400,
            None,
        ),
        BadRequest(
            "messages of the wrong type",
            chat,
            text("{\"messages\": \"hi\"}"),
            400,
            None,
        ),
        BadRequest("body over the limit", completions, over_limit, 413, None),
        BadRequest(
            "negative max_tokens",
            completions,
            text("{\"prompt\": \"hi\", \"max_tokens\": -5}"),
            400,
            Some("max_tokens"),
        ),
        BadRequest(
            "zero max_tokens",
            completions,
            text("{\"prompt\": \"hi\", \"max_tokens\": 0}"),
            400,
            Some("max_tokens"),
        ),
        BadRequest(
            "huge max_tokens",
            completions,
            text("{\"prompt\": \"hi\", \"max_tokens\": 1000000000000}"),
            400,
            Some("max_tokens"),
        ),
        BadRequest(
            "max_tokens beyond 64 bits",
            completions,
            text("{\"prompt\": \"hi\", \"max_tokens\": 1e30}"),
            400,
            None,
        ),
        BadRequest(
            "negative temperature",
            completions,
            text("{\"prompt\": \"hi\", \"temperature\": -1}"),
            400,
            Some("temperature"),
        ),
        BadRequest(
            "n above max_n",
            completions,
            text("{\"prompt\": \"hi\", \"n\": 17}"),
            400,
            Some("n"),
        ),
        BadRequest(
            "missing prompt",
            completions,
            text("{\"max_tokens\": 3}"),
            400,
            None,
        ),
        BadRequest(
            "empty prompt",
            completions,
            text("{\"prompt\": \"\"}"),
            400,
            Some("prompt"),
        ),
        BadRequest(
            "empty prompt list",
            completions,
            text("{\"prompt\": []}"),
            400,
            Some("prompt"),
        ),
        BadRequest(
            "token id outside the vocabulary",
            completions,
            text("{\"prompt\": [1, 512]}"),
            400,
            Some("prompt"),
        ),
        BadRequest(
            "prompt longer than max_model_len",
            completions,
            json!({"prompt": too_long}).to_string().into_bytes(),
            400,
            Some("prompt"),
        ),
        BadRequest(
            "text prompt longer than max_model_len",
            completions,
            json!({"prompt": "word ".repeat(2000)})
                .to_string()
                .into_bytes(),
            400,
            Some("prompt"),
        ),
        BadRequest(
            "prompt that leaves no room for max_tokens",
            completions,
            json!({"prompt": &too_long[..1023], "max_tokens": 2})
                .to_string()
                .into_bytes(),
            400,
            Some("max_tokens"),
        ),
        BadRequest(
            "unknown model",
            completions,
            text("{\"prompt\": \"hi\", \"model\": \"gpt-4\"}"),
            404,
            Some("model"),
        ),
        BadRequest(
            "unknown model in a chat",
            chat,
            text("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"model\": \"x\"}"),
            404,
            Some("model"),
        ),
        BadRequest(
            "missing messages",
            chat,
            text("{\"model\": \"qwen3-moe-tiny\"}"),
            400,
            None,
        ),
        BadRequest(
            "empty messages",
            chat,
            text("{\"messages\": []}"),
            400,
            Some("messages"),
        ),
        BadRequest(
            "message without content",
            chat,
            text("{\"messages\": [{\"role\": \"user\"}]}"),
            400,
            Some("messages[0].content"),
        ),
        BadRequest(
            "image content part",
            chat,
            text(
                "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]}",
            ),
            400,
            Some("messages[0].content[0].type"),
        ),
        BadRequest(
            "invalid UTF-8",
            completions,
            b"{\"prompt\": \"\xff\xfe\xfd\"}".to_vec(),
            400,
            None,
        ),
        BadRequest(
            "invalid UTF-8 in a chat",
            chat,
            b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}".to_vec(),
            400,
            None,
        ),
        BadRequest("unknown route", "/v1/embeddings", text("{}"), 404, None),
    ];
    for BadRequest(what, path, body, status, param) in &cases {
        let reply = server.post_bytes(path, body);
        let error = reply.assert_error(*status);
        assert_eq!(
            error["param"].as_str(),
            *param,
            "{what}: param of {}",
            reply.body
        );
        if *status == 404 && *param == Some("model") {
            assert_eq!(error["code"], "model_not_found", "{what}");
        }
    }
    // A GET on a POST route.
    server.get(completions).assert_error(405);

    // The boundary: 1023 prompt tokens and one more fills max_model_len.
    let reply = server.post(
        completions,
        &json!({"prompt": &too_long[..1023], "max_tokens": 1}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["usage"], usage(1023, 1));

    // Still serving, and nothing bad reached the engine.
    let reply = server.post(completions, &json!({"prompt": PROMPT, "max_tokens": 4}));
    assert_eq!(reply.status, 200, "{}", reply.body);
    server.wait_until_idle();
    let metrics = server.metrics();
    assert_eq!(metrics.get("sparkrt_requests_total{outcome=\"ok\"}"), 2.0);
    assert_eq!(metrics.get("sparkrt_requests_total{outcome=\"5xx\"}"), 0.0);
    assert_eq!(server.get("/health").status, 200);
}

#[test]
fn a_full_queue_gets_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    // One sequence at a time, one waiting: the third request has no room.
    let profile = tiny_profile(
        dir.path(),
        "one-seq",
        "max_model_len = 16384\nmax_num_seqs = 1\nmax_num_batched_tokens = 256\n\
         kv_cache_dtype = \"f32\"\nkv_cache = \"auto\"\nkv_block_size = 16",
    );
    let server = Server::start(&["--profile", profile.to_str().unwrap(), "--max-queue", "1"]);
    // Long enough to be running and waiting for as long as the test looks.
    let long = json!({"prompt": "Hello", "max_tokens": 16000, "ignore_eos": true,
                      "stream": true});
    let mut running = server.open_stream("/v1/completions", &long);
    assert!(running.next_data().is_some());
    server.wait_until("one request runs", || {
        server.metrics().get("sparkrt_requests_running") == 1.0
    });
    let waiting = server.open_stream("/v1/completions", &long);
    server.wait_until("one request waits", || {
        server.metrics().get("sparkrt_requests_waiting") == 1.0
    });

    let reply = server.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    let error = reply.assert_error(429);
    assert_eq!(error["type"], "rate_limit_error");
    assert_eq!(error["code"], "queue_full");
    let retry: u64 = reply
        .header("retry-after")
        .expect("a Retry-After header")
        .parse()
        .expect("Retry-After in seconds");
    assert!(retry > 0);
    assert_eq!(
        server
            .metrics()
            .get("sparkrt_requests_total{outcome=\"rejected\"}"),
        1.0
    );

    // Both clients leave; the waiting one too is dropped and the blocks
    // come back.
    drop(running);
    drop(waiting);
    server.wait_until("the clients' sequences are freed", || {
        let m = server.metrics();
        m.get("sparkrt_requests_running") == 0.0
            && m.get("sparkrt_requests_waiting") == 0.0
            && m.get("sparkrt_kv_blocks_used") == 0.0
    });
    let reply = server.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[test]
fn the_api_key_guards_every_route_but_the_probes() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "s3cret-key-0123\n").unwrap();
    let mut server = Server::start_with_key(
        &["--api-key-file", key_file.to_str().unwrap()],
        Some("s3cret-key-0123"),
    );
    let no_key: &[(&str, &str)] = &[];
    let wrong: &[(&str, &str)] = &[("Authorization", "Bearer s3cret-key-0124")];
    let prefix: &[(&str, &str)] = &[("Authorization", "Bearer s3cret")];
    let basic: &[(&str, &str)] = &[("Authorization", "Basic czNjcmV0LWtleS0wMTIz")];
    let no_scheme: &[(&str, &str)] = &[("Authorization", "s3cret-key-0123")];
    let body = json!({"prompt": "Hi", "max_tokens": 2}).to_string();

    // Without the key (or with a wrong one) only the probes answer: a
    // kubelet's readiness probe sends no key (issue 13).
    server.set_key(None);
    assert_eq!(server.get("/health").status, 200);
    assert_eq!(server.get("/ready").status, 200);
    for headers in [no_key, wrong, prefix, basic, no_scheme] {
        for path in [
            "/metrics",
            "/v1/memory",
            "/v1/stats",
            "/v1/models",
            "/v1/nothing",
        ] {
            let error = server.get_with(path, headers).assert_error(401);
            assert_eq!(error["code"], "invalid_api_key", "{path} {headers:?}");
        }
        for path in ["/v1/completions", "/v1/chat/completions"] {
            server
                .post_with(path, body.as_bytes(), headers)
                .assert_error(401);
        }
    }
    // The scheme's name is case-insensitive (RFC 9110).
    let lower = [("Authorization", "bearer s3cret-key-0123")];
    assert_eq!(server.get_with("/v1/models", &lower).status, 200);

    // With the key, everything answers.
    server.set_key(Some("s3cret-key-0123"));
    for path in [
        "/health",
        "/ready",
        "/metrics",
        "/v1/memory",
        "/v1/stats",
        "/v1/models",
    ] {
        assert_eq!(server.get(path).status, 200, "{path}");
    }
    let reply = server.post_bytes("/v1/completions", body.as_bytes());
    assert_eq!(reply.status, 200, "{}", reply.body);
    server.get("/v1/nothing").assert_error(404);
    assert_eq!(
        server
            .metrics()
            .get("sparkrt_requests_total{outcome=\"ok\"}"),
        1.0
    );
}
