//! The `?` overlay: what each key does.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Clear, Paragraph};

use super::style::panel;

const KEYS: [(&str, &str); 7] = [
    ("q", "quit"),
    ("p", "pause / resume sampling"),
    ("tab", "focus ledger / processes"),
    ("s", "sort the focused table"),
    ("u", "units: GiB (2^30) / GB (10^9)"),
    ("?", "this help"),
    ("esc", "close help"),
];

pub fn render(frame: &mut Frame) {
    let width = 44;
    let height = KEYS.len() as u16 + 2;
    let area: Rect = frame
        .area()
        .centered(Constraint::Length(width), Constraint::Length(height));
    let lines: Vec<Line> = KEYS
        .iter()
        .map(|(key, what)| Line::raw(format!(" {key:<5} {what}")))
        .collect();
    frame.render_widget(Clear, area);
    frame.render_widget(Paragraph::new(lines).block(panel(" keys ", true)), area);
}
