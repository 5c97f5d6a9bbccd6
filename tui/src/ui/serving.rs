//! The serving panel: requests, token rates, KV blocks and the guard, from
//! `/metrics` (and the guard's thresholds from `/v1/memory`).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};

use super::style::{dim, panel};
use crate::app::App;
use crate::units::Units;

fn count<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "–".to_string(), |v| v.to_string())
}

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
    match &sample.metrics {
        Some(Ok(m)) => {
            lines.push(Line::raw(format!(
                "requests  running {} · queued {}",
                count(m.requests_running),
                count(m.requests_waiting)
            )));
            lines.push(Line::raw(format!(
                "tokens/s  gen {} · prompt {}",
                rate(sample.generation_tokens_per_s),
                rate(sample.prompt_tokens_per_s)
            )));
            lines.push(Line::raw(kv_line(m.kv_blocks_used, m.kv_blocks_free)));
            lines.push(Line::raw(format!(
                "done      ok {} · error {} · rejected {}",
                count(m.requests_ok),
                count(m.requests_error),
                count(m.requests_rejected)
            )));
        }
        Some(Err(error)) => {
            lines.push(Line::styled(
                format!("metrics: {error}"),
                Style::new().fg(Color::Red),
            ));
        }
        None => {}
    }
    if let Some(memory) = &sample.server {
        let tripped = sample
            .serving()
            .and_then(|m| m.guard_tripped)
            .unwrap_or(memory.guard.tripped);
        lines.push(guard_line(
            tripped,
            memory.guard.threshold_bytes,
            memory.guard.resume_bytes,
            app.units,
        ));
    }
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: true }).block(block),
        area,
    );
}

fn kv_line(used: Option<u64>, free: Option<u64>) -> String {
    let share = match (used, free) {
        (Some(u), Some(f)) if u + f > 0 => format!(" ({:.0}%)", 100.0 * u as f64 / (u + f) as f64),
        _ => String::new(),
    };
    format!(
        "kv blocks used {} · free {}{share}",
        count(used),
        count(free)
    )
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
