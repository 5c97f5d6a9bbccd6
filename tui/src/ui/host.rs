//! The host panel: meminfo, swap, the kubelet's reservations and eviction
//! threshold, the kubepods cgroup.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::Paragraph;

use sparkrt_wire::HostSnapshot;

use super::style::{dim, panel};
use crate::app::App;
use crate::units::Units;

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let sample = app.latest.as_ref();
    let block = panel(" host ", false);
    let mut lines = Vec::new();
    if let Some(Err(error)) = sample.map(|s| &s.host) {
        lines.push(Line::styled(
            format!("host reading failed: {error}"),
            Style::new().fg(Color::Red),
        ));
    }
    match sample.and_then(|s| s.host_reading()) {
        Some(host) => lines.extend(host_lines(host, app.units)),
        None => lines.push(Line::styled("no host reading yet", dim())),
    }
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

fn host_lines(host: &HostSnapshot, units: Units) -> Vec<Line<'static>> {
    let f = |bytes| units.format(bytes);
    let optional = |bytes: Option<u64>| bytes.map_or_else(|| "–".to_string(), f);
    let rows = [
        ("MemTotal", f(host.mem_total)),
        ("MemAvailable", f(host.mem_available)),
        ("MemFree", f(host.mem_free)),
        ("Cached+Buffers", f(host.page_cache())),
        ("Shmem", f(host.shmem)),
        (
            "swap used",
            format!("{} / {}", f(host.swap_used()), f(host.swap_total)),
        ),
        (
            "kubelet resv.",
            format!(
                "system {} · kube {}",
                f(host.system_reserved),
                f(host.kube_reserved)
            ),
        ),
        ("evictionHard", f(host.eviction_hard)),
        (
            "kubepods",
            format!(
                "{} / max {}",
                optional(host.kubepods_current),
                optional(host.kubepods_max)
            ),
        ),
        ("plan usable", optional(host.usable)),
    ];
    rows.into_iter()
        .map(|(name, value)| Line::raw(format!("{name:<15}{value}")))
        .collect()
}
