//! The axum handlers of the OpenAI routes: parse and validate the body,
//! submit to the engine, then answer at once ([`collect`]) or stream
//! ([`super::stream`]).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use tokio::sync::{mpsc, oneshot};

use super::types::{
    ASSISTANT, AssistantMessage, ChatChoice, ChatContent, ChatRequest, CommonParams,
    CompletionRequest, CompletionResponse, ModelCard, ModelList, OneOrMany, Prompt, TextChoice,
};
use super::{ResponseMeta, Route, stream};
use crate::engine::sampling::SamplingParams;
use crate::engine::{AdmissionError, Event, Request};
use crate::server::ServerState;
use crate::server::engine_loop::{Command, SubmitError};
use crate::server::errors::ApiError;
use crate::text::ChatMessage;

/// Seconds a client is told to wait after a 429 or 503.
const RETRY_AFTER_SECONDS: u64 = 2;

pub async fn models(State(state): State<Arc<ServerState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.model_name.clone(),
            object: "model",
            created: state.started_unix,
            owned_by: "sparkrt",
            max_model_len: state.limits.max_model_len,
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
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body: CompletionRequest = parse_body(body)?;
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
    let body: ChatRequest = parse_body(body)?;
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
    common: CommonParams,
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
        Ok(stream::sse(state, meta, events).into_response())
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

/// The blocking answer: waits for the whole text, then answers once.
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
                state.counters.finished(false);
                return Err(ApiError::internal(message));
            }
        }
    }
    state.counters.finished(false);
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
