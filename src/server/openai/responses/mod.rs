//! `POST /v1/responses`: OpenAI's Responses API over the chat template and
//! the output parsers, blocking or streamed (SSE events).
//!
//! - [`types`]: the request, the response object, its items and events;
//! - [`input`]: input items and flat tools into the chat template's input;
//! - [`output`]: the parser's deltas into output items and events;
//! - [`handler`]: the route.
//!
//! Nothing is stored: `previous_response_id` and `store: true` are refused
//! (400); clients send the whole conversation as input items.

mod handler;
pub mod input;
pub mod output;
pub mod types;

pub use handler::responses;
