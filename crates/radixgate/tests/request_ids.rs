//! Request ids end to end on loopback: the client's id (from the configured
//! headers) or a fresh one reaches a real simulated worker (through a tap
//! that records what it was sent) and comes back on every answer, the
//! router's own errors included; a bad id is replaced; and the router's
//! log lines about a request carry its id, to the end of its stream.

mod common;

use common::process::Serve;
use common::tap::tap;
use common::*;
use serde_json::Value;

/// Whether `id` is one the router made: 32 lower-case hex digits.
fn fresh(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

fn id_of(r: &reqwest::Response) -> String {
    r.headers()
        .get("x-request-id")
        .unwrap_or_else(|| panic!("no x-request-id on a {} answer", r.status()))
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_id_reaches_the_worker_and_comes_back() {
    let w = sim_worker(fast_worker()).await;
    let t = tap(&w.url).await;
    let gw = gateway_ready(config(&[&t.url]), 1).await;
    let c = client();
    for (i, stream) in [false, true].into_iter().enumerate() {
        let id = format!("client-id-{i}");
        let r = c
            .post(format!("{}/v1/chat/completions", gw.url))
            .header("x-request-id", &id)
            .json(&chat("hello there", stream))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(id_of(&r), id, "stream={stream}");
        r.bytes().await.unwrap();
        assert_eq!(t.last("x-request-id").as_deref(), Some(id.as_str()));
        assert_eq!(
            t.posts()
                .last()
                .unwrap()
                .get_all("x-request-id")
                .iter()
                .count(),
            1,
            "one id to the worker"
        );
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_an_id_gets_a_fresh_one_everywhere() {
    let w = sim_worker(fast_worker()).await;
    let t = tap(&w.url).await;
    let gw = gateway_ready(config(&[&t.url]), 1).await;
    let mut ids = Vec::new();
    for stream in [false, true] {
        let r = client()
            .post(format!("{}/v1/chat/completions", gw.url))
            .json(&chat("no id here", stream))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let id = id_of(&r);
        r.bytes().await.unwrap();
        assert!(fresh(&id), "{id}");
        assert_eq!(t.last("x-request-id"), Some(id.clone()), "the worker's");
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1], "each request its own");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_own_errors_carry_the_id() {
    let c = client();
    // No workers: 503 for an inference request, 404, 405 and a bad body.
    let gw = gateway(config(&[])).await;
    let base = &gw.url;
    let cases = [
        (
            c.post(format!("{base}/v1/chat/completions"))
                .json(&chat("x", false)),
            503,
        ),
        (c.get(format!("{base}/no/such/path")), 404),
        (c.get(format!("{base}/v1/chat/completions")), 405),
        (
            c.post(format!("{base}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body("{not json"),
            400,
        ),
    ];
    for (i, (request, status)) in cases.into_iter().enumerate() {
        let id = format!("err-{i}");
        let r = request.header("x-request-id", &id).send().await.unwrap();
        assert_eq!(r.status(), status);
        assert_eq!(id_of(&r), id, "{status}");
        let body: Value = r.json().await.unwrap();
        assert!(body["error"]["message"].is_string(), "{body}");
        // Without one, a fresh id.
    }
    let r = c.get(format!("{base}/no/such/path")).send().await.unwrap();
    assert!(fresh(&id_of(&r)));
    gw.shutdown().await;

    // The client key's refusal (401) too.
    let mut keyed = config(&[]);
    keyed.server.api_key = Some("sk-test".into());
    let gw = gateway(keyed).await;
    let r = c
        .post(format!("{}/v1/chat/completions", gw.url))
        .header("x-request-id", "err-401")
        .json(&chat("x", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(id_of(&r), "err-401");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_headers_are_read_in_order() {
    let w = sim_worker(fast_worker()).await;
    let t = tap(&w.url).await;
    let mut c = config(&[&t.url]);
    c.tracing.request_id_headers = vec!["X-Amzn-Trace-Id".into(), "x-correlation-id".into()];
    let gw = gateway_ready(c, 1).await;
    let send = |headers: Vec<(&'static str, &'static str)>| {
        let mut request = client()
            .post(format!("{}/v1/chat/completions", gw.url))
            .json(&chat("configured", false));
        for (name, value) in headers {
            request = request.header(name, value);
        }
        async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.status(), 200);
            let id = id_of(&r);
            r.bytes().await.unwrap();
            id
        }
    };
    let amzn = "Root=1-5759e988-bd862e3fe1be46a994272793";
    assert_eq!(send(vec![("x-amzn-trace-id", amzn)]).await, amzn);
    assert_eq!(t.last("x-request-id").as_deref(), Some(amzn));
    // The client's own header passes on unchanged beside it.
    assert_eq!(t.last("x-amzn-trace-id").as_deref(), Some(amzn));
    assert_eq!(
        send(vec![
            ("x-correlation-id", "corr-2"),
            ("x-amzn-trace-id", amzn)
        ])
        .await,
        amzn,
        "the first configured header wins"
    );
    assert_eq!(send(vec![("x-correlation-id", "corr-3")]).await, "corr-3");
    // x-request-id is not in the list: it is not taken, and the worker
    // gets the router's id in its place.
    let id = send(vec![("x-request-id", "not-listed")]).await;
    assert!(fresh(&id), "{id}");
    assert_eq!(t.last("x-request-id"), Some(id));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_id_is_replaced_not_refused() {
    let w = sim_worker(fast_worker()).await;
    let t = tap(&w.url).await;
    let gw = gateway_ready(config(&[&t.url]), 1).await;
    let long = "x".repeat(129);
    for bad in ["has space", "tab\tinside", long.as_str(), "caf\u{e9}"] {
        let r = client()
            .post(format!("{}/v1/chat/completions", gw.url))
            .header("x-request-id", bad)
            .json(&chat("bad id", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{bad:?}");
        let id = id_of(&r);
        r.bytes().await.unwrap();
        assert!(fresh(&id), "{bad:?} -> {id}");
        assert_eq!(t.last("x-request-id"), Some(id), "{bad:?}: the worker's");
    }
    // The longest kept is 128 characters.
    let longest = "y".repeat(128);
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .header("x-request-id", &longest)
        .json(&chat("bad id", false))
        .send()
        .await
        .unwrap();
    assert_eq!(id_of(&r), longest);
    gw.shutdown().await;
}

/// Sends a streamed chat request with `id` to `base` and reads it to its
/// (broken) end.
async fn broken_stream(base: &str, id: &str) {
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .header("x-request-id", id)
        .json(&serde_json::json!({
            "model": "scripted",
            "messages": [{"role": "user", "content": "will break"}],
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(id_of(&r), id);
    let body = r.text().await.unwrap_or_default();
    assert!(body.contains("stream_interrupted"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_about_a_request_carry_its_id() {
    // A worker whose stream breaks off after its first event: the router's
    // WARN about it is logged when the stream ends, after the handler has
    // returned.
    let w = dying_worker(vec!["data: {\"a\":1}\n\n"]).await;
    // A filter that names only some targets: the request's span is still
    // there (the router keeps it whatever the filter), and the handler's
    // routing line at debug.
    let (mut serve, base) = Serve::start(&[
        "--worker-urls",
        &w.url,
        "--log-level",
        "radixgate::server=info,radixgate::proxy=debug",
    ]);
    wait_for_healthy(&base, 1).await;
    broken_stream(&base, "log-text-1").await;
    let routed = serve.wait_for("routed");
    assert!(
        routed.contains("request{request_id=log-text-1}"),
        "{routed}"
    );
    let broke = serve.wait_for("worker stream broke off");
    assert!(
        broke.contains("WARN") && broke.contains("request{request_id=log-text-1}"),
        "{broke}"
    );
    drop(serve);

    // The same in JSON lines: the span's fields are in `span`.
    let (mut serve, base) = Serve::start(&["--worker-urls", &w.url, "--log-json"]);
    wait_for_healthy(&base, 1).await;
    broken_stream(&base, "log-json-2").await;
    let line = serve.wait_for("worker stream broke off");
    let json: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(json["span"]["request_id"], "log-json-2", "{line}");
    assert_eq!(json["span"]["name"], "request", "{line}");
    // At the default level (a bare `info`) the debug line is not logged:
    // it would have come before the WARN.
    assert!(
        !serve.seen.iter().any(|l| l.contains("\"routed\"")),
        "{}",
        serve.seen.join("\n")
    );
    drop(serve);

    // A bare level lets its own lines through, with the request's span.
    let (mut serve, base) = Serve::start(&["--worker-urls", &w.url, "--log-level", "DEBUG"]);
    wait_for_healthy(&base, 1).await;
    broken_stream(&base, "log-text-3").await;
    let routed = serve.wait_for(" routed ");
    assert!(
        routed.contains("DEBUG") && routed.contains("request{request_id=log-text-3}"),
        "{routed}"
    );
}
