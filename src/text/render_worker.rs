//! Chat templates rendered in child processes (`sparkrt render-worker`)
//! whose address space is capped: the one bound `render_limits` cannot give
//! inside the server. A template that builds a huge value without writing
//! it (`ns.s = ns.s ~ ns.s` in a loop: one instruction per doubling) would
//! make an allocation fail, and a failed allocation aborts the process.
//! In a worker only the worker dies: the request gets a 400 naming
//! `max_template_memory_bytes`, and the next rendering starts a new worker.
//!
//! Protocol, one JSON object per line each way: the parent starts
//! `sparkrt render-worker BYTES` (the worker caps itself at BYTES before it
//! reads anything), sends the template source once (`{"source": ...}`) and
//! waits for `ready`; then per rendering `{"context": {...}, "limits": {...}}`
//! (the variables the template sees, as `ChatTemplate` builds them), to
//! which the worker answers `{"text": ...}`, `{"over": LIMIT}` or
//! `{"failed": MESSAGE}`. At most `workers` run at once; idle ones are kept
//! for the next rendering. The worker's side is `render_worker_main`.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use minijinja::Value;
use serde::{Deserialize, Serialize};

use super::error::TextError;
use super::render_limits::{RenderLimits, TemplateLimit};

/// Address space of one worker: the template's values and the rendered
/// text (at most `max_template_output_bytes`) with room to spare.
pub const DEFAULT_WORKER_MEMORY_BYTES: u64 = 512 << 20;
/// Workers rendering at once (renderings take about a millisecond; a
/// runaway one is bounded by its fuel, under a second).
pub const DEFAULT_WORKERS: usize = 4;
/// The subcommand a worker runs.
pub const WORKER_COMMAND: &str = "render-worker";
/// What a worker says once it is capped and its template compiled.
pub(super) const READY: &str = "ready";
/// Longest line of the protocol that is not a rendering's reply.
const MAX_CONTROL_LINE: u64 = 4096;
/// Longest error message a worker sends (a template may raise an exception
/// holding a huge value).
pub(super) const MAX_MESSAGE_BYTES: usize = 4096;

/// The pool of workers of one template.
pub struct RenderWorkers {
    exe: PathBuf,
    source: String,
    memory_bytes: u64,
    pool: Mutex<Pool>,
    changed: Condvar,
}

/// Idle workers and how many more may start, changed only together (under
/// one lock, so a release between a waiter's check and its wait is seen).
struct Pool {
    idle: Vec<Worker>,
    /// Workers that may still start (idle ones count as started).
    free: usize,
}

impl std::fmt::Debug for RenderWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderWorkers")
            .field("exe", &self.exe)
            .field("memory_bytes", &self.memory_bytes)
            .finish_non_exhaustive()
    }
}

/// One running worker and its pipes.
struct Worker {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Serialize, Deserialize)]
pub(super) struct Init {
    pub(super) source: String,
}

#[derive(Serialize)]
struct Request<'a> {
    context: &'a BTreeMap<&'a str, Value>,
    limits: WireLimits,
}

#[derive(Deserialize)]
pub(super) struct OwnedRequest {
    pub(super) context: Value,
    pub(super) limits: WireLimits,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
pub(super) struct WireLimits {
    fuel: u64,
    max_output_bytes: usize,
    max_time_us: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Reply {
    Text(String),
    Over(WireLimit),
    Failed(String),
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum WireLimit {
    Fuel(u64),
    OutputBytes(usize),
    TimeUs(u64),
}

pub(super) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl From<RenderLimits> for WireLimits {
    fn from(l: RenderLimits) -> WireLimits {
        WireLimits {
            fuel: l.fuel,
            max_output_bytes: l.max_output_bytes,
            max_time_us: micros(l.max_time),
        }
    }
}

impl From<WireLimits> for RenderLimits {
    fn from(l: WireLimits) -> RenderLimits {
        RenderLimits {
            fuel: l.fuel,
            max_output_bytes: l.max_output_bytes,
            max_time: Duration::from_micros(l.max_time_us),
        }
    }
}

impl RenderWorkers {
    /// Workers running `exe render-worker` for `source`, each capped at
    /// `memory_bytes` of address space; started on first use.
    pub fn new(exe: PathBuf, source: String, memory_bytes: u64, workers: usize) -> RenderWorkers {
        RenderWorkers {
            exe,
            source,
            memory_bytes,
            pool: Mutex::new(Pool {
                idle: Vec::new(),
                free: workers.max(1),
            }),
            changed: Condvar::new(),
        }
    }

    /// Starts one worker now and checks that it answers, so a worker that
    /// cannot run is a start-up error, not every chat request's.
    pub fn check(&self) -> Result<(), TextError> {
        let worker = self.acquire()?;
        self.release(Some(worker));
        Ok(())
    }

    /// Renders `context` under `limits` in a worker, waiting for one when
    /// all are busy. A worker found dead before the request reached it (an
    /// idle one killed from outside) is replaced once.
    pub(crate) fn render(
        &self,
        context: &BTreeMap<&str, Value>,
        limits: RenderLimits,
    ) -> Result<String, TextError> {
        // Serialized once, here: a failure is this request's, not a worker's.
        let request = serde_json::to_vec(&Request {
            context,
            limits: limits.into(),
        })
        .map_err(|e| TextError::TemplateWorker {
            message: format!("chat template: the context does not serialize: {e}"),
        })?;
        for attempt in 0..2 {
            let mut worker = self.acquire()?;
            match exchange(&mut worker, &request, limits) {
                Ok(reply) => {
                    self.release(Some(worker));
                    return reply;
                }
                Err(Gone::BeforeRequest) if attempt == 0 => {
                    drop(worker);
                    self.release(None);
                }
                Err(gone) => {
                    let error = gone.error(&mut worker, self.memory_bytes);
                    drop(worker);
                    self.release(None);
                    return Err(error);
                }
            }
        }
        Err(unavailable("its workers keep dying before they are asked"))
    }

    /// An idle live worker, or a new one while fewer than `workers` exist.
    fn acquire(&self) -> Result<Worker, TextError> {
        let mut pool = lock(&self.pool);
        loop {
            while let Some(mut worker) = pool.idle.pop() {
                if matches!(worker.child.try_wait(), Ok(None)) {
                    return Ok(worker);
                }
                // Died while idle (killed from outside): its slot is free.
                pool.free += 1;
            }
            if pool.free > 0 {
                pool.free -= 1;
                break;
            }
            pool = self
                .changed
                .wait(pool)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        drop(pool);
        self.spawn().inspect_err(|_| self.release(None))
    }

    /// Returns a worker to the pool, or its slot when it is gone.
    fn release(&self, worker: Option<Worker>) {
        let mut pool = lock(&self.pool);
        match worker {
            Some(worker) => pool.idle.push(worker),
            None => pool.free += 1,
        }
        self.changed.notify_one();
    }

    fn spawn(&self) -> Result<Worker, TextError> {
        let failed = |e: io::Error| unavailable(&format!("starting a worker: {e}"));
        // Without a pre-exec hook std spawns with posix_spawn, so a server
        // holding many GiB of mappings starts a worker without copying its
        // page tables; the worker caps its own address space first thing.
        let mut child = Command::new(&self.exe)
            .arg(WORKER_COMMAND)
            .arg(self.memory_bytes.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(failed)?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(failed(io::Error::other("no pipes")));
        };
        let mut worker = Worker {
            child,
            stdin: BufWriter::new(stdin),
            stdout: BufReader::new(stdout),
        };
        let init = serde_json::to_vec(&Init {
            source: self.source.clone(),
        })
        .map_err(|e| failed(io::Error::other(e)))?;
        write_line(&mut worker.stdin, &init).map_err(failed)?;
        // The worker answers the init once it is capped and compiled.
        let mut line = String::new();
        (&mut worker.stdout)
            .take(MAX_CONTROL_LINE)
            .read_line(&mut line)
            .map_err(failed)?;
        if line.trim_end() != READY {
            return Err(unavailable(&format!(
                "a worker did not start (it said {:?})",
                line.trim_end()
            )));
        }
        Ok(worker)
    }
}

/// Why an exchange ended without a reply.
enum Gone {
    /// The worker was dead before it read the request (a broken pipe).
    BeforeRequest,
    /// It closed its output while rendering: it is exiting.
    Closed,
    /// It answered what cannot be a reply.
    During,
}

/// How long a worker that closed its output may take to finish exiting:
/// the kernel closes a dying process's files before it reports its exit.
const EXIT_GRACE: Duration = Duration::from_secs(2);

impl Gone {
    /// The request's error; a worker that still runs is stopped.
    fn error(self, worker: &mut Worker, memory_bytes: u64) -> TextError {
        if matches!(self, Gone::Closed) {
            let deadline = std::time::Instant::now() + EXIT_GRACE;
            while matches!(worker.child.try_wait(), Ok(None))
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        match worker.child.try_wait() {
            Ok(Some(status)) => died(Some(status), memory_bytes),
            Ok(None) => {
                // Alive but its reply broke the protocol: the pipe may
                // hold more, so it cannot serve again.
                let _ = worker.child.kill();
                let _ = worker.child.wait();
                unavailable("a worker sent what is not a reply; it was stopped")
            }
            Err(_) => died(worker.child.wait().ok(), memory_bytes),
        }
    }
}

/// The error of a worker that cannot render: the server's fault (a 500),
/// not the template's.
fn unavailable(why: &str) -> TextError {
    TextError::TemplateWorkerUnavailable {
        why: why.to_string(),
    }
}

/// One request (serialized) and its reply; `Err` when the worker is gone.
fn exchange(
    worker: &mut Worker,
    request: &[u8],
    limits: RenderLimits,
) -> Result<Result<String, TextError>, Gone> {
    write_line(&mut worker.stdin, request).map_err(|e| match e.kind() {
        io::ErrorKind::BrokenPipe => Gone::BeforeRequest,
        _ => Gone::During,
    })?;
    // The reply holds at most the capped text JSON-escaped (≤ 6 bytes a
    // byte), or a message the worker cuts to MAX_MESSAGE_BYTES.
    let bound = limits
        .max_output_bytes
        .max(MAX_MESSAGE_BYTES)
        .saturating_mul(6)
        .saturating_add(MAX_CONTROL_LINE as usize) as u64;
    let mut line = String::new();
    match (&mut worker.stdout).take(bound).read_line(&mut line) {
        Ok(_) if line.ends_with('\n') => {}
        // End of file short of the bound: the worker closed its output.
        Ok(n) if (n as u64) < bound => return Err(Gone::Closed),
        _ => return Err(Gone::During),
    }
    let reply: Reply = serde_json::from_str(&line).map_err(|_| Gone::During)?;
    Ok(match reply {
        Reply::Text(text) => Ok(text),
        Reply::Over(limit) => Err(TextError::TemplateOverLimit {
            limit: match limit {
                WireLimit::Fuel(n) => TemplateLimit::Fuel(n),
                WireLimit::OutputBytes(n) => TemplateLimit::OutputBytes(n),
                WireLimit::TimeUs(us) => TemplateLimit::Time(Duration::from_micros(us)),
            },
        }),
        Reply::Failed(message) => Err(TextError::TemplateWorker { message }),
    })
}

/// The error of a rendering whose worker died: the memory cap when it
/// aborted (a failed allocation aborts: SIGABRT), else a server fault.
fn died(status: Option<ExitStatus>, memory_bytes: u64) -> TextError {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if status.and_then(|s| s.signal()) == Some(libc::SIGABRT) {
            return TextError::TemplateOverLimit {
                limit: TemplateLimit::MemoryBytes(memory_bytes),
            };
        }
    }
    let _ = memory_bytes;
    unavailable(&format!(
        "a worker exited while rendering ({})",
        status.map_or("unknown status".to_string(), |s| s.to_string())
    ))
}

pub(super) fn write_line(out: &mut impl Write, line: &[u8]) -> io::Result<()> {
    out.write_all(line)?;
    out.write_all(b"\n")?;
    out.flush()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_that_cannot_start_is_a_server_fault_and_frees_its_slot() {
        let workers = RenderWorkers::new("/nonexistent/sparkrt".into(), "x".into(), 1 << 30, 1);
        for _ in 0..3 {
            let err = workers.check().unwrap_err();
            assert!(
                matches!(err, TextError::TemplateWorkerUnavailable { .. }),
                "{err}"
            );
        }
    }
}
