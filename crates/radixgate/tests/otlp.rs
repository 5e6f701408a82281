//! OpenTelemetry export against a real OTLP/HTTP receiver on loopback: the
//! `radixgate serve` binary with `--otlp-endpoint` posts its spans to a
//! receiver started here, which decodes them with the protocol's own
//! types (`opentelemetry-proto`); the worker is a real simulated worker
//! behind a tap that records what it was sent. Checked: the span tree and
//! its parent (the client's `traceparent`), the decision's explanation as
//! attributes, the `traceparent` the worker got, a streamed and a whole
//! answer; without export, the client's headers pass unchanged; a dead
//! collector breaks no request and is logged once; spans lost to a full
//! queue or a failing collector are counted, as are the exported ones;
//! a disaggregated request's spans name their sides; and a client's long
//! path and method are cut in its span.

mod common;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use common::process::{Serve, free_port};
use common::tap::tap;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use parking_lot::Mutex;
use prost::Message;
use radixgate::trace::request_id::MAX_SPAN_TEXT;
use radixgate_sim::server::FaultConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// A real OTLP/HTTP trace receiver: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`; keeps every span and the service names.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    services: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start() -> (Self, String) {
        let receiver = Self::default();
        let app = Router::new()
            .route("/v1/traces", post(accept))
            .with_state(receiver.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (receiver, url)
    }

    /// The spans of trace `trace_id` once `n` of them have arrived.
    async fn trace(&self, trace_id: &[u8], n: usize) -> Vec<Span> {
        let of = |spans: &[Span]| -> Vec<Span> {
            spans
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .cloned()
                .collect()
        };
        wait_until(&format!("{n} spans of trace {}", hex(trace_id)), || async {
            of(&self.spans.lock()).len() >= n
        })
        .await;
        of(&self.spans.lock())
    }
}

async fn accept(State(r): State<Receiver>, body: Bytes) -> axum::response::Response {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
    for resource in request.resource_spans {
        for kv in resource.resource.iter().flat_map(|r| &r.attributes) {
            if kv.key == "service.name" {
                r.services.lock().push(text(kv.value.as_ref()));
            }
        }
        for scope in resource.scope_spans {
            r.spans.lock().extend(scope.spans);
        }
    }
    axum::response::Response::builder()
        .header("content-type", "application/x-protobuf")
        .body(ExportTraceServiceResponse::default().encode_to_vec().into())
        .unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

/// A span's attribute, as text; empty when absent.
fn attr(span: &Span, key: &str) -> String {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| text(kv.value.as_ref()))
        .unwrap_or_default()
}

/// The one span named `name`.
fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one {name} span in {:#?}", names(spans));
    found[0]
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

/// What one request came back with.
struct Sent {
    id: String,
    decision: String,
    worker_traceparent: String,
    worker_tracestate: Option<String>,
}

/// Sends a chat request through `base` with `traceparent` (if any) and a
/// tracestate, reads the answer to its end, and returns what the worker
/// behind `tap` was sent.
async fn send(base: &str, tap: &common::tap::Tap, traceparent: Option<&str>, stream: bool) -> Sent {
    let mut request = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat("the span tree, please", stream));
    if let Some(parent) = traceparent {
        request = request
            .header("traceparent", parent)
            .header("tracestate", "vendor=opaque1");
    }
    let r = request.send().await.unwrap();
    assert_eq!(r.status(), 200);
    let header = |name: &str| r.headers()[name].to_str().unwrap().to_owned();
    let (id, decision) = (header("x-request-id"), header("x-radixgate-decision"));
    let body = r.text().await.unwrap();
    assert!(!body.contains("\"error\""), "{body}");
    Sent {
        id,
        decision,
        worker_traceparent: tap
            .last("traceparent")
            .expect("a traceparent to the worker"),
        worker_tracestate: tap.last("tracestate"),
    }
}

/// The five spans of one request nest as documented, and the worker was
/// told the attempt's span as its parent.
fn check_tree(spans: &[Span], sent: &Sent, client_span: Option<&[u8]>, worker: &str, stream: bool) {
    assert_eq!(spans.len(), 5, "{:?}", names(spans));
    let receive = named(spans, "receive");
    let decision = named(spans, "decision");
    let attempt = named(spans, "attempt");
    let first_byte = named(spans, "first_byte");
    let body = named(spans, "stream");

    // receive: the server span, under the client's span when it sent one.
    assert_eq!(receive.kind, SpanKind::Server as i32);
    match client_span {
        Some(parent) => assert_eq!(receive.parent_span_id, parent),
        None => assert!(
            receive.parent_span_id.is_empty(),
            "a root without a traceparent"
        ),
    }
    assert_eq!(attr(receive, "request_id"), sent.id);
    assert_eq!(attr(receive, "url.path"), "/v1/chat/completions");
    assert_eq!(attr(receive, "http.response.status_code"), "200");

    // decision: under receive, with the explanation the header gave.
    assert_eq!(decision.parent_span_id, receive.span_id);
    assert_eq!(attr(decision, "radixgate.decision"), sent.decision);
    assert_eq!(attr(decision, "radixgate.worker"), worker);
    assert_eq!(attr(decision, "radixgate.policy"), "cache_aware");
    let branch = attr(decision, "radixgate.branch");
    assert!(
        sent.decision.contains(&format!("branch={branch}")) && !branch.is_empty(),
        "{branch} vs {}",
        sent.decision
    );
    for key in ["radixgate.match", "radixgate.load", "radixgate.available"] {
        assert!(!attr(decision, key).is_empty(), "{key} on the decision");
    }

    // attempt: the client span under receive, and the worker's parent.
    assert_eq!(attempt.parent_span_id, receive.span_id);
    assert_eq!(attempt.kind, SpanKind::Client as i32);
    assert_eq!(attr(attempt, "radixgate.worker"), worker);
    assert_eq!(attr(attempt, "radixgate.retry"), "0");
    assert_eq!(attr(attempt, "http.response.status_code"), "200");
    assert_eq!(attr(attempt, "radixgate.outcome"), "complete");
    assert_eq!(
        sent.worker_traceparent,
        format!("00-{}-{}-01", hex(&attempt.trace_id), hex(&attempt.span_id)),
        "the worker's spans nest under the attempt"
    );

    // first_byte and stream: under the attempt, one after the other.
    assert_eq!(first_byte.parent_span_id, attempt.span_id);
    assert_eq!(body.parent_span_id, attempt.span_id);
    assert_eq!(attr(body, "radixgate.outcome"), "complete");
    assert!(
        attr(body, "gen_ai.usage.input_tokens")
            .parse::<u64>()
            .unwrap()
            > 0,
        "stream={stream}: tokens from the usage"
    );
    // Each child within its parent (clock order, not durations).
    for (child, parent) in [
        (decision, receive),
        (attempt, receive),
        (first_byte, attempt),
        (body, attempt),
    ] {
        assert!(
            parent.start_time_unix_nano <= child.start_time_unix_nano
                && child.end_time_unix_nano <= parent.end_time_unix_nano,
            "{} outside {}",
            child.name,
            parent.name
        );
    }
    assert!(first_byte.end_time_unix_nano <= body.start_time_unix_nano);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_nest_under_the_clients_traceparent() {
    let (receiver, collector) = Receiver::start().await;
    let w = sim_worker(fast_worker()).await;
    let t = tap(&w.url).await;
    let (_serve, base) = Serve::start(&[
        "--worker-urls",
        &t.url,
        "--otlp-endpoint",
        &collector,
        "--otlp-service-name",
        "router-under-test",
    ]);
    wait_for_healthy(&base, 1).await;
    for (i, stream) in [false, true].into_iter().enumerate() {
        let trace_id = format!("4bf92f3577b34da6a3ce929d0e0e47{i:02x}");
        let client_span = "00f067aa0ba902b7";
        let sent = send(
            &base,
            &t,
            Some(&format!("00-{trace_id}-{client_span}-01")),
            stream,
        )
        .await;
        let trace = receiver.trace(&decode(&trace_id), 5).await;
        check_tree(&trace, &sent, Some(&decode(client_span)), &t.url, stream);
        // The client's tracestate goes on with the trace.
        assert_eq!(sent.worker_tracestate.as_deref(), Some("vendor=opaque1"));
    }

    // No traceparent: the router starts the trace.
    let sent = send(&base, &t, None, true).await;
    let trace_id = sent
        .worker_traceparent
        .split('-')
        .nth(1)
        .unwrap()
        .to_owned();
    let trace = receiver.trace(&decode(&trace_id), 5).await;
    check_tree(&trace, &sent, None, &t.url, true);
    assert_eq!(sent.worker_tracestate, None);

    // Nothing else was exported (no probe or scrape spans), and under the
    // configured service name.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A copy: the receiver's lock is not held while a message is formatted.
    let all = receiver.spans.lock().clone();
    assert_eq!(all.len(), 15, "{:?}", names(&all));
    let services = receiver.services.lock().clone();
    assert!(!services.is_empty() && services.iter().all(|s| s == "router-under-test"));
    // Each of them counted exported, none dropped.
    wait_until("15 spans counted exported", || async {
        spans_total(&metrics_text(&base).await, "exported") == 15
    })
    .await;
    let text = metrics_text(&base).await;
    for outcome in ["dropped_queue_full", "dropped_export_failed"] {
        assert_eq!(spans_total(&text, outcome), 0, "{outcome}");
    }
}

/// `radixgate_otlp_spans_total{outcome}` in a scrape; 0 when absent.
fn spans_total(text: &str, outcome: &str) -> u64 {
    let series = format!("radixgate_otlp_spans_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |v| v.parse().expect("a count"))
}

fn decode(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_still_queued_at_shutdown_are_exported() {
    let (receiver, collector) = Receiver::start().await;
    let w = sim_worker(fast_worker()).await;
    let t = tap(&w.url).await;
    let (mut serve, base) = Serve::start(&["--worker-urls", &t.url, "--otlp-endpoint", &collector]);
    wait_for_healthy(&base, 1).await;
    let sent = send(&base, &t, None, false).await;
    // At once, within the batch delay: the spans are still queued.
    assert!(serve.terminate(), "a clean exit");
    let all = receiver.spans.lock().clone();
    assert_eq!(all.len(), 5, "{:?}", names(&all));
    let trace_id = sent.worker_traceparent.split('-').nth(1).unwrap();
    assert!(all.iter().all(|s| hex(&s.trace_id) == trace_id));
}

/// With export on, the client's `tracestate` goes on entry for entry; one
/// that breaks the W3C format is dropped whole (docs/tracing.md), as is
/// one without a valid `traceparent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_tracestate_is_dropped_as_documented() {
    let (_receiver, collector) = Receiver::start().await;
    let w = sim_worker(fast_worker()).await;
    let t = tap(&w.url).await;
    let (_serve, base) = Serve::start(&["--worker-urls", &t.url, "--otlp-endpoint", &collector]);
    wait_for_healthy(&base, 1).await;
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    for (traceparent, state, passed) in [
        (parent, "a=1, b@v=2", Some("a=1,b@v=2")),
        (parent, "Vendor=upper", None),
        (parent, "a=1,no-equals", None),
        ("00-not-a-traceparent", "a=1", None),
    ] {
        let r = client()
            .post(format!("{base}/v1/chat/completions"))
            .header("traceparent", traceparent)
            .header("tracestate", state)
            .json(&chat("trace state", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        assert_eq!(t.last("tracestate").as_deref(), passed, "{state}");
    }
    // Sent on two lines, it is one list (W3C Trace Context): both lines'
    // entries go on, in order. Before, only the first line's did.
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .header("traceparent", parent)
        .header("tracestate", "a=1")
        .header("tracestate", "b=2,c=3")
        .json(&chat("trace state", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    assert_eq!(t.last("tracestate").as_deref(), Some("a=1,b=2,c=3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_export_the_clients_trace_headers_pass_unchanged() {
    let w = sim_worker(fast_worker()).await;
    let t = tap(&w.url).await;
    let gw = gateway_ready(config(&[&t.url]), 1).await;
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let sent = send(&gw.url, &t, Some(parent), true).await;
    assert_eq!(sent.worker_traceparent, parent);
    assert_eq!(sent.worker_tracestate.as_deref(), Some("vendor=opaque1"));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_breaks_no_request_and_is_logged_once() {
    let w = sim_worker(fast_worker()).await;
    let dead = format!("http://127.0.0.1:{}", free_port());
    let (mut serve, base) = Serve::start(&["--worker-urls", &w.url, "--otlp-endpoint", &dead]);
    wait_for_healthy(&base, 1).await;
    // Requests over several batch periods: every one is answered.
    for i in 0..12 {
        let r = client()
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat(&format!("dead collector {i}"), i % 2 == 0))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let warned = serve.wait_for("OTLP span export failed");
    assert!(
        warned.contains("WARN") && warned.contains(&dead),
        "{warned}"
    );
    // More failing batches later: still that one line.
    for i in 0..4 {
        let r = client()
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat(&format!("still dead {i}"), false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let seen = serve.drain(Duration::from_secs(4));
    let warnings = seen
        .iter()
        .filter(|l| l.contains("OTLP span export failed"))
        .count();
    assert_eq!(warnings, 1, "{seen:#?}");
}

/// `radixgate.retry` is the number of attempts sent before: a worker that
/// sat a request out (its half-open breaker's one probe was out) was sent
/// nothing, and is no attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_sat_out_is_no_attempt_in_the_spans() {
    let (receiver, collector) = Receiver::start().await;
    let a = sim_worker(fast_worker()).await;
    let b = sim_worker(fast_worker()).await;
    let (_serve, base) = Serve::start(&[
        "--worker-urls",
        &a.url,
        "--otlp-endpoint",
        &collector,
        "--retry-max-retries",
        "0",
        "--cb-failure-threshold",
        "1",
        "--cb-timeout-duration-secs",
        "1",
    ]);
    wait_for_healthy(&base, 1).await;
    // A fails a prompt (its tree keeps it) and its breaker opens.
    a.set_faults(FaultConfig {
        error_rate: 1.0,
        ..Default::default()
    });
    let prompt = chat("the prompt worker A holds", false);
    assert_eq!(post_chat(&base, &prompt).await.status(), 500);
    let r = client()
        .post(format!("{base}/workers"))
        .json(&serde_json::json!({"url": b.url}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    wait_for_healthy(&base, 2).await;
    // Half-open after a second; the same prompt is its probe, held 3 s.
    a.set_faults(FaultConfig {
        latency_ms: 3_000,
        ..Default::default()
    });
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let url = base.clone();
    let body = prompt.clone();
    let probe = tokio::spawn(async move { post_chat(&url, &body).await.status() });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The prompt again: decided for A, which sits out, then sent to B.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e47aa";
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .json(&prompt)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let spans = receiver.trace(&decode(trace_id), 6).await;
    let decisions: Vec<&Span> = spans.iter().filter(|s| s.name == "decision").collect();
    let workers: Vec<String> = decisions
        .iter()
        .map(|d| attr(d, "radixgate.worker"))
        .collect();
    assert_eq!(workers.len(), 2, "{:?}", names(&spans));
    assert!(
        workers.contains(&a.url) && workers.contains(&b.url),
        "{workers:?}"
    );
    for decision in decisions {
        assert_eq!(attr(decision, "radixgate.retry"), "0", "{decision:#?}");
    }
    let attempt = named(&spans, "attempt");
    assert_eq!(attr(attempt, "radixgate.worker"), b.url);
    assert_eq!(attr(attempt, "radixgate.retry"), "0");
    assert_eq!(probe.await.unwrap(), 200);
}

/// A collector that holds every post until [`Failing::open`], then
/// accepts the first post that comes after (counting its spans) and
/// answers 500 to all others.
#[derive(Clone)]
struct Failing {
    open: tokio::sync::watch::Sender<bool>,
    posts_after: Arc<std::sync::atomic::AtomicUsize>,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
}

impl Failing {
    async fn start() -> (Self, String) {
        let collector = Self {
            open: tokio::sync::watch::channel(false).0,
            posts_after: Arc::default(),
            accepted: Arc::default(),
        };
        let app = Router::new()
            .route("/v1/traces", post(fail))
            .with_state(collector.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (collector, url)
    }

    fn open(&self) {
        self.open.send_replace(true);
    }
}

async fn fail(State(c): State<Failing>, body: Bytes) -> axum::http::StatusCode {
    use std::sync::atomic::Ordering::SeqCst;
    let mut open = c.open.subscribe();
    let held = !*open.borrow_and_update();
    open.wait_for(|open| *open).await.unwrap();
    if !held && c.posts_after.fetch_add(1, SeqCst) == 0 {
        let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
        let spans = request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum::<usize>();
        c.accepted.fetch_add(spans, SeqCst);
        return axum::http::StatusCode::OK;
    }
    axum::http::StatusCode::INTERNAL_SERVER_ERROR
}

/// Spans the export loses are counted, by why: a burst while the
/// collector holds the export's post fills the queue (4,096 spans), and
/// the batches the collector then refuses are lost too. Every span the
/// requests made is accounted for, exported or dropped, and "exported"
/// is what the collector accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_lost_to_a_full_queue_or_a_failing_collector_are_counted() {
    let (collector, url) = Failing::start().await;
    let w = sim_worker(fast_worker()).await;
    let (_serve, base) = Serve::start(&["--worker-urls", &w.url, "--otlp-endpoint", &url]);
    wait_for_healthy(&base, 1).await;
    // Waves of requests until the queue is seen full (5 spans each: the
    // queue holds 820 requests' worth, and one batch of 512 is held).
    let mut sent = 0_u64;
    while spans_total(&metrics_text(&base).await, "dropped_queue_full") == 0 {
        assert!(
            sent < 4_000,
            "no span counted dropped after {sent} requests"
        );
        let wave = (0..50).map(|i| {
            let base = base.clone();
            async move {
                let r = client()
                    .post(format!("{base}/v1/chat/completions"))
                    .json(&chat(&format!("burst {i}"), i % 2 == 0))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
            }
        });
        futures::future::join_all(wave).await;
        sent += 50;
    }
    collector.open();
    let counted = |text: &str| {
        ["exported", "dropped_queue_full", "dropped_export_failed"].map(|o| spans_total(text, o))
    };
    wait_until("every span counted", || async {
        counted(&metrics_text(&base).await).iter().sum::<u64>() == 5 * sent
    })
    .await;
    let [exported, queue_full, failed] = counted(&metrics_text(&base).await);
    assert!(queue_full > 0 && failed > 0, "{queue_full} {failed}");
    let accepted = collector.accepted.load(std::sync::atomic::Ordering::SeqCst);
    assert!(exported > 0, "the first post after the collector opened");
    assert_eq!(exported, accepted as u64);
}

/// A client's path and method become attributes of its `receive` span,
/// which waits in the export queue (4,096 spans) while the collector is
/// slow: held to a bound, so that clients sending long paths (any 404 is
/// traced) cannot make the queue hold hundreds of megabytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_long_path_and_method_are_cut_in_its_span() {
    let (receiver, collector) = Receiver::start().await;
    let w = sim_worker(fast_worker()).await;
    let (_serve, base) = Serve::start(&["--worker-urls", &w.url, "--otlp-endpoint", &collector]);
    wait_for_healthy(&base, 1).await;
    let path = format!("/{}", "p".repeat(60_000));
    let method = reqwest::Method::from_bytes("M".repeat(20_000).as_bytes()).unwrap();
    let r = client()
        .request(method, format!("{base}{path}"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error(), "{}", r.status());
    wait_until("the receive span", || async {
        receiver.spans.lock().iter().any(|s| s.name == "receive")
    })
    .await;
    let all = receiver.spans.lock().clone();
    let receive = named(&all, "receive");
    let (got_path, got_method) = (
        attr(receive, "url.path"),
        attr(receive, "http.request.method"),
    );
    for (name, got, sent) in [
        ("url.path", &got_path, &path),
        ("method", &got_method, &"M".repeat(20_000)),
    ] {
        assert!(
            !got.is_empty() && got.len() <= MAX_SPAN_TEXT && sent.starts_with(got.as_str()),
            "{name}: {} bytes exported of {}",
            got.len(),
            sent.len()
        );
    }
}

/// A disaggregated pool's request has a `decision` span for each side and
/// an `attempt` span for each worker, each saying its side in
/// `radixgate.role`. Before, such a request had no decision span at all,
/// and its two attempts could be told apart only by their workers' URLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_request_has_a_decision_and_an_attempt_per_side() {
    use radixgate_sim::server::Role;
    let (receiver, collector) = Receiver::start().await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4799";
    let id = decode(trace_id);
    let prefill = pd_sim_worker(Role::Prefill).await;
    let decode = pd_sim_worker(Role::Decode).await;
    let port = prefill.handle.bootstrap_addr().unwrap().port().to_string();
    let (_serve, base) = Serve::start(&[
        "--pd-disaggregation",
        "--prefill",
        &prefill.url,
        &port,
        "--decode",
        &decode.url,
        "--otlp-endpoint",
        &collector,
    ]);
    wait_for_healthy(&base, 2).await;
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .json(&chat("a disaggregated span tree", true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let of = |spans: &[Span], name: &str| -> Vec<Span> {
        spans.iter().filter(|s| s.name == name).cloned().collect()
    };
    // The receive span ends last, with the answer.
    wait_until("the request's receive span", || async {
        !of(&receiver.trace(&id, 1).await, "receive").is_empty()
    })
    .await;
    let spans = receiver.trace(&id, 1).await;
    let receive = &of(&spans, "receive")[0];
    let by_role = |name: &str| {
        let mut found: Vec<(String, String)> = of(&spans, name)
            .iter()
            .filter(|s| s.parent_span_id == receive.span_id)
            .map(|s| (attr(s, "radixgate.role"), attr(s, "radixgate.worker")))
            .collect();
        found.sort();
        found
    };
    let sides = vec![
        ("decode".to_owned(), decode.url.clone()),
        ("prefill".to_owned(), prefill.url.clone()),
    ];
    assert_eq!(by_role("decision"), sides, "{:?}", names(&spans));
    assert_eq!(by_role("attempt"), sides, "{:?}", names(&spans));
}
