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
use super::tool_types::{finish_reason, message_parts};
use super::types::{
    ASSISTANT, AssistantMessage, ChatChoice, ChatInput, ChatRequest, CommonParams,
    CompletionRequest, CompletionResponse, ModelCard, ModelList, OneOrMany, Prompt, RequestBody,
    TemplateParams, TextChoice,
};
use super::{ResponseMeta, Route, chat_prompt, stream};
use crate::engine::sampling::SamplingParams;
use crate::engine::{AdmissionError, Event, Request};
use crate::server::engine_loop::{Command, SubmitError};
use crate::server::errors::ApiError;
use crate::server::{ServerState, body};
use crate::text::parsers::{OutputParser, ParsedMessage, TokenPiece};

/// Seconds a client is told to wait after a 429 or 503.
pub(super) const RETRY_AFTER_SECONDS: u64 = 2;

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
        Ok(stream::sse(
            state,
            submitted.meta,
            submitted.events,
            submitted.parser,
            outcome,
        )
        .into_response())
    } else {
        let answer = collect(submitted.meta, submitted.events, submitted.parser).await;
        outcome.finished(answer.is_ok());
        answer
    }
}

/// 503 without looking at the request while the engine thread is gone or
/// the memory guard is tripped.
pub(super) fn admit(state: &ServerState) -> Result<(), ApiError> {
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

/// A request the engine took: its answer's metadata, its events and the
/// parser its output goes through.
pub(super) struct Submitted {
    pub(super) meta: ResponseMeta,
    pub(super) events: mpsc::UnboundedReceiver<Event>,
    pub(super) stream: bool,
    pub(super) parser: OutputParser,
}

async fn prepare_and_submit(
    state: &Arc<ServerState>,
    bytes: Bytes,
    route: Route,
) -> Result<Submitted, ApiError> {
    let job_state = Arc::clone(state);
    let (common, prompt, parser) = state
        .prep
        .run(bytes.len(), move || prepare(&job_state, &bytes, route))
        .await??;
    submit(state, common, prompt, parser, route).await
}

/// On the preparation pool: the body parsed and checked against the limits,
/// then rendered and tokenized; a chat answer's output parser starts from
/// the rendered prompt (it may open reasoning).
fn prepare(
    state: &ServerState,
    bytes: &[u8],
    route: Route,
) -> Result<(CommonParams, Vec<u32>, OutputParser), ApiError> {
    let limits = &state.request_limits;
    match route {
        Route::Completion => {
            let body: CompletionRequest = parse_body(bytes)?;
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
            Ok((body.common, prompt, OutputParser::off()))
        }
        Route::Chat => {
            let body: ChatRequest = parse_body(bytes)?;
            check_common(state, &body.common)?;
            let prepared = prepare_chat(state, body.messages, body.template)?;
            let (prompt, parser) = render_chat(state, &prepared)?;
            Ok((body.common, prompt, parser))
        }
    }
}

/// The limits every route shares, and the model's name.
pub(super) fn check_common(state: &ServerState, common: &CommonParams) -> Result<(), ApiError> {
    state.request_limits.check_common(common)?;
    if let Some(model) = &common.model
        && !model.is_empty()
        && *model != state.config.model_name
    {
        return Err(ApiError::model_not_found(model));
    }
    Ok(())
}

/// The chat template's text for a chat request (its sizes checked first).
fn prepare_chat(
    state: &ServerState,
    messages: Vec<ChatInput>,
    params: TemplateParams,
) -> Result<chat_prompt::PreparedChat, ApiError> {
    state.request_limits.check_messages(&messages)?;
    state.request_limits.check_template_params(&params)?;
    chat_prompt::prepare(messages, params)
}

/// A prepared chat rendered by the chat template and tokenized, and the
/// parser its answer goes through (it may start inside reasoning; it looks
/// for tool calls only when tools were offered).
pub(super) fn render_chat(
    state: &ServerState,
    prepared: &chat_prompt::PreparedChat,
) -> Result<(Vec<u32>, OutputParser), ApiError> {
    let template = state.config.chat_template.as_ref().ok_or_else(|| {
        ApiError::invalid("this model has no chat template; use /v1/completions", None)
    })?;
    let rendered = template
        .render_prompt(&prepared.prompt)
        .map_err(chat_prompt::render_error)?;
    let prompt = encode(state, &rendered)?;
    let parsers = chat_prompt::output_parsers(&state.config.output_parsers, prepared.tools_offered);
    Ok((prompt, parsers.start(&rendered)))
}

/// The body as its route's struct; a field the struct does not take is
/// refused by name (see [`super::types::Unsupported`]).
pub(super) fn parse_body<T: serde::de::DeserializeOwned + RequestBody>(
    bytes: &[u8],
) -> Result<T, ApiError> {
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

pub(super) async fn submit(
    state: &Arc<ServerState>,
    common: CommonParams,
    prompt: Vec<u32>,
    parser: OutputParser,
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
                skip_special_tokens: common.skip_special_tokens.unwrap_or(true),
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
        parser,
    })
}

fn admission_error(e: AdmissionError) -> ApiError {
    let param = match e {
        AdmissionError::Sampling(_) => None,
        _ => Some("prompt"),
    };
    ApiError::invalid(e.to_string(), param)
}

/// The blocking answer: waits for the whole text, then answers once. The
/// text goes through the same parser as a stream's, so the message is the
/// concatenation of what the stream would have sent.
async fn collect(
    meta: ResponseMeta,
    mut events: mpsc::UnboundedReceiver<Event>,
    mut parser: OutputParser,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut message = ParsedMessage::default();
    let mut ids = Vec::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Token {
                id,
                text: piece,
                hidden,
                ..
            } => {
                ids.push(id);
                message.apply_all(parser.push(TokenPiece {
                    id,
                    text: &piece,
                    hidden: hidden.as_deref(),
                }));
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
                message.apply_all(parser.push_text(&rest));
                message.apply_all(parser.finish());
                let completion = completion_tokens.max(ids.len());
                let output = match meta.route {
                    Route::Completion => Output::Text(text),
                    Route::Chat => Output::Message(message),
                };
                return Ok(blocking_answer(
                    meta,
                    output,
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

/// What a blocking answer carries: the text of a completion, the parsed
/// message of a chat answer.
enum Output {
    Text(String),
    Message(ParsedMessage),
}

/// The one answer of a blocking request, in its route's shape.
fn blocking_answer(
    meta: ResponseMeta,
    output: Output,
    ids: &[u32],
    finish: &'static str,
    completion_tokens: usize,
) -> Response {
    let usage = meta.usage(completion_tokens);
    let ids = meta.token_ids(ids, true);
    match output {
        Output::Text(text) => Json(CompletionResponse {
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
        Output::Message(message) => {
            let (content, reasoning, tool_calls) = message_parts(message);
            let finish = finish_reason(finish, !tool_calls.is_empty());
            Json(CompletionResponse {
                id: meta.id,
                object: "chat.completion",
                created: meta.created,
                model: meta.model,
                choices: vec![ChatChoice {
                    index: 0,
                    message: AssistantMessage {
                        role: ASSISTANT,
                        content,
                        reasoning_content: reasoning.clone(),
                        reasoning,
                        tool_calls,
                    },
                    logprobs: None,
                    finish_reason: finish,
                    ids,
                }],
                usage,
            })
            .into_response()
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
