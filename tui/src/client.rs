//! The HTTP side of the collector: one blocking GET per endpoint, each bounded
//! by a short timeout so a slow or dead server costs at most that long.

use std::time::Duration;

use sparkrt_wire::{
    HEALTH_PATH, HealthReport, LoadingReport, MEMORY_PATH, STATS_PATH, ServingStats,
};
use thiserror::Error;

use crate::memory::{self, MemoryParseError, ServerMemory};
use crate::stats::{self, StatsParseError};

/// A larger answer than this is not one of ours (the ledger is a few KiB).
const MAX_BODY_BYTES: u64 = 8 * 1024 * 1024;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum UrlError {
    #[error("server URL {0:?}: https is not supported, the server speaks plain http on the node")]
    Https(String),
    #[error("server URL {0:?}: expected http://HOST[:PORT]")]
    Malformed(String),
}

#[derive(Debug, Error)]
pub enum FetchError {
    #[error("GET {url}: {source}")]
    Http {
        url: String,
        #[source]
        source: ureq::Error,
    },
    #[error(transparent)]
    Memory(#[from] MemoryParseError),
    #[error(transparent)]
    Stats(#[from] StatsParseError),
}

/// Talks to one `sparkrt serve`.
pub struct ServerClient {
    agent: ureq::Agent,
    base_url: String,
}

impl ServerClient {
    /// `server_url` is `http://host[:port]`, with or without a trailing `/`.
    /// `timeout` bounds each request end to end (connect, send, receive).
    pub fn new(server_url: &str, timeout: Duration) -> Result<ServerClient, UrlError> {
        let base_url = normalise_url(server_url)?;
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .max_redirects(0)
            .http_status_as_error(true)
            .build();
        Ok(ServerClient {
            agent: config.into(),
            base_url,
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn memory(&self) -> Result<ServerMemory, FetchError> {
        let body = self.get_text(MEMORY_PATH)?;
        Ok(memory::parse(&body)?)
    }

    pub fn stats(&self) -> Result<ServingStats, FetchError> {
        let body = self.get_text(STATS_PATH)?;
        Ok(stats::parse(&body)?)
    }

    /// The loading section of `/health` while the server starts (`None`
    /// once loaded, from an older server, or when it cannot be read).
    pub fn loading(&self) -> Option<LoadingReport> {
        let body = self.get_text(HEALTH_PATH).ok()?;
        let health: HealthReport = serde_json::from_str(&body).ok()?;
        (health.status == "loading").then_some(health.loading)
    }

    fn get_text(&self, path: &str) -> Result<String, FetchError> {
        let url = format!("{}{}", self.base_url, path);
        let http_error = |source| FetchError::Http {
            url: url.clone(),
            source,
        };
        let mut response = self.agent.get(&url).call().map_err(http_error)?;
        response
            .body_mut()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_string()
            .map_err(http_error)
    }
}

fn normalise_url(server_url: &str) -> Result<String, UrlError> {
    let trimmed = server_url.trim().trim_end_matches('/');
    if trimmed.starts_with("https://") {
        return Err(UrlError::Https(server_url.to_string()));
    }
    let authority = trimmed
        .strip_prefix("http://")
        .ok_or_else(|| UrlError::Malformed(server_url.to_string()))?;
    if authority.is_empty() || authority.contains(['/', '?', '#', ' ']) {
        return Err(UrlError::Malformed(server_url.to_string()));
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_normalised_or_refused() {
        assert_eq!(
            normalise_url("http://127.0.0.1:8000/"),
            Ok("http://127.0.0.1:8000".to_string())
        );
        assert_eq!(
            normalise_url("http://spark"),
            Ok("http://spark".to_string())
        );
        assert!(matches!(
            normalise_url("https://spark:8000"),
            Err(UrlError::Https(_))
        ));
        for bad in ["127.0.0.1:8000", "http://", "http://h/v1", "ftp://h"] {
            assert!(
                matches!(normalise_url(bad), Err(UrlError::Malformed(_))),
                "{bad}"
            );
        }
    }
}
