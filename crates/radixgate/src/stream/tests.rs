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
        upstream(vec![data("data: a\n"), data("\ndata: b\n\n")]),
        Recorder(log.clone()),
        true,
    );
    let bytes = body.collect().await.unwrap().to_bytes();
    assert_eq!(bytes, "data: a\n\ndata: b\n\n");
    assert_eq!(*log.lock().unwrap(), ["first", "Complete"]);
}

/// The events of an SSE text, each as its lines' data joined (what a
/// client's parser hands on), and what follows the last blank line.
fn events(text: &str) -> (Vec<String>, String) {
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut parts: Vec<&str> = text.split("\n\n").collect();
    let rest = parts.pop().unwrap_or_default().to_owned();
    let events = parts
        .iter()
        .map(|event| {
            event
                .lines()
                .filter_map(|line| line.strip_prefix("data: "))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    (events, rest)
}

/// A worker that breaks off, or ends cleanly, in the middle of an event:
/// the client gets none of that event, the error event is one of its own
/// and parses, and a clean end there is no complete stream.
#[tokio::test]
async fn an_end_in_the_middle_of_an_event_sends_none_of_it_before_the_error_event() {
    let partial = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel";
    for (items, end) in [
        (
            vec![data("data: 1\n\n"), data(partial), broken()],
            "UpstreamError",
        ),
        (vec![data("data: 1\n\n"), data(partial)], "UpstreamError"),
        (
            vec![data("data: 1\n\ndata: 2\n"), broken()],
            "UpstreamError",
        ),
        (
            vec![data("data: 1\r\n\r\n"), data("data: 2\r"), broken()],
            "UpstreamError",
        ),
        (
            vec![data("data: 1\n\n"), data("data: [DONE]\n"), data("\n")],
            "Complete",
        ),
    ] {
        let log = Log::default();
        let body = WatchedBody::new(upstream(items), Recorder(log.clone()), true);
        let bytes = body.collect().await.unwrap().to_bytes();
        let text = std::str::from_utf8(&bytes).unwrap();
        let (events, rest) = events(text);
        assert_eq!(rest, "", "the text ends at an event's end: {text:?}");
        assert_eq!(events[0], "1", "{text:?}");
        assert_eq!(*log.lock().unwrap(), ["first", end], "{text:?}");
        if end == "Complete" {
            assert_eq!(events.last().unwrap(), "[DONE]");
            continue;
        }
        assert_eq!(events.len(), 2, "the unfinished event was sent: {text:?}");
        let error: serde_json::Value = serde_json::from_str(events.last().unwrap())
            .unwrap_or_else(|e| panic!("the error event is not JSON ({e}): {text:?}"));
        assert_eq!(error["error"]["type"], "upstream_error", "{text:?}");
    }
}

/// An event split over frames (at any byte, a line end's two bytes
/// included) reaches the client whole and unchanged, and the frames the
/// client gets each end an event.
#[tokio::test]
async fn an_event_split_over_frames_is_passed_on_whole() {
    let text = "data: {\"a\":1}\r\n\r\n: ping\n\ndata: 2\r\rdata: 3\n\n";
    for cut in 1..text.len() {
        for second in cut..text.len() {
            let items = vec![
                data(&text[..cut]),
                data(&text[cut..second]),
                data(&text[second..]),
            ];
            let log = Log::default();
            let mut body = WatchedBody::new(upstream(items), Recorder(log.clone()), true);
            let mut got = String::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.unwrap().into_data().unwrap();
                got.push_str(std::str::from_utf8(&frame).unwrap());
                assert_eq!(events(&got).1, "", "cut at {cut}, {second}: {got:?}");
            }
            assert_eq!(got, text, "cut at {cut}, {second}");
            assert_eq!(*log.lock().unwrap(), ["first", "Complete"]);
        }
    }
}

/// A long event that comes in many small frames (a worker writing a
/// large tool call's arguments as it makes them) is passed on whole, once,
/// after the events before it and before the next.
#[tokio::test]
async fn a_long_event_in_many_small_frames_is_passed_on_whole() {
    let long = format!("data: {}\n\n", "y".repeat(300 * 1024));
    let text = format!("data: 1\n\n{long}data: 2\n\n");
    let items = text
        .as_bytes()
        .chunks(1000)
        .map(|c| data(std::str::from_utf8(c).unwrap()))
        .collect();
    let mut body = WatchedBody::new(upstream(items), Recorder(Log::default()), true);
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        frames.push(frame.unwrap().into_data().unwrap());
    }
    let got: Vec<u8> = frames.concat();
    assert_eq!(got, text.as_bytes());
    // Every frame ends an event; the long one went out in a frame of its
    // own, with at most the event it ends beside it.
    for frame in &frames {
        assert_eq!(events(std::str::from_utf8(frame).unwrap()).1, "");
    }
    assert!(
        frames
            .iter()
            .any(|f| f.len() >= long.len() && f.len() < long.len() + 20),
        "{:?}",
        frames.iter().map(|f| f.len()).collect::<Vec<_>>()
    );
}

/// An event longer than what is held back is passed on as it comes, and
/// closed before the error event when the worker breaks off in it.
#[tokio::test]
async fn an_event_longer_than_the_hold_is_passed_on_as_it_comes() {
    let long = format!("data: {}", "x".repeat(HOLD_AT_MOST));
    let body = WatchedBody::new(
        upstream(vec![data("data: 1\n\n"), data(&long), broken()]),
        Recorder(Log::default()),
        true,
    );
    let bytes = body.collect().await.unwrap().to_bytes();
    let (events, rest) = events(std::str::from_utf8(&bytes).unwrap());
    assert_eq!(rest, "");
    assert_eq!(events.len(), 3);
    assert_eq!(events[1].len(), HOLD_AT_MOST);
    assert!(events[2].contains("upstream_error"), "{}", events[2]);
}

/// The Messages and Responses APIs' clients look for an event named
/// `error`, in their own shapes.
#[tokio::test]
async fn each_api_gets_its_own_error_event() {
    for (api, expected) in [
        (
            ErrorEvents::Messages,
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"the worker's stream broke off: reset\"}}\n\n",
        ),
        (
            ErrorEvents::Responses,
            "event: error\ndata: {\"type\":\"error\",\"code\":\"stream_interrupted\",\"message\":\"the worker's stream broke off: reset\",\"param\":null}\n\n",
        ),
    ] {
        let body = WatchedBody::new(
            upstream(vec![data("event: ping\ndata: {}\n\n"), broken()]),
            (),
            true,
        )
        .with_error_events(api);
        let bytes = body.collect().await.unwrap().to_bytes();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert_eq!(text, format!("event: ping\ndata: {{}}\n\n{expected}"));
    }
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
        upstream(vec![data("data: a\n\n"), data("data: b\n\n")]),
        Recorder(log.clone()),
        true,
    );
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "data: a\n\n");
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
        paced(
            &[
                "data: a\n\n",
                "data: b\n\n",
                "data: c\n\n",
                "data: d\n\n",
                "data: e\n\n",
            ],
            vec![gap; 5],
        ),
        Recorder(log.clone()),
        true,
    )
    .with_stall_timeout(std::time::Duration::from_secs(1));
    let bytes = body.collect().await.unwrap().to_bytes();
    assert_eq!(
        bytes,
        "data: a\n\ndata: b\n\ndata: c\n\ndata: d\n\ndata: e\n\n"
    );
    assert_eq!(*log.lock().unwrap(), ["first", "Complete"]);
}

#[tokio::test(start_paused = true)]
async fn a_stream_silent_past_its_stall_timeout_ends_with_an_error_event() {
    let log = Log::default();
    let ms = std::time::Duration::from_millis;
    let started = tokio::time::Instant::now();
    let body = WatchedBody::new(
        paced(
            &["data: a\n\n", "data: b\n\n", "data: c\n\n"],
            vec![ms(600), ms(600), ms(5000)],
        ),
        Recorder(log.clone()),
        true,
    )
    .with_stall_timeout(ms(1000));
    let bytes = body.collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(
        text.starts_with("data: a\n\ndata: b\n\n") && text.contains("stream_stalled"),
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
    let texts: &'static [&'static str] = &["data: x\n\n"; 100];
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
    assert_eq!(text.matches("data: x\n\n").count(), 3, "{text}");
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
    // The type a whole answer cut by the shutdown has: the router's, not
    // the worker's error.
    assert!(text.contains(r#""type":"service_unavailable""#), "{text}");
    assert_eq!(*log.lock().unwrap(), ["Shutdown"]);
}

/// A body of known length ends with its last byte: hyper drops it then
/// without polling it to its end, and that is a complete answer, not a
/// client gone.
#[tokio::test]
async fn a_body_of_known_length_is_complete_at_its_last_byte() {
    for sse in [false, true] {
        let log = Log::default();
        let mut body = WatchedBody::new(
            http_body_util::Full::new(Bytes::from_static(b"data: {\"a\":1}\n\n")),
            Recorder(log.clone()),
            sse,
        );
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "data: {\"a\":1}\n\n");
        assert!(body.is_end_stream());
        drop(body);
        assert_eq!(*log.lock().unwrap(), ["first", "Complete"], "sse {sse}");
    }
}

/// The request's own timeout cutting a stream says nothing about the
/// worker: it ends as timed out, not as the worker's failure.
#[tokio::test(start_paused = true)]
async fn the_request_timeout_cutting_a_stream_is_not_the_workers_failure() {
    let log = Log::default();
    let body = WatchedBody::new(
        paced(
            &["data: a\n\n", "data: b\n\n"],
            vec![
                std::time::Duration::ZERO,
                std::time::Duration::from_secs(60),
            ],
        ),
        Recorder(log.clone()),
        true,
    )
    .with_deadline(tokio::time::Instant::now() + std::time::Duration::from_secs(5));
    let bytes = body.collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(text.contains("request_timeout"), "{text}");
    assert!(text.contains(r#""type":"timeout""#), "{text}");
    assert_eq!(*log.lock().unwrap(), ["first", "TimedOut"]);
}

/// A worker whose frames are always ready (a fast generation whose client
/// reads slowly: the next frame is buffered whenever the body is polled)
/// is still cut at the request's deadline, not streamed past it: within
/// `DEADLINE_EVERY` frames.
#[tokio::test(start_paused = true)]
async fn the_request_timeout_ends_a_stream_whose_frames_are_always_ready() {
    let log = Log::default();
    let frames = (0..100).map(|_| data("data: x\n\n")).collect();
    let body = WatchedBody::new(upstream(frames), Recorder(log.clone()), true)
        .with_deadline(tokio::time::Instant::now() + std::time::Duration::from_secs(5));
    let mut body = std::pin::pin!(body);
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "data: x\n\n");
    tokio::time::advance(std::time::Duration::from_secs(6)).await;
    let rest = body.collect().await.unwrap().to_bytes();
    let text = String::from_utf8(rest.to_vec()).unwrap();
    let passed = text.matches("data: x").count();
    assert!(
        passed < DEADLINE_EVERY as usize,
        "{passed} frames past the deadline"
    );
    assert!(text.contains("data: {\"error\""), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    assert_eq!(*log.lock().unwrap(), ["first", "TimedOut"]);
}

/// A body read ahead gives the same frames after, its break included.
#[tokio::test]
async fn a_body_read_ahead_is_read_whole_after() {
    let mut body = Primed::new(vec![], upstream(vec![data("ab"), data("cd"), data("ef")]));
    body.read_ahead(3).await;
    assert_eq!(body.held(), b"abcd");
    assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdef");

    let mut body = Primed::new(vec![], upstream(vec![data("ab"), broken(), data("x")]));
    body.read_ahead(100).await;
    assert_eq!(body.held(), b"ab");
    assert!(!body.is_end_stream());
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "ab");
    assert!(
        body.frame().await.unwrap().is_err(),
        "the break, as it came"
    );

    let mut body = Primed::new(vec![], upstream(vec![data("ab")]));
    body.read_ahead(100).await;
    assert_eq!(body.collect().await.unwrap().to_bytes(), "ab");
}
