//! Forwarding loops, found by the `Via` header (RFC 9110 §7.6.3).
//!
//! Every request this gateway sends a worker (a client's, a health probe,
//! model and cache-size discovery, a fan-out) carries a `Via` entry that
//! names this gateway by a pseudonym drawn when it starts
//! (`1.1 radixgate-<16 hex digits>`), after any entries the client sent.
//! A request that arrives with that pseudonym in its `Via` has been here
//! before: a worker URL points at this router (a typo, or a Kubernetes
//! selector that also matches the router's own pods), or at a router that
//! forwards back here. It is refused with 508 Loop Detected before
//! anything else is done, so the health probe of such a "worker" fails and
//! it is never admitted, and a request already under way is retried on
//! another worker instead of going round until the connection limits stop
//! it. Another router in the chain (one in front of per-pool routers, say)
//! has a pseudonym of its own and passes.

use crate::auth::RouteLabel;
use crate::error::GatewayError;
use crate::state::Shared;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use futures::future::Either;
use std::future::Ready;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// This gateway's entry in the `Via` headers it sends.
#[derive(Debug, Clone)]
pub(crate) struct Via {
    value: HeaderValue,
    pseudonym: String,
}

impl Via {
    /// A new pseudonym, drawn at random (one per gateway: two gateways in
    /// one process, as in the tests, are told apart too).
    pub(crate) fn new() -> Self {
        let pseudonym = format!("radixgate-{:016x}", rand::random::<u64>());
        let value = HeaderValue::from_str(&format!("1.1 {pseudonym}"))
            .expect("ASCII letters, digits and a hyphen");
        Self { value, pseudonym }
    }

    /// The header value: `1.1 radixgate-…`.
    pub(crate) fn value(&self) -> &HeaderValue {
        &self.value
    }

    /// Whether `headers` carry this gateway's entry in a `Via`.
    pub(crate) fn seen_in(&self, headers: &HeaderMap) -> bool {
        headers.get_all(header::VIA).iter().any(|value| {
            value.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|entry| entry.split_whitespace().nth(1) == Some(&self.pseudonym))
            })
        })
    }
}

/// The layer that refuses, with 508, a request that has passed through
/// this gateway before (see the module doc). A service of its own, with
/// the inner service's own future behind it, rather than
/// `axum::middleware::from_fn`, which boxes one: 1.018x the instructions
/// per request of the build before loop refusal, against 1.039x with
/// `from_fn` (`bench/instr_cost.py`, docs/experiments/results/via_cost.txt).
/// A refusal of a request to a forwarded route is counted in
/// `radixgate_requests_total` under that route, as the tenant gate counts
/// its own (`crate::auth::RequireTenant`): a loop that refused every
/// client request showed no refusal in the metrics.
#[derive(Clone)]
pub(crate) struct RefuseLoops {
    shared: Arc<Shared>,
    route: RouteLabel,
}

impl RefuseLoops {
    /// Refuses what names the gateway's `Via` (in `shared`); `route` names
    /// the route a refused request is counted under.
    pub(crate) fn new(shared: &Arc<Shared>, route: RouteLabel) -> Self {
        Self {
            shared: shared.clone(),
            route,
        }
    }
}

impl<S> Layer<S> for RefuseLoops {
    type Service = Refusing<S>;

    fn layer(&self, inner: S) -> Refusing<S> {
        Refusing {
            inner,
            refuse: self.clone(),
        }
    }
}

/// [`RefuseLoops`] around a service.
#[derive(Clone)]
pub(crate) struct Refusing<S> {
    inner: S,
    refuse: RefuseLoops,
}

impl<S> Service<Request> for Refusing<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let via = &self.refuse.shared.via;
        if !via.seen_in(req.headers()) {
            return Either::Right(self.inner.call(req));
        }
        tracing::warn!(
            path = req.uri().path(),
            "request came back to this router (its Via names it): a worker URL leads back here"
        );
        let refused = GatewayError::LoopDetected {
            pseudonym: via.pseudonym.clone(),
        };
        let refused = crate::error::refused_unread(&req, refused);
        if let Some(route) = (self.refuse.route)(req.method(), req.uri().path()) {
            self.refuse.shared.request_metrics.request_done(
                route,
                refused.status().as_u16(),
                None,
                std::time::Duration::ZERO,
            );
        }
        Either::Left(std::future::ready(Ok(refused)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_gateways_own_entry_counts() {
        let ours = Via::new();
        let other = Via::new();
        assert_ne!(ours.pseudonym, other.pseudonym);
        let mut headers = HeaderMap::new();
        assert!(!ours.seen_in(&headers));
        headers.append(
            header::VIA,
            HeaderValue::from_static("1.1 nginx, 1.0 squid"),
        );
        headers.append(header::VIA, other.value().clone());
        assert!(!ours.seen_in(&headers), "another router's entry passes");
        // Its name as a comment, or inside another name, is not its entry.
        let mentioned = format!("1.1 proxy ({})", ours.pseudonym);
        headers.append(header::VIA, HeaderValue::from_str(&mentioned).unwrap());
        let longer = format!("1.1 {}0", ours.pseudonym);
        headers.append(header::VIA, HeaderValue::from_str(&longer).unwrap());
        assert!(!ours.seen_in(&headers));
        // In a list, or a field line of its own.
        let listed = format!("1.1 nginx, HTTP/1.1 {} , 1.1 x", ours.pseudonym);
        let mut in_list = HeaderMap::new();
        in_list.insert(header::VIA, HeaderValue::from_str(&listed).unwrap());
        assert!(ours.seen_in(&in_list));
        headers.append(header::VIA, ours.value().clone());
        assert!(ours.seen_in(&headers));
    }
}
