//! `Authorization: Bearer <key>` on every route but the probes (`/health`,
//! `/ready`: a kubelet sends no key), compared in constant time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::errors::ApiError;
use super::state::ServerState;

/// The routes that answer without a key: liveness and readiness probes,
/// which reveal nothing but whether the server is up and admitting work
/// (`/ping` is vLLM's name of `/health`, for SageMaker-style checks).
pub const PROBES: [&str; 3] = ["/health", "/ready", "/ping"];

pub async fn require_key(
    State(state): State<Arc<ServerState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = &state.config.api_key else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    let open_metrics = state.config.metrics_no_auth && path == "/metrics";
    if PROBES.contains(&path) || open_metrics || presents_key(&request, key) {
        next.run(request).await
    } else {
        ApiError::unauthorized().into_response()
    }
}

/// Whether `request` carries `Authorization: Bearer <key>`.
pub fn presents_key(request: &Request, key: &str) -> bool {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .unwrap_or("");
    constant_time_eq(presented.as_bytes(), key.as_bytes())
}

/// The token of `Bearer <token>`; the scheme's name is case-insensitive
/// (RFC 9110, section 11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// Equal in time independent of where the inputs differ (only the length
/// of the presented key can leak).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn constant_time_eq_compares_bytes() {
        assert!(super::constant_time_eq(b"secret", b"secret"));
        assert!(!super::constant_time_eq(b"secret", b"secreT"));
        assert!(!super::constant_time_eq(b"secret", b"secrets"));
        assert!(!super::constant_time_eq(b"", b"x"));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(super::bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(super::bearer_token("bearer  abc"), Some("abc"));
        assert_eq!(super::bearer_token("Basic abc"), None);
        assert_eq!(super::bearer_token("abc"), None);
    }
}
