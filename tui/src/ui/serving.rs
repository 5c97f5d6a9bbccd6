//! The serving panel: requests, token rates, KV blocks and the guard, from
//! `/v1/stats` (and the guard's thresholds from `/v1/memory`).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use sparkrt_wire::Percentiles;

use super::style::{dim, panel};
use crate::app::App;
use crate::units::Units;

fn rate(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_string(), |v| format!("{v:.1}"))
}

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let block = panel(" serving ", false);
    let Some(sample) = app.latest.as_ref().filter(|s| s.server.is_some()) else {
        frame.render_widget(
            Paragraph::new("no server: host panels only")
                .style(dim())
                .block(block),
            area,
        );
        return;
    };
    let mut lines = Vec::new();
    match &sample.stats {
        Some(Ok(m)) => {
            lines.push(Line::raw(format!(
                "requests  running {} · queued {}",
                m.requests_running, m.requests_waiting
            )));
            lines.push(Line::raw(format!(
                "tokens/s  gen {} · prompt {}",
                rate(sample.generation_tokens_per_s),
                rate(sample.prompt_tokens_per_s)
            )));
            if m.spec_decode_num_draft_tokens_total > 0 {
                lines.push(Line::raw(drafts_line(
                    m.spec_decode_num_drafts_total,
                    m.spec_decode_num_draft_tokens_total,
                    m.spec_decode_num_accepted_tokens_total,
                )));
            }
            lines.push(Line::raw(kv_line(
                m.kv_blocks_used,
                m.kv_blocks_cached,
                m.kv_blocks_free,
            )));
            // Hybrid models: the prefix cache's recurrent-state snapshots
            // held, of the plan's snapshot slots (the one plan figure the
            // monitor reads).
            let snapshot_slots = sample
                .server
                .as_ref()
                .and_then(|memory| memory.plan["recurrent_state"]["snapshot_slots"].as_u64())
                .unwrap_or(0);
            if snapshot_slots > 0 {
                lines.push(Line::raw(format!(
                    "state     snapshots {} / {snapshot_slots}",
                    m.state_snapshots_cached
                )));
            }
            lines.push(Line::raw(format!(
                "latency   ttft {} · itl {}",
                percentiles(m.ttft_seconds),
                percentiles(m.itl_seconds)
            )));
            lines.push(Line::raw(format!(
                "done      ok {} · error {} · rejected {} · cancelled {}",
                m.requests.ok, m.requests.error, m.requests.rejected, m.requests.cancelled
            )));
        }
        Some(Err(error)) => {
            lines.push(Line::styled(
                format!("stats: {error}"),
                Style::new().fg(Color::Red),
            ));
        }
        None => {}
    }
    if let Some(memory) = &sample.server {
        let tripped = sample
            .serving()
            .map_or(memory.guard.tripped, |m| m.guard_tripped);
        lines.push(guard_line(
            tripped,
            memory.guard.threshold_bytes,
            memory.guard.resume_bytes,
            app.units,
        ));
        if let Some(line) = hidden_line(&memory.guard, app.units) {
            lines.push(line);
        }
    }
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: true }).block(block),
        area,
    );
}

/// `p50 120ms p99 750ms`, or a dash before the server has a sample.
fn percentiles(p: Option<Percentiles>) -> String {
    p.map_or_else(
        || "–".to_string(),
        |p| format!("p50 {} p99 {}", millis(p.p50), millis(p.p99)),
    )
}

fn millis(seconds: f64) -> String {
    let ms = seconds * 1000.0;
    if ms < 10.0 {
        format!("{ms:.1}ms")
    } else {
        format!("{ms:.0}ms")
    }
}

/// Speculative decoding since the server started: drafts kept of those
/// verified, and tokens per drafting step (1 + kept ÷ drafting steps).
fn drafts_line(steps: u64, drafted: u64, kept: u64) -> String {
    let share = 100.0 * kept as f64 / drafted.max(1) as f64;
    let per_step = 1.0 + kept as f64 / steps.max(1) as f64;
    format!("drafts    kept {kept} of {drafted} ({share:.0}%) · {per_step:.2} tok/step")
}

fn kv_line(used: u64, cached: u64, free: u64) -> String {
    let total = used.saturating_add(cached).saturating_add(free);
    let share = if total > 0 {
        format!(" ({:.0}%)", 100.0 * used as f64 / total as f64)
    } else {
        String::new()
    };
    format!("kv blocks used {used} · cached {cached} · free {free}{share}")
}

/// What the host's figures miss and the guard adds back (a GB10's pinned
/// weights and driver allocations); nothing where nothing is hidden.
fn hidden_line(guard: &sparkrt_wire::GuardState, units: Units) -> Option<Line<'static>> {
    let (pinned, driver) = (guard.pinned_weights_bytes, guard.driver_allocations_bytes);
    if pinned == 0 && driver == 0 {
        return None;
    }
    let mut parts = Vec::new();
    if pinned > 0 {
        parts.push(format!("pinned weights {}", units.format(pinned)));
    }
    if driver > 0 {
        parts.push(format!("driver allocs {}", units.format(driver)));
    }
    Some(Line::from(vec![
        Span::raw("hidden    "),
        Span::raw(parts.join(" · ")),
    ]))
}

fn guard_line(tripped: bool, threshold: u64, resume: u64, units: Units) -> Line<'static> {
    let state = if tripped {
        Span::styled(
            "TRIPPED (refusing work)",
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        )
    } else {
        Span::styled("ok", Style::new().fg(Color::Green))
    };
    Line::from(vec![
        Span::raw("guard     "),
        state,
        Span::styled(
            format!(
                " · trips < {} · resumes > {}",
                units.format(threshold),
                units.format(resume)
            ),
            dim(),
        ),
    ])
}
