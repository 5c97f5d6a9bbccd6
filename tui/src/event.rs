//! What the draw loop waits on: keys and resizes from the input thread,
//! samples from the collector thread, all on one channel.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::Duration;

use crossterm::event::{self, Event, KeyEvent, KeyEventKind};

use crate::sample::Sample;

#[derive(Debug)]
pub enum AppEvent {
    Key(KeyEvent),
    Resize,
    Sample(Box<Sample>),
    /// Reading the terminal failed; the loop should end.
    InputFailed(String),
}

/// How long the input thread blocks before it looks at `stop` again.
const INPUT_POLL: Duration = Duration::from_millis(100);

/// Forwards key presses and resizes to `events` until `stop` is set or the
/// receiver is gone.
pub fn spawn_input(
    events: Sender<AppEvent>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sparkrt-top-input".to_string())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let forwarded = match next_event() {
                    Ok(None) => continue,
                    Ok(Some(app_event)) => events.send(app_event),
                    Err(error) => {
                        let _ = events.send(AppEvent::InputFailed(error.to_string()));
                        return;
                    }
                };
                if forwarded.is_err() {
                    return;
                }
            }
        })
}

fn next_event() -> std::io::Result<Option<AppEvent>> {
    if !event::poll(INPUT_POLL)? {
        return Ok(None);
    }
    Ok(match event::read()? {
        // Some terminals also report releases; act on presses only.
        Event::Key(key) if key.kind == KeyEventKind::Press => Some(AppEvent::Key(key)),
        Event::Resize(_, _) => Some(AppEvent::Resize),
        _ => None,
    })
}
