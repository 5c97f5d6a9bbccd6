//! The ledger panel: per category, what the plan set aside and what is held.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use sparkrt_wire::WeightsResidency;

use super::style::{bold, dim, panel};
use crate::app::App;
use crate::units::Units;

/// Below this width the headers are abbreviated.
const NARROW: u16 = 44;

pub fn render(frame: &mut Frame, area: Rect, app: &App, focused: bool) {
    // Each figure carries its own unit (`23.1 MiB`, `1.40 GiB`): at most
    // eight characters, so the columns stay narrow.
    let title = format!(" ledger · sort: {} ", app.ledger_sort.label());
    let block = panel(title, focused);
    let Some(memory) = app.latest.as_ref().and_then(|s| s.server.as_ref()) else {
        frame.render_widget(
            Paragraph::new("no server: host panels only")
                .style(dim())
                .block(block),
            area,
        );
        return;
    };
    let units = app.units;
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [table_area, notes_area] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(2)]).areas(inner);

    let entries = app.sorted_ledger();
    let (planned, allocated) = entries.iter().fold((0u64, 0u64), |(p, a), e| {
        (p.saturating_add(e.planned), a.saturating_add(e.allocated))
    });
    let mut rows: Vec<Row> = entries
        .iter()
        .map(|e| figures_row(e.name.clone(), e.planned, e.allocated, units))
        .collect();
    rows.push(figures_row("total".to_string(), planned, allocated, units).style(bold()));
    // Narrow panels squeeze the figure columns; short headers still fit.
    let (planned_header, allocated_header) = if table_area.width < NARROW {
        ("plan", "alloc")
    } else {
        ("planned", "allocated")
    };
    let header = Row::new([
        Cell::from("category"),
        numeric(planned_header.to_string()),
        numeric(allocated_header.to_string()),
        numeric("%".to_string()),
    ])
    .style(bold());
    let widths = [
        Constraint::Min(12),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(4),
    ];
    frame.render_widget(Table::new(rows, widths).header(header), table_area);

    let notes = vec![
        Line::raw(format!(
            "page cache: {} · weights: {}",
            memory.ledger.page_cache_policy.name(),
            residency_name(memory.ledger.weights_residency)
        )),
        Line::raw(format!("server RSS {}", units.format(memory.process_rss))),
    ];
    let mut notes = notes;
    if let Some(loading) = &memory.loading {
        // Measured (mincore), so a page evicted under pressure shows here.
        notes.push(Line::raw(format!(
            "weights in page cache {:.1}% ({} of {})",
            100.0 * loading.resident_fraction(),
            units.format(loading.resident_bytes),
            units.format(loading.mapped_bytes)
        )));
    }
    frame.render_widget(Paragraph::new(notes).style(dim()), notes_area);
}

fn figures_row(name: String, planned: u64, allocated: u64, units: Units) -> Row<'static> {
    let share = if planned > 0 {
        format!("{:.0}", 100.0 * allocated as f64 / planned as f64)
    } else {
        "–".to_string()
    };
    Row::new([
        Cell::from(name),
        numeric(units.format(planned)),
        numeric(units.format(allocated)),
        numeric(share),
    ])
}

fn numeric(text: String) -> Cell<'static> {
    Cell::from(Line::from(text).right_aligned())
}

/// In words, for people (the wire names have underscores).
fn residency_name(residency: WeightsResidency) -> &'static str {
    match residency {
        WeightsResidency::Mapped => "mapped",
        WeightsResidency::HostRegistered => "host registered",
        WeightsResidency::DeviceCopy => "device copy",
    }
}
