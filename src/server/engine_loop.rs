//! The engine thread: owns the engine, takes submissions between steps,
//! steps while there is work, and publishes gauges for `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::backend::Backend;
use crate::engine::{AdmissionError, Engine, Event, Request, SeqId};

/// Why a submission was refused.
#[derive(Debug)]
pub enum SubmitError {
    Admission(AdmissionError),
    QueueFull,
    ShuttingDown,
}

pub enum Command {
    Submit {
        request: Request,
        events: mpsc::UnboundedSender<Event>,
        reply: oneshot::Sender<Result<SeqId, SubmitError>>,
    },
}

/// Live figures of the engine, written by its thread after each step.
#[derive(Debug, Default)]
pub struct Gauges {
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub kv_blocks_used: AtomicUsize,
    pub kv_blocks_total: AtomicUsize,
    pub step_errors: AtomicU64,
    pub loaded: AtomicBool,
}

/// Runs until every command sender is gone and no work is left.
pub fn run<B: Backend>(
    mut engine: Engine<'_, B>,
    commands: Receiver<Command>,
    gauges: &Gauges,
    max_queue: usize,
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
        if let Err(e) = engine.step() {
            gauges.step_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("engine step failed: {e}");
            engine.fail_all(&e.to_string());
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
    }
    gauges.loaded.store(false, Ordering::Release);
}

fn handle<B: Backend>(engine: &mut Engine<'_, B>, command: Command, max_queue: usize, open: bool) {
    match command {
        Command::Submit {
            request,
            events,
            reply,
        } => {
            let result = if !open {
                Err(SubmitError::ShuttingDown)
            } else if engine.num_waiting() >= max_queue {
                Err(SubmitError::QueueFull)
            } else {
                engine
                    .add_request(request, Box::new(events))
                    .map_err(SubmitError::Admission)
            };
            // The client may have left already; its sequence then ends at the next step.
            let _ = reply.send(result);
        }
    }
}

/// A handle to submit work to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    pub commands: std::sync::mpsc::Sender<Command>,
    pub gauges: Arc<Gauges>,
}
