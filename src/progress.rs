//! Start-up's progress on stderr, drawn from a [`LoadProgress`]: a bar
//! (bytes, GB/s, ETA) when stderr is a terminal, else a log line every few
//! seconds, so a journal or a pipe shows how far loading is without
//! carriage returns.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sparkrt_wire::LoadPhase;

use crate::checkpoint::load::LoadProgress;

/// How often the bar is redrawn.
const DRAW_EVERY: Duration = Duration::from_millis(200);
/// How often a log line is written off a terminal.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Shows `progress` until `stop` is set (the setter unparks this thread,
/// so it ends at once rather than at its next redraw).
pub fn report_until(progress: &LoadProgress, stop: &AtomicBool) {
    let bar = std::io::stderr().is_terminal().then(|| {
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr())
    });
    if let Some(bar) = &bar
        && let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} {bar:40} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} ETA {eta}",
        )
    {
        bar.set_style(style);
    }
    let mut logged = Instant::now();
    let mut shown = None;
    while !stop.load(Ordering::Acquire) {
        std::thread::park_timeout(DRAW_EVERY);
        if stop.load(Ordering::Acquire) {
            break;
        }
        let phase = progress.phase();
        if !matches!(phase, LoadPhase::Reading | LoadPhase::Device) {
            continue;
        }
        let report = progress.report();
        match &bar {
            Some(bar) => {
                if shown != Some(phase) {
                    // A new phase: its own length and rate.
                    bar.reset();
                    bar.set_message(phase_words(phase));
                    shown = Some(phase);
                }
                bar.set_length(report.total_bytes);
                bar.set_position(report.done_bytes);
            }
            None if logged.elapsed() >= LOG_EVERY => {
                logged = Instant::now();
                tracing::info!(
                    done_bytes = report.done_bytes,
                    total_bytes = report.total_bytes,
                    "{}",
                    report.reason()
                );
            }
            None => {}
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}

fn phase_words(phase: LoadPhase) -> &'static str {
    match phase {
        LoadPhase::Device => "copying weights to the device",
        _ => "loading weights",
    }
}
