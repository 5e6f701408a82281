use super::*;
use http_body_util::{BodyExt, StreamBody};
use std::sync::{Arc, Mutex};

type Log = Arc<Mutex<Vec<String>>>;

/// Records calls so tests can check each stream ends exactly once.
struct Recorder(Log);

impl StreamWatch for Recorder {
    fn first_byte(&mut self) {
        self.0.lock().unwrap().push("first".into());
    }
    fn finish(self, end: StreamEnd) {
        self.0.lock().unwrap().push(format!("{end:?}"));
    }
}

type Item = Result<Frame<Bytes>, std::io::Error>;

fn upstream(items: Vec<Item>) -> StreamBody<futures::stream::Iter<std::vec::IntoIter<Item>>> {
    StreamBody::new(futures::stream::iter(items))
}

fn data(s: &str) -> Item {
    Ok(Frame::data(Bytes::from(s.to_owned())))
}

fn broken() -> Item {
    Err(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "reset",
    ))
}

#[tokio::test]
async fn complete_stream_passes_bytes_and_finishes_once() {
    let log = Log::default();
    let body = WatchedBody::new(
        upstream(vec![data("a"), data("b")]),
        Recorder(log.clone()),
        true,
    );
    let bytes = body.collect().await.unwrap().to_bytes();
    assert_eq!(bytes, "ab");
    assert_eq!(*log.lock().unwrap(), ["first", "Complete"]);
}

#[tokio::test]
async fn broken_sse_stream_ends_with_error_event_not_done() {
    let log = Log::default();
    let body = WatchedBody::new(
        upstream(vec![
            data("data: 1\n\n"),
            broken(),
            data("data: [DONE]\n\n"),
        ]),
        Recorder(log.clone()),
        true,
    );
    let bytes = body.collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(text.starts_with("data: 1\n\ndata: {\"error\""), "{text}");
    assert!(text.contains("stream_interrupted"));
    assert!(!text.contains("[DONE]"));
    assert_eq!(*log.lock().unwrap(), ["first", "UpstreamError"]);
}

#[tokio::test]
async fn broken_plain_body_is_an_error() {
    let log = Log::default();
    let body = WatchedBody::new(
        upstream(vec![data("{\"a\":"), broken()]),
        Recorder(log.clone()),
        false,
    );
    assert!(body.collect().await.is_err());
    assert_eq!(*log.lock().unwrap(), ["first", "UpstreamError"]);
}

#[tokio::test]
async fn dropped_early_counts_as_client_gone() {
    let log = Log::default();
    let mut body = WatchedBody::new(
        upstream(vec![data("a"), data("b")]),
        Recorder(log.clone()),
        true,
    );
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "a");
    drop(body);
    assert_eq!(*log.lock().unwrap(), ["first", "ClientGone"]);
}

#[tokio::test]
async fn dropped_before_any_byte_still_finishes() {
    let log = Log::default();
    drop(WatchedBody::new(
        upstream(vec![]),
        Recorder(log.clone()),
        false,
    ));
    assert_eq!(*log.lock().unwrap(), ["ClientGone"]);
}

/// Frames `texts`, each after waiting `gaps[i]` (paused time in the tests).
fn paced(
    texts: &'static [&'static str],
    gaps: Vec<std::time::Duration>,
) -> StreamBody<impl futures::Stream<Item = Item> + Unpin> {
    let items = futures::stream::unfold(0usize, move |i| {
        let gap = gaps.get(i).copied();
        async move {
            tokio::time::sleep(gap?).await;
            Some((data(texts.get(i)?), i + 1))
        }
    });
    StreamBody::new(Box::pin(items))
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_keeps_sending_outlives_its_stall_timeout() {
    let log = Log::default();
    let gap = std::time::Duration::from_millis(600);
    let body = WatchedBody::new(
        paced(&["a", "b", "c", "d", "e"], vec![gap; 5]),
        Recorder(log.clone()),
        true,
    )
    .with_stall_timeout(std::time::Duration::from_secs(1));
    let bytes = body.collect().await.unwrap().to_bytes();
    assert_eq!(bytes, "abcde");
    assert_eq!(*log.lock().unwrap(), ["first", "Complete"]);
}

#[tokio::test(start_paused = true)]
async fn a_stream_silent_past_its_stall_timeout_ends_with_an_error_event() {
    let log = Log::default();
    let ms = std::time::Duration::from_millis;
    let started = tokio::time::Instant::now();
    let body = WatchedBody::new(
        paced(&["a", "b", "c"], vec![ms(600), ms(600), ms(5000)]),
        Recorder(log.clone()),
        true,
    )
    .with_stall_timeout(ms(1000));
    let bytes = body.collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(
        text.starts_with("ab") && text.contains("stream_stalled"),
        "{text}"
    );
    // Stalled 1 s after the second frame, not 1 s after the first.
    assert_eq!(started.elapsed(), ms(2200));
    assert_eq!(*log.lock().unwrap(), ["first", "UpstreamError"]);
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_ends_a_stream_that_keeps_sending() {
    let log = Log::default();
    let token = tokio_util::sync::CancellationToken::new();
    let texts: &'static [&'static str] = &["x"; 100];
    let body = WatchedBody::new(
        paced(texts, vec![std::time::Duration::from_millis(100); 100]),
        Recorder(log.clone()),
        true,
    )
    .with_abort(token.clone());
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(350)).await;
        cancel.cancel();
    });
    let bytes = body.collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    // Frames at 100, 200 and 300 ms; the cancel at 350 ms ends it there.
    assert_eq!(text.split("data: ").next(), Some("xxx"), "{text}");
    assert!(text.contains("shutting_down"), "{text}");
    assert_eq!(*log.lock().unwrap(), ["first", "Shutdown"]);
}

#[tokio::test]
async fn a_shutdown_ends_a_stream_whose_frames_are_always_ready() {
    let log = Log::default();
    let token = tokio_util::sync::CancellationToken::new();
    let body = WatchedBody::new(
        upstream(vec![data("a"), data("b"), data("c")]),
        Recorder(log.clone()),
        true,
    )
    .with_abort(token.clone());
    token.cancel();
    let bytes = body.collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(
        text.starts_with("data: ") && text.contains("shutting_down"),
        "{text}"
    );
    assert_eq!(*log.lock().unwrap(), ["Shutdown"]);
}
