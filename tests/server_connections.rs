//! Connections bounded in time and number (issue 13): a client that never
//! finishes its headers is closed by the header timeout, connections past
//! the cap get a minimal 503 while the server keeps serving, SIGTERM ends
//! the process whatever half-open clients do, and `--host` is checked (and
//! a non-loopback one without a key refused) before the model loads.

use crate::server;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use server::Server;

/// Long enough for any answer of a healthy server in a test.
const READ_LIMIT: Duration = Duration::from_secs(30);

/// A connection that has sent `bytes` and nothing more.
fn half_sent(server: &Server, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(server.address()).unwrap();
    stream.set_read_timeout(Some(READ_LIMIT)).unwrap();
    stream.write_all(bytes).unwrap();
    stream
}

/// Reads until the server closes; what it sent.
fn read_to_close(stream: &mut TcpStream) -> String {
    let mut text = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&buffer[..n]),
            // A reset is a close too.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            // A signal to this process (another test's child exiting) is not
            // the server's doing.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// `GET path` on a fresh connection; the raw answer.
fn raw_get(server: &Server, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    let mut stream = half_sent(server, request.as_bytes());
    read_to_close(&mut stream)
}

#[test]
fn a_client_that_never_finishes_its_headers_is_closed_by_the_timeout() {
    let server = Server::start(&["--header-timeout-ms", "1000"]);
    let start = Instant::now();
    let mut slow = half_sent(&server, b"GET /health HT");
    let answer = read_to_close(&mut slow);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(10),
        "closed after {waited:?}"
    );
    assert!(!answer.contains("200 OK"), "{answer}");
    // An idle keep-alive connection is closed the same way.
    let mut idle = half_sent(&server, b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n");
    let answer = read_to_close(&mut idle);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(server.get("/health").status, 200, "still serving");
}

#[test]
fn connections_past_the_cap_get_503_but_the_probes_are_answered() {
    let server = Server::start(&["--max-connections", "2", "--header-timeout-ms", "60000"]);
    // Two idle connections fill the cap (with the helper's own pooled
    // connection, if it kept one, the second is already refused).
    let holders: Vec<TcpStream> = (0..2).map(|_| half_sent(&server, b"")).collect();
    let answer = raw_get(&server, "/v1/models");
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{answer}"
    );
    let lower = answer.to_ascii_lowercase();
    assert!(lower.contains("\r\nretry-after: 1\r\n"), "{answer}");
    assert!(lower.contains("\r\nconnection: close\r\n"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    let error: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(error["error"]["code"], "too_many_connections", "{body}");
    assert!(
        error["error"]["message"].as_str().unwrap().contains('2'),
        "names the cap: {body}"
    );
    // The probes still get their real answers, as on any connection.
    for path in ["/health", "/ready"] {
        let answer = raw_get(&server, path);
        assert!(
            answer.starts_with("HTTP/1.1 200 OK\r\n"),
            "{path}: {answer}"
        );
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
        let probe: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(
            probe.get("status").is_some() || probe.get("ready").is_some(),
            "{path}: {body}"
        );
    }
    // A flood of slow clients past the cap does not shut the probes out:
    // each overflow connection is held for at most a second.
    let slow: Vec<TcpStream> = (0..8).map(|_| half_sent(&server, b"GET /heal")).collect();
    assert!(raw_get(&server, "/health").starts_with("HTTP/1.1 200 OK"));
    drop(slow);
    // Once the holders go, others are served again.
    drop(holders);
    server.wait_until("a connection is served again", || {
        raw_get(&server, "/v1/models").starts_with("HTTP/1.1 200")
    });
    assert!(server.log().contains("at the connection cap"));
}

/// `POST /v1/completions` with a `Content-Length` of `length` and the first
/// `sent` bytes of its body.
fn half_body(server: &Server, length: usize, sent: &[u8]) -> TcpStream {
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    );
    let stream = half_sent(server, head.as_bytes());
    (&stream).write_all(sent).unwrap();
    stream
}

/// The error code of a raw answer of status `status`.
fn error_code(answer: &str, status: &str) -> String {
    assert!(
        answer.starts_with(&format!("HTTP/1.1 {status}")),
        "{answer}"
    );
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    let error: serde_json::Value = serde_json::from_str(body).unwrap();
    error["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_slow_body_gets_408_naming_the_limit_and_the_connection_closes() {
    let server = Server::start(&[
        "--body-timeout-ms",
        "2000",
        "--body-rate-grace-ms",
        "500",
        "--min-body-rate",
        "200",
    ]);
    // Slow loris: a byte every 100 ms, below 200 bytes/s once the grace is over.
    let start = Instant::now();
    let mut loris = half_body(&server, 1000, b"{");
    let trickle = {
        let mut stream = loris.try_clone().unwrap();
        std::thread::spawn(move || {
            while stream.write_all(b" ").is_ok() {
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let answer = read_to_close(&mut loris);
    let waited = start.elapsed();
    assert_eq!(error_code(&answer, "408"), "min_body_rate", "{answer}");
    assert!(answer.contains("200 bytes/s"), "{answer}");
    assert!(
        waited >= Duration::from_millis(450) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    drop(loris);
    trickle.join().unwrap();

    // Fast enough for the rate (1 KiB/s), too slow for the whole body
    // within the timeout.
    let start = Instant::now();
    let mut steady = half_body(&server, 1 << 20, b"{");
    let feeder = {
        let mut stream = steady.try_clone().unwrap();
        std::thread::spawn(move || {
            while stream.write_all(&[b' '; 100]).is_ok() {
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let answer = read_to_close(&mut steady);
    let waited = start.elapsed();
    assert_eq!(error_code(&answer, "408"), "body_timeout", "{answer}");
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(6),
        "{waited:?}"
    );
    drop(steady);
    feeder.join().unwrap();
    // A body sent at once is served as always.
    let reply = server.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[test]
fn sigterm_ends_the_server_with_half_open_clients_after_draining_a_stream() {
    // No body deadline to speak of: the half-sent body is closed by SIGTERM.
    let mut server = Server::start(&["--min-body-rate", "0", "--body-timeout-ms", "600000"]);
    let half = half_sent(
        &server,
        b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Le",
    );
    let mut half_body = half_body(&server, 100, b"{\"pro");
    let idle = half_sent(&server, b"");
    let mut stream = server.open_stream(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 24, "stream": true, "ignore_eos": true}),
    );
    let first = stream.next_data().expect("a first event");
    assert_ne!(first, "[DONE]");
    let start = Instant::now();
    server.terminate();
    // The half-sent body is not waited for: closed at once, unanswered.
    let answer = read_to_close(&mut half_body);
    assert!(answer.is_empty(), "{answer}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "the half-sent body was held {:?}",
        start.elapsed()
    );
    // The answer in flight finishes.
    let mut last = first;
    while let Some(data) = stream.next_data() {
        last = data;
    }
    assert_eq!(last, "[DONE]", "the stream in flight drains");
    let status = server
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("still running 10 s after SIGTERM: {}", server.log()));
    assert!(status.success(), "{status:?}: {}", server.log());
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    drop((half, idle));
}

/// `sparkrt serve ARGS` that must fail; its exit code and stderr.
fn serve_fails(args: &[&str]) -> (Option<i32>, String, Duration) {
    let start = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_sparkrt"))
        .args(["serve", "--port", "0"])
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        start.elapsed(),
    )
}

#[test]
fn a_public_host_without_a_key_is_refused_before_the_model_loads() {
    // A model folder that does not exist: the host check comes first.
    for host in ["0.0.0.0", "::", "[::]"] {
        let (code, stderr, took) =
            serve_fails(&["--host", host, "--model", "/nonexistent/sparkrt-model"]);
        assert_eq!(code, Some(2), "{host}: {stderr}");
        assert!(stderr.contains("not loopback"), "{host}: {stderr}");
        assert!(stderr.contains("--api-key-file"), "{host}: {stderr}");
        assert!(stderr.contains("--insecure-no-api-key"), "{host}: {stderr}");
        assert!(!stderr.contains("nonexistent"), "{host}: {stderr}");
        assert!(took < Duration::from_secs(10), "{host}: {took:?}");
    }
    // With the flag the check passes (and the missing model is the error).
    let (code, stderr, _) = serve_fails(&[
        "--host",
        "0.0.0.0",
        "--insecure-no-api-key",
        "--model",
        "/nonexistent/sparkrt-model",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("without an API key"), "{stderr}");
    assert!(stderr.contains("nonexistent"), "{stderr}");
    // An unresolvable host, and a cap past the fd budget, likewise.
    let (code, stderr, _) = serve_fails(&["--host", "no-such-host.invalid"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no-such-host.invalid"), "{stderr}");
    let (code, stderr, _) = serve_fails(&["--max-connections", "100000000"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("RLIMIT_NOFILE"), "{stderr}");
}

#[test]
fn localhost_and_ipv6_loopback_serve() {
    let server = Server::start(&["--host", "localhost"]);
    assert!(
        server.url.starts_with("http://127.0.0.1:"),
        "{}",
        server.url
    );
    assert_eq!(server.get("/health").status, 200);
    drop(server);
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback here: --host ::1 not tried");
        return;
    }
    for host in ["::1", "[::1]"] {
        let server = Server::start(&["--host", host]);
        assert!(server.url.starts_with("http://[::1]:"), "{}", server.url);
        assert_eq!(server.get("/health").status, 200);
    }
}
