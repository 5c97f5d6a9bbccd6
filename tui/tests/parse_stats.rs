//! `GET /v1/stats` parsing against the canned answer and broken ones.

use crate::common;

use common::STATS_OK;
use serde_json::error::Category;
use sparkrt_tui::stats::{self, StatsParseError};
use sparkrt_wire::{Percentiles, RequestOutcomes, ServingStats};

/// The canned answer with one JSON value replaced (by its pointer path).
fn with(pointer: &str, value: serde_json::Value) -> String {
    let mut doc: serde_json::Value = serde_json::from_str(STATS_OK).unwrap();
    *doc.pointer_mut(pointer).unwrap() = value;
    doc.to_string()
}

fn json_error(body: &str) -> serde_json::Error {
    match stats::parse(body) {
        Err(StatsParseError::Json(e)) => e,
        Ok(stats) => panic!("expected a JSON error, got {stats:?}"),
    }
}

#[test]
fn canned_answer_parses_to_its_figures() {
    let stats = stats::parse(STATS_OK).unwrap();
    assert_eq!(
        stats,
        ServingStats {
            requests: RequestOutcomes {
                ok: 120,
                error: 2,
                rejected: 5,
                cancelled: 0,
            },
            requests_running: 3,
            requests_waiting: 1,
            prompt_tokens_total: 51200,
            generation_tokens_total: 8000,
            preemptions_total: 4,
            kv_blocks_used: 5120,
            kv_blocks_free: 15360,
            kv_blocks_cached: 0,
            prefix_cache_queries_total: 0,
            prefix_cache_hits_total: 0,
            state_snapshots_cached: 0,
            state_snapshots_taken_total: 0,
            spec_decode_num_drafts_total: 0,
            spec_decode_num_draft_tokens_total: 0,
            spec_decode_num_accepted_tokens_total: 0,
            spec_decode_num_accepted_tokens_per_pos: [0; sparkrt_wire::MAX_SPECULATIVE_TOKENS],
            guard_tripped: false,
            ttft_seconds: Some(Percentiles {
                p50: 0.125,
                p99: 0.75
            }),
            itl_seconds: Some(Percentiles {
                p50: 0.025,
                p99: 0.07
            }),
        }
    );
}

#[test]
fn the_canned_answer_is_exactly_what_the_wire_type_writes() {
    let recorded: serde_json::Value = serde_json::from_str(STATS_OK).unwrap();
    let written = serde_json::to_value(stats::parse(STATS_OK).unwrap()).unwrap();
    assert_eq!(written, recorded);
}

#[test]
fn an_answer_without_the_cancelled_count_reads_as_none_cancelled() {
    let mut doc: serde_json::Value = serde_json::from_str(STATS_OK).unwrap();
    doc["requests"]
        .as_object_mut()
        .unwrap()
        .remove("cancelled")
        .unwrap();
    doc["requests"]["ok"] = 7.into();
    let stats = stats::parse(&doc.to_string()).unwrap();
    assert_eq!((stats.requests.ok, stats.requests.cancelled), (7, 0));
}

#[test]
fn missing_figures_are_errors_that_name_them() {
    for key in [
        "requests_running",
        "requests_waiting",
        "generation_tokens_total",
        "kv_blocks_free",
        "guard_tripped",
    ] {
        let mut doc: serde_json::Value = serde_json::from_str(STATS_OK).unwrap();
        doc.as_object_mut().unwrap().remove(key);
        let error = json_error(&doc.to_string()).to_string();
        assert!(error.contains(&format!("missing field `{key}`")), "{error}");
    }
    assert!(json_error("{}").to_string().contains("missing field"));
}

#[test]
fn guard_tripped_reads_true() {
    let stats = stats::parse(&with("/guard_tripped", serde_json::json!(true))).unwrap();
    assert!(stats.guard_tripped);
}

#[test]
fn non_numbers_in_figures_are_errors() {
    // JSON has no NaN or infinities: a server that means them must send
    // something else, and that is refused.
    for (pointer, value) in [
        ("/requests_running", serde_json::json!("NaN")),
        ("/generation_tokens_total", serde_json::json!(null)),
        ("/prompt_tokens_total", serde_json::json!("+Inf")),
        ("/kv_blocks_free", serde_json::json!(f64::MAX)),
        ("/requests/ok", serde_json::json!("NaN")),
        ("/guard_tripped", serde_json::json!("NaN")),
    ] {
        let error = json_error(&with(pointer, value.clone()));
        assert_eq!(error.classify(), Category::Data, "{pointer} = {value}");
    }
    let error =
        json_error(&STATS_OK.replace("\"requests_running\": 3", "\"requests_running\": NaN"));
    assert_eq!(error.classify(), Category::Syntax);
}

#[test]
fn extra_fields_are_ignored() {
    let mut doc: serde_json::Value = serde_json::from_str(STATS_OK).unwrap();
    doc["host_mem_available_bytes"] = serde_json::json!("NaN");
    doc["requests"]["other_thing"] = serde_json::json!([1]);
    assert_eq!(
        stats::parse(&doc.to_string()).unwrap(),
        stats::parse(STATS_OK).unwrap()
    );
}

#[test]
fn impossible_values_are_errors() {
    for (pointer, value) in [
        ("/requests_running", serde_json::json!(-1)),
        ("/kv_blocks_used", serde_json::json!(2.5)),
        ("/guard_tripped", serde_json::json!(2)),
        ("/generation_tokens_total", serde_json::json!(-3)),
    ] {
        let error = json_error(&with(pointer, value.clone()));
        assert_eq!(error.classify(), Category::Data, "{pointer} = {value}");
    }
}

#[test]
fn garbage_is_a_syntax_error_with_its_line_number() {
    let html = "<html><body>502 Bad Gateway</body></html>";
    let error = json_error(html);
    assert_eq!((error.classify(), error.line()), (Category::Syntax, 1));
    // Cut inside a line: the canned answer's 9th line is
    // `"prompt_tokens_total": 51200,`, cut after its name.
    let cut = STATS_OK.find("\"prompt_tokens_total\"").unwrap() + 21;
    let error = json_error(&STATS_OK[..cut]);
    assert_eq!((error.classify(), error.line()), (Category::Eof, 9));
    let error = json_error("{\"requests_running\": three}");
    assert_eq!(error.classify(), Category::Syntax);
    assert!(error.to_string().contains("line 1"), "{error}");
}

#[test]
fn an_answer_without_latencies_reads_as_none_yet() {
    let mut doc: serde_json::Value = serde_json::from_str(STATS_OK).unwrap();
    let object = doc.as_object_mut().unwrap();
    object.remove("ttft_seconds").unwrap();
    object.remove("itl_seconds").unwrap();
    let stats = stats::parse(&doc.to_string()).unwrap();
    assert_eq!((stats.ttft_seconds, stats.itl_seconds), (None, None));
}
