//! Hostile and broken clients against a real gateway on loopback: bodies
//! that are too big, too slow or too many, slow headers, idle keep-alive
//! connections, too many connections, and slow uploads competing with
//! normal requests for admission (issue 11, items 2, 4 and 5).
//!
//! Raw `TcpStream`s send exactly the bytes a hostile client would. Every
//! wait is a hang guard that fails the test; no test asserts how fast
//! anything happens. The short timeouts configured here (1 s) only keep the
//! suite quick.

mod common;

use common::*;
use radixgate::config::Config;
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Turns a hang into a failure; never a speed assertion.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// One simulated worker, admitted without health probes; each test starts
/// its gateway with `gateway_ready(c, 1)`, since admission still asks the
/// worker for its models and its KV cache size before the worker serves.
async fn worker_and_config() -> (SimWorker, Config) {
    let w = sim_worker(fast_worker()).await;
    let mut c = config(&[&w.url]);
    c.health.enabled = false;
    (w, c)
}

async fn connect(gateway: &str) -> TcpStream {
    TcpStream::connect(gateway.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Request headers for a POST to the chat route, ending the head.
fn post_head(content_length: usize, extra: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n\
         Content-Length: {content_length}\r\n{extra}\r\n"
    )
}

/// A chat body of exactly `len` bytes (padded with spaces, which JSON
/// ignores).
fn chat_body(len: usize) -> String {
    let mut body = serde_json::to_string(&chat("hello", false)).unwrap();
    assert!(body.len() <= len, "{len} is too small for a chat body");
    body.extend(std::iter::repeat_n(' ', len - body.len()));
    body
}

/// One HTTP/1.1 response read off a raw connection: status, head, body
/// (by Content-Length).
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Whether an answer's head says the connection closes after it.
fn says_close(answer: &Answer) -> bool {
    answer
        .head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("connection: close"))
}

/// Reads one response; `None` when the connection ends first.
async fn read_answer(stream: &mut TcpStream) -> Option<Answer> {
    let mut buf = Vec::new();
    let work = async {
        let (head, body) = read_http_message(stream, &mut buf).await?;
        let status = head[9..12].parse().unwrap();
        let body = String::from_utf8_lossy(&body).into_owned();
        Some(Answer { status, head, body })
    };
    tokio::time::timeout(HANG_GUARD, work)
        .await
        .expect("no answer and no close: the connection hangs")
}

/// Waits until the server ends the connection (EOF or reset), ignoring any
/// bytes it sends first.
async fn wait_closed(stream: &mut TcpStream) {
    let work = async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(HANG_GUARD, work)
        .await
        .expect("the server kept the connection open");
}

/// Polls `attempt` until it yields a value; the deadline is a hang guard.
async fn first_some<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + HANG_GUARD;
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn normal_request_succeeds(gateway: &str) {
    let r = client()
        .post(format!("{gateway}/v1/chat/completions"))
        .json(&chat("a normal request", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
}

// ---- item 2: bodies ----

#[tokio::test]
async fn declared_oversize_body_is_refused_before_it_is_sent() {
    let (_w, mut c) = worker_and_config().await;
    c.server.max_payload_size = 1024;
    let gw = gateway_ready(c, 1).await;
    let mut s = connect(&gw.url).await;
    // Headers only: the 10 MB body is never sent.
    s.write_all(post_head(10_000_000, "").as_bytes())
        .await
        .unwrap();
    let answer = read_answer(&mut s).await.expect("an answer, not a close");
    assert_eq!(answer.status, 413, "{}", answer.head);
    // The body is not read, so the connection ends, as the answer says.
    assert!(says_close(&answer), "{}", answer.head);
    let mut rest = [0u8; 64];
    assert_eq!(s.read(&mut rest).await.unwrap(), 0, "the connection closed");
    let body = answer.json();
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("1024"),
        "{body}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn expect_continue_with_oversize_length_gets_413_not_100_continue() {
    let (_w, mut c) = worker_and_config().await;
    c.server.max_payload_size = 1024;
    let gw = gateway_ready(c, 1).await;
    let mut s = connect(&gw.url).await;
    s.write_all(post_head(10_000_000, "Expect: 100-continue\r\n").as_bytes())
        .await
        .unwrap();
    let answer = read_answer(&mut s).await.expect("an answer, not a close");
    assert_eq!(
        answer.status, 413,
        "the first answer must refuse, not invite the body: {}",
        answer.head
    );
    assert_eq!(answer.json()["error"]["code"], "payload_too_large");

    // Within the limit, 100-continue still invites the body.
    let mut s = connect(&gw.url).await;
    let body = chat_body(600);
    s.write_all(post_head(body.len(), "Expect: 100-continue\r\n").as_bytes())
        .await
        .unwrap();
    let first = read_answer(&mut s).await.unwrap();
    assert_eq!(first.status, 100, "{}", first.head);
    s.write_all(body.as_bytes()).await.unwrap();
    let answer = read_answer(&mut s).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    gw.shutdown().await;
}

#[tokio::test]
async fn stalled_body_gets_408_not_a_gateway_timeout() {
    let (_w, mut c) = worker_and_config().await;
    c.server.body_read_timeout_secs = 1;
    // Today only the end-to-end timeout would end it (as a 504 that blames
    // the worker); keep that short so the old behaviour shows quickly.
    c.server.request_timeout_secs = 3;
    let gw = gateway_ready(c, 1).await;
    let mut s = connect(&gw.url).await;
    let body = chat_body(500);
    s.write_all(post_head(body.len(), "").as_bytes())
        .await
        .unwrap();
    s.write_all(&body.as_bytes()[..100]).await.unwrap();
    // ... and the rest never comes.
    let answer = read_answer(&mut s).await.expect("an answer, not a close");
    assert_eq!(answer.status, 408, "{}", answer.body);
    assert!(says_close(&answer), "{}", answer.head);
    let json = answer.json();
    assert_eq!(json["error"]["code"], "body_read_timeout", "{json}");
    assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
    // The gateway is fine for everyone else.
    normal_request_succeeds(&gw.url).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn body_budget_exhausted_gets_503_with_retry_after_and_is_given_back() {
    let (_w, mut c) = worker_and_config().await;
    c.server.max_payload_size = 1000;
    c.server.max_buffered_body_bytes = 1500;
    let gw = gateway_ready(c, 1).await;
    // A slow client declares 1,000 bytes and sends 990: they take 990 of
    // the 1,500-byte budget.
    let mut slow = connect(&gw.url).await;
    slow.write_all(post_head(1000, "").as_bytes())
        .await
        .unwrap();
    slow.write_all(&chat_body(1000).as_bytes()[..990])
        .await
        .unwrap();

    // A complete 800-byte request no longer fits: declared...
    let body = chat_body(800);
    let url = format!("{}/v1/chat/completions", gw.url);
    let (retry_after, json) = first_some("a request refused by the body budget", || {
        let (url, body) = (url.clone(), body.clone());
        async move {
            let r = client()
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            if r.status() != 503 {
                return None;
            }
            let retry_after = r.headers().get("retry-after").cloned();
            Some((retry_after, r.json::<Value>().await.unwrap()))
        }
    })
    .await;
    assert!(retry_after.is_some(), "503 without Retry-After");
    assert_eq!(json["error"]["code"], "body_budget_exhausted", "{json}");
    assert_eq!(json["error"]["type"], "service_unavailable", "{json}");

    // ... and chunked, with no length declared: refused as it grows.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = body
        .as_bytes()
        .chunks(100)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let r = client()
        .post(&url)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let json: Value = r.json().await.unwrap();
    assert_eq!(json["error"]["code"], "body_budget_exhausted", "{json}");

    // A body refused before it is read leaves its connection unable to
    // carry another request: the 503 says `Connection: close`, as the 413
    // and the 408 do. Without it the 503 told the client to retry and the
    // server then closed the connection unannounced: a client that retried
    // on its kept-alive connection, as pools do, had its retry lost.
    let mut s = connect(&gw.url).await;
    s.write_all(post_head(800, "").as_bytes()).await.unwrap();
    let answer = read_answer(&mut s).await.expect("an answer, not a close");
    assert_eq!(answer.status, 503, "{}", answer.head);
    assert_eq!(answer.json()["error"]["code"], "body_budget_exhausted");
    assert!(says_close(&answer), "{}", answer.head);
    wait_closed(&mut s).await;

    // The slow client leaves: its bytes go back to the budget.
    drop(slow);
    wait_until("the budget given back", || {
        let (url, body) = (url.clone(), body.clone());
        async move {
            let r = client()
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            r.status() == 200
        }
    })
    .await;
    gw.shutdown().await;
}

/// A length declared is not memory held: clients that declare the largest
/// body and send a few bytes of it hold only those bytes of the shared
/// budget. Before, each reserved its whole declared length, so a handful of
/// connections (32 at the defaults: a 1 GiB budget, 32 MiB bodies) that
/// sent nothing more had every other request answered 503
/// `body_budget_exhausted` until their body timeout, and again on
/// reconnecting.
#[tokio::test]
async fn declared_lengths_alone_do_not_spend_the_body_budget() {
    let (_w, mut c) = worker_and_config().await;
    c.server.max_payload_size = 1000;
    c.server.max_buffered_body_bytes = 1500;
    let gw = gateway_ready(c, 1).await;
    let mut idle = Vec::new();
    for _ in 0..3 {
        let mut s = connect(&gw.url).await;
        s.write_all(post_head(1000, "").as_bytes()).await.unwrap();
        s.write_all(b"{\"model\": ").await.unwrap();
        idle.push(s);
    }
    // Past the moment their bodies are polled (the head is answered by
    // nothing yet: a 503 would be read here).
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let r = client()
            .post(format!("{}/v1/chat/completions", gw.url))
            .header("content-type", "application/json")
            .body(chat_body(800))
            .send()
            .await
            .unwrap();
        let status = r.status();
        assert_eq!(status, 200, "{}", r.text().await.unwrap());
    }
    drop(idle);
    gw.shutdown().await;
}

/// A client that goes away while its body is still arriving (it closes
/// its connection, or resets its HTTP/2 stream: a client-side timeout, a
/// cancelled upload) is counted as 499, as one that leaves while its
/// request waits for a worker is: its request was not a bad one, and an
/// operator who alerts on 400s must not be sent looking for a bug in a
/// client that only gave up. A body that is malformed is still a 400.
#[tokio::test]
async fn a_client_that_leaves_mid_body_is_counted_499_not_400() {
    let (_w, c) = worker_and_config().await;
    let gw = gateway_ready(c, 1).await;
    let counted = |status: &'static str| {
        let url = gw.url.clone();
        async move {
            series_value(
                &url,
                &format!(
                    "radixgate_requests_total{{route=\"/v1/chat/completions\",\
                     status=\"{status}\",model=\"unknown\"}}"
                ),
            )
            .await
        }
    };
    // A declared length, and the connection closed part-way.
    let mut s = connect(&gw.url).await;
    s.write_all(post_head(1000, "").as_bytes()).await.unwrap();
    s.write_all(b"{\"model\": ").await.unwrap();
    drop(s);
    wait_until("the first left", || async { counted("499").await == 1.0 }).await;
    // A chunked body, and the connection closed part-way.
    let mut s = connect(&gw.url).await;
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n\
          Transfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\n",
    )
    .await
    .unwrap();
    drop(s);
    wait_until("the second left", || async { counted("499").await == 2.0 }).await;
    // An HTTP/2 stream whose body stops, then reset by its client.
    let tcp = connect(&gw.url).await;
    type Streamed = http_body_util::StreamBody<
        futures::stream::BoxStream<
            'static,
            Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>,
        >,
    >;
    let (mut sender, connection) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake::<_, Streamed>(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    let first = futures::stream::once(async {
        Ok(http_body::Frame::data(bytes::Bytes::from_static(
            b"{\"model\": ",
        )))
    });
    // Asked for more once its first bytes went out; the rest never comes.
    let (asked, more_asked) = tokio::sync::oneshot::channel::<()>();
    let rest = futures::stream::once(async move {
        let _ = asked.send(());
        std::future::pending().await
    });
    let body = futures::StreamExt::boxed(futures::StreamExt::chain(first, rest));
    let request = axum::http::Request::post(format!("{}/v1/chat/completions", gw.url))
        .body(http_body_util::StreamBody::new(body))
        .unwrap();
    let sending = tokio::spawn(async move { sender.send_request(request).await });
    tokio::time::timeout(HANG_GUARD, more_asked)
        .await
        .expect("the stream's first bytes were never sent")
        .unwrap();
    // Reset (CANCEL) after them: the router sees them, then the reset.
    sending.abort();
    wait_until("the third left", || async { counted("499").await == 3.0 }).await;
    assert_eq!(counted("400").await, 0.0, "{}", metrics_text(&gw.url).await);
    connection.abort();
    // A malformed chunked body is the client's fault: 400.
    let mut s = connect(&gw.url).await;
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n\
          Transfer-Encoding: chunked\r\n\r\nzz\r\n{\"mod\r\n",
    )
    .await
    .unwrap();
    wait_until("the malformed body", || async {
        counted("400").await == 1.0
    })
    .await;
    drop(s);
    assert_eq!(counted("499").await, 3.0);
    // A client that half-closes part-way still reads the answer: a status
    // line with nginx's reason phrase, not hyper's `<none>`.
    let mut s = connect(&gw.url).await;
    s.write_all(post_head(1000, "").as_bytes()).await.unwrap();
    s.write_all(b"{\"model\": ").await.unwrap();
    s.shutdown().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(HANG_GUARD, s.read_to_end(&mut answer))
        .await
        .expect("no answer to a half-closed client")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 499 Client Closed Request\r\n"),
        "{answer}"
    );
    wait_until("the fourth left", || async { counted("499").await == 4.0 }).await;
    gw.shutdown().await;
}

// ---- item 4: slowloris, idle connections, the connection cap ----

#[tokio::test]
async fn slowloris_is_closed_after_the_header_timeout() {
    let (_w, mut c) = worker_and_config().await;
    c.server.header_read_timeout_secs = 1;
    let gw = gateway_ready(c, 1).await;
    // Half a request head, then nothing.
    let mut half = connect(&gw.url).await;
    half.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")
        .await
        .unwrap();
    // Nothing at all.
    let mut silent = connect(&gw.url).await;
    // A header line every 200 ms, forever.
    let mut trickle = connect(&gw.url).await;
    trickle
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\n")
        .await
        .unwrap();
    let (mut trickle_read, mut trickle_write) = trickle.split();
    let dripping = async {
        for i in 0.. {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let line = format!("X-Drip-{i}: x\r\n");
            if trickle_write.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
    };
    let closed = async {
        let mut chunk = [0u8; 1024];
        loop {
            match trickle_read.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(HANG_GUARD, async {
        tokio::select! {
            () = closed => {}
            () = dripping => {}
        }
    })
    .await
    .expect("the trickling connection stayed open");
    wait_closed(&mut half).await;
    wait_closed(&mut silent).await;
    normal_request_succeeds(&gw.url).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn the_separate_metrics_port_closes_slow_and_idle_connections_too() {
    let (_w, mut c) = worker_and_config().await;
    c.server.header_read_timeout_secs = 1;
    c.server.idle_timeout_secs = 1;
    let port = with_metrics_port(&mut c).await;
    let gw = gateway_ready(c, 1).await;
    let metrics = format!("http://127.0.0.1:{port}");
    let mut silent = connect(&metrics).await;
    let mut half = connect(&metrics).await;
    half.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
    let mut idle = connect(&metrics).await;
    let answer = get_on(&mut idle, "/metrics").await.unwrap();
    assert_eq!(answer.status, 200);
    assert!(answer.body.contains("# TYPE radixgate_"), "{}", answer.body);
    wait_closed(&mut silent).await;
    wait_closed(&mut half).await;
    wait_closed(&mut idle).await;
    gw.shutdown().await;
}

/// The metrics port serves probes and scrapes, which need no long
/// keep-alive: an idle connection there goes within seconds, whatever the
/// client port's idle timeout, so that its small cap is not held by idle
/// connections.
#[tokio::test]
async fn the_metrics_port_keeps_an_idle_connection_seconds_not_the_client_ports_minutes() {
    let (_w, mut c) = worker_and_config().await;
    c.server.header_read_timeout_secs = 600;
    c.server.idle_timeout_secs = 600;
    let port = with_metrics_port(&mut c).await;
    let gw = gateway_ready(c, 1).await;
    let metrics = format!("http://127.0.0.1:{port}");
    let mut silent = connect(&metrics).await;
    let mut idle = connect(&metrics).await;
    assert_eq!(get_on(&mut idle, "/liveness").await.unwrap().status, 200);
    let closed = tokio::time::timeout(Duration::from_secs(12), async {
        wait_closed(&mut silent).await;
        wait_closed(&mut idle).await;
    })
    .await;
    assert!(closed.is_ok(), "held past 12 s");
    gw.shutdown().await;
}

/// An HTTP/2 client that shuts its flow-control window gets no byte of
/// any answer's body: on the metrics port such a connection goes within
/// seconds too, not after the client port's write timeout, so that 64 of
/// them cannot hold its cap (and fail the probes there) for a minute each.
#[tokio::test]
async fn the_metrics_port_cuts_an_http2_client_with_a_shut_window_within_seconds() {
    let (_w, mut c) = worker_and_config().await;
    c.server.client_write_timeout_secs = 600;
    let port = with_metrics_port(&mut c).await;
    let gw = gateway_ready(c, 1).await;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(0)
            .handshake::<_, http_body_util::Empty<bytes::Bytes>>(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    let request = axum::http::Request::get(format!("http://127.0.0.1:{port}/metrics"))
        .body(http_body_util::Empty::new())
        .unwrap();
    let answer = sender.send_request(request).await.unwrap();
    assert_eq!(answer.status(), 200);
    let closed = tokio::time::timeout(Duration::from_secs(15), connection).await;
    assert!(closed.is_ok(), "held past 15 s");
    drop(answer);
    gw.shutdown().await;
}

/// Sends a GET on a raw keep-alive connection and reads its answer.
async fn get_on(stream: &mut TcpStream, path: &str) -> Option<Answer> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    read_answer(stream).await
}

#[tokio::test]
async fn idle_keep_alive_connection_is_closed() {
    let (_w, mut c) = worker_and_config().await;
    c.server.idle_timeout_secs = 1;
    let gw = gateway_ready(c, 1).await;
    let mut s = connect(&gw.url).await;
    let answer = get_on(&mut s, "/liveness").await.unwrap();
    assert_eq!(answer.status, 200);
    // No next request: the router closes the connection.
    wait_closed(&mut s).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn an_idle_connection_is_not_held_to_the_header_timeout() {
    let (_w, mut c) = worker_and_config().await;
    c.server.header_read_timeout_secs = 1;
    c.server.idle_timeout_secs = 60;
    let gw = gateway_ready(c, 1).await;
    let mut s = connect(&gw.url).await;
    assert_eq!(get_on(&mut s, "/liveness").await.unwrap().status, 200);
    // Idle for longer than the header timeout, well within the idle one.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let again = get_on(&mut s, "/liveness").await;
    assert_eq!(
        again.map(|a| a.status),
        Some(200),
        "the idle keep-alive connection was closed by the header timeout"
    );
    gw.shutdown().await;
}

/// Gives `c` a metrics port, a free one on loopback, and returns it.
async fn with_metrics_port(c: &mut Config) -> u16 {
    let spare = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = spare.local_addr().unwrap().port();
    drop(spare);
    c.metrics.prometheus_port = Some(port);
    port
}

/// Fills a connection cap of `n` with connections that are each served
/// once and kept open; earlier clients' connections may still be counted
/// for a moment, so each is retried until served.
async fn fill_the_cap(url: &str, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for i in 0..n {
        let served = first_some(&format!("connection {i} served"), || {
            let url = url.to_owned();
            async move {
                let mut s = connect(&url).await;
                let answer = get_on(&mut s, "/liveness").await?;
                (answer.status == 200).then_some(s)
            }
        })
        .await;
        held.push(served);
    }
    held
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_and_the_cap_frees_up() {
    let (_w, mut c) = worker_and_config().await;
    c.server.max_connections = 3;
    c.server.threads = 2;
    let gw = gateway_ready(c, 1).await;
    let mut held = fill_the_cap(&gw.url, 3).await;
    // Refused so far: filling the cap may have met a place still held by
    // a connection of the readiness polls, closing (`fill_the_cap` tries
    // again then), and each such try was refused and counted.
    let refused = |metrics: &str| {
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix("radixgate_client_connections_refused_total{kind=\"connection\"} ")
            })
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = refused(&get_on(&mut held[0], "/metrics").await.unwrap().body);
    // One more: accepted and closed at once, never served.
    let mut extra = connect(&gw.url).await;
    assert!(
        get_on(&mut extra, "/liveness").await.is_none(),
        "a connection over the cap was served"
    );
    // The held ones still work.
    for s in &mut held {
        assert_eq!(get_on(s, "/liveness").await.unwrap().status, 200);
    }
    // An operator sees the cap reached: three places taken, one connection
    // refused (read on a held connection, the port being full).
    let mut shown = String::new();
    for _ in 0..100 {
        shown = get_on(&mut held[0], "/metrics").await.unwrap().body;
        let value = |series: &str| {
            shown
                .lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .map(|v| v.trim().to_owned())
        };
        if value("radixgate_client_connections").as_deref() == Some("3")
            && refused(&shown) == before + 1
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        shown.contains("radixgate_client_connections 3\n")
            && refused(&shown) == before + 1
            && shown.contains("radixgate_client_connections_refused_total{kind=\"stream\"} 0\n"),
        "{before} refused before the extra connection:\n{shown}"
    );
    drop(held);
    wait_until("a request served once the cap frees up", || async {
        client()
            .post(format!("{}/v1/chat/completions", gw.url))
            .json(&chat("after the cap", false))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    gw.shutdown().await;
}

/// Clients that fill the client port's connection cap must not fail the
/// orchestrator's probes (Kubernetes would restart a router under a
/// connection flood, cutting every stream it serves): the metrics port,
/// apart from that cap, answers `/liveness`, `/readiness` and `/health` too.
#[tokio::test]
async fn probes_on_the_metrics_port_pass_while_clients_fill_the_connection_cap() {
    let (_w, mut c) = worker_and_config().await;
    c.server.max_connections = 2;
    c.server.threads = 1;
    let port = with_metrics_port(&mut c).await;
    let gw = gateway_ready(c, 1).await;
    let held = fill_the_cap(&gw.url, 2).await;
    let mut probe = connect(&gw.url).await;
    assert!(
        get_on(&mut probe, "/liveness").await.is_none(),
        "the client port is full"
    );
    let management = format!("http://127.0.0.1:{port}");
    for path in ["/liveness", "/readiness", "/health"] {
        let mut s = connect(&management).await;
        let answer = get_on(&mut s, path).await.expect("answered");
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert!(answer.body.contains("\"status\":\"ok\""), "{}", answer.body);
    }
    drop(held);
    gw.shutdown().await;
}

// ---- item 5: admission after the body ----

#[tokio::test]
async fn a_slow_upload_does_not_hold_the_only_admission_slot() {
    let (_w, mut c) = worker_and_config().await;
    c.admission.max_concurrent_requests = Some(1);
    c.admission.queue_size = 0;
    let gw = gateway_ready(c, 1).await;
    let mut slow = connect(&gw.url).await;
    let body = chat_body(2000);
    slow.write_all(post_head(body.len(), "").as_bytes())
        .await
        .unwrap();
    slow.write_all(&body.as_bytes()[..50]).await.unwrap();
    // Give the router time to start on the slow request (not an assertion:
    // the test only needs the upload to be under way).
    tokio::time::sleep(Duration::from_millis(500)).await;
    normal_request_succeeds(&gw.url).await;
    // The slow upload completes and is admitted in its turn.
    slow.write_all(&body.as_bytes()[50..]).await.unwrap();
    let answer = read_answer(&mut slow).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    gw.shutdown().await;
}

// ---- a client that stops reading ----

/// A worker whose streamed answers never end, as fast as they are read
/// (16 KiB events); its whole answers are short.
async fn endless_streamer() -> (String, tokio_util::sync::CancellationToken) {
    use axum::routing::{get, post};
    let answer = |body: axum::Json<Value>| async move {
        if body["stream"] != true {
            return axum::Json(serde_json::json!({
                "id": "c", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }))
            .into_response();
        }
        let event = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
            "x".repeat(16 * 1024)
        );
        let event = bytes::Bytes::from(event);
        let events =
            futures::stream::repeat_with(move || Ok::<_, std::convert::Infallible>(event.clone()));
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(axum::body::Body::from_stream(events))
            .unwrap()
    };
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(|| async { axum::Json(serde_json::json!({"data": [{"id": "m"}]})) }),
        )
        .route("/v1/chat/completions", post(answer));
    serve_app(app).await
}

use axum::response::IntoResponse as _;

#[tokio::test]
async fn a_client_that_stops_reading_its_stream_is_cut_off_and_frees_its_slot() {
    let (worker, _stop) = endless_streamer().await;
    let mut c = config(&[&worker]);
    c.health.enabled = false;
    c.admission.max_concurrent_requests = Some(1);
    c.admission.queue_size = 0;
    c.server.client_write_timeout_secs = 1;
    let gw = gateway_ready(c, 1).await;

    // A client with a small receive window reads the answer's head, then
    // nothing more, and keeps its connection open.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr = gw.url.trim_start_matches("http://").parse().unwrap();
    let mut stalled = socket.connect(addr).await.unwrap();
    let body = serde_json::json!({
        "model": "m", "stream": true, "max_tokens": 1_000_000,
        "messages": [{"role": "user", "content": "tell me everything"}],
    })
    .to_string();
    stalled
        .write_all(format!("{}{body}", post_head(body.len(), "")).as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 64];
    let n = tokio::time::timeout(HANG_GUARD, stalled.read(&mut head))
        .await
        .expect("the stream's head")
        .unwrap();
    assert!(
        head[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&head[..n])
    );

    // The only slot is the stalled stream's until its connection is cut
    // (503 meanwhile); then a normal request gets it.
    first_some("a normal request admitted after the stalled client is cut off", || async {
        let r = client()
            .post(format!("{}/v1/chat/completions", gw.url))
            .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    wait_closed(&mut stalled).await;
    gw.shutdown().await;
}

// ---- paths the client spells ----

/// A model id in the path that percent-decodes to bytes that are not
/// UTF-8 gets the gateway's own JSON error, as every refusal does; it had
/// the path extractor's plain-text line, which OpenAI's SDKs cannot read.
#[tokio::test]
async fn a_model_path_that_is_not_utf8_gets_a_json_error() {
    let (_worker, c) = worker_and_config().await;
    let gw = gateway_ready(c, 1).await;
    let mut stream = connect(&gw.url).await;
    for path in ["/v1/models/%FF", "/v1/models/ok%C3"] {
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let answer = read_answer(&mut stream).await.expect("an answer");
        assert_eq!(answer.status, 400, "{path}: {}", answer.head);
        let error = &answer.json()["error"];
        assert_eq!(error["type"], "invalid_request_error", "{path}: {error}");
        assert!(
            error["message"].as_str().unwrap().contains("UTF-8"),
            "{path}: {error}"
        );
    }
    normal_request_succeeds(&gw.url).await;
    gw.shutdown().await;
}

// ---- HTTP/2: many requests on one connection ----

/// A worker that holds every chat request it gets until `release` is
/// cancelled, and counts those it holds now.
struct HoldingWorker {
    url: String,
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    release: tokio_util::sync::CancellationToken,
}

async fn holding_worker() -> HoldingWorker {
    use axum::routing::{get, post};
    use std::sync::atomic::{AtomicUsize, Ordering};
    /// Counts a request held from its start until it is answered or
    /// dropped (the gateway gave up on it).
    struct Held(std::sync::Arc<AtomicUsize>);
    impl Drop for Held {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let held = std::sync::Arc::new(AtomicUsize::new(0));
    let release = tokio_util::sync::CancellationToken::new();
    let (count, released) = (held.clone(), release.clone());
    let answer = move || {
        let (count, released) = (count.clone(), released.clone());
        async move {
            count.fetch_add(1, Ordering::AcqRel);
            let _held = Held(count);
            released.cancelled().await;
            axum::Json(serde_json::json!({
                "id": "c", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }))
        }
    };
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(|| async { axum::Json(serde_json::json!({"data": [{"id": "m"}]})) }),
        )
        .route("/v1/chat/completions", post(answer));
    let (url, _stop) = serve_app(app).await;
    HoldingWorker { url, held, release }
}

impl HoldingWorker {
    fn held(&self) -> usize {
        self.held.load(std::sync::atomic::Ordering::Acquire)
    }
}

type H2Sender = hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// An HTTP/2 connection (prior knowledge, as `h2c` clients open it) to
/// the gateway.
async fn h2_connect(gateway: &str) -> H2Sender {
    let tcp = connect(gateway).await;
    let (sender, connection) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(connection);
    sender
}

/// A chat request for model `m` on an HTTP/2 connection.
fn h2_chat(gateway: &str, text: &str) -> axum::http::Request<http_body_util::Full<bytes::Bytes>> {
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]});
    axum::http::Request::post(format!("{gateway}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(body.to_string().into()))
        .unwrap()
}

/// `max_connections` keeps half the open-file limit for worker
/// connections because each client connection has at most one request in
/// flight — but one HTTP/2 connection carries up to 200 streams, each a
/// connection to a worker. Streams beyond the first of a connection take a
/// place under the same cap, so a few HTTP/2 clients cannot open more
/// worker connections than the cap allows (and exhaust the process's file
/// descriptors, failing its probes and accepts); one over the cap gets
/// 503 with `Retry-After` and the request's id (like every answer), and
/// the places free up with the streams.
#[tokio::test]
async fn http2_streams_beyond_the_connection_cap_are_refused() {
    const CAP: usize = 4;
    const STREAMS: usize = 10;
    let worker = holding_worker().await;
    let mut c = config(&[&worker.url]);
    c.health.enabled = false;
    c.server.max_connections = CAP;
    c.server.threads = 1;
    let gw = gateway_ready(c, 1).await;
    let sender = h2_connect(&gw.url).await;
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut streams = tokio::task::JoinSet::new();
    for i in 0..STREAMS {
        let mut sender = sender.clone();
        let mut request = h2_chat(&gw.url, &format!("stream {i}"));
        let id = format!("stream-{i}");
        request
            .headers_mut()
            .insert("x-request-id", id.parse().unwrap());
        let refused = refused.clone();
        streams.spawn(async move {
            let answer = sender.send_request(request).await.unwrap();
            let status = answer.status();
            assert_eq!(
                answer.headers().get("x-request-id").map(|v| v.as_bytes()),
                Some(id.as_bytes()),
                "the request's id on its {status} answer"
            );
            let retry_after = answer.headers().get("retry-after").cloned();
            let body = http_body_util::BodyExt::collect(answer.into_body())
                .await
                .unwrap()
                .to_bytes();
            if status == 503 {
                assert!(retry_after.is_some(), "503 without Retry-After");
                refused.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            } else {
                assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
            }
        });
    }
    // Every stream is either held by the worker or refused.
    wait_until("every stream held or refused", || async {
        worker.held() + refused.load(std::sync::atomic::Ordering::Acquire) == STREAMS
    })
    .await;
    assert!(
        worker.held() <= CAP,
        "{} requests of one connection in flight at the workers, over a cap of {CAP}",
        worker.held()
    );
    worker.release.cancel();
    while let Some(done) = streams.join_next().await {
        done.unwrap();
    }
    wait_for_zero_load(&gw.url).await;
    // Counted as refused streams, not connections.
    let refused = refused.load(std::sync::atomic::Ordering::Acquire) as f64;
    assert!(refused > 0.0);
    wait_until("the refused streams counted", || async {
        series_value(
            &gw.url,
            "radixgate_client_connections_refused_total{kind=\"stream\"}",
        )
        .await
            == refused
    })
    .await;
    assert_eq!(
        series_value(
            &gw.url,
            "radixgate_client_connections_refused_total{kind=\"connection\"}"
        )
        .await,
        0.0
    );
    // The places came back: as many streams as before are served.
    let mut sender = sender.clone();
    for i in 0..CAP {
        let answer = sender
            .send_request(h2_chat(&gw.url, &format!("again {i}")))
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
    }
    gw.shutdown().await;
}

/// A request's headers are held to the same size over both protocols: a
/// request with 40 KB of headers (a long token, a client's context) that
/// passes over HTTP/1 passes over HTTP/2 too. HTTP/2 had hyper's own 16 KiB
/// limit, and such a request got a bare 431 there only, so a client (or a
/// proxy in front) that moved to HTTP/2 broke on requests that worked.
#[tokio::test]
async fn headers_that_pass_over_http1_pass_over_http2() {
    let (_w, c) = worker_and_config().await;
    let gw = gateway_ready(c, 1).await;
    let big = "t".repeat(40_000);
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .header("x-client-context", &big)
        .json(&chat("big headers", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "over HTTP/1");
    let mut sender = h2_connect(&gw.url).await;
    let request = axum::http::Request::post(format!("{}/v1/chat/completions", gw.url))
        .header("content-type", "application/json")
        .header("x-client-context", &big)
        .body(http_body_util::Full::new(
            chat("big headers", false).to_string().into(),
        ))
        .unwrap();
    let answer = sender.send_request(request).await.unwrap();
    assert_eq!(answer.status(), 200, "over HTTP/2");
    gw.shutdown().await;
}

/// An HTTP/2 connection opened by hand: the client preface, empty
/// SETTINGS and their ACK, and a `GET path` on stream 1 (HPACK by hand:
/// static-table method and scheme, literal path and authority).
fn h2_raw_get(path: &str) -> Vec<u8> {
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
    bytes.extend([0, 0, 0, 4, 1, 0, 0, 0, 0]);
    let mut block = vec![0x82, 0x86, 0x44, u8::try_from(path.len()).unwrap()];
    block.extend(path.as_bytes());
    block.extend([0x41, 2]);
    block.extend(b"gw");
    // HEADERS, END_STREAM | END_HEADERS, stream 1.
    bytes.extend([0, 0, u8::try_from(block.len()).unwrap(), 1, 5, 0, 0, 0, 1]);
    bytes.extend(block);
    bytes
}

/// The frame types of everything read off `stream` until it closes, the
/// 9-byte frame headers parsed as they come.
async fn h2_frame_types_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(HANG_GUARD, stream.read(&mut buf))
            .await
            .expect("closed");
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => bytes.extend(&buf[..n]),
        }
    }
    let mut types = Vec::new();
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let len = usize::from(bytes[at]) << 16
            | usize::from(bytes[at + 1]) << 8
            | usize::from(bytes[at + 2]);
        types.push(bytes[at + 3]);
        at += 9 + len;
    }
    types
}

/// An HTTP/2 connection left idle is told so with a GOAWAY before it is
/// closed, as on shutdown: its client then opens its next request on a
/// new connection. It was closed without one, and a request its client
/// sent just then was lost with no sign of whether it had been served.
#[tokio::test]
async fn an_idle_http2_connection_is_sent_goaway_before_it_closes() {
    const GOAWAY: u8 = 7;
    let (_w, mut c) = worker_and_config().await;
    c.server.header_read_timeout_secs = 1;
    c.server.idle_timeout_secs = 1;
    let gw = gateway_ready(c, 1).await;
    let mut idle = connect(&gw.url).await;
    idle.write_all(&h2_raw_get("/liveness")).await.unwrap();
    let types = h2_frame_types_until_closed(&mut idle).await;
    assert!(types.contains(&GOAWAY), "frame types read: {types:?}");
    normal_request_succeeds(&gw.url).await;
    gw.shutdown().await;
}

/// On shutdown an HTTP/2 connection is sent GOAWAY and a PING, and closes
/// once the PING is answered; an idle HTTP/1 connection closes at once. A
/// client that answers nothing — a peer that vanished without a FIN (a
/// NAT's timeout, a machine gone), or one that stopped reading — must not
/// hold the shutdown for its idle timeout or the whole grace period (set
/// long for long streams): with nothing in flight, its connection goes
/// after the header timeout.
#[tokio::test]
async fn an_idle_http2_client_that_answers_nothing_does_not_hold_the_shutdown() {
    let (_w, mut c) = worker_and_config().await;
    c.server.header_read_timeout_secs = 1;
    c.server.idle_timeout_secs = 600;
    c.server.shutdown_grace_period_secs = 600;
    let gw = gateway_ready(c, 1).await;
    let mut silent = connect(&gw.url).await;
    silent.write_all(&h2_raw_get("/liveness")).await.unwrap();
    // Its answer (SETTINGS, HEADERS, DATA) arrives; then it reads nothing.
    let mut answer = [0u8; 4096];
    let n = tokio::time::timeout(HANG_GUARD, silent.read(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    assert!(n > 0);
    wait_until("the request is over", || async {
        total_load(&gw.url).await == 0
    })
    .await;
    gw.stop.cancel();
    let stopped = tokio::time::timeout(HANG_GUARD, gw.task).await;
    assert!(
        stopped.is_ok(),
        "an idle HTTP/2 connection that answers nothing held the shutdown"
    );
    stopped.unwrap().unwrap().unwrap();
    drop(silent);
}

/// The write timeout cuts a connection whose client takes none of its
/// answers; over HTTP/2 a stream whose client reads it keeps the others
/// going (their frames moving is the client taking them). A new stream's
/// first frame is no such sign: it is the worker's, handed on to a client
/// that takes nothing. A client that grants no window and opens a stream
/// every moment must not keep all its streams — each one a worker's
/// sequence and an admission slot — for their request timeout.
#[tokio::test]
async fn new_http2_streams_do_not_keep_a_client_that_takes_nothing() {
    let (worker, _stop) = endless_streamer().await;
    let mut c = config(&[&worker]);
    c.health.enabled = false;
    c.server.client_write_timeout_secs = 1;
    let gw = gateway_ready(c, 1).await;
    let tcp = connect(&gw.url).await;
    let (sender, connection) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(0)
            .handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    let mut connection = tokio::spawn(connection);
    let opening = async {
        let mut answers = Vec::new();
        loop {
            let body = serde_json::json!({
                "model": "m", "stream": true,
                "messages": [{"role": "user", "content": format!("stream {}", answers.len())}],
            });
            let request = axum::http::Request::post(format!("{}/v1/chat/completions", gw.url))
                .header("content-type", "application/json")
                .body(http_body_util::Full::<bytes::Bytes>::new(
                    body.to_string().into(),
                ))
                .unwrap();
            match sender.clone().send_request(request).await {
                // Held, never read: its window stays shut.
                Ok(answer) => answers.push(answer),
                Err(_) => return answers,
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let cut = tokio::time::timeout(HANG_GUARD, async {
        tokio::select! {
            _ = &mut connection => {}
            _ = opening => {}
        }
    })
    .await;
    assert!(
        cut.is_ok(),
        "a client that took nothing kept its connection by opening streams"
    );
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

// ---- shutdown with requests queued ----

/// A request still waiting for an admission slot when the shutdown grace
/// period ends is answered 503 `shutting_down` with `Retry-After`, which a
/// client can act on, rather than having its connection dropped under it
/// (which leaves a client of a POST not knowing whether it ran).
#[tokio::test]
async fn a_request_queued_when_the_grace_period_ends_is_told_so() {
    let worker = holding_worker().await;
    let mut c = config(&[&worker.url]);
    c.health.enabled = false;
    c.admission.max_concurrent_requests = Some(1);
    c.admission.queue_size = 1;
    c.server.shutdown_grace_period_secs = 1;
    let gw = gateway_ready(c, 1).await;
    let send = |text: &'static str| {
        let url = gw.url.clone();
        tokio::spawn(async move {
            let body =
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]});
            let r = client()
                .post(format!("{url}/v1/chat/completions"))
                .json(&body)
                .send()
                .await?;
            let status = r.status().as_u16();
            let retry_after = r.headers().get("retry-after").cloned();
            let body = r.text().await?;
            Ok::<_, reqwest::Error>((status, retry_after, body))
        })
    };
    let _holder = send("holder");
    wait_until("the holder at the worker", || async { worker.held() == 1 }).await;
    let queued = send("queued");
    wait_until("one request queued", || async {
        series_value(&gw.url, "radixgate_admission_queued_requests").await == 1.0
    })
    .await;
    gw.stop.cancel();
    let (status, retry_after, body) = tokio::time::timeout(HANG_GUARD, queued)
        .await
        .expect("an answer by the end of the grace period")
        .unwrap()
        .expect("an answer, not a dropped connection");
    assert_eq!(status, 503, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "shutting_down", "{body}");
    assert!(retry_after.is_some(), "Retry-After");
    gw.task.await.unwrap().unwrap();
    worker.release.cancel();
}

/// The same, where the slot's holder is an event stream: the end of the
/// grace period cuts that stream, which frees the slot at the very moment
/// the queued request is told to give up. The queued request still gets
/// its 503 and is never sent to a worker (where it would run with its
/// connection about to be dropped, its client not knowing whether it ran).
#[tokio::test]
async fn a_slot_freed_by_the_grace_periods_end_does_not_admit_a_queued_request() {
    use futures::StreamExt;
    let worker = stalling_worker(vec!["data: {\"choices\": []}\n\n"]).await;
    let mut c = config(&[&worker.url]);
    c.health.enabled = false;
    c.server.threads = 1;
    c.admission.max_concurrent_requests = Some(1);
    c.admission.queue_size = 1;
    c.server.shutdown_grace_period_secs = 1;
    let gw = gateway_ready(c, 1).await;
    let holder = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&scripted_chat("holder", true))
        .send()
        .await
        .unwrap();
    assert_eq!(holder.status(), 200);
    let mut holder = holder.bytes_stream();
    holder.next().await.expect("the first event").unwrap();
    let queued = {
        let url = gw.url.clone();
        tokio::spawn(async move {
            let r = client()
                .post(format!("{url}/v1/chat/completions"))
                .json(&scripted_chat("queued", false))
                .send()
                .await?;
            let status = r.status().as_u16();
            let body = r.text().await?;
            Ok::<_, reqwest::Error>((status, body))
        })
    };
    wait_until("one request queued", || async {
        series_value(&gw.url, "radixgate_admission_queued_requests").await == 1.0
    })
    .await;
    gw.stop.cancel();
    let (status, body) = tokio::time::timeout(HANG_GUARD, queued)
        .await
        .expect("an answer by the end of the grace period")
        .unwrap()
        .expect("an answer, not a dropped connection");
    assert_eq!(status, 503, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "shutting_down", "{body}");
    // The holder's stream was told why it ended.
    let mut rest = Vec::new();
    while let Some(Ok(chunk)) = holder.next().await {
        rest.extend_from_slice(&chunk);
    }
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("shutting_down"), "{rest}");
    gw.task.await.unwrap().unwrap();
    assert_eq!(worker.received.lock().len(), 1, "only the holder was sent");
    worker.stop.cancel();
}

/// A chat request for the scripted worker's model.
fn scripted_chat(text: &str, stream: bool) -> Value {
    serde_json::json!({"model": "scripted", "stream": stream,
                       "messages": [{"role": "user", "content": text}]})
}

/// Refusals given before the body is read (a wrong key, a path or method
/// with no route, a request that came back through a loop) leave the rest
/// of a body unread, and the server closes the connection: the answer
/// says so, or a client that sends its next request on the connection
/// loses it. A request without a body keeps its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_body_is_read_says_the_connection_closes() {
    let (_w, mut c) = worker_and_config().await;
    c.server.api_key = Some("sk-good".into());
    let gw = gateway_ready(c, 1).await;
    let key = "Authorization: Bearer sk-good\r\n";
    for (head, status) in [
        // A wrong key.
        (post_head(1 << 20, "Authorization: Bearer sk-bad\r\n"), 401),
        // No route for the path, or for the method.
        (
            post_head(1 << 20, key).replace("/v1/chat/completions", "/no/such/path"),
            404,
        ),
        (
            post_head(1 << 20, key).replace("POST /v1/chat/completions", "PUT /health"),
            405,
        ),
    ] {
        let mut s = connect(&gw.url).await;
        s.write_all(head.as_bytes()).await.unwrap();
        // Some of the body, not all of it.
        s.write_all(&[b' '; 4096]).await.unwrap();
        let answer = read_answer(&mut s).await.expect("an answer, not a close");
        assert_eq!(answer.status, status, "{}", answer.head);
        assert!(says_close(&answer), "{status}: {}", answer.head);
        wait_closed(&mut s).await;
    }
    // Without a body, the connection stays for the next request.
    let mut s = connect(&gw.url).await;
    s.write_all(b"GET /no/such/path HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    let answer = read_answer(&mut s).await.expect("an answer");
    assert_eq!(answer.status, 404);
    assert!(!says_close(&answer), "{}", answer.head);
    gw.shutdown().await;
}

/// The same for refusals the request path gives before it reads the body:
/// a tenant over its request limit (429), and a `/v1` path that is not
/// passed on (engine administration, a path that is not plain: 404). They
/// left the body unread without saying so, and the connection closed under
/// the client's next request (a keep-alive client's retry after the 429's
/// `Retry-After`, say), which was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_the_request_path_before_the_body_is_read_says_the_connection_closes() {
    let (_w, mut c) = worker_and_config().await;
    let tenant = |name: &str, key: &str, requests_per_minute| radixgate::config::TenantSpec {
        name: name.into(),
        key: Some(key.into()),
        key_env: None,
        requests_per_minute,
        tokens_per_minute: None,
        priority: Default::default(),
    };
    c.tenants.keys = vec![
        tenant("one-a-minute", "sk-one", Some(1)),
        tenant("open", "sk-open", None),
    ];
    let gw = gateway_ready(c, 1).await;
    let one = "Authorization: Bearer sk-one\r\n";
    let open = "Authorization: Bearer sk-open\r\n";
    // The limited tenant's one request of the minute.
    let mut s = connect(&gw.url).await;
    let body = chat_body(1024);
    s.write_all(format!("{}{body}", post_head(body.len(), one)).as_bytes())
        .await
        .unwrap();
    let answer = read_answer(&mut s).await.expect("an answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
    let path = |head: String, to: &str| head.replace("/v1/chat/completions", to);
    for (head, status) in [
        (post_head(1 << 20, one), 429),
        (path(post_head(1 << 20, open), "/v1/load_lora_adapter"), 404),
        (
            path(post_head(1 << 20, open), "/v1/a/../chat/completions"),
            404,
        ),
    ] {
        let mut s = connect(&gw.url).await;
        s.write_all(head.as_bytes()).await.unwrap();
        // Some of the body, not all of it.
        s.write_all(&[b' '; 4096]).await.unwrap();
        let answer = read_answer(&mut s).await.expect("an answer, not a close");
        assert_eq!(answer.status, status, "{}{}", answer.head, answer.body);
        assert!(says_close(&answer), "{status}: {}", answer.head);
        wait_closed(&mut s).await;
    }
    gw.shutdown().await;
}
