//! Errors in the OpenAI error-object shape, with the HTTP status to send.

use std::borrow::Cow;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answered as `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    /// The request field at fault: a fixed name, or one the client sent
    /// (an unsupported field).
    pub param: Option<Cow<'static, str>>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (503 from the memory guard, 429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(Cow::Borrowed),
            code: None,
            retry_after: None,
        }
    }

    /// A request field this server does not implement: 400 naming it, with
    /// OpenAI's `unsupported_parameter` code (refused, never ignored).
    pub fn unsupported_parameter(field: &str, why: &str) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!("Unsupported parameter: '{field}' {why}"),
            kind: "invalid_request_error",
            param: Some(Cow::Owned(field.to_string())),
            code: Some("unsupported_parameter"),
            retry_after: None,
        }
    }

    pub fn with_status(mut self, status: StatusCode) -> ApiError {
        self.status = status;
        self
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// A client-sized value over one of [`crate::server::limits::RequestLimits`]:
    /// 400 with the limit's name as `code`, and the value and the limit in
    /// the message.
    pub fn over_limit(
        limit: &'static str,
        what: &str,
        value: usize,
        max: usize,
        param: Option<&'static str>,
    ) -> ApiError {
        ApiError::invalid(
            format!("{what} is {value}, over this server's limit {limit} = {max}"),
            param,
        )
        .with_code(limit)
    }

    pub fn model_not_found(model: &str) -> ApiError {
        ApiError::invalid(
            format!("The model `{model}` does not exist."),
            Some("model"),
        )
        .with_status(StatusCode::NOT_FOUND)
        .with_code("model_not_found")
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or invalid API key (send `Authorization: Bearer <key>`)".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    pub fn queue_full(retry_after: u64) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: "the request queue is full; retry later".into(),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
            retry_after: Some(retry_after),
        }
    }

    pub fn memory_guard(retry_after: u64) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the host is low on memory (MemAvailable is below the eviction line plus the safety margin); not admitting new work until it recovers".into(),
            kind: "server_error",
            param: None,
            code: Some("memory_guard"),
            retry_after: Some(retry_after),
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorObject {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        }
    }
}

/// What an error answers: `{"error": {...}}`.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    pub error: ErrorObject<'a>,
}

/// OpenAI's error object; `param` and `code` are `null` when not set.
#[derive(Debug, Serialize)]
pub struct ErrorObject<'a> {
    pub message: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<&'a str>,
    pub code: Option<&'static str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after
            && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}
