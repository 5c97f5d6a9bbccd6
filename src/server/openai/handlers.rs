//! The axum handlers of the OpenAI routes: admit, parse and validate the
//! body, render and tokenize (on [`crate::server::prep`]'s pool), submit to
//! the engine, then answer at once ([`collect`]) or stream
//! ([`super::stream`]).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use tokio::sync::{mpsc, oneshot};

use super::outcome::Outcome;
use super::types::{
    ASSISTANT, AssistantMessage, ChatChoice, ChatContent, ChatInput, ChatRequest, CommonParams,
    CompletionRequest, CompletionResponse, ModelCard, ModelList, OneOrMany, Prompt, RequestBody,
    TextChoice,
};
use super::{ResponseMeta, Route, stream};
use crate::engine::grammar::Constraint;
use crate::engine::sampling::{MAX_TEMPERATURE, SamplingParams};
use crate::engine::{AdmissionError, Event, Request};
use crate::server::engine_loop::{Command, SubmitError};
use crate::server::errors::ApiError;
use crate::server::{ServerState, body};
use crate::text::ChatMessage;

/// Seconds a client is told to wait after a 429 or 503.
const RETRY_AFTER_SECONDS: u64 = 2;

pub async fn models(State(state): State<Arc<ServerState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.config.model_name.clone(),
            object: "model",
            created: state.started_unix,
            owned_by: "sparkrt",
            max_model_len: state.config.limits.max_model_len,
        }],
    })
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

pub async fn completions(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    handle(state, &headers, body, Route::Completion).await
}

pub async fn chat_completions(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    handle(state, &headers, body, Route::Chat).await
}

/// Both routes, in the order that keeps work after refusals: the body limit
/// (413), the engine's and the guard's admission (503) before anything is
/// parsed, then the parsing, the request limits, the template and the
/// tokenizer on the preparation pool, then the engine.
async fn handle(
    state: Arc<ServerState>,
    headers: &HeaderMap,
    body: Body,
    route: Route,
) -> Result<Response, ApiError> {
    let bytes = body::read(headers, body, state.request_limits.max_body_bytes).await?;
    admit(&state)?;
    // From here a client that leaves is counted as cancelled.
    let mut outcome = Outcome::new(Arc::clone(&state));
    let submitted = match prepare_and_submit(&state, bytes, route).await {
        Ok(s) => s,
        Err(e) => {
            outcome.dismiss();
            return Err(e);
        }
    };
    if submitted.stream {
        Ok(stream::sse(state, submitted.meta, submitted.events, outcome).into_response())
    } else {
        let answer = collect(submitted.meta, submitted.events).await;
        outcome.finished(answer.is_ok());
        answer
    }
}

/// 503 without looking at the request while the engine thread is gone or
/// the memory guard is tripped.
fn admit(state: &ServerState) -> Result<(), ApiError> {
    if let Some(failure) = state.config.engine.gauges.failure() {
        return Err(
            ApiError::internal(format!("the engine has stopped: {failure}"))
                .with_status(axum::http::StatusCode::SERVICE_UNAVAILABLE),
        );
    }
    if state.config.guard.tripped() {
        state.counters.rejected();
        return Err(ApiError::memory_guard(RETRY_AFTER_SECONDS));
    }
    Ok(())
}

/// A request the engine took: its answer's metadata and its events.
struct Submitted {
    meta: ResponseMeta,
    events: mpsc::UnboundedReceiver<Event>,
    stream: bool,
}

async fn prepare_and_submit(
    state: &Arc<ServerState>,
    bytes: Bytes,
    route: Route,
) -> Result<Submitted, ApiError> {
    let job_state = Arc::clone(state);
    let (common, prompt) = state
        .prep
        .run(bytes.len(), move || prepare(&job_state, &bytes, route))
        .await??;
    submit(state, common, prompt, route).await
}

/// On the preparation pool: the body parsed and checked against the limits,
/// then rendered and tokenized.
fn prepare(
    state: &ServerState,
    bytes: &[u8],
    route: Route,
) -> Result<(CommonParams, Vec<u32>), ApiError> {
    let limits = &state.request_limits;
    let (mut common, prompt) = match route {
        Route::Completion => {
            let mut body: CompletionRequest = parse_body(bytes)?;
            body.common.sampling = std::mem::take(&mut body.sampling);
            check_common(state, &body.common)?;
            let prompt = match body.prompt {
                Prompt::Ids(ids) => {
                    limits.check_prompt_ids(ids.len())?;
                    ids
                }
                Prompt::Text(text) => encode(state, &text)?,
                Prompt::Texts(texts) if texts.len() == 1 => encode(state, &texts[0])?,
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
            (body.common, prompt)
        }
        Route::Chat => {
            let mut body: ChatRequest = parse_body(bytes)?;
            body.common.sampling = std::mem::take(&mut body.sampling);
            check_common(state, &body.common)?;
            let rendered = render_chat(state, body.messages)?;
            let prompt = encode(state, &rendered)?;
            (body.common, prompt)
        }
    };
    common.constraint = compile_grammar(state, &common)?;
    Ok((common, prompt))
}

/// The structured-output fields' grammar, compiled (on the preparation
/// pool); an invalid one is a 400 naming its field.
fn compile_grammar(
    state: &ServerState,
    common: &CommonParams,
) -> Result<Option<Constraint>, ApiError> {
    let Some((spec, field)) = common.sampling.grammar()? else {
        return Ok(None);
    };
    let compiler = state
        .grammars
        .get()
        .map_err(|e| ApiError::invalid(e.to_string(), Some(field)))?;
    compiler
        .compile(&spec)
        .map(Some)
        .map_err(|e| ApiError::invalid(format!("{field}: {e}"), Some(field)))
}

/// The limits every route shares, and the model's name.
fn check_common(state: &ServerState, common: &CommonParams) -> Result<(), ApiError> {
    state.request_limits.check_common(common)?;
    if let Some(model) = &common.model
        && !model.is_empty()
        && *model != state.config.model_name
    {
        return Err(ApiError::model_not_found(model));
    }
    Ok(())
}

fn render_chat(state: &ServerState, input: Vec<ChatInput>) -> Result<String, ApiError> {
    if input.is_empty() {
        return Err(ApiError::invalid(
            "`messages` must not be empty",
            Some("messages"),
        ));
    }
    state.request_limits.check_messages(&input)?;
    let template = state.config.chat_template.as_ref().ok_or_else(|| {
        ApiError::invalid("this model has no chat template; use /v1/completions", None)
    })?;
    let mut messages = Vec::with_capacity(input.len());
    for m in input {
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
    template
        .render(&messages, true)
        .map_err(|e| ApiError::invalid(format!("chat template: {e}"), Some("messages")))
}

/// The body as its route's struct; a field the struct does not take is
/// refused by name (see [`super::types::Unsupported`]).
fn parse_body<T: serde::de::DeserializeOwned + RequestBody>(bytes: &[u8]) -> Result<T, ApiError> {
    let body: T = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}"), None))?;
    if let Some(field) = body.unsupported().first_set() {
        return Err(ApiError::unsupported_parameter(
            field,
            "is not supported by this server (see the README's table of supported fields)",
        ));
    }
    Ok(body)
}

/// Text to ids, once its length is known to fit `max_prompt_bytes`.
fn encode(state: &ServerState, text: &str) -> Result<Vec<u32>, ApiError> {
    let tokenizer = state.config.tokenizer.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "this model has no tokenizer; send token ids",
            Some("prompt"),
        )
    })?;
    state.request_limits.check_prompt_bytes(text.len())?;
    tokenizer
        .encode(text, false)
        .map_err(|e| ApiError::invalid(format!("cannot tokenize the prompt: {e}"), Some("prompt")))
}

/// Validates the sampling fields against the prompt and the model's limits.
fn sampling(
    common: &CommonParams,
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
    let temperature = common.temperature.unwrap_or(1.0);
    if temperature > MAX_TEMPERATURE {
        return Err(ApiError::invalid(
            format!("temperature must be in [0, {MAX_TEMPERATURE}], got {temperature}"),
            Some("temperature"),
        ));
    }
    let mut params = SamplingParams {
        temperature,
        top_k,
        top_p: common.top_p.unwrap_or(1.0),
        seed: common.seed,
        max_tokens,
        stop,
        constraint: common.constraint.clone(),
        ..SamplingParams::default()
    };
    common.sampling.apply_to(&mut params)?;
    params
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string(), e.field()))?;
    Ok(params)
}

async fn submit(
    state: &Arc<ServerState>,
    common: CommonParams,
    prompt: Vec<u32>,
    route: Route,
) -> Result<Submitted, ApiError> {
    let params = sampling(
        &common,
        prompt.len(),
        state.config.limits.max_model_len,
        route,
    )?;
    // The guard may have tripped while the prompt was prepared.
    if state.config.guard.tripped() {
        state.counters.rejected();
        return Err(ApiError::memory_guard(RETRY_AFTER_SECONDS));
    }
    let prompt_len = prompt.len();
    let prompt_ids = common.return_token_ids.then(|| prompt.clone());
    let (events_tx, events) = mpsc::unbounded_channel();
    let (reply_tx, reply) = oneshot::channel();
    state
        .config
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
        model: state.config.model_name.clone(),
        route,
        prompt_len,
        prompt_ids,
        include_usage: common.stream_options.is_some_and(|o| o.include_usage),
    };
    Ok(Submitted {
        meta,
        events,
        stream: common.stream,
    })
}

fn admission_error(e: AdmissionError) -> ApiError {
    let param = match &e {
        AdmissionError::Sampling(e) => e.field(),
        _ => Some("prompt"),
    };
    ApiError::invalid(e.to_string(), param)
}

/// The blocking answer: waits for the whole text, then answers once.
async fn collect(
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
                let completion = completion_tokens.max(ids.len());
                return Ok(blocking_answer(
                    meta,
                    text,
                    &ids,
                    reason.as_str(),
                    completion,
                ));
            }
            Event::Failed { message } => {
                return Err(ApiError::internal(message));
            }
        }
    }
    Err(ApiError::internal("the engine dropped the request"))
}

/// The one answer of a blocking request, in its route's shape.
fn blocking_answer(
    meta: ResponseMeta,
    text: String,
    ids: &[u32],
    finish: &'static str,
    completion_tokens: usize,
) -> Response {
    let usage = meta.usage(completion_tokens);
    let ids = meta.token_ids(ids, true);
    match meta.route {
        Route::Completion => Json(CompletionResponse {
            id: meta.id,
            object: "text_completion",
            created: meta.created,
            model: meta.model,
            choices: vec![TextChoice {
                index: 0,
                text,
                logprobs: None,
                finish_reason: Some(finish),
                ids,
            }],
            usage,
        })
        .into_response(),
        Route::Chat => Json(CompletionResponse {
            id: meta.id,
            object: "chat.completion",
            created: meta.created,
            model: meta.model,
            choices: vec![ChatChoice {
                index: 0,
                message: AssistantMessage {
                    role: ASSISTANT,
                    content: text,
                },
                logprobs: None,
                finish_reason: finish,
                ids,
            }],
            usage,
        })
        .into_response(),
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
