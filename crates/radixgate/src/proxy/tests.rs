//! Unit tests of the request path's helpers (`proxy.rs`).

use super::*;
use axum::http::HeaderValue;

#[test]
fn an_event_stream_is_told_by_its_media_type_in_any_case() {
    for (value, sse) in [
        ("text/event-stream", true),
        ("text/event-stream; charset=utf-8", true),
        ("Text/Event-Stream", true),
        ("TEXT/EVENT-STREAM;charset=UTF-8", true),
        ("application/json", false),
        ("text/event", false),
        ("", false),
    ] {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static(value));
        assert_eq!(is_event_stream(&headers), sse, "{value:?}");
    }
    assert!(!is_event_stream(&HeaderMap::new()));
}

#[test]
fn a_body_is_encoded_by_any_coding_but_identity() {
    for (values, encoded) in [
        (&["gzip"][..], true),
        (&["br"], true),
        (&["identity", "gzip"], true),
        (&["Identity, deflate"], true),
        (&["identity"], false),
        (&[" IDENTITY "], false),
        (&[""], false),
        (&[], false),
    ] {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("content-encoding", HeaderValue::from_static(value));
        }
        assert_eq!(is_encoded(&headers), encoded, "{values:?}");
    }
}

#[test]
fn the_routing_key_is_the_first_header_that_has_one_else_the_user() {
    let headers = |pairs: &[(&'static str, &[u8])]| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_bytes(value).unwrap());
        }
        map
    };
    let both = headers(&[("x-radixgate-routing-key", b"k"), ("X-Session-Id", b"s")]);
    assert_eq!(routing_key(&both, Some("u")), Some("s"));
    let key = headers(&[("x-radixgate-routing-key", b"k")]);
    assert_eq!(routing_key(&key, Some("u")), Some("k"));
    assert_eq!(routing_key(&HeaderMap::new(), Some("u")), Some("u"));
    assert_eq!(routing_key(&HeaderMap::new(), None), None);
    // A value that is not text is no key.
    let opaque = headers(&[("x-session-id", b"\xff"), ("x-radixgate-routing-key", b"k")]);
    assert_eq!(routing_key(&opaque, None), Some("k"));
}

/// A request dropped unanswered is a client that left (499), unless a
/// panic unwound it: that one is answered 500 (`trace::request_id`),
/// a bug, and counted so.
#[test]
fn an_unanswered_request_is_499_unless_a_panic_ended_it() {
    let metrics = crate::metrics::Metrics::with_histograms(RequestMetrics::HISTOGRAMS);
    let requests = RequestMetrics::new(&metrics);
    let tenants = crate::tenants::TenantMetrics::new(&metrics);
    let progress = Progress::default();
    let unanswered = |route| Unanswered {
        metrics: &requests,
        tenant_metrics: &tenants,
        route,
        started: Instant::now(),
        progress: &progress,
        served: &|_| false,
    };
    drop(unanswered("/v1/completions"));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _unanswered = unanswered("/v1/chat/completions");
        panic!("a bug in a handler");
    }));
    assert!(panicked.is_err());
    let text = metrics.render();
    let counted = |route: &str, status: &str| {
        let series = format!(
            "radixgate_requests_total{{route=\"{route}\",status=\"{status}\",model=\"unknown\"}} 1"
        );
        text.lines().any(|l| l == series)
    };
    assert!(counted("/v1/completions", "499"), "{text}");
    assert!(counted("/v1/chat/completions", "500"), "{text}");
    assert!(!counted("/v1/chat/completions", "499"), "{text}");
}

/// A blank session header, or a blank `user`, is no key: as one, every
/// such request hashed to one worker.
#[test]
fn a_blank_session_key_is_none() {
    let mut headers = HeaderMap::new();
    assert_eq!(routing_key(&headers, None), None);
    assert_eq!(routing_key(&headers, Some("")), None);
    assert_eq!(routing_key(&headers, Some(" ")), None);
    assert_eq!(routing_key(&headers, Some("u1")), Some("u1"));
    headers.insert(&ROUTING_KEY_HEADERS[0], HeaderValue::from_static(""));
    assert_eq!(routing_key(&headers, Some("u1")), Some("u1"));
    assert_eq!(routing_key(&headers, None), None);
    headers.insert(&ROUTING_KEY_HEADERS[1], HeaderValue::from_static("s2"));
    assert_eq!(routing_key(&headers, Some("u1")), Some("s2"));
    headers.insert(&ROUTING_KEY_HEADERS[0], HeaderValue::from_static("s1"));
    assert_eq!(routing_key(&headers, Some("u1")), Some("s1"));
}
