//! What the kernel's page cache should do with the checkpoint's pages:
//! prefetch them before the first forward pass, or drop them once the weights
//! live elsewhere (a device copy), so the same bytes are not held twice.

use std::io::IsTerminal;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use memmap2::{Advice, UncheckedAdvice};

use super::error::CheckpointError;
use super::mapped::Checkpoint;

/// The page-cache policy applied to the checkpoint, as the ledger records
/// it: a wire type (`/v1/memory` reports it), defined with the monitor's.
pub use sparkrt_wire::PageCachePolicy;

/// The policy stored in the checkpoint's `AtomicU8` (`policy as u8`).
fn policy_from_u8(value: u8) -> PageCachePolicy {
    [PageCachePolicy::WillNeed, PageCachePolicy::DontNeed]
        .into_iter()
        .find(|&p| p as u8 == value)
        .unwrap_or(PageCachePolicy::Keep)
}

/// The system's page size (4 KiB where it cannot be read).
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

/// Prefetching advises this many bytes at a time, so the progress bar moves.
const PREFETCH_CHUNK: usize = 64 << 20;
/// Loads smaller than this finish too fast for a progress bar to help.
const PROGRESS_MIN_BYTES: u64 = 1 << 30;

impl Checkpoint {
    /// The policy last applied (`Keep` until `prefetch` or `release`).
    pub fn page_cache_policy(&self) -> PageCachePolicy {
        policy_from_u8(self.policy.load(Ordering::Relaxed))
    }

    /// Asks the kernel to read every mapped file ahead (`MADV_WILLNEED`),
    /// showing a progress bar on a terminal for multi-GiB checkpoints.
    pub fn prefetch(&self) -> Result<(), CheckpointError> {
        let total: u64 = self.shards.iter().map(|s| s.map.len() as u64).sum();
        let bar = if std::io::stderr().is_terminal() && total >= PROGRESS_MIN_BYTES {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "prefetching weights {bar:40} {binary_bytes}/{binary_total_bytes} {eta}",
            ) {
                bar.set_style(style);
            }
            bar
        } else {
            ProgressBar::hidden()
        };
        for (shard, info) in self.shards.iter().zip(self.files()) {
            let mut offset = 0;
            while offset < shard.map.len() {
                let len = PREFETCH_CHUNK.min(shard.map.len() - offset);
                shard
                    .map
                    .advise_range(Advice::WillNeed, offset, len)
                    .map_err(|source| CheckpointError::Io {
                        path: info.path.clone(),
                        source,
                    })?;
                offset += len;
                bar.inc(len as u64);
            }
        }
        bar.finish_and_clear();
        self.policy
            .store(PageCachePolicy::WillNeed as u8, Ordering::Relaxed);
        Ok(())
    }

    /// Drops the whole pages under `bytes` (a slice of this checkpoint's
    /// mappings, e.g. a chunk the device has copied) from this process and
    /// from the page cache, as [`Self::release`] does for everything. A
    /// slice outside every mapping is left alone (`Ok(false)`).
    pub fn release_range(&self, bytes: &[u8]) -> Result<bool, CheckpointError> {
        let page = page_size();
        let start = bytes.as_ptr() as usize;
        for (shard, info) in self.shards.iter().zip(self.files()) {
            let base = shard.map.as_ptr() as usize;
            if start < base || start + bytes.len() > base + shard.map.len() {
                continue;
            }
            // Whole pages only: the pages at either end may hold bytes
            // another chunk still needs.
            let first = (start - base).div_ceil(page) * page;
            let end = (start - base + bytes.len()) / page * page;
            if end <= first {
                return Ok(true);
            }
            let io_error = |source| CheckpointError::Io {
                path: info.path.clone(),
                source,
            };
            // SAFETY: as in `release`: a read-only shared file mapping, whose
            // dropped pages fault the same file contents back in.
            unsafe {
                shard
                    .map
                    .unchecked_advise_range(UncheckedAdvice::DontNeed, first, end - first)
            }
            .map_err(io_error)?;
            // SAFETY: plain FFI call on a file descriptor this struct owns;
            // it reads no memory of ours.
            let rc = unsafe {
                libc::posix_fadvise(
                    shard.file.as_raw_fd(),
                    first as libc::off_t,
                    (end - first) as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
            if rc != 0 {
                return Err(io_error(std::io::Error::from_raw_os_error(rc)));
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// Drops the checkpoint's pages from this process and from the page cache
    /// (`MADV_DONTNEED` on the mapping, then `POSIX_FADV_DONTNEED` on the
    /// file). Views stay valid: a later access reads the file again.
    pub fn release(&self) -> Result<(), CheckpointError> {
        for (shard, info) in self.shards.iter().zip(self.files()) {
            let io_error = |source| CheckpointError::Io {
                path: info.path.clone(),
                source,
            };
            if !shard.map.is_empty() {
                // SAFETY: the mapping is a read-only, shared file mapping.
                // MADV_DONTNEED only drops this process's page-table entries;
                // the next access faults the same file contents back in, so
                // no borrowed slice ever sees different bytes.
                unsafe { shard.map.unchecked_advise(UncheckedAdvice::DontNeed) }
                    .map_err(io_error)?;
            }
            // Pages still mapped elsewhere stay cached; ours are unmapped
            // above, so the kernel can drop them now.
            // SAFETY: plain FFI call on a file descriptor this struct owns and
            // keeps open; it reads no memory of ours.
            let rc = unsafe {
                libc::posix_fadvise(shard.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
            };
            if rc != 0 {
                return Err(io_error(std::io::Error::from_raw_os_error(rc)));
            }
        }
        self.policy
            .store(PageCachePolicy::DontNeed as u8, Ordering::Relaxed);
        Ok(())
    }
}
