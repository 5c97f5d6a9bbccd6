//! The accept loop: every connection bounded in time (a header read
//! timeout, which hyper also starts while a keep-alive connection waits for
//! its next request) and in number (a cap, beyond which a connection gets a
//! minimal `503` and is closed), and a shutdown that ends within the drain
//! time whatever clients do.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::{Service, service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use super::fds::OVERFLOW_RESPONDERS;

/// A request's headers must arrive within this of the connection being
/// ready for them: after accept, and after the previous answer on a
/// keep-alive connection (so it is the idle keep-alive timeout as well).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// After SIGTERM, answers in flight get this long to finish; then every
/// connection is closed. Below systemd's default `TimeoutStopSec` (90 s)
/// and the unit install.sh writes.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a refusal may take to write and to read what the client sent.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

/// What a refused client may have sent that is read (not to reset the
/// connection under its answer).
const REFUSAL_READ_BYTES: usize = 16 << 10;

/// Waits after a failed accept (e.g. EMFILE from a descriptor used
/// elsewhere) instead of spinning.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// The bounds one server runs with.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
    pub drain_timeout: Duration,
}

/// Serves `router` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(OVERFLOW_RESPONDERS));
    let (stop, stopped) = watch::channel(false);
    let mut tasks = JoinSet::new();
    // Logged once per episode, not per connection.
    let at_cap = AtomicBool::new(false);
    let accept_failing = AtomicBool::new(false);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                if accept_failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("accepting connections again");
                }
                stream
            }
            Err(e) => {
                if !accept_failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!("accepting a connection failed: {e}");
                }
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => {
                if at_cap.swap(false, Ordering::Relaxed) {
                    tracing::info!("below the connection cap again");
                }
                tasks.spawn(connection(
                    stream,
                    router.clone(),
                    permit,
                    stopped.clone(),
                    limits,
                ));
            }
            Err(_) => {
                if !at_cap.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "at the connection cap: new connections get 503"
                    );
                }
                // Past the refusers too, the connection is just closed.
                if let Ok(permit) = Arc::clone(&refusals).try_acquire_owned() {
                    tasks.spawn(refuse(stream, permit, limits.max_connections));
                }
            }
        }
    }
    drop(listener);
    let _ = stop.send(true);
    // Connections close at once when idle, within the drain time otherwise;
    // the extra second covers their last writes.
    let all_closed = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.drain_timeout + Duration::from_secs(1), all_closed)
        .await
        .is_err()
    {
        tracing::warn!("closing connections still open after the drain time");
    }
    tasks.abort_all();
}

/// One connection: HTTP/1.1 with keep-alive until it ends or the server
/// stops. On stop a connection with no request in flight (idle, or a
/// request half sent) is closed at once; one with answers in flight gets
/// the drain time.
async fn connection(
    stream: TcpStream,
    router: Router,
    _permit: OwnedSemaphorePermit,
    mut stopped: watch::Receiver<bool>,
    limits: ConnectionLimits,
) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let service = {
        let in_flight = Arc::clone(&in_flight);
        let inner = TowerToHyperService::new(router);
        service_fn(move |request: hyper::Request<Incoming>| {
            let active = Active::enter(&in_flight);
            let answer = inner.call(request);
            async move {
                let response = answer.await?;
                Ok::<_, Infallible>(response.map(|body| Tracked {
                    body,
                    _active: active,
                }))
            }
        })
    };
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(served);
    tokio::select! {
        result = served.as_mut() => {
            if let Err(e) = result {
                tracing::debug!("connection ended: {e}");
            }
            return;
        }
        _ = stopped.wait_for(|stop| *stop) => {}
    }
    if in_flight.load(Ordering::Acquire) == 0 {
        return;
    }
    served.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(limits.drain_timeout, served).await;
}

/// The answer beyond the cap: a minimal `503` in OpenAI's error shape.
async fn refuse(mut stream: TcpStream, _permit: OwnedSemaphorePermit, max_connections: usize) {
    let body = format!(
        "{{\"error\":{{\"message\":\"too many connections: the server holds its maximum of \
         {max_connections}; retry shortly\",\"type\":\"server_error\",\"param\":null,\
         \"code\":\"too_many_connections\"}}}}"
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent, so closing does not reset the
        // connection before it has read the answer.
        let mut buffer = vec![0u8; 4096];
        let mut read = 0;
        while read < REFUSAL_READ_BYTES {
            match stream.read(&mut buffer).await? {
                0 => break,
                n => read += n,
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// Counts a request in flight on its connection until its answer's body
/// has been sent (or dropped).
struct Active(Arc<AtomicUsize>);

impl Active {
    fn enter(count: &Arc<AtomicUsize>) -> Active {
        count.fetch_add(1, Ordering::AcqRel);
        Active(Arc::clone(count))
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body that keeps its request counted while it is sent.
struct Tracked {
    body: Body,
    _active: Active,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
