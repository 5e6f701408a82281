//! The accept loop of one serving thread: client connections, their
//! timeouts and their cap.
//!
//! `axum::serve` has no header-read or idle timeout and no connection cap,
//! so a slowloris client could hold connections (and file descriptors)
//! forever. This loop serves the same router over hyper-util's HTTP/1 +
//! HTTP/2 auto builder, and adds:
//!
//! - per connection, a watchdog ([`activity`]) that closes it when a request
//!   head takes longer than `header_read_timeout_secs` (from the accept or
//!   from the head's first byte), or when it has had no request in flight
//!   for `idle_timeout_secs`, or when its client has taken none of an
//!   answer that waits for it for `client_write_timeout_secs` (nginx's
//!   `send_timeout`);
//! - a cap on client connections over all serving threads
//!   ([`ConnectionSlots`], `max_connections`): a connection over it is
//!   accepted and closed at once — the client learns at once rather than
//!   waiting in a full backlog, and its file descriptor is freed — and one
//!   WARN line naming the cap is logged at most every ten seconds. The cap
//!   is what keeps worker connections (one per request in flight) within
//!   the file descriptors left to them, so requests count under it too: a
//!   connection's first request in flight rides on its connection's place,
//!   and each further one at the same time (HTTP/2 streams; up to 200 a
//!   connection) takes a place of its own ([`Place`]), or is answered 503
//!   with `Retry-After` when none is left (and, like every answer, the
//!   request's `x-request-id`: this one never reaches the router's layers,
//!   so it picks the id itself);
//! - the same cap on a request's headers over both protocols
//!   ([`MAX_HEAD_BYTES`]);
//! - `TCP_NODELAY` on every connection (streamed tokens must not wait for
//!   Nagle's algorithm), and the peer address as
//!   `axum::extract::ConnectInfo<SocketAddr>` in every request's extensions,
//!   as `into_make_service_with_connect_info` would put it.
//!
//! Shutdown: from the moment the gateway starts shutting down (`draining`,
//! before the shutdown delay), every answer to an HTTP/1 request says
//! `Connection: close`, and its connection closes after it: a keep-alive
//! client (whose connection a load balancer or a Kubernetes Service pins
//! here, whatever the endpoints say) takes its next request to a new
//! connection, and so to a replica that stays, instead of sending here
//! until the listener closes, when one sent as its idle connection closes
//! is lost. (HTTP/2 connections get their GOAWAY at `stop`, which tells a
//! client which streams were not served.) Then on `stop` the loop stops
//! accepting and asks each connection to finish gracefully (HTTP/1 closes
//! after its response in flight, HTTP/2 sends GOAWAY), then waits for them
//! all; a connection with nothing in flight that has not closed
//! `header_read_timeout` after the stop or its last answer (an HTTP/2
//! client that never answers the GOAWAY's PING) is closed then. The
//! serving thread drops the runtime — and with it every connection still
//! open — on abort.

mod activity;

use crate::error::GatewayError;
use crate::metrics::{Describe, Family, Metrics, OneGauge};
use crate::trace::request_id::{REQUEST_ID_HEADER, RequestIds};
use ::metrics::{Counter, Label};
use activity::{Activity, Busy, Timeouts, WatchedIo};
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

/// The most bytes of headers a request may have, over either protocol:
/// hyper's own HTTP/1 limit (the read buffer a request head must fit in),
/// set on both so that they agree. hyper's HTTP/2 default (16 KiB) refused
/// with a bare 431 headers that HTTP/1 took, so a request that worked
/// broke once its client, or a proxy in front, moved to HTTP/2.
const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;

/// Shortest time between two WARN lines about the connection cap.
const CAP_WARNING_EVERY: Duration = Duration::from_secs(10);
/// Pause after an accept error that is not one connection's (out of file
/// descriptors, say), so the loop does not spin while none can be had.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// The open client connections of all serving threads, and their cap.
#[derive(Debug)]
pub(crate) struct ConnectionSlots {
    open: AtomicUsize,
    cap: usize,
    /// What sets the cap, for the WARN line.
    setting: &'static str,
    /// Connections closed at the cap since the last WARN line.
    refused: AtomicUsize,
    /// Connections closed at the cap, and requests (HTTP/2 streams beyond
    /// a connection's first) answered 503 at it, since start: the
    /// counters [`ConnectionMetrics`] publishes.
    refused_connections: AtomicU64,
    refused_streams: AtomicU64,
    /// When the last WARN line was logged, in ms since `epoch` (0: never).
    warned_at_ms: AtomicU64,
    epoch: std::time::Instant,
}

pub(crate) const CONNECTIONS: Describe = Describe::new(
    "radixgate_client_connections",
    "Places taken under the client connection cap (server.max_connections): \
     open client connections, and requests in flight beyond each one's first.",
);
pub(crate) const REFUSED: Describe = Describe::new(
    "radixgate_client_connections_refused_total",
    "Refused at the client connection cap: connections closed at once (kind \
     connection), and requests beyond a connection's first answered 503 (kind stream).",
);

/// The client port's connection gauge and refusals, published from the
/// cap's own atomics by the upkeep tick (nothing is recorded per
/// connection or per request).
pub(crate) struct ConnectionMetrics {
    open: OneGauge,
    refused: Family<&'static str, Counter>,
}

impl ConnectionMetrics {
    pub(crate) fn new(metrics: &Metrics) -> Self {
        let this = Self {
            open: metrics.gauge(&CONNECTIONS),
            refused: metrics.counters(&REFUSED),
        };
        // Exported at 0 from the start, so that an alert on their rate
        // has a series to read.
        for kind in ["connection", "stream"] {
            this.refused_total(kind, 0);
        }
        this
    }

    /// Publishes what `slots` counts now.
    pub(crate) fn publish(&self, slots: &ConnectionSlots) {
        self.open.set(slots.open.load(Ordering::Relaxed) as f64);
        self.refused_total(
            "connection",
            slots.refused_connections.load(Ordering::Relaxed),
        );
        self.refused_total("stream", slots.refused_streams.load(Ordering::Relaxed));
    }

    fn refused_total(&self, kind: &'static str, total: u64) {
        self.refused.with(
            &kind,
            || kind,
            || vec![Label::new("kind", kind)],
            |c| c.absolute(total),
        );
    }
}

/// One open connection's place under the cap; freed when dropped.
struct Slot(Arc<ConnectionSlots>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ConnectionSlots {
    /// Room for `cap` connections (`server.max_connections`).
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Self::set_by(cap, "server.max_connections")
    }

    /// Room for `cap` connections, a cap that `setting` names.
    pub(crate) fn set_by(cap: usize, setting: &'static str) -> Arc<Self> {
        Arc::new(Self {
            open: AtomicUsize::new(0),
            cap,
            setting,
            refused: AtomicUsize::new(0),
            refused_connections: AtomicU64::new(0),
            refused_streams: AtomicU64::new(0),
            warned_at_ms: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        })
    }

    fn try_open(self: &Arc<Self>) -> Option<Slot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.cap).then_some(open + 1)
            })
            .ok()
            .map(|_| Slot(self.clone()))
    }

    /// Counts a connection closed at the cap.
    fn refused_connection(&self) {
        self.refused_connections.fetch_add(1, Ordering::Relaxed);
        self.refused();
    }

    /// Counts a request (an HTTP/2 stream) answered 503 at the cap.
    fn refused_stream(&self) {
        self.refused_streams.fetch_add(1, Ordering::Relaxed);
        self.refused();
    }

    /// Logs one WARN line about the cap at most every
    /// [`CAP_WARNING_EVERY`] over all threads.
    fn refused(&self) {
        self.refused.fetch_add(1, Ordering::AcqRel);
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let last = self.warned_at_ms.load(Ordering::Acquire);
        let due = last == 0 || now.saturating_sub(last) >= CAP_WARNING_EVERY.as_millis() as u64;
        if due
            && self
                .warned_at_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let refused = self.refused.swap(0, Ordering::AcqRel);
            tracing::warn!(
                max_connections = self.cap,
                refused,
                "client connection cap ({} = {}) reached: closing new connections \
                 and refusing further HTTP/2 streams",
                self.setting,
                self.cap
            );
        }
    }
}

/// A request's place under the connection cap, held with its response
/// body: the connection's own place for the first request in flight on it,
/// or one taken for a further request at the same time (an HTTP/2 stream),
/// which would otherwise open a worker connection the cap does not see.
enum Place {
    /// The connection's own place; free again when this drops.
    Own(Arc<AtomicBool>),
    /// A place of its own under the cap, freed when this drops.
    Extra { _slot: Slot },
}

impl Place {
    /// A place for a request on a connection whose own place is `own`
    /// (true while a request holds it); `None` when the cap is full.
    fn take(own: &Arc<AtomicBool>, slots: &Arc<ConnectionSlots>) -> Option<Self> {
        if own
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Some(Self::Own(own.clone()));
        }
        slots.try_open().map(|slot| Self::Extra { _slot: slot })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Self::Own(own) = self {
            own.store(false, Ordering::Release);
        }
    }
}

/// What every connection of a gateway is held to.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionLimits {
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) write_timeout: Duration,
    pub(crate) slots: Arc<ConnectionSlots>,
    /// Where a refused stream's id is read from (the router's own).
    pub(crate) ids: Arc<RequestIds>,
    /// Cancelled when the gateway starts shutting down: HTTP/1 answers
    /// then close their connections.
    pub(crate) draining: CancellationToken,
}

impl ConnectionLimits {
    /// The cap on client connections.
    pub(crate) fn slots_cap(&self) -> usize {
        self.slots.cap
    }
}

/// Serves `app` on `listener` until `stop`, then waits for the connections
/// to finish. Runs on the serving thread's own runtime.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The watchdog keeps the header timeout (hyper's would also cut idle
    // keep-alive connections at the header timeout; see `activity`).
    builder
        .http1()
        .header_read_timeout(None)
        .max_buf_size(MAX_HEAD_BYTES);
    builder
        .http2()
        .max_header_list_size(u32::try_from(MAX_HEAD_BYTES).unwrap_or(u32::MAX));
    let builder = Arc::new(builder);
    let timeouts = Timeouts {
        header: limits.header_read_timeout,
        idle: limits.idle_timeout,
        write: limits.write_timeout,
    };
    let connections = TaskTracker::new();
    loop {
        let (tcp, peer) = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) if is_connection_error(&err) => continue,
                Err(err) => {
                    tracing::error!(error = %err, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let Some(slot) = limits.slots.try_open() else {
            drop(tcp);
            limits.slots.refused_connection();
            continue;
        };
        let _ = tcp.set_nodelay(true);
        connections.spawn(connection(
            tcp,
            peer,
            app.clone(),
            builder.clone(),
            timeouts,
            stop.clone(),
            slot,
            limits.ids.clone(),
            limits.draining.clone(),
        ));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Errors of one incoming connection, not of the listener.
fn is_connection_error(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Serves one connection until it ends, its watchdog expires, or (after
/// `stop`) its last request is answered.
// What one connection needs; a struct of them would only rename them.
#[allow(clippy::too_many_arguments)]
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    app: Router,
    builder: Arc<auto::Builder<TokioExecutor>>,
    timeouts: Timeouts,
    stop: CancellationToken,
    slot: Slot,
    ids: Arc<RequestIds>,
    draining: CancellationToken,
) {
    let activity = Activity::new();
    let io = TokioIo::new(WatchedIo::new(tcp, activity.clone()));
    let requests = activity.clone();
    let slots = slot.0.clone();
    let own_place = Arc::new(AtomicBool::new(false));
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let busy = requests.request();
        let place = Place::take(&own_place, &slots);
        if place.is_none() {
            slots.refused_stream();
        }
        let cap = slots.cap;
        let http1 = req.version() < axum::http::Version::HTTP_2;
        req.extensions_mut().insert(ConnectInfo(peer));
        let app = app.clone();
        let ids = ids.clone();
        let draining = draining.clone();
        async move {
            let mut response = match place {
                Some(_) => app.oneshot(req.map(Body::new)).await?,
                None => {
                    let mut refused =
                        axum::response::IntoResponse::into_response(GatewayError::ConnectionCap {
                            cap,
                        });
                    let id = ids.pick(req.headers());
                    refused.headers_mut().insert(REQUEST_ID_HEADER, id);
                    refused
                }
            };
            // Shutting down: the client's next request goes elsewhere.
            if http1 && draining.is_cancelled() {
                response.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                Body::new(Tracked {
                    body,
                    busy,
                    _place: place,
                })
            }))
        }
    });
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let expired = activity.expired(timeouts);
    tokio::pin!(expired);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(%peer, error = %err, "client connection ended with an error");
                }
                return;
            }
            () = stop.cancelled(), if !stopping => {
                stopping = true;
                activity.stopping();
                conn.as_mut().graceful_shutdown();
            }
            () = expired.as_mut() => {
                if !stopping && activity.idle_h2() {
                    tracing::debug!(%peer, "idle HTTP/2 client connection: sending GOAWAY");
                    stopping = true;
                    activity.stopping();
                    conn.as_mut().graceful_shutdown();
                    expired.set(activity.expired(timeouts));
                    continue;
                }
                tracing::debug!(%peer, "closing client connection: header, idle or write timeout");
                return;
            }
        }
    }
}

/// A response body that keeps its request counted on the connection until
/// it is dropped (sent, or cut off), and tells it whether the client or the
/// worker is what the answer waits for.
struct Tracked {
    body: Body,
    busy: Busy,
    /// The request's place under the connection cap (`None`: refused).
    _place: Option<Place>,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(_))) => self.busy.handed(),
            _ => self.busy.asked(),
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;

    /// The peer address reaches handlers as axum's `ConnectInfo`, over
    /// HTTP/1 and HTTP/2, and `stop` ends the loop once connections close.
    #[tokio::test]
    async fn connect_info_over_both_protocols_and_a_graceful_stop() {
        let app = Router::new().route(
            "/peer",
            get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.ip().to_string() }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(60),
            slots: ConnectionSlots::new(16),
            ids: RequestIds::new(Vec::new()),
            draining: CancellationToken::new(),
        };
        let stop = CancellationToken::new();
        let served = tokio::spawn(serve(listener, app, limits.clone(), stop.clone()));
        let _ = rustls::crypto::ring::default_provider().install_default();
        for h2 in [false, true] {
            let mut client = reqwest::Client::builder().no_proxy();
            if h2 {
                client = client.http2_prior_knowledge();
            }
            let response = client
                .build()
                .unwrap()
                .get(format!("http://{addr}/peer"))
                .send()
                .await
                .unwrap();
            let version = response.version();
            assert_eq!(response.text().await.unwrap(), "127.0.0.1");
            assert_eq!(version == axum::http::Version::HTTP_2, h2);
        }
        stop.cancel();
        served.await.unwrap().unwrap();
        assert_eq!(limits.slots.open.load(Ordering::Acquire), 0);
    }
}
