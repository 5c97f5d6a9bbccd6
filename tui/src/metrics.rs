//! `GET /metrics`: the server's Prometheus text, reduced to the figures the
//! serving panel shows (names fixed in docs/ARCHITECTURE.md, "Contracts").
//!
//! Metrics the monitor does not use are skipped; a contract metric that is
//! absent stays `None` (shown as "–"); one with an impossible value (NaN,
//! negative, a fraction where a count is due) is an error, because it means
//! the server is broken and the panel should say so instead of guessing.

use thiserror::Error;

/// The serving figures of one `/metrics` answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServingMetrics {
    pub requests_ok: Option<f64>,
    pub requests_error: Option<f64>,
    pub requests_rejected: Option<f64>,
    pub requests_running: Option<u64>,
    pub requests_waiting: Option<u64>,
    pub prompt_tokens_total: Option<f64>,
    pub generation_tokens_total: Option<f64>,
    pub kv_blocks_used: Option<u64>,
    pub kv_blocks_free: Option<u64>,
    pub guard_tripped: Option<bool>,
}

#[derive(Debug, Error, PartialEq)]
pub enum MetricsParseError {
    #[error("/metrics line {line}: {reason}: {text:?}")]
    Syntax {
        line: usize,
        reason: &'static str,
        text: String,
    },
    #[error("/metrics: {metric} is {value}, expected {expected}")]
    BadValue {
        metric: String,
        value: f64,
        expected: &'static str,
    },
}

/// `(name, value)` pairs inside the braces of a sample line.
type Labels = Vec<(String, String)>;

/// One sample line: `name{label="value",...} value [timestamp]`.
#[derive(Debug, PartialEq)]
struct Sample {
    name: String,
    labels: Labels,
    value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl ServingMetrics {
    pub fn parse(body: &str) -> Result<ServingMetrics, MetricsParseError> {
        let mut metrics = ServingMetrics::default();
        for (index, raw) in body.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let sample = parse_sample(line).map_err(|reason| MetricsParseError::Syntax {
                line: index + 1,
                reason,
                text: line.chars().take(80).collect(),
            })?;
            metrics.absorb(&sample)?;
        }
        Ok(metrics)
    }

    fn absorb(&mut self, sample: &Sample) -> Result<(), MetricsParseError> {
        let value = sample.value;
        match sample.name.as_str() {
            "sparkrt_requests_total" => {
                let slot = match sample.label("outcome") {
                    Some("ok") => &mut self.requests_ok,
                    Some("error") => &mut self.requests_error,
                    Some("rejected") => &mut self.requests_rejected,
                    _ => return Ok(()),
                };
                *slot = Some(counter(sample)?);
            }
            "sparkrt_requests_running" => self.requests_running = Some(count(sample)?),
            "sparkrt_requests_waiting" => self.requests_waiting = Some(count(sample)?),
            "sparkrt_prompt_tokens_total" => self.prompt_tokens_total = Some(counter(sample)?),
            "sparkrt_generation_tokens_total" => {
                self.generation_tokens_total = Some(counter(sample)?)
            }
            "sparkrt_kv_blocks_used" => self.kv_blocks_used = Some(count(sample)?),
            "sparkrt_kv_blocks_free" => self.kv_blocks_free = Some(count(sample)?),
            "sparkrt_guard_tripped" => {
                self.guard_tripped = Some(if value == 0.0 {
                    false
                } else if value == 1.0 {
                    true
                } else {
                    return Err(bad_value(sample, "0 or 1"));
                })
            }
            _ => {}
        }
        Ok(())
    }
}

fn bad_value(sample: &Sample, expected: &'static str) -> MetricsParseError {
    MetricsParseError::BadValue {
        metric: sample.name.clone(),
        value: sample.value,
        expected,
    }
}

/// A counter: finite and not negative.
fn counter(sample: &Sample) -> Result<f64, MetricsParseError> {
    if sample.value.is_finite() && sample.value >= 0.0 {
        Ok(sample.value)
    } else {
        Err(bad_value(sample, "a finite non-negative number"))
    }
}

/// A gauge that counts things: a non-negative whole number.
fn count(sample: &Sample) -> Result<u64, MetricsParseError> {
    let value = sample.value;
    // 2^53: beyond it f64 no longer holds every integer, far beyond any count.
    if value.is_finite()
        && value >= 0.0
        && value.fract() == 0.0
        && value <= 9.007_199_254_740_992e15
    {
        Ok(value as u64)
    } else {
        Err(bad_value(sample, "a non-negative whole number"))
    }
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    is_name_start(c) || c.is_ascii_digit()
}

/// Parses one non-comment line of the Prometheus text format.
fn parse_sample(line: &str) -> Result<Sample, &'static str> {
    let name_end = line
        .char_indices()
        .find(|&(_, c)| !is_name_char(c))
        .map_or(line.len(), |(i, _)| i);
    let name = &line[..name_end];
    if !name.starts_with(is_name_start) {
        return Err("expected a metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after_brace) = rest.strip_prefix('{') {
        let (parsed, after_labels) = parse_labels(after_brace)?;
        labels = parsed;
        rest = after_labels;
    }
    let mut fields = rest.split_whitespace();
    let value_text = fields.next().ok_or("missing value")?;
    // Prometheus writes NaN, +Inf and -Inf; Rust's parser reads all three.
    let value: f64 = value_text.parse().map_err(|_| "value is not a number")?;
    if let Some(timestamp) = fields.next() {
        timestamp
            .parse::<i64>()
            .map_err(|_| "timestamp is not an integer")?;
    }
    if fields.next().is_some() {
        return Err("unexpected text after the value");
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses `key="value",...}` (the opening brace already consumed) and
/// returns the labels and what follows the closing brace.
fn parse_labels(text: &str) -> Result<(Labels, &str), &'static str> {
    let mut labels = Vec::new();
    let mut rest = text.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let key_end = rest
            .char_indices()
            .find(|&(_, c)| !is_name_char(c))
            .map_or(rest.len(), |(i, _)| i);
        let key = &rest[..key_end];
        if key.is_empty() {
            return Err("expected a label name");
        }
        rest = rest[key_end..].trim_start();
        rest = rest
            .strip_prefix('=')
            .ok_or("expected = after a label name")?;
        rest = rest.trim_start();
        rest = rest
            .strip_prefix('"')
            .ok_or("expected a quoted label value")?;
        let (value, after_value) = parse_quoted(rest)?;
        labels.push((key.to_string(), value));
        rest = after_value.trim_start();
        if let Some(after_comma) = rest.strip_prefix(',') {
            rest = after_comma.trim_start();
        } else if !rest.starts_with('}') {
            return Err("expected , or } after a label");
        }
    }
}

/// Reads a label value up to its closing quote, undoing `\\`, `\"`, `\n`.
fn parse_quoted(text: &str) -> Result<(String, &str), &'static str> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &text[i + 1..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, escaped)) => value.push(escaped),
                None => break,
            },
            _ => value.push(c),
        }
    }
    Err("unterminated label value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_line_with_labels_escapes_and_timestamp() {
        let sample = parse_sample(r#"m_x{a="1",b="say \"hi\"\\", } 2.5e3 1700000000000"#).unwrap();
        assert_eq!(sample.name, "m_x");
        assert_eq!(
            sample.labels,
            vec![
                ("a".to_string(), "1".to_string()),
                ("b".to_string(), "say \"hi\"\\".to_string())
            ]
        );
        assert_eq!(sample.value, 2500.0);
    }

    #[test]
    fn sample_line_errors() {
        assert_eq!(parse_sample("9abc 1"), Err("expected a metric name"));
        assert_eq!(parse_sample("abc"), Err("missing value"));
        assert_eq!(
            parse_sample("abc{x=\"1\" 2"),
            Err("expected , or } after a label")
        );
        assert_eq!(
            parse_sample("abc{x=\"1} 2"),
            Err("unterminated label value")
        );
        assert_eq!(parse_sample("abc twelve"), Err("value is not a number"));
        assert_eq!(
            parse_sample("abc 1 2 3"),
            Err("unexpected text after the value")
        );
    }
}
