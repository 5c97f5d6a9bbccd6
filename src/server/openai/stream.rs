//! The SSE stream of a `stream: true` request: one chunk per piece of text
//! as the engine produces it, the finish reason, the usage when asked for,
//! then `[DONE]`. With several choices (a batch of prompts, `n`) their
//! chunks interleave as the engine produces them, each carrying its choice's
//! `index`, each choice with its own parser, logprobs and finish reason; the
//! usage chunk comes once, after the last choice finished.
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

use super::logprobs::ChoiceLogprobs;
use super::meta::ResponseMeta;
use super::outcome::Outcome;
use super::route::Route;
use super::tool_types::{finish_reason, tool_call_delta};
use super::types::{ASSISTANT, ChatChunkChoice, ChatDelta, CompletionChunk, TextChoice, Usage};
use crate::engine::Event;
use crate::server::errors::ApiError;
use crate::server::state::ServerState;
use crate::text::parsers::{Delta, OutputParser, TokenPiece};

/// Seconds between keep-alive comments while the engine is silent.
const KEEP_ALIVE_SECONDS: u64 = 10;

/// One choice's state in the stream.
struct StreamChoice {
    /// Ids of tokens whose text is still held back (partial characters,
    /// possible stop strings): they go out with the next text.
    ids: Vec<u32>,
    logprobs: ChoiceLogprobs,
    /// The chat route's output parser (reasoning, tool calls); completions
    /// have none and stream their text as it comes.
    parser: Option<OutputParser>,
    made_tool_calls: bool,
    /// No chunk of this choice has gone out yet (the first carries the
    /// prompt's ids, the echoed prompt and `prompt_logprobs`).
    first: bool,
    finished: bool,
    /// Its tokens so far, for the running usage: counted as they come, the
    /// engine's count once it finished.
    completion_tokens: usize,
    /// The prompt's tokens served from the prefix cache (known at the end).
    cached_tokens: usize,
}

pub(super) fn sse(
    state: Arc<ServerState>,
    meta: ResponseMeta,
    mut events: mpsc::UnboundedReceiver<(usize, Event)>,
    mut parsers: Vec<Option<OutputParser>>,
    mut outcome: Outcome,
) -> Sse<impl futures_core::Stream<Item = Result<SseEvent, Infallible>>> {
    let body = async_stream::stream! {
        let mut choices: Vec<StreamChoice> = (0..meta.choices.len())
            .map(|index| StreamChoice {
                ids: Vec::new(),
                logprobs: meta.choice_logprobs(index),
                parser: parsers.get_mut(index).and_then(Option::take),
                made_tool_calls: false,
                first: true,
                finished: false,
                completion_tokens: 0,
                cached_tokens: 0,
            })
            .collect();
        if meta.route == Route::Chat {
            for (index, choice) in choices.iter_mut().enumerate() {
                yield Ok(meta.choice_chunk(index, choice, Some(""), None));
            }
        }
        // Without a tokenizer there is no text at all: every token gets its chunk.
        let chunk_per_token = state.config.tokenizer.is_none();
        let mut open = choices.len();
        let mut usage = meta.usage_tally();
        let mut failed = false;
        while open > 0 {
            let Some((index, event)) = events.recv().await else {
                break;
            };
            let Some(choice) = choices.get_mut(index) else {
                continue;
            };
            match event {
                Event::Token { id, text, logprob, hidden } => {
                    choice.ids.push(id);
                    choice.completion_tokens += 1;
                    if let Some(t) = &logprob {
                        choice.logprobs.on_token(t);
                    }
                    let piece = TokenPiece { id, text: &text, hidden: hidden.as_deref() };
                    if let Some(deltas) = choice.parser.as_mut().map(|p| p.push(piece)) {
                        for delta in deltas {
                            yield Ok(meta.delta_chunk(index, choice, &delta));
                        }
                    } else if !text.is_empty() || chunk_per_token {
                        yield Ok(meta.choice_chunk(index, choice, Some(&text), None));
                    }
                }
                Event::PromptLogprob { logprob, .. } => choice.logprobs.on_prompt(&logprob),
                Event::PromptLogits { .. } => {}
                Event::Finished { reason, text, stop_logprob, prompt_tokens, completion_tokens, cached_tokens } => {
                    if let Some(t) = &stop_logprob {
                        choice.logprobs.on_token(t);
                    }
                    choice.completion_tokens = completion_tokens;
                    choice.cached_tokens = cached_tokens;
                    let mut reason = reason.as_str();
                    if let Some(parser) = choice.parser.as_mut() {
                        let mut deltas = parser.push_text(&text);
                        deltas.extend(parser.finish());
                        for delta in deltas {
                            yield Ok(meta.delta_chunk(index, choice, &delta));
                        }
                        reason = finish_reason(reason, choice.made_tool_calls);
                        // Ids whose text was held back and came to nothing
                        // go out with the finish reason.
                        yield Ok(meta.choice_chunk(index, choice, None, Some(reason)));
                    } else {
                        if !text.is_empty() || !choice.ids.is_empty() || stop_logprob.is_some() {
                            yield Ok(meta.choice_chunk(index, choice, Some(&text), None));
                        }
                        yield Ok(meta.choice_chunk(index, choice, None, Some(reason)));
                    }
                    if !choice.finished {
                        choice.finished = true;
                        open -= 1;
                        usage.finished(meta.choices[index].prompt, prompt_tokens, cached_tokens, completion_tokens);
                    }
                }
                Event::Failed { message } => {
                    yield Ok(data(&ApiError::internal(message).body()));
                    failed = true;
                    break;
                }
            }
        }
        if open == 0 {
            outcome.finished(true);
            if meta.include_usage {
                yield Ok(meta.usage_chunk(usage.usage()));
            }
        } else {
            outcome.finished(false);
            if !failed {
                yield Ok(data(&ApiError::internal("the engine dropped the request").body()));
            }
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

    /// One chunk of choice `index` carrying `text`, the ids of the tokens it
    /// came from and their log-probabilities (and the finish reason at the
    /// end). The choice's first chunk also carries the chat role, the
    /// prompt's ids, the echoed prompt and `prompt_logprobs`.
    fn choice_chunk(
        &self,
        index: usize,
        choice: &mut StreamChoice,
        text: Option<&str>,
        finish: Option<&'static str>,
    ) -> SseEvent {
        match self.route {
            Route::Completion => {
                let first = std::mem::replace(&mut choice.first, false);
                let ids = self.token_ids(index, &choice.ids, first);
                choice.ids.clear();
                let mut piece = String::new();
                if first && let Some(echo) = &self.choices[index].echo {
                    piece.push_str(echo);
                }
                piece.push_str(text.unwrap_or(""));
                data(&self.chunk(
                    vec![TextChoice {
                        index: index as u32,
                        text: piece,
                        logprobs: choice.logprobs.take_nonempty(),
                        finish_reason: finish,
                        ids,
                        prompt_logprobs: if first {
                            choice.logprobs.take_prompt()
                        } else {
                            None
                        },
                    }],
                    self.running_usage(index, choice),
                ))
            }
            Route::Chat => {
                let delta = ChatDelta {
                    content: text.map(str::to_string),
                    ..ChatDelta::default()
                };
                self.chat_chunk(index, choice, delta, finish)
            }
        }
    }

    /// One chat chunk carrying a parser's delta.
    fn delta_chunk(&self, index: usize, choice: &mut StreamChoice, delta: &Delta) -> SseEvent {
        choice.made_tool_calls |= matches!(delta, Delta::ToolCallStart { .. });
        self.chat_chunk(index, choice, chat_delta(delta), None)
    }

    /// One chat chunk of choice `index` carrying `delta`, the ids of the
    /// tokens it came from and their log-probabilities; the choice's first
    /// one also the role and the prompt's ids.
    fn chat_chunk(
        &self,
        index: usize,
        choice: &mut StreamChoice,
        mut delta: ChatDelta,
        finish: Option<&'static str>,
    ) -> SseEvent {
        let first = std::mem::replace(&mut choice.first, false);
        delta.role = first.then_some(ASSISTANT);
        let ids = self.token_ids(index, &choice.ids, first);
        choice.ids.clear();
        data(&self.chunk(
            vec![ChatChunkChoice {
                index: index as u32,
                delta,
                logprobs: choice.logprobs.take_nonempty(),
                finish_reason: finish,
                ids,
            }],
            self.running_usage(index, choice),
        ))
    }

    /// With `continuous_usage_stats`, choice `index`'s usage so far (as
    /// vLLM: its prompt's tokens, its own completion tokens).
    fn running_usage(&self, index: usize, choice: &StreamChoice) -> Option<Usage> {
        self.continuous_usage.then(|| {
            Usage::new(
                self.choices[index].prompt_ids.len(),
                choice.completion_tokens,
            )
            .with_cached_tokens(choice.cached_tokens)
        })
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
