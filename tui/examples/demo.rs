//! `cargo run -p sparkrt-tui --example demo [-- --no-server]`
//!
//! Runs the monitor on made-up data: a host whose MemAvailable swings towards
//! the eviction line and back (so the pool turns yellow, then red), and a
//! stand-in `sparkrt serve` on 127.0.0.1 that answers `/v1/memory` and
//! `/v1/stats` (the wire types, as the server writes them) with a filling KV
//! cache and growing token counters. With
//! `--no-server` nothing listens, and the screen shows the host panels only.

use std::f64::consts::TAU;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use sparkrt_tui::memory::ServerMemory;
use sparkrt_tui::{HostSource, TopOptions};
use sparkrt_wire::{
    Category, GpuProcess, GuardState, HostSnapshot, KvState, Ledger, LedgerEntry, MEMORY_PATH,
    MemoryReport, PageCachePolicy, Percentiles, RequestOutcomes, STATS_PATH, ServingStats,
    WeightsResidency,
};

const GIB: u64 = 1 << 30;
const MEM_TOTAL: u64 = 128 * GIB;
const EVICTION_HARD: u64 = 16 * GIB;
/// One full swing of the made-up load, in seconds.
const PERIOD_S: f64 = 40.0;

/// MemAvailable at `t` seconds: between 18 and 46 GiB.
fn mem_available(t: f64) -> u64 {
    let swing = 0.5 + 0.5 * (TAU * t / PERIOD_S).cos();
    ((18.0 + 28.0 * swing) * GIB as f64) as u64
}

/// Share of the KV cache in use at `t`: fills as MemAvailable falls.
fn kv_fill(t: f64) -> f64 {
    0.5 - 0.45 * (TAU * t / PERIOD_S).cos()
}

struct DemoHost {
    start: Instant,
}

impl HostSource for DemoHost {
    fn read(&mut self) -> Result<HostSnapshot, String> {
        Ok(host_at(self.start.elapsed().as_secs_f64()))
    }
}

fn host_at(t: f64) -> HostSnapshot {
    HostSnapshot {
        mem_total: MEM_TOTAL,
        mem_available: mem_available(t),
        mem_free: 6 * GIB,
        cached: 14 * GIB,
        buffers: GIB / 2,
        shmem: GIB / 4,
        swap_total: 0,
        swap_free: 0,
        kubepods_current: Some(3 * GIB),
        kubepods_max: Some(100 * GIB),
        system_reserved: 2 * GIB,
        kube_reserved: GIB,
        eviction_hard: EVICTION_HARD,
        usable: Some(100 * GIB),
        gpu_processes: vec![GpuProcess {
            pid: std::process::id(),
            bytes: 80 * GIB,
        }],
    }
}

fn memory_at(t: f64) -> ServerMemory {
    let blocks_total = 20_480u64;
    let blocks_used = (blocks_total as f64 * kv_fill(t)) as u64;
    let host = host_at(t);
    let entry = |category: Category, planned: u64, allocated: u64| LedgerEntry {
        name: category.name().to_string(),
        planned,
        allocated,
    };
    MemoryReport {
        plan: serde_json::json!({"model": "demo"}),
        ledger: Ledger {
            categories: vec![
                entry(Category::Weights, 60 * GIB, 60 * GIB),
                entry(Category::MoeWorkspace, 2 * GIB, 2 * GIB),
                entry(Category::Activations, GIB, GIB),
                entry(Category::KvCache, 20 * GIB, 20 * GIB),
                entry(Category::RuntimeOverhead, 2 * GIB, GIB + GIB / 2),
            ],
            page_cache_policy: PageCachePolicy::DontNeed,
            weights_residency: WeightsResidency::HostRegistered,
        },
        kv: KvState {
            block_size_tokens: 16,
            block_bytes: 1 << 20,
            blocks_total,
            blocks_used,
            blocks_cached: 0,
        },
        guard: GuardState {
            tripped: host.mem_available < 20 * GIB,
            threshold_bytes: 20 * GIB,
            resume_bytes: 24 * GIB,
            ..GuardState::default()
        },
        host,
        process_rss: 62 * GIB,
        loading: None,
    }
}

fn stats_at(t: f64) -> ServingStats {
    let blocks_total = 20_480u64;
    let used = (blocks_total as f64 * kv_fill(t)) as u64;
    let running = (8.0 * kv_fill(t)).round() as u64;
    ServingStats {
        requests: RequestOutcomes {
            ok: (t / 3.0) as u64,
            error: 1,
            rejected: (t / 30.0) as u64,
            cancelled: (t / 60.0) as u64,
        },
        requests_running: running,
        requests_waiting: running / 3,
        prompt_tokens_total: (800.0 * t) as u64,
        generation_tokens_total: (55.0 * t) as u64,
        preemptions_total: (t / 20.0) as u64,
        kv_blocks_used: used,
        kv_blocks_free: blocks_total - used,
        kv_blocks_cached: 0,
        prefix_cache_queries_total: 0,
        prefix_cache_hits_total: 0,
        state_snapshots_cached: 0,
        state_snapshots_taken_total: 0,
        spec_decode_num_drafts_total: 0,
        spec_decode_num_draft_tokens_total: 0,
        spec_decode_num_accepted_tokens_total: 0,
        spec_decode_num_accepted_tokens_per_pos: [0; sparkrt_wire::MAX_SPECULATIVE_TOKENS],
        guard_tripped: mem_available(t) < 20 * GIB,
        // Latency grows with the KV fill (a busier batch).
        ttft_seconds: Some(Percentiles {
            p50: 0.1 + 0.4 * kv_fill(t),
            p99: 0.3 + 1.2 * kv_fill(t),
        }),
        itl_seconds: Some(Percentiles {
            p50: 0.02 + 0.03 * kv_fill(t),
            p99: 0.05 + 0.1 * kv_fill(t),
        }),
    }
}

fn serve(listener: TcpListener, start: Instant) {
    for stream in listener.incoming().flatten() {
        thread::spawn(move || answer(stream, start.elapsed().as_secs_f64()));
    }
}

fn answer(stream: TcpStream, t: f64) {
    let mut reader = BufReader::new(&stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    // Skip the headers up to the blank line.
    let mut header = String::new();
    while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
        header.clear();
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("");
    let body = match path {
        MEMORY_PATH => serde_json::to_string(&memory_at(t)),
        STATS_PATH => serde_json::to_string(&stats_at(t)),
        _ => Ok(String::new()),
    };
    let (status, body) = match body {
        Ok(body) if !body.is_empty() => ("200 OK", body),
        Ok(_) => ("404 Not Found", String::new()),
        Err(e) => ("500 Internal Server Error", e.to_string()),
    };
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    if std::env::args().any(|a| a == "--no-server") {
        drop(listener); // nothing answers there now
    } else {
        thread::spawn(move || serve(listener, start));
    }
    let options = TopOptions {
        server_url: url,
        interval: Duration::from_millis(500),
        history: Duration::from_secs(120),
        ..TopOptions::default()
    };
    sparkrt_tui::run(options, Box::new(DemoHost { start }))?;
    Ok(())
}
