//! The accept loop: every connection bounded in time (a header read
//! timeout, which hyper also starts while a keep-alive connection waits for
//! its next request; a body deadline and a minimum body rate) and in number
//! (a cap, beyond which a connection gets a minimal `503` and is closed,
//! except the probes, see [`overflow`]), and a shutdown that ends within the
//! drain time whatever clients do.

use std::convert::Infallible;
use std::future::Future;
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
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use super::fds::OVERFLOW_RESPONDERS;

/// A request's headers must arrive within this of the connection being
/// ready for them: after accept, and after the previous answer on a
/// keep-alive connection (so it is the idle keep-alive timeout as well).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A request's body must have arrived within this of its headers.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// After [`BODY_RATE_GRACE`], a body must keep arriving at this average
/// rate (bytes/s) counted from its headers: a client sending a byte now and
/// then (slow loris) is cut off after the grace instead of holding a
/// connection and a handler for the whole [`BODY_TIMEOUT`]. 16 KiB/s is
/// far below any real client's rate and lets a maximal body of a
/// 4096-token model (a few MB) through within the timeout on a slow link.
pub const MIN_BODY_BYTES_PER_S: u64 = 16 << 10;

/// How long a body may take to start flowing before the rate counts.
pub const BODY_RATE_GRACE: Duration = Duration::from_secs(5);

/// After SIGTERM, answers in flight get this long to finish; then every
/// connection is closed. Below systemd's default `TimeoutStopSec` (90 s)
/// and the unit install.sh writes.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a refusal may take to write and to read what the client sent.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

/// Waits after a failed accept (e.g. EMFILE from a descriptor used
/// elsewhere) instead of spinning.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// The bounds one server runs with.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub body: BodyPace,
    pub max_connections: usize,
    pub drain_timeout: Duration,
}

/// How fast a request body must arrive (see [`Receiving`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyPace {
    pub timeout: Duration,
    pub min_bytes_per_s: u64,
    pub rate_grace: Duration,
}

impl Default for BodyPace {
    fn default() -> Self {
        BodyPace {
            timeout: BODY_TIMEOUT,
            min_bytes_per_s: MIN_BODY_BYTES_PER_S,
            rate_grace: BODY_RATE_GRACE,
        }
    }
}

impl BodyPace {
    /// When the next body byte must have arrived, `seen` bytes in, and the
    /// limit that sets it.
    fn deadline(&self, seen: u64) -> (Duration, BodyTooSlow) {
        let by_rate = if self.min_bytes_per_s == 0 {
            Duration::MAX
        } else {
            self.rate_grace.saturating_add(Duration::from_secs_f64(
                seen as f64 / self.min_bytes_per_s as f64,
            ))
        };
        if by_rate < self.timeout {
            (
                by_rate,
                BodyTooSlow::Rate {
                    min_bytes_per_s: self.min_bytes_per_s,
                    grace: self.rate_grace,
                },
            )
        } else {
            (self.timeout, BodyTooSlow::Timeout(self.timeout))
        }
    }
}

/// A body that did not arrive in time: the error its reader gets (the
/// handler answers 408 naming the limit, see `body::read`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyTooSlow {
    #[error("the request body did not arrive within body_timeout = {}s", .0.as_secs_f64())]
    Timeout(Duration),
    #[error(
        "the request body arrived slower than min_body_rate = {min_bytes_per_s} bytes/s \
         (counted after {}s)", grace.as_secs_f64()
    )]
    Rate {
        min_bytes_per_s: u64,
        grace: Duration,
    },
}

impl BodyTooSlow {
    /// The limit's name (the error's `code`).
    pub fn name(&self) -> &'static str {
        match self {
            BodyTooSlow::Timeout(_) => "body_timeout",
            BodyTooSlow::Rate { .. } => "min_body_rate",
        }
    }
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
                    tasks.spawn(overflow(
                        stream,
                        router.clone(),
                        permit,
                        limits.max_connections,
                    ));
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
/// stops. On stop a connection with no request being answered (idle, its
/// headers half sent, or its body still arriving) is closed at once; one
/// with answers in flight gets the drain time.
async fn connection(
    stream: TcpStream,
    router: Router,
    _permit: OwnedSemaphorePermit,
    mut stopped: watch::Receiver<bool>,
    limits: ConnectionLimits,
) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let receiving = Arc::new(AtomicUsize::new(0));
    let service = {
        let (in_flight, receiving) = (Arc::clone(&in_flight), Arc::clone(&receiving));
        let inner = TowerToHyperService::new(router);
        service_fn(move |request: hyper::Request<Incoming>| {
            let active = Active::enter(&in_flight);
            let request = request.map(|body| Receiving::new(body, limits.body, &receiving));
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
    // Every request counted in flight is still receiving its body: nothing
    // is being answered, so nothing is lost by closing now.
    if in_flight.load(Ordering::Acquire) <= receiving.load(Ordering::Acquire) {
        return;
    }
    served.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(limits.drain_timeout, served).await;
}

/// A connection beyond the cap: one request, read and answered within
/// [`REFUSAL_TIMEOUT`], then closed. `GET /health` and `GET /ready` are
/// answered by the router as on any connection; everything else gets a
/// minimal `503` in OpenAI's error shape.
///
/// Why this path rather than a connection slot reserved for the probes: a
/// reserved slot is one more connection a slow client can hold (its headers
/// trickling in for the whole header timeout), and then the kubelet's probe
/// finds it taken exactly when the server is flooded. Here every
/// connection past the cap gets its own short-lived responder (up to
/// [`OVERFLOW_RESPONDERS`], whose descriptors `fds` budgets), bounded to
/// one request and one second, so a flood of slow clients costs each of
/// them a second, and a probe arriving meanwhile is answered. (Only a
/// sustained flood of more than [`OVERFLOW_RESPONDERS`] new connections a
/// second, each holding its responder the whole second, can still crowd a
/// probe out: past the responders a connection is closed unanswered.) The probes'
/// handlers read no body and take no engine or preparation slot, so
/// answering them here costs no more than the 503.
async fn overflow(
    stream: TcpStream,
    router: Router,
    _permit: OwnedSemaphorePermit,
    max_connections: usize,
) {
    let inner = TowerToHyperService::new(router);
    let service = service_fn(move |request: hyper::Request<Incoming>| {
        let probe = request.method() == hyper::Method::GET
            && super::auth::PROBES.contains(&request.uri().path());
        let answer = probe.then(|| inner.call(request));
        async move {
            match answer {
                Some(answer) => answer.await,
                None => Ok(too_many_connections(max_connections)),
            }
        }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(REFUSAL_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, served).await;
}

/// The `503` beyond the cap.
fn too_many_connections(max_connections: usize) -> axum::response::Response {
    let body = format!(
        "{{\"error\":{{\"message\":\"too many connections: the server holds its maximum of \
         {max_connections}; retry shortly\",\"type\":\"server_error\",\"param\":null,\
         \"code\":\"too_many_connections\"}}}}"
    );
    axum::response::Response::builder()
        .status(hyper::StatusCode::SERVICE_UNAVAILABLE)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::RETRY_AFTER, "1")
        .header(hyper::header::CONNECTION, "close")
        .body(Body::from(body))
        .unwrap_or_default()
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

/// A request's body as it arrives: each frame must come before the
/// deadline [`BodyPace::deadline`] sets from the bytes seen so far, else
/// the reader gets [`BodyTooSlow`]. Counted as receiving (see
/// [`connection`]) until it ends, fails or is dropped.
struct Receiving {
    body: Incoming,
    pace: BodyPace,
    started: tokio::time::Instant,
    seen: u64,
    /// Armed at the first poll that waits (a body never polled costs no timer).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    receiving: Option<Active>,
}

impl Receiving {
    fn new(body: Incoming, pace: BodyPace, receiving: &Arc<AtomicUsize>) -> Receiving {
        let counted = (!hyper::body::Body::is_end_stream(&body)).then(|| Active::enter(receiving));
        Receiving {
            body,
            pace,
            started: tokio::time::Instant::now(),
            seen: 0,
            timer: None,
            receiving: counted,
        }
    }
}

impl hyper::body::Body for Receiving {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.seen = this.seen.saturating_add(data.len() as u64);
                }
                // The deadline moves with every byte; re-armed when next waiting.
                this.timer = None;
                if this.body.is_end_stream() {
                    this.receiving = None;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => {
                this.receiving = None;
                Poll::Ready(other.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                let (after, limit) = this.pace.deadline(this.seen);
                let started = this.started;
                let timer = this.timer.get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep_until(
                        started.checked_add(after).unwrap_or_else(far_future),
                    ))
                });
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.receiving = None;
                        Poll::Ready(Some(Err(Box::new(limit))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A deadline that never comes (a pace without a rate, far from now).
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_deadline_moves_with_the_bytes_until_the_timeout() {
        let pace = BodyPace {
            timeout: Duration::from_secs(30),
            min_bytes_per_s: 1000,
            rate_grace: Duration::from_secs(5),
        };
        let rate = BodyTooSlow::Rate {
            min_bytes_per_s: 1000,
            grace: Duration::from_secs(5),
        };
        assert_eq!(pace.deadline(0), (Duration::from_secs(5), rate));
        assert_eq!(pace.deadline(2500), (Duration::from_millis(7500), rate));
        // Enough bytes earn no more than the timeout.
        let timeout = (
            Duration::from_secs(30),
            BodyTooSlow::Timeout(Duration::from_secs(30)),
        );
        assert_eq!(pace.deadline(25_000), timeout);
        assert_eq!(pace.deadline(u64::MAX), timeout);
        let no_rate = BodyPace {
            min_bytes_per_s: 0,
            ..pace
        };
        assert_eq!(no_rate.deadline(0), timeout);
    }
}
