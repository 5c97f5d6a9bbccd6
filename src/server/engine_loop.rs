//! The engine thread: owns the engine, takes submissions between steps,
//! steps while there is work, and publishes gauges for `/metrics`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::latency::LatencyMetrics;
use crate::backend::BackendError;
use crate::engine::{AdmissionError, Engine, EngineError, EventSink, Request, SeqId};
use crate::model::ModelError;

/// Steps in a row that may fail (an executor error, or sampling refusing
/// the model's NaN/infinite logits) before the engine is declared broken
/// (a fatal error, [`EngineError::is_fatal`], breaks it at once):
/// one failing step can be a request's bad luck, three in a row with
/// nothing working in between is the model or the device. The engine
/// thread then ends, `/ready` answers 503 with the reason, and the process
/// exits non-zero after [`ENGINE_FAILURE_GRACE`] (see `cli::serve`), so an
/// orchestrator restarts it instead of routing requests to a server that
/// fails them all.
pub const MAX_CONSECUTIVE_STEP_FAILURES: u32 = 3;

/// How long a server whose engine is gone keeps answering (503 with the
/// reason on `/ready`, `/health` and the generation routes) before it exits:
/// long enough for a readiness probe (kubelet's default period is 10 s) to
/// see why before the process goes.
pub const ENGINE_FAILURE_GRACE: Duration = Duration::from_secs(15);

/// Why a submission was refused.
#[derive(Debug)]
pub enum SubmitError {
    Admission(AdmissionError),
    QueueFull,
    ShuttingDown,
}

/// One prompt and its choices (`n`, `best_of`).
pub struct Group {
    pub request: Request,
    /// Where each choice's events go (the handler's channel), choice j at
    /// `sinks[j]`.
    pub sinks: Vec<Box<dyn EventSink>>,
}

pub enum Command {
    /// One request's prompts (a batched completions request has several),
    /// queued together or not at all: the queue's room is checked for all
    /// their choices at once, so a batch no larger than `max_choices` is
    /// always admitted into an empty queue, whatever `--max-queue` is.
    Submit {
        groups: Vec<Group>,
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
    /// Recurrent-state snapshots the prefix cache holds (hybrid models).
    pub state_snapshots_cached: AtomicUsize,
    pub step_errors: AtomicU64,
    pub loaded: AtomicBool,
    /// Why the engine thread ended before the server did (a panic, or
    /// [`MAX_CONSECUTIVE_STEP_FAILURES`] failed steps).
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

/// What the engine thread is run with besides the engine.
pub struct LoopOptions {
    pub max_queue: usize,
    /// Test fault injection (the hidden `serve --fault-engine-panic-after-steps`):
    /// the loop panics after this many steps that did work.
    pub panic_after_steps: Option<u64>,
    /// Test fault injection (the hidden `serve --fault-device-lost-after-steps`):
    /// after this many steps that did work, the next step fails with the
    /// error a sticky CUDA fault gives ([`BackendError::DeviceLost`]).
    pub device_lost_after_steps: Option<u64>,
}

/// Runs until every command sender is gone and no work is left, or until
/// [`MAX_CONSECUTIVE_STEP_FAILURES`] steps in a row have failed. If the
/// loop panics, the panic ends here. Either failure clears the loaded flag
/// and keeps the reason, so `/ready` and `/health` answer 503 with it and
/// new requests get 503 instead of hanging on a thread that is gone.
pub fn run(
    engine: Engine<'_>,
    commands: Receiver<Command>,
    gauges: &Gauges,
    options: &LoopOptions,
    latency: &LatencyMetrics,
) {
    watch(gauges, || {
        if let Err(broken) = serve_commands(engine, commands, gauges, options, latency) {
            tracing::error!("{broken}");
            gauges.record_failure(broken);
        }
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

/// The loop; `Err(reason)` when the engine is broken (failed steps).
fn serve_commands(
    mut engine: Engine<'_>,
    commands: Receiver<Command>,
    gauges: &Gauges,
    options: &LoopOptions,
    latency: &LatencyMetrics,
) -> Result<(), String> {
    let max_queue = options.max_queue;
    let mut failures = FailedSteps::default();
    let mut steps_with_work = 0u64;
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
        let result = if options
            .device_lost_after_steps
            .is_some_and(|n| steps_with_work >= n)
        {
            Err(EngineError::from(ModelError::from(
                BackendError::DeviceLost(format!(
                    "injected fault: CUDA_ERROR_ILLEGAL_ADDRESS after {steps_with_work} steps"
                )),
            )))
        } else {
            engine.step()
        };
        let failed = match result {
            Ok(report) => {
                latency.observe_step(
                    started.elapsed().as_secs_f64(),
                    report.tokens,
                    report.sampled,
                );
                if report.tokens > 0 {
                    steps_with_work += 1;
                }
                match report.failure {
                    Some(why) => Some(why),
                    None if report.tokens > 0 => {
                        failures.succeeded();
                        None
                    }
                    // An empty step says nothing either way.
                    None => None,
                }
            }
            Err(e) if e.is_fatal() => {
                // Nothing can run any more (a lost device): stop now, so
                // the process exits and is restarted, instead of failing
                // every request that follows.
                gauges.step_errors.fetch_add(1, Ordering::Relaxed);
                let broken = format!("engine step failed fatally: {e}");
                engine.fail_all(&broken);
                return Err(broken);
            }
            Err(e) => {
                engine.fail_all(&e.to_string());
                Some(format!("engine step failed: {e}"))
            }
        };
        if let Some(why) = failed {
            gauges.step_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("{why}");
            if let Some(broken) = failures.failed(why) {
                // Whatever is queued would fail the same way.
                engine.fail_all(&broken);
                return Err(broken);
            }
        }
        if options
            .panic_after_steps
            .is_some_and(|n| steps_with_work >= n)
        {
            panic!("injected fault: the engine thread panics after {steps_with_work} steps");
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
        gauges
            .state_snapshots_cached
            .store(engine.state_snapshots(), Ordering::Relaxed);
    }
    Ok(())
}

/// Failed steps since the last one that worked.
#[derive(Debug, Default)]
struct FailedSteps {
    in_a_row: u32,
}

impl FailedSteps {
    fn succeeded(&mut self) {
        self.in_a_row = 0;
    }

    /// Counts a failed step; the reason the engine is broken once
    /// [`MAX_CONSECUTIVE_STEP_FAILURES`] have failed in a row.
    fn failed(&mut self, why: String) -> Option<String> {
        self.in_a_row += 1;
        (self.in_a_row >= MAX_CONSECUTIVE_STEP_FAILURES).then(|| {
            format!(
                "engine failed {} consecutive steps, the last: {why}",
                self.in_a_row
            )
        })
    }
}

fn handle(engine: &mut Engine<'_>, command: Command, max_queue: usize, open: bool) {
    match command {
        Command::Submit { groups, reply } => {
            let choices = groups.iter().map(|g| g.sinks.len()).sum();
            let result = if !open {
                Err(SubmitError::ShuttingDown)
            } else if !queue_has_room(engine.num_waiting(), choices, max_queue) {
                Err(SubmitError::QueueFull)
            } else {
                add_groups(engine, groups)
            };
            // The client may have left already; its sequences then end at the next step.
            let _ = reply.send(result);
        }
    }
}

/// Adds every group, or none: a group the engine refuses aborts the ones
/// added before it.
fn add_groups(engine: &mut Engine<'_>, groups: Vec<Group>) -> Result<Vec<SeqId>, SubmitError> {
    let mut ids = Vec::new();
    for group in groups {
        match engine.add_request_group(group.request, group.sinks) {
            Ok(added) => ids.extend(added),
            Err(e) => {
                for id in ids {
                    engine.abort(id);
                }
                return Err(SubmitError::Admission(e));
            }
        }
    }
    Ok(ids)
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
    fn only_failures_in_a_row_break_the_engine() {
        let mut steps = FailedSteps::default();
        assert_eq!(steps.failed("a".into()), None);
        assert_eq!(steps.failed("b".into()), None);
        steps.succeeded();
        assert_eq!(steps.failed("c".into()), None);
        assert_eq!(steps.failed("d".into()), None);
        assert_eq!(
            steps.failed("sampling failed: NaN".into()).as_deref(),
            Some("engine failed 3 consecutive steps, the last: sampling failed: NaN")
        );
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
