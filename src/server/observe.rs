//! `/health`, `/ready`, `/metrics` (Prometheus text), and the typed JSON the
//! monitor reads: `/v1/stats` (the serving gauges) and `/v1/memory` (the
//! plan, the ledger and the latest host reading). The JSON types are
//! `sparkrt_wire`'s, shared with the monitor.

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sparkrt_wire::{
    self as wire, HostSnapshot, KvState, MemoryReport, Percentiles, RequestOutcomes, ServingStats,
    WeightsResidency,
};

use super::errors::ApiError;
use super::loading::health_answer;
use super::state::ServerState;
use crate::plan::ledger::LedgerSnapshot;

/// `{"status": "ok", "loading": …}`, or 503 with the reason once the engine
/// thread has died (a liveness probe then restarts the server).
pub async fn health(State(state): State<Arc<ServerState>>) -> Response {
    health_answer(
        state.config.loading.report(),
        state.config.engine.gauges.failure(),
    )
}

/// `/version`, as vLLM answers it: `{"version": "…"}`, sparkrt's.
pub async fn version() -> Json<serde_json::Value> {
    Json(serde_json::json!({"version": env!("CARGO_PKG_VERSION")}))
}

/// The answer of `/ready`.
#[derive(Serialize)]
struct Readiness {
    ready: bool,
    loaded: bool,
    memory_guard_tripped: bool,
    /// Why it is not ready (absent when it is).
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// Why the engine thread ended (absent while it runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    engine_failure: Option<String>,
}

/// 200 once the model is loaded and while the memory guard admits work.
pub async fn ready(State(state): State<Arc<ServerState>>) -> Response {
    let loaded = state.config.engine.gauges.loaded.load(Ordering::Acquire);
    let tripped = state.config.guard.tripped();
    let ready = loaded && !tripped;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let engine_failure = state.config.engine.gauges.failure();
    let reason = if ready {
        None
    } else if let Some(why) = &engine_failure {
        Some(why.clone())
    } else if !loaded {
        Some(state.config.loading.report().reason())
    } else {
        state.config.guard.state().reason
    };
    let body = Readiness {
        ready,
        loaded,
        memory_guard_tripped: tripped,
        reason,
        engine_failure,
    };
    (status, Json(body)).into_response()
}

/// The serving figures at this instant; `/v1/stats` and `/metrics` both
/// answer from it.
fn serving_stats(state: &ServerState) -> ServingStats {
    let g = &state.config.engine.gauges;
    let c = &state.counters;
    let e = &state.config.engine_counters;
    let kv_used = g.kv_blocks_used.load(Ordering::Relaxed) as u64;
    let kv_total = g.kv_blocks_total.load(Ordering::Relaxed) as u64;
    let kv_cached = g.kv_blocks_cached.load(Ordering::Relaxed) as u64;
    let recent = state.latency.recent();
    let percentiles = |p: Option<(f64, f64)>| p.map(|(p50, p99)| Percentiles { p50, p99 });
    ServingStats {
        requests: RequestOutcomes {
            ok: c.ok.load(Ordering::Relaxed),
            error: c.client_error.load(Ordering::Relaxed) + c.server_error.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
        },
        requests_running: g.running.load(Ordering::Relaxed) as u64,
        requests_waiting: g.waiting.load(Ordering::Relaxed) as u64,
        prompt_tokens_total: e.prompt_tokens.load(Ordering::Relaxed),
        generation_tokens_total: e.generation_tokens.load(Ordering::Relaxed),
        preemptions_total: e.preemptions.load(Ordering::Relaxed),
        kv_blocks_used: kv_used,
        kv_blocks_free: kv_total.saturating_sub(kv_used + kv_cached),
        kv_blocks_cached: kv_cached,
        prefix_cache_queries_total: e.prefix_cache_queries.load(Ordering::Relaxed),
        prefix_cache_hits_total: e.prefix_cache_hits.load(Ordering::Relaxed),
        state_snapshots_cached: g.state_snapshots_cached.load(Ordering::Relaxed) as u64,
        state_snapshots_taken_total: e.state_snapshots_taken.load(Ordering::Relaxed),
        spec_decode_num_drafts_total: e.spec_drafts.load(Ordering::Relaxed),
        spec_decode_num_draft_tokens_total: e.spec_draft_tokens.load(Ordering::Relaxed),
        spec_decode_num_accepted_tokens_total: e.spec_accepted_tokens.load(Ordering::Relaxed),
        spec_decode_num_accepted_tokens_per_pos: std::array::from_fn(|j| {
            e.spec_accepted_per_position[j].load(Ordering::Relaxed)
        }),
        guard_tripped: state.config.guard.tripped(),
        ttft_seconds: percentiles(recent.ttft),
        itl_seconds: percentiles(recent.itl),
    }
}

pub async fn stats(State(state): State<Arc<ServerState>>) -> Json<ServingStats> {
    Json(serving_stats(&state))
}

pub async fn metrics(State(state): State<Arc<ServerState>>) -> Response {
    let stats = serving_stats(&state);
    let c = &state.counters;
    let count = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    let mut out = String::new();
    // Every sample carries vLLM's `model_name` label (its dashboards filter
    // on it); a family's own labels follow it.
    let model = format!("model_name=\"{}\"", label_value(&state.config.model_name));
    let with_model = |labels: &str| match labels.strip_prefix('{') {
        Some(rest) => format!("{{{model},{rest}"),
        None => format!("{{{model}}}"),
    };
    let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in lines {
            let _ = writeln!(out, "{name}{} {value}", with_model(labels));
        }
    };
    let plain = |v: u64| vec![(String::new(), v)];
    metric(
        "sparkrt_requests_total",
        "counter",
        "Requests to the generation routes by outcome: ok, 4xx, 5xx (or failed mid-stream), rejected (429/503 for capacity), cancelled.",
        &[
            ("{outcome=\"ok\"}".into(), stats.requests.ok),
            ("{outcome=\"4xx\"}".into(), count(&c.client_error)),
            ("{outcome=\"5xx\"}".into(), count(&c.server_error)),
            ("{outcome=\"rejected\"}".into(), stats.requests.rejected),
            ("{outcome=\"cancelled\"}".into(), stats.requests.cancelled),
        ],
    );
    metric(
        "sparkrt_requests_running",
        "gauge",
        "Sequences being served.",
        &plain(stats.requests_running),
    );
    metric(
        "sparkrt_requests_waiting",
        "gauge",
        "Sequences queued.",
        &plain(stats.requests_waiting),
    );
    metric(
        "sparkrt_prompt_tokens_total",
        "counter",
        "Prompt tokens processed.",
        &plain(stats.prompt_tokens_total),
    );
    metric(
        "sparkrt_generation_tokens_total",
        "counter",
        "Tokens generated.",
        &plain(stats.generation_tokens_total),
    );
    metric(
        "sparkrt_preemptions_total",
        "counter",
        "Sequences preempted for KV blocks.",
        &plain(stats.preemptions_total),
    );
    metric(
        "sparkrt_kv_blocks_used",
        "gauge",
        "KV cache blocks in use.",
        &plain(stats.kv_blocks_used),
    );
    let kv_total = stats.kv_blocks_used + stats.kv_blocks_free + stats.kv_blocks_cached;
    let usage = if kv_total == 0 {
        0.0
    } else {
        stats.kv_blocks_used as f64 / kv_total as f64
    };
    let _ = writeln!(
        out,
        "# HELP sparkrt_kv_cache_usage_perc KV cache blocks in use over all blocks (vLLM's kv_cache_usage_perc: a fraction, 1 is full; cached blocks count as free).\n\
         # TYPE sparkrt_kv_cache_usage_perc gauge\n\
         sparkrt_kv_cache_usage_perc{{{model}}} {usage}"
    );
    let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in lines {
            let _ = writeln!(out, "{name}{} {value}", with_model(labels));
        }
    };
    metric(
        "sparkrt_kv_blocks_free",
        "gauge",
        "KV cache blocks free (neither used nor cached).",
        &plain(stats.kv_blocks_free),
    );
    metric(
        "sparkrt_kv_blocks_cached",
        "gauge",
        "KV cache blocks no sequence uses, kept by the prefix cache (reclaimable).",
        &plain(stats.kv_blocks_cached),
    );
    metric(
        "sparkrt_prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        &plain(stats.prefix_cache_queries_total),
    );
    metric(
        "sparkrt_prefix_cache_hits_total",
        "counter",
        "Prompt tokens served from the prefix cache (not recomputed).",
        &plain(stats.prefix_cache_hits_total),
    );
    metric(
        "sparkrt_state_snapshots_cached",
        "gauge",
        "Hybrid models: recurrent-state snapshots the prefix cache holds.",
        &plain(stats.state_snapshots_cached),
    );
    metric(
        "sparkrt_state_snapshots_taken_total",
        "counter",
        "Hybrid models: recurrent-state snapshots written for the prefix cache.",
        &plain(stats.state_snapshots_taken_total),
    );
    metric(
        "sparkrt_spec_decode_num_drafts_total",
        "counter",
        "Speculative decoding: steps of a sequence that carried draft tokens.",
        &plain(stats.spec_decode_num_drafts_total),
    );
    metric(
        "sparkrt_spec_decode_num_draft_tokens_total",
        "counter",
        "Speculative decoding: draft tokens verified.",
        &plain(stats.spec_decode_num_draft_tokens_total),
    );
    metric(
        "sparkrt_spec_decode_num_accepted_tokens_total",
        "counter",
        "Speculative decoding: draft tokens kept (equal to what the target drew).",
        &plain(stats.spec_decode_num_accepted_tokens_total),
    );
    let drafted = state
        .config
        .limits
        .speculative
        .map_or(0, |c| c.num_speculative_tokens);
    let per_position: Vec<(String, u64)> = stats.spec_decode_num_accepted_tokens_per_pos[..drafted]
        .iter()
        .enumerate()
        .map(|(j, &n)| (format!("{{position=\"{j}\"}}"), n))
        .collect();
    metric(
        "sparkrt_spec_decode_num_accepted_tokens_per_pos",
        "counter",
        "Speculative decoding: draft tokens kept at each draft position (0: the first).",
        &per_position,
    );
    let ledger = state.config.ledger.snapshot();
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
    if let Some(info) = state.config.guard.latest() {
        metric(
            "sparkrt_host_mem_available_bytes",
            "gauge",
            "MemAvailable of the host.",
            &plain(info.mem_available),
        );
    }
    let plan_host = &state.config.plan.host;
    metric(
        "sparkrt_guard_threshold_bytes",
        "gauge",
        "MemAvailable below which the memory guard refuses new work: the eviction threshold plus the safety margin.",
        &plain(crate::plan::memory::guard_threshold(
            plan_host.eviction_hard,
            plan_host.safety_margin,
        )),
    );
    metric(
        "sparkrt_guard_tripped",
        "gauge",
        "1 while the memory guard refuses new work.",
        &plain(u64::from(stats.guard_tripped)),
    );
    state.latency.encode(&mut out);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// A Prometheus label value: `\\`, `"` and newlines escaped (text format 0.0.4).
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `/v1/memory`. 503 while the guard has no host reading (it reads once
/// before the server listens, so only an unreadable `/proc/meminfo` gets it).
pub async fn memory(State(state): State<Arc<ServerState>>) -> Result<Response, ApiError> {
    let plan = &state.config.plan;
    let host = host_snapshot(&state).ok_or_else(|| {
        ApiError::internal("the memory guard has no host reading yet")
            .with_status(StatusCode::SERVICE_UNAVAILABLE)
    })?;
    let g = &state.config.engine.gauges;
    let kv = KvState {
        block_size_tokens: plan.kv_cache.block_size as u64,
        block_bytes: plan.kv_cache.block_bytes,
        blocks_total: g.kv_blocks_total.load(Ordering::Relaxed) as u64,
        blocks_used: g.kv_blocks_used.load(Ordering::Relaxed) as u64,
        blocks_cached: g.kv_blocks_cached.load(Ordering::Relaxed) as u64,
    };
    let report = MemoryReport {
        plan,
        ledger: ledger_report(state.config.ledger.snapshot()),
        kv,
        host,
        guard: state.config.guard.state(),
        process_rss: crate::host::process::rss_bytes(),
        loading: Some(state.config.loading.report()),
    };
    // Serialized here, while `report` can still borrow the plan.
    Ok(Json(report).into_response())
}

/// The guard's latest reading with the cgroup and the plan's kubelet figures.
fn host_snapshot(state: &ServerState) -> Option<HostSnapshot> {
    let m = state.config.guard.latest()?;
    let plan_host = &state.config.plan.host;
    Some(m.to_wire(
        state.kubepods().as_ref(),
        [
            plan_host.system_reserved,
            plan_host.kube_reserved,
            plan_host.eviction_hard,
        ],
    ))
}

fn ledger_report(snapshot: LedgerSnapshot) -> wire::Ledger {
    wire::Ledger {
        categories: snapshot
            .categories
            .into_iter()
            .map(|row| wire::LedgerEntry {
                name: row.name.to_string(),
                planned: row.planned,
                allocated: row.allocated,
            })
            .collect(),
        page_cache_policy: snapshot.page_cache_policy,
        // Until a backend records otherwise the weights are read where the
        // checkpoint is mapped (the server only listens once it has).
        weights_residency: snapshot
            .weights_residency
            .unwrap_or(WeightsResidency::Mapped),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::checkpoint::load::LoadProgress;
    use crate::server::loading::health_answer;
    use sparkrt_wire::{HealthReport, LoadPhase};

    async fn health_of(response: Response) -> (StatusCode, HealthReport) {
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn health_reports_loading_then_ok_then_a_dead_engine() {
        let progress = LoadProgress::new();
        progress.begin(LoadPhase::Reading, 100);
        progress.advance(40);
        let (status, loading) = health_of(health_answer(progress.report(), None)).await;
        assert_eq!(status, StatusCode::OK, "alive while loading");
        assert_eq!(loading.status, "loading");
        assert_eq!(loading.loading.done_bytes, 40);
        progress.begin(LoadPhase::Ready, 0);
        let (status, ok) = health_of(health_answer(progress.report(), None)).await;
        assert_eq!((status, ok.status.as_str()), (StatusCode::OK, "ok"));
        let dead = health_answer(
            progress.report(),
            Some("engine thread panicked: boom".into()),
        );
        let (status, dead) = health_of(dead).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(dead.status, "failed");
        assert_eq!(dead.reason.as_deref(), Some("engine thread panicked: boom"));
    }
}
