//! The OpenAI-compatible HTTP server: routes, the engine thread, the memory
//! guard, and the observability endpoints the monitor reads.
//!
//! This file only assembles the router; the modules below it are layered,
//! each importing only those beneath it: leaf types and helpers (`errors`,
//! `body`, `limits`, `prep`, `latency`, `guard`, `engine_loop`, `fds`,
//! `listen`, `expose`, `openai::types`…), then [`state`] (what the handlers
//! share), then the handlers (`auth`, `loading`, `observe`, `openai`).

pub mod auth;
pub mod body;
pub mod cors;
pub mod engine_loop;
pub mod errors;
pub mod expose;
pub mod fds;
pub mod guard;
pub mod hidden_footprint;
pub mod latency;
pub mod limits;
pub mod listen;
pub mod loading;
pub mod observe;
pub mod openai;
pub mod prep;
pub mod seeds;
pub mod state;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

pub use state::{RequestCounters, ServerConfig, ServerState};

/// The routes, with the API key check in front of all but the probes
/// (`/health`, `/ready`, `/ping`).
pub fn router(state: Arc<ServerState>) -> Router {
    let routes = Router::new()
        .route("/health", get(observe::health))
        // vLLM's routes: `/ping` answers as `/health` (GET or POST, as
        // vLLM's), `/version` the server's version.
        .route("/ping", get(observe::health).post(observe::health))
        .route("/version", get(observe::version))
        .route("/ready", get(observe::ready))
        .route("/metrics", get(observe::metrics))
        .route("/v1/memory", get(observe::memory))
        .route("/v1/stats", get(observe::stats))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{id}", get(openai::model))
        .route("/tokenize", post(openai::tokenize))
        .route("/detokenize", post(openai::detokenize))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/responses", post(openai::responses))
        .fallback(openai::not_found)
        .method_not_allowed_fallback(openai::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            auth::require_key,
        ));
    // Outside the key check: a browser's preflight carries no key.
    let routes = match &state.config.cors {
        Some(policy) => routes.layer(axum::middleware::from_fn_with_state(
            Arc::new(policy.clone()),
            cors::apply,
        )),
        None => routes,
    };
    routes
        .layer(DefaultBodyLimit::max(state.request_limits.max_body_bytes))
        .with_state(state)
}
