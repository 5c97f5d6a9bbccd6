//! Options of the monitor and the parser for its `--interval` value.

use std::time::Duration;

use thiserror::Error;

/// How the monitor runs. `sparkrt-top` (`src/main.rs`) fills it from its flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopOptions {
    /// Base URL of `sparkrt serve`, e.g. `http://127.0.0.1:8000`.
    pub server_url: String,
    /// Time between two samples.
    pub interval: Duration,
    /// Longest a request to the server may take, connect to last byte. Kept
    /// short so a stuck server shows as disconnected within a second or two.
    pub request_timeout: Duration,
    /// How much history the chart keeps.
    pub history: Duration,
    /// How many processes the process panel keeps (largest RSS first).
    pub max_processes: usize,
}

impl Default for TopOptions {
    fn default() -> Self {
        TopOptions {
            server_url: "http://127.0.0.1:8000".to_string(),
            interval: Duration::from_millis(500),
            request_timeout: Duration::from_millis(1500),
            history: Duration::from_secs(5 * 60),
            max_processes: 40,
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum IntervalError {
    #[error("interval {0:?}: expected a number followed by ms or s, e.g. 500ms or 2s")]
    Malformed(String),
    #[error("interval {0:?} is too short: the monitor samples at most every 50ms")]
    TooShort(String),
}

/// The shortest interval accepted: faster sampling only burns CPU.
const MIN_INTERVAL: Duration = Duration::from_millis(50);

/// Parses `500ms`, `2s`, `1.5s`.
pub fn parse_interval(text: &str) -> Result<Duration, IntervalError> {
    let trimmed = text.trim();
    let malformed = || IntervalError::Malformed(text.to_string());
    let (number, seconds_per_unit) = if let Some(ms) = trimmed.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(s) = trimmed.strip_suffix('s') {
        (s, 1.0)
    } else {
        return Err(malformed());
    };
    let value: f64 = number.trim().parse().map_err(|_| malformed())?;
    if !value.is_finite() || value < 0.0 {
        return Err(malformed());
    }
    let interval =
        Duration::try_from_secs_f64(value * seconds_per_unit).map_err(|_| malformed())?;
    if interval < MIN_INTERVAL {
        return Err(IntervalError::TooShort(text.to_string()));
    }
    Ok(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_milliseconds_and_seconds() {
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_interval(" 1.5s "), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn rejects_garbage_and_too_short() {
        for bad in ["", "500", "fast", "-1s", "NaNs", "1e400s", "ms"] {
            assert!(
                matches!(parse_interval(bad), Err(IntervalError::Malformed(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse_interval("10ms"),
            Err(IntervalError::TooShort(_))
        ));
    }
}
