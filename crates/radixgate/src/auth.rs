//! Bearer-key checks for the client API and the admin API.
//!
//! Keys are compared in constant time for a given length, so response time
//! does not reveal how many leading characters of a guess were right.
//!
//! Each key sits in an `ArcSwapOption` shared by the middleware of every
//! serving thread and by the reload task ([`crate::reload`]), which stores
//! the new key: requests that start afterwards are checked against it, with
//! no lock on the request path.

use crate::config::ServerConfig;
use crate::error::GatewayError;
use arc_swap::ArcSwapOption;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The key a route group requires, if any; a reload may replace it.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequiredKey(Arc<ArcSwapOption<String>>);

impl RequiredKey {
    /// Requires `key` from now on (`None`: open).
    pub(crate) fn set(&self, key: Option<&str>) {
        self.0.store(key.map(|k| Arc::new(k.to_owned())));
    }

    /// Whether a key is required now.
    pub(crate) fn is_set(&self) -> bool {
        self.0.load().is_some()
    }
}

/// The keys of a gateway, as the server section sets them.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    /// The client API's key.
    pub(crate) client: RequiredKey,
    /// The admin API's key.
    pub(crate) admin: RequiredKey,
}

impl Keys {
    pub(crate) fn new(server: &ServerConfig) -> Self {
        let keys = Self::default();
        keys.store(server);
        keys
    }

    /// Takes the keys of `server` (at start-up and on every reload).
    pub(crate) fn store(&self, server: &ServerConfig) {
        self.client.set(server.api_key.as_deref());
        self.admin.set(
            server
                .admin_api_key
                .as_deref()
                .or(server.api_key.as_deref()),
        );
    }
}

/// Middleware: rejects requests without the required bearer key.
pub(crate) async fn require_key(
    State(key): State<RequiredKey>,
    req: Request,
    next: Next,
) -> Response {
    // The key is read once, before the request goes on (no guard is held
    // across the `.await`).
    let allowed = match &*key.0.load() {
        Some(expected) => presented_key_matches(req.headers(), expected),
        None => true,
    };
    if allowed {
        next.run(req).await
    } else {
        GatewayError::Unauthorized.into_response()
    }
}

fn presented_key_matches(headers: &HeaderMap, expected: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| constant_time_eq(given.trim().as_bytes(), expected.as_bytes()))
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
        assert!(!presented_key_matches(&HeaderMap::new(), "sk-1"));
        assert!(constant_time_eq(b"", b""));
    }
}
