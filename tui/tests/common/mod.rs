//! Canned data and a tiny HTTP server shared by the integration tests.
#![allow(dead_code)] // each test binary uses its own part of this module

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sparkrt_tui::collector::Sample;
use sparkrt_tui::link::ServerLink;
use sparkrt_tui::memory::{self, ServerMemory};
use sparkrt_tui::processes::ProcessRow;
use sparkrt_tui::stats;
use sparkrt_wire::{HostSnapshot, ServingStats};

pub const GIB: u64 = 1 << 30;
pub const MEMORY_OK: &str = include_str!("../data/memory_ok.json");
pub const STATS_OK: &str = include_str!("../data/stats_ok.json");

/// The host of `memory_ok.json`, plus a plan usable figure of 96 GiB.
pub fn canned_host() -> HostSnapshot {
    HostSnapshot {
        mem_total: 128 * GIB,
        mem_available: 40 * GIB,
        mem_free: 10 * GIB,
        cached: 24 * GIB,
        buffers: GIB,
        shmem: GIB,
        swap_total: 8 * GIB,
        swap_free: 6 * GIB,
        kubepods_current: Some(6 * GIB),
        kubepods_max: None,
        system_reserved: 2 * GIB,
        kube_reserved: GIB,
        eviction_hard: 16 * GIB,
        usable: Some(96 * GIB),
        gpu_processes: Vec::new(),
    }
}

pub fn canned_memory() -> ServerMemory {
    memory::parse(MEMORY_OK).expect("canned /v1/memory parses")
}

pub fn canned_stats() -> ServingStats {
    stats::parse(STATS_OK).expect("canned /v1/stats parses")
}

pub fn canned_processes() -> Vec<ProcessRow> {
    vec![
        ProcessRow {
            pid: 4242,
            name: "sparkrt".to_string(),
            rss: 62 * GIB,
            gpu_bytes: None,
        },
        ProcessRow {
            pid: 77,
            name: "kubelet".to_string(),
            rss: GIB / 2,
            gpu_bytes: None,
        },
    ]
}

/// A sample as the collector would make it with the server up.
pub fn connected_sample() -> Sample {
    Sample {
        taken_at: Instant::now(),
        host: Ok(canned_host()),
        processes: canned_processes(),
        link: ServerLink::Connected { reconnects: 0 },
        server: Some(canned_memory()),
        stats: Some(Ok(canned_stats())),
        generation_tokens_per_s: Some(54.5),
        prompt_tokens_per_s: Some(812.0),
        loading: None,
    }
}

/// A sample with no server.
pub fn disconnected_sample() -> Sample {
    Sample {
        link: ServerLink::Disconnected {
            reason: "connection refused".to_string(),
        },
        server: None,
        stats: None,
        generation_tokens_per_s: None,
        prompt_tokens_per_s: None,
        ..connected_sample()
    }
}

/// How the test server answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// 200 with these bodies for /v1/memory and /v1/stats.
    Serve { memory: String, stats: String },
    /// Reads the request, then says nothing until the mode changes.
    Stall,
    /// Closes the connection as soon as the request is read.
    Close,
    /// Answers bytes that are not HTTP.
    NotHttp,
    /// Answers with this status and an empty body.
    Status(u16),
}

impl Mode {
    pub fn healthy() -> Mode {
        Mode::Serve {
            memory: MEMORY_OK.to_string(),
            stats: STATS_OK.to_string(),
        }
    }
}

/// An HTTP/1.1 server on 127.0.0.1 whose behaviour the test switches.
pub struct TestServer {
    pub addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
}

impl TestServer {
    pub fn start(mode: Mode) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let mode = Arc::new(Mutex::new(mode));
        let shared = Arc::clone(&mode);
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mode = Arc::clone(&shared);
                thread::spawn(move || answer(stream, &mode));
            }
        });
        TestServer { addr, mode }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.mode.lock().expect("mode lock") = mode;
    }
}

/// A URL where nothing listens: bind a port, then let it go.
pub fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}")
}

fn read_request_path(stream: &mut TcpStream) -> Option<String> {
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    text.split_whitespace().nth(1).map(str::to_string)
}

fn answer(mut stream: TcpStream, mode: &Mutex<Mode>) {
    let Some(path) = read_request_path(&mut stream) else {
        return;
    };
    let current = mode.lock().expect("mode lock").clone();
    match current {
        Mode::Serve { memory, stats } => {
            let body = if path == "/v1/memory" {
                memory
            } else if path == "/v1/stats" {
                stats
            } else {
                return respond(&mut stream, 404, "");
            };
            respond(&mut stream, 200, &body);
        }
        Mode::Stall => {
            // Hold the connection open, silent, until the test moves on (the
            // client's timeout should have given up long before).
            let until = Instant::now() + Duration::from_secs(30);
            while Instant::now() < until && *mode.lock().expect("mode lock") == Mode::Stall {
                thread::sleep(Duration::from_millis(20));
            }
        }
        Mode::Close => drop(stream),
        Mode::NotHttp => {
            let _ = stream.write_all(b"SSH-2.0-OpenSSH_9.6\r\nthis is not http\r\n\r\n");
        }
        Mode::Status(code) => respond(&mut stream, code, ""),
    }
}

fn respond(stream: &mut TcpStream, status: u16, body: &str) {
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body.as_bytes());
}
