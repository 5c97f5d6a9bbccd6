//! The memory guard: reads MemAvailable on a short interval and, below
//! `eviction_hard + safety_margin`, stops admitting work until it is back
//! above that line plus a hysteresis margin.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::host::{self, MemInfo};
use crate::plan::memory::guard_threshold;
pub use sparkrt_tui::wire::GuardState;

#[derive(Debug)]
pub struct MemoryGuard {
    root: PathBuf,
    /// Trip below this MemAvailable.
    pub threshold_bytes: u64,
    /// Resume at or above this MemAvailable.
    pub resume_bytes: u64,
    tripped: AtomicBool,
    latest: Mutex<Option<MemInfo>>,
    last_error: Mutex<Option<String>>,
}

impl MemoryGuard {
    /// Trips below `eviction_hard + safety_margin`; resumes one more
    /// `safety_margin` above that, so it does not flap.
    pub fn new(root: PathBuf, eviction_hard: u64, safety_margin: u64) -> Arc<MemoryGuard> {
        let threshold = guard_threshold(eviction_hard, safety_margin);
        Arc::new(MemoryGuard {
            root,
            threshold_bytes: threshold,
            resume_bytes: threshold + safety_margin,
            tripped: AtomicBool::new(false),
            latest: Mutex::new(None),
            last_error: Mutex::new(None),
        })
    }

    pub fn tripped(&self) -> bool {
        self.tripped.load(Ordering::Acquire)
    }

    pub fn state(&self) -> GuardState {
        GuardState {
            tripped: self.tripped(),
            threshold_bytes: self.threshold_bytes,
            resume_bytes: self.resume_bytes,
        }
    }

    pub fn latest(&self) -> Option<MemInfo> {
        self.latest.lock().ok().and_then(|m| *m)
    }

    /// One reading: updates the latest figures and the tripped state.
    pub fn check(&self) {
        match host::read_meminfo(&self.root) {
            Ok(info) => {
                let was = self.tripped();
                let now = if was {
                    info.mem_available < self.resume_bytes
                } else {
                    info.mem_available < self.threshold_bytes
                };
                if now != was {
                    if now {
                        tracing::warn!(
                            mem_available = info.mem_available,
                            threshold = self.threshold_bytes,
                            "memory guard tripped: refusing new requests"
                        );
                    } else {
                        tracing::info!(mem_available = info.mem_available, "memory guard cleared");
                    }
                }
                self.tripped.store(now, Ordering::Release);
                if let Ok(mut latest) = self.latest.lock() {
                    *latest = Some(info);
                }
                if let Ok(mut e) = self.last_error.lock() {
                    *e = None;
                }
            }
            Err(e) => {
                // An unreadable meminfo is not a reason to stop serving, but it is logged once.
                if let Ok(mut last) = self.last_error.lock() {
                    let message = e.to_string();
                    if last.as_deref() != Some(message.as_str()) {
                        tracing::warn!("memory guard cannot read the host: {message}");
                        *last = Some(message);
                    }
                }
            }
        }
    }

    /// Checks every `interval` until `stop` is set.
    pub fn spawn(
        self: &Arc<Self>,
        interval: Duration,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        let guard = Arc::clone(self);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                guard.check();
                std::thread::sleep(interval);
            }
        })
    }
}
