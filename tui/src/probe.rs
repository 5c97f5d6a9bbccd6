//! The binary's host source: each reading runs `sparkrt probe --json
//! --snapshot` ([`sparkrt_wire::PROBE_SNAPSHOT_ARGS`]) and reads the one
//! [`HostSnapshot`] it prints. The `sparkrt` binary owns the host probe and
//! the plan's headroom formula; running it keeps a single copy of both, and
//! keeps this crate free of the server's code.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use sparkrt_wire::{HostSnapshot, PROBE_SNAPSHOT_ARGS};
use thiserror::Error;

use crate::host::HostSource;

/// A probe that has not exited by then is killed and the reading is an
/// error. Reading the host takes milliseconds; this leaves room for a busy box.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Bytes kept of the probe's stdout and of its stderr. The snapshot is under
/// 1 KiB and an error one line. Both fit in the pipe's buffer (64 KiB on
/// Linux), so the probe never waits on the monitor to exit; one that writes
/// more cannot finish, and is killed at the deadline like a stuck one.
const MAX_OUTPUT_BYTES: u64 = 16 * 1024;

/// How often a running probe is looked at.
const POLL: Duration = Duration::from_millis(5);

/// What to read, passed on to `sparkrt probe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    /// Read the host below this directory (`/` normally, fake trees in tests).
    pub host_root: PathBuf,
    /// The kubelet's configuration file (the probe's default when absent).
    pub kubelet_config: Option<PathBuf>,
    /// The profile whose `[host]` reserves give the usable headroom (the
    /// built-in reserves when absent).
    pub profile: Option<String>,
}

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("cannot run the host probe {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("waiting for the host probe {program}: {source}")]
    Wait {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the host probe {program} did not finish within {timeout:?}")]
    TimedOut { program: String, timeout: Duration },
    #[error("the host probe {program} wrote more than {MAX_OUTPUT_BYTES} bytes")]
    TooLarge { program: String },
    #[error("the host probe failed ({status}): {message}")]
    Failed { status: ExitStatus, message: String },
    #[error("the host probe {program} did not print a host snapshot: {source}")]
    Json {
        program: String,
        #[source]
        source: serde_json::Error,
    },
}

impl ProbeError {
    /// The probe's own exit code when it ran and failed (2: the host cannot
    /// be read as asked), else none.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            ProbeError::Failed { status, .. } => status.code(),
            _ => None,
        }
    }
}

/// Runs `program` (a `sparkrt` binary) once per reading.
#[derive(Debug, Clone)]
pub struct ProbeCommand {
    program: PathBuf,
    args: Vec<OsString>,
    timeout: Duration,
}

impl ProbeCommand {
    pub fn new(program: PathBuf, target: &ProbeTarget) -> ProbeCommand {
        let mut args: Vec<OsString> = PROBE_SNAPSHOT_ARGS.iter().map(OsString::from).collect();
        args.push("--host-root".into());
        args.push(target.host_root.clone().into_os_string());
        if let Some(file) = &target.kubelet_config {
            args.push("--kubelet-config".into());
            args.push(file.clone().into_os_string());
        }
        if let Some(profile) = &target.profile {
            args.push("--profile".into());
            args.push(profile.into());
        }
        ProbeCommand {
            program,
            args,
            timeout: PROBE_TIMEOUT,
        }
    }

    /// The same probe with a shorter deadline (tests).
    pub fn with_timeout(mut self, timeout: Duration) -> ProbeCommand {
        self.timeout = timeout;
        self
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Runs the probe once and parses its answer.
    pub fn snapshot(&self) -> Result<HostSnapshot, ProbeError> {
        let program = self.program.display().to_string();
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ProbeError::Spawn {
                program: program.clone(),
                source,
            })?;
        let status = wait_until(&mut child, self.timeout, &program)?;
        let too_large = || ProbeError::TooLarge {
            program: program.clone(),
        };
        let stdout = read_bounded(child.stdout.take()).ok_or_else(too_large)?;
        let stderr = read_bounded(child.stderr.take()).ok_or_else(too_large)?;
        if !status.success() {
            let text = String::from_utf8_lossy(&stderr);
            // `sparkrt` prints `error: …`; the screen says it is an error.
            let message = text.trim().trim_start_matches("error: ").to_string();
            return Err(ProbeError::Failed { status, message });
        }
        serde_json::from_slice(&stdout).map_err(|source| ProbeError::Json { program, source })
    }
}

impl HostSource for ProbeCommand {
    fn read(&mut self) -> Result<HostSnapshot, String> {
        self.snapshot().map_err(|e| e.to_string())
    }
}

/// Waits up to `timeout` for `child` to exit, then kills it.
fn wait_until(
    child: &mut Child,
    timeout: Duration,
    program: &str,
) -> Result<ExitStatus, ProbeError> {
    let deadline = Instant::now() + timeout;
    loop {
        let exited = child.try_wait().map_err(|source| ProbeError::Wait {
            program: program.to_string(),
            source,
        })?;
        if let Some(status) = exited {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            // Already gone or not: either way it is reaped here.
            let _ = child.kill();
            let _ = child.wait();
            return Err(ProbeError::TimedOut {
                program: program.to_string(),
                timeout,
            });
        }
        std::thread::sleep(POLL);
    }
}

/// What an exited child left in one of its pipes; `None` past the limit.
fn read_bounded(pipe: Option<impl Read>) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    if let Some(pipe) = pipe {
        // A read error leaves what was read; the parse then says what is wrong.
        let _ = pipe.take(MAX_OUTPUT_BYTES + 1).read_to_end(&mut bytes);
    }
    (bytes.len() as u64 <= MAX_OUTPUT_BYTES).then_some(bytes)
}
