//! The top line: server state, sampling interval, units, pause, help hint.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::style::{bold, dim};
use crate::app::App;
use crate::link::ServerLink;

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let mut spans = vec![
        Span::styled("sparkrt top", bold()),
        Span::styled(" │ ", dim()),
    ];
    match app.latest.as_ref().map(|s| &s.link) {
        None => spans.push(Span::styled("waiting for the first sample", dim())),
        Some(ServerLink::Connected { reconnects }) => {
            let word = if *reconnects > 0 {
                "server: reconnected"
            } else {
                "server: connected"
            };
            spans.push(Span::styled(word, Style::new().fg(Color::Green)));
            spans.push(Span::raw(format!(" {}", app.server_url)));
            if let Some(loading) = app.latest.as_ref().and_then(|s| s.loading.as_ref()) {
                spans.push(Span::styled(" │ ", dim()));
                spans.push(Span::styled(
                    loading.reason(),
                    Style::new().fg(Color::Yellow),
                ));
            }
        }
        Some(ServerLink::Disconnected { reason }) => {
            spans.push(Span::styled(
                "server: disconnected",
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
            ));
            spans.push(Span::styled(format!(" ({reason})"), dim()));
        }
    }
    spans.push(Span::styled(" │ ", dim()));
    spans.push(Span::raw(format!(
        "every {}ms │ {}",
        app.interval.as_millis(),
        app.units.name()
    )));
    if app.paused {
        spans.push(Span::styled(" │ ", dim()));
        spans.push(Span::styled(
            "PAUSED",
            Style::new().fg(Color::Black).bg(Color::Yellow),
        ));
    }
    spans.push(Span::styled(" │ ? help", dim()));
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}
