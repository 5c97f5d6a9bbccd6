//! What each key does to the monitor's state.

use crate::common;

use std::time::Duration;

use common::{GIB, connected_sample};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use sparkrt_tui::app::{App, Control, Focus, LedgerSort, ProcessSort};
use sparkrt_tui::units::Units;

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn app() -> App {
    let mut app = App::new(
        "http://h:1",
        Duration::from_millis(500),
        Duration::from_secs(60),
    );
    app.apply(connected_sample());
    app
}

#[test]
fn q_and_ctrl_c_quit_other_keys_do_not() {
    let mut app = app();
    assert_eq!(app.on_key(key(KeyCode::Char('q'))), Control::Quit);
    assert_eq!(
        app.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
        Control::Quit
    );
    for code in [
        KeyCode::Char('c'),
        KeyCode::Char('x'),
        KeyCode::Enter,
        KeyCode::Esc,
    ] {
        assert_eq!(app.on_key(key(code)), Control::Continue, "{code:?}");
    }
}

#[test]
fn pause_holds_the_screen_still() {
    let mut app = app();
    app.on_key(key(KeyCode::Char('p')));
    assert!(app.paused);
    let mut newer = connected_sample();
    if let Ok(host) = &mut newer.host {
        host.mem_available = 30 * GIB;
    }
    app.apply(newer.clone());
    let shown = app.latest.as_ref().and_then(|s| s.host_reading()).unwrap();
    assert_eq!(shown.mem_available, 40 * GIB, "paused: sample dropped");
    assert_eq!(app.history.points().count(), 1);

    app.on_key(key(KeyCode::Char('p')));
    app.apply(newer);
    let shown = app.latest.as_ref().and_then(|s| s.host_reading()).unwrap();
    assert_eq!(shown.mem_available, 30 * GIB);
    assert_eq!(app.history.points().count(), 2);
}

#[test]
fn tab_moves_focus_and_s_sorts_the_focused_table() {
    let mut app = app();
    assert_eq!(app.focus, Focus::Ledger);
    app.on_key(key(KeyCode::Char('s')));
    assert_eq!(app.ledger_sort, LedgerSort::AllocatedDesc);
    let held: Vec<u64> = app
        .sorted_ledger()
        .iter()
        .map(|e| e.allocated / GIB)
        .collect();
    assert_eq!(held, [60, 20, 2, 1, 1]);
    app.on_key(key(KeyCode::Char('s')));
    let names: Vec<String> = app.sorted_ledger().into_iter().map(|e| e.name).collect();
    assert_eq!(
        names,
        [
            "activations",
            "kv_cache",
            "moe_workspace",
            "runtime_overhead",
            "weights"
        ]
    );
    assert_eq!(app.process_sort, ProcessSort::RssDesc, "untouched");

    app.on_key(key(KeyCode::Tab));
    assert_eq!(app.focus, Focus::Processes);
    // RSS → GPU → name → pid.
    for _ in 0..2 {
        app.on_key(key(KeyCode::Char('s')));
    }
    assert_eq!(app.process_sort, ProcessSort::Name);
    let names: Vec<String> = app.sorted_processes().into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["kubelet", "sparkrt"]);
    app.on_key(key(KeyCode::Char('s')));
    let pids: Vec<u32> = app.sorted_processes().into_iter().map(|p| p.pid).collect();
    assert_eq!(pids, [77, 4242]);
    assert_eq!(app.ledger_sort, LedgerSort::Name, "untouched");

    app.on_key(key(KeyCode::BackTab));
    assert_eq!(app.focus, Focus::Ledger);
}

#[test]
fn u_toggles_units_and_question_mark_toggles_help() {
    let mut app = app();
    app.on_key(key(KeyCode::Char('u')));
    assert_eq!(app.units, Units::Decimal);
    app.on_key(key(KeyCode::Char('u')));
    assert_eq!(app.units, Units::Binary);
    app.on_key(key(KeyCode::Char('?')));
    assert!(app.show_help);
    app.on_key(key(KeyCode::Char('?')));
    assert!(!app.show_help);
}
