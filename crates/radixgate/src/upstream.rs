//! The HTTP clients the gateway talks to workers with, and header hygiene.
//!
//! Two pooled clients (keep-alive, `TCP_NODELAY`, the same TLS roots):
//! [`Forwarder`] carries client requests — hyper's own pooled client, with
//! the worker's base URL joined to the route by plain string concatenation
//! and the body sent as the client's `Bytes`, nothing re-parsed or copied
//! per request — and a `reqwest` client ([`client`]) makes the gateway's own
//! calls (health probes, model discovery, fan-out), where convenience
//! matters more than microseconds.
//!
//! Only headers are filtered on the way through: hop-by-hop headers are
//! connection-specific and must not be forwarded (RFC 9110 §7.6.1) — the
//! standard ones and every header the message's own `Connection` header
//! names, both ways — `host` and `content-length` are set by the client
//! library for the new connection, the client's `authorization` is
//! replaced by the worker's own key when one is configured, and its
//! `accept-encoding` is not passed on: the gateway reads answers (usage,
//! first tokens) and may append an error event to a stream, so a worker (or
//! a proxy in front of it) must not compress them. A worker's CORS
//! headers (`access-control-*`) are dropped from its answers: engines allow
//! pages of any origin by default, and the router's own
//! `cors_allowed_origins` must decide alone which pages read its answers.
//! So are a worker's `x-radixgate-*` headers: they are the router's own
//! account of a request (which worker, why, which prefill worker), and one
//! a worker sent (another radixgate behind this one, or a worker that
//! lies) must not pass for it.
//!
//! A worker may close an idle keep-alive connection (uvicorn, which vLLM
//! and SGLang serve with, after 5 s) just as a request goes out on it; the
//! pool had not yet seen the close. The worker then answers nothing, and
//! most likely never read the request: [`ForwardError::Stale`] says so
//! (each connection records whether it has carried an answer before,
//! `Wire`), and the caller sends the request again on a new connection
//! ([`Forwarder::send_with_on_new_connection`]) instead of counting the worker
//! as having broken a connection.
//!
//! `X-Forwarded-For` and `Forwarded` are appended to: the client's peer
//! address is added after whatever the client sent (RFC 7239 §4), so the
//! worker sees the whole chain. The gateway itself trusts neither header
//! for anything (not for auth, limits or routing): a client can write any
//! value into them; only the entry this gateway appended is its own.

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri, header};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

/// How long the gateway waits for a worker's TCP (and TLS) handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an unused pooled connection to a worker is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Most idle pooled connections kept per worker.
const POOL_MAX_IDLE: usize = 1024;

/// Installs the process-wide rustls crypto provider (ring). Idempotent: a
/// second install (another client, a test) is refused harmlessly, and the
/// one provider stays in place.
fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds the client for the gateway's own calls to workers.
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    builder().build()
}

/// [`client`], sending `via` (this gateway's `Via` entry) with every call,
/// so that a probe of a "worker" that is this gateway is refused
/// (`crate::via`).
pub(crate) fn worker_client(via: &HeaderValue) -> Result<reqwest::Client, reqwest::Error> {
    let mut headers = HeaderMap::new();
    headers.insert(header::VIA, via.clone());
    builder().default_headers(headers).build()
}

fn builder() -> reqwest::ClientBuilder {
    install_crypto();
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE)
        .connect_timeout(CONNECT_TIMEOUT)
        .no_proxy()
}

/// The request path's client: forwards a client's request to a worker.
/// A clone shares the connection pool; [`Forwarder::fresh_pool`] makes one
/// with the same TLS set-up and a pool of its own (one per serving thread).
#[derive(Clone)]
pub struct Forwarder {
    connector: Connector,
    client: Client<Connector, Full<Bytes>>,
    /// The same, keeping no idle connection: each request gets a new one.
    unpooled: Client<Connector, Full<Bytes>>,
}

/// TCP (`TCP_NODELAY`, connect timeout) with TLS for `https` workers,
/// each connection watched for reuse ([`Wire`]).
type Connector = Watched<hyper_rustls::HttpsConnector<HttpConnector>>;

/// Whether a connection to a worker has carried an answer before the
/// request last written on it, shared between the connection and its
/// metadata (which hyper hands back with a failed request's error).
#[derive(Clone, Default)]
struct Reused(Arc<AtomicBool>);

/// A connector whose connections are [`Wire`]s.
#[derive(Clone)]
struct Watched<C>(C);

impl<C> tower::Service<Uri> for Watched<C>
where
    C: tower::Service<Uri>,
{
    type Response = Wire<C::Response>;
    type Error = C::Error;
    type Future = futures::future::MapOk<C::Future, fn(C::Response) -> Wire<C::Response>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        use futures::TryFutureExt as _;
        self.0.call(uri).map_ok(Wire::new as fn(_) -> _)
    }
}

/// A worker connection that notes when a request is written on it after
/// it has read something (an earlier answer): from then on it is reused.
/// Seen through TLS, never below it, so a handshake's bytes do not count.
/// (Over HTTP/2 the server's settings are read before the first request,
/// so every failed HTTP/2 request counts as sent on a reused connection:
/// it is then tried once more on a new one, which costs one connection.)
struct Wire<T> {
    io: T,
    has_read: bool,
    reused: Reused,
}

impl<T> Wire<T> {
    fn new(io: T) -> Self {
        Self {
            io,
            has_read: false,
            reused: Reused::default(),
        }
    }
}

impl<T: Connection> Connection for Wire<T> {
    fn connected(&self) -> Connected {
        self.io.connected().extra(self.reused.clone())
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for Wire<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        // Whether it read bytes or an end: either way an answer's worth
        // was read once anything is written after it.
        if polled.is_ready() {
            self.has_read = true;
        }
        polled
    }
}

impl<T: hyper::rt::Write + Unpin> Wire<T> {
    fn writing(&mut self) {
        if self.has_read && !self.reused.0.load(Ordering::Relaxed) {
            self.reused.0.store(true, Ordering::Relaxed);
        }
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for Wire<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.writing();
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.writing();
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Why a request could not be forwarded to a worker.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The worker's URL and the route do not form a valid URI.
    #[error("invalid worker URI {uri:?}: {source}")]
    Uri {
        /// The joined URI.
        uri: String,
        /// Why it is invalid.
        source: axum::http::uri::InvalidUri,
    },
    /// No connection could be made (refused, unreachable, TLS, timed
    /// out connecting); the message holds the whole error chain.
    #[error("{0}")]
    Transport(String),
    /// The connection broke after the request went out, before a response
    /// head arrived (the worker reset or closed it); the message holds the
    /// whole error chain.
    #[error("{0}")]
    Closed(String),
    /// As [`Closed`](Self::Closed), on a pooled connection that had
    /// carried an answer before: most likely the worker closed it, idle,
    /// as the request went out, and never saw the request.
    #[error("{0}")]
    Stale(String),
    /// The worker answered with a head that cannot be read (a malformed
    /// status line or header, two different lengths, a head over hyper's
    /// limits): an answer, not a broken connection. The message holds
    /// the whole error chain.
    #[error("{0}")]
    Invalid(String),
}

impl Forwarder {
    /// Builds the forwarding client: HTTP/1.1 to plain-HTTP workers,
    /// HTTP/1.1 or HTTP/2 (by ALPN) to HTTPS workers, verified against the
    /// platform's roots.
    pub fn new() -> Result<Self, rustls::Error> {
        install_crypto();
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .try_with_platform_verifier()?
            .https_or_http()
            .enable_all_versions()
            .wrap_connector(http);
        Ok(Self::with_connector(Watched(connector)))
    }

    fn with_connector(connector: Connector) -> Self {
        let pooled = |max_idle| {
            Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .pool_max_idle_per_host(max_idle)
                .build(connector.clone())
        };
        Self {
            client: pooled(POOL_MAX_IDLE),
            unpooled: pooled(0),
            connector,
        }
    }

    /// A forwarder with the same TLS set-up and an empty pool of its own.
    /// Its connections are driven by the runtime of the thread that opens
    /// them, so each serving thread should have its own.
    pub fn fresh_pool(&self) -> Self {
        Self::with_connector(self.connector.clone())
    }

    /// Sends `body` with `headers` to `path` on the worker at `base` (its
    /// URL without a trailing slash) with `method` (`POST` but for a
    /// stored response's `GET` or `DELETE`), and returns the response
    /// head, its body still streaming.
    pub async fn send_with(
        &self,
        method: Method,
        base: &str,
        path: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, ForwardError> {
        Self::send(&self.client, method, base, path, headers, body).await
    }

    /// [`send_with`](Self::send_with) on a connection of its own, never
    /// one the pool kept: for a request whose pooled connection was
    /// [stale](ForwardError::Stale).
    pub async fn send_with_on_new_connection(
        &self,
        method: Method,
        base: &str,
        path: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, ForwardError> {
        Self::send(&self.unpooled, method, base, path, headers, body).await
    }

    async fn send(
        client: &Client<Connector, Full<Bytes>>,
        method: Method,
        base: &str,
        path: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, ForwardError> {
        let mut joined = String::with_capacity(base.len() + path.len());
        joined.push_str(base);
        joined.push_str(path);
        let uri = Uri::try_from(joined).map_err(|source| ForwardError::Uri {
            uri: format!("{base}{path}"),
            source,
        })?;
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        client
            .request(request)
            .await
            // hyper's own messages are terse ("client error (Connect)"):
            // the cause is in the chain.
            .map_err(|err| {
                let chain = crate::error::chain(&err);
                if err.is_connect() {
                    ForwardError::Transport(chain)
                } else if unreadable(&err) {
                    ForwardError::Invalid(chain)
                } else if was_reused(&err) {
                    ForwardError::Stale(chain)
                } else {
                    ForwardError::Closed(chain)
                }
            })
    }
}

/// Whether a request failed on its answer's head, which the worker sent
/// but hyper could not read ([`ForwardError::Invalid`]).
fn unreadable(err: &hyper_util::client::legacy::Error) -> bool {
    let mut cause = std::error::Error::source(err);
    while let Some(err) = cause {
        if err
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_parse)
        {
            return true;
        }
        cause = err.source();
    }
    false
}

/// Whether a failed request went out on a connection that had carried an
/// answer before ([`Wire`]).
fn was_reused(err: &hyper_util::client::legacy::Error) -> bool {
    let Some(connected) = err.connect_info() else {
        return false;
    };
    let mut extensions = axum::http::Extensions::new();
    connected.get_extras(&mut extensions);
    extensions
        .get::<Reused>()
        .is_some_and(|r| r.0.load(Ordering::Relaxed))
}

/// A call the gateway itself makes to a worker (health probe, model
/// discovery, fan-out): the worker's own key, and a bounded wait.
pub(crate) fn worker_call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    key: Option<&str>,
    timeout: Duration,
) -> reqwest::RequestBuilder {
    let request = client.request(method, url).timeout(timeout);
    match key {
        Some(key) => request.bearer_auth(key),
        None => request,
    }
}

/// The header names a message's `Connection` header lists (its options,
/// which describe that connection only), lower-cased.
fn connection_options(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect()
}

/// Whether `name` must not cross the gateway: a standard hop-by-hop header
/// or one the message's `Connection` header names (`options`).
fn is_connection_specific(name: &HeaderName, options: &[String]) -> bool {
    is_hop_by_hop(name) || options.iter().any(|o| o == name.as_str())
}

/// Appends `peer` to the client's `X-Forwarded-For` and `Forwarded`
/// headers (creating `X-Forwarded-For` if absent; `Forwarded` only when the
/// client sent one, so a worker that reads neither sees one header, as
/// usual for proxies). Each header's values are joined into one line.
fn append_forwarded(out: &mut HeaderMap, client: &HeaderMap, peer: IpAddr) {
    let joined = |name: &HeaderName| -> Option<String> {
        let parts: Vec<&str> = client
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    };
    let xff_name = HeaderName::from_static("x-forwarded-for");
    let mut xff = joined(&xff_name).map_or_else(String::new, |before| before + ", ");
    push_ip(&mut xff, peer);
    if let Ok(value) = HeaderValue::from_str(&xff) {
        out.insert(xff_name, value);
    }
    if let Some(before) = joined(&header::FORWARDED) {
        // RFC 7239: IPv6 addresses are quoted and bracketed.
        let mut value = before + ", for=";
        match peer {
            IpAddr::V4(_) => push_ip(&mut value, peer),
            IpAddr::V6(v6) => {
                let _ = write!(value, "\"[{v6}]\"");
            }
        }
        if let Ok(value) = HeaderValue::from_str(&value) {
            out.insert(header::FORWARDED, value);
        }
    }
}

/// Appends `ip` as text. An IPv4 address, every request's usual peer, is
/// written digit by digit: through `Display` it is four integer
/// formattings, ~1,300 instructions a request.
fn push_ip(out: &mut String, ip: IpAddr) {
    let IpAddr::V4(v4) = ip else {
        let _ = write!(out, "{ip}");
        return;
    };
    out.reserve(15);
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
}

/// Headers that describe one connection, not the message.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// The client's headers as they should go to a worker; `peer` is the
/// client's address as this gateway saw it (appended to the forwarding
/// headers, an IPv4-mapped IPv6 address as IPv4; when unknown, they pass
/// unchanged).
pub fn request_headers(
    client: &HeaderMap,
    worker_key: Option<&str>,
    gateway_has_key: bool,
    peer: Option<IpAddr>,
) -> HeaderMap {
    let options = connection_options(client);
    // Room for what is added: the worker's key, the two forwarding
    // headers, the gateway's `Via` and a trace context, without a rehash.
    let mut out = HeaderMap::with_capacity(client.len() + 5);
    for (name, value) in client {
        // No `Accept-Encoding`: answers come as they are, since the
        // gateway reads them (usage, first tokens) and may append an error
        // event to a stream. No `Expect`: the gateway holds the whole body
        // already, and sends it at once.
        if is_connection_specific(name, &options)
            || name == header::HOST
            || name == header::CONTENT_LENGTH
            || name == header::ACCEPT_ENCODING
            || name == header::EXPECT
        {
            continue;
        }
        // The client's key authenticated it to us; it is not the worker's.
        if (name == header::AUTHORIZATION || name == crate::auth::API_KEY)
            && (gateway_has_key || worker_key.is_some())
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(key) = worker_key
        && let Ok(value) = format!("Bearer {key}").parse()
    {
        out.insert(header::AUTHORIZATION, value);
    }
    if let Some(peer) = peer {
        // A socket listening on `::` sees an IPv4 client as
        // `::ffff:a.b.c.d`: the worker is told the client's own address.
        append_forwarded(&mut out, client, peer.to_canonical());
    }
    out
}

/// A worker's response headers as they should go to the client, without
/// its CORS headers or any in the router's `x-radixgate-` namespace (see
/// the module doc). For a stream, `content-length` is
/// dropped too: if the worker breaks off, the gateway appends an error
/// event, which a fixed length would not allow. So is the
/// `content-length` of an answer that also came with a
/// `transfer-encoding`: its body was read by the transfer coding, and the
/// length is stale (RFC 9112 §6.3 says an intermediary must remove it);
/// passed on, it cut the client's body short of what the worker sent.
pub fn response_headers(worker: &HeaderMap, streaming: bool) -> HeaderMap {
    let options = connection_options(worker);
    let streaming = streaming || worker.contains_key(header::TRANSFER_ENCODING);
    // Room for what the router adds (its worker, decision and prefill
    // headers, the request id, hyper's length and date) without a rehash.
    let mut out = HeaderMap::with_capacity(worker.len() + 6);
    for (name, value) in worker {
        if is_connection_specific(name, &options)
            || (streaming && name == header::CONTENT_LENGTH)
            || name.as_str().starts_with("access-control-")
            || name.as_str().starts_with("x-radixgate-")
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_written_as_display_writes_it() {
        let mut addresses: Vec<IpAddr> = (0..=255u8)
            .map(|o| std::net::Ipv4Addr::new(o, 255 - o, o / 2, o % 10).into())
            .collect();
        addresses.push("::1".parse().unwrap());
        addresses.push("fe80::1:2".parse().unwrap());
        for ip in addresses {
            let mut out = String::from("x, ");
            push_ip(&mut out, ip);
            assert_eq!(out, format!("x, {ip}"));
        }
    }

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn request_headers_drop_hop_by_hop_and_swap_keys() {
        let client = map(&[
            ("connection", "keep-alive"),
            ("host", "gw"),
            ("content-length", "10"),
            ("authorization", "Bearer client"),
            ("x-request-id", "r1"),
            ("content-type", "application/json"),
            ("accept-encoding", "gzip, deflate"),
            ("expect", "100-continue"),
        ]);
        let open = request_headers(&client, None, false, None);
        assert!(
            open.get("expect").is_none(),
            "the body is held here already: the worker is not asked to wait"
        );
        assert!(
            open.get("accept-encoding").is_none(),
            "answers come as they are: the router reads them"
        );
        assert_eq!(
            open["authorization"], "Bearer client",
            "no keys: passed through"
        );
        assert!(open.get("connection").is_none() && open.get("host").is_none());
        assert!(open.get("content-length").is_none());
        assert_eq!(open["x-request-id"], "r1");

        let gated = request_headers(&client, None, true, None);
        assert!(
            gated.get("authorization").is_none(),
            "the gateway's key stays here"
        );
        let keyed = request_headers(&client, Some("wk"), true, None);
        assert_eq!(keyed["authorization"], "Bearer wk");
    }

    #[test]
    fn headers_named_in_connection_are_dropped_both_ways() {
        let client = map(&[
            ("connection", "keep-alive, X-Secret-Hop"),
            ("connection", "x-other"),
            ("x-secret-hop", "1"),
            ("x-other", "2"),
            ("x-kept", "3"),
        ]);
        let out = request_headers(&client, None, false, None);
        assert!(out.get("x-secret-hop").is_none() && out.get("x-other").is_none());
        assert_eq!(out["x-kept"], "3");
        let worker = map(&[("connection", "x-worker-hop"), ("x-worker-hop", "1")]);
        assert!(
            response_headers(&worker, false)
                .get("x-worker-hop")
                .is_none()
        );
    }

    #[test]
    fn forwarding_headers_are_appended_to() {
        let peer: IpAddr = "10.1.2.3".parse().unwrap();
        let fresh = request_headers(&HeaderMap::new(), None, false, Some(peer));
        assert_eq!(fresh["x-forwarded-for"], "10.1.2.3");
        assert!(fresh.get("forwarded").is_none());
        let client = map(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
            ("forwarded", "for=1.1.1.1"),
        ]);
        let out = request_headers(&client, None, false, Some(peer));
        assert_eq!(out["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 10.1.2.3");
        assert_eq!(out.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(out["forwarded"], "for=1.1.1.1, for=10.1.2.3");
        let v6: IpAddr = "::1".parse().unwrap();
        let out = request_headers(&client, None, false, Some(v6));
        assert_eq!(out["forwarded"], "for=1.1.1.1, for=\"[::1]\"");
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        let out = request_headers(&client, None, false, Some(mapped));
        assert_eq!(out["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 10.1.2.3");
        assert_eq!(out["forwarded"], "for=1.1.1.1, for=10.1.2.3");
        let unknown = request_headers(&client, None, false, None);
        assert_eq!(unknown.get_all("x-forwarded-for").iter().count(), 2);
    }

    #[test]
    fn streaming_responses_lose_content_length() {
        let worker = map(&[
            ("content-length", "5"),
            ("transfer-encoding", "chunked"),
            ("x-a", "1"),
        ]);
        assert!(
            response_headers(&worker, true)
                .get("content-length")
                .is_none()
        );
        assert!(
            response_headers(&worker, false)
                .get("transfer-encoding")
                .is_none()
        );
    }

    #[test]
    fn a_workers_cors_headers_are_dropped() {
        let worker = map(&[
            ("access-control-allow-origin", "*"),
            ("access-control-allow-credentials", "true"),
            ("x-access-control-note", "kept"),
        ]);
        let out = response_headers(&worker, false);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out["x-access-control-note"], "kept");
    }

    #[test]
    fn a_length_beside_a_transfer_coding_is_dropped() {
        let both = map(&[("content-length", "7"), ("transfer-encoding", "chunked")]);
        assert!(
            response_headers(&both, false)
                .get("content-length")
                .is_none()
        );
        let length = map(&[("content-length", "7")]);
        assert_eq!(response_headers(&length, false)["content-length"], "7");
    }
}
