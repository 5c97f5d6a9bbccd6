//! The `/v1/responses` route: the same admission, preparation pool, engine
//! submission and output parsers as the chat route, answered as one
//! response object or as a stream of Responses events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::input::{self, Echo};
use super::output::OutputBuilder;
use super::types::{
    IncompleteDetails, InputTokensDetails, NumberedEvent, OutputItem, OutputTokensDetails,
    ReasoningEcho, ResponseEvent, ResponseObject, ResponseUsage, ResponsesRequest, StreamEvent,
    TextFormat, TextFormatEcho,
};
use crate::engine::Event;
use crate::server::body;
use crate::server::errors::ApiError;
use crate::server::openai::handlers::{self, Fanout, Prepared, PreparedPrompt, Submitted};
use crate::server::openai::logprobs::LogprobsAsked;
use crate::server::openai::meta::ResponseMeta;
use crate::server::openai::outcome::Outcome;
use crate::server::openai::route::Route;
use crate::server::state::ServerState;
use crate::text::parsers::{OutputParser, TokenPiece};

/// Seconds between keep-alive comments while the engine is silent.
const KEEP_ALIVE_SECONDS: u64 = 10;

pub async fn responses(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // Counted once, as the other generation routes are (see `Outcome`).
    let mut outcome = Outcome::new(Arc::clone(&state));
    let arrived = outcome.arrived;
    let (submitted, echo) = match async {
        let bytes = body::read(&headers, body, state.request_limits.max_body_bytes).await?;
        handlers::admit(&state)?;
        prepare_and_submit(&state, bytes, arrived).await
    }
    .await
    {
        Ok(s) => s,
        Err(e) => {
            outcome.refused(&e);
            return Err(e);
        }
    };
    let answer = Answer {
        id: format!("resp_{}", state.next_request_id()),
        echo,
    };
    if submitted.stream {
        Ok(stream(answer, submitted, outcome).into_response())
    } else {
        let result = collect(answer, submitted).await;
        outcome.finished(result.is_ok());
        result.map(|object| Json(object).into_response())
    }
}

async fn prepare_and_submit(
    state: &Arc<ServerState>,
    bytes: Bytes,
    arrived: Instant,
) -> Result<(Submitted, Echo), ApiError> {
    let job_state = Arc::clone(state);
    let (prepared, echo) = state
        .prep
        .run(bytes.len(), move || {
            let request: ResponsesRequest = handlers::parse_body(&bytes)?;
            handlers::check_common(&job_state, &request.common)?;
            handlers::refuse_n(&request.common)?;
            let (common, chat, echo) = input::prepare(request, &job_state.request_limits)?;
            let tool_spec = handlers::forced_tool_grammar(&job_state, &chat)?;
            let (ids, parser) = handlers::render_chat(&job_state, &chat)?;
            let mut common = common;
            common.end_after = handlers::first_call_end(std::slice::from_ref(&parser));
            common.constraint = handlers::compile_grammar(&job_state, &common, tool_spec)?;
            let prepared = Prepared {
                common,
                prompts: vec![PreparedPrompt { ids, text: None }],
                fanout: Fanout::ONE,
                logprobs: LogprobsAsked::default(),
                echo: false,
                parsers: vec![parser],
            };
            Ok::<_, ApiError>((prepared, echo))
        })
        .await??;
    let submitted = handlers::submit(state, prepared, Route::Chat, arrived).await?;
    Ok((submitted, echo))
}

/// What every form of the answer repeats.
struct Answer {
    id: String,
    echo: Echo,
}

impl Answer {
    fn object(
        &self,
        meta: &ResponseMeta,
        status: &'static str,
        output: Vec<OutputItem>,
        usage: Option<ResponseUsage>,
    ) -> ResponseObject {
        let echo = &self.echo;
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: meta.created,
            status,
            incomplete_details: (status == "incomplete").then_some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
            error: None,
            model: meta.model.clone(),
            output,
            instructions: echo.instructions.clone(),
            max_output_tokens: echo.max_output_tokens,
            parallel_tool_calls: echo.parallel_tool_calls,
            previous_response_id: None,
            reasoning: ReasoningEcho {
                effort: echo.effort.clone(),
                summary: None,
            },
            store: false,
            temperature: echo.temperature,
            top_p: echo.top_p,
            tool_choice: echo.tool_choice.clone(),
            tools: echo.tools.clone(),
            truncation: "disabled",
            metadata: serde_json::Map::new(),
            text: TextFormatEcho {
                format: TextFormat { kind: "text" },
            },
            usage,
        }
    }
}

/// The engine's events through the parser and the output builder: the
/// output events as they come, then how it ended.
struct Progress {
    parser: OutputParser,
    builder: OutputBuilder,
    reasoning_tokens: usize,
}

/// How the generation ended.
enum Ending {
    Finished {
        truncated: bool,
        usage: ResponseUsage,
        output: Vec<OutputItem>,
    },
    Failed(String),
}

impl Progress {
    fn new(parser: OutputParser, stem: &str) -> Progress {
        Progress {
            parser,
            builder: OutputBuilder::new(stem),
            reasoning_tokens: 0,
        }
    }

    /// One engine event: the output events it makes, and the ending if it
    /// is the last.
    fn step(&mut self, event: Event, prompt_len: usize) -> (Vec<StreamEvent>, Option<Ending>) {
        let mut out = Vec::new();
        match event {
            Event::Token {
                id, text, hidden, ..
            } => {
                let deltas = self.parser.push(TokenPiece {
                    id,
                    text: &text,
                    hidden: hidden.as_deref(),
                });
                for delta in deltas {
                    self.builder.push(delta, &mut out);
                }
                // A token that leaves the output inside reasoning is one.
                self.reasoning_tokens += usize::from(self.builder.in_reasoning());
                (out, None)
            }
            Event::PromptLogits { .. } | Event::PromptLogprob { .. } => (out, None),
            Event::Finished {
                reason,
                text,
                completion_tokens,
                cached_tokens,
                ..
            } => {
                let mut deltas = self.parser.push_text(&text);
                deltas.extend(self.parser.finish());
                for delta in deltas {
                    self.builder.push(delta, &mut out);
                }
                let truncated = reason.as_str() == "length";
                let output = self.builder.finish(truncated, &mut out);
                let usage = ResponseUsage {
                    input_tokens: prompt_len,
                    input_tokens_details: InputTokensDetails { cached_tokens },
                    output_tokens: completion_tokens,
                    output_tokens_details: OutputTokensDetails {
                        reasoning_tokens: self.reasoning_tokens.min(completion_tokens),
                    },
                    total_tokens: prompt_len + completion_tokens,
                };
                (
                    out,
                    Some(Ending::Finished {
                        truncated,
                        usage,
                        output,
                    }),
                )
            }
            Event::Failed { message } => (out, Some(Ending::Failed(message))),
        }
    }
}

/// One prompt, one choice: its parser (its events are index 0).
fn only_parser(parsers: Vec<Option<OutputParser>>) -> OutputParser {
    parsers
        .into_iter()
        .flatten()
        .next()
        .unwrap_or_else(OutputParser::off)
}

/// The blocking answer: the whole output, then one response object.
async fn collect(answer: Answer, submitted: Submitted) -> Result<ResponseObject, ApiError> {
    let Submitted {
        meta,
        mut events,
        parsers,
        ..
    } = submitted;
    let parser = only_parser(parsers);
    let prompt_len = meta.choices.first().map_or(0, |c| c.prompt_ids.len());
    let mut progress = Progress::new(parser, answer.id.trim_start_matches("resp_"));
    while let Some(event) = events.recv().await {
        match progress.step(event.1, prompt_len).1 {
            None => {}
            Some(Ending::Finished {
                truncated,
                usage,
                output,
            }) => {
                let status = if truncated { "incomplete" } else { "completed" };
                return Ok(answer.object(&meta, status, output, Some(usage)));
            }
            Some(Ending::Failed(message)) => return Err(ApiError::internal(message)),
        }
    }
    Err(ApiError::internal("the engine dropped the request"))
}

/// The streamed answer: `response.created`, `response.in_progress`, the
/// output events, then `response.completed` (or `.incomplete` when cut at
/// `max_output_tokens`, `.failed` when the engine failed).
fn stream(
    answer: Answer,
    submitted: Submitted,
    mut outcome: Outcome,
) -> Sse<impl futures_core::Stream<Item = Result<SseEvent, Infallible>>> {
    let Submitted {
        meta,
        mut events,
        parsers,
        ..
    } = submitted;
    let parser = only_parser(parsers);
    let prompt_len = meta.choices.first().map_or(0, |c| c.prompt_ids.len());
    let body = async_stream::stream! {
        let mut sequence = 0u64;
        let mut next = || { sequence += 1; sequence - 1 };
        let started = answer.object(&meta, "in_progress", Vec::new(), None);
        for kind in ["response.created", "response.in_progress"] {
            yield Ok(sse(kind, &ResponseEvent { kind, sequence_number: next(), response: &started }));
        }
        let mut progress = Progress::new(parser, answer.id.trim_start_matches("resp_"));
        let mut ended = false;
        while let Some(event) = events.recv().await {
            let (out, ending) = progress.step(event.1, prompt_len);
            for event in &out {
                yield Ok(sse(event.kind(), &NumberedEvent { event, sequence_number: next() }));
            }
            let Some(ending) = ending else { continue };
            ended = true;
            let (kind, object) = match ending {
                Ending::Finished { truncated, usage, output } => {
                    outcome.finished(true);
                    let (kind, status) = if truncated {
                        ("response.incomplete", "incomplete")
                    } else {
                        ("response.completed", "completed")
                    };
                    (kind, answer.object(&meta, status, output, Some(usage)))
                }
                Ending::Failed(message) => {
                    outcome.finished(false);
                    let mut object = answer.object(&meta, "failed", Vec::new(), None);
                    object.error = Some(serde_json::json!({"code": "server_error", "message": message}));
                    ("response.failed", object)
                }
            };
            yield Ok(sse(kind, &ResponseEvent { kind, sequence_number: next(), response: &object }));
            break;
        }
        if !ended {
            outcome.finished(false);
            let mut object = answer.object(&meta, "failed", Vec::new(), None);
            object.error = Some(serde_json::json!({
                "code": "server_error", "message": "the engine dropped the request"
            }));
            let kind = "response.failed";
            yield Ok(sse(kind, &ResponseEvent { kind, sequence_number: next(), response: &object }));
        }
    };
    Sse::new(body).keep_alive(KeepAlive::new().interval(Duration::from_secs(KEEP_ALIVE_SECONDS)))
}

/// One SSE event: `event: KIND` and the JSON.
fn sse(kind: &'static str, value: &impl Serialize) -> SseEvent {
    let event = SseEvent::default().event(kind);
    match serde_json::to_string(value) {
        Ok(json) => event.data(json),
        Err(e) => event.data(format!(
            "{{\"type\":\"error\",\"message\":\"cannot serialize an event: {e}\"}}"
        )),
    }
}
