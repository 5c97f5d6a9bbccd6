//! The history chart: MemAvailable and the runtime's total over the last
//! minutes, with the eviction threshold as a flat line.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Chart, Dataset, GraphType, Paragraph};

use super::style::{dim, panel};
use crate::app::App;

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let window = app.history.window().as_secs_f64();
    // The series are named in the title: the chart's own legend would cover
    // the lines in a panel this low.
    let title = Line::from(vec![
        Span::raw(format!(
            " history · last {} min · ",
            (window / 60.0).round()
        )),
        Span::styled("MemAvailable", Style::new().fg(Color::Green)),
        Span::raw(" · "),
        Span::styled("runtime", Style::new().fg(Color::Cyan)),
        Span::raw(" · "),
        Span::styled("evictionHard", Style::new().fg(Color::Red)),
        Span::raw(" "),
    ]);
    let host = app.latest.as_ref().and_then(|s| s.host_reading());
    let Some(host) = host.filter(|_| app.history.latest().is_some()) else {
        frame.render_widget(
            Paragraph::new("waiting for samples…")
                .style(dim())
                .block(panel(title, false)),
            area,
        );
        return;
    };
    let units = app.units;
    // Plotted in bytes; only the axis label is scaled, by the shared rule.
    let in_units = |bytes: u64| bytes as f64;
    let available = app.history.series(|p| in_units(p.mem_available));
    let runtime = app.history.series(|p| in_units(p.runtime_total));
    let eviction = [
        (-window, in_units(host.eviction_hard)),
        (0.0, in_units(host.eviction_hard)),
    ];
    let datasets = vec![
        Dataset::default()
            .name("MemAvailable")
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(Style::new().fg(Color::Green))
            .data(&available),
        Dataset::default()
            .name("runtime")
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(Style::new().fg(Color::Cyan))
            .data(&runtime),
        Dataset::default()
            .name("eviction")
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(Style::new().fg(Color::Red))
            .data(&eviction),
    ];
    let top = in_units(host.mem_total);
    let chart = Chart::new(datasets)
        .block(panel(title, false))
        .legend_position(None)
        .x_axis(
            Axis::default()
                .bounds([-window, 0.0])
                .labels([format!("-{}s", window.round()), "now".to_string()])
                .style(dim()),
        )
        .y_axis(
            Axis::default()
                .bounds([0.0, top.max(f64::MIN_POSITIVE)])
                .labels(["0".to_string(), units.format(host.mem_total)])
                .style(dim()),
        );
    frame.render_widget(chart, area);
}
