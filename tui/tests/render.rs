//! Whole-screen renders on ratatui's TestBackend with canned data: labels,
//! figures and the markers land where the arithmetic says.
//!
//! Layout facts used below: row 0 is the status line; the pool panel starts
//! on row 1 with its border, so its headline is row 2, the bar rows 3 and 4,
//! the eviction marker row 5 and the usable marker row 6. The bar spans the
//! inner width (terminal width − 2) from column 1.

use crate::common;

use std::sync::mpsc;
use std::time::Duration;

use common::{GIB, connected_sample, disconnected_sample};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::style::Color;
use sparkrt_tui::app::App;
use sparkrt_tui::event::AppEvent;
use sparkrt_tui::pool::marker_column;
use sparkrt_tui::run::{TopError, draw_loop};
use sparkrt_tui::ui;

const STATUS_ROW: u16 = 0;
const HEADLINE_ROW: u16 = 2;
const BAR_ROWS: [u16; 2] = [3, 4];
const EVICTION_ROW: u16 = 5;
const USABLE_ROW: u16 = 6;

fn app_with(sample: sparkrt_tui::collector::Sample) -> App {
    let mut app = App::new(
        "http://127.0.0.1:8000",
        Duration::from_millis(500),
        Duration::from_secs(300),
    );
    app.apply(sample);
    app
}

fn render(app: &App, width: u16, height: u16) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|frame| ui::draw(frame, app)).unwrap();
    terminal.backend().buffer().clone()
}

fn row(buffer: &Buffer, y: u16) -> String {
    (0..buffer.area.width)
        .map(|x| buffer[(x, y)].symbol())
        .collect()
}

fn screen(buffer: &Buffer) -> String {
    (0..buffer.area.height)
        .map(|y| row(buffer, y))
        .collect::<Vec<_>>()
        .join("\n")
}

fn symbol(buffer: &Buffer, x: u16, y: u16) -> &str {
    buffer[(x, y)].symbol()
}

/// The column of the first cell on row `y` whose text starts with `needle`.
fn find_on_row(buffer: &Buffer, y: u16, needle: &str) -> Option<u16> {
    let cells: Vec<&str> = (0..buffer.area.width)
        .map(|x| buffer[(x, y)].symbol())
        .collect();
    (0..cells.len()).find_map(|start| {
        cells[start..]
            .concat()
            .starts_with(needle)
            .then_some(start as u16)
    })
}

#[test]
fn pool_bar_markers_sit_where_the_arithmetic_says() {
    let buffer = render(&app_with(connected_sample()), 122, 40);
    // Inner width 120. Eviction line at 128 − 16 = 112 GiB: ⌊112 × 120 / 128⌋
    // = 105, plus the border column: x = 106. Usable at 96 GiB: ⌊96 × 120 /
    // 128⌋ = 90, x = 91.
    assert_eq!(marker_column(112 * GIB, 128 * GIB, 120), 105);
    for y in BAR_ROWS {
        assert_eq!(symbol(&buffer, 106, y), "┃", "eviction line on row {y}");
        assert_eq!(buffer[(106, y)].fg, Color::Red);
        assert_eq!(symbol(&buffer, 91, y), "╎", "usable line on row {y}");
    }
    // The marker label does not fit right of column 105, so it ends there.
    assert_eq!(symbol(&buffer, 106, EVICTION_ROW), "▲");
    let eviction_label = row(&buffer, EVICTION_ROW);
    assert!(
        eviction_label.contains("eviction (evictionHard 16.0 GiB) ▲"),
        "{eviction_label}"
    );
    assert_eq!(symbol(&buffer, 91, USABLE_ROW), "△");
    assert!(row(&buffer, USABLE_ROW).contains("usable 96.0 GiB"));
    // The line is drawn on the bar and nowhere else on those rows.
    assert_eq!(row(&buffer, BAR_ROWS[0]).matches('┃').count(), 1);
}

#[test]
fn pool_segments_fill_the_bar_in_order() {
    let buffer = render(&app_with(connected_sample()), 130, 40);
    // Inner width 128 = one cell per GiB. Weights 0..60, moe 60..62, kv used
    // 62..67, kv free 67..82, activations 82..83, overhead 83..84, others
    // 84..88, page cache 88..113, free 113..128 (x = cell + 1).
    let bar = row(&buffer, BAR_ROWS[0]);
    let cells: Vec<char> = bar.chars().collect();
    assert!(cells[1..=84].iter().all(|&c| c == '█'), "{bar}");
    assert!(cells[85..=88].iter().all(|&c| c == '▓'), "{bar}");
    assert!(
        cells[89..=113]
            .iter()
            .all(|&c| c == '▒' || c == '╎' || c == '┃'),
        "{bar}"
    );
    assert!(
        cells[114..=128].iter().all(|&c| c == '░' || c == '┃'),
        "{bar}"
    );
    // The labels on the second bar row start where their segment starts.
    assert_eq!(find_on_row(&buffer, BAR_ROWS[1], "weights"), Some(1));
    assert_eq!(find_on_row(&buffer, BAR_ROWS[1], "kv free"), Some(68));
    // The usable line (x = 97) crosses the page cache label.
    assert_eq!(find_on_row(&buffer, BAR_ROWS[1], "page cac"), Some(89));
    assert_eq!(buffer[(1, BAR_ROWS[0])].fg, Color::Blue);
    assert_eq!(buffer[(63, BAR_ROWS[0])].fg, Color::Cyan);
}

#[test]
fn headline_legend_and_panels_show_the_figures() {
    let buffer = render(&app_with(connected_sample()), 160, 44);
    let text = screen(&buffer);
    let headline = row(&buffer, HEADLINE_ROW);
    assert!(headline.contains("eviction margin 24.0 GiB"), "{headline}");
    assert!(headline.contains("MemAvailable 40.0 GiB"), "{headline}");
    assert!(
        headline.contains("runtime 84.0 GiB / usable 96.0 GiB"),
        "{headline}"
    );
    assert!(row(&buffer, 1).contains("MemTotal 128 GiB"));
    for needle in [
        // legend
        "weights 60.0 GiB",
        "kv used 5.00 GiB",
        "kv free 15.0 GiB",
        "other processes 4.00 GiB",
        "page cache 25.0 GiB",
        "free 15.0 GiB",
        // serving
        "running 3 · queued 1",
        "gen 54.5 · prompt 812.0",
        "kv blocks used 5120 · cached 0 · free 15360 (25%)",
        "ok 120 · error 2 · rejected 5",
        "ttft p50 125ms p99 750ms",
        "itl p50 25ms p99 70ms",
        "trips < 18.0 GiB",
        // host
        "evictionHard   16.0 GiB",
        "kubelet resv.  system 2.00 GiB · kube 1.00 GiB",
        "swap used      2.00 GiB / 8.00 GiB",
        "kubepods       6.00 GiB / max –",
        "plan usable    96.0 GiB",
        // ledger notes and processes
        "page cache: dontneed · weights: host registered",
        "server RSS 62.0 GiB",
        "sparkrt",
        "kubelet",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    // Status line.
    assert!(row(&buffer, STATUS_ROW).contains("server: connected http://127.0.0.1:8000"));
}

/// The words of a screen line, borders dropped.
fn words(line: &str) -> Vec<&str> {
    line.split(|c: char| c.is_whitespace() || c == '│')
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn ledger_rows_show_planned_allocated_and_share() {
    let buffer = render(&app_with(connected_sample()), 160, 44);
    let text = screen(&buffer);
    let overhead = text
        .lines()
        .find(|l| l.contains("runtime_overhead"))
        .expect("overhead row");
    // Planned 2 GiB, allocated 1 GiB: 50 %.
    let figures = words(overhead);
    let at = figures
        .iter()
        .position(|w| *w == "runtime_overhead")
        .unwrap();
    assert_eq!(
        &figures[at + 1..at + 6],
        ["2.00", "GiB", "1.00", "GiB", "50"]
    );
    let total = text
        .lines()
        .find(|l| l.contains("│total"))
        .expect("total row");
    let figures = words(total);
    let at = figures.iter().position(|w| *w == "total").unwrap();
    // 60 + 2 + 1 + 20 + 2 = 85 GiB planned, 84 allocated: 98.8 % → 99.
    assert_eq!(
        &figures[at + 1..at + 6],
        ["85.0", "GiB", "84.0", "GiB", "99"]
    );
    assert!(text.contains("ledger · sort:"));
}

#[test]
fn eviction_margin_colour_turns_yellow_then_red() {
    let colour_of_margin = |available: u64| {
        let mut sample = connected_sample();
        if let Ok(host) = &mut sample.host {
            host.mem_available = available;
        }
        let buffer = render(&app_with(sample), 122, 40);
        let x = find_on_row(&buffer, HEADLINE_ROW, "eviction margin ").unwrap() + 16;
        buffer[(x, HEADLINE_ROW)].fg
    };
    // Margin 24 GiB of 128 (18.8 %), 10 GiB (7.8 %), 4 GiB (3.1 %).
    assert_eq!(colour_of_margin(40 * GIB), Color::Green);
    assert_eq!(colour_of_margin(26 * GIB), Color::Yellow);
    assert_eq!(colour_of_margin(20 * GIB), Color::Red);
}

#[test]
fn units_key_switches_to_decimal_gigabytes() {
    let mut app = app_with(connected_sample());
    app.on_key(KeyEvent::new(KeyCode::Char('u'), KeyModifiers::NONE));
    let buffer = render(&app, 160, 44);
    // 128 GiB = 137.44 GB; 24 GiB = 25.77 GB.
    assert!(row(&buffer, 1).contains("MemTotal 137 GB"));
    assert!(row(&buffer, HEADLINE_ROW).contains("eviction margin 25.8 GB"));
    // The ledger too: 60 GiB of weights = 64.4 GB; the status line says so.
    let text = screen(&buffer);
    let weights = text
        .lines()
        // The ledger's row, not the pool bar's label.
        .find(|l| l.contains("│weights ") && l.contains(" GB"))
        .expect("weights row");
    assert_eq!(
        words(weights)[..6],
        ["weights", "64.4", "GB", "64.4", "GB", "100"],
        "{weights}"
    );
    assert!(row(&buffer, STATUS_ROW).contains("│ decimal │"));
}

#[test]
fn without_a_server_host_panels_remain() {
    let buffer = render(&app_with(disconnected_sample()), 122, 40);
    let text = screen(&buffer);
    assert!(row(&buffer, STATUS_ROW).contains("server: disconnected (connection refused)"));
    assert!(text.contains("no server: host panels only"));
    assert!(text.contains("MemAvailable   40.0 GiB"));
    // Host-only pool: others 88, page cache 25, free 15 GiB; the eviction
    // line is still at x = 106.
    assert!(text.contains("other processes 88.0 GiB"));
    assert!(row(&buffer, HEADLINE_ROW).contains("runtime 0 B"));
    assert_eq!(symbol(&buffer, 106, BAR_ROWS[0]), "┃");
}

#[test]
fn before_the_first_sample_it_says_so() {
    let app = App::new(
        "http://x:1",
        Duration::from_secs(1),
        Duration::from_secs(60),
    );
    let text = screen(&render(&app, 100, 30));
    assert!(text.contains("waiting for the first sample"));
}

#[test]
fn help_overlay_lists_the_keys() {
    let mut app = app_with(connected_sample());
    app.on_key(KeyEvent::new(KeyCode::Char('?'), KeyModifiers::NONE));
    let text = screen(&render(&app, 100, 40));
    for needle in [
        "q     quit",
        "p     pause",
        "tab   focus",
        "s     sort",
        "u     units",
    ] {
        assert!(text.contains(needle), "missing {needle:?}");
    }
    app.on_key(KeyEvent::new(KeyCode::Esc, KeyModifiers::NONE));
    assert!(!screen(&render(&app, 100, 40)).contains("q     quit"));
}

#[test]
fn narrow_wide_and_tiny_terminals_render_without_panics() {
    let mut help = app_with(connected_sample());
    help.show_help = true;
    let apps = [
        app_with(connected_sample()),
        app_with(disconnected_sample()),
        help,
    ];
    for app in &apps {
        for (width, height) in [(60, 40), (60, 20), (200, 60), (200, 12), (20, 8), (1, 1)] {
            let buffer = render(app, width, height);
            assert_eq!(buffer.area.width, width);
        }
    }
    // At 60 columns the bar and its eviction line are still there:
    // inner 58, ⌊112 × 58 / 128⌋ = 50, x = 51.
    let buffer = render(&apps[0], 60, 40);
    assert_eq!(symbol(&buffer, 51, BAR_ROWS[0]), "┃");
    assert_eq!(symbol(&buffer, 51, EVICTION_ROW), "▲");
    // At 200 columns: inner 198, ⌊112 × 198 / 128⌋ = 173, x = 174.
    let buffer = render(&apps[0], 200, 60);
    assert_eq!(symbol(&buffer, 174, BAR_ROWS[1]), "┃");
}

#[test]
fn draw_loop_applies_samples_and_quits_on_q() {
    let mut terminal = Terminal::new(TestBackend::new(122, 40)).unwrap();
    let mut app = App::new(
        "http://127.0.0.1:8000",
        Duration::from_millis(500),
        Duration::from_secs(300),
    );
    let (tx, rx) = mpsc::channel();
    tx.send(AppEvent::Sample(Box::new(connected_sample())))
        .unwrap();
    tx.send(AppEvent::Resize).unwrap();
    tx.send(AppEvent::Key(KeyEvent::new(
        KeyCode::Char('q'),
        KeyModifiers::NONE,
    )))
    .unwrap();
    draw_loop(&mut terminal, &mut app, &rx, || true).unwrap();
    assert!(app.latest.is_some());
    let last = screen(terminal.backend().buffer());
    assert!(last.contains("eviction margin 24.0 GiB"));
}

#[test]
fn draw_loop_ends_when_the_collector_is_gone() {
    let mut terminal = Terminal::new(TestBackend::new(80, 30)).unwrap();
    let mut app = App::new(
        "http://x:1",
        Duration::from_secs(1),
        Duration::from_secs(60),
    );
    let (tx, rx) = mpsc::channel::<AppEvent>();
    drop(tx);
    let result = draw_loop(&mut terminal, &mut app, &rx, || false);
    assert!(matches!(result, Err(TopError::CollectorStopped)));
}

#[test]
fn broken_stats_and_host_readings_are_shown_not_hidden() {
    let mut sample = connected_sample();
    sample.stats = Some(Err("/v1/stats: requests_running is NaN".to_string()));
    sample.host = Err("/proc/meminfo: permission denied".to_string());
    let buffer = render(&app_with(sample), 160, 44);
    let text = screen(&buffer);
    assert!(text.contains("stats: /v1/stats: requests_running is NaN"));
    assert!(text.contains("host reading failed: /proc/meminfo: permission denied"));
    // The server's host object stands in: the pool is still drawn, without
    // the usable line the server does not report.
    assert!(row(&buffer, HEADLINE_ROW).contains("eviction margin 24.0 GiB"));
    assert!(!row(&buffer, HEADLINE_ROW).contains("usable"));
    assert!(text.contains("plan usable    –"));
}

/// The canned sample with a tiny model's ledger: kilobytes and megabytes.
fn tiny_model_sample() -> sparkrt_tui::collector::Sample {
    let mut json: serde_json::Value =
        serde_json::from_str(common::MEMORY_OK).expect("canned JSON parses");
    // (planned, allocated) per category, in the file's order.
    let figures: [(u64, u64); 5] = [
        (24_222_106, 24_222_106), // 23.1 MiB
        (1536, 1536),             // 1.50 KiB
        (512, 512),               // 512 B
        (10 * 1024 * 1024 + 300 * 1024, 0),
        (1 << 30, 1 << 29),
    ];
    for (i, (planned, allocated)) in figures.iter().enumerate() {
        let category = &mut json["ledger"]["categories"][i];
        category["planned"] = (*planned).into();
        category["allocated"] = (*allocated).into();
    }
    let mut sample = connected_sample();
    sample.server =
        Some(sparkrt_tui::memory::parse(&json.to_string()).expect("tiny ledger parses"));
    sample
}

#[test]
fn a_tiny_models_ledger_reads_in_kib_and_mib() {
    let buffer = render(&app_with(tiny_model_sample()), 160, 44);
    let text = screen(&buffer);
    let figures_of = |category: &str| {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("│{category} ")))
            .unwrap_or_else(|| panic!("{category} row in\n{text}"));
        let w = words(line);
        let at = w.iter().position(|x| *x == category).unwrap();
        w[at + 1..]
            .iter()
            .take(5)
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(figures_of("weights"), ["23.1", "MiB", "23.1", "MiB", "100"]);
    assert_eq!(
        figures_of("moe_workspace"),
        ["1.50", "KiB", "1.50", "KiB", "100"]
    );
    assert_eq!(figures_of("activations"), ["512", "B", "512", "B", "100"]);
    assert_eq!(figures_of("kv_cache"), ["10.3", "MiB", "0", "B", "0"]);
    assert_eq!(
        figures_of("runtime_overhead"),
        ["1.00", "GiB", "512", "MiB", "50"]
    );
    // Total: 24_222_106 + 1536 + 512 + 10_792_960 + 2^30 = 1_108_759_338 B
    // = 1.033 GiB planned; 24_222_106 + 2048 + 2^29 = 561_094_066 B = 535 MiB.
    assert_eq!(figures_of("total"), ["1.03", "GiB", "535", "MiB", "51"]);
}

#[test]
fn at_80_columns_the_pool_labels_stay_whole() {
    let buffer = render(&app_with(connected_sample()), 80, 44);
    let text = screen(&buffer);
    // The legend wraps between items, never inside one (its two lines hold
    // the first six at this width).
    for item in [
        "█ weights 60.0 GiB  █ moe workspace 2.00 GiB  █ kv used 5.00 GiB",
        "█ kv free 15.0 GiB  █ activations 1.00 GiB  █ overhead 1.00 GiB",
        // The ledger's figure columns hold a whole figure and its unit.
        "weights            60.0 GiB  60.0 GiB  100",
        "runtime_overhead   2.00 GiB  1.00 GiB   50",
    ] {
        assert!(text.contains(item), "missing {item:?} in\n{text}");
    }
    // Inner width 78: eviction at ⌊112 × 78 / 128⌋ = 68, usable at
    // ⌊96 × 78 / 128⌋ = 58; both labels end at their arrows, whole.
    assert!(
        row(&buffer, EVICTION_ROW).contains("eviction (evictionHard 16.0 GiB) ▲"),
        "{}",
        row(&buffer, EVICTION_ROW)
    );
    assert!(
        row(&buffer, USABLE_ROW).contains("usable 96.0 GiB"),
        "{}",
        row(&buffer, USABLE_ROW)
    );
    assert!(row(&buffer, HEADLINE_ROW).contains("eviction margin 24.0 GiB"));
}

#[test]
fn speculative_decoding_shows_its_drafts_beside_the_token_rates() {
    let quiet = screen(&render(&app_with(connected_sample()), 160, 44));
    assert!(!quiet.contains("drafts"), "no drafts, no line:\n{quiet}");
    let mut sample = connected_sample();
    if let Some(Ok(stats)) = sample.stats.as_mut() {
        stats.spec_decode_num_drafts_total = 380;
        stats.spec_decode_num_draft_tokens_total = 784;
        stats.spec_decode_num_accepted_tokens_total = 388;
    }
    let text = screen(&render(&app_with(sample), 160, 44));
    // 388 / 784 = 49.5 %; 1 + 388 / 380 = 2.02 tokens a drafting step.
    assert!(
        text.contains("drafts    kept 388 of 784 (49%) · 2.02 tok/step"),
        "{text}"
    );
}

/// The canned sample with a hybrid model's recurrent-state pool (3 GiB,
/// all allocated) in the ledger before `runtime_overhead`.
fn hybrid_model_sample() -> sparkrt_tui::collector::Sample {
    let mut json: serde_json::Value =
        serde_json::from_str(common::MEMORY_OK).expect("canned JSON parses");
    let categories = json["ledger"]["categories"]
        .as_array_mut()
        .expect("categories");
    categories.insert(
        4,
        serde_json::json!({"name": "recurrent_state", "planned": 3u64 << 30, "allocated": 3u64 << 30}),
    );
    json["plan"]["recurrent_state"] = serde_json::json!({"snapshot_slots": 32});
    let mut sample = connected_sample();
    sample.server =
        Some(sparkrt_tui::memory::parse(&json.to_string()).expect("hybrid ledger parses"));
    if let Some(Ok(stats)) = sample.stats.as_mut() {
        stats.state_snapshots_cached = 5;
    }
    sample
}

#[test]
fn the_recurrent_state_pool_has_its_ledger_row_and_bar_segment_at_80_columns() {
    let buffer = render(&app_with(hybrid_model_sample()), 80, 44);
    let text = screen(&buffer);
    let line = text
        .lines()
        .find(|l| l.contains("│recurrent_state "))
        .unwrap_or_else(|| panic!("recurrent_state row in\n{text}"));
    let w = words(line);
    let at = w.iter().position(|x| *x == "recurrent_state").unwrap();
    // 3 × 2^30 B planned and allocated: 3.00 GiB each, 100 %.
    assert_eq!(w[at + 1..at + 6], ["3.00", "GiB", "3.00", "GiB", "100"]);
    // The legend names it whole, with its figure.
    assert!(text.contains("█ gdn state 3.00 GiB"), "{text}");
    // Total planned: 60 + 2 + 1 + 20 + 3 + 2 GiB = 88 GiB.
    let total = text
        .lines()
        .find(|l| l.contains("│total "))
        .unwrap_or_else(|| panic!("total row in\n{text}"));
    let w = words(total);
    let at = w.iter().position(|x| *x == "total").unwrap();
    assert_eq!(w[at + 1..at + 3], ["88.0", "GiB"]);
    // The serving panel: 5 snapshots held of the plan's 32 slots.
    assert!(text.contains("state     snapshots 5 / 32"), "{text}");
}

#[test]
fn without_a_recurrent_state_the_legend_has_no_empty_item() {
    let text = screen(&render(&app_with(connected_sample()), 80, 44));
    assert!(!text.contains("gdn state"), "{text}");
    assert!(!text.contains("snapshots"), "{text}");
}

/// On a GB10 the guard adds back what the host's figures miss: the
/// registered (pinned) weights and the driver's allocations outside the
/// cgroup. The serving panel names both, scaled; elsewhere nothing shows.
#[test]
fn a_gb10s_hidden_footprint_is_shown_beside_the_guard() {
    let quiet = screen(&render(&app_with(connected_sample()), 160, 44));
    assert!(
        !quiet.contains("hidden"),
        "nothing hidden, no line:\n{quiet}"
    );
    let mut json: serde_json::Value =
        serde_json::from_str(common::MEMORY_OK).expect("canned JSON parses");
    json["guard"]["pinned_weights_bytes"] = serde_json::json!(17u64 * GIB + 200 * (1 << 20));
    json["guard"]["driver_allocations_bytes"] = serde_json::json!(700u64 << 20);
    let mut sample = connected_sample();
    sample.server = Some(sparkrt_tui::memory::parse(&json.to_string()).expect("parses"));
    let text = screen(&render(&app_with(sample), 160, 44));
    // 17 GiB + 200 MiB = 17.195 GiB; 700 MiB.
    assert!(
        text.contains("hidden    pinned weights 17.2 GiB · driver allocs 700 MiB"),
        "{text}"
    );
}
