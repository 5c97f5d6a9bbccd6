//! `/health`, `/ready`, `/metrics` (Prometheus text) and `/v1/memory` (the
//! plan, the ledger and the latest host reading; the monitor reads it).

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::ServerState;

pub async fn health() -> &'static str {
    "ok"
}

/// 200 once the model is loaded and while the memory guard admits work.
pub async fn ready(State(state): State<Arc<ServerState>>) -> Response {
    let loaded = state.engine.gauges.loaded.load(Ordering::Acquire);
    let tripped = state.guard.tripped();
    let status = if loaded && !tripped {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({"ready": status == StatusCode::OK, "loaded": loaded, "memory_guard_tripped": tripped})),
    )
        .into_response()
}

pub async fn metrics(State(state): State<Arc<ServerState>>) -> Response {
    let g = &state.engine.gauges;
    let c = &state.counters;
    let e = &state.engine_counters;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in lines {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let plain = |v: u64| vec![(String::new(), v)];
    metric(
        "sparkrt_requests_total",
        "counter",
        "Requests by outcome.",
        &[
            ("{outcome=\"ok\"}".into(), c.ok.load(Ordering::Relaxed)),
            (
                "{outcome=\"error\"}".into(),
                c.error.load(Ordering::Relaxed),
            ),
            (
                "{outcome=\"rejected\"}".into(),
                c.rejected.load(Ordering::Relaxed),
            ),
        ],
    );
    metric(
        "sparkrt_requests_running",
        "gauge",
        "Sequences being served.",
        &plain(g.running.load(Ordering::Relaxed) as u64),
    );
    metric(
        "sparkrt_requests_waiting",
        "gauge",
        "Sequences queued.",
        &plain(g.waiting.load(Ordering::Relaxed) as u64),
    );
    metric(
        "sparkrt_prompt_tokens_total",
        "counter",
        "Prompt tokens processed.",
        &plain(e.prompt_tokens.load(Ordering::Relaxed)),
    );
    metric(
        "sparkrt_generation_tokens_total",
        "counter",
        "Tokens generated.",
        &plain(e.generation_tokens.load(Ordering::Relaxed)),
    );
    metric(
        "sparkrt_preemptions_total",
        "counter",
        "Sequences preempted for KV blocks.",
        &plain(e.preemptions.load(Ordering::Relaxed)),
    );
    let (used, total) = (
        g.kv_blocks_used.load(Ordering::Relaxed) as u64,
        g.kv_blocks_total.load(Ordering::Relaxed) as u64,
    );
    metric(
        "sparkrt_kv_blocks_used",
        "gauge",
        "KV cache blocks in use.",
        &plain(used),
    );
    metric(
        "sparkrt_kv_blocks_free",
        "gauge",
        "KV cache blocks free.",
        &plain(total.saturating_sub(used)),
    );
    let ledger = state.ledger.snapshot();
    let mut lines = Vec::new();
    for row in &ledger.categories {
        lines.push((
            format!("{{category=\"{}\",kind=\"planned\"}}", row.name),
            row.planned,
        ));
        lines.push((
            format!("{{category=\"{}\",kind=\"allocated\"}}", row.name),
            row.allocated,
        ));
    }
    metric(
        "sparkrt_ledger_bytes",
        "gauge",
        "Memory by plan category, planned and allocated.",
        &lines,
    );
    if let Some(info) = state.guard.latest() {
        metric(
            "sparkrt_host_mem_available_bytes",
            "gauge",
            "MemAvailable of the host.",
            &plain(info.mem_available),
        );
    }
    metric(
        "sparkrt_guard_tripped",
        "gauge",
        "1 while the memory guard refuses new work.",
        &plain(u64::from(state.guard.tripped())),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

pub async fn memory(State(state): State<Arc<ServerState>>) -> Json<Value> {
    let g = &state.engine.gauges;
    let plan = &state.plan;
    let host = state.guard.latest().map(|m| {
        json!({
            "mem_total": m.mem_total, "mem_available": m.mem_available, "mem_free": m.mem_free,
            "cached": m.cached, "buffers": m.buffers, "shmem": m.shmem,
            "swap_total": m.swap_total, "swap_free": m.swap_free,
            "kubepods_current": state.kubepods_current(), "kubepods_max": state.kubepods_max(),
            "system_reserved": plan.host.system_reserved, "kube_reserved": plan.host.kube_reserved,
            "eviction_hard": plan.host.eviction_hard,
        })
    });
    Json(json!({
        "plan": plan,
        "ledger": state.ledger.snapshot(),
        "kv": {
            "block_size_tokens": plan.kv_cache.block_size,
            "block_bytes": plan.kv_cache.block_bytes,
            "blocks_total": g.kv_blocks_total.load(Ordering::Relaxed),
            "blocks_used": g.kv_blocks_used.load(Ordering::Relaxed),
        },
        "host": host,
        "guard": state.guard.state(),
        "process_rss": crate::host::process::rss_bytes(),
    }))
}
