//! The request id in every log line about a request, without a span.
//!
//! A `tracing` span would do it (it did, until 2026-12-03), but a span costs
//! every request its registration, the formatting of its field and a trip
//! through every layer each time its future is polled: about 6,000
//! instructions, 5% of a whole answer's (bench/README.md, "Router CPU per
//! request"), for lines that are rarely written. Here the id sits in a
//! thread-local while the request's code runs ([`RequestLog::scope`] around
//! its future, [`RequestLog::enter`] around the stream's end), which costs
//! two moves a poll, and the log layer's line format ([`LogFormat`]) reads
//! it only when it writes a line. The lines look as they did: text lines
//! carry `request{request_id=…}:` after the level, JSON lines a `span`
//! and a `spans` entry `{"request_id": …, "name": "request"}`.

use axum::http::HeaderValue;
use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::registry::LookupSpan;

thread_local! {
    /// The id of the request whose code runs on this thread now.
    static CURRENT: Cell<Option<HeaderValue>> = const { Cell::new(None) };
}

/// A request's id for its log lines (none for a request without one).
#[derive(Clone, Debug, Default)]
pub struct RequestLog(Option<HeaderValue>);

impl RequestLog {
    /// The log scope of the request with `id`.
    pub fn new(id: HeaderValue) -> Self {
        Self(Some(id))
    }

    /// The request whose code runs now, if any (for a task it spawns).
    pub fn current() -> Self {
        Self(with_current(|id| id.cloned()))
    }

    /// Makes this the current request until the guard drops.
    pub fn enter(&self) -> Entered {
        Entered {
            previous: CURRENT.replace(self.0.clone()),
        }
    }

    /// `future`, polled and dropped with this as the current request.
    pub fn scope<F: Future>(self, future: F) -> Scoped<F> {
        Scoped {
            id: self.0,
            inner: Some(future),
        }
    }
}

/// While it lives, a request is current ([`RequestLog::enter`]).
#[must_use = "the request is current only while the guard lives"]
pub struct Entered {
    previous: Option<HeaderValue>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.set(self.previous.take());
    }
}

/// Moves `slot`'s id in as the current one, and back when dropped (also
/// when what runs in between panics).
struct Swap<'a> {
    slot: &'a mut Option<HeaderValue>,
    previous: Option<HeaderValue>,
}

impl<'a> Swap<'a> {
    fn new(slot: &'a mut Option<HeaderValue>) -> Self {
        let previous = CURRENT.replace(slot.take());
        Self { slot, previous }
    }
}

impl Drop for Swap<'_> {
    fn drop(&mut self) {
        *self.slot = CURRENT.replace(self.previous.take());
    }
}

pin_project_lite::pin_project! {
    /// A future run with its request current ([`RequestLog::scope`]).
    pub struct Scoped<F> {
        id: Option<HeaderValue>,
        // `None` only once dropped: the drop runs in the scope too.
        #[pin]
        inner: Option<F>,
    }

    impl<F> PinnedDrop for Scoped<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            let _scope = Swap::new(this.id);
            this.inner.set(None);
        }
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _scope = Swap::new(this.id);
        match this.inner.as_pin_mut() {
            Some(inner) => inner.poll(cx),
            // Not reached: only the drop empties it.
            None => Poll::Pending,
        }
    }
}

/// `f` of the current request's id, if any (left in place).
fn with_current<R>(f: impl FnOnce(Option<&HeaderValue>) -> R) -> R {
    CURRENT.with(|current| {
        let id = current.take();
        let out = f(id.as_ref());
        current.set(id);
        out
    })
}

/// `f` of the current request's id as text (ids are visible ASCII).
fn with_current_text<R>(f: impl FnOnce(Option<&str>) -> R) -> R {
    with_current(|id| f(id.and_then(|id| id.to_str().ok())))
}

/// The log layer's line format: `inner`'s, with the current request's id.
/// A text line is written as `tracing-subscriber`'s full format writes it,
/// its time and level here (`inner` is that format without them), then
/// `request{request_id=…}: `, then `inner`'s rest. A JSON line is `inner`'s
/// with the request added as the outermost span.
pub struct LogFormat<E> {
    inner: E,
    json: bool,
}

impl<E> LogFormat<E> {
    /// Text lines; `inner` must leave out the time and the level.
    pub fn text(inner: E) -> Self {
        Self { inner, json: false }
    }

    /// JSON lines, `inner`'s.
    pub fn json(inner: E) -> Self {
        Self { inner, json: true }
    }
}

impl<S, N, E> FormatEvent<S, N> for LogFormat<E>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    E: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if self.json {
            return with_current_text(|id| match id {
                None => self.inner.format_event(ctx, writer, event),
                Some(id) => {
                    let mut line = String::new();
                    self.inner
                        .format_event(ctx, Writer::new(&mut line), event)?;
                    writer.write_str(&with_request_span(&line, id))
                }
            });
        }
        let ansi = writer.has_ansi_escapes();
        if ansi {
            writer.write_str("\x1b[2m")?;
            SystemTime.format_time(&mut writer)?;
            writer.write_str("\x1b[0m ")?;
        } else {
            SystemTime.format_time(&mut writer)?;
            writer.write_char(' ')?;
        }
        let (level, colour) = match *event.metadata().level() {
            Level::TRACE => ("TRACE", "35"),
            Level::DEBUG => ("DEBUG", "34"),
            Level::INFO => (" INFO", "32"),
            Level::WARN => (" WARN", "33"),
            Level::ERROR => ("ERROR", "31"),
        };
        if ansi {
            write!(writer, "\x1b[{colour}m{level}\x1b[0m ")?;
        } else {
            write!(writer, "{level} ")?;
        }
        with_current_text(|id| match (id, ansi) {
            (None, _) => Ok(()),
            (Some(id), false) => write!(writer, "request{{request_id={id}}}: "),
            (Some(id), true) => write!(
                writer,
                "\x1b[1mrequest\x1b[0m\x1b[1m{{\x1b[0m\x1b[3mrequest_id\x1b[0m\x1b[2m=\x1b[0m{id}\x1b[1m}}\x1b[0m\x1b[2m:\x1b[0m "
            ),
        })?;
        self.inner.format_event(ctx, writer, event)
    }
}

/// A JSON log line with the request `id` as its outermost span: first in
/// `spans`, and `span` where the line has no span of its own.
fn with_request_span(line: &str, id: &str) -> String {
    let span = format!(
        "{{\"request_id\":{},\"name\":\"request\"}}",
        serde_json::Value::from(id)
    );
    let mut out = String::with_capacity(line.len() + 2 * span.len() + 20);
    if let Some(at) = line.find("\"spans\":[") {
        let at = at + "\"spans\":[".len();
        let inner_spans = !line[at..].starts_with(']');
        out.push_str(&line[..at]);
        out.push_str(&span);
        if inner_spans {
            out.push(',');
        }
        out.push_str(&line[at..]);
        return out;
    }
    match line.trim_end().strip_suffix('}') {
        Some(object) => {
            let rest = &line[object.len() + 1..];
            out.push_str(object);
            out.push_str(",\"span\":");
            out.push_str(&span);
            out.push_str(",\"spans\":[");
            out.push_str(&span);
            out.push_str("]}");
            out.push_str(rest);
        }
        None => out.push_str(line),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current() -> Option<String> {
        with_current_text(|id| id.map(str::to_owned))
    }

    #[test]
    fn the_request_is_current_while_entered_and_while_its_future_runs() {
        assert_eq!(current(), None);
        let a = RequestLog::new(HeaderValue::from_static("a"));
        {
            let _a = a.enter();
            assert_eq!(current().as_deref(), Some("a"));
            {
                let _b = RequestLog::new(HeaderValue::from_static("b")).enter();
                assert_eq!(current().as_deref(), Some("b"));
                assert_eq!(RequestLog::current().0, Some(HeaderValue::from_static("b")));
            }
            assert_eq!(current().as_deref(), Some("a"));
        }
        assert_eq!(current(), None);

        // A future sees its request on every poll, and not between them.
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let mut future = Box::pin(a.clone().scope(async move {
            log.lock().unwrap().push(current());
            tokio::task::yield_now().await;
            log.lock().unwrap().push(current());
        }));
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(future.as_mut().poll(&mut cx).is_pending());
        assert_eq!(current(), None);
        assert!(future.as_mut().poll(&mut cx).is_ready());
        assert_eq!(current(), None);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![Some("a".into()), Some("a".into())]
        );
    }

    #[test]
    fn a_future_is_dropped_in_its_request() {
        struct Tell(std::sync::Arc<std::sync::Mutex<Option<String>>>);
        impl Drop for Tell {
            fn drop(&mut self) {
                *self.0.lock().unwrap() = current();
            }
        }
        let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
        let tell = Tell(seen.clone());
        let future = RequestLog::new(HeaderValue::from_static("gone")).scope(async move {
            let _tell = tell;
            std::future::pending::<()>().await;
        });
        let mut future = Box::pin(future);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(future.as_mut().poll(&mut cx).is_pending());
        drop(future);
        assert_eq!(seen.lock().unwrap().as_deref(), Some("gone"));
        assert_eq!(current(), None);
    }

    /// Where the subscriber below writes.
    #[derive(Clone, Default)]
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
        type Writer = Sink;
        fn make_writer(&'a self) -> Sink {
            self.clone()
        }
    }

    /// The lines `emit` logs, through `tracing-subscriber`'s own format in
    /// a span `request{request_id=r-1}` and through [`LogFormat`] with
    /// the request current, with their times cut off.
    fn both(json: bool, ansi: bool, emit: fn()) -> (String, String) {
        use tracing_subscriber::fmt;
        let strip = |sink: Sink| {
            let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
            let cut = |line: &str| match json {
                true => {
                    let mut line: serde_json::Value = serde_json::from_str(line).unwrap();
                    line.as_object_mut().unwrap().remove("timestamp");
                    line.to_string()
                }
                false => line.split_once("Z").unwrap().1.to_owned(),
            };
            text.lines().map(cut).collect::<Vec<_>>().join("\n")
        };
        let (stock, ours) = (Sink::default(), Sink::default());
        let builder = || {
            fmt::Subscriber::builder()
                .with_ansi(ansi)
                .with_max_level(Level::TRACE)
        };
        // Each logs `emit`'s lines about the request, then without one.
        let in_span = |sub: tracing::Dispatch| {
            tracing::dispatcher::with_default(&sub, || {
                tracing::error_span!("request", request_id = %"r-1").in_scope(emit);
                emit();
            });
        };
        let in_scope = |sub: tracing::Dispatch| {
            tracing::dispatcher::with_default(&sub, || {
                let request = RequestLog::new(HeaderValue::from_static("r-1")).enter();
                emit();
                drop(request);
                emit();
            });
        };
        if json {
            in_span(builder().json().with_writer(stock.clone()).finish().into());
            in_scope(
                builder()
                    .json()
                    .map_event_format(LogFormat::json)
                    .with_writer(ours.clone())
                    .finish()
                    .into(),
            );
        } else {
            in_span(builder().with_writer(stock.clone()).finish().into());
            in_scope(
                builder()
                    .event_format(LogFormat::text(
                        fmt::format().without_time().with_level(false),
                    ))
                    .with_writer(ours.clone())
                    .finish()
                    .into(),
            );
        }
        (strip(stock), strip(ours))
    }

    #[test]
    fn lines_read_as_they_did_with_a_request_span() {
        fn emit() {
            tracing::warn!(target: "radixgate::proxy", worker = "http://w", n = 3, "broke off");
            tracing::debug!("plain");
            tracing::error!(target: "t", "quoted \"x\"");
        }
        for json in [false, true] {
            for ansi in [false, true] {
                let (stock, ours) = both(json, ansi, emit);
                assert!(stock.contains("r-1"), "{stock}");
                assert_eq!(ours, stock, "json {json}, ansi {ansi}");
            }
        }
    }

    #[test]
    fn a_json_line_gains_the_request_as_its_outermost_span() {
        let plain = "{\"timestamp\":\"t\",\"level\":\"WARN\",\"fields\":{\"message\":\"m\"},\"target\":\"x\"}\n";
        let line: serde_json::Value =
            serde_json::from_str(&with_request_span(plain, "a\"b")).unwrap();
        assert_eq!(line["span"]["request_id"], "a\"b");
        assert_eq!(line["span"]["name"], "request");
        assert_eq!(line["spans"][0]["request_id"], "a\"b");
        assert_eq!(line["fields"]["message"], "m");
        assert!(with_request_span(plain, "x").ends_with("}\n"));

        let spanned = "{\"level\":\"WARN\",\"span\":{\"k\":1,\"name\":\"inner\"},\"spans\":[{\"k\":1,\"name\":\"inner\"}]}";
        let line: serde_json::Value =
            serde_json::from_str(&with_request_span(spanned, "r")).unwrap();
        assert_eq!(line["span"]["name"], "inner", "the innermost span stays");
        assert_eq!(line["spans"][0]["request_id"], "r");
        assert_eq!(line["spans"][1]["name"], "inner");
    }
}
