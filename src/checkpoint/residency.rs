//! How much of the checkpoint the page cache holds, measured with
//! `mincore(2)` rather than assumed: a weight page evicted under memory
//! pressure after start-up shows up here.
//!
//! A [`ResidencyProbe`] maps the shard files once more (address space only,
//! no memory: the pages are the page cache's, shared with the checkpoint's
//! own mapping). It owns its mappings, so the server can keep it for its
//! whole life, and it caches its reading for a second: `mincore` over
//! 10 GB is 2.6 M page entries, a few milliseconds, not worth redoing for
//! every `/v1/memory`.

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use memmap2::Mmap;

use super::error::CheckpointError;
use super::mapped::Checkpoint;

/// A reading is reused for this long.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// `mincore` is asked about this many bytes at a time, so its result vector
/// stays small (one byte per page: 256 KiB for 1 GiB of 4 KiB pages).
const CHUNK_BYTES: usize = 1 << 30;

/// Resident bytes of a mapping, of its length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Residency {
    pub resident: u64,
    pub total: u64,
}

impl Residency {
    pub fn fraction(self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            self.resident as f64 / self.total as f64
        }
    }
}

/// The system's page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system; no memory of ours.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

/// Bytes of `map` the page cache holds now (the last page counted whole).
pub fn resident_bytes(map: &Mmap) -> io::Result<u64> {
    let page = page_size();
    let mut flags = Vec::new();
    let mut resident = 0u64;
    let mut offset = 0usize;
    while offset < map.len() {
        let len = CHUNK_BYTES.min(map.len() - offset);
        let pages = len.div_ceil(page);
        flags.clear();
        flags.resize(pages, 0u8);
        // SAFETY: `map` is a live mapping and `offset` a multiple of the
        // page size (CHUNK_BYTES is), so the address is page-aligned as
        // mincore requires and `offset..offset + len` lies inside the
        // mapping; `flags` has one byte per page of that range, which is
        // all mincore writes. mincore reads no memory of the mapping.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr().add(offset) as *mut libc::c_void,
                len,
                flags.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let in_core = flags.iter().filter(|&&f| f & 1 == 1).count();
        resident += (in_core * page) as u64;
        offset += len;
    }
    Ok(resident.min(map.len() as u64))
}

/// Measures the page cache's share of a checkpoint's files for as long as
/// it is kept (see the module).
#[derive(Debug)]
pub struct ResidencyProbe {
    maps: Vec<Mmap>,
    last: Mutex<Option<(Instant, Residency)>>,
}

impl ResidencyProbe {
    /// The reading at most [`SAMPLE_INTERVAL`] old; a file `mincore`
    /// refuses counts as not resident.
    pub fn sample(&self) -> Residency {
        let mut last = match self.last.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some((at, reading)) = *last
            && at.elapsed() < SAMPLE_INTERVAL
        {
            return reading;
        }
        let reading = self.measure();
        *last = Some((Instant::now(), reading));
        reading
    }

    /// Drops the kept reading, so the next [`ResidencyProbe::sample`]
    /// measures (a reading from before a phase ended is stale: at ready it
    /// would miss the last second of reading, about a tenth of the weights
    /// at 1 GB/s on a 10 GB checkpoint).
    pub fn forget(&self) {
        match self.last.lock() {
            Ok(mut last) => *last = None,
            Err(poisoned) => *poisoned.into_inner() = None,
        }
    }

    /// A fresh reading, not cached.
    pub fn measure(&self) -> Residency {
        self.maps.iter().fold(Residency::default(), |sum, map| {
            let resident = resident_bytes(map).unwrap_or(0);
            Residency {
                resident: sum.resident + resident,
                total: sum.total + map.len() as u64,
            }
        })
    }
}

impl Checkpoint {
    /// Bytes of the checkpoint's mappings the page cache holds now.
    pub fn residency(&self) -> Result<Residency, CheckpointError> {
        let mut sum = Residency::default();
        for (shard, info) in self.shards.iter().zip(self.files()) {
            sum.resident += resident_bytes(&shard.map).map_err(|source| CheckpointError::Io {
                path: info.path.clone(),
                source,
            })?;
            sum.total += shard.map.len() as u64;
        }
        Ok(sum)
    }

    /// A probe of the same files that the server can keep (see the module).
    pub fn residency_probe(&self) -> Result<ResidencyProbe, CheckpointError> {
        let mut maps = Vec::with_capacity(self.shards.len());
        for (shard, info) in self.shards.iter().zip(self.files()) {
            // SAFETY: a read-only shared mapping of a file this checkpoint
            // validated and keeps open; the probe never reads through it
            // (mincore only asks the kernel about its pages), so a file
            // changed under it cannot fault us.
            let map = unsafe { Mmap::map(&shard.file) }.map_err(|source| CheckpointError::Io {
                path: info.path.clone(),
                source,
            })?;
            maps.push(map);
        }
        Ok(ResidencyProbe {
            maps,
            last: Mutex::new(None),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    use super::*;

    /// A file of `len` bytes of changing data, written and synced (so its
    /// pages are clean and the kernel may drop them).
    fn data_file(len: usize) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.bin");
        let mut file = std::fs::File::create(&path).unwrap();
        let block: Vec<u8> = (0..1 << 20).map(|i: usize| (i * 31 % 251) as u8).collect();
        let mut left = len;
        while left > 0 {
            let n = left.min(block.len());
            file.write_all(&block[..n]).unwrap();
            left -= n;
        }
        file.sync_all().unwrap();
        (dir, path)
    }

    #[test]
    fn a_file_read_is_resident_and_dropped_pages_are_not() {
        let len = 32 << 20;
        let (_dir, path) = data_file(len);
        let mut file = std::fs::File::open(&path).unwrap();
        let mut sink = Vec::new();
        file.read_to_end(&mut sink).unwrap();
        assert_eq!(sink.len(), len);
        // SAFETY: a read-only mapping of a file this test owns.
        let map = unsafe { Mmap::map(&file) }.unwrap();
        let read = resident_bytes(&map).unwrap();
        assert_eq!(map.len() as u64, len as u64);
        assert!(
            read as f64 >= 0.99 * len as f64,
            "{read} of {len} bytes resident right after reading the file"
        );
        // SAFETY: plain FFI on a descriptor this test owns.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise(DONTNEED)");
        let dropped = resident_bytes(&map).unwrap();
        if dropped as f64 > 0.5 * len as f64 {
            // Some file systems (tmpfs: the page cache is the file) keep
            // the pages whatever they are told.
            eprintln!(
                "skipped: the kernel kept {dropped} of {len} bytes after POSIX_FADV_DONTNEED \
                 (tmpfs or an overlay that ignores it)"
            );
            return;
        }
        assert!(
            dropped < read,
            "{dropped} resident after dropping, {read} before"
        );
    }

    #[test]
    fn the_probe_caches_its_reading_for_a_second() {
        let (_dir, path) = data_file(1 << 20);
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a read-only mapping of a file this test owns.
        let map = unsafe { Mmap::map(&file) }.unwrap();
        let probe = ResidencyProbe {
            maps: vec![map],
            last: Mutex::new(None),
        };
        let first = probe.sample();
        assert_eq!(first.total, 1 << 20);
        assert_eq!(
            probe.sample(),
            first,
            "within the interval: the same reading"
        );
    }
}
