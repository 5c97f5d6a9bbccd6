//! Reading a request body under `max_body_bytes`. A body over the limit is
//! answered 413 naming the limit; the rest of it is read and thrown away (up
//! to [`MAX_DRAIN_BYTES`]) so that a client still sending it reads that
//! answer instead of a reset connection. Memory stays at the limit either
//! way: only the bytes under it are kept.

use std::pin::Pin;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use futures_core::Stream;

use super::errors::ApiError;
use super::listen::BodyTooSlow;

/// Bytes past the limit read and discarded before the connection is given
/// up on (a body longer still gets its 413 and a closed connection).
pub const MAX_DRAIN_BYTES: usize = 16 << 20;

/// The whole body, or 413 when it is longer than `limit` bytes.
pub async fn read(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(len) = declared
        && len > limit.saturating_add(MAX_DRAIN_BYTES)
    {
        return Err(too_large(len, limit));
    }
    let mut stream = body.into_data_stream();
    let mut kept: Vec<u8> = Vec::with_capacity(declared.unwrap_or(0).min(limit));
    let mut seen = 0usize;
    while let Some(chunk) = next(&mut stream).await {
        let chunk = chunk.map_err(read_error)?;
        seen = seen.saturating_add(chunk.len());
        if seen <= limit {
            kept.extend_from_slice(&chunk);
        } else if seen > limit.saturating_add(MAX_DRAIN_BYTES) {
            break;
        }
    }
    if seen > limit {
        return Err(too_large(declared.unwrap_or(seen).max(seen), limit));
    }
    Ok(Bytes::from(kept))
}

/// A body that stopped arriving in time is a 408 naming the limit (the
/// connection then closes: its body was not read to the end); any other
/// failure is the client's broken body.
fn read_error(error: axum::Error) -> ApiError {
    let inner = error.into_inner();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*inner);
    while let Some(e) = cause {
        if let Some(slow) = e.downcast_ref::<BodyTooSlow>() {
            return ApiError::invalid(slow.to_string(), None)
                .with_status(StatusCode::REQUEST_TIMEOUT)
                .with_code(slow.name());
        }
        cause = e.source();
    }
    ApiError::invalid(format!("reading the body: {inner}"), None)
}

fn too_large(len: usize, limit: usize) -> ApiError {
    ApiError::over_limit(
        "max_body_bytes",
        "the request body's length in bytes",
        len,
        limit,
        None,
    )
    .with_status(StatusCode::PAYLOAD_TOO_LARGE)
}

async fn next<S: Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bodies_up_to_the_limit_pass_longer_ones_get_413() {
        let none = HeaderMap::new();
        let ok = read(&none, Body::from(vec![b'a'; 100]), 100).await.unwrap();
        assert_eq!(ok.len(), 100);
        let over = read(&none, Body::from(vec![b'a'; 101]), 100)
            .await
            .unwrap_err();
        assert_eq!(over.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(over.code, Some("max_body_bytes"));
        assert!(
            over.message.contains("101") && over.message.contains("100"),
            "{}",
            over.message
        );
        // A declared length far past the limit is refused without reading.
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_LENGTH,
            (1usize << 40).to_string().parse().unwrap(),
        );
        let huge = read(&headers, Body::empty(), 100).await.unwrap_err();
        assert!(
            huge.message.contains(&(1usize << 40).to_string()),
            "{}",
            huge.message
        );
    }
}
