//! Draws one frame from the [`App`] state. Each panel has its own module;
//! this one only lays them out.

mod help;
mod history;
mod host;
mod ledger;
mod pool;
mod processes;
mod serving;
mod status;
mod style;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout};

use crate::app::{App, Focus};

/// Rows of the pool panel: borders, headline, two bar rows, two marker rows,
/// two legend rows.
const POOL_HEIGHT: u16 = 9;
const MIDDLE_HEIGHT: u16 = 9;
const LOWER_HEIGHT: u16 = 13;

pub fn draw(frame: &mut Frame, app: &App) {
    let [status_area, pool_area, middle, lower, processes_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(POOL_HEIGHT),
        Constraint::Length(MIDDLE_HEIGHT),
        Constraint::Length(LOWER_HEIGHT),
        Constraint::Min(3),
    ])
    .areas(frame.area());
    let [history_area, serving_area] =
        Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)]).areas(middle);
    let [ledger_area, host_area] =
        Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(lower);

    status::render(frame, status_area, app);
    pool::render(frame, pool_area, app);
    history::render(frame, history_area, app);
    serving::render(frame, serving_area, app);
    ledger::render(frame, ledger_area, app, app.focus == Focus::Ledger);
    host::render(frame, host_area, app);
    processes::render(frame, processes_area, app, app.focus == Focus::Processes);
    if app.show_help {
        help::render(frame);
    }
}
