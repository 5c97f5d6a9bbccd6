//! Colours and the panel frame shared by every panel.

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::Block;

use crate::pool::{MarginLevel, SegmentKind};

pub fn panel<'a>(title: impl Into<Line<'a>>, focused: bool) -> Block<'a> {
    let border = if focused {
        Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD)
    } else {
        Style::new().fg(Color::DarkGray)
    };
    Block::bordered().title(title).border_style(border)
}

pub fn level_colour(level: MarginLevel) -> Color {
    match level {
        MarginLevel::Comfortable => Color::Green,
        MarginLevel::Warning => Color::Yellow,
        MarginLevel::Critical => Color::Red,
    }
}

/// Yellow and red are kept for the eviction margin warning, so no segment uses them.
pub fn segment_colour(kind: SegmentKind) -> Color {
    match kind {
        SegmentKind::Weights => Color::Blue,
        SegmentKind::MoeWorkspace => Color::Magenta,
        SegmentKind::KvUsed => Color::Cyan,
        SegmentKind::KvFree => Color::LightCyan,
        SegmentKind::RecurrentState => Color::LightYellow,
        SegmentKind::Activations => Color::LightMagenta,
        SegmentKind::Overhead => Color::LightBlue,
        SegmentKind::OtherProcesses => Color::Gray,
        SegmentKind::PageCache => Color::Green,
        SegmentKind::Free => Color::DarkGray,
    }
}

/// The character a segment is filled with, so the bar reads in plain text
/// too (tmux capture, monochrome terminals): runtime solid, then lighter.
pub fn segment_fill(kind: SegmentKind) -> &'static str {
    match kind {
        SegmentKind::OtherProcesses => "▓",
        SegmentKind::PageCache => "▒",
        SegmentKind::Free => "░",
        _ => "█",
    }
}

pub fn dim() -> Style {
    Style::new().fg(Color::DarkGray)
}

pub fn bold() -> Style {
    Style::new().add_modifier(Modifier::BOLD)
}
