//! The engine thread: owns the engine, takes submissions between steps,
//! steps while there is work, and publishes gauges for `/metrics`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::latency::LatencyMetrics;
use crate::engine::{AdmissionError, Engine, EventSink, Request, SeqId};

/// Why a submission was refused.
#[derive(Debug)]
pub enum SubmitError {
    Admission(AdmissionError),
    QueueFull,
    ShuttingDown,
}

pub enum Command {
    /// One prompt's choices (`n`, `best_of`), queued together or not at all.
    Submit {
        request: Request,
        /// Where each choice's events go (the handler's channel), choice j
        /// at `sinks[j]`.
        sinks: Vec<Box<dyn EventSink>>,
        reply: oneshot::Sender<Result<Vec<SeqId>, SubmitError>>,
    },
}

/// Live figures of the engine, written by its thread after each step.
#[derive(Debug, Default)]
pub struct Gauges {
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub kv_blocks_used: AtomicUsize,
    /// Unreferenced full blocks kept by the prefix cache.
    pub kv_blocks_cached: AtomicUsize,
    pub kv_blocks_total: AtomicUsize,
    pub step_errors: AtomicU64,
    pub loaded: AtomicBool,
    /// Why the engine thread ended before the server did (a panic).
    failure: Mutex<Option<String>>,
}

impl Gauges {
    /// Why the engine thread is gone, when it ended abnormally.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .map_or_else(|poisoned| poisoned.into_inner().clone(), |f| f.clone())
    }

    fn record_failure(&self, message: String) {
        match self.failure.lock() {
            Ok(mut f) => *f = Some(message),
            Err(poisoned) => *poisoned.into_inner() = Some(message),
        }
    }
}

/// Runs until every command sender is gone and no work is left. If the loop
/// panics, the panic ends here: the loaded flag is cleared and the message
/// kept, so `/ready` and `/health` answer 503 with it and new requests get
/// 503 instead of hanging on a thread that is gone.
pub fn run(
    engine: Engine<'_>,
    commands: Receiver<Command>,
    gauges: &Gauges,
    max_queue: usize,
    latency: &LatencyMetrics,
) {
    watch(gauges, || {
        serve_commands(engine, commands, gauges, max_queue, latency)
    });
}

/// Runs `body` (the engine loop); whichever way it ends the loaded flag is
/// cleared, and a panic is recorded as `engine thread panicked: <message>`.
fn watch(gauges: &Gauges, body: impl FnOnce()) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    gauges.loaded.store(false, Ordering::Release);
    if let Err(payload) = result {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_string());
        let message = format!("engine thread panicked: {message}");
        tracing::error!("{message}");
        gauges.record_failure(message);
    }
}

fn serve_commands(
    mut engine: Engine<'_>,
    commands: Receiver<Command>,
    gauges: &Gauges,
    max_queue: usize,
    latency: &LatencyMetrics,
) {
    gauges
        .kv_blocks_total
        .store(engine.kv_blocks_total(), Ordering::Relaxed);
    gauges.loaded.store(true, Ordering::Release);
    let mut open = true;
    loop {
        // Idle: wait for work (with a timeout, to notice abandoned requests).
        if !engine.has_work() {
            if !open {
                break;
            }
            match commands.recv_timeout(Duration::from_millis(200)) {
                Ok(command) => handle(&mut engine, command, max_queue, open),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        }
        loop {
            match commands.try_recv() {
                Ok(command) => handle(&mut engine, command, max_queue, open),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let started = Instant::now();
        match engine.step() {
            Ok(report) => latency.observe_step(
                started.elapsed().as_secs_f64(),
                report.tokens,
                report.sampled,
            ),
            Err(e) => {
                gauges.step_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!("engine step failed: {e}");
                engine.fail_all(&e.to_string());
            }
        }
        gauges
            .running
            .store(engine.num_running(), Ordering::Relaxed);
        gauges
            .waiting
            .store(engine.num_waiting(), Ordering::Relaxed);
        gauges
            .kv_blocks_used
            .store(engine.kv_blocks_used(), Ordering::Relaxed);
        gauges
            .kv_blocks_cached
            .store(engine.kv_blocks_cached(), Ordering::Relaxed);
    }
}

fn handle(engine: &mut Engine<'_>, command: Command, max_queue: usize, open: bool) {
    match command {
        Command::Submit {
            request,
            sinks,
            reply,
        } => {
            let result = if !open {
                Err(SubmitError::ShuttingDown)
            } else if !queue_has_room(engine.num_waiting(), sinks.len(), max_queue) {
                Err(SubmitError::QueueFull)
            } else {
                engine
                    .add_request_group(request, sinks)
                    .map_err(SubmitError::Admission)
            };
            // The client may have left already; its sequence then ends at the next step.
            let _ = reply.send(result);
        }
    }
}

/// Whether `choices` more sequences may join `waiting` ones: every choice
/// counts, and a group larger than the whole queue still gets in when the
/// queue is empty (else it could never be served).
fn queue_has_room(waiting: usize, choices: usize, max_queue: usize) -> bool {
    waiting + choices <= max_queue.max(choices)
}

/// A handle to submit work to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    pub commands: std::sync::mpsc::Sender<Command>,
    pub gauges: Arc<Gauges>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_choice_of_a_group_counts_against_the_queue() {
        assert!(queue_has_room(0, 1, 4));
        assert!(queue_has_room(3, 1, 4));
        assert!(!queue_has_room(4, 1, 4));
        assert!(queue_has_room(1, 3, 4));
        assert!(!queue_has_room(2, 3, 4));
        // Larger than the queue: only into an empty one.
        assert!(queue_has_room(0, 6, 4));
        assert!(!queue_has_room(1, 6, 4));
    }

    #[test]
    fn a_loop_that_returns_clears_loaded_without_a_failure() {
        let gauges = Gauges::default();
        watch(&gauges, || gauges.loaded.store(true, Ordering::Release));
        assert!(!gauges.loaded.load(Ordering::Acquire));
        assert_eq!(gauges.failure(), None);
    }

    #[test]
    fn a_loop_that_panics_clears_loaded_and_keeps_the_message() {
        let gauges = Gauges::default();
        watch(&gauges, || {
            gauges.loaded.store(true, Ordering::Release);
            let index = gauges.running.load(Ordering::Relaxed) + 3;
            panic!("block {index} out of range");
        });
        assert!(!gauges.loaded.load(Ordering::Acquire));
        assert_eq!(
            gauges.failure().as_deref(),
            Some("engine thread panicked: block 3 out of range")
        );
        watch(&gauges, || std::panic::panic_any(7u8));
        assert_eq!(
            gauges.failure().as_deref(),
            Some("engine thread panicked: (no message)")
        );
    }
}
