//! Every request's id, and the spans around its handling.
//!
//! The id is the first of the client's `tracing.request_id_headers` that is
//! present with a valid value (1 to [`MAX_REQUEST_ID_LEN`] visible ASCII
//! characters, so it is safe in a header and in a log line), else a fresh
//! one: 32 random hex digits. A client's id that is not valid is replaced,
//! never refused: an id is for finding a request, not a reason to fail it.
//! Whichever it is, the worker gets it as `x-request-id` (replacing the
//! client's own, which is otherwise passed on like any header) and the
//! client gets it back as `x-request-id` on every answer, the router's own
//! errors included.
//!
//! The layer ([`IdentifyRequests`]) wraps every route, and makes the request's scopes
//! ([`super::RequestSpans`]): its log scope, which puts
//! `request{request_id=…}` in every log line about it
//! ([`super::request_log`]), always, and with export on the exported
//! `receive` span, whose parent is the client's `traceparent` when it sent
//! a valid one.
//!
//! It also answers for a handler that panics: the client gets a 500 with
//! an OpenAI-style body ([`GatewayError::Internal`]) rather than a dropped
//! connection, and the panic hook `trace::init` installs logs where it
//! happened, with the request's id. A panic after the answer's head (in its
//! body) still ends the connection: the status has been sent.

use super::request_log::{RequestLog, Scoped};
use super::{OTEL_TARGET, RequestSpans};
use crate::error::GatewayError;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::Status;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use tower::{Layer, Service};
use tracing::Instrument;
use tracing::instrument::Instrumented;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header the id goes to the worker and back to the client in.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-supplied id kept, in bytes: room for a UUID (36), a W3C
/// trace id (32) or an AWS `X-Amzn-Trace-Id` (about 80).
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// Most bytes of a client's path or method kept in its `receive` span.
/// Both can be tens of KiB (any path is traced, a 404's too), and a span
/// waits in the export queue ([`super::export::QUEUE`] of them) while the
/// collector is slow: uncut, a few thousand such requests held hundreds of
/// MiB there.
pub const MAX_SPAN_TEXT: usize = 1024;

/// Paths whose requests get no exported span: probes and scrapes, which
/// would otherwise fill a trace store with one trace every few seconds.
const UNTRACED: [&str; 4] = ["/health", "/readiness", "/liveness", "/metrics"];

/// Where ids are read from (the configured header names).
#[derive(Debug)]
pub struct RequestIds {
    headers: Box<[HeaderName]>,
}

impl RequestIds {
    /// Reads ids from `headers`, in that order.
    pub fn new(headers: Vec<HeaderName>) -> Arc<Self> {
        Arc::new(Self {
            headers: headers.into_boxed_slice(),
        })
    }

    /// The request's id: the first valid client one, else a fresh one.
    pub fn pick(&self, headers: &axum::http::HeaderMap) -> HeaderValue {
        self.headers
            .iter()
            .filter_map(|name| headers.get(name))
            .find(|value| valid(value))
            .cloned()
            .unwrap_or_else(fresh)
    }
}

/// 1 to [`MAX_REQUEST_ID_LEN`] visible ASCII characters (no spaces or
/// control characters).
pub fn valid(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_REQUEST_ID_LEN
        && bytes.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// A fresh id: 128 random bits as 32 lower-case hex digits.
pub fn fresh() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits: u128 = rand::random();
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = HEX[((bits >> (124 - 4 * i)) & 0xf) as usize];
    }
    HeaderValue::from_bytes(&out).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// The layer that gives every request its id and scopes (see the module
/// doc). A service of its own, whose future is named, rather than
/// `axum::middleware::from_fn`, which boxes the rest of the router and the
/// future of each request.
#[derive(Clone, Debug)]
pub struct IdentifyRequests {
    ids: Arc<RequestIds>,
}

impl IdentifyRequests {
    /// Ids read from `ids`' headers.
    pub fn new(ids: Arc<RequestIds>) -> Self {
        Self { ids }
    }
}

impl<S> Layer<S> for IdentifyRequests {
    type Service = Identified<S>;

    fn layer(&self, inner: S) -> Identified<S> {
        Identified {
            inner,
            ids: self.ids.clone(),
        }
    }
}

/// [`IdentifyRequests`] around a service.
#[derive(Clone, Debug)]
pub struct Identified<S> {
    inner: S,
    ids: Arc<RequestIds>,
}

impl<S> Service<Request> for Identified<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Answered<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    /// Picks the id, sets it on the request and runs the rest of the
    /// router inside the request's scopes, its call included.
    fn call(&mut self, mut req: Request) -> Answered<S::Future> {
        let id = self.ids.pick(req.headers());
        req.headers_mut().insert(REQUEST_ID_HEADER, id.clone());
        // Valid ids are visible ASCII, so this never falls back.
        let receive = receive_span(&req, id.to_str().unwrap_or_default());
        let log = RequestLog::new(id.clone());
        let spans = RequestSpans {
            request: log.clone(),
            receive: receive.clone(),
        };
        req.extensions_mut().insert(spans);
        let inner = {
            let _span = receive.enter();
            let _current = log.enter();
            catch_unwind(AssertUnwindSafe(|| self.inner.call(req))).ok()
        };
        Answered {
            inner: inner.map(|inner| log.scope(inner).instrument(receive.clone())),
            id: Some(id),
            receive,
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer under way ([`Identified`]): on its way out it
    /// gets the request's id, and the exported span its status. `None`
    /// when the call itself panicked.
    pub struct Answered<F> {
        #[pin]
        inner: Option<Instrumented<Scoped<F>>>,
        id: Option<HeaderValue>,
        receive: tracing::Span,
    }
}

impl<F, E> Future for Answered<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let polled = match this.inner.as_mut().as_pin_mut() {
            Some(inner) => catch_unwind(AssertUnwindSafe(|| inner.poll(cx))).ok(),
            None => None,
        };
        let mut answer = match polled {
            Some(polled) => ready!(polled),
            None => {
                // The handler's state is dropped now, never polled again.
                this.inner.set(None);
                Ok(GatewayError::Internal.into_response())
            }
        };
        if let Ok(response) = &mut answer {
            if !this.receive.is_disabled() {
                let status = response.status();
                this.receive
                    .set_attribute("http.response.status_code", i64::from(status.as_u16()));
                if status.is_server_error() {
                    this.receive.set_status(Status::error(status.to_string()));
                }
            }
            if let Some(id) = this.id.take() {
                response.headers_mut().insert(REQUEST_ID_HEADER, id);
            }
        }
        Poll::Ready(answer)
    }
}

/// The exported server span of a request, child of the client's
/// `traceparent` when it sent a valid one; disabled without export and for
/// probes and scrapes.
fn receive_span(req: &Request, id: &str) -> tracing::Span {
    if !super::exporting() || UNTRACED.contains(&req.uri().path()) {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(target: OTEL_TARGET, "receive", otel.kind = "server");
    let client = opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .extract(&ClientContext::of(req.headers()));
    // Before the span is first entered: after that its parent is fixed.
    let _ = span.set_parent(client);
    span.set_attribute("request_id", id.to_owned());
    span.set_attribute("http.request.method", cut(req.method().as_str()));
    span.set_attribute("url.path", cut(req.uri().path()));
    span
}

/// A request's headers as W3C Trace Context reads them: a `tracestate`
/// sent on several lines is one list, its lines joined with commas in
/// order (a proxy may add its entry on a line of its own). Read one line
/// at a time, every entry past the first line was lost.
struct ClientContext<'a> {
    headers: &'a axum::http::HeaderMap,
    /// The joined list, when there are several lines.
    tracestate: Option<String>,
}

impl<'a> ClientContext<'a> {
    fn of(headers: &'a axum::http::HeaderMap) -> Self {
        let mut lines = headers.get_all("tracestate").iter();
        let tracestate = match (lines.next(), lines.next()) {
            (Some(_), Some(_)) => {
                let lines = headers.get_all("tracestate").iter();
                // A line that is not text is not trace state; the list is
                // then invalid, as the propagator finds.
                let text: Option<Vec<&str>> = lines.map(|l| l.to_str().ok()).collect();
                Some(text.map_or_else(String::new, |t| t.join(",")))
            }
            _ => None,
        };
        Self {
            headers,
            tracestate,
        }
    }
}

impl opentelemetry::propagation::Extractor for ClientContext<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match &self.tracestate {
            Some(joined) if key.eq_ignore_ascii_case("tracestate") => Some(joined),
            _ => self.headers.get(key)?.to_str().ok(),
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.headers.keys().map(|k| k.as_str()).collect()
    }
}

/// The first [`MAX_SPAN_TEXT`] bytes of `text` (less, to end on a
/// character).
fn cut(text: &str) -> String {
    let mut end = text.len().min(MAX_SPAN_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    fn ids() -> Arc<RequestIds> {
        RequestIds::new(
            ["x-request-id", "x-correlation-id"]
                .map(HeaderName::from_static)
                .to_vec(),
        )
    }

    #[test]
    fn the_first_valid_client_id_wins() {
        let mut h = HeaderMap::new();
        h.insert("x-correlation-id", HeaderValue::from_static("corr-1"));
        assert_eq!(ids().pick(&h), "corr-1");
        h.insert("x-request-id", HeaderValue::from_static("req-1"));
        assert_eq!(ids().pick(&h), "req-1");
        // A bad first one falls through to the next valid one.
        h.insert("x-request-id", HeaderValue::from_static("has space"));
        assert_eq!(ids().pick(&h), "corr-1");
    }

    #[test]
    fn invalid_or_missing_ids_are_replaced_by_fresh_ones() {
        let long = "a".repeat(MAX_REQUEST_ID_LEN + 1);
        for bad in ["", "has space", "tab\there", long.as_str(), "caf\u{e9}"] {
            let mut h = HeaderMap::new();
            let Ok(value) = HeaderValue::from_str(bad) else {
                continue;
            };
            h.insert("x-request-id", value);
            let id = ids().pick(&h);
            assert_ne!(id.as_bytes(), bad.as_bytes(), "{bad:?} kept");
            assert_eq!(id.len(), 32);
        }
        let ok = "a".repeat(MAX_REQUEST_ID_LEN);
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_str(&ok).unwrap());
        assert_eq!(ids().pick(&h), ok.as_str());
    }

    /// A handler that panics, in its call or as its future runs, is
    /// answered 500 with an OpenAI-style body and the request's id; the
    /// panic goes no further.
    #[tokio::test]
    async fn a_panicking_handler_is_answered_500_with_the_request_id() {
        use std::convert::Infallible;
        use tower::ServiceExt;
        async fn in_poll(_: Request) -> Result<Response, Infallible> {
            panic!("a bug in a handler")
        }
        fn in_call(_: Request) -> std::future::Ready<Result<Response, Infallible>> {
            panic!("a bug in a layer's call")
        }
        let layer = IdentifyRequests::new(ids());
        let answers = [
            layer
                .layer(tower::service_fn(in_poll))
                .oneshot(Request::new(axum::body::Body::empty()))
                .await,
            layer
                .layer(tower::service_fn(in_call))
                .oneshot(Request::new(axum::body::Body::empty()))
                .await,
        ];
        for answer in answers {
            let answer = answer.unwrap();
            assert_eq!(answer.status(), 500);
            assert_eq!(answer.headers()[REQUEST_ID_HEADER].len(), 32);
            let body = axum::body::to_bytes(answer.into_body(), 4096)
                .await
                .unwrap();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["error"]["code"], "internal_error", "{body}");
            assert_eq!(body["error"]["type"], "server_error", "{body}");
        }
    }

    #[test]
    fn fresh_ids_are_32_hex_digits_and_differ() {
        let a = fresh();
        let b = fresh();
        assert_ne!(a, b);
        for id in [a, b] {
            let text = id.to_str().unwrap();
            assert_eq!(text.len(), 32, "{text}");
            assert!(
                text.bytes()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            );
            assert!(valid(&id));
        }
    }

    #[test]
    fn no_headers_configured_means_always_fresh() {
        let none = RequestIds::new(Vec::new());
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_static("req-1"));
        assert_ne!(none.pick(&h), "req-1");
    }
}
