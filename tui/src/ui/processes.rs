//! The process panel: the largest processes by RSS (and GPU memory where the
//! host source reports it).

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::widgets::{Row, Table};

use super::style::{bold, panel};
use crate::app::App;

pub fn render(frame: &mut Frame, area: Rect, app: &App, focused: bool) {
    let title = format!(" processes · sort: {} ", app.process_sort.label());
    let units = app.units;
    let rows: Vec<Row> = app
        .sorted_processes()
        .into_iter()
        .map(|p| {
            Row::new([
                p.pid.to_string(),
                p.name,
                units.format(p.rss),
                p.gpu_bytes
                    .map_or_else(|| "–".to_string(), |g| units.format(g)),
            ])
        })
        .collect();
    let header = Row::new(["pid", "name", "rss", "gpu"]).style(bold());
    let widths = [
        Constraint::Length(8),
        Constraint::Min(12),
        Constraint::Length(11),
        Constraint::Length(11),
    ];
    frame.render_widget(
        Table::new(rows, widths)
            .header(header)
            .block(panel(title, focused)),
        area,
    );
}
