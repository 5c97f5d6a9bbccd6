//! The SSE stream of a `stream: true` request: one chunk per piece of text
//! as the engine produces it, the finish reason, the usage when asked for,
//! then `[DONE]`.
//!
//! A chat stream sends its output parser's deltas, one chunk each, as
//! OpenAI and vLLM do: `delta.reasoning_content` (and `reasoning`),
//! `delta.content`, and for a tool call first `tool_calls: [{index, id,
//! type: "function", function: {name, arguments: ""}}]`, then
//! `tool_calls: [{index, function: {arguments: piece}}]`; the finish reason
//! is `tool_calls` when the model called tools and stopped by itself.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use serde::Serialize;
use tokio::sync::mpsc;

use super::outcome::Outcome;
use super::tool_types::{finish_reason, tool_call_delta};
use super::types::{ASSISTANT, ChatChunkChoice, ChatDelta, CompletionChunk, TextChoice, Usage};
use super::{ResponseMeta, Route};
use crate::engine::Event;
use crate::server::ServerState;
use crate::server::errors::ApiError;
use crate::text::parsers::{Delta, OutputParser, TokenPiece};

/// Seconds between keep-alive comments while the engine is silent.
const KEEP_ALIVE_SECONDS: u64 = 10;

pub(super) fn sse(
    state: Arc<ServerState>,
    meta: ResponseMeta,
    mut events: mpsc::UnboundedReceiver<Event>,
    mut parser: OutputParser,
    mut outcome: Outcome,
) -> Sse<impl futures_core::Stream<Item = Result<SseEvent, Infallible>>> {
    let body = async_stream::stream! {
        let mut first = true;
        if meta.route == Route::Chat {
            yield Ok(meta.choice_chunk(Some(""), &[], None, true));
            first = false;
        }
        // Ids of tokens whose text is still held back (partial characters,
        // possible stop strings): they go out with the next text. Without a
        // tokenizer there is no text at all: every token gets its chunk.
        let mut ids = Vec::new();
        let chunk_per_token = state.config.tokenizer.is_none();
        let mut ended = false;
        let mut made_tool_calls = false;
        while let Some(event) = events.recv().await {
            match event {
                Event::Token { id, text, hidden, .. } if meta.route == Route::Chat => {
                    ids.push(id);
                    let piece = TokenPiece { id, text: &text, hidden: hidden.as_deref() };
                    for delta in parser.push(piece) {
                        made_tool_calls |= matches!(delta, Delta::ToolCallStart { .. });
                        yield Ok(meta.delta_chunk(chat_delta(&delta), &ids, None, first));
                        ids.clear();
                        first = false;
                    }
                }
                Event::Token { id, text, .. } => {
                    ids.push(id);
                    if !text.is_empty() || chunk_per_token {
                        yield Ok(meta.choice_chunk(Some(&text), &ids, None, first));
                        ids.clear();
                        first = false;
                    }
                }
                Event::PromptLogits { .. } => {}
                Event::Finished { reason, text, completion_tokens, .. } => {
                    outcome.finished(true);
                    let mut reason = reason.as_str();
                    if meta.route == Route::Chat {
                        let mut deltas = parser.push_text(&text);
                        deltas.extend(parser.finish());
                        for delta in deltas {
                            made_tool_calls |= matches!(delta, Delta::ToolCallStart { .. });
                            yield Ok(meta.delta_chunk(chat_delta(&delta), &ids, None, first));
                            ids.clear();
                            first = false;
                        }
                        reason = finish_reason(reason, made_tool_calls);
                        // Ids whose text was held back and came to nothing
                        // go out with the finish reason.
                        yield Ok(meta.delta_chunk(ChatDelta::default(), &ids, Some(reason), first));
                    } else {
                        if !text.is_empty() || !ids.is_empty() {
                            yield Ok(meta.choice_chunk(Some(&text), &ids, None, first));
                            first = false;
                        }
                        yield Ok(meta.choice_chunk(None, &[], Some(reason), first));
                    }
                    if meta.include_usage {
                        yield Ok(meta.usage_chunk(meta.usage(completion_tokens)));
                    }
                    ended = true;
                    break;
                }
                Event::Failed { message } => {
                    outcome.finished(false);
                    yield Ok(data(&ApiError::internal(message).body()));
                    ended = true;
                    break;
                }
            }
        }
        if !ended {
            outcome.finished(false);
            yield Ok(data(&ApiError::internal("the engine dropped the request").body()));
        }
        yield Ok(SseEvent::default().data("[DONE]"));
    };
    Sse::new(body).keep_alive(KeepAlive::new().interval(Duration::from_secs(KEEP_ALIVE_SECONDS)))
}

impl ResponseMeta {
    /// A chunk of `C` choices with this request's id, object and model.
    fn chunk<C>(&self, choices: Vec<C>, usage: Option<Usage>) -> CompletionChunk<C> {
        CompletionChunk {
            id: self.id.clone(),
            object: match self.route {
                Route::Completion => "text_completion",
                Route::Chat => "chat.completion.chunk",
            },
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    /// One chunk carrying `text` and the ids of the tokens it came from (and
    /// the finish reason at the end). The first chunk also carries the
    /// chat role and the prompt's ids.
    fn choice_chunk(
        &self,
        text: Option<&str>,
        ids: &[u32],
        finish: Option<&'static str>,
        first: bool,
    ) -> SseEvent {
        match self.route {
            Route::Completion => data(&self.chunk(
                vec![TextChoice {
                    index: 0,
                    text: text.unwrap_or("").to_string(),
                    logprobs: None,
                    finish_reason: finish,
                    ids: self.token_ids(ids, first),
                }],
                None,
            )),
            Route::Chat => self.delta_chunk(
                ChatDelta {
                    content: text.map(str::to_string),
                    ..ChatDelta::default()
                },
                ids,
                finish,
                first,
            ),
        }
    }

    /// One chat chunk carrying `delta` and the ids of the tokens it came
    /// from; the first one also the role and the prompt's ids.
    fn delta_chunk(
        &self,
        mut delta: ChatDelta,
        ids: &[u32],
        finish: Option<&'static str>,
        first: bool,
    ) -> SseEvent {
        delta.role = first.then_some(ASSISTANT);
        data(&self.chunk(
            vec![ChatChunkChoice {
                index: 0,
                delta,
                logprobs: None,
                finish_reason: finish,
                ids: self.token_ids(ids, first),
            }],
            None,
        ))
    }

    /// The chunk after the last choice when the client asked for usage: no
    /// choices, the usage.
    fn usage_chunk(&self, usage: Usage) -> SseEvent {
        data(&self.chunk(Vec::<TextChoice>::new(), Some(usage)))
    }
}

/// A parser delta as a chat chunk's delta.
fn chat_delta(delta: &Delta) -> ChatDelta {
    match delta {
        Delta::Reasoning(text) => ChatDelta {
            reasoning_content: Some(text.clone()),
            reasoning: Some(text.clone()),
            ..ChatDelta::default()
        },
        Delta::Content(text) => ChatDelta {
            content: Some(text.clone()),
            ..ChatDelta::default()
        },
        Delta::ToolCallStart { .. } | Delta::ToolCallArguments { .. } => ChatDelta {
            tool_calls: tool_call_delta(delta).map(|d| vec![d]),
            ..ChatDelta::default()
        },
    }
}

fn data(value: &impl Serialize) -> SseEvent {
    match serde_json::to_string(value) {
        Ok(json) => SseEvent::default().data(json),
        // Not reached with these types (no maps with non-string keys); an
        // event a client can see beats a panic in the stream.
        Err(e) => SseEvent::default().event("error").data(e.to_string()),
    }
}
