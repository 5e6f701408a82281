//! Calls to the client API from web pages of other origins (CORS).
//!
//! Engines answer pages of any origin by default (vLLM's
//! `--allowed-origins`, SGLang), so a browser app that called one directly
//! stopped working behind a router that answered none: its preflight got
//! 405 and its calls no `Access-Control-Allow-Origin`.
//! `server.cors_allowed_origins` lists the origins whose pages may call
//! (or `*`: any). For a request from one of them:
//!
//! - a preflight (`OPTIONS` with `Access-Control-Request-Method`) is
//!   answered 204 before authentication, since a browser sends it without
//!   credentials: the client API's methods (GET, POST, and DELETE for a
//!   stored response), the headers it asks for, for 10 minutes; the call
//!   that follows is authenticated as any other;
//! - every answer carries `Access-Control-Allow-Origin` and lets the page
//!   read the router's own headers (the worker, the decision, the request
//!   id, `Retry-After`, `x-should-retry`).
//!
//! Only the client API is wrapped. The admin plane, which refuses
//! cross-site requests (see `admin`), never answers another origin, and
//! neither do the probes and `/metrics`.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The router's answer headers a page may read: `Retry-After` and
/// `x-should-retry` are what OpenAI's and Anthropic's SDKs decide a retry
/// by, in a browser as elsewhere.
const EXPOSED: &str =
    "x-radixgate-worker, x-radixgate-decision, x-request-id, retry-after, x-should-retry";

/// The methods of the client API a page may call: `DELETE` is a stored
/// response's (`DELETE /v1/responses/{id}`), which a browser sends only
/// once a preflight allowed it.
const METHODS: &str = "GET, POST, DELETE";

/// How long a browser may keep a preflight's answer, in seconds.
const PREFLIGHT_MAX_AGE: &str = "600";

/// The origins whose pages may call the client API.
#[derive(Debug)]
pub(crate) struct Cors {
    any: bool,
    origins: Vec<String>,
    /// Whether a path is the client API's.
    applies: fn(&str) -> bool,
}

/// Checks one `cors_allowed_origins` entry: `*`, or an origin as a browser
/// sends it, `http(s)://host[:port]` with nothing after.
pub(crate) fn check_origin(origin: &str) -> Result<(), String> {
    if origin == "*" {
        return Ok(());
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return Err("expected `*` or an origin, scheme://host[:port]".into());
    };
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return Err("the scheme must be http or https".into());
    }
    if authority.is_empty()
        || authority
            .bytes()
            .any(|b| matches!(b, b'/' | b'?' | b'#' | b'*' | b'@') || b.is_ascii_whitespace())
    {
        return Err("an origin is scheme://host[:port], with no path, user or wildcard".into());
    }
    Ok(())
}

impl Cors {
    /// The policy for `origins` (checked entries) on the paths `applies`
    /// takes; `None` when there are none, so that nothing is added to the
    /// request path.
    pub(crate) fn new(origins: &[String], applies: fn(&str) -> bool) -> Option<Arc<Self>> {
        (!origins.is_empty()).then(|| {
            Arc::new(Self {
                any: origins.iter().any(|o| o == "*"),
                origins: origins.iter().map(|o| o.to_ascii_lowercase()).collect(),
                applies,
            })
        })
    }

    /// The `Access-Control-Allow-Origin` for a page of `origin`, if it may
    /// call.
    fn allows(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        if self.any {
            return Some(HeaderValue::from_static("*"));
        }
        let origin_text = origin.to_str().ok()?;
        self.origins
            .iter()
            .any(|o| o.eq_ignore_ascii_case(origin_text))
            .then(|| origin.clone())
    }
}

/// The middleware around the client API's routes (see the module doc).
pub(crate) async fn layer(State(cors): State<Arc<Cors>>, req: Request, next: Next) -> Response {
    let Some(allowed) = req
        .headers()
        .get(header::ORIGIN)
        .filter(|_| (cors.applies)(req.uri().path()))
        .and_then(|origin| cors.allows(origin))
    else {
        return next.run(req).await;
    };
    if req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    {
        let mut response = StatusCode::NO_CONTENT.into_response();
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(METHODS),
        );
        if let Some(asked) = req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
            headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
        }
        headers.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(PREFLIGHT_MAX_AGE),
        );
        headers.insert(
            header::VARY,
            HeaderValue::from_static(
                "origin, access-control-request-method, access-control-request-headers",
            ),
        );
        return response;
    }
    let mut response = next.run(req).await;
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSED),
    );
    if !cors.any {
        headers.append(header::VARY, HeaderValue::from_static("origin"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_checked_and_matched_without_case() {
        for good in ["*", "https://chat.example.com", "http://127.0.0.1:8080"] {
            assert!(check_origin(good).is_ok(), "{good}");
        }
        for bad in [
            "chat.example.com",
            "ftp://a",
            "https://",
            "https://a/path",
            "https://*.example.com",
            "https://u@a",
        ] {
            assert!(check_origin(bad).is_err(), "{bad}");
        }
        let all = |_: &str| true;
        assert!(Cors::new(&[], all).is_none());
        let cors = Cors::new(&["https://Chat.Example.com".into()], all).unwrap();
        let asked = HeaderValue::from_static("https://chat.example.COM");
        assert_eq!(cors.allows(&asked), Some(asked.clone()));
        assert_eq!(
            cors.allows(&HeaderValue::from_static("https://evil.example")),
            None
        );
        let any = Cors::new(&["*".into()], all).unwrap();
        assert_eq!(any.allows(&asked), Some(HeaderValue::from_static("*")));
    }
}
