//! Bearer-key checks for the client API, the admin plane and `/metrics`.
//!
//! The client API's keys are its tenants' ([`crate::tenants`]): a request
//! that presents one is tagged with its tenant (for limits, priority and
//! metrics) and its response body is metered for the tokens it reports; with
//! no tenant configured the client API is open. A client presents its key
//! as a Bearer token or, without one, as `x-api-key` ([`client_key`]). The
//! admin API checks one key, as a Bearer token only.
//!
//! Keys are compared in constant time for a given length, so response time
//! does not reveal how many leading characters of a guess were right. The
//! scheme name is matched case-insensitively (`bearer`, `BEARER`), as RFC
//! 9110 (11.1) says of every authentication scheme; the key is not.
//! [`bearer_matches`] is the one check; the admin plane's gate
//! ([`crate::admin`]) and `/metrics` use it with their own keys.
//! [`basic_matches`] is the browser's way in to the dashboard's read-only
//! pages: HTTP Basic (RFC 7617) with the admin key as the password, any
//! user name; the gate accepts it on those pages only.
//!
//! Each key sits in an `ArcSwapOption` shared by the middleware of every
//! serving thread and by the reload task ([`crate::reload`]), which stores
//! the new key: requests that start afterwards are checked against it, with
//! no lock on the request path.

use crate::config::ServerConfig;
use crate::error::GatewayError;
use crate::responses::charged::StoredAnswer;
use crate::state::Shared;
use crate::tenants::{Metered, Metering, Tenant, TenantRef};
use arc_swap::ArcSwapOption;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, header};
use axum::response::Response;
use futures::future::Either;
use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use tower::{Layer, Service};

/// A key a route group requires, if any; a reload may replace it.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequiredKey(Arc<ArcSwapOption<String>>);

impl RequiredKey {
    /// Requires `key` from now on (`None`: open).
    pub(crate) fn set(&self, key: Option<&str>) {
        self.0.store(key.map(|k| Arc::new(k.to_owned())));
    }

    /// The key required now, if any.
    pub(crate) fn get(&self) -> Option<Arc<String>> {
        self.0.load_full()
    }
}

/// The keys of the admin plane and of `/metrics`, as the server section
/// sets them (the client API's keys are its tenants', [`crate::tenants`]).
#[derive(Debug, Default)]
pub(crate) struct Keys {
    /// `server.admin_api_key`.
    pub(crate) admin: RequiredKey,
    /// `server.metrics_api_key`.
    pub(crate) metrics: RequiredKey,
}

impl Keys {
    pub(crate) fn new(server: &ServerConfig) -> Self {
        let keys = Self::default();
        keys.store(server);
        keys
    }

    /// Takes the keys of `server` (at start-up and on every reload).
    pub(crate) fn store(&self, server: &ServerConfig) {
        self.admin.set(server.admin_api_key.as_deref());
        self.metrics.set(server.metrics_api_key.as_deref());
    }
}

/// The client API's gate: finds the tenant whose key was presented (401 if
/// none matches while any is configured), tags the request with it, counts
/// its answer and meters its body. A refusal of a request to a forwarded
/// route is counted in `radixgate_requests_total` under that route, as the
/// request path counts its own refusals; without it, a client whose key
/// was rotated out failed every request while the metrics showed none.
/// A service of its own, whose future is named, rather than
/// `axum::middleware::from_fn`, which boxes the route and the future of
/// each request.
#[derive(Clone)]
pub(crate) struct RequireTenant {
    shared: Arc<Shared>,
    route: RouteLabel,
}

/// The route label a request is counted under in the request metrics, for
/// a request to a forwarded route (by its method and path); `None` for the
/// others, which are not counted.
pub(crate) type RouteLabel = fn(&axum::http::Method, &str) -> Option<&'static str>;

impl RequireTenant {
    /// The gate of the tenants in `shared` (as a reload leaves them);
    /// `route` names the route a refused request is counted under.
    pub(crate) fn new(shared: &Arc<Shared>, route: RouteLabel) -> Self {
        Self {
            shared: shared.clone(),
            route,
        }
    }
}

impl<S> Layer<S> for RequireTenant {
    type Service = TenantGate<S>;

    fn layer(&self, inner: S) -> TenantGate<S> {
        TenantGate {
            inner,
            shared: self.shared.clone(),
            route: self.route,
        }
    }
}

/// [`RequireTenant`] around a route.
#[derive(Clone)]
pub(crate) struct TenantGate<S> {
    inner: S,
    shared: Arc<Shared>,
    route: RouteLabel,
}

/// What the gate answers with: its own refusal, the route's answer as is
/// (no tenants configured) or metered for its tenant.
type Gated<F, E> = Either<Ready<Result<Response, E>>, Either<F, Charged<F>>>;

impl<S> Service<Request> for TenantGate<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Gated<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let tenant = {
            let tenants = self.shared.tenants.load();
            if tenants.is_open() {
                None
            } else {
                match client_key(req.headers()).and_then(|key| tenants.find(key)) {
                    Some(tenant) => Some(tenant.clone()),
                    None => {
                        let refused =
                            crate::error::refused_unread(&req, GatewayError::Unauthorized);
                        if let Some(route) = (self.route)(req.method(), req.uri().path()) {
                            self.shared.request_metrics.request_done(
                                route,
                                refused.status().as_u16(),
                                None,
                                std::time::Duration::ZERO,
                            );
                        }
                        return Either::Left(std::future::ready(Ok(refused)));
                    }
                }
            }
        };
        let Some(tenant) = tenant else {
            return Either::Right(Either::Left(self.inner.call(req)));
        };
        req.extensions_mut().insert(TenantRef(tenant.clone()));
        Either::Right(Either::Right(Charged {
            inner: self.inner.call(req),
            charge: Some(Charge(Some((tenant, self.shared.clone())))),
        }))
    }
}

pin_project_lite::pin_project! {
    /// A tenant's answer under way: counted in its metrics when it comes,
    /// and its body metered ([`Metered`]).
    pub(crate) struct Charged<F> {
        #[pin]
        inner: F,
        charge: Option<Charge>,
    }
}

/// A tenant's request not yet answered. Dropped so, its client gone
/// before the answer's head, it counts the request as 499 in the tenant's
/// series, as `radixgate_requests_total` does (`crate::proxy`), or as 500
/// when a panic unwinds it (the client is answered 500).
pub(crate) struct Charge(Option<(Arc<Tenant>, Arc<Shared>)>);

impl Charge {
    /// The answer came: the tenant and the gateway, to count it.
    fn answered(mut self) -> Option<(Arc<Tenant>, Arc<Shared>)> {
        self.0.take()
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some((tenant, shared)) = self.0.take() {
            let status = crate::proxy::unanswered_status();
            shared.tenant_metrics.request(tenant.name(), status);
        }
    }
}

impl<F, E> Future for Charged<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = ready!(this.inner.poll(cx));
        let Some((tenant, shared)) = this.charge.take().and_then(Charge::answered) else {
            return Poll::Ready(answer);
        };
        let Ok(response) = &answer else {
            return Poll::Ready(answer);
        };
        shared
            .tenant_metrics
            .request(tenant.name(), response.status().as_u16());
        Poll::Ready(answer.map(|mut response| {
            // Set by the request path on a worker's answer to a tenant with
            // a token limit; only a successful one is charged an estimate.
            let metering = response
                .extensions_mut()
                .remove::<Metering>()
                .filter(|_| response.status().is_success());
            // An encoded stream's usage event cannot be taken out of it.
            let sse = crate::proxy::is_event_stream(response.headers())
                && !crate::proxy::is_encoded(response.headers());
            if metering.as_ref().is_some_and(Metering::strips_usage_event) && sse {
                // The usage event is taken out: the length changes.
                response.headers_mut().remove(header::CONTENT_LENGTH);
            }
            let generate = response
                .extensions_mut()
                .remove::<crate::usage::GenerateAnswer>()
                .is_some();
            let stored = response.extensions_mut().remove::<StoredAnswer>();
            response.map(|body| {
                let metered = Metered::new(body, tenant, shared, metering, sse, generate, stored);
                Body::new(metered)
            })
        }))
    }
}

/// The key a client of the client API presents: its `Authorization: Bearer`
/// token, else its `x-api-key` header, which Anthropic's SDKs send by
/// default (the Messages API's own way).
pub(crate) fn client_key(headers: &HeaderMap) -> Option<&str> {
    bearer(headers).or_else(|| {
        headers
            .get(API_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    })
}

/// Anthropic's header for an API key.
pub(crate) const API_KEY: header::HeaderName = header::HeaderName::from_static("x-api-key");

/// The token of an `Authorization: Bearer <token>` header, if present; the
/// scheme is matched in any case.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
}

/// Whether `headers` carry `Authorization: Bearer <expected>`, the scheme
/// in any case.
pub(crate) fn bearer_matches(headers: &HeaderMap, expected: &str) -> bool {
    bearer(headers).is_some_and(|given| constant_time_eq(given.as_bytes(), expected.as_bytes()))
}

/// Whether `headers` carry `Authorization: Basic <base64(user:password)>`
/// whose password is `expected` (any user name), the scheme in any case.
pub(crate) fn basic_matches(headers: &HeaderMap, expected: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
        .and_then(|(_, token)| base64_decode(token.trim()))
        .and_then(|pair| {
            let colon = pair.iter().position(|&b| b == b':')?;
            Some(constant_time_eq(&pair[colon + 1..], expected.as_bytes()))
        })
        .unwrap_or(false)
}

/// Standard base64 (RFC 4648, with or without `=` padding); `None` for
/// anything else.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let digits = text.trim_end_matches('=').as_bytes();
    if text.len() - digits.len() > 2 || digits.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in digits {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Equality whose running time depends only on the lengths.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_exactly() {
        let headers = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert!(bearer_matches(&headers("Bearer sk-1"), "sk-1"));
        assert!(!bearer_matches(&headers("Bearer sk-2"), "sk-1"));
        assert!(!bearer_matches(&headers("Bearer sk-10"), "sk-1"));
        assert!(!bearer_matches(&headers("Basic sk-1"), "sk-1"));
        assert!(bearer_matches(&headers("bearer sk-1"), "sk-1"));
        assert!(bearer_matches(&headers("BEARER  sk-1"), "sk-1"));
        assert!(!bearer_matches(&headers("Bearer SK-1"), "sk-1"));
        assert!(!bearer_matches(&headers("Bearersk-1"), "sk-1"));
        assert!(!bearer_matches(&headers("Bearer"), "sk-1"));
        assert!(!bearer_matches(&HeaderMap::new(), "sk-1"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn basic_takes_the_key_as_password_from_any_user() {
        let headers = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        // base64("admin:sk-1"), base64(":sk-1"), base64("ops:sk-2"),
        // base64("a:b:sk-1") (a password may hold colons).
        assert!(basic_matches(&headers("Basic YWRtaW46c2stMQ=="), "sk-1"));
        assert!(basic_matches(&headers("basic YWRtaW46c2stMQ"), "sk-1"));
        assert!(basic_matches(&headers("Basic OnNrLTE="), "sk-1"));
        assert!(!basic_matches(&headers("Basic b3BzOnNrLTI="), "sk-1"));
        assert!(!basic_matches(&headers("Basic YTpiOnNrLTE="), "sk-1"));
        assert!(basic_matches(&headers("Basic YTpiOnNrLTE="), "b:sk-1"));
        // No colon, bad characters, bad length, another scheme.
        assert!(!basic_matches(&headers("Basic c2stMQ=="), "sk-1"));
        assert!(!basic_matches(&headers("Basic YWRtaW46c2stMQ=*"), "sk-1"));
        assert!(!basic_matches(&headers("Basic YWRtaW46c2stM"), "sk-1"));
        assert!(!basic_matches(&headers("Bearer sk-1"), "sk-1"));
        assert!(!basic_matches(&HeaderMap::new(), "sk-1"));
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("Zm9vYmFy").unwrap(), b"foobar");
        assert_eq!(base64_decode("Zm9vYg==").unwrap(), b"foob");
        assert_eq!(base64_decode("/+8=").unwrap(), [0xff, 0xef]);
        assert!(base64_decode("Zm9vYg===").is_none());
    }
}
