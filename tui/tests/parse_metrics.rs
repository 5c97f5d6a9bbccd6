//! `GET /metrics` parsing against the canned answer and broken ones.

mod common;

use common::METRICS_OK;
use sparkrt_tui::metrics::{MetricsParseError, ServingMetrics};

#[test]
fn canned_answer_parses_to_its_figures() {
    let m = ServingMetrics::parse(METRICS_OK).unwrap();
    assert_eq!(
        m,
        ServingMetrics {
            requests_ok: Some(120.0),
            requests_error: Some(2.0),
            requests_rejected: Some(5.0),
            requests_running: Some(3),
            requests_waiting: Some(1),
            prompt_tokens_total: Some(51200.0),
            generation_tokens_total: Some(8000.0),
            kv_blocks_used: Some(5120),
            kv_blocks_free: Some(15360),
            guard_tripped: Some(false),
        }
    );
}

#[test]
fn missing_metrics_stay_none() {
    let m = ServingMetrics::parse("sparkrt_requests_running 2\n").unwrap();
    assert_eq!(m.requests_running, Some(2));
    assert_eq!(m.requests_waiting, None);
    assert_eq!(m.generation_tokens_total, None);
    assert_eq!(
        ServingMetrics::parse("").unwrap(),
        ServingMetrics::default()
    );
}

#[test]
fn guard_tripped_reads_one_as_true() {
    let m = ServingMetrics::parse("sparkrt_guard_tripped 1\n").unwrap();
    assert_eq!(m.guard_tripped, Some(true));
}

#[test]
fn nan_and_infinities_in_used_metrics_are_errors() {
    for (line, metric) in [
        ("sparkrt_requests_running NaN", "sparkrt_requests_running"),
        (
            "sparkrt_generation_tokens_total NaN",
            "sparkrt_generation_tokens_total",
        ),
        (
            "sparkrt_prompt_tokens_total +Inf",
            "sparkrt_prompt_tokens_total",
        ),
        ("sparkrt_kv_blocks_free -Inf", "sparkrt_kv_blocks_free"),
        (
            "sparkrt_requests_total{outcome=\"ok\"} NaN",
            "sparkrt_requests_total",
        ),
        ("sparkrt_guard_tripped NaN", "sparkrt_guard_tripped"),
    ] {
        match ServingMetrics::parse(&format!("{METRICS_OK}{line}\n")) {
            Err(MetricsParseError::BadValue {
                metric: m, value, ..
            }) => {
                assert_eq!(m, metric);
                assert!(!value.is_finite(), "{line}");
            }
            other => panic!("{line}: expected BadValue, got {other:?}"),
        }
    }
}

#[test]
fn nan_in_a_metric_the_monitor_ignores_is_fine() {
    let body = format!("{METRICS_OK}sparkrt_host_mem_available_bytes NaN\nother_thing NaN\n");
    assert_eq!(
        ServingMetrics::parse(&body).unwrap(),
        ServingMetrics::parse(METRICS_OK).unwrap()
    );
}

#[test]
fn impossible_values_are_errors() {
    for line in [
        "sparkrt_requests_running -1",
        "sparkrt_kv_blocks_used 2.5",
        "sparkrt_guard_tripped 2",
        "sparkrt_generation_tokens_total -3",
    ] {
        assert!(
            matches!(
                ServingMetrics::parse(line),
                Err(MetricsParseError::BadValue { .. })
            ),
            "{line}"
        );
    }
}

#[test]
fn garbage_is_a_syntax_error_with_its_line_number() {
    let html = "<html><body>502 Bad Gateway</body></html>";
    assert!(matches!(
        ServingMetrics::parse(html),
        Err(MetricsParseError::Syntax { line: 1, .. })
    ));
    // Cut inside a line: the last line has a name but no value. The canned
    // text's 9th line is `sparkrt_prompt_tokens_total 51200`.
    let cut = METRICS_OK.find("sparkrt_prompt_tokens_total").unwrap() + 10;
    match ServingMetrics::parse(&METRICS_OK[..cut]) {
        Err(MetricsParseError::Syntax { line, reason, .. }) => {
            assert_eq!(line, 9);
            assert_eq!(reason, "missing value");
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
    let unterminated = "sparkrt_requests_total{outcome=\"ok} 1";
    assert!(matches!(
        ServingMetrics::parse(unterminated),
        Err(MetricsParseError::Syntax { line: 1, .. })
    ));
    assert!(matches!(
        ServingMetrics::parse("sparkrt_requests_running three"),
        Err(MetricsParseError::Syntax { .. })
    ));
}
