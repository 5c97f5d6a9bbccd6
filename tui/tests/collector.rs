//! The collector against a tiny HTTP server on 127.0.0.1 that answers well,
//! slowly, not at all, or with garbage. Time bounds are generous: they only
//! catch a collector that hangs, they do not measure it.

use crate::common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{GIB, Mode, TestServer, canned_host, dead_url};
use sparkrt_tui::HostSource;
use sparkrt_tui::client::ServerClient;
use sparkrt_tui::collector::{self, Collector, Sample};
use sparkrt_tui::event::AppEvent;
use sparkrt_tui::link::ServerLink;
use sparkrt_wire::HostSnapshot;

/// Short enough that a stalled server fails a poll quickly.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(300);
/// Far above the timeout; only a hang exceeds it.
const HANG_BOUND: Duration = Duration::from_secs(20);

struct CannedHost;

impl HostSource for CannedHost {
    fn read(&mut self) -> Result<HostSnapshot, String> {
        Ok(canned_host())
    }
}

struct BrokenHost;

impl HostSource for BrokenHost {
    fn read(&mut self) -> Result<HostSnapshot, String> {
        Err("/proc/meminfo: no such file".to_string())
    }
}

fn collector_for(url: &str) -> Collector {
    let client = ServerClient::new(url, REQUEST_TIMEOUT).unwrap();
    Collector::new(Box::new(CannedHost), client)
}

fn disconnect_reason(sample: &Sample) -> &str {
    match &sample.link {
        ServerLink::Disconnected { reason } => reason,
        other => panic!("expected disconnected, got {other:?}"),
    }
}

#[test]
fn healthy_server_gives_memory_and_stats() {
    let server = TestServer::start(Mode::healthy());
    let mut collector = collector_for(&server.url());
    let sample = collector.collect();
    assert_eq!(sample.link, ServerLink::Connected { reconnects: 0 });
    let memory = sample.server.as_ref().expect("memory");
    assert_eq!(memory.runtime_allocated(), 84 * GIB);
    let stats = sample.serving().expect("stats");
    assert_eq!(stats.requests_running, 3);
    assert_eq!(sample.host.as_ref().unwrap().mem_total, 128 * GIB);
    // One reading of a counter gives no rate yet.
    assert_eq!(sample.generation_tokens_per_s, None);
    // The second reading: the canned counter did not move, so 0 tokens/s.
    let second = collector.collect();
    assert_eq!(second.generation_tokens_per_s, Some(0.0));
}

#[test]
fn no_server_is_disconnected_with_host_readings_kept() {
    let mut collector = collector_for(&dead_url());
    let sample = collector.collect();
    let reason = disconnect_reason(&sample);
    assert!(reason.contains("/v1/memory"), "{reason}");
    assert!(sample.server.is_none() && sample.stats.is_none());
    assert_eq!(sample.host_reading(), Some(&canned_host()));
}

#[test]
fn stalled_server_times_out_then_recovers() {
    let server = TestServer::start(Mode::Stall);
    let mut collector = collector_for(&server.url());

    let started = Instant::now();
    let sample = collector.collect();
    assert!(
        started.elapsed() < HANG_BOUND,
        "the request timeout was not honoured"
    );
    let reason = disconnect_reason(&sample).to_lowercase();
    assert!(
        reason.contains("timeout") || reason.contains("timed out"),
        "{reason}"
    );

    server.set_mode(Mode::healthy());
    let sample = collector.collect();
    assert_eq!(sample.link, ServerLink::Connected { reconnects: 0 });

    server.set_mode(Mode::Stall);
    assert!(matches!(
        collector.collect().link,
        ServerLink::Disconnected { .. }
    ));
    server.set_mode(Mode::healthy());
    assert_eq!(
        collector.collect().link,
        ServerLink::Connected { reconnects: 1 }
    );
}

#[test]
fn closed_connection_is_disconnected() {
    let server = TestServer::start(Mode::Close);
    let mut collector = collector_for(&server.url());
    let sample = collector.collect();
    disconnect_reason(&sample);
    server.set_mode(Mode::healthy());
    assert!(matches!(
        collector.collect().link,
        ServerLink::Connected { .. }
    ));
}

#[test]
fn answers_that_are_not_http_are_disconnected() {
    let server = TestServer::start(Mode::NotHttp);
    let mut collector = collector_for(&server.url());
    disconnect_reason(&collector.collect());
}

#[test]
fn error_status_is_disconnected_and_named() {
    let server = TestServer::start(Mode::Status(503));
    let mut collector = collector_for(&server.url());
    let sample = collector.collect();
    assert!(disconnect_reason(&sample).contains("503"));
}

#[test]
fn garbage_memory_body_is_disconnected_with_the_parse_error() {
    let server = TestServer::start(Mode::Serve {
        memory: "{\"plan\": {}, \"ledger\": {\"categ".to_string(),
        stats: common::STATS_OK.to_string(),
    });
    let mut collector = collector_for(&server.url());
    let sample = collector.collect();
    let reason = disconnect_reason(&sample);
    assert!(
        reason.contains("/v1/memory is not the expected JSON"),
        "{reason}"
    );
}

#[test]
fn garbage_stats_keep_the_link_and_report_the_error() {
    let server = TestServer::start(Mode::Serve {
        memory: common::MEMORY_OK.to_string(),
        stats: common::STATS_OK.replace("\"requests_running\": 3", "\"requests_running\": NaN"),
    });
    let mut collector = collector_for(&server.url());
    let sample = collector.collect();
    assert_eq!(sample.link, ServerLink::Connected { reconnects: 0 });
    assert!(sample.server.is_some());
    match &sample.stats {
        Some(Err(error)) => assert!(
            error.contains("/v1/stats is not the expected JSON"),
            "{error}"
        ),
        other => panic!("expected a stats error, got {other:?}"),
    }
}

#[test]
fn a_failing_host_source_is_reported_and_the_server_host_used() {
    let server = TestServer::start(Mode::healthy());
    let client = ServerClient::new(&server.url(), REQUEST_TIMEOUT).unwrap();
    let mut collector = Collector::new(Box::new(BrokenHost), client);
    let sample = collector.collect();
    assert_eq!(sample.host, Err("/proc/meminfo: no such file".to_string()));
    // The server's own host object stands in (it has no usable figure).
    let host = sample.host_reading().expect("server host");
    assert_eq!(host.mem_available, 40 * GIB);
    assert_eq!(host.usable, None);
}

#[test]
fn collector_thread_reports_disconnect_and_reconnect() {
    let server = TestServer::start(Mode::healthy());
    let (events_tx, events) = mpsc::channel();
    let (stop, stop_rx) = mpsc::channel();
    let thread = collector::spawn(
        collector_for(&server.url()).with_processes(5),
        Duration::from_millis(50),
        events_tx,
        stop_rx,
    )
    .unwrap();
    let next_link = || match events.recv_timeout(HANG_BOUND) {
        Ok(AppEvent::Sample(sample)) => {
            assert!(sample.processes.len() <= 5);
            sample.link
        }
        other => panic!("expected a sample, got {other:?}"),
    };
    assert!(matches!(next_link(), ServerLink::Connected { .. }));

    server.set_mode(Mode::Close);
    while !matches!(next_link(), ServerLink::Disconnected { .. }) {}
    server.set_mode(Mode::healthy());
    loop {
        if let ServerLink::Connected { reconnects } = next_link() {
            assert_eq!(reconnects, 1);
            break;
        }
    }

    drop(stop);
    let started = Instant::now();
    while !thread.is_finished() {
        assert!(started.elapsed() < HANG_BOUND, "collector did not stop");
        std::thread::sleep(Duration::from_millis(10));
    }
}
