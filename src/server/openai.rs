//! OpenAI-compatible routes: `/v1/models`, `/v1/completions`,
//! `/v1/chat/completions`, streamed (SSE) or not.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::ServerState;
use super::engine_loop::{Command, SubmitError};
use super::errors::ApiError;
use crate::engine::sampling::SamplingParams;
use crate::engine::{AdmissionError, Event, Request};
use crate::text::ChatMessage;

/// Seconds a client is told to wait after a 429 or 503.
const RETRY_AFTER_SECONDS: u64 = 2;

pub async fn models(State(state): State<Arc<ServerState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_name,
            "object": "model",
            "created": state.started_unix,
            "owned_by": "sparkrt",
            "max_model_len": state.limits.max_model_len,
        }]
    }))
}

/// Unknown routes answer in OpenAI's error shape too.
pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::invalid(format!("no route {}", uri.path()), None)
        .with_status(axum::http::StatusCode::NOT_FOUND)
}

pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::invalid(format!("{method} is not allowed on {}", uri.path()), None)
        .with_status(axum::http::StatusCode::METHOD_NOT_ALLOWED)
}

/// Either one string or a list of strings (`stop`, `prompt`).
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A prompt: text, or token ids.
#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

/// Fields common to both routes. Unknown fields are ignored, as OpenAI's
/// clients send more than a server needs.
#[derive(Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    seed: Option<u64>,
    stop: Option<OneOrMany>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    n: Option<u32>,
    /// vLLM's extension: keep generating past end-of-sequence tokens
    /// (benchmarks with fixed output lengths).
    #[serde(default)]
    ignore_eos: bool,
    /// vLLM's extension: also answer the prompt's and the output's token ids.
    #[serde(default)]
    return_token_ids: bool,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct CompletionBody {
    #[serde(flatten)]
    common: Common,
    prompt: Prompt,
}

#[derive(Deserialize)]
struct ChatBody {
    #[serde(flatten)]
    common: Common,
    messages: Vec<ChatInput>,
}

#[derive(Deserialize)]
struct ChatInput {
    role: String,
    content: ChatContent,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ChatContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// Which route a request came from (response shapes differ).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Completion,
    Chat,
}

pub async fn completions(
    State(state): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body: CompletionBody = parse_body(body)?;
    let prompt = match body.prompt {
        Prompt::Ids(ids) => ids,
        Prompt::Text(text) => encode(&state, &text)?,
        Prompt::Texts(mut texts) if texts.len() == 1 => encode(&state, &texts.remove(0))?,
        Prompt::Texts(texts) if texts.is_empty() => {
            return Err(ApiError::invalid(
                "`prompt` must not be empty",
                Some("prompt"),
            ));
        }
        Prompt::Texts(_) => {
            return Err(ApiError::invalid(
                "only one prompt per request is supported",
                Some("prompt"),
            ));
        }
    };
    serve(state, body.common, prompt, Route::Completion).await
}

pub async fn chat_completions(
    State(state): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body: ChatBody = parse_body(body)?;
    if body.messages.is_empty() {
        return Err(ApiError::invalid(
            "`messages` must not be empty",
            Some("messages"),
        ));
    }
    let template = state.chat_template.as_ref().ok_or_else(|| {
        ApiError::invalid("this model has no chat template; use /v1/completions", None)
    })?;
    let mut messages = Vec::with_capacity(body.messages.len());
    for m in body.messages {
        let content = match m.content {
            ChatContent::Text(t) => t,
            ChatContent::Parts(parts) => {
                let mut text = String::new();
                for part in parts {
                    match (part.kind.as_str(), part.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        _ => {
                            return Err(ApiError::invalid(
                                "only text content parts are supported",
                                Some("messages"),
                            ));
                        }
                    }
                }
                text
            }
        };
        messages.push(ChatMessage::new(m.role, content));
    }
    let rendered = template
        .render(&messages, true)
        .map_err(|e| ApiError::invalid(format!("chat template: {e}"), Some("messages")))?;
    let prompt = encode(&state, &rendered)?;
    serve(state, body.common, prompt, Route::Chat).await
}

fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        ApiError::invalid(rejection.body_text(), None).with_status(rejection.status())
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}"), None))
}

fn encode(state: &ServerState, text: &str) -> Result<Vec<u32>, ApiError> {
    let tokenizer = state.tokenizer.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "this model has no tokenizer; send token ids",
            Some("prompt"),
        )
    })?;
    tokenizer
        .encode(text, false)
        .map_err(|e| ApiError::invalid(format!("cannot tokenize the prompt: {e}"), Some("prompt")))
}

/// Validates the sampling fields against the prompt and the model's limits.
fn sampling(
    common: &Common,
    prompt_len: usize,
    max_model_len: usize,
    route: Route,
) -> Result<SamplingParams, ApiError> {
    if let Some(model) = &common.model
        && model.is_empty()
    {
        return Err(ApiError::invalid(
            "`model` must not be empty",
            Some("model"),
        ));
    }
    if common.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("only n = 1 is supported", Some("n")));
    }
    if prompt_len >= max_model_len {
        return Err(ApiError::invalid(
            format!(
                "the prompt has {prompt_len} tokens; this model's maximum context length is {max_model_len} tokens"
            ),
            Some("prompt"),
        ));
    }
    let room = max_model_len - prompt_len;
    let max_tokens = match common.max_completion_tokens.or(common.max_tokens) {
        None if route == Route::Completion => 16.min(room),
        None => room,
        Some(n) if n < 1 => {
            return Err(ApiError::invalid(
                "`max_tokens` must be at least 1",
                Some("max_tokens"),
            ));
        }
        Some(n) if n as u64 > room as u64 => {
            return Err(ApiError::invalid(
                format!(
                    "max_tokens = {n} plus the prompt's {prompt_len} tokens exceeds this model's maximum context length of {max_model_len} tokens"
                ),
                Some("max_tokens"),
            ));
        }
        Some(n) => n as usize,
    };
    let top_k = match common.top_k {
        None | Some(-1) | Some(0) => None,
        Some(k) if k > 0 => Some(k as usize),
        Some(_) => return Err(ApiError::invalid("`top_k` must be positive", Some("top_k"))),
    };
    let stop = match &common.stop {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
    };
    let params = SamplingParams {
        temperature: common.temperature.unwrap_or(1.0),
        top_k,
        top_p: common.top_p.unwrap_or(1.0),
        seed: common.seed,
        max_tokens,
        stop,
    };
    params
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string(), None))?;
    Ok(params)
}

async fn serve(
    state: Arc<ServerState>,
    common: Common,
    prompt: Vec<u32>,
    route: Route,
) -> Result<Response, ApiError> {
    if let Some(model) = &common.model
        && !model.is_empty()
        && *model != state.model_name
    {
        return Err(ApiError::model_not_found(model));
    }
    let params = sampling(&common, prompt.len(), state.limits.max_model_len, route)?;
    if state.guard.tripped() {
        state.counters.rejected();
        return Err(ApiError::memory_guard(RETRY_AFTER_SECONDS));
    }
    let prompt_len = prompt.len();
    let prompt_ids = common.return_token_ids.then(|| prompt.clone());
    let (events_tx, events) = mpsc::unbounded_channel();
    let (reply_tx, reply) = oneshot::channel();
    state
        .engine
        .commands
        .send(Command::Submit {
            request: Request {
                prompt,
                params,
                prompt_logits: false,
                ignore_eos: common.ignore_eos,
            },
            events: events_tx,
            reply: reply_tx,
        })
        .map_err(|_| ApiError::internal("the engine has stopped"))?;
    match reply.await {
        Ok(Ok(_)) => {}
        Ok(Err(SubmitError::QueueFull)) => {
            state.counters.rejected();
            return Err(ApiError::queue_full(RETRY_AFTER_SECONDS));
        }
        Ok(Err(SubmitError::Admission(e))) => {
            state.counters.rejected();
            return Err(admission_error(e));
        }
        Ok(Err(SubmitError::ShuttingDown)) | Err(_) => {
            return Err(ApiError::internal("the server is shutting down")
                .with_status(axum::http::StatusCode::SERVICE_UNAVAILABLE));
        }
    }
    let meta = ResponseMeta {
        id: format!(
            "{}-{}",
            if route == Route::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            state.next_request_id()
        ),
        created: unix_now(),
        model: state.model_name.clone(),
        route,
        prompt_len,
        prompt_ids,
        include_usage: common.stream_options.is_some_and(|o| o.include_usage),
    };
    if common.stream {
        Ok(stream(state, meta, events).into_response())
    } else {
        collect(state, meta, events).await
    }
}

fn admission_error(e: AdmissionError) -> ApiError {
    let param = match e {
        AdmissionError::Sampling(_) => None,
        _ => Some("prompt"),
    };
    ApiError::invalid(e.to_string(), param)
}

struct ResponseMeta {
    id: String,
    created: u64,
    model: String,
    route: Route,
    prompt_len: usize,
    /// The prompt's token ids when the client asked for token ids
    /// (`return_token_ids`); output ids are then reported too.
    prompt_ids: Option<Vec<u32>>,
    include_usage: bool,
}

impl ResponseMeta {
    fn usage(&self, completion: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_len,
            "completion_tokens": completion,
            "total_tokens": self.prompt_len + completion,
        })
    }

    fn object(&self) -> &'static str {
        match self.route {
            Route::Completion => "text_completion",
            Route::Chat => "chat.completion",
        }
    }

    /// The one choice of a blocking answer.
    fn choice(&self, text: &str, ids: &[u32], finish: &str) -> Value {
        let mut choice = match self.route {
            Route::Completion => json!({"index": 0, "text": text, "logprobs": null,
                                        "finish_reason": finish}),
            Route::Chat => json!({"index": 0,
                                  "message": {"role": "assistant", "content": text},
                                  "logprobs": null, "finish_reason": finish}),
        };
        if let Some(prompt_ids) = &self.prompt_ids {
            choice["prompt_token_ids"] = json!(prompt_ids);
            choice["token_ids"] = json!(ids);
        }
        choice
    }

    /// One streamed chunk carrying `text` and the ids of the tokens it
    /// came from (and the finish reason at the end).
    fn chunk(&self, text: Option<&str>, ids: &[u32], finish: Option<&str>, first: bool) -> Value {
        let mut choice = match self.route {
            Route::Completion => json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null,
                                        "finish_reason": finish}),
            Route::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
        };
        if let Some(prompt_ids) = &self.prompt_ids {
            if first {
                choice["prompt_token_ids"] = json!(prompt_ids);
            }
            choice["token_ids"] = json!(ids);
        }
        let object = match self.route {
            Route::Completion => "text_completion",
            Route::Chat => "chat.completion.chunk",
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [choice],
        })
    }
}

async fn collect(
    state: Arc<ServerState>,
    meta: ResponseMeta,
    mut events: mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut ids = Vec::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Token { id, text: piece } => {
                ids.push(id);
                text.push_str(&piece);
            }
            Event::PromptLogits { .. } => {}
            Event::Finished {
                reason,
                text: rest,
                completion_tokens,
                ..
            } => {
                text.push_str(&rest);
                state.counters.finished(true);
                return Ok(Json(json!({
                    "id": meta.id, "object": meta.object(), "created": meta.created,
                    "model": meta.model,
                    "choices": [meta.choice(&text, &ids, reason.as_str())],
                    "usage": meta.usage(completion_tokens.max(ids.len())),
                }))
                .into_response());
            }
            Event::Failed { message } => {
                state.counters.finished(false);
                return Err(ApiError::internal(message));
            }
        }
    }
    state.counters.finished(false);
    Err(ApiError::internal("the engine dropped the request"))
}

fn stream(
    state: Arc<ServerState>,
    meta: ResponseMeta,
    mut events: mpsc::UnboundedReceiver<Event>,
) -> Sse<impl futures_core::Stream<Item = Result<SseEvent, Infallible>>> {
    let body = async_stream::stream! {
        let mut first = true;
        if meta.route == Route::Chat {
            yield Ok(data(&meta.chunk(Some(""), &[], None, true)));
            first = false;
        }
        // Ids of tokens whose text is still held back (partial characters,
        // possible stop strings): they go out with the next text. Without a
        // tokenizer there is no text at all: every token gets its chunk.
        let mut ids = Vec::new();
        let chunk_per_token = state.tokenizer.is_none();
        let mut ended = false;
        while let Some(event) = events.recv().await {
            match event {
                Event::Token { id, text } => {
                    ids.push(id);
                    if !text.is_empty() || chunk_per_token {
                        yield Ok(data(&meta.chunk(Some(&text), &ids, None, first)));
                        ids.clear();
                        first = false;
                    }
                }
                Event::PromptLogits { .. } => {}
                Event::Finished { reason, text, completion_tokens, .. } => {
                    state.counters.finished(true);
                    if !text.is_empty() || !ids.is_empty() {
                        yield Ok(data(&meta.chunk(Some(&text), &ids, None, first)));
                        first = false;
                    }
                    yield Ok(data(&meta.chunk(None, &[], Some(reason.as_str()), first)));
                    if meta.include_usage {
                        let mut usage = meta.chunk(None, &[], None, false);
                        usage["choices"] = json!([]);
                        usage["usage"] = meta.usage(completion_tokens);
                        yield Ok(data(&usage));
                    }
                    ended = true;
                    break;
                }
                Event::Failed { message } => {
                    state.counters.finished(false);
                    yield Ok(data(&ApiError::internal(message).body()));
                    ended = true;
                    break;
                }
            }
        }
        if !ended {
            state.counters.finished(false);
            yield Ok(data(&ApiError::internal("the engine dropped the request").body()));
        }
        yield Ok(SseEvent::default().data("[DONE]"));
    };
    Sse::new(body).keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
}

fn data(value: &Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
