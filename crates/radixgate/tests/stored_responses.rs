//! Response affinity over real HTTP: simulated workers that keep the
//! Responses API's stored responses in their own memory, as vLLM and
//! SGLang do, behind a gateway that must send every request naming one
//! (`previous_response_id`, or its id in the path) to the worker that made
//! it.

mod common;

use common::*;
use radixgate_sim::server::DEFAULT_MODEL;
use serde_json::{Value, json};

/// `POST /v1/responses`: status, the serving worker, the decision, body.
async fn respond(gw: &str, body: &Value) -> (u16, String, String, Value) {
    let r = client()
        .post(format!("{gw}/v1/responses"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (worker, decision) = (header("x-radixgate-worker"), header("x-radixgate-decision"));
    (status, worker, decision, r.json().await.unwrap())
}

/// A request about a stored response: status, serving worker, body.
async fn by_id(method: reqwest::Method, url: &str) -> (u16, String, Value) {
    let r = client().request(method, url).send().await.unwrap();
    let status = r.status().as_u16();
    let worker = r
        .headers()
        .get("x-radixgate-worker")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, worker, r.json().await.unwrap())
}

fn turn(input: &str, previous: Option<&str>, stream: bool) -> Value {
    json!({
        "model": DEFAULT_MODEL,
        "input": input,
        "max_output_tokens": 2,
        "stream": stream,
        "previous_response_id": previous,
    })
}

/// A distinct question, long enough that no two share much of a prefix:
/// routed by their text, they spread over the pool.
fn question(i: usize) -> String {
    format!("{i} {}", "why is the sky blue today? ".repeat(1 + i % 5)).repeat(3)
}

/// Two simulated workers behind a gateway (its config as `adjust` leaves
/// it), and a response made through it.
struct Made {
    workers: [SimWorker; 2],
    gw: Gateway,
    /// The URL of the worker that made it.
    maker: String,
    /// The response's id.
    id: String,
}

impl Made {
    async fn new(adjust: impl FnOnce(&mut radixgate::config::Config)) -> Self {
        let workers = [
            sim_worker(fast_worker()).await,
            sim_worker(fast_worker()).await,
        ];
        let mut c = config(&[&workers[0].url, &workers[1].url]);
        adjust(&mut c);
        let gw = gateway_ready(c, 2).await;
        let (status, maker, _, made) = respond(&gw.url, &turn("hello there", None, false)).await;
        assert_eq!(status, 200, "{made}");
        let id = made["id"].as_str().unwrap().to_owned();
        Self {
            workers,
            gw,
            maker,
            id,
        }
    }

    /// The simulated worker that made the response.
    fn maker_sim(&self) -> &SimWorker {
        self.workers.iter().find(|w| w.url == self.maker).unwrap()
    }

    /// The other worker's URL.
    fn other(&self) -> &str {
        &self
            .workers
            .iter()
            .find(|w| w.url != self.maker)
            .unwrap()
            .url
    }

    async fn shutdown(self) {
        self.gw.shutdown().await;
    }
}

/// A response made at the worker at `url` directly, not through a
/// gateway: its id.
async fn made_at(url: &str) -> String {
    let r = client()
        .post(format!("{url}/v1/responses"))
        .json(&turn("made elsewhere", None, false))
        .send()
        .await
        .unwrap();
    r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn follow_ups_and_requests_by_id_reach_the_worker_that_made_the_response() {
    let Made {
        gw,
        maker,
        id,
        workers: _workers,
    } = Made::new(|_| {}).await;
    // Follow-ups whose texts would otherwise spread: all at the maker.
    let mut previous = id.clone();
    for i in 0..12 {
        let (status, worker, decision, v) =
            respond(&gw.url, &turn(&question(i), Some(&previous), false)).await;
        assert_eq!(status, 200, "follow-up {i}: {v}");
        assert_eq!(worker, maker, "follow-up {i}");
        assert!(decision.contains("branch=previous_response"), "{decision}");
        previous = v["id"].as_str().unwrap().to_owned();
    }
    // A streamed answer's id is learned from its events.
    let r = client()
        .post(format!("{}/v1/responses", gw.url))
        .json(&turn("stream it", Some(&id), true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let created = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .find_map(|d| serde_json::from_str::<Value>(d).ok())
        .unwrap();
    let streamed = created["response"]["id"].as_str().unwrap().to_owned();
    let (status, worker, _, v) =
        respond(&gw.url, &turn(&question(99), Some(&streamed), false)).await;
    assert_eq!((status, worker.as_str()), (200, maker.as_str()), "{v}");
    // By id, at the maker.
    let url = format!("{}/v1/responses/{id}", gw.url);
    let (status, worker, v) = by_id(reqwest::Method::GET, &url).await;
    assert_eq!((status, worker.as_str()), (200, maker.as_str()), "{v}");
    assert_eq!(v["id"], id.as_str());
    let items = format!("{url}/input_items");
    let (status, worker, v) = by_id(reqwest::Method::GET, &items).await;
    assert_eq!((status, worker.as_str()), (200, maker.as_str()), "{v}");
    let cancel = format!("{url}/cancel");
    let (status, worker, v) = by_id(reqwest::Method::POST, &cancel).await;
    assert_eq!((status, worker.as_str()), (200, maker.as_str()), "{v}");
    let (status, worker, v) = by_id(reqwest::Method::DELETE, &url).await;
    assert_eq!((status, worker.as_str()), (200, maker.as_str()), "{v}");
    assert_eq!(v["deleted"], true);
    // Deleted, and forgotten: asked of every worker, nobody holds it.
    let (status, worker, v) = by_id(reqwest::Method::GET, &url).await;
    assert_eq!((status, worker.as_str()), (404, ""), "{v}");
    assert_eq!(v["error"]["code"], "not_found", "{v}");
    // Counting a prompt's tokens beside them is still any other POST,
    // passed on to a worker (the simulated one has no such endpoint).
    let r = client()
        .post(format!("{}/v1/responses/input_tokens", gw.url))
        .json(&json!({"model": DEFAULT_MODEL, "input": "x"}))
        .send()
        .await
        .unwrap();
    assert!(r.headers().contains_key("x-radixgate-worker"), "{r:?}");
    // 12 + 2 follow-ups and 4 requests by id at the maker; the one after
    // the deletion asked of every worker.
    let counted = |outcome: &str| {
        let series = format!("radixgate_response_affinity_total{{outcome=\"{outcome}\"}}");
        let gw = gw.url.clone();
        async move { series_value(&gw, &series).await }
    };
    assert_eq!(counted("maker").await, 18.0);
    assert_eq!(counted("unknown").await, 1.0);
    gw.shutdown().await;
}

/// An id the gateway did not see made (another replica's, or from before
/// a restart) is asked of the workers in turn; one nobody holds is an
/// OpenAI-style 404.
#[tokio::test]
async fn an_unknown_id_is_asked_of_each_worker_then_is_a_404() {
    let a = sim_worker(fast_worker()).await;
    let b = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&a.url, &b.url]), 2).await;
    for holder in [&a, &b] {
        let id = made_at(&holder.url).await;
        let url = format!("{}/v1/responses/{id}", gw.url);
        let (status, worker, v) = by_id(reqwest::Method::GET, &url).await;
        assert_eq!((status, worker.as_str()), (200, holder.url.as_str()), "{v}");
    }
    let url = format!("{}/v1/responses/resp_nobody", gw.url);
    let (status, worker, v) = by_id(reqwest::Method::GET, &url).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(worker, "");
    assert_eq!(v["error"]["code"], "not_found", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("resp_nobody"),
        "{v}"
    );
    let unknown = "radixgate_response_affinity_total{outcome=\"unknown\"}";
    assert_eq!(series_value(&gw.url, unknown).await, 3.0);
    gw.shutdown().await;
}

/// The maker gone from the pool: a follow-up is routed as any other (the
/// engine there answers for itself), and counted so.
#[tokio::test]
async fn a_follow_up_whose_maker_left_is_routed_as_any_other() {
    let made = Made::new(|_| {}).await;
    let other = made.other().to_owned();
    let Made {
        gw,
        maker,
        id,
        workers: _workers,
    } = made;
    remove_worker(&gw.url, &maker).await;
    let (status, worker, decision, v) =
        respond(&gw.url, &turn("and then?", Some(&id), false)).await;
    assert_eq!(worker, other, "{v}");
    assert!(!decision.contains("previous_response"), "{decision}");
    assert_eq!(status, 404, "the other worker never stored it: {v}");
    let gone = "radixgate_response_affinity_total{outcome=\"maker_unavailable\"}";
    assert_eq!(series_value(&gw.url, gone).await, 1.0);
    gw.shutdown().await;
}

/// A follow-up naming a response the gateway did not see made (made
/// through another replica, or before a restart) is asked of the workers
/// of its pool in turn until one holds it, and that worker is then known:
/// it was routed by its text and reached the other worker about one time
/// in two, which answered 404 (the conversation broke). Nobody holding it,
/// the last worker's own 404 reaches the client.
#[tokio::test]
async fn a_follow_up_naming_a_response_made_elsewhere_finds_its_maker() {
    let a = sim_worker(fast_worker()).await;
    let b = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&a.url, &b.url]), 2).await;
    for holder in [&a.url, &b.url] {
        let id = made_at(holder).await;
        for i in 0..4 {
            let (status, worker, decision, v) =
                respond(&gw.url, &turn(&question(i), Some(&id), false)).await;
            assert_eq!(
                (status, worker.as_str()),
                (200, holder.as_str()),
                "{i}: {v}"
            );
            // Found once, then known.
            let branch = if i == 0 {
                "response_lookup"
            } else {
                "previous_response"
            };
            assert!(
                decision.contains(&format!("branch={branch}")),
                "{i}: {decision}"
            );
        }
    }
    let (status, worker, _, v) =
        respond(&gw.url, &turn("and then?", Some("resp_nobody"), false)).await;
    assert_eq!(status, 404, "{v}");
    assert!(
        [&a.url, &b.url].contains(&&worker),
        "the engine's own: {worker}"
    );
    assert_eq!(v["error"]["param"], "previous_response_id", "{v}");
    gw.shutdown().await;
}

/// The requests by id are client API routes: behind its key.
#[tokio::test]
async fn requests_by_id_need_the_client_key() {
    let a = sim_worker(fast_worker()).await;
    let mut c = config(&[&a.url]);
    c.server.api_key = Some("sk-test".into());
    let gw = gateway_ready(c, 1).await;
    for (method, path) in [
        (reqwest::Method::GET, "/v1/responses/resp_1"),
        (reqwest::Method::DELETE, "/v1/responses/resp_1"),
        (reqwest::Method::POST, "/v1/responses/resp_1/cancel"),
        (reqwest::Method::GET, "/v1/responses/resp_1/input_items"),
    ] {
        let url = format!("{}{path}", gw.url);
        let r = client().request(method.clone(), &url).send().await.unwrap();
        assert_eq!(r.status(), 401, "{method} {path}");
        let r = client()
            .request(method.clone(), &url)
            .bearer_auth("sk-test")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{method} {path}");
    }
    // Refused, they are counted under their route, as answered they are:
    // the cancel's POST was counted as an unrouted request, the others in
    // no series at all, so a client with a rotated-out key failing every
    // request by id left the router looking idle.
    let text = metrics_text(&gw.url).await;
    let counted = |route: &str, status: &str| {
        let labels = format!("route=\"{route}\",status=\"{status}\"");
        text.lines()
            .filter(|l| l.starts_with("radixgate_requests_total{") && l.contains(&labels))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>()
    };
    let route = "/v1/responses/{id}";
    assert_eq!(counted(route, "404"), 4.0, "{text}");
    assert_eq!(counted(route, "401"), 4.0, "{text}");
    assert_eq!(counted("/v1/*", "401"), 0.0, "{text}");
    gw.shutdown().await;
}

/// A follow-up whose maker fails it (a 5xx, a 429, no answer) gets that
/// failure: no other worker holds the response, so a retry elsewhere can
/// only be refused. It was retried on another worker, routed by its text,
/// whose 404 (previous response not found) reached the client: a
/// conversation its maker would take up again moments later read as lost.
#[tokio::test]
async fn a_follow_up_its_maker_fails_gets_that_failure_not_another_workers_404() {
    let made = Made::new(|c| c.circuit_breaker.failure_threshold = 100).await;
    let (gw, sim) = (&made.gw, made.maker_sim());
    let (maker, id) = (made.maker.clone(), made.id.clone());
    sim.set_faults(radixgate_sim::server::FaultConfig {
        error_rate: 1.0,
        ..Default::default()
    });
    for i in 0..2 {
        let (status, worker, decision, v) =
            respond(&gw.url, &turn(&question(i), Some(&id), false)).await;
        assert_eq!(status, 500, "{i}: the maker's own failure: {v}");
        assert_eq!(worker, maker, "{i}: {v}");
        assert!(decision.contains("branch=previous_response"), "{decision}");
    }
    // The maker well again: the conversation goes on there.
    sim.set_faults(radixgate_sim::server::FaultConfig::default());
    let (status, worker, _, v) = respond(&gw.url, &turn("and then?", Some(&id), false)).await;
    assert_eq!((status, worker.as_str()), (200, maker.as_str()), "{v}");
    made.shutdown().await;
}

/// A worker that answers every request 500, serving the simulated model
/// (stopped when the token is cancelled).
async fn failing_worker() -> (String, tokio_util::sync::CancellationToken) {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"data": [{"id": DEFAULT_MODEL}]})) }),
        )
        .fallback(|| async {
            let error = json!({"error": {"message": "engine error", "type": "internal"}});
            (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(error),
            )
        });
    serve_app(app).await
}

/// Asking the workers for an id the gateway did not see made, those that
/// answered 404 spent the request's retries: with one retry, a worker
/// failing after one 404 ended the lookup before the worker holding the
/// response was asked (the client got the 500). A 404 there is an answer
/// ("not here"), not a failed attempt; only failures count.
#[tokio::test]
async fn workers_that_do_not_hold_an_id_spend_no_retry_of_its_lookup() {
    let first = sim_worker(fast_worker()).await;
    let mut c = config(&[&first.url]);
    c.retry.max_retries = 1;
    c.circuit_breaker.enabled = false;
    let gw = gateway_ready(c, 1).await;
    // Added one after another, so the lookup asks them in this order
    // (least loaded first, all idle: by id).
    let (failing, _stop_failing) = failing_worker().await;
    let holder = sim_worker(fast_worker()).await;
    for (n, url) in [(2, &failing), (3, &holder.url)] {
        let r = client()
            .post(format!("{}/workers", gw.url))
            .json(&json!({"url": url}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        wait_for_healthy(&gw.url, n).await;
    }
    let id = made_at(&holder.url).await;
    let url = format!("{}/v1/responses/{id}", gw.url);
    let (status, worker, v) = by_id(reqwest::Method::GET, &url).await;
    assert_eq!((status, worker.as_str()), (200, holder.url.as_str()), "{v}");
    gw.shutdown().await;
}

/// A stored response's maker in the pool but out of rotation (here
/// failing its health checks): a follow-up or a request by id gets 503
/// naming it, with `Retry-After`, as the worker that alone holds the
/// response will be back. The follow-up was routed by its text and got
/// another worker's 404, which a client takes for a lost conversation
/// (and a request by id the router's 404 after asking every other one).
#[tokio::test]
async fn a_request_whose_maker_is_out_of_rotation_gets_503_naming_it() {
    let made = Made::new(|c| c.health.interval_secs = 1).await;
    let (gw, held) = (&made.gw, made.maker_sim());
    let (maker, id) = (made.maker.clone(), made.id.clone());
    held.set_faults(radixgate_sim::server::FaultConfig {
        unhealthy: true,
        ..Default::default()
    });
    wait_until("the maker out of rotation", || async {
        workers(&gw.url)
            .await
            .iter()
            .any(|w| w["url"] == maker.as_str() && w["state"] != "healthy")
    })
    .await;
    let r = client()
        .post(format!("{}/v1/responses", gw.url))
        .json(&turn("and then?", Some(&id), false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_healthy_worker", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains(&maker),
        "{v}"
    );
    let url = format!("{}/v1/responses/{id}", gw.url);
    let (status, _, v) = by_id(reqwest::Method::GET, &url).await;
    assert_eq!(status, 503, "{v}");
    // Back in rotation: the conversation goes on there.
    held.set_faults(radixgate_sim::server::FaultConfig::default());
    wait_for_healthy(&gw.url, 2).await;
    let (status, worker, _, v) = respond(&gw.url, &turn("and then?", Some(&id), false)).await;
    assert_eq!((status, worker.as_str()), (200, maker.as_str()), "{v}");
    made.shutdown().await;
}

/// A response made with `store: false` (or `null`, which the engines read
/// so) is stored nowhere: its id is not kept, so a request naming it is
/// one of an id not seen made (asked of the workers, each a 404), not one
/// sent to a maker that holds nothing. Before, every such id took a place
/// in the map (`responses.max_ids`), pushing out ids a client could name.
#[tokio::test]
async fn a_response_not_stored_is_not_kept() {
    let a = sim_worker(fast_worker()).await;
    let b = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&a.url, &b.url]), 2).await;
    for (i, store) in [json!(false), Value::Null].into_iter().enumerate() {
        let mut body = turn(&question(i), None, i == 1);
        body["store"] = store;
        let r = client()
            .post(format!("{}/v1/responses", gw.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        let id = text
            .split("\"id\":\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap()
            .to_owned();
        let url = format!("{}/v1/responses/{id}", gw.url);
        let (status, _, v) = by_id(reqwest::Method::GET, &url).await;
        assert_eq!(status, 404, "{v}");
    }
    let maker = "radixgate_response_affinity_total{outcome=\"maker\"}";
    let unknown = "radixgate_response_affinity_total{outcome=\"unknown\"}";
    assert_eq!(series_value(&gw.url, maker).await, 0.0);
    assert_eq!(series_value(&gw.url, unknown).await, 2.0);
    gw.shutdown().await;
}

/// A stored response read back as a stream (`GET /v1/responses/{id}?stream=
/// true`, which vLLM serves for a background response) is a Responses API
/// stream: when its worker breaks off, the client gets that API's own
/// `event: error`, as a stream made by `POST /v1/responses` does, not the
/// chat API's `data: {"error": ...}`, which a client reading the events
/// by their `type` cannot tell from a token.
#[tokio::test]
async fn a_stored_response_streamed_back_ends_with_the_responses_apis_error_event() {
    use axum::routing::get;
    use futures::StreamExt as _;
    const EVENTS: [&str; 2] = [
        "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\
         \"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\"}}\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\
         \"sequence_number\":1,\"delta\":\"a\"}\n\n",
    ];
    async fn stream_back() -> axum::response::Response {
        let events = EVENTS.map(|e| Ok(axum::body::Bytes::from_static(e.as_bytes())));
        let broke = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "worker died");
        let items = events.into_iter().chain([Err(broke)]);
        let body = futures::stream::iter(items).then(|item| async move {
            // Separate writes, so the events arrive before the break.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            item
        });
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(axum::body::Body::from_stream(body))
            .unwrap()
    }
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"data": [{"id": DEFAULT_MODEL}]})) }),
        )
        .route("/v1/responses/{id}", get(stream_back));
    let (worker, stop) = serve_app(app).await;
    let gw = gateway_ready(config(&[&worker]), 1).await;
    let r = client()
        .get(format!("{}/v1/responses/resp_1?stream=true", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let rest = text.strip_prefix(&EVENTS.concat()).expect(&text);
    let data = rest
        .strip_prefix("event: error\ndata: ")
        .and_then(|rest| rest.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("a Responses error event: {text}"));
    let error: Value = serde_json::from_str(data).unwrap();
    assert_eq!(error["type"], "error", "{text}");
    assert_eq!(error["code"], "stream_interrupted", "{text}");
    gw.shutdown().await;
    stop.cancel();
}
