//! Cross-origin requests from browser UIs (vLLM's `--allowed-origins`,
//! `--allowed-methods`, `--allowed-headers`, `--allow-credentials`), as
//! Starlette's `CORSMiddleware` that vLLM uses answers them: a preflight
//! (`OPTIONS` with `Access-Control-Request-Method`) is answered here, before
//! the API key check (browsers send no credentials on a preflight), and
//! the answers of the other requests from an allowed origin carry
//! `Access-Control-Allow-Origin`. Without `--allowed-origins` nothing is
//! added: a browser on another origin cannot read the API.
//!
//! Written here rather than taken from tower-http, which is not in the
//! dependency tree: the whole policy is the few header rules below.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::errors::ApiError;

/// What a preflight's answer lets the browser cache, in seconds (Starlette's).
const MAX_AGE_SECONDS: &str = "600";

/// The methods `*` stands for in a preflight's answer (Starlette's list).
const ALL_METHODS: &str = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";

/// Headers a browser may always send (the CORS-safelisted ones Starlette
/// allows besides the configured list).
const SAFELISTED_HEADERS: [&str; 4] = [
    "accept",
    "accept-language",
    "content-language",
    "content-type",
];

/// A list of `--allowed-*` values; `*` allows any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allowed {
    Any,
    /// Origins as given; methods upper-case; headers lower-case.
    Only(Vec<String>),
}

impl Allowed {
    fn allows(&self, value: &str) -> bool {
        match self {
            Allowed::Any => true,
            Allowed::Only(list) => list.iter().any(|v| v == value),
        }
    }
}

/// The cross-origin policy of `serve`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorsPolicy {
    pub origins: Allowed,
    pub methods: Allowed,
    pub headers: Allowed,
    /// `Access-Control-Allow-Credentials: true` (the origin is then echoed,
    /// never `*`, as the Fetch standard requires).
    pub credentials: bool,
}

impl CorsPolicy {
    /// One line for the start-up summary.
    pub fn describe(&self) -> String {
        let list = |allowed: &Allowed| match allowed {
            Allowed::Any => "*".to_owned(),
            Allowed::Only(list) => list.join(", "),
        };
        format!(
            "origins {}; methods {}; headers {}{}",
            list(&self.origins),
            list(&self.methods),
            list(&self.headers),
            if self.credentials {
                "; credentials"
            } else {
                ""
            }
        )
    }

    /// The value of `Access-Control-Allow-Origin` for an allowed `origin`.
    fn allow_origin(&self, origin: &HeaderValue) -> HeaderValue {
        if self.origins == Allowed::Any && !self.credentials {
            HeaderValue::from_static("*")
        } else {
            origin.clone()
        }
    }

    /// The answer to a preflight from `origin`.
    fn preflight(&self, origin: &HeaderValue, request: &HeaderMap) -> Response {
        let origin_text = origin.to_str().unwrap_or("");
        if !self.origins.allows(origin_text) {
            return refuse(format!("Disallowed CORS origin {origin_text:?}"));
        }
        let method = request
            .get(header::ACCESS_CONTROL_REQUEST_METHOD)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_uppercase();
        if !self.methods.allows(&method) {
            return refuse(format!("Disallowed CORS method {method:?}"));
        }
        let asked = request
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let asked: Vec<String> = asked
            .split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect();
        if let Some(bad) = asked
            .iter()
            .find(|h| !SAFELISTED_HEADERS.contains(&h.as_str()) && !self.headers.allows(h))
        {
            return refuse(format!("Disallowed CORS header {bad:?}"));
        }
        let mut answer = StatusCode::OK.into_response();
        let headers = answer.headers_mut();
        self.decorate(origin, headers);
        let methods = match &self.methods {
            Allowed::Any => ALL_METHODS.to_owned(),
            Allowed::Only(list) => list.join(", "),
        };
        let allowed_headers = match &self.headers {
            Allowed::Any => asked.join(", "),
            Allowed::Only(list) => {
                let mut all: Vec<&str> = SAFELISTED_HEADERS.to_vec();
                all.extend(list.iter().map(String::as_str));
                all.join(", ")
            }
        };
        insert(headers, header::ACCESS_CONTROL_ALLOW_METHODS, &methods);
        if !allowed_headers.is_empty() {
            insert(
                headers,
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                &allowed_headers,
            );
        }
        insert(headers, header::ACCESS_CONTROL_MAX_AGE, MAX_AGE_SECONDS);
        answer
    }

    /// The headers every answer to an allowed `origin` carries.
    fn decorate(&self, origin: &HeaderValue, headers: &mut HeaderMap) {
        let allow = self.allow_origin(origin);
        if allow != "*" {
            headers.append(header::VARY, HeaderValue::from_static("Origin"));
        }
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        if self.credentials {
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
    }
}

fn insert(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(name, value);
    }
}

fn refuse(message: String) -> Response {
    ApiError::invalid(message, None).into_response()
}

/// The layer in front of the key check (installed only with a policy):
/// preflights answered, allowed origins' answers marked; a request without
/// `Origin` (not from a browser on another origin) passes unchanged.
pub async fn apply(
    State(policy): State<Arc<CorsPolicy>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(origin) = request.headers().get(header::ORIGIN).cloned() else {
        return next.run(request).await;
    };
    if request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    {
        return policy.preflight(&origin, request.headers());
    }
    let allowed = policy.origins.allows(origin.to_str().unwrap_or(""));
    let mut response = next.run(request).await;
    if allowed {
        policy.decorate(&origin, response.headers_mut());
    }
    response
}

/// `--allowed-*`'s value: a JSON list (vLLM's form, `'["http://a"]'`) or
/// comma-separated words; `*` among them allows any.
pub fn parse_allowed(text: &str, flag: &str) -> Result<Allowed, String> {
    let items: Vec<String> = if text.trim_start().starts_with('[') {
        serde_json::from_str::<Vec<String>>(text)
            .map_err(|e| format!("{flag}: not a JSON list of strings ({e})"))?
    } else {
        text.split(',').map(str::to_owned).collect()
    };
    let items: Vec<String> = items
        .into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if items.is_empty() {
        return Err(format!("{flag}: the list is empty"));
    }
    if items.iter().any(|s| s == "*") {
        return Ok(Allowed::Any);
    }
    Ok(Allowed::Only(items))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_json_or_commas_and_star_is_any() {
        assert_eq!(
            parse_allowed(r#"["http://a", "http://b"]"#, "--allowed-origins"),
            Ok(Allowed::Only(vec!["http://a".into(), "http://b".into()]))
        );
        assert_eq!(
            parse_allowed("http://a, http://b", "x"),
            Ok(Allowed::Only(vec!["http://a".into(), "http://b".into()]))
        );
        assert_eq!(parse_allowed(r#"["*"]"#, "x"), Ok(Allowed::Any));
        assert!(parse_allowed("[1]", "--allowed-origins").is_err());
        assert!(parse_allowed(" , ", "x").is_err());
    }
}
