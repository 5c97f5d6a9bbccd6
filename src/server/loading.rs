//! The server while the weights load: it listens from the start, so
//! `/health` (200, with the `loading` section), `/ready` (503 with the
//! reason, e.g. `loading weights: 37% (3.8 of 10.2 GB, 2.1 GB/s)`) and
//! `/v1/memory` (503 with the `loading` section) answer during loading; every
//! other route answers 503 `loading` until the model is up. Then the full
//! router takes over on the same listener ([`RouterSwitch`]).

use std::sync::{Arc, OnceLock};

use axum::Json;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hyper::service::Service;
use hyper_util::service::TowerToHyperService;
use sparkrt_wire::{HealthReport, LoadPhase, LoadingReport};

use super::auth;
use super::errors::ApiError;
use crate::checkpoint::load::LoadProgress;

/// What the loading routes answer from.
pub struct LoadingState {
    pub progress: Arc<LoadProgress>,
    /// As the full server's: every route but the probes requires it.
    pub api_key: Option<String>,
}

/// Serves the loading router until [`RouterSwitch::serve_with`] installs
/// the full one; the accept loop runs on [`RouterSwitch::router`] for the
/// server's whole life.
pub struct RouterSwitch {
    loading: Router,
    serving: OnceLock<Router>,
}

impl RouterSwitch {
    pub fn new(state: LoadingState) -> Arc<RouterSwitch> {
        Arc::new(RouterSwitch {
            loading: loading_router(Arc::new(state)),
            serving: OnceLock::new(),
        })
    }

    /// From now on every request goes to `router`.
    pub fn serve_with(&self, router: Router) {
        let _ = self.serving.set(router);
    }

    /// The router the accept loop serves: it hands each request to the
    /// current one.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .fallback(dispatch)
            .with_state(Arc::clone(self))
    }
}

async fn dispatch(State(switch): State<Arc<RouterSwitch>>, request: Request) -> Response {
    let router = switch.serving.get().unwrap_or(&switch.loading).clone();
    match TowerToHyperService::new(router).call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

fn loading_router(state: Arc<LoadingState>) -> Router {
    Router::new()
        .route("/health", axum::routing::get(health))
        .route("/ping", axum::routing::get(health).post(health))
        .route("/ready", axum::routing::get(ready))
        .route(sparkrt_wire::MEMORY_PATH, axum::routing::get(memory))
        .fallback(not_yet)
        .with_state(state)
}

/// `/health` of a server: 200 while it works (loading included), 503 once
/// start-up or the engine thread has failed (`failure`).
pub fn health_answer(loading: LoadingReport, failure: Option<String>) -> Response {
    let failure =
        failure.or_else(|| (loading.phase == LoadPhase::Failed).then(|| loading.reason()));
    let (status, word) = match (&failure, loading.phase) {
        (Some(_), _) => (StatusCode::SERVICE_UNAVAILABLE, "failed"),
        (None, LoadPhase::Ready) => (StatusCode::OK, "ok"),
        (None, _) => (StatusCode::OK, "loading"),
    };
    let report = HealthReport {
        status: word.to_string(),
        reason: failure,
        loading,
    };
    (status, Json(report)).into_response()
}

async fn health(State(state): State<Arc<LoadingState>>) -> Response {
    health_answer(state.progress.report(), None)
}

async fn ready(State(state): State<Arc<LoadingState>>) -> Response {
    let body = serde_json::json!({
        "ready": false,
        "loaded": false,
        "memory_guard_tripped": false,
        "reason": state.progress.report().reason(),
    });
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

async fn memory(State(state): State<Arc<LoadingState>>, request: Request) -> Response {
    if let Some(key) = &state.api_key
        && !auth::presents_key(&request, key)
    {
        return ApiError::unauthorized().into_response();
    }
    let loading = state.progress.report();
    let error = loading_error(&loading);
    let mut body = serde_json::to_value(error.body()).unwrap_or_default();
    body["loading"] = serde_json::to_value(&loading).unwrap_or_default();
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

async fn not_yet(State(state): State<Arc<LoadingState>>) -> Response {
    loading_error(&state.progress.report()).into_response()
}

fn loading_error(loading: &LoadingReport) -> ApiError {
    ApiError::internal(loading.reason())
        .with_status(StatusCode::SERVICE_UNAVAILABLE)
        .with_code("loading")
}
