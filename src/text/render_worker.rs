//! Chat templates rendered in child processes (`sparkrt render-worker`)
//! whose address space is capped: the one bound `render_limits` cannot give
//! inside the server. A template that builds a huge value without writing
//! it (`ns.s = ns.s ~ ns.s` in a loop: one instruction per doubling) would
//! make an allocation fail, and a failed allocation aborts the process.
//! In a worker only the worker dies: the request gets a 400 naming
//! `max_template_memory_bytes`, and the next rendering starts a new worker.
//!
//! Protocol, one JSON object per line each way: the parent sends the
//! template source once (`{"source": ...}`), then per rendering
//! `{"context": {...}, "limits": {...}}` (the variables the template sees,
//! as `ChatTemplate` builds them); the worker answers `{"text": ...}`,
//! `{"over": LIMIT}` or `{"failed": MESSAGE}`. At most `workers` run at once;
//! idle ones are kept for the next rendering.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use minijinja::Value;
use serde::{Deserialize, Serialize};

use super::chat::ChatTemplate;
use super::config_files::SpecialTokens;
use super::error::TextError;
use super::render_limits::{RenderLimits, TemplateLimit};

/// Address space of one worker: the template's values and the rendered
/// text (at most `max_template_output_bytes`) with room to spare, and a
/// bound the host can afford `DEFAULT_WORKERS` times over.
pub const DEFAULT_WORKER_MEMORY_BYTES: u64 = 1 << 30;
/// Workers rendering at once.
pub const DEFAULT_WORKERS: usize = 2;
/// The subcommand a worker runs.
pub const WORKER_COMMAND: &str = "render-worker";

/// The pool of workers of one template.
pub struct RenderWorkers {
    exe: PathBuf,
    source: String,
    memory_bytes: u64,
    idle: Mutex<Vec<Worker>>,
    /// Workers that may still start (idle ones count as started).
    free: Mutex<usize>,
    freed: Condvar,
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
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Serialize, Deserialize)]
struct Init {
    source: String,
}

#[derive(Serialize)]
struct Request<'a> {
    context: &'a BTreeMap<&'a str, Value>,
    limits: WireLimits,
}

#[derive(Deserialize)]
struct OwnedRequest {
    context: Value,
    limits: WireLimits,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
struct WireLimits {
    fuel: u64,
    max_output_bytes: usize,
    max_time_ms: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    Text(String),
    Over(WireLimit),
    Failed(String),
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum WireLimit {
    Fuel(u64),
    OutputBytes(usize),
    TimeMs(u64),
}

impl From<RenderLimits> for WireLimits {
    fn from(l: RenderLimits) -> WireLimits {
        WireLimits {
            fuel: l.fuel,
            max_output_bytes: l.max_output_bytes,
            max_time_ms: u64::try_from(l.max_time.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl From<WireLimits> for RenderLimits {
    fn from(l: WireLimits) -> RenderLimits {
        RenderLimits {
            fuel: l.fuel,
            max_output_bytes: l.max_output_bytes,
            max_time: Duration::from_millis(l.max_time_ms),
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
            idle: Mutex::new(Vec::new()),
            free: Mutex::new(workers.max(1)),
            freed: Condvar::new(),
        }
    }

    /// Renders `context` under `limits` in a worker, waiting for one when
    /// all are busy.
    pub(crate) fn render(
        &self,
        context: &BTreeMap<&str, Value>,
        limits: RenderLimits,
    ) -> Result<String, TextError> {
        let mut worker = self.acquire()?;
        let result = exchange(&mut worker, context, limits);
        match result {
            Ok(reply) => {
                self.release(Some(worker));
                reply
            }
            Err(_) => {
                // The worker died (or its pipes broke): why decides the error.
                let status = worker.child.wait().ok();
                self.release(None);
                Err(died(status, self.memory_bytes))
            }
        }
    }

    /// An idle worker, or a new one while fewer than `workers` exist.
    fn acquire(&self) -> Result<Worker, TextError> {
        if let Some(worker) = lock(&self.idle).pop() {
            return Ok(worker);
        }
        let mut free = lock(&self.free);
        loop {
            if let Some(worker) = lock(&self.idle).pop() {
                return Ok(worker);
            }
            if *free > 0 {
                *free -= 1;
                break;
            }
            free = self
                .freed
                .wait(free)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        drop(free);
        self.spawn().inspect_err(|_| self.release(None))
    }

    /// Returns a worker to the pool, or its slot when it is gone.
    fn release(&self, worker: Option<Worker>) {
        match worker {
            Some(worker) => lock(&self.idle).push(worker),
            None => *lock(&self.free) += 1,
        }
        self.freed.notify_one();
    }

    fn spawn(&self) -> Result<Worker, TextError> {
        let failed = |e: io::Error| TextError::TemplateWorker {
            message: format!("starting {} {WORKER_COMMAND}: {e}", self.exe.display()),
        };
        let mut command = Command::new(&self.exe);
        command
            .arg(WORKER_COMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        cap_address_space(&mut command, self.memory_bytes);
        let mut child = command.spawn().map_err(failed)?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(failed(io::Error::other("no pipes")));
        };
        let mut worker = Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        };
        let init = Init {
            source: self.source.clone(),
        };
        write_line(&mut worker.stdin, &init).map_err(failed)?;
        Ok(worker)
    }
}

/// Sets the child's `RLIMIT_AS` before it runs.
#[cfg(unix)]
fn cap_address_space(command: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only setrlimit, which is async-signal-safe; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: bytes as libc::rlim_t,
                rlim_max: bytes as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
    }
}

#[cfg(not(unix))]
fn cap_address_space(_command: &mut Command, _bytes: u64) {}

/// One request and its reply; `Err` when the worker is gone.
fn exchange(
    worker: &mut Worker,
    context: &BTreeMap<&str, Value>,
    limits: RenderLimits,
) -> io::Result<Result<String, TextError>> {
    let request = Request {
        context,
        limits: limits.into(),
    };
    write_line(&mut worker.stdin, &request)?;
    // The reply holds at most the capped text, JSON-escaped (≤ 6 bytes a byte).
    let bound = limits
        .max_output_bytes
        .saturating_mul(6)
        .saturating_add(4096) as u64;
    let mut line = String::new();
    (&mut worker.stdout).take(bound).read_line(&mut line)?;
    if !line.ends_with('\n') {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "worker gone"));
    }
    let reply: Reply = serde_json::from_str(&line).map_err(io::Error::other)?;
    Ok(match reply {
        Reply::Text(text) => Ok(text),
        Reply::Over(limit) => Err(TextError::TemplateOverLimit {
            limit: match limit {
                WireLimit::Fuel(n) => TemplateLimit::Fuel(n),
                WireLimit::OutputBytes(n) => TemplateLimit::OutputBytes(n),
                WireLimit::TimeMs(ms) => TemplateLimit::Time(Duration::from_millis(ms)),
            },
        }),
        Reply::Failed(message) => Err(TextError::TemplateWorker { message }),
    })
}

/// The error of a rendering whose worker died: the memory cap when it was
/// killed by a signal (a failed allocation aborts), else the exit status.
fn died(status: Option<ExitStatus>, memory_bytes: u64) -> TextError {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if status.is_some_and(|s| s.signal().is_some()) {
            return TextError::TemplateOverLimit {
                limit: TemplateLimit::MemoryBytes(memory_bytes),
            };
        }
    }
    let _ = memory_bytes;
    TextError::TemplateWorker {
        message: format!(
            "the chat template's worker exited ({})",
            status.map_or("unknown status".to_string(), |s| s.to_string())
        ),
    }
}

fn write_line(out: &mut impl Write, value: &impl Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *out, value).map_err(io::Error::other)?;
    out.write_all(b"\n")?;
    out.flush()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The worker's side (`sparkrt render-worker`): reads the template, then
/// renders each request from stdin onto stdout until stdin closes.
pub fn serve_stdio() -> io::Result<()> {
    let stdin = io::stdin();
    let mut input = stdin.lock();
    let mut stdout = io::stdout().lock();
    let mut line = String::new();
    input.read_line(&mut line)?;
    let init: Init = serde_json::from_str(&line).map_err(io::Error::other)?;
    // The parent compiled the same source already; an error here is its bug.
    let mut template = ChatTemplate::from_source(init.source, SpecialTokens::default())
        .map_err(|e| io::Error::other(e.to_string()))?;
    loop {
        line.clear();
        if input.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let request: OwnedRequest = serde_json::from_str(&line).map_err(io::Error::other)?;
        template.set_limits(request.limits.into());
        let reply = match template.render_here(&request.context) {
            Ok(text) => Reply::Text(text),
            Err(TextError::TemplateOverLimit { limit }) => match limit {
                TemplateLimit::Fuel(n) => Reply::Over(WireLimit::Fuel(n)),
                TemplateLimit::OutputBytes(n) => Reply::Over(WireLimit::OutputBytes(n)),
                TemplateLimit::Time(t) => Reply::Over(WireLimit::TimeMs(
                    u64::try_from(t.as_millis()).unwrap_or(u64::MAX),
                )),
                // Only the parent sees a worker run out of memory.
                other @ TemplateLimit::MemoryBytes(_) => Reply::Failed(other.to_string()),
            },
            Err(other) => Reply::Failed(other.to_string()),
        };
        write_line(&mut stdout, &reply)?;
    }
}
