//! Benchmark: ways of bringing a checkpoint's pages into the page cache from
//! a cold cache, side by side in one run, against the disk's plain
//! sequential read rate of the same files.
//!
//! Before each strategy every file is synced and evicted with
//! `posix_fadvise(POSIX_FADV_DONTNEED)` (works unprivileged for clean pages;
//! the residency left is printed, measured with `mincore`). Strategies:
//!
//! - `sequential read`: one thread, 1 MiB `read`s, file after file (what
//!   `dd` measures: the disk's rate);
//! - `pread 8 MiB ×4`: four threads `pread`ing 8 MiB pieces in turn;
//! - `load_pages`: what `serve` does (`Checkpoint::load_pages`: 64 MiB
//!   pieces in forward-pass order, each `madvise(WILLNEED)`d then waited
//!   for with 8 MiB `pread`s, four threads);
//! - `madvise WILLNEED + touch`: 64 MiB chunks of the mapping advised, then
//!   a byte of each page read, four threads;
//! - `MAP_POPULATE`: each file mapped with `MAP_POPULATE`, one after another.
//!
//! Run: `cargo bench --bench cold_load -- DIR` (default
//! `target/bench-models/qwen3-30b-a3b-8l`, made by `sparkrt make-checkpoint
//! --like benches/models/qwen3-30b-a3b-8l --out DIR --shards 4`); `--profile
//! dev` builds faster and reads as fast (the work is the disk's).

// A benchmark that cannot set itself up stops with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use memmap2::{Advice, Mmap, MmapOptions};
use sparkrt::checkpoint::Checkpoint;
use sparkrt::checkpoint::load::LoadProgress;
use sparkrt::checkpoint::residency::{page_size, resident_bytes};

const CHUNK: usize = 64 << 20;

/// One way of reading the checkpoint `dir` made of `files` in.
type Strategy = fn(&Path, &[PathBuf]);
const THREADS: usize = 4;

fn main() {
    let dir = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map_or_else(
            || PathBuf::from("target/bench-models/qwen3-30b-a3b-8l"),
            PathBuf::from,
        );
    if !dir.is_dir() {
        println!(
            "skipped: no checkpoint at {} (sparkrt make-checkpoint --like \
             benches/models/qwen3-30b-a3b-8l --out {0} --shards 4)",
            dir.display()
        );
        return;
    }
    let files = shards(&dir);
    let bytes: u64 = files.iter().map(|f| f.metadata().unwrap().len()).sum();
    println!(
        "{}: {} files, {:.2} GB; page size {} B",
        dir.display(),
        files.len(),
        bytes as f64 / 1e9,
        page_size()
    );
    let strategies: [(&str, Strategy); 5] = [
        ("sequential read 1 MiB ×1", sequential_read),
        ("pread 8 MiB ×4", pread_pieces),
        ("load_pages (WILLNEED+pread ×4)", load_pages),
        ("madvise WILLNEED + touch ×4", willneed_and_touch),
        ("MAP_POPULATE", populate),
    ];
    // A virtual disk's host may cache too: every round runs the strategies
    // in the opposite order of the one before, so none always goes first.
    let rounds: usize = std::env::var("COLD_LOAD_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let mut seconds = vec![Vec::new(); strategies.len()];
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..strategies.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (name, strategy) = strategies[i];
            let cold = evict(&files);
            let started = Instant::now();
            strategy(&dir, &files);
            let elapsed = started.elapsed().as_secs_f64();
            let warm = residency(&files);
            println!(
                "round {round} {name:<30} {elapsed:7.2} s {:6.2} GB/s  resident {:.1}% → {:.1}%",
                bytes as f64 / elapsed / 1e9,
                100.0 * cold,
                100.0 * warm
            );
            seconds[i].push(elapsed);
        }
    }
    let median = |s: &[f64]| {
        let mut s = s.to_vec();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    let base = median(&seconds[0]);
    println!("medians of {rounds} rounds:");
    for ((name, _), s) in strategies.iter().zip(&seconds) {
        let m = median(s);
        println!(
            "{name:<30} {m:7.2} s {:6.2} GB/s  ×{:.2} of the sequential read's time",
            bytes as f64 / m / 1e9,
            m / base
        );
    }
}

/// The checkpoint's `.safetensors` files, sorted.
fn shards(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    files
}

/// Drops the files' pages from the page cache; returns the fraction left.
fn evict(files: &[PathBuf]) -> f64 {
    for path in files {
        let file = File::open(path).unwrap();
        // Dirty pages cannot be dropped: write them first.
        file.sync_data().unwrap();
        // SAFETY: plain FFI on a descriptor we own.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise on {}", path.display());
    }
    residency(files)
}

/// The fraction of the files the page cache holds (mincore).
fn residency(files: &[PathBuf]) -> f64 {
    let (mut resident, mut total) = (0u64, 0u64);
    for path in files {
        let map = map(path);
        resident += resident_bytes(&map).unwrap();
        total += map.len() as u64;
    }
    resident as f64 / total.max(1) as f64
}

fn map(path: &Path) -> Mmap {
    let file = File::open(path).unwrap();
    // SAFETY: a read-only mapping of a file nothing writes while we run.
    unsafe { Mmap::map(&file) }.unwrap()
}

fn sequential_read(_: &Path, files: &[PathBuf]) {
    let mut buffer = vec![0u8; 1 << 20];
    for path in files {
        let mut file = File::open(path).unwrap();
        while file.read(&mut buffer).unwrap() > 0 {}
    }
}

fn pread_pieces(_: &Path, files: &[PathBuf]) {
    use std::os::unix::fs::FileExt;
    const PIECE: u64 = 8 << 20;
    let opened: Vec<File> = files.iter().map(|p| File::open(p).unwrap()).collect();
    let pieces: Vec<(usize, u64)> = opened
        .iter()
        .enumerate()
        .flat_map(|(i, f)| {
            (0..f.metadata().unwrap().len())
                .step_by(PIECE as usize)
                .map(move |o| (i, o))
        })
        .collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                let mut buffer = vec![0u8; PIECE as usize];
                while let Some(&(i, offset)) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let _ = opened[i].read_at(&mut buffer, offset).unwrap();
                }
            });
        }
    });
}

fn load_pages(dir: &Path, _: &[PathBuf]) {
    let checkpoint = Checkpoint::open(dir).unwrap();
    checkpoint.load_pages(&LoadProgress::new()).unwrap();
}

fn willneed_and_touch(_: &Path, files: &[PathBuf]) {
    let maps: Vec<Mmap> = files.iter().map(|p| map(p)).collect();
    let chunks: Vec<(usize, usize)> = maps
        .iter()
        .enumerate()
        .flat_map(|(i, m)| (0..m.len()).step_by(CHUNK).map(move |o| (i, o)))
        .collect();
    let next = AtomicUsize::new(0);
    let page = page_size();
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                let mut sum = 0u8;
                while let Some(&(i, offset)) = chunks.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let map = &maps[i];
                    let len = CHUNK.min(map.len() - offset);
                    map.advise_range(Advice::WillNeed, offset, len).unwrap();
                    for at in (offset..offset + len).step_by(page) {
                        sum = sum.wrapping_add(map[at]);
                    }
                }
                std::hint::black_box(sum);
            });
        }
    });
}

fn populate(_: &Path, files: &[PathBuf]) {
    for path in files {
        let file = File::open(path).unwrap();
        // SAFETY: a read-only mapping of a file nothing writes while we run.
        let map = unsafe { MmapOptions::new().populate().map(&file) }.unwrap();
        std::hint::black_box(map.len());
    }
}
