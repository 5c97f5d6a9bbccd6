//! Reading `GET /v1/stats` ([`ServingStats`], shape in [`sparkrt_wire`]): the
//! serving panel's figures as typed JSON. (`/metrics` carries the same
//! figures as Prometheus text, for Prometheus; the monitor does not read it.)

use sparkrt_wire::ServingStats;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StatsParseError {
    /// Not JSON, a missing field, or a figure of the wrong type (negative,
    /// fractional or non-numeric counts are refused by the integer types).
    #[error("/v1/stats is not the expected JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Parses the answer; a missing field or a wrong type is an error.
pub fn parse(body: &str) -> Result<ServingStats, StatsParseError> {
    Ok(serde_json::from_str(body)?)
}
