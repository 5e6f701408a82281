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
//! connection-specific and must not be forwarded (RFC 9110 §7.6.1), `host`
//! and `content-length` are set by the client library for the new
//! connection, and the client's `authorization` is replaced by the worker's
//! own key when one is configured.

use axum::http::{HeaderMap, HeaderName, Method, Request, Response, Uri, header};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
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
    install_crypto();
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE)
        .connect_timeout(CONNECT_TIMEOUT)
        .no_proxy()
        .build()
}

/// The request path's client: forwards a client's request to a worker.
/// A clone shares the connection pool; [`Forwarder::fresh_pool`] makes one
/// with the same TLS set-up and a pool of its own (one per serving thread).
#[derive(Clone)]
pub struct Forwarder {
    connector: Connector,
    client: Client<Connector, Full<Bytes>>,
}

/// TCP (`TCP_NODELAY`, connect timeout) with TLS for `https` workers.
type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

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
    /// The connection failed, or broke before a response head arrived;
    /// the message holds the whole error chain.
    #[error("{0}")]
    Transport(String),
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
        Ok(Self::with_connector(connector))
    }

    fn with_connector(connector: Connector) -> Self {
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE)
            .build(connector.clone());
        Self { connector, client }
    }

    /// A forwarder with the same TLS set-up and an empty pool of its own.
    /// Its connections are driven by the runtime of the thread that opens
    /// them, so each serving thread should have its own.
    pub fn fresh_pool(&self) -> Self {
        Self::with_connector(self.connector.clone())
    }

    /// POSTs `body` with `headers` to `path` on the worker at `base`
    /// (its URL without a trailing slash) and returns the response head,
    /// its body still streaming.
    pub async fn post(
        &self,
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
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        self.client
            .request(request)
            .await
            // hyper's own messages are terse ("client error (Connect)"):
            // the cause is in the chain.
            .map_err(|err| ForwardError::Transport(crate::error::chain(&err)))
    }
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

/// The client's headers as they should go to a worker.
pub fn request_headers(
    client: &HeaderMap,
    worker_key: Option<&str>,
    gateway_has_key: bool,
) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(client.len());
    for (name, value) in client {
        if is_hop_by_hop(name) || name == header::HOST || name == header::CONTENT_LENGTH {
            continue;
        }
        // The client's key authenticated it to us; it is not the worker's.
        if name == header::AUTHORIZATION && (gateway_has_key || worker_key.is_some()) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(key) = worker_key
        && let Ok(value) = format!("Bearer {key}").parse()
    {
        out.insert(header::AUTHORIZATION, value);
    }
    out
}

/// A worker's response headers as they should go to the client. For a
/// stream, `content-length` is dropped too: if the worker breaks off, the
/// gateway appends an error event, which a fixed length would not allow.
pub fn response_headers(worker: &HeaderMap, streaming: bool) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(worker.len() + 2);
    for (name, value) in worker {
        if is_hop_by_hop(name) || (streaming && name == header::CONTENT_LENGTH) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ]);
        let open = request_headers(&client, None, false);
        assert_eq!(
            open["authorization"], "Bearer client",
            "no keys: passed through"
        );
        assert!(open.get("connection").is_none() && open.get("host").is_none());
        assert!(open.get("content-length").is_none());
        assert_eq!(open["x-request-id"], "r1");

        let gated = request_headers(&client, None, true);
        assert!(
            gated.get("authorization").is_none(),
            "the gateway's key stays here"
        );
        let keyed = request_headers(&client, Some("wk"), true);
        assert_eq!(keyed["authorization"], "Bearer wk");
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
        assert_eq!(response_headers(&worker, false)["content-length"], "5");
        assert!(
            response_headers(&worker, false)
                .get("transfer-encoding")
                .is_none()
        );
    }
}
