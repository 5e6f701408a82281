//! What one client connection is doing, for its header, idle and write
//! timeouts.
//!
//! hyper's own `header_read_timeout` starts whenever an HTTP/1 connection
//! waits for a request head — including the wait for the next request on an
//! idle keep-alive connection — so it cannot tell a slowloris from a
//! well-behaved pooled connection, and it does nothing for HTTP/2 or for a
//! connection that never sends a byte (hyper-util's protocol sniffing waits
//! for one). So the connection's [`Activity`] is tracked here instead, from
//! two sources: [`WatchedIo`] sees every read, and a [`Busy`] guard lives
//! from the moment a request's head is parsed until its response body is
//! dropped. The connection's deadline follows:
//!
//! - a request in flight: none while the router waits for the body or the
//!   worker (the body-read timeout and the request timeout bound those);
//!   `write_timeout` after the client last took any of its answer while
//!   an answer's frame waits for it ([`Sending`]: a client that stops
//!   reading and keeps its connection open would otherwise hold its
//!   request, its admission slot and the worker's stream for as long as
//!   the worker goes on);
//! - HTTP/1 bytes of a next head read since the connection went idle: the
//!   head must be complete `header_read_timeout` after its first byte;
//! - a new connection: its first request head within `header_read_timeout`
//!   of the accept;
//! - otherwise (idle keep-alive, HTTP/2 with no stream open): `idle_timeout`
//!   after its last request ended (an HTTP/2 connection is then sent a
//!   GOAWAY and treated as stopping, [`Activity::idle_h2`]) — or, once the
//!   server is stopping
//!   ([`Activity::stopping`]), `header_read_timeout` after the stop or the
//!   last request's end, whichever is later, if that comes first: an
//!   HTTP/2 connection closes on shutdown only when its client answers the
//!   GOAWAY's PING, and one that answers nothing (a peer gone without a
//!   FIN) would hold the shutdown for its idle timeout or the whole grace
//!   period. (Counted from the last request's end too, since its answer's
//!   last frames may still be buffered for the client when its body drops.)
//!
//! The write deadline is seen from the answers' bodies: one that has handed
//! hyper a frame and has not been asked for the next is waiting for the
//! client (hyper asks for more as soon as it has written, or buffered, what
//! it has), one asked for a frame it does not have yet is waiting for the
//! worker. Over HTTP/2 the connection's streams are seen together: the
//! connection is cut when answers wait for the client and the client has
//! taken none of their frames for the timeout, so a client that stalls one
//! stream while it reads another keeps that one until its request timeout.
//! Only a frame hyper asked past counts as taken: a frame handed on (a new
//! stream's first, the worker's) is the worker moving, not the client, and
//! counting it let a client that took nothing keep its connection, and all
//! its streams, by opening a new stream within every timeout.
//!
//! Concurrency: one connection's state is a `parking_lot::Mutex` touched by
//! its reads, its requests (HTTP/2 streams run as tasks of the same
//! single-threaded runtime) and its watchdog; never held across `.await`.
//! Nothing wakes the watchdog: it sleeps until the deadline it computed, but
//! never longer than the shortest timeout, and then looks again. A
//! deadline that moved earlier meanwhile (a head's first byte) is therefore
//! seen before it passes, and a request costs the watchdog no wake-up and
//! no timer of its own (waking it on a request's head, start and end took
//! three task wake-ups and timer re-arms per request).

use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The first bytes of every HTTP/2 connection (its preface starts so).
const H2_PREFACE_START: &[u8] = b"PRI ";

/// A connection's timeouts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    /// For a request head to arrive.
    pub(crate) header: Duration,
    /// For a connection with no request in flight.
    pub(crate) idle: Duration,
    /// For the client to take any of an answer that waits for it.
    pub(crate) write: Duration,
}

/// One connection's activity; shared by its reads, requests and watchdog.
#[derive(Debug)]
pub(crate) struct Activity {
    state: Mutex<State>,
    /// The answers waiting for the client: bodies that have handed hyper a
    /// frame and not been asked for the next. Atomics apart from `state`,
    /// since they move with every frame of a stream.
    waiting: AtomicU64,
    /// Frames the client has taken in all: handed frames hyper asked past
    /// (wrapping: only compared for a change).
    taken: AtomicU64,
}

#[derive(Debug)]
struct State {
    /// Requests whose response body is not yet dropped.
    in_flight: usize,
    /// The accept, or the end of the last request.
    since: Instant,
    /// When the first byte read while no request was in flight came.
    head_started: Option<Instant>,
    /// Whether any request was made on this connection yet.
    served: bool,
    /// Whether any byte was read yet (the first read decides `h2`).
    read_any: bool,
    /// An HTTP/2 connection (its reads between streams are frames such as
    /// PINGs, not a slow request head).
    h2: bool,
    /// When the server asked the connection to finish, if it has.
    stopping: Option<Instant>,
}

impl Activity {
    /// A connection accepted now.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                in_flight: 0,
                since: Instant::now(),
                head_started: None,
                served: false,
                read_any: false,
                h2: false,
                stopping: None,
            }),
            waiting: AtomicU64::new(0),
            taken: AtomicU64::new(0),
        })
    }

    /// Bytes were read off the connection.
    fn read(&self, bytes: &[u8]) {
        let mut state = self.state.lock();
        if !state.read_any {
            state.read_any = true;
            state.h2 = bytes.starts_with(H2_PREFACE_START);
        }
        if state.in_flight == 0 && state.head_started.is_none() && !state.h2 {
            state.head_started = Some(Instant::now());
        }
    }

    /// A request's head was parsed; it is in flight until the guard drops.
    pub(crate) fn request(self: &Arc<Self>) -> Busy {
        let mut state = self.state.lock();
        state.in_flight += 1;
        state.served = true;
        state.head_started = None;
        drop(state);
        Busy {
            activity: self.clone(),
            handed: false,
        }
    }

    /// The server is stopping: once no request is in flight, the
    /// connection is closed `header` after the stop or the last request's
    /// end (time for its client to take the rest of its last answer, see
    /// the GOAWAY or `Connection: close` and answer a PING).
    pub(crate) fn stopping(&self) {
        self.state.lock().stopping.get_or_insert_with(Instant::now);
    }

    /// Whether the connection is HTTP/2 with no stream open and not yet
    /// told to go: at its idle deadline it is sent a GOAWAY (and a PING)
    /// and [`Activity::stopping`] gives it the header timeout to finish,
    /// rather than being closed with no word. A client that sent a stream
    /// just then learns from the GOAWAY whether it was taken; closed, it
    /// could not tell, and a request without a retry-safe method was
    /// lost.
    pub(crate) fn idle_h2(&self) -> bool {
        let state = self.state.lock();
        state.h2 && state.in_flight == 0 && state.stopping.is_none()
    }

    /// When the connection must be closed, if nothing changes first.
    fn deadline(&self, timeouts: Timeouts) -> Option<Instant> {
        let state = self.state.lock();
        if state.in_flight > 0 {
            return None;
        }
        let idle = match state.stopping {
            // Told to go: its idle time no longer counts (an idle HTTP/2
            // connection is told so when that is up, see `idle_h2`).
            Some(stopped) => stopped.max(state.since) + timeouts.header,
            None => state.since + timeouts.idle,
        };
        let deadline = match state.head_started {
            Some(started) => started + timeouts.header,
            None if state.served => idle,
            None => state.since + timeouts.header,
        };
        Some(match state.stopping {
            Some(stopped) => deadline.min(stopped.max(state.since) + timeouts.header),
            None => deadline,
        })
    }

    /// Completes when the connection has outlived its deadline: a head took
    /// too long, it sat idle too long, or its client took none of an answer
    /// that waited for it for `write` (seen by this watchdog's looks, so
    /// within twice that).
    pub(crate) async fn expired(&self, timeouts: Timeouts) {
        // No deadline can move earlier than a head's (now + `header`), and
        // a stall is seen at a look.
        let look_again = timeouts.header.min(timeouts.idle).min(timeouts.write);
        let mut stall = Stall::default();
        loop {
            let now = Instant::now();
            let deadline = self.deadline(timeouts).or_else(|| {
                let waiting = self.waiting.load(Ordering::Relaxed);
                stall.deadline(
                    waiting,
                    self.taken.load(Ordering::Relaxed),
                    now,
                    timeouts.write,
                )
            });
            let wake = match deadline {
                Some(deadline) if deadline <= now => return,
                Some(deadline) => deadline.min(now + look_again),
                None => now + look_again,
            };
            tokio::time::sleep_until(wake).await;
        }
    }
}

/// The watchdog's view of answers waiting for the client: what
/// [`Activity::taken`] read at the last look, and since when it had not
/// changed while answers waited.
#[derive(Debug, Default)]
struct Stall {
    seen: u64,
    since: Option<Instant>,
}

impl Stall {
    /// When the connection must be cut for a client that takes nothing,
    /// given `waiting` and `taken` read `now`; `None` while no answer waits
    /// for it.
    fn deadline(
        &mut self,
        waiting: u64,
        taken: u64,
        now: Instant,
        write: Duration,
    ) -> Option<Instant> {
        if waiting == 0 {
            self.since = None;
            return None;
        }
        if self.since.is_none() || taken != self.seen {
            self.seen = taken;
            self.since = Some(now);
        }
        self.since.map(|since| since + write)
    }
}

/// A request in flight on a connection; dropped with its response body,
/// which reports its frames to it.
#[derive(Debug)]
pub(crate) struct Busy {
    activity: Arc<Activity>,
    /// The body handed hyper a frame and was not asked for the next yet.
    handed: bool,
}

impl Busy {
    /// The body handed hyper a frame: the client is what it waits for,
    /// until it is asked for the next. Asked while it waited, the frame
    /// before was taken.
    pub(crate) fn handed(&mut self) {
        if self.handed {
            self.activity.taken.fetch_add(1, Ordering::Relaxed);
        } else {
            self.handed = true;
            self.activity.waiting.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The body was asked for a frame it does not have yet (the worker is
    /// what it waits for), or it has ended: a frame it handed was taken.
    pub(crate) fn asked(&mut self) {
        if self.handed {
            self.activity.taken.fetch_add(1, Ordering::Relaxed);
            self.stop_waiting();
        }
    }

    /// The body no longer waits for the client.
    fn stop_waiting(&mut self) {
        if self.handed {
            self.handed = false;
            self.activity.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        // Dropped with a frame handed: cut off (a reset, a closed
        // connection), or its last frame went with the body; either way
        // nothing the client is seen to take.
        self.stop_waiting();
        let mut state = self.activity.state.lock();
        state.in_flight -= 1;
        if state.in_flight == 0 {
            state.since = Instant::now();
        }
    }
}

/// A connection's socket, reporting its reads to the [`Activity`].
pub(crate) struct WatchedIo<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> WatchedIo<T> {
    pub(crate) fn new(inner: T, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WatchedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read(&buf.filled()[before..]);
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WatchedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        header: Duration::from_secs(10),
        idle: Duration::from_secs(120),
        write: Duration::from_secs(60),
    };

    #[tokio::test(start_paused = true)]
    async fn deadlines_follow_the_connection() {
        let activity = Activity::new();
        let start = Instant::now();
        assert_eq!(activity.deadline(T), Some(start + T.header), "fresh");
        tokio::time::advance(Duration::from_secs(3)).await;
        activity.read(b"POST / HTTP/1.1\r\n");
        assert_eq!(
            activity.deadline(T),
            Some(start + Duration::from_secs(13)),
            "a head under way"
        );
        let busy = activity.request();
        activity.read(b"body bytes");
        assert_eq!(activity.deadline(T), None, "in flight");
        tokio::time::advance(Duration::from_secs(500)).await;
        drop(busy);
        let idle = Instant::now();
        assert_eq!(activity.deadline(T), Some(idle + T.idle), "idle");
        activity.read(b"G");
        assert_eq!(activity.deadline(T), Some(idle + T.header), "next head");
    }

    #[tokio::test(start_paused = true)]
    async fn new_answers_handed_on_are_not_the_client_taking_any() {
        let activity = Activity::new();
        let watched = activity.clone();
        let expired = tokio::spawn(async move { watched.expired(T).await });
        let mut streams = Vec::new();
        // A new stream every 10 s, each handed its first frame, none taken.
        for _ in 0..20 {
            let mut busy = activity.request();
            busy.handed();
            streams.push(busy);
            tokio::time::advance(Duration::from_secs(10)).await;
            tokio::task::yield_now().await;
        }
        assert!(expired.is_finished(), "a client that takes nothing is cut");
        expired.await.unwrap();
        drop(streams);
        assert_eq!(activity.waiting.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopping_connection_goes_within_the_header_timeout_once_idle() {
        let activity = Activity::new();
        activity.read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        drop(activity.request());
        let busy = activity.request();
        activity.stopping();
        assert_eq!(activity.deadline(T), None, "a request in flight finishes");
        tokio::time::advance(Duration::from_secs(500)).await;
        drop(busy);
        let ended = Instant::now();
        assert_eq!(
            activity.deadline(T),
            Some(ended + T.header),
            "then the header timeout from its end, not the idle timeout"
        );
        // Idle when the stop came: the header timeout from the stop.
        let idle = Activity::new();
        drop(idle.request());
        tokio::time::advance(Duration::from_secs(30)).await;
        let stopped_idle = Instant::now();
        idle.stopping();
        assert_eq!(idle.deadline(T), Some(stopped_idle + T.header));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_h2_connection_told_to_go_gets_the_header_timeout() {
        let h1 = Activity::new();
        h1.read(b"GET / HTTP/1.1\r\n");
        drop(h1.request());
        assert!(!h1.idle_h2(), "HTTP/1 is closed at its idle deadline");
        let h2 = Activity::new();
        h2.read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        let busy = h2.request();
        assert!(!h2.idle_h2(), "a stream is open");
        drop(busy);
        assert!(h2.idle_h2());
        tokio::time::advance(T.idle).await;
        let told = Instant::now();
        h2.stopping();
        assert!(!h2.idle_h2(), "told once");
        assert_eq!(h2.deadline(T), Some(told + T.header), "not at once");
    }

    #[tokio::test(start_paused = true)]
    async fn h2_frames_between_streams_are_not_a_slow_head() {
        let activity = Activity::new();
        activity.read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        let busy = activity.request();
        drop(busy);
        let idle = Instant::now();
        activity.read(b"ping frame");
        assert_eq!(activity.deadline(T), Some(idle + T.idle));
    }

    #[tokio::test(start_paused = true)]
    async fn expires_only_when_the_deadline_holds() {
        let activity = Activity::new();
        let busy = activity.request();
        let watched = activity.clone();
        let expired = tokio::spawn(async move { watched.expired(T).await });
        tokio::time::advance(Duration::from_secs(1000)).await;
        tokio::task::yield_now().await;
        assert!(
            !expired.is_finished(),
            "a request in flight that waits for its worker never expires"
        );
        drop(busy);
        tokio::time::advance(T.idle - Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        assert!(!expired.is_finished());
        tokio::time::advance(Duration::from_secs(2)).await;
        expired.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_begun_while_idle_expires_on_the_header_timeout() {
        let activity = Activity::new();
        drop(activity.request());
        let watched = activity.clone();
        let expired = tokio::spawn(async move { watched.expired(T).await });
        // Idle for a while (the idle deadline is 120 s away), then a head
        // starts and stalls: it must expire 10 s after its first byte.
        tokio::time::advance(Duration::from_secs(37)).await;
        activity.read(b"POST / HT");
        tokio::time::advance(T.header - Duration::from_millis(1)).await;
        tokio::task::yield_now().await;
        assert!(!expired.is_finished(), "not before the header timeout");
        tokio::time::advance(Duration::from_millis(2)).await;
        tokio::task::yield_now().await;
        assert!(expired.is_finished(), "at the header timeout");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_the_client_takes_none_of_expires_after_the_write_timeout() {
        let activity = Activity::new();
        let mut busy = activity.request();
        let watched = activity.clone();
        let expired = tokio::spawn(async move { watched.expired(T).await });
        let passes = |secs| async move {
            tokio::time::advance(Duration::from_secs(secs)).await;
            tokio::task::yield_now().await;
        };
        // Frames taken as they come: the client keeps up.
        for _ in 0..30 {
            busy.handed();
            passes(5).await;
            busy.handed();
            busy.asked();
            passes(5).await;
        }
        assert!(!expired.is_finished(), "a client that reads is never cut");
        // A frame handed and never asked past: the client takes nothing.
        busy.handed();
        passes(T.write.as_secs() - 11).await;
        assert!(!expired.is_finished());
        // Seen within twice the timeout (the watchdog's looks).
        passes(2 * T.write.as_secs()).await;
        assert!(expired.is_finished(), "a client that takes nothing is cut");
        expired.await.unwrap();
        drop(busy);
        assert_eq!(activity.waiting.load(Ordering::Relaxed), 0);
    }
}
