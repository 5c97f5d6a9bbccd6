//! The entry point: start the collector and input threads, then draw on
//! every event until `q`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use ratatui::Terminal;
use ratatui::backend::Backend;
use thiserror::Error;

use crate::app::{App, Control};
use crate::client::{ServerClient, UrlError};
use crate::collector::{self, Collector};
use crate::event::{self, AppEvent};
use crate::host::HostSource;
use crate::options::TopOptions;
use crate::terminal::TerminalGuard;
use crate::ui;

#[derive(Debug, Error)]
pub enum TopError {
    #[error(transparent)]
    Url(#[from] UrlError),
    #[error("cannot set up the terminal: {0}")]
    Terminal(#[source] std::io::Error),
    #[error("drawing failed: {0}")]
    Draw(String),
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("reading the keyboard failed: {0}")]
    Input(String),
    #[error("the collector thread stopped")]
    CollectorStopped,
}

/// The screen is redrawn at least this often, events or not.
const REDRAW_EVERY: Duration = Duration::from_millis(250);

/// Runs `sparkrt top` until the user quits. `host` supplies host readings.
pub fn run(options: TopOptions, host: Box<dyn HostSource>) -> Result<(), TopError> {
    let client = ServerClient::new(&options.server_url, options.request_timeout)?;
    let mut app = App::new(client.base_url(), options.interval, options.history);
    let collector = Collector::new(host, client).with_processes(options.max_processes);

    let mut guard = TerminalGuard::enter().map_err(TopError::Terminal)?;
    let (events_tx, events_rx) = mpsc::channel();
    let (stop_collector, collector_stop_rx) = mpsc::channel();
    let stop_input = Arc::new(AtomicBool::new(false));
    let collector_thread = collector::spawn(
        collector,
        options.interval,
        events_tx.clone(),
        collector_stop_rx,
    )
    .map_err(TopError::Thread)?;
    let input_thread =
        event::spawn_input(events_tx, Arc::clone(&stop_input)).map_err(TopError::Thread)?;

    let result = draw_loop(guard.terminal(), &mut app, &events_rx, || {
        !collector_thread.is_finished()
    });

    stop_input.store(true, Ordering::Relaxed);
    drop(stop_collector);
    // The input thread looks at its flag every 100 ms. The collector may be
    // inside a request; it ends by itself within the request timeout, so it
    // is not waited for and quitting is immediate.
    let _ = input_thread.join();
    drop(guard);
    result
}

/// Draws, then waits for the next event, until a key says quit. Returns an
/// error when input fails or the collector is gone (`collector_alive`).
pub fn draw_loop<B: Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    events: &Receiver<AppEvent>,
    collector_alive: impl Fn() -> bool,
) -> Result<(), TopError> {
    loop {
        // A collector that panicked has already had the panic hook restore
        // the terminal: stop before drawing on the user's screen.
        if !collector_alive() {
            return Err(TopError::CollectorStopped);
        }
        terminal
            .draw(|frame| ui::draw(frame, app))
            .map_err(|e| TopError::Draw(e.to_string()))?;
        match events.recv_timeout(REDRAW_EVERY) {
            Ok(AppEvent::Key(key)) => {
                if app.on_key(key) == Control::Quit {
                    return Ok(());
                }
            }
            // The next draw picks up the new size.
            Ok(AppEvent::Resize) => {}
            Ok(AppEvent::Sample(sample)) => app.apply(*sample),
            Ok(AppEvent::InputFailed(error)) => return Err(TopError::Input(error)),
            // Redraw; the top of the loop checks on the collector.
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Err(TopError::CollectorStopped),
        }
    }
}
