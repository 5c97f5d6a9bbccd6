//! `GET /v1/memory` parsing against the canned answer and broken ones.

use crate::common;

use common::{GIB, MEMORY_OK};
use serde_json::error::Category;
use sparkrt_tui::memory::{self, MemoryParseError};
use sparkrt_wire::{self as wire, KvState, PageCachePolicy, WeightsResidency};

/// The canned answer with one JSON value replaced (by its pointer path).
fn with(pointer: &str, value: serde_json::Value) -> String {
    let mut doc: serde_json::Value = serde_json::from_str(MEMORY_OK).unwrap();
    *doc.pointer_mut(pointer).unwrap() = value;
    doc.to_string()
}

/// The canned answer with one field removed.
fn without(parent: &str, key: &str) -> String {
    let mut doc: serde_json::Value = serde_json::from_str(MEMORY_OK).unwrap();
    doc.pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove(key);
    doc.to_string()
}

fn json_error(body: &str) -> serde_json::Error {
    match memory::parse(body) {
        Err(MemoryParseError::Json(e)) => e,
        other => panic!("expected a JSON error, got {other:?}"),
    }
}

#[test]
fn canned_answer_parses_to_its_figures() {
    let memory = memory::parse(MEMORY_OK).unwrap();
    let names: Vec<&str> = memory
        .ledger
        .categories
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "weights",
            "moe_workspace",
            "activations",
            "kv_cache",
            "runtime_overhead"
        ]
    );
    let overhead = memory.category(wire::Category::RuntimeOverhead).unwrap();
    assert_eq!((overhead.planned, overhead.allocated), (2 * GIB, GIB));
    assert_eq!(memory.ledger.page_cache_policy, PageCachePolicy::DontNeed);
    assert_eq!(
        memory.ledger.weights_residency,
        WeightsResidency::HostRegistered
    );
    assert_eq!(
        memory.kv,
        KvState {
            block_size_tokens: 16,
            block_bytes: 1 << 20,
            blocks_total: 20480,
            blocks_used: 5120,
            blocks_cached: 0,
        }
    );
    // 5120 blocks × 1 MiB = 5 GiB.
    assert_eq!(memory.kv_used_bytes(), 5 * GIB);
    // 60 + 2 + 1 + 20 + 1 GiB.
    assert_eq!(memory.runtime_allocated(), 84 * GIB);
    assert_eq!(memory.host.mem_total, 128 * GIB);
    assert_eq!(memory.host.kubepods_current, Some(6 * GIB));
    assert_eq!(memory.host.kubepods_max, None);
    assert_eq!(memory.host.eviction_hard, 16 * GIB);
    assert_eq!(
        memory.host.usable, None,
        "usable comes from the host source"
    );
    assert!(!memory.guard.tripped);
    assert_eq!(memory.guard.threshold_bytes, 18 * GIB);
    assert_eq!(memory.process_rss, 62 * GIB);
    assert_eq!(memory.plan["model"], "qwen3-moe-demo");
}

#[test]
fn extra_fields_are_ignored() {
    let mut doc: serde_json::Value = serde_json::from_str(MEMORY_OK).unwrap();
    doc["guard"]["extra"] = serde_json::json!({"anything": [1, 2]});
    doc["new_section"] = serde_json::json!(7);
    let body = doc.to_string();
    assert!(memory::parse(&body).is_ok());
}

#[test]
fn truncated_json_is_an_error() {
    for cut in [0, 1, MEMORY_OK.len() / 2, MEMORY_OK.len() - 3] {
        let error = json_error(&MEMORY_OK[..cut]);
        assert_eq!(error.classify(), Category::Eof, "cut at {cut}: {error}");
    }
}

#[test]
fn not_json_at_all_is_an_error() {
    let error = json_error("<html><body>502 Bad Gateway</body></html>");
    assert_eq!(error.classify(), Category::Syntax);
    let error = json_error("\u{0}\u{1}binary");
    assert_eq!(error.classify(), Category::Syntax);
}

#[test]
fn wrong_types_are_errors() {
    let cases = [
        ("/ledger/categories/0/planned", serde_json::json!("60GiB")),
        ("/ledger/categories/0/allocated", serde_json::json!(-1)),
        ("/ledger/categories/0/allocated", serde_json::json!(1.5)),
        ("/kv/blocks_used", serde_json::json!(null)),
        ("/host/mem_total", serde_json::json!(true)),
        ("/host/kubepods_current", serde_json::json!("6Gi")),
        ("/guard/tripped", serde_json::json!(0)),
        ("/ledger/categories", serde_json::json!({"weights": 1})),
        ("/ledger/weights_residency", serde_json::json!("swapped")),
        ("/ledger/page_cache_policy", serde_json::json!(3)),
    ];
    for (pointer, value) in cases {
        let error = json_error(&with(pointer, value.clone()));
        // serde_json calls a number where an enum's string is due a syntax
        // error, the rest data errors; either way the answer is refused.
        assert!(
            matches!(error.classify(), Category::Data | Category::Syntax),
            "{pointer} = {value}: {error}"
        );
    }
}

#[test]
fn missing_fields_are_errors_that_name_them() {
    let cases = [
        ("", "ledger"),
        ("", "kv"),
        ("", "host"),
        ("", "guard"),
        ("", "process_rss"),
        ("/kv", "block_bytes"),
        ("/host", "eviction_hard"),
        ("/guard", "resume_bytes"),
        ("/ledger", "weights_residency"),
    ];
    for (parent, key) in cases {
        let error = json_error(&without(parent, key)).to_string();
        assert!(
            error.contains(&format!("missing field `{key}`")),
            "{parent}/{key}: {error}"
        );
    }
}

#[test]
fn absent_plan_and_null_kubepods_are_fine() {
    let memory = memory::parse(&without("", "plan")).unwrap();
    assert!(memory.plan.is_null());
    let memory = memory::parse(&without("/host", "kubepods_current")).unwrap();
    assert_eq!(memory.host.kubepods_current, None);
}

#[test]
fn impossible_figures_are_errors() {
    let body = with("/kv/blocks_used", serde_json::json!(20481));
    assert!(matches!(
        memory::parse(&body),
        Err(MemoryParseError::KvOverfull {
            used: 20481,
            total: 20480
        })
    ));
    let body = with("/host/mem_available", serde_json::json!(129 * GIB));
    assert!(matches!(
        memory::parse(&body),
        Err(MemoryParseError::AvailableAboveTotal { .. })
    ));
}

#[test]
fn the_canned_answer_is_exactly_what_the_wire_type_writes() {
    // Parsed and written back, nothing is lost or added: the fixture has the
    // shape the server serializes (the server builds the same type).
    let recorded: serde_json::Value = serde_json::from_str(MEMORY_OK).unwrap();
    let written = serde_json::to_value(memory::parse(MEMORY_OK).unwrap()).unwrap();
    assert_eq!(written, recorded);
}
