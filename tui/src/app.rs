//! The monitor's state between frames, and what each key does to it.

use std::cmp::Reverse;
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use sparkrt_wire::LedgerEntry;

use crate::history::{History, HistoryPoint};
use crate::processes::ProcessRow;
use crate::sample::Sample;
use crate::units::Units;

/// The panel `tab` selects; `s` sorts the focused one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    Ledger,
    Processes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerSort {
    /// The server's order (the contract's category order).
    Server,
    AllocatedDesc,
    Name,
}

impl LedgerSort {
    fn next(self) -> LedgerSort {
        match self {
            LedgerSort::Server => LedgerSort::AllocatedDesc,
            LedgerSort::AllocatedDesc => LedgerSort::Name,
            LedgerSort::Name => LedgerSort::Server,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            LedgerSort::Server => "server order",
            LedgerSort::AllocatedDesc => "allocated",
            LedgerSort::Name => "name",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessSort {
    RssDesc,
    GpuDesc,
    Name,
    Pid,
}

impl ProcessSort {
    fn next(self) -> ProcessSort {
        match self {
            ProcessSort::RssDesc => ProcessSort::GpuDesc,
            ProcessSort::GpuDesc => ProcessSort::Name,
            ProcessSort::Name => ProcessSort::Pid,
            ProcessSort::Pid => ProcessSort::RssDesc,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            ProcessSort::RssDesc => "rss",
            ProcessSort::GpuDesc => "gpu",
            ProcessSort::Name => "name",
            ProcessSort::Pid => "pid",
        }
    }
}

/// What the loop does after a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Continue,
    Quit,
}

#[derive(Debug, Clone)]
pub struct App {
    pub server_url: String,
    pub interval: Duration,
    /// The sample on screen.
    pub latest: Option<Sample>,
    pub history: History,
    /// While paused, new samples are dropped and the screen holds still.
    pub paused: bool,
    pub focus: Focus,
    pub ledger_sort: LedgerSort,
    pub process_sort: ProcessSort,
    pub units: Units,
    pub show_help: bool,
}

impl App {
    pub fn new(server_url: &str, interval: Duration, history_window: Duration) -> App {
        App {
            server_url: server_url.to_string(),
            interval,
            latest: None,
            history: History::new(history_window),
            paused: false,
            focus: Focus::Ledger,
            ledger_sort: LedgerSort::Server,
            process_sort: ProcessSort::RssDesc,
            units: Units::Binary,
            show_help: false,
        }
    }

    pub fn apply(&mut self, sample: Sample) {
        if self.paused {
            return;
        }
        if let Some(host) = sample.host_reading() {
            self.history.push(HistoryPoint {
                at: sample.taken_at,
                mem_available: host.mem_available,
                runtime_total: sample.server.as_ref().map_or(0, |s| s.runtime_allocated()),
            });
        }
        self.latest = Some(sample);
    }

    pub fn on_key(&mut self, key: KeyEvent) -> Control {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        match key.code {
            KeyCode::Char('q') => return Control::Quit,
            KeyCode::Char('c') if ctrl => return Control::Quit,
            KeyCode::Char('p') => self.paused = !self.paused,
            KeyCode::Tab | KeyCode::BackTab => {
                // Two focusable panels: forwards and backwards are the same.
                self.focus = match self.focus {
                    Focus::Ledger => Focus::Processes,
                    Focus::Processes => Focus::Ledger,
                }
            }
            KeyCode::Char('s') => match self.focus {
                Focus::Ledger => self.ledger_sort = self.ledger_sort.next(),
                Focus::Processes => self.process_sort = self.process_sort.next(),
            },
            KeyCode::Char('u') => self.units = self.units.toggled(),
            KeyCode::Char('?') => self.show_help = !self.show_help,
            KeyCode::Esc => self.show_help = false,
            _ => {}
        }
        Control::Continue
    }

    /// The ledger rows in the chosen order (empty without a server).
    pub fn sorted_ledger(&self) -> Vec<LedgerEntry> {
        let mut rows = self
            .latest
            .as_ref()
            .and_then(|s| s.server.as_ref())
            .map(|s| s.ledger.categories.clone())
            .unwrap_or_default();
        match self.ledger_sort {
            LedgerSort::Server => {}
            LedgerSort::AllocatedDesc => rows.sort_by_key(|e| Reverse(e.allocated)),
            LedgerSort::Name => rows.sort_by(|a, b| a.name.cmp(&b.name)),
        }
        rows
    }

    pub fn sorted_processes(&self) -> Vec<ProcessRow> {
        let mut rows = self
            .latest
            .as_ref()
            .map(|s| s.processes.clone())
            .unwrap_or_default();
        match self.process_sort {
            ProcessSort::RssDesc => rows.sort_by_key(|p| Reverse(p.rss)),
            ProcessSort::GpuDesc => rows.sort_by_key(|p| Reverse(p.gpu_bytes)),
            ProcessSort::Name => rows.sort_by(|a, b| a.name.cmp(&b.name)),
            ProcessSort::Pid => rows.sort_by_key(|r| r.pid),
        }
        rows
    }
}
