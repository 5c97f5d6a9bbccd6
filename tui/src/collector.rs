//! The collector: once per interval it reads the host, the process table and
//! the server, and sends one [`Sample`] to the draw loop. It runs on its own
//! thread so the screen never waits on a slow server.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::client::ServerClient;
use crate::event::AppEvent;
use crate::host::HostSource;
use crate::link::LinkTracker;
use crate::processes::ProcessTable;
use crate::rates::CounterRate;

// The sample is plain data in its own module, so the event channel can carry
// it without importing the collector (which sends on that channel).
pub use crate::sample::Sample;

pub struct Collector {
    host: Box<dyn HostSource>,
    client: ServerClient,
    processes: Option<(ProcessTable, usize)>,
    link: LinkTracker,
    generation_rate: CounterRate,
    prompt_rate: CounterRate,
}

impl Collector {
    /// A collector that reads no process table (see [`Collector::with_processes`]).
    pub fn new(host: Box<dyn HostSource>, client: ServerClient) -> Collector {
        Collector {
            host,
            client,
            processes: None,
            link: LinkTracker::default(),
            generation_rate: CounterRate::default(),
            prompt_rate: CounterRate::default(),
        }
    }

    /// Also read the `limit` largest processes by RSS each round.
    pub fn with_processes(mut self, limit: usize) -> Collector {
        self.processes = Some((ProcessTable::new(), limit));
        self
    }

    /// One round: host, processes, then the server (each request bounded by
    /// the client's timeout). `/v1/stats` is only asked once `/v1/memory`
    /// answered, so a dead server costs one timeout per round, not two.
    pub fn collect(&mut self) -> Sample {
        let host = self.host.read();
        let gpu = host
            .as_ref()
            .map(|h| h.gpu_processes.as_slice())
            .unwrap_or_default();
        let processes = match &mut self.processes {
            Some((table, limit)) => table.read(*limit, gpu),
            None => Vec::new(),
        };

        let (server, stats, loading) = match self.client.memory() {
            Ok(memory) => {
                self.link.record_success();
                let stats = self.client.stats().map_err(|e| e.to_string());
                (Some(memory), Some(stats), None)
            }
            // A starting server answers /v1/memory 503 and /health with
            // its progress.
            Err(error) => match self.client.loading() {
                Some(loading) => {
                    self.link.record_success();
                    (None, None, Some(loading))
                }
                None => {
                    self.link.record_failure(error.to_string());
                    (None, None, None)
                }
            },
        };
        let taken_at = Instant::now();
        let serving = stats.as_ref().and_then(|m| m.as_ref().ok());
        let generation_tokens_per_s = self
            .generation_rate
            .update(taken_at, serving.map(|m| m.generation_tokens_total as f64));
        let prompt_tokens_per_s = self
            .prompt_rate
            .update(taken_at, serving.map(|m| m.prompt_tokens_total as f64));

        Sample {
            taken_at,
            host,
            processes,
            link: self.link.link(),
            server,
            stats,
            generation_tokens_per_s,
            prompt_tokens_per_s,
            loading,
        }
    }
}

/// Runs `collector` every `interval` on a new thread, sending each sample to
/// `events`. The thread ends when `stop` receives or is dropped, or when the
/// draw loop has gone (`events` closed).
pub fn spawn(
    mut collector: Collector,
    interval: Duration,
    events: Sender<AppEvent>,
    stop: Receiver<()>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sparkrt-top-collector".to_string())
        .spawn(move || {
            loop {
                let started = Instant::now();
                let sample = collector.collect();
                if events.send(AppEvent::Sample(Box::new(sample))).is_err() {
                    return;
                }
                let wait = interval.saturating_sub(started.elapsed());
                match stop.recv_timeout(wait) {
                    Err(RecvTimeoutError::Timeout) => continue,
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        })
}
