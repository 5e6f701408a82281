//! The HTTP client the gateway talks to workers with, and header hygiene.
//!
//! One pooled client (keep-alive, `TCP_NODELAY`) is shared by the request
//! path, health checks and fan-out calls. Request bodies go out as the
//! client's bytes; only headers are filtered: hop-by-hop headers are
//! connection-specific and must not be forwarded (RFC 9110 §7.6.1), `host`
//! and `content-length` are set by the client library for the new
//! connection, and the client's `authorization` is replaced by the worker's
//! own key when one is configured.

use axum::http::{HeaderMap, HeaderName, header};
use std::time::Duration;

/// Builds the shared worker client.
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    // Idempotent: a second install (another client, a test) is refused
    // harmlessly, and the one provider stays in place.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .connect_timeout(Duration::from_secs(5))
        .no_proxy()
        .build()
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
