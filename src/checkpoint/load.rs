//! The load phase: every weight page brought into the page cache before the
//! server reports ready, in the order the first forward pass reads them
//! (embedding, layer 0, 1, …, then the final norm and `lm_head`), with its
//! progress published for the progress bar, `/health`, `/ready` and
//! `/v1/memory`.
//!
//! How: the tensor ranges, in forward order, are cut into 64 MiB pieces;
//! four reader threads each take the next piece, `madvise(MADV_WILLNEED)`
//! it on the mapping (one large asynchronous read the kernel can merge, so
//! four of them keep the disk's queue deep), then `pread` it in 8 MiB steps
//! into a scratch buffer the thread reuses, which waits for those pages and
//! fills the page cache: the pages the mapping reads, so there is no second
//! resident copy (the scratch is 32 MiB in all, freed at the end).
//!
//! Why this way, measured side by side (`benches/cold_load.rs`, figures in
//! README "Cold start"): plain 8 MiB `pread`s from four threads reached
//! about half of `WILLNEED` plus touching a byte per page (synchronous
//! reads keep few requests in flight); `WILLNEED` plus touching and
//! `MAP_POPULATE` were the fastest, but both read through the mapping, and a
//! shard truncated after it was opened then SIGBUSes the process on the
//! first page past its new end. Waiting with `pread` keeps the speed of the
//! large asynchronous reads and makes a short file an error naming it (a
//! short read); the phase also stops within one 8 MiB step of a shutdown.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use sparkrt_wire::{LoadPhase, LoadingReport};

use super::error::CheckpointError;
use super::mapped::Checkpoint;
use super::residency::ResidencyProbe;

/// Bytes advised at once (one piece of work for a reader).
const PIECE_BYTES: u64 = 64 << 20;
/// Bytes one `pread` asks for (the size of each reader's scratch buffer).
const STEP_BYTES: u64 = 8 << 20;
/// Reads in flight.
const READERS: usize = 4;

/// Start-up's progress, shared by the loader (which writes it) and the
/// server and progress bar (which read it); also how a shutdown asks the
/// loader to stop.
#[derive(Debug)]
pub struct LoadProgress {
    phase: AtomicU8,
    done: AtomicU64,
    total: AtomicU64,
    started: Instant,
    phase_started: Mutex<Instant>,
    cancel: AtomicBool,
    /// Test hook (`serve --load-throttle-bytes-per-s`): the reading is held
    /// to this rate, so tests can watch a load in progress; 0 = unheld.
    throttle: AtomicU64,
    probe: OnceLock<ResidencyProbe>,
    error: Mutex<Option<String>>,
}

impl Default for LoadProgress {
    fn default() -> Self {
        LoadProgress::new()
    }
}

impl LoadProgress {
    pub fn new() -> LoadProgress {
        let now = Instant::now();
        LoadProgress {
            phase: AtomicU8::new(0),
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            started: now,
            phase_started: Mutex::new(now),
            cancel: AtomicBool::new(false),
            throttle: AtomicU64::new(0),
            probe: OnceLock::new(),
            error: Mutex::new(None),
        }
    }

    pub fn phase(&self) -> LoadPhase {
        let index = usize::from(self.phase.load(Ordering::Acquire));
        LoadPhase::ALL
            .get(index)
            .copied()
            .unwrap_or(LoadPhase::Failed)
    }

    /// Enters `phase`, which has `total` bytes to do.
    pub fn begin(&self, phase: LoadPhase, total: u64) {
        if let Some(probe) = self.probe() {
            probe.forget();
        }
        *lock(&self.phase_started) = Instant::now();
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        let index = LoadPhase::ALL
            .iter()
            .position(|&p| p == phase)
            .unwrap_or(LoadPhase::ALL.len() - 1);
        self.phase.store(index as u8, Ordering::Release);
    }

    pub fn advance(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Sets the current phase's figures (a device copy reports both).
    pub fn set_done(&self, done: u64, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        self.done.store(done, Ordering::Relaxed);
    }

    pub fn fail(&self, why: String) {
        *lock(&self.error) = Some(why);
        self.begin(LoadPhase::Failed, 0);
    }

    /// Asks the loader to stop (shutdown).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    /// Holds reading to `bytes_per_second` (tests; 0 lifts it).
    pub fn throttle(&self, bytes_per_second: u64) {
        self.throttle.store(bytes_per_second, Ordering::Relaxed);
    }

    /// Where residency is measured from once the checkpoint is mapped.
    pub fn set_probe(&self, probe: ResidencyProbe) {
        let _ = self.probe.set(probe);
    }

    pub fn probe(&self) -> Option<&ResidencyProbe> {
        self.probe.get()
    }

    /// The `loading` section of `/health` and `/v1/memory` now.
    pub fn report(&self) -> LoadingReport {
        let phase = self.phase();
        let done = self.done.load(Ordering::Relaxed);
        let total = self.total.load(Ordering::Relaxed);
        let in_phase = lock(&self.phase_started).elapsed().as_secs_f64();
        let rate = if in_phase > 0.0 {
            done as f64 / in_phase
        } else {
            0.0
        };
        let eta = (rate > 0.0 && matches!(phase, LoadPhase::Reading | LoadPhase::Device))
            .then(|| total.saturating_sub(done) as f64 / rate);
        let residency = self.probe().map(ResidencyProbe::sample).unwrap_or_default();
        LoadingReport {
            phase,
            done_bytes: done,
            total_bytes: total,
            resident_bytes: residency.resident,
            mapped_bytes: residency.total,
            bytes_per_second: rate,
            elapsed_seconds: self.started.elapsed().as_secs_f64(),
            eta_seconds: eta,
            error: lock(&self.error).clone(),
        }
    }

    /// Waits until `upcoming` more bytes keep reading under the throttle
    /// (tests), or until stopped: before the read, so a test can change a
    /// file between the start of the phase and its reads.
    fn hold_to_throttle(&self, upcoming: u64) {
        let phase_started = *lock(&self.phase_started);
        let rate = self.throttle.load(Ordering::Relaxed);
        if rate == 0 {
            return;
        }
        let after = self.done.load(Ordering::Relaxed).saturating_add(upcoming);
        let due = Duration::from_secs_f64(after as f64 / rate as f64);
        while !self.is_cancelled() {
            let elapsed = phase_started.elapsed();
            if elapsed >= due {
                return;
            }
            std::thread::sleep((due - elapsed).min(Duration::from_millis(20)));
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One read: `len` bytes of file `file` at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    file: usize,
    offset: u64,
    len: u64,
}

/// Where a tensor comes in the first forward pass: the embedding, then its
/// layer, then everything else (final norm, `lm_head`).
fn forward_rank(name: &str) -> u64 {
    if name.contains("embed_tokens") || name.ends_with("wte.weight") {
        return 0;
    }
    let layer = name
        .split_once("layers.")
        .and_then(|(_, rest)| rest.split('.').next())
        .and_then(|index| index.parse::<u64>().ok());
    match layer {
        Some(index) => index.saturating_add(1),
        None => u64::MAX,
    }
}

impl Checkpoint {
    /// The reads that bring every tensor byte in, in forward-pass order:
    /// adjacent tensors of a file joined, then cut into pieces.
    fn load_pieces(&self) -> Vec<Piece> {
        let mut tensors: Vec<_> = self
            .headers
            .tensors
            .iter()
            .filter(|t| t.byte_len > 0)
            .map(|t| (forward_rank(&t.name), t.file, t.offset, t.byte_len))
            .collect();
        tensors.sort_unstable();
        let mut ranges: Vec<Piece> = Vec::with_capacity(tensors.len());
        for (_, file, offset, len) in tensors {
            match ranges.last_mut() {
                Some(last) if last.file == file && last.offset + last.len == offset => {
                    last.len += len;
                }
                _ => ranges.push(Piece { file, offset, len }),
            }
        }
        let mut pieces = Vec::new();
        for range in ranges {
            let mut offset = range.offset;
            let end = range.offset + range.len;
            while offset < end {
                let len = PIECE_BYTES.min(end - offset);
                pieces.push(Piece {
                    file: range.file,
                    offset,
                    len,
                });
                offset += len;
            }
        }
        pieces
    }

    /// Bytes [`Checkpoint::load_pages`] reads: every tensor's.
    pub fn load_bytes(&self) -> u64 {
        self.headers.total_tensor_bytes()
    }

    /// Reads every tensor byte into the page cache (see the module),
    /// reporting to `progress` in phase `reading`. Stops with
    /// [`CheckpointError::Cancelled`] once `progress` is cancelled, and
    /// with an error naming the file on a read error or a short file.
    pub fn load_pages(&self, progress: &LoadProgress) -> Result<(), CheckpointError> {
        let pieces = self.load_pieces();
        progress.begin(LoadPhase::Reading, pieces.iter().map(|p| p.len).sum());
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<CheckpointError>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..READERS.min(pieces.len()) {
                scope.spawn(|| {
                    let mut scratch = vec![0u8; STEP_BYTES as usize];
                    loop {
                        if progress.is_cancelled() || failed.load(Ordering::Acquire) {
                            return;
                        }
                        let Some(&piece) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            return;
                        };
                        if let Err(e) = self.read_piece(piece, &mut scratch, progress) {
                            failed.store(true, Ordering::Release);
                            lock(&first_error).get_or_insert(e);
                            return;
                        }
                    }
                });
            }
        });
        if let Some(e) = lock(&first_error).take() {
            return Err(e);
        }
        if progress.is_cancelled() {
            return Err(CheckpointError::Cancelled);
        }
        Ok(())
    }

    /// Asks for one piece ahead, then waits for it by reading it through
    /// the file (not the mapping: a short file is then an error, not a
    /// SIGBUS), step by step, stopping early once `progress` is cancelled.
    fn read_piece(
        &self,
        piece: Piece,
        scratch: &mut [u8],
        progress: &LoadProgress,
    ) -> Result<(), CheckpointError> {
        let (Some(shard), Some(info)) = (self.shards.get(piece.file), self.files().get(piece.file))
        else {
            return Ok(());
        };
        let io_error = |source| CheckpointError::Io {
            path: info.path.clone(),
            source,
        };
        let (Ok(start), Ok(len)) = (usize::try_from(piece.offset), usize::try_from(piece.len))
        else {
            return Ok(());
        };
        // Validation put the piece inside the mapping. WILLNEED only starts
        // reads of the file's pages; it never faults the mapping in.
        shard
            .map
            .advise_range(memmap2::Advice::WillNeed, start, len)
            .map_err(io_error)?;
        let mut offset = piece.offset;
        let end = piece.offset + piece.len;
        while offset < end {
            let step = STEP_BYTES.min(end - offset);
            progress.hold_to_throttle(step);
            if progress.is_cancelled() {
                return Ok(());
            }
            let take = (step as usize).min(scratch.len());
            let buffer = &mut scratch[..take];
            match shard.file.read_exact_at(buffer, offset) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    let found = shard.file.metadata().map_or(0, |m| m.len());
                    return Err(CheckpointError::Truncated {
                        path: info.path.clone(),
                        expected: info.file_bytes,
                        found,
                    });
                }
                Err(source) => return Err(io_error(source)),
            }
            progress.advance(step);
            offset += step;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_load_in_forward_order() {
        let mut names = vec![
            "lm_head.weight",
            "model.layers.10.mlp.gate.weight",
            "model.norm.weight",
            "model.layers.2.self_attn.q_proj.weight",
            "model.embed_tokens.weight",
            "model.layers.0.input_layernorm.weight",
        ];
        names.sort_by_key(|n| (forward_rank(n), *n));
        assert_eq!(
            names,
            [
                "model.embed_tokens.weight",
                "model.layers.0.input_layernorm.weight",
                "model.layers.2.self_attn.q_proj.weight",
                "model.layers.10.mlp.gate.weight",
                "lm_head.weight",
                "model.norm.weight",
            ]
        );
    }

    #[test]
    fn a_report_counts_bytes_and_states_the_reason() {
        let progress = LoadProgress::new();
        assert_eq!(progress.phase(), LoadPhase::Mapping);
        progress.begin(LoadPhase::Reading, 10_200_000_000);
        progress.advance(3_800_000_000);
        let report = progress.report();
        assert_eq!(report.phase, LoadPhase::Reading);
        assert_eq!(report.done_bytes, 3_800_000_000);
        assert!(
            report
                .reason()
                .starts_with("loading weights: 37% (3.8 of 10.2 GB, "),
            "{}",
            report.reason()
        );
        progress.fail("boom".into());
        assert_eq!(progress.report().reason(), "start-up failed: boom");
    }
}
