//! The pool panel: one bar for MemTotal, split by owner, with the eviction
//! line and the plan's usable line (the plan's headroom) on it, and the
//! eviction margin above it.

use ratatui::Frame;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::style::{level_colour, panel, segment_colour, segment_fill};
use crate::app::App;
use crate::pool::{PoolBreakdown, boundary, marker_column};
use crate::units::Units;

const EVICTION_SYMBOL: &str = "┃";
const USABLE_SYMBOL: &str = "╎";
const EVICTION_ARROW: &str = "▲";
const USABLE_ARROW: &str = "△";

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let sample = app.latest.as_ref();
    let Some(host) = sample.and_then(|s| s.host_reading()) else {
        let message = match sample.map(|s| &s.host) {
            Some(Err(error)) => format!("no host reading: {error}"),
            _ => "waiting for the first sample…".to_string(),
        };
        frame.render_widget(Paragraph::new(message).block(panel(" pool ", false)), area);
        return;
    };
    let pool = PoolBreakdown::new(host, sample.and_then(|s| s.server.as_ref()));
    let units = app.units;
    let colour = level_colour(pool.level);
    let block = panel(
        format!(" pool · MemTotal {} ", units.format(pool.mem_total)),
        false,
    )
    .border_style(Style::new().fg(colour));
    let inner = block.inner(area);
    frame.render_widget(block, area);

    let [headline, bar, markers, legend] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(2),
        Constraint::Length(2),
        Constraint::Min(0),
    ])
    .areas(inner);
    frame.render_widget(
        Paragraph::new(headline_text(&pool, host.mem_available, units)),
        headline,
    );
    let buffer = frame.buffer_mut();
    draw_bar(buffer, bar, &pool);
    draw_markers(buffer, markers, &pool, host.eviction_hard, units);
    frame.render_widget(
        Paragraph::new(legend_lines(&pool, units, legend.width)),
        legend,
    );
}

fn headline_text(pool: &PoolBreakdown, mem_available: u64, units: Units) -> Line<'static> {
    let colour = level_colour(pool.level);
    let mut spans = vec![
        Span::raw("eviction margin "),
        Span::styled(
            units.format_signed(pool.eviction_margin),
            Style::new().fg(colour).add_modifier(Modifier::BOLD),
        ),
        Span::raw(format!(" · MemAvailable {}", units.format(mem_available))),
        Span::raw(format!(" · runtime {}", units.format(pool.runtime_total))),
    ];
    if let Some(usable) = pool.usable_at {
        spans.push(Span::raw(format!(" / usable {}", units.format(usable))));
    }
    Line::from(spans)
}

/// Row one: each segment in its fill character; row two: its colour with its
/// name where it fits. Then the usable and eviction lines across both rows.
fn draw_bar(buffer: &mut Buffer, area: Rect, pool: &PoolBreakdown) {
    if area.width == 0 || area.height == 0 {
        return;
    }
    let width = area.width;
    let total = pool.mem_total;
    let mut offset = 0u64;
    for segment in &pool.segments {
        let end = offset.saturating_add(segment.bytes);
        let (first, last) = (boundary(offset, total, width), boundary(end, total, width));
        offset = end;
        let colour = segment_colour(segment.kind);
        for x in first..last {
            buffer[(area.x + x, area.y)]
                .set_symbol(segment_fill(segment.kind))
                .set_fg(colour);
            if area.height > 1 {
                buffer[(area.x + x, area.y + 1)]
                    .set_symbol(" ")
                    .set_bg(colour);
            }
        }
        let cells = usize::from(last - first);
        let label = segment.kind.label();
        if area.height > 1 && cells > label.chars().count() {
            buffer.set_stringn(
                area.x + first,
                area.y + 1,
                label,
                cells,
                Style::new().fg(Color::Black).bg(colour),
            );
        }
    }
    let mut draw_line = |offset: u64, symbol: &str, colour: Color| {
        let x = area.x + marker_column(offset, total, width);
        for y in area.y..area.y + area.height {
            buffer[(x, y)]
                .set_symbol(symbol)
                .set_fg(colour)
                .modifier
                .insert(Modifier::BOLD);
        }
    };
    if let Some(usable) = pool.usable_at {
        draw_line(usable, USABLE_SYMBOL, Color::White);
    }
    draw_line(pool.eviction_at, EVICTION_SYMBOL, Color::Red);
}

/// Under the bar: an arrow under each line, with its name and figure.
fn draw_markers(
    buffer: &mut Buffer,
    area: Rect,
    pool: &PoolBreakdown,
    eviction_hard: u64,
    units: Units,
) {
    if area.height == 0 || area.width == 0 {
        return;
    }
    let width = area.width;
    let eviction_col = marker_column(pool.eviction_at, pool.mem_total, width);
    let eviction_text = format!("eviction (evictionHard {})", units.format(eviction_hard));
    let row = Rect { height: 1, ..area };
    place_marker(
        buffer,
        row,
        eviction_col,
        EVICTION_ARROW,
        &eviction_text,
        Color::Red,
    );
    if let (Some(usable), true) = (pool.usable_at, area.height > 1) {
        let usable_col = marker_column(usable, pool.mem_total, width);
        let row = Rect {
            y: area.y + 1,
            height: 1,
            ..area
        };
        let usable_text = format!("usable {}", units.format(usable));
        place_marker(
            buffer,
            row,
            usable_col,
            USABLE_ARROW,
            &usable_text,
            Color::White,
        );
    }
}

/// Writes `arrow text` starting under `col`, or `text arrow` ending under it
/// when the first would run off the right edge.
fn place_marker(buffer: &mut Buffer, row: Rect, col: u16, arrow: &str, text: &str, colour: Color) {
    let style = Style::new().fg(colour).add_modifier(Modifier::BOLD);
    let right = format!("{arrow} {text}");
    let left = format!("{text} {arrow}");
    let length = right.chars().count() as u16;
    let width = row.width;
    if col.saturating_add(length) <= width || col + 1 < length {
        let room = usize::from(width - col);
        buffer.set_stringn(row.x + col, row.y, right, room, style);
    } else {
        buffer.set_string(row.x + col + 1 - length, row.y, left, style);
    }
}

/// One item per segment (`█ weights 60.0 GiB`), packed into lines of
/// `width` without splitting an item.
fn legend_lines(pool: &PoolBreakdown, units: Units, width: u16) -> Vec<Line<'static>> {
    const GAP: &str = "  ";
    let mut lines = Vec::new();
    let mut spans: Vec<Span> = Vec::new();
    let mut used = 0usize;
    for segment in &pool.segments {
        let text = format!(" {} {}", segment.kind.label(), units.format(segment.bytes));
        let item_width = 1 + text.chars().count();
        if used > 0 && used + GAP.len() + item_width > usize::from(width) {
            lines.push(Line::from(std::mem::take(&mut spans)));
            used = 0;
        }
        if used > 0 {
            spans.push(Span::raw(GAP));
            used += GAP.len();
        }
        spans.push(Span::styled(
            segment_fill(segment.kind),
            Style::new().fg(segment_colour(segment.kind)),
        ));
        spans.push(Span::raw(text));
        used += item_width;
    }
    lines.push(Line::from(spans));
    lines
}
