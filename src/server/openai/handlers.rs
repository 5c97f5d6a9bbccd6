//! The axum handlers of the OpenAI routes: admit, parse and validate the
//! body, render and tokenize (on [`crate::server::prep`]'s pool), submit to
//! the engine, then answer at once ([`collect`]) or stream
//! ([`super::stream`]).

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use tokio::sync::{mpsc, oneshot};

use super::logprobs::{ChoiceLogprobs, LogprobsAsked};
use super::meta::{ChoiceMeta, ResponseMeta};
use super::outcome::Outcome;
use super::route::Route;
use super::tool_types::{finish_reason, message_parts};
use super::types::{
    ASSISTANT, AssistantMessage, ChatChoice, ChatInput, ChatLogprobParams, ChatRequest,
    CommonParams, CompletionLogprobParams, CompletionRequest, CompletionResponse, ModelCard,
    ModelList, OneOrMany, Prompt, RequestBody, TemplateParams, TextChoice, Usage,
};
use super::{chat_prompt, sizes, stream};
use crate::engine::grammar::{Constraint, GrammarSpec};
use crate::engine::sampling::{MAX_TEMPERATURE, SamplingParams};
use crate::engine::{AdmissionError, Event, EventSink, Request, TokenLogprob};
use crate::server::body;
use crate::server::engine_loop::{Command, Group, SubmitError};
use crate::server::errors::ApiError;
use crate::server::latency::TimedSink;
use crate::server::limits::RequestLimits;
use crate::server::state::ServerState;
use crate::text::GenerationDefaults;
use crate::text::parsers::{OutputParser, ParsedMessage, TokenPiece};

/// Seconds a client is told to wait after a 429 or 503.
pub(super) const RETRY_AFTER_SECONDS: u64 = 2;

pub async fn models(State(state): State<Arc<ServerState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![model_card(&state)],
    })
}

/// `GET /v1/models/{id}`: the served model's card for its name or one of
/// its aliases, or a 404 in OpenAI's shape for any other id.
pub async fn model(
    State(state): State<Arc<ServerState>>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    if id.is_empty() {
        return Err(ApiError::model_not_found(&id));
    }
    check_model(&state, Some(&id))?;
    Ok(Json(model_card(&state)))
}

fn model_card(state: &ServerState) -> ModelCard {
    ModelCard {
        id: state.config.model_name.clone(),
        object: "model",
        created: state.started_unix,
        owned_by: "sparkrt",
        max_model_len: state.config.limits.max_model_len,
    }
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
    // Every request is counted once: refused by its error's status, else by
    // how its answer ends; a client that leaves first is counted cancelled.
    let mut outcome = Outcome::new(Arc::clone(&state));
    let arrived = outcome.arrived;
    let submitted = match async {
        let bytes = body::read(headers, body, state.request_limits.max_body_bytes).await?;
        admit(&state)?;
        prepare_and_submit(&state, bytes, route, arrived).await
    }
    .await
    {
        Ok(s) => s,
        Err(e) => {
            outcome.refused(&e);
            return Err(e);
        }
    };
    if submitted.stream {
        Ok(stream::sse(
            state,
            submitted.meta,
            submitted.events,
            submitted.parsers,
            outcome,
        )
        .into_response())
    } else {
        let answer = collect(
            submitted.meta,
            submitted.events,
            submitted.parsers,
            submitted.fanout,
        )
        .await;
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
        return Err(ApiError::memory_guard(RETRY_AFTER_SECONDS));
    }
    Ok(())
}

/// A request the engine took: its answer's metadata, its choices' events
/// (tagged with the choice's index) and, per choice, the parser its output
/// goes through (chat: reasoning and tool calls; completions: none).
pub(super) struct Submitted {
    pub(super) meta: ResponseMeta,
    pub(super) events: mpsc::UnboundedReceiver<(usize, Event)>,
    pub(super) stream: bool,
    pub(super) parsers: Vec<Option<OutputParser>>,
    pub(super) fanout: Fanout,
}

/// A parsed request, its prompts tokenized.
pub(super) struct Prepared {
    pub(super) common: CommonParams,
    pub(super) prompts: Vec<PreparedPrompt>,
    pub(super) fanout: Fanout,
    pub(super) logprobs: LogprobsAsked,
    pub(super) echo: bool,
    /// The chat route's output parsers, one per choice of its one prompt
    /// (each choice parses its own text); none for completions.
    pub(super) parsers: Vec<OutputParser>,
}

/// How many choices each prompt fans out into (`n`, `best_of`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Fanout {
    /// Choices answered per prompt.
    pub(super) n: usize,
    /// Candidates generated per prompt (at least `n`); when more than `n`,
    /// the `n` with the highest cumulative log-probability are answered.
    pub(super) best_of: usize,
}

impl Fanout {
    pub(super) const ONE: Fanout = Fanout { n: 1, best_of: 1 };

    /// Whether the answer is a pick among more candidates than it returns.
    fn picks(&self) -> bool {
        self.best_of > self.n
    }
}

/// One prompt (its `n` choices): its ids and, to echo, its text.
pub(super) struct PreparedPrompt {
    pub(super) ids: Vec<u32>,
    pub(super) text: Option<String>,
}

impl PreparedPrompt {
    fn from_text(state: &ServerState, text: String) -> Result<PreparedPrompt, ApiError> {
        Ok(PreparedPrompt {
            ids: encode(state, &text)?,
            text: Some(text),
        })
    }

    fn from_ids(state: &ServerState, ids: Vec<u32>) -> Result<PreparedPrompt, ApiError> {
        state.request_limits.check_prompt_ids(ids.len())?;
        Ok(PreparedPrompt { ids, text: None })
    }
}

/// Routes where a request sends events tagged with its choice's index.
struct IndexedSink {
    index: usize,
    events: mpsc::UnboundedSender<(usize, Event)>,
}

impl EventSink for IndexedSink {
    fn send(&mut self, event: Event) -> bool {
        self.events.send((self.index, event)).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.events.is_closed()
    }
}

async fn prepare_and_submit(
    state: &Arc<ServerState>,
    bytes: Bytes,
    route: Route,
    arrived: Instant,
) -> Result<Submitted, ApiError> {
    let job_state = Arc::clone(state);
    let prepared = state
        .prep
        .run(bytes.len(), move || prepare(&job_state, &bytes, route))
        .await??;
    submit(state, prepared, route, arrived).await
}

/// On the preparation pool: the body parsed and checked against the limits,
/// then rendered and tokenized; a chat answer's output parser starts from
/// the rendered prompt (it may open reasoning).
fn prepare(state: &ServerState, bytes: &[u8], route: Route) -> Result<Prepared, ApiError> {
    let limits = &state.request_limits;
    let mut tool_spec = None;
    let mut prepared = match route {
        Route::Completion => {
            let mut body: CompletionRequest = parse_body(bytes)?;
            body.common.sampling = std::mem::take(&mut body.sampling);
            check_common(state, &body.common)?;
            let fanout = fanout(&body.common, route)?;
            let echo = body.logprobs.echo.unwrap_or(false);
            let logprobs = completion_logprobs(limits, &body.logprobs)?;
            let prompts = completion_prompts(state, body.prompt, fanout)?;
            Prepared {
                common: body.common,
                prompts,
                fanout,
                logprobs,
                echo,
                parsers: Vec::new(),
            }
        }
        Route::Chat => {
            let mut body: ChatRequest = parse_body(bytes)?;
            body.common.sampling = std::mem::take(&mut body.sampling);
            check_common(state, &body.common)?;
            let fanout = fanout(&body.common, route)?;
            let logprobs = chat_logprobs(limits, &body.logprobs)?;
            let prepared = prepare_chat(state, body.messages, body.template)?;
            tool_spec = forced_tool_grammar(state, &prepared)?;
            let (ids, parsers) = render_chat_choices(state, &prepared, fanout.best_of)?;
            let prompt = PreparedPrompt { ids, text: None };
            body.common.end_after = first_call_end(&parsers);
            Prepared {
                common: body.common,
                prompts: vec![prompt],
                fanout,
                logprobs,
                echo: false,
                parsers,
            }
        }
    };
    prepared.common.constraint = compile_grammar(state, &prepared.common, tool_spec)?;
    Ok(prepared)
}

/// Where the answer ends under `parallel_tool_calls: false` (its parsers
/// keep the first call only): right after that call's closing marker, so
/// no tokens are spent on calls that would be dropped. Formats whose calls
/// end generation anyway (harmony's `<|call|>`) need none.
pub(super) fn first_call_end(parsers: &[OutputParser]) -> Vec<String> {
    parsers
        .first()
        .and_then(OutputParser::first_call_end)
        .map(str::to_string)
        .into_iter()
        .collect()
}

/// The grammar of `tool_choice` `required` or a named function, if asked.
pub(super) fn forced_tool_grammar(
    state: &ServerState,
    prepared: &chat_prompt::PreparedChat,
) -> Result<Option<GrammarSpec>, ApiError> {
    prepared
        .forced
        .as_ref()
        .map(|forced| super::tool_grammar::grammar(&state.config.output_parsers, forced))
        .transpose()
}

/// The structured-output fields' grammar, or the forced tool calls', compiled
/// (on the preparation pool); an invalid one is a 400 naming its field.
pub(super) fn compile_grammar(
    state: &ServerState,
    common: &CommonParams,
    tool_spec: Option<GrammarSpec>,
) -> Result<Option<Constraint>, ApiError> {
    let sampled = common.sampling.grammar()?;
    let (spec, field) = match (sampled, tool_spec) {
        (None, None) => return Ok(None),
        (Some(found), None) => found,
        (None, Some(spec)) => (spec, "tool_choice"),
        (Some((_, field)), Some(_)) => {
            return Err(ApiError::invalid(
                format!(
                    "{field} and tool_choice \"required\" (or a named function, or a \
                     function with `strict: true`) cannot both constrain the answer"
                ),
                Some(field),
            ));
        }
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

/// `n` and `best_of`: 1 ≤ n ≤ best_of ≤ `max_n` (the upper bounds are
/// [`RequestLimits::check_common`]'s), `best_of` on completions only (as in
/// OpenAI's API) and not streamed (a pick needs every candidate finished).
fn fanout(common: &CommonParams, route: Route) -> Result<Fanout, ApiError> {
    let n = match common.n {
        None => 1,
        Some(0) => return Err(ApiError::invalid("`n` must be at least 1", Some("n"))),
        Some(n) => n as usize,
    };
    let best_of = match common.sampling.best_of {
        None => n,
        Some(_) if route == Route::Chat => {
            return Err(ApiError::unsupported_parameter(
                "best_of",
                "is a /v1/completions field (the chat API has none; use n)",
            ));
        }
        Some(b) if b > 1 && common.stream => {
            return Err(ApiError::invalid(
                "best_of is not supported with stream",
                Some("best_of"),
            ));
        }
        Some(b) => match usize::try_from(b) {
            Ok(b) if b >= n => b,
            _ => {
                return Err(ApiError::invalid(
                    format!("`best_of` must be at least `n` ({n}), got {b}"),
                    Some("best_of"),
                ));
            }
        },
    };
    Ok(Fanout { n, best_of })
}

/// How many prompts a completions `prompt` holds.
fn prompt_count(prompt: &Prompt) -> usize {
    match prompt {
        Prompt::Text(_) | Prompt::Ids(_) => 1,
        Prompt::Texts(v) => v.len(),
        Prompt::IdLists(v) => v.len(),
    }
}

/// A completions `prompt`, one or a batch, each tokenized; the batch's
/// count, its choices (`fanout` per prompt) and its tokens together are
/// bounded before (and as) they are made.
fn completion_prompts(
    state: &ServerState,
    prompt: Prompt,
    fanout: Fanout,
) -> Result<Vec<PreparedPrompt>, ApiError> {
    let limits = &state.request_limits;
    let count = prompt_count(&prompt);
    if count == 0 {
        return Err(ApiError::invalid(
            "`prompt` must not be empty",
            Some("prompt"),
        ));
    }
    limits.check_prompt_count(count)?;
    limits.check_choices(count, fanout.best_of)?;
    let mut prompts = Vec::with_capacity(count);
    let mut total = 0usize;
    let mut add = |p: PreparedPrompt| -> Result<(), ApiError> {
        total = total.saturating_add(p.ids.len());
        limits.check_batch_tokens(total)?;
        prompts.push(p);
        Ok(())
    };
    match prompt {
        Prompt::Text(text) => add(PreparedPrompt::from_text(state, text)?)?,
        Prompt::Ids(ids) => add(PreparedPrompt::from_ids(state, ids)?)?,
        Prompt::Texts(texts) => {
            for text in texts {
                add(PreparedPrompt::from_text(state, text)?)?;
            }
        }
        Prompt::IdLists(lists) => {
            for ids in lists {
                add(PreparedPrompt::from_ids(state, ids)?)?;
            }
        }
    }
    Ok(prompts)
}

/// Completions' `logprobs` (with `echo`, the prompt's too) and vLLM's
/// `prompt_logprobs`.
fn completion_logprobs(
    limits: &RequestLimits,
    params: &CompletionLogprobParams,
) -> Result<LogprobsAsked, ApiError> {
    let sampled = params
        .logprobs
        .map(|n| limits.check_top_logprobs("logprobs", n))
        .transpose()?;
    let prompt = params
        .prompt_logprobs
        .map(|n| limits.check_top_logprobs("prompt_logprobs", n))
        .transpose()?;
    Ok(LogprobsAsked {
        sampled,
        echo: sampled.filter(|_| params.echo == Some(true)),
        prompt,
    })
}

/// Chat's `logprobs` and `top_logprobs` (which needs `logprobs`).
fn chat_logprobs(
    limits: &RequestLimits,
    params: &ChatLogprobParams,
) -> Result<LogprobsAsked, ApiError> {
    let top = params
        .top_logprobs
        .map(|n| limits.check_top_logprobs("top_logprobs", n))
        .transpose()?;
    let wanted = params.logprobs == Some(true);
    if top.is_some() && !wanted {
        return Err(ApiError::invalid(
            "`top_logprobs` needs `logprobs: true`",
            Some("top_logprobs"),
        ));
    }
    Ok(LogprobsAsked {
        sampled: wanted.then(|| top.unwrap_or(0)),
        ..LogprobsAsked::default()
    })
}

/// The limits every route shares, and the model's name.
pub(super) fn check_model(state: &ServerState, model: Option<&str>) -> Result<(), ApiError> {
    if let Some(model) = model
        && !model.is_empty()
        && model != state.config.model_name
        && !state
            .config
            .model_aliases
            .iter()
            .any(|alias| alias == model)
    {
        return Err(ApiError::model_not_found(model));
    }
    Ok(())
}

pub(super) fn check_common(state: &ServerState, common: &CommonParams) -> Result<(), ApiError> {
    state.request_limits.check_common(&sizes::common(common))?;
    if let Some(user) = &common.user {
        tracing::debug!(user = %user, "the request's `user` (accepted, not used)");
    }
    check_model(state, common.model.as_deref())
}

/// A chat's messages and template fields checked against the limits and
/// converted for the template.
fn prepare_chat(
    state: &ServerState,
    messages: Vec<ChatInput>,
    params: TemplateParams,
) -> Result<chat_prompt::PreparedChat, ApiError> {
    let limits = &state.request_limits;
    limits.check_messages(&sizes::messages(&messages))?;
    limits.check_template_arguments(&sizes::template(&params))?;
    chat_prompt::prepare(messages, params)
}

/// A prepared chat rendered by the chat template and tokenized, and the
/// parser its answer goes through (it may start inside reasoning; it looks
/// for tool calls only when tools were offered).
pub(super) fn render_chat(
    state: &ServerState,
    prepared: &chat_prompt::PreparedChat,
) -> Result<(Vec<u32>, OutputParser), ApiError> {
    let (prompt, mut parsers) = render_chat_choices(state, prepared, 1)?;
    Ok((prompt, parsers.pop().unwrap_or_else(OutputParser::off)))
}

/// As [`render_chat`], with one parser for each of `choices` answers.
fn render_chat_choices(
    state: &ServerState,
    prepared: &chat_prompt::PreparedChat,
    choices: usize,
) -> Result<(Vec<u32>, Vec<OutputParser>), ApiError> {
    let rendered = render_text(state, prepared)?;
    let prompt = encode(state, &rendered)?;
    let tools = prepared
        .prompt
        .tools
        .as_deref()
        .filter(|_| prepared.tools_offered);
    let parsers = &state.config.output_parsers;
    let started = (0..choices)
        .map(|_| {
            let parser = parsers.start(&rendered, tools);
            if prepared.first_call_only {
                parser.first_call_only()
            } else {
                parser
            }
        })
        .collect();
    Ok((prompt, started))
}

/// `/v1/responses` answers one choice: `n` other than 1 is refused there.
pub(super) fn refuse_n(common: &CommonParams) -> Result<(), ApiError> {
    if common.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid(
            "only n = 1 is supported on /v1/responses",
            Some("n"),
        ));
    }
    Ok(())
}

/// Plain messages rendered by the chat template (`/tokenize`).
pub(super) fn render_messages(
    state: &ServerState,
    messages: Vec<ChatInput>,
    add_generation_prompt: bool,
) -> Result<String, ApiError> {
    let params = TemplateParams {
        add_generation_prompt: Some(add_generation_prompt),
        ..TemplateParams::default()
    };
    render_text(state, &prepare_chat(state, messages, params)?)
}

fn render_text(
    state: &ServerState,
    prepared: &chat_prompt::PreparedChat,
) -> Result<String, ApiError> {
    let template = state.config.chat_template.as_ref().ok_or_else(|| {
        ApiError::invalid("this model has no chat template; use /v1/completions", None)
    })?;
    template
        .render_prompt(&prepared.prompt)
        .map_err(chat_prompt::render_error)
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
    body.refuse_nested()?;
    Ok(body)
}

/// Text to ids, once its length is known to fit `max_prompt_bytes`.
pub(super) fn encode(state: &ServerState, text: &str) -> Result<Vec<u32>, ApiError> {
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

/// Checks `defaults` as a request that sets no field would meet them, so a
/// generation_config.json out of range stops the start instead of failing
/// every request.
pub fn check_generation_defaults(defaults: &GenerationDefaults) -> Result<(), ApiError> {
    let request: CompletionRequest = serde_json::from_value(serde_json::json!({"prompt": ""}))
        .map_err(|e| ApiError::invalid(e.to_string(), None))?;
    sampling(&request.common, 0, usize::MAX, Route::Completion, defaults).map(drop)
}

/// Validates the sampling fields against the prompt and the model's limits.
/// A field the request leaves unset takes `defaults`' value (the
/// checkpoint's generation_config.json), else OpenAI's neutral one.
fn sampling(
    common: &CommonParams,
    prompt_len: usize,
    max_model_len: usize,
    route: Route,
    defaults: &GenerationDefaults,
) -> Result<SamplingParams, ApiError> {
    if let Some(model) = &common.model
        && model.is_empty()
    {
        return Err(ApiError::invalid(
            "`model` must not be empty",
            Some("model"),
        ));
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
        None => match defaults.max_new_tokens {
            Some(n) => n.min(room),
            None if route == Route::Completion => 16.min(room),
            None => room,
        },
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
        None => defaults.top_k,
        Some(-1) | Some(0) => None,
        Some(k) if k > 0 => Some(k as usize),
        Some(_) => return Err(ApiError::invalid("`top_k` must be positive", Some("top_k"))),
    };
    let stop = match &common.stop {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
    };
    let temperature = common.temperature.or(defaults.temperature).unwrap_or(1.0);
    if temperature > MAX_TEMPERATURE {
        return Err(ApiError::invalid(
            format!("temperature must be in [0, {MAX_TEMPERATURE}], got {temperature}"),
            Some("temperature"),
        ));
    }
    let mut params = SamplingParams {
        temperature,
        top_k,
        top_p: common.top_p.or(defaults.top_p).unwrap_or(1.0),
        seed: common.seed,
        max_tokens,
        stop,
        end_after: common.end_after.clone(),
        constraint: common.constraint.clone(),
        ..SamplingParams::default()
    };
    common.sampling.apply_to(&mut params, defaults)?;
    params
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string(), e.field()))?;
    Ok(params)
}

pub(super) async fn submit(
    state: &Arc<ServerState>,
    prepared: Prepared,
    route: Route,
    arrived: Instant,
) -> Result<Submitted, ApiError> {
    let Prepared {
        common,
        prompts,
        fanout,
        logprobs,
        echo,
        parsers,
    } = prepared;
    let max_model_len = state.config.limits.max_model_len;
    let params = prompts
        .iter()
        .map(|p| {
            sampling(
                &common,
                p.ids.len(),
                max_model_len,
                route,
                &state.config.generation_defaults,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut params = params;
    if let Some(seeds) = &state.config.default_seed {
        for p in params.iter_mut().filter(|p| p.seed.is_none()) {
            p.seed = Some(seeds.next());
        }
    }
    // The guard may have tripped while the prompt was prepared.
    if state.config.guard.tripped() {
        return Err(ApiError::memory_guard(RETRY_AFTER_SECONDS));
    }
    let mut engine_logprobs = logprobs.engine();
    if fanout.picks() {
        // The pick needs every sampled token's log-probability; the answer
        // shows them only where the client asked (`logprobs`).
        engine_logprobs.sampled = engine_logprobs.sampled.or(Some(0));
    }
    let tokenizer = state.config.tokenizer.clone();
    let (events_tx, events) = mpsc::unbounded_channel();
    let mut choices = Vec::with_capacity(prompts.len() * fanout.best_of);
    // Each prompt is one group of its `best_of` choices, and the request's
    // groups are one submission: all admitted or none.
    let mut groups = Vec::with_capacity(prompts.len());
    for (prompt_index, (prompt, params)) in prompts.into_iter().zip(params).enumerate() {
        let echo_text = echo.then(|| match (prompt.text, &tokenizer) {
            (Some(text), _) => text,
            (None, Some(t)) => t.decode(&prompt.ids, false).unwrap_or_default(),
            (None, None) => String::new(),
        });
        let prompt_ids: Arc<[u32]> = prompt.ids.as_slice().into();
        let first = prompt_index * fanout.best_of;
        let sinks = (first..first + fanout.best_of)
            .map(|index| {
                choices.push(ChoiceMeta {
                    prompt: prompt_index,
                    prompt_ids: Arc::clone(&prompt_ids),
                    echo: echo_text.clone(),
                });
                Box::new(
                    TimedSink::new(
                        IndexedSink {
                            index,
                            events: events_tx.clone(),
                        },
                        Arc::clone(&state.latency),
                        arrived,
                    )
                    .with_max_tokens(params.max_tokens),
                ) as Box<dyn EventSink>
            })
            .collect();
        groups.push(Group {
            request: Request::new(prompt.ids, params)
                .with_ignore_eos(common.ignore_eos)
                .with_logprobs(engine_logprobs)
                .with_skip_special_tokens(common.skip_special_tokens.unwrap_or(true))
                .with_cache_salt(common.cache_salt.clone()),
            sinks,
        });
    }
    let (reply_tx, reply) = oneshot::channel();
    state
        .config
        .engine
        .commands
        .send(Command::Submit {
            groups,
            reply: reply_tx,
        })
        .map_err(|_| ApiError::internal("the engine has stopped"))?;
    match reply.await {
        Ok(Ok(_)) => {}
        Ok(Err(SubmitError::QueueFull)) => {
            return Err(ApiError::queue_full(RETRY_AFTER_SECONDS));
        }
        Ok(Err(SubmitError::Admission(e))) => return Err(admission_error(e)),
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
        choices,
        return_token_ids: common.return_token_ids,
        logprobs,
        tokenizer,
        include_usage: common.usage_asked().0,
        continuous_usage: common.usage_asked().1,
    };
    Ok(Submitted {
        meta,
        events,
        stream: common.stream,
        parsers: parsers.into_iter().map(Some).collect(),
        fanout,
    })
}

fn admission_error(e: AdmissionError) -> ApiError {
    let param = match &e {
        AdmissionError::Sampling(e) => e.field(),
        _ => Some("prompt"),
    };
    ApiError::invalid(e.to_string(), param)
}

/// One choice of a blocking answer, as its events arrive.
struct BlockingChoice {
    text: String,
    ids: Vec<u32>,
    logprobs: ChoiceLogprobs,
    /// The chat route's output parser and what it made of the text so far.
    parser: Option<OutputParser>,
    message: ParsedMessage,
    finish: Option<&'static str>,
    completion_tokens: usize,
    /// The sum of its sampled tokens' log-probabilities (`best_of` picks by
    /// it; 0 when the engine was not asked for them).
    cumulative_logprob: f64,
}

impl BlockingChoice {
    fn on_logprob(&mut self, t: &TokenLogprob) {
        self.cumulative_logprob += f64::from(t.logprob);
        self.logprobs.on_token(t);
    }
}

/// The blocking answer: waits for every choice's whole text, then answers
/// once. A chat text goes through the same parser as a stream's, so the
/// message is the concatenation of what the stream would have sent.
async fn collect(
    meta: ResponseMeta,
    mut events: mpsc::UnboundedReceiver<(usize, Event)>,
    mut parsers: Vec<Option<OutputParser>>,
    fanout: Fanout,
) -> Result<Response, ApiError> {
    let mut usage = meta.usage_tally();
    let mut choices: Vec<BlockingChoice> = (0..meta.choices.len())
        .map(|index| BlockingChoice {
            text: meta.choices[index].echo.clone().unwrap_or_default(),
            ids: Vec::new(),
            logprobs: meta.choice_logprobs(index),
            parser: parsers.get_mut(index).and_then(Option::take),
            message: ParsedMessage::default(),
            finish: None,
            completion_tokens: 0,
            cumulative_logprob: 0.0,
        })
        .collect();
    let mut open = choices.len();
    while open > 0 {
        let Some((index, event)) = events.recv().await else {
            return Err(ApiError::internal("the engine dropped the request"));
        };
        let Some(choice) = choices.get_mut(index) else {
            continue;
        };
        match event {
            Event::Token {
                id,
                text: piece,
                logprob,
                hidden,
            } => {
                choice.ids.push(id);
                if let Some(parser) = choice.parser.as_mut() {
                    choice.message.apply_all(parser.push(TokenPiece {
                        id,
                        text: &piece,
                        hidden: hidden.as_deref(),
                    }));
                }
                choice.text.push_str(&piece);
                if let Some(t) = &logprob {
                    choice.on_logprob(t);
                }
            }
            Event::PromptLogprob { logprob, .. } => choice.logprobs.on_prompt(&logprob),
            Event::PromptLogits { .. } => {}
            Event::Finished {
                reason,
                text: rest,
                stop_logprob,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            } => {
                choice.text.push_str(&rest);
                if let Some(parser) = choice.parser.as_mut() {
                    choice.message.apply_all(parser.push_text(&rest));
                    choice.message.apply_all(parser.finish());
                }
                if let Some(t) = &stop_logprob {
                    choice.on_logprob(t);
                }
                choice.completion_tokens = completion_tokens.max(choice.ids.len());
                if choice.finish.replace(reason.as_str()).is_none() {
                    open -= 1;
                    let prompt = meta.choices[index].prompt;
                    usage.finished(
                        prompt,
                        prompt_tokens,
                        cached_tokens,
                        choice.completion_tokens,
                    );
                }
            }
            Event::Failed { message } => {
                return Err(ApiError::internal(message));
            }
        }
    }
    let cumulative: Vec<f64> = choices.iter().map(|c| c.cumulative_logprob).collect();
    let mut candidates: Vec<Option<BlockingChoice>> = choices.into_iter().map(Some).collect();
    let answered = answered_candidates(&cumulative, fanout)
        .into_iter()
        .filter_map(|c| Some((c, candidates.get_mut(c)?.take()?)))
        .collect();
    Ok(blocking_answer(meta, answered, usage.usage()))
}

/// Which candidates are answered, in the answer's order: all of them when
/// each prompt generated `n`; else, prompt by prompt, the `n` of its
/// `best_of` with the highest cumulative log-probability, best first (the
/// earlier candidate on a tie). Choice `i` of the answer has index `i`, so
/// prompt p's choices are `p * n ..`.
fn answered_candidates(cumulative: &[f64], fanout: Fanout) -> Vec<usize> {
    let all: Vec<usize> = (0..cumulative.len()).collect();
    if !fanout.picks() {
        return all;
    }
    all.chunks(fanout.best_of)
        .flat_map(|group| {
            let mut ranked = group.to_vec();
            ranked.sort_by(|&a, &b| cumulative[b].total_cmp(&cumulative[a]).then(a.cmp(&b)));
            ranked.truncate(fanout.n);
            ranked
        })
        .collect()
}

/// The one answer of a blocking request, in its route's shape: `choices`
/// are (candidate index, its choice) in the answer's order.
fn blocking_answer(
    meta: ResponseMeta,
    choices: Vec<(usize, BlockingChoice)>,
    usage: Usage,
) -> Response {
    match meta.route {
        Route::Completion => {
            let choices = choices
                .into_iter()
                .enumerate()
                .map(|(index, (candidate, mut c))| TextChoice {
                    index: index as u32,
                    logprobs: c.logprobs.take(),
                    prompt_logprobs: c.logprobs.take_prompt(),
                    ids: meta.token_ids(candidate, &c.ids, true),
                    text: c.text,
                    finish_reason: c.finish,
                })
                .collect();
            Json(CompletionResponse {
                id: meta.id,
                object: "text_completion",
                created: meta.created,
                model: meta.model,
                choices,
                usage,
            })
            .into_response()
        }
        Route::Chat => {
            let choices = choices
                .into_iter()
                .enumerate()
                .map(|(index, (candidate, mut c))| {
                    let (content, reasoning, tool_calls) = match c.parser {
                        Some(_) => message_parts(c.message),
                        None => (Some(c.text), None, Vec::new()),
                    };
                    let finish = finish_reason(c.finish.unwrap_or("stop"), !tool_calls.is_empty());
                    ChatChoice {
                        index: index as u32,
                        logprobs: c.logprobs.take(),
                        ids: meta.token_ids(candidate, &c.ids, true),
                        message: AssistantMessage {
                            role: ASSISTANT,
                            content,
                            reasoning_content: reasoning.clone(),
                            reasoning,
                            tool_calls,
                        },
                        finish_reason: finish,
                    }
                })
                .collect();
            Json(CompletionResponse {
                id: meta.id,
                object: "chat.completion",
                created: meta.created,
                model: meta.model,
                choices,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_of_answers_the_top_n_of_each_prompt_best_first() {
        let pick = Fanout { n: 2, best_of: 3 };
        // Two prompts of three candidates; a tie goes to the earlier one.
        let cumulative = [-3.0, -1.0, -2.0, -0.5, -0.5, -9.0];
        assert_eq!(answered_candidates(&cumulative, pick), [1, 2, 3, 4]);
        let top1 = Fanout { n: 1, best_of: 3 };
        assert_eq!(answered_candidates(&cumulative, top1), [1, 3]);
        // Without a pick every candidate is answered, in order.
        let all = Fanout { n: 3, best_of: 3 };
        assert_eq!(answered_candidates(&cumulative, all), [0, 1, 2, 3, 4, 5]);
    }
}

#[cfg(test)]
mod generation_defaults_tests {
    use super::*;
    use serde_json::json;

    /// The engine's parameters for a completion body under `defaults`, a
    /// 10-token prompt and a 100-token context.
    fn params(body: serde_json::Value, defaults: &GenerationDefaults) -> SamplingParams {
        let mut request: CompletionRequest = serde_json::from_value(body).unwrap();
        request.common.sampling = std::mem::take(&mut request.sampling);
        sampling(&request.common, 10, 100, Route::Completion, defaults).unwrap()
    }

    fn checkpoint() -> GenerationDefaults {
        GenerationDefaults {
            temperature: Some(0.6),
            top_p: Some(0.95),
            top_k: Some(20),
            min_p: Some(0.05),
            repetition_penalty: Some(1.1),
            presence_penalty: Some(0.5),
            frequency_penalty: Some(0.25),
            max_new_tokens: Some(40),
        }
    }

    #[test]
    fn unset_fields_take_the_checkpoints_defaults() {
        let p = params(json!({"prompt": "p"}), &checkpoint());
        assert_eq!(p.temperature, 0.6);
        assert_eq!(p.top_p, 0.95);
        assert_eq!(p.top_k, Some(20));
        assert_eq!(p.min_p, 0.05);
        assert_eq!(p.repetition_penalty, 1.1);
        assert_eq!(p.presence_penalty, 0.5);
        assert_eq!(p.frequency_penalty, 0.25);
        assert_eq!(p.max_tokens, 40);
    }

    #[test]
    fn fields_the_request_gives_win_even_the_neutral_values() {
        let p = params(
            json!({"prompt": "p", "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                   "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                   "frequency_penalty": 0.0, "max_tokens": 7}),
            &checkpoint(),
        );
        let neutral = SamplingParams {
            max_tokens: 7,
            ..SamplingParams::default()
        };
        assert_eq!(p, neutral);
    }

    #[test]
    fn no_defaults_are_openais_and_max_new_tokens_is_capped_by_the_room() {
        let p = params(json!({"prompt": "p"}), &GenerationDefaults::default());
        assert_eq!(p, SamplingParams::default());
        let long = GenerationDefaults {
            max_new_tokens: Some(5000),
            ..GenerationDefaults::default()
        };
        // 100 positions less the 10-token prompt.
        assert_eq!(params(json!({"prompt": "p"}), &long).max_tokens, 90);
    }
}
