//! Bearer-key checks for the client API and the admin API.
//!
//! The client API's keys are its tenants' ([`crate::tenants`]): a request
//! that presents one is tagged with its tenant (for limits, priority and
//! metrics) and its response body is metered for the tokens it reports; with
//! no tenant configured the client API is open. The admin API checks one key.
//!
//! Keys are compared in constant time for a given length, so response time
//! does not reveal how many leading characters of a guess were right.

use crate::error::GatewayError;
use crate::state::AppState;
use crate::tenants::{Metered, TenantRef};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The key a route group requires, if any.
#[derive(Clone, Debug)]
pub(crate) struct RequiredKey(pub(crate) Option<Arc<str>>);

/// Middleware: rejects requests without the required bearer key.
pub(crate) async fn require_key(
    State(key): State<RequiredKey>,
    req: Request,
    next: Next,
) -> Response {
    match &key.0 {
        Some(expected) if !presented_key_matches(req.headers(), expected) => {
            GatewayError::Unauthorized.into_response()
        }
        _ => next.run(req).await,
    }
}

/// Middleware of the client API: finds the tenant whose key was presented
/// (401 if none matches while any is configured), tags the request with it,
/// counts its answer and meters its body.
pub(crate) async fn require_tenant(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let shared = &state.shared;
    let tenant = {
        let tenants = shared.tenants.load();
        if tenants.is_open() {
            return next.run(req).await;
        }
        match bearer(req.headers()).and_then(|key| tenants.find(key)) {
            Some(tenant) => tenant.clone(),
            None => return GatewayError::Unauthorized.into_response(),
        }
    };
    req.extensions_mut().insert(TenantRef(tenant.clone()));
    let response = next.run(req).await;
    shared
        .metrics
        .tenant_request(tenant.name(), response.status().as_u16());
    let shared = shared.clone();
    response.map(|body| Body::new(Metered::new(body, tenant, shared)))
}

/// The token of an `Authorization: Bearer <token>` header, if present.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

fn presented_key_matches(headers: &HeaderMap, expected: &str) -> bool {
    bearer(headers).is_some_and(|given| constant_time_eq(given.as_bytes(), expected.as_bytes()))
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
        assert!(presented_key_matches(&headers("Bearer sk-1"), "sk-1"));
        assert!(!presented_key_matches(&headers("Bearer sk-2"), "sk-1"));
        assert!(!presented_key_matches(&headers("Bearer sk-10"), "sk-1"));
        assert!(!presented_key_matches(&headers("Basic sk-1"), "sk-1"));
        assert!(!presented_key_matches(&HeaderMap::new(), "sk-1"));
        assert!(constant_time_eq(b"", b""));
    }
}
