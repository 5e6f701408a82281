//! The request path against workers whose every byte is written by hand:
//! framing a library worker would never send, and connections a worker
//! closes under the router. Real gateways and raw TCP workers on loopback;
//! no assertion is a wall-clock bound.

mod common;

use common::*;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// What a raw worker does with the `n`th POST (from 0) on one of its
/// connections, given its head: the bytes of its answer, or `None` to
/// close the connection without answering.
type Answering = Arc<dyn Fn(usize, &str) -> Option<Vec<u8>> + Send + Sync>;

/// A worker speaking HTTP/1.1 by hand: every GET (health, models) gets a
/// small JSON answer, every POST what `answer` says.
async fn raw_worker(answer: Answering) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve_connection(stream, answer.clone()));
        }
    });
    url
}

/// Reads one request's head (its body is read and dropped); `None` at
/// the connection's end.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    read_http_message(stream, buf).await.map(|(head, _)| head)
}

async fn serve_connection(mut stream: TcpStream, answer: Answering) {
    let mut buf = Vec::new();
    let mut posts = 0;
    while let Some(head) = read_request(&mut stream, &mut buf).await {
        let bytes = if head.starts_with("POST") {
            posts += 1;
            match answer(posts - 1, &head) {
                Some(bytes) => bytes,
                None => return,
            }
        } else {
            let model = radixgate_sim::server::DEFAULT_MODEL;
            let body = format!(r#"{{"data":[{{"id":"{model}"}}]}}"#);
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        };
        if stream.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

/// A whole chat completion, as a worker sends it.
const COMPLETION: &str = r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},"finish_reason":"stop"}]}"#;

/// `body` in HTTP/1.1 chunked framing, in chunks of `size` bytes.
fn chunked(body: &str, size: usize) -> String {
    let mut out = String::new();
    for piece in body.as_bytes().chunks(size) {
        out.push_str(&format!("{:x}\r\n", piece.len()));
        out.push_str(std::str::from_utf8(piece).unwrap());
        out.push_str("\r\n");
    }
    out.push_str("0\r\n\r\n");
    out
}

async fn chat_answer(gw: &str) -> reqwest::Response {
    tokio::time::timeout(
        Duration::from_secs(30),
        post_chat(gw, &chat("hello", false)),
    )
    .await
    .expect("the gateway answered nothing")
}

/// A worker's answer with both `Content-Length` and `Transfer-Encoding:
/// chunked` is read as chunked (RFC 9112 §6.3: the length is to be
/// ignored), and the client must get the whole body, framed once: a proxy
/// that passes the worker's stale length on cuts the answer short.
#[tokio::test]
async fn an_answer_with_both_length_and_chunked_reaches_the_client_whole() {
    let answer: Answering = Arc::new(|_, _| {
        Some(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                 content-length: 7\r\ntransfer-encoding: chunked\r\n\r\n{}",
                chunked(COMPLETION, 16)
            )
            .into_bytes(),
        )
    });
    let worker = raw_worker(answer).await;
    let gw = gateway_ready(config(&[&worker]), 1).await;
    let response = chat_answer(&gw.url).await;
    assert_eq!(response.status(), 200);
    let length = response.headers().get("content-length").cloned();
    let body = tokio::time::timeout(Duration::from_secs(30), response.bytes())
        .await
        .expect("the body hangs");
    let body = body.map(|b| String::from_utf8_lossy(&b).into_owned());
    assert_eq!(
        body.as_deref().ok(),
        Some(COMPLETION),
        "the client's body (its head said content-length {length:?}): {body:?}"
    );
    let parsed: Value = serde_json::from_str(COMPLETION).unwrap();
    assert_eq!(parsed["object"], "chat.completion");
    gw.shutdown().await;
}

/// A worker closes an idle keep-alive connection (uvicorn, which vLLM
/// and SGLang serve with, after 5 s) just as the router sends a request
/// on it: the request went out on a connection the worker had given up,
/// and no answer comes. That is no failure of the worker or the request:
/// the router sends it again on a new connection, and the client, even
/// with one worker, gets its answer.
#[tokio::test]
async fn a_pooled_connection_the_worker_closed_is_not_a_failed_request() {
    let answer: Answering = Arc::new(|n, _| {
        // Each connection's first request is answered; a later one
        // finds the worker closing it.
        (n == 0).then(|| {
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\n\r\n{COMPLETION}",
                COMPLETION.len()
            )
            .into_bytes()
        })
    });
    let worker = raw_worker(answer).await;
    let mut c = config(&[&worker]);
    // Serving threads have pools of their own: one, so the second
    // request finds the first one's connection.
    c.server.threads = 1;
    let gw = gateway_ready(c, 1).await;
    for i in 0..3 {
        let response = chat_answer(&gw.url).await;
        let status = response.status();
        let body = response.text().await.unwrap();
        assert_eq!(status, 200, "request {i}: {body}");
        assert_eq!(body, COMPLETION, "request {i}");
    }
    assert_eq!(
        series_sum(&gw.url, "radixgate_upstream_errors_total").await,
        0.0,
        "no attempt failed: the worker broke nothing"
    );
    gw.shutdown().await;
}

/// A router listening on `::` (IPv4 and IPv6 clients on one socket) sees
/// an IPv4 client as `::ffff:a.b.c.d`; the worker is told the client's
/// own address, as one listening on `0.0.0.0` would tell it.
#[tokio::test]
async fn a_dual_stack_router_forwards_an_ipv4_clients_address_as_ipv4() {
    // Run for real: a machine without IPv6 fails here rather than passing
    // a test it never ran.
    let listener = TcpListener::bind("[::]:0")
        .await
        .expect("an IPv6 socket on ::, which this test needs");
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let seen = heads.clone();
    let answer: Answering = Arc::new(move |_, head| {
        seen.lock().push(head.to_owned());
        Some(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\n\r\n{COMPLETION}",
                COMPLETION.len()
            )
            .into_bytes(),
        )
    });
    let worker = raw_worker(answer).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(radixgate::server::run(
        listener,
        config(&[&worker]),
        stop.clone(),
    ));
    let gw = format!("http://127.0.0.1:{port}");
    wait_for_healthy(&gw, 1).await;
    let response = client()
        .post(format!("{gw}/v1/chat/completions"))
        .header("forwarded", "for=192.0.2.1")
        .json(&chat("hello", false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let head = heads.lock().pop().expect("the worker got the request");
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
            .unwrap_or_default()
    };
    assert_eq!(header("x-forwarded-for"), "127.0.0.1", "{head}");
    assert_eq!(
        header("forwarded"),
        "for=192.0.2.1, for=127.0.0.1",
        "{head}"
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// A worker (or a proxy in front of it) that answers a chat request with
/// `101 Switching Protocols` has not answered it: the request asked for
/// no upgrade. Passed on, the client got a 101 with no body for a POST,
/// no error it could read, and the worker's breaker counted it a success.
/// It is an invalid answer: retried on another worker, and with none
/// left, a 502 with an OpenAI-style error.
#[tokio::test]
async fn a_protocol_switch_nobody_asked_for_is_no_answer() {
    let switches: Answering = Arc::new(|_, _| {
        Some(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\
              connection: upgrade\r\n\r\n"
                .to_vec(),
        )
    });
    let liar = raw_worker(switches).await;
    let gw = gateway_ready(config(&[&liar]), 1).await;
    for stream in [false, true] {
        let response = chat_answer_streamed(&gw.url, stream).await;
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert_eq!(status, 502, "stream {stream}: {body}");
        let body: Value = serde_json::from_str(&body).expect("an OpenAI-style error");
        assert_eq!(body["error"]["code"], "worker_invalid_answer", "{body}");
    }
    let invalid = format!("radixgate_upstream_errors_total{{worker=\"{liar}\",kind=\"invalid\"}}");
    assert_eq!(series_value(&gw.url, &invalid).await, 2.0);
    gw.shutdown().await;

    // Beside a worker that answers, every request is answered there.
    let good = sim_worker(fast_worker()).await;
    let mut c = config(&[&liar, &good.url]);
    c.routing = radixgate_routing::PolicyConfig::RoundRobin(Default::default());
    let gw = gateway_ready(c, 2).await;
    assert_all_served_by(&gw.url, &good.url, 4, "switched").await;
    gw.shutdown().await;
}

async fn chat_answer_streamed(gw: &str, stream: bool) -> reqwest::Response {
    tokio::time::timeout(
        Duration::from_secs(30),
        post_chat(gw, &chat("hello", stream)),
    )
    .await
    .expect("the gateway answered nothing")
}

/// A worker whose answer's head cannot be read (here two different
/// lengths, as a broken proxy in front of a pool may send for every
/// worker) answered, and broke no connection: that is no sign that the
/// request kills engines. Counted as one, two such answers ended the
/// request with `x-should-retry: false` although a worker that answers
/// was left, and made the request a suspect for ten minutes.
#[tokio::test]
async fn an_unreadable_answer_is_no_broken_connection() {
    let unreadable: Answering = Arc::new(|_, _| {
        Some(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\ncontent-length: 3\r\n\r\n{COMPLETION}",
                COMPLETION.len()
            )
            .into_bytes(),
        )
    });
    let first = raw_worker(unreadable.clone()).await;
    let second = raw_worker(unreadable).await;
    let good = sim_worker(fast_worker()).await;
    let mut c = config(&[&first, &second, &good.url]);
    c.routing = radixgate_routing::PolicyConfig::RoundRobin(Default::default());
    let gw = gateway_ready(c, 3).await;
    for i in 0..6 {
        let response = chat_answer_streamed(&gw.url, i % 2 == 0).await;
        let status = response.status();
        let retry = response.headers().get("x-should-retry").cloned();
        let served = response.headers().get("x-radixgate-worker").cloned();
        let body = response.text().await.unwrap_or_default();
        assert_eq!(status, 200, "request {i} ({retry:?}): {body}");
        assert_eq!(served.unwrap(), good.url.as_str(), "request {i}");
    }
    let invalid = format!("radixgate_upstream_errors_total{{worker=\"{first}\",kind=\"invalid\"}}");
    assert!(series_value(&gw.url, &invalid).await > 0.0);
    gw.shutdown().await;
}
