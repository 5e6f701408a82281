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
