//! The response body that carries a request's bookkeeping to its true end.
//!
//! [`WatchedBody`] wraps a worker's response body and passes its frames
//! through one at a time as they arrive: nothing is buffered beyond the frame
//! in hand (and an SSE event's start, below), so a slow client slows the
//! read from the worker (backpressure).
//!
//! It owns a [`StreamWatch`] (the worker's load guard, metrics timers) and
//! hands it exactly one [`StreamEnd`]: when the worker's body ends, when it
//! fails, or — through `Drop` — when the client goes away first. Dropping the
//! body also drops the worker's body, which closes or resets that upstream
//! request, so a cancelled client cancels the work on the worker. Nobody
//! releases load by hand.
//!
//! A worker that dies mid-stream must never look like a finished stream. For
//! an SSE response the body then ends with an explicit error event and no
//! `[DONE]`, in the shape the API's clients look for ([`ErrorEvents`]:
//! `data: {"error": ...}` for the OpenAI-style APIs, `event: error` for the
//! Messages and Responses APIs); if the worker's bytes stopped in the middle
//! of an event, that event is closed first (a blank line), so the error
//! event is one of its own and parses. To that end an SSE body's frames are
//! passed on up to their last whole event, and the unfinished one's bytes
//! wait for the rest of it (at most [`HOLD_AT_MOST`]): a worker that stops
//! in the middle of an event sends the client no half of it, which its
//! parser would fail on before it read the error event. An SSE body that
//! ends cleanly in the middle of an event (a worker whose connection closed,
//! an HTTP/2 reset with no error) ends so too: it is not a complete stream. Any other body
//! ends with an error, so the connection is aborted instead of completing
//! (nothing is appended to a JSON body). The same holds when the worker goes silent for
//! longer than the stall timeout ([`WatchedBody::with_stall_timeout`]), when
//! the request's deadline passes, and when the gateway's shutdown grace
//! period runs out ([`WatchedBody::with_abort`]): the client learns why its
//! stream ended. Whether a response is SSE is the worker's content type's
//! call, never the client's `stream` flag: a worker may answer a streamed
//! request with a JSON error.
//!
//! [`Primed`] puts back the frames the attempt loop read ahead (to know the
//! worker really started: its first token) in front of the rest of the
//! worker's body.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::collections::VecDeque;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

/// The error type of a watched body.
type BoxError = Box<dyn StdError + Send + Sync>;

/// What one poll of a watched body yields.
type Polled = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

/// How a response stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The worker's body ended normally.
    Complete,
    /// The worker's body failed part-way (connection lost, bad framing).
    UpstreamError,
    /// The client stopped reading before the end (disconnect or cancel).
    ClientGone,
    /// The gateway cut the stream: its shutdown grace period ran out.
    Shutdown,
    /// The gateway cut the stream: the request's own timeout ran out
    /// (`server.request_timeout_secs`), whatever the worker was doing.
    TimedOut,
}

/// Bookkeeping that lives exactly as long as a response stream.
pub trait StreamWatch: Send + 'static {
    /// Called once, when the first data frame goes to the client.
    fn first_byte(&mut self) {}
    /// Called with every data frame as it goes to the client (after
    /// [`first_byte`](Self::first_byte) for the first).
    fn data(&mut self, _bytes: &[u8]) {}
    /// Called exactly once, when the stream ends in any way.
    fn finish(self, end: StreamEnd);
}

/// A unit watch that records nothing.
impl StreamWatch for () {
    fn finish(self, _end: StreamEnd) {}
}

/// The shape of the error event an SSE body ends with when it breaks off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrorEvents {
    /// `data: {"error": {"message", "type", "param", "code"}}`: OpenAI's
    /// chat and completions APIs as vLLM and SGLang stream them.
    #[default]
    OpenAi,
    /// `event: error` with `{"type": "error", "error": {"type",
    /// "message"}}`: Anthropic's Messages API (its SDKs raise on that
    /// event only).
    Messages,
    /// `event: error` with `{"type": "error", "code", "message",
    /// "param"}`: OpenAI's Responses API.
    Responses,
}

/// A worker's response body with its [`StreamWatch`].
pub struct WatchedBody<B, W: StreamWatch> {
    inner: B,
    watch: Option<W>,
    sse: bool,
    errors: ErrorEvents,
    /// The last bytes passed on (an SSE body's), to tell whether they end
    /// an event; as if a blank line came before the first.
    last: [u8; 3],
    started: bool,
    /// End-to-end deadline of the request, if any: a worker that stalls
    /// mid-stream must not hold the client (and the load) forever.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Longest silence between frames, and the timer of the current one.
    stall: Option<(std::time::Duration, Pin<Box<tokio::time::Sleep>>)>,
    /// Cancelled when the gateway stops waiting for streams to finish.
    abort: Option<Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>>,
    /// Set once the body has reported its end (or its error event).
    done: bool,
    /// Frames the worker had ready in a row since the deadline was last
    /// looked at.
    ready_in_a_row: u32,
    /// The start of an SSE event not yet whole, held back until it is.
    held: bytes::BytesMut,
}

/// The most of an unfinished SSE event held back; an event longer than this
/// is passed on as it comes.
pub const HOLD_AT_MOST: usize = 1 << 20;

/// Frames a worker may have ready in a row before the request's deadline
/// is looked at again.
const DEADLINE_EVERY: u32 = 16;

impl<B, W: StreamWatch> WatchedBody<B, W> {
    /// Wraps `inner`; `sse` says whether it is an event stream, which decides
    /// how a mid-stream failure is reported.
    pub fn new(inner: B, watch: W, sse: bool) -> Self
    where
        B: Body,
    {
        let mut body = Self {
            inner,
            watch: Some(watch),
            sse,
            errors: ErrorEvents::default(),
            last: *b"\n\n\n",
            started: false,
            deadline: None,
            stall: None,
            abort: None,
            done: false,
            ready_in_a_row: 0,
            held: bytes::BytesMut::new(),
        };
        // A body over before it starts (an empty answer, a 204) is dropped
        // unpolled once its head is written: it is complete now, not a
        // client gone then.
        if body.inner.is_end_stream() {
            body.end(StreamEnd::Complete);
        }
        body
    }

    /// Ends an SSE body that breaks off with `errors`' event.
    pub fn with_error_events(mut self, errors: ErrorEvents) -> Self {
        self.errors = errors;
        self
    }

    /// Ends the body with an error (an SSE error event, or a failed body)
    /// when the worker sends nothing for `after` (counted from now, then
    /// from each frame).
    pub fn with_stall_timeout(mut self, after: std::time::Duration) -> Self {
        self.stall = Some((after, Box::pin(tokio::time::sleep(after))));
        self
    }

    /// Ends the body when `abort` is cancelled (the shutdown grace period
    /// ran out): an SSE error event saying so, or a failed body.
    pub fn with_abort(mut self, abort: tokio_util::sync::CancellationToken) -> Self {
        self.abort = Some(Box::pin(abort.cancelled_owned()));
        self
    }

    /// Ends the body with an error (an SSE error event, or a failed body)
    /// if it is still running at `deadline`.
    pub fn with_deadline(mut self, deadline: tokio::time::Instant) -> Self {
        self.deadline = Some(Box::pin(tokio::time::sleep_until(deadline)));
        self
    }

    /// Ends the stream early because of `err`: an error event for SSE, an
    /// error (aborting the connection) otherwise.
    fn fail(&mut self, err: BoxError, code: &str) -> Polled {
        self.fail_as(StreamEnd::UpstreamError, err, code)
    }

    /// Whether the request's deadline has passed (registering for it when
    /// not).
    fn past_deadline(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline
            .as_mut()
            .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready())
    }

    fn fail_as(&mut self, end: StreamEnd, err: BoxError, code: &str) -> Polled {
        // The type a whole answer's error of the same cause has
        // (`GatewayError`): the router's own shutdown or timeout is not
        // the worker's error.
        let kind = match end {
            StreamEnd::Shutdown => "service_unavailable",
            StreamEnd::TimedOut => "timeout",
            _ => "upstream_error",
        };
        self.end(end);
        if self.sse {
            Poll::Ready(Some(Ok(Frame::data(sse_error_event(
                self.errors,
                self.closing(),
                &err.to_string(),
                (kind, code),
            )))))
        } else {
            Poll::Ready(Some(Err(err)))
        }
    }

    /// What closes the event the passed bytes stopped in, if they stopped
    /// in one: nothing at an event's end (a blank line), one line end after
    /// a whole line, two in the middle of one. (A lone `\r` is followed by
    /// `\n\n`: with it, `\r\n` is one line end, and then a blank line.)
    fn closing(&self) -> &'static str {
        closing_after(self.last)
    }

    /// Notes the end of `data`, passed on.
    fn passed(&mut self, data: &[u8]) {
        self.last = last_three(self.last, data);
    }

    /// Of an SSE body's `data`, what to pass on now: the bytes up to the
    /// end of its last whole event, after what was held back. The rest is
    /// held until its event is whole, unless that makes more than
    /// [`HOLD_AT_MOST`]; `None` when nothing is whole yet.
    fn whole_events(&mut self, data: Bytes) -> Option<Bytes> {
        if self.held.is_empty() {
            // The common case: the frame is passed on as it came, or its
            // tail alone is copied to be held.
            let whole = self.whole_within(&data, 0);
            if whole == data.len() || data.len() - whole > HOLD_AT_MOST {
                return Some(data);
            }
            self.held = bytes::BytesMut::from(&data[whole..]);
            return (whole > 0).then(|| data.slice(..whole));
        }
        // Appended to what is held (its buffer grows as a `Vec` does): an
        // event that comes in many small frames is copied about twice in
        // all, not once per frame as when each frame rebuilt it.
        let scanned = self.held.len();
        self.held.extend_from_slice(&data);
        let whole = self.whole_within(&self.held, scanned);
        let held = self.held.len();
        if whole == held || held - whole > HOLD_AT_MOST {
            return Some(std::mem::take(&mut self.held).freeze());
        }
        (whole > 0).then(|| self.held.split_to(whole).freeze())
    }

    /// Where the last whole event of `data` ends (0 if none does), the
    /// first `scanned` bytes known to end none: whether one ends at a byte
    /// depends only on the bytes before it.
    fn whole_within(&self, data: &[u8], scanned: usize) -> usize {
        (scanned + 1..=data.len())
            .rev()
            .find(|&end| closing_after(last_three(self.last, &data[..end])).is_empty())
            .unwrap_or(0)
    }

    fn end(&mut self, end: StreamEnd) {
        self.done = true;
        if let Some(watch) = self.watch.take() {
            watch.finish(end);
        }
    }
}

/// What closes the event that bytes ending in `last` stopped in (see
/// [`WatchedBody::closing`]); nothing when they end an event.
fn closing_after(last: [u8; 3]) -> &'static str {
    match last {
        [_, b'\n' | b'\r', b'\n' | b'\r'] if last[1..] != *b"\r\n" => "",
        [b'\n' | b'\r', b'\r', b'\n'] => "",
        [_, _, b'\n'] => "\n",
        _ => "\n\n",
    }
}

/// The last three bytes of `before` followed by `data`.
fn last_three(before: [u8; 3], data: &[u8]) -> [u8; 3] {
    match data.len() {
        0 => before,
        1 => [before[1], before[2], data[0]],
        2 => [before[2], data[0], data[1]],
        n => [data[n - 3], data[n - 2], data[n - 1]],
    }
}

/// The SSE event sent when a worker's stream breaks off or times out, after
/// `closing` (what ends an event the worker left unfinished).
/// `(kind, code)`: the OpenAI error's `type` and `code`.
fn sse_error_event(
    errors: ErrorEvents,
    closing: &str,
    message: &str,
    (kind, code): (&str, &str),
) -> Bytes {
    let event = match errors {
        ErrorEvents::OpenAi => {
            let body = serde_json::json!({
                "error": {
                    "message": message,
                    "type": kind,
                    "param": null,
                    "code": code,
                }
            });
            format!("data: {body}\n\n")
        }
        ErrorEvents::Messages => {
            let body = serde_json::json!({
                "type": "error",
                "error": {"type": "api_error", "message": message},
            });
            format!("event: error\ndata: {body}\n\n")
        }
        ErrorEvents::Responses => {
            let body = serde_json::json!({
                "type": "error",
                "code": code,
                "message": message,
                "param": null,
            });
            format!("event: error\ndata: {body}\n\n")
        }
    };
    Bytes::from(format!("{closing}{event}"))
}

impl<B, W> Body for WatchedBody<B, W>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
    W: StreamWatch + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(abort) = this.abort.as_mut()
            && abort.as_mut().poll(cx).is_ready()
        {
            let err = "the gateway shut down before the worker finished answering";
            return this.fail_as(StreamEnd::Shutdown, err.into(), "shutting_down");
        }
        // A frame holding no whole event is held, and the next one read.
        loop {
            // The deadline, whenever the worker has no frame ready, and
            // every DEADLINE_EVERY frames it had ready in a row: a fast
            // worker read by a slow client always has its next frame
            // buffered. (Not before every frame: polling the timer that
            // often cost a streamed request 2.5% more instructions,
            // bench/instr_cost.py --stream.)
            if this.ready_in_a_row >= DEADLINE_EVERY {
                this.ready_in_a_row = 0;
                if this.past_deadline(cx) {
                    let err = "the request timed out while the worker was still answering";
                    return this.fail_as(StreamEnd::TimedOut, err.into(), "request_timeout");
                }
            }
            let polled = Pin::new(&mut this.inner).poll_frame(cx);
            if polled.is_pending() {
                this.ready_in_a_row = 0;
                if this.past_deadline(cx) {
                    let err = "the request timed out while the worker was still answering";
                    return this.fail_as(StreamEnd::TimedOut, err.into(), "request_timeout");
                }
                if let Some((after, timer)) = this.stall.as_mut()
                    && timer.as_mut().poll(cx).is_ready()
                {
                    let err = format!("the worker's stream stalled: nothing for {after:?}");
                    return this.fail(err.into(), "stream_stalled");
                }
                return Poll::Pending;
            }
            this.ready_in_a_row += 1;
            if let Some((after, timer)) = this.stall.as_mut() {
                let next = tokio::time::Instant::now() + *after;
                timer.as_mut().reset(next);
            }
            let frame = match ready!(polled) {
                Some(Ok(frame)) if this.sse && frame.is_data() => {
                    let data = frame.into_data().unwrap_or_default();
                    match this.whole_events(data) {
                        Some(whole) => Frame::data(whole),
                        None => continue,
                    }
                }
                Some(Ok(frame)) => frame,
                Some(Err(err)) => {
                    let err: Self::Error = err.into();
                    let message = format!("the worker's stream broke off: {err}");
                    return this.fail(message.into(), "stream_interrupted");
                }
                None if this.sse && (!this.held.is_empty() || !this.closing().is_empty()) => {
                    let err = "the worker's stream ended in the middle of an event";
                    return this.fail(err.into(), "stream_incomplete");
                }
                None => {
                    this.end(StreamEnd::Complete);
                    return Poll::Ready(None);
                }
            };
            if let Some(data) = frame.data_ref() {
                if this.sse {
                    this.passed(data);
                }
                if let Some(watch) = this.watch.as_mut() {
                    if !this.started {
                        this.started = true;
                        watch.first_byte();
                    }
                    watch.data(data);
                }
            }
            // A body of known length is over with its last byte, and hyper
            // drops it then, unpolled: it ends complete here, not as a
            // client gone at the drop.
            let event_open = this.sse && (!this.held.is_empty() || !this.closing().is_empty());
            if this.inner.is_end_stream() && !event_open {
                this.end(StreamEnd::Complete);
            }
            return Poll::Ready(Some(Ok(frame)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        if self.sse {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

/// A worker's body with its first frames, already read, put back in front.
pub struct Primed<B: Body> {
    read: VecDeque<Frame<Bytes>>,
    /// Where reading ahead ([`Self::read_ahead`]) met the body's error:
    /// given after the frames read, as the body gave it.
    broke: Option<B::Error>,
    rest: B,
}

impl<B: Body> Primed<B> {
    /// `read` (the frames read ahead, in order) followed by the rest of
    /// `rest`.
    pub fn new(read: Vec<Frame<Bytes>>, rest: B) -> Self {
        Self {
            read: read.into(),
            broke: None,
            rest,
        }
    }

    /// The first frame's data, until it is read.
    pub fn first_data(&self) -> Option<&[u8]> {
        self.read.front()?.data_ref().map(|data| &data[..])
    }

    /// The data of the frames read ahead, joined.
    pub fn held(&self) -> Vec<u8> {
        let data = self.read.iter().filter_map(Frame::data_ref);
        data.flat_map(|d| d.iter().copied()).collect()
    }
}

impl<B: Body<Data = Bytes> + Unpin> Primed<B> {
    /// Reads the body ahead until at least `limit` bytes are held, or it
    /// ends or breaks; what is read stays in front, to be read as before
    /// (a break too). Dropped before its end, it keeps what it read.
    pub async fn read_ahead(&mut self, limit: usize) {
        use http_body_util::BodyExt;
        let mut held: usize = (self.read.iter().filter_map(Frame::data_ref))
            .map(Bytes::len)
            .sum();
        while held < limit && self.broke.is_none() {
            match self.rest.frame().await {
                Some(Ok(frame)) => {
                    held += frame.data_ref().map_or(0, Bytes::len);
                    self.read.push_back(frame);
                }
                Some(Err(err)) => self.broke = Some(err),
                None => return,
            }
        }
    }
}

impl<B> Body for Primed<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(frame) = this.read.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(err) = this.broke.take() {
            return Poll::Ready(Some(Err(err)));
        }
        Pin::new(&mut this.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty() && self.broke.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.rest.size_hint();
        let n: u64 = self
            .read
            .iter()
            .filter_map(Frame::data_ref)
            .map(|data| data.len() as u64)
            .sum();
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + n);
        }
        hint.set_lower(hint.lower() + n);
        hint
    }
}

impl<B, W: StreamWatch> Drop for WatchedBody<B, W> {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.finish(StreamEnd::ClientGone);
        }
    }
}

#[cfg(test)]
mod tests;
