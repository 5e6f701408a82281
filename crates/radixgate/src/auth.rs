//! Bearer-key checks for the client API, the admin plane and `/metrics`.
//!
//! Keys are compared in constant time for a given length, so response time
//! does not reveal how many leading characters of a guess were right. The
//! scheme name is matched case-insensitively (`bearer`, `BEARER`), as RFC
//! 9110 (11.1) says of every authentication scheme; the key is not.
//! [`bearer_matches`] is the one check; the admin plane's gate
//! ([`crate::admin`]) and `/metrics` use it with their own keys.

use crate::error::GatewayError;
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

fn presented_key_matches(headers: &HeaderMap, expected: &str) -> bool {
    bearer_matches(headers, expected)
}

/// Whether `headers` carry `Authorization: Bearer <expected>`, the scheme
/// in any case.
pub(crate) fn bearer_matches(headers: &HeaderMap, expected: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .is_some_and(|(_, given)| constant_time_eq(given.trim().as_bytes(), expected.as_bytes()))
}

/// Equality whose running time depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
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
        assert!(presented_key_matches(&headers("bearer sk-1"), "sk-1"));
        assert!(presented_key_matches(&headers("BEARER  sk-1"), "sk-1"));
        assert!(!presented_key_matches(&headers("Bearer SK-1"), "sk-1"));
        assert!(!presented_key_matches(&headers("Bearersk-1"), "sk-1"));
        assert!(!presented_key_matches(&headers("Bearer"), "sk-1"));
        assert!(!presented_key_matches(&HeaderMap::new(), "sk-1"));
        assert!(constant_time_eq(b"", b""));
    }
}
