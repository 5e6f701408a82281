//! The API server's answers, held to a size and a time: a layer in the
//! kube client's stack that fails an answer's body once it passes its
//! bound, or once it has not ended in time.
//!
//! kube reads a list answer (and an error's) whole into memory, and a
//! watch's line by line with no limit on a line, so an API server that
//! sent an endless answer, or one that never ended its line, grew the
//! router's memory until it was killed. Now a list (or any answer but a
//! watch) may be [`MAX_LIST_BYTES`] long, and each line of a watch, which
//! is one event, [`MAX_EVENT_BYTES`]: an object the API server stores is
//! at most a few MiB (etcd's request limit, 1.5 MiB by default), and a
//! page of a list at most 500 of them (kube-runtime's page size), when the
//! API server pages it.
//!
//! The connection's read timeout ends an answer only when it goes silent:
//! one that trickled a byte now and then never ended, and the watch
//! waited on it for good. Now every answer, headers and body, must be over
//! within the client's deadline of being asked, longer than a watch is
//! asked to stay open.
//!
//! An answer past a bound fails as any broken answer does: the watcher
//! retries with back-off, the router keeps the workers it knows, and the
//! WARN says which bound.
//!
//! The layer also tells its pool's watch when the API server accepts a
//! watch (its headers, a success): kube-runtime's watcher says nothing of
//! a watch resumed after an outage until a pod changes, so without it the
//! watch read as disconnected for as long as the pods stayed as they were.

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

/// The most a list answer (or any answer but a watch) may be.
pub(super) const MAX_LIST_BYTES: usize = 64 << 20;

/// The most one line of a watch, one event, may be.
pub(super) const MAX_EVENT_BYTES: usize = 16 << 20;

/// An answer passed a bound.
#[derive(Debug, thiserror::Error)]
pub(super) enum Overrun {
    /// A list answer (or an error's) passed [`MAX_LIST_BYTES`].
    #[error("the API server's answer is over {} MiB; given up on", MAX_LIST_BYTES >> 20)]
    List,
    /// A watch line passed [`MAX_EVENT_BYTES`].
    #[error("a watch event from the API server is over {} MiB; given up on", MAX_EVENT_BYTES >> 20)]
    Event,
    /// The answer was not over in time.
    #[error("the API server's answer did not end within {0:?} of the request; given up on")]
    Late(Duration),
}

/// The layer: each answer's body bounded, a watch's per line, and each
/// answer over within `deadline`; `answered` told of each watch accepted.
#[derive(Clone, Debug)]
pub(super) struct Bounded {
    pub(super) deadline: Duration,
    pub(super) answered: Arc<Notify>,
}

impl<S> Layer<S> for Bounded {
    type Service = BoundedService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BoundedService {
            inner,
            deadline: self.deadline,
            answered: self.answered.clone(),
        }
    }
}

/// The client's service, its answers bounded.
#[derive(Clone, Debug)]
pub(super) struct BoundedService<S> {
    inner: S,
    deadline: Duration,
    answered: Arc<Notify>,
}

impl<S, B, R> Service<Request<R>> for BoundedService<S>
where
    S: Service<Request<R>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = Response<BoundedBody<B>>;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<R>) -> Self::Future {
        let watch = is_watch(&request);
        let within = self.deadline;
        let deadline = Instant::now() + within;
        let answer = self.inner.call(request);
        let answered = self.answered.clone();
        Box::pin(async move {
            let response = match tokio::time::timeout_at(deadline, answer).await {
                Ok(response) => response.map_err(Into::into)?,
                Err(_) => return Err(Overrun::Late(within).into()),
            };
            if watch && response.status().is_success() {
                answered.notify_one();
            }
            Ok(response.map(|body| BoundedBody {
                inner: body,
                watch,
                seen: 0,
                deadline: Box::pin(tokio::time::sleep_until(deadline)),
                within,
                failed: false,
            }))
        })
    }
}

/// Whether the request is a watch (`watch=true`, as kube asks it).
fn is_watch<R>(request: &Request<R>) -> bool {
    request.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1"))
    })
}

/// An answer's body that fails once past its bound.
#[derive(Debug)]
pub(super) struct BoundedBody<B> {
    inner: B,
    /// A watch: bounded per line, not in all.
    watch: bool,
    /// Bytes so far: in all, or a watch's since its last newline.
    seen: usize,
    /// When the answer must be over by, `within` of the request.
    deadline: Pin<Box<Sleep>>,
    within: Duration,
    /// Past its bound: nothing more is read.
    failed: bool,
}

impl<B> BoundedBody<B> {
    /// Counts `data`; the error once past the bound.
    fn count(&mut self, data: &[u8]) -> Result<(), Overrun> {
        if !self.watch {
            self.seen = self.seen.saturating_add(data.len());
            return match self.seen > MAX_LIST_BYTES {
                true => Err(Overrun::List),
                false => Ok(()),
            };
        }
        let mut lines = data.split(|b| *b == b'\n');
        // The first piece goes on with the line already begun.
        let mut line = self.seen + lines.next().map_or(0, <[u8]>::len);
        for next in lines {
            if line > MAX_EVENT_BYTES {
                break;
            }
            line = next.len();
        }
        self.seen = line;
        match line > MAX_EVENT_BYTES {
            true => Err(Overrun::Event),
            false => Ok(()),
        }
    }
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        // Before the body: one that always has more must still end.
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.failed = true;
            return Poll::Ready(Some(Err(Overrun::Late(self.within).into())));
        }
        let frame = match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(err)) => return Poll::Ready(Some(Err(err.into()))),
            None => return Poll::Ready(None),
        };
        if let Some(data) = frame.data_ref()
            && let Err(err) = self.count(data)
        {
            self.failed = true;
            return Poll::Ready(Some(Err(err.into())));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(watch: bool) -> BoundedBody<()> {
        BoundedBody {
            inner: (),
            watch,
            seen: 0,
            deadline: Box::pin(tokio::time::sleep(Duration::ZERO)),
            within: Duration::ZERO,
            failed: false,
        }
    }

    #[tokio::test]
    async fn a_list_is_bounded_in_all() {
        let mut list = body(false);
        let chunk = vec![b'\n'; 1 << 20];
        for _ in 0..MAX_LIST_BYTES >> 20 {
            assert!(list.count(&chunk).is_ok());
        }
        assert!(matches!(list.count(b"x"), Err(Overrun::List)));
    }

    #[tokio::test]
    async fn a_watch_is_bounded_per_line() {
        let mut watch = body(true);
        let long = vec![b'x'; MAX_EVENT_BYTES - 1];
        // Many lines just under the bound, newlines in any place.
        for _ in 0..8 {
            assert!(watch.count(&long).is_ok());
            assert!(watch.count(b"x\nyy").is_ok());
            assert_eq!(watch.seen, 2);
            assert!(watch.count(&long[2..]).is_ok());
            assert!(watch.count(b"z\n").is_ok());
        }
        // A line past it, in one chunk or across many.
        let mut over = vec![b'x'; MAX_EVENT_BYTES + 1];
        over.push(b'\n');
        assert!(matches!(body(true).count(&over), Err(Overrun::Event)));
        let mut watch = body(true);
        assert!(watch.count(b"{}\n").is_ok());
        assert!(watch.count(&long).is_ok());
        assert!(matches!(watch.count(b"xx\n{}\n"), Err(Overrun::Event)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_not_over_in_time_fails_even_while_it_sends() {
        use http_body_util::{BodyExt as _, StreamBody};
        let within = Duration::from_secs(2);
        let mut body = BoundedBody {
            inner: StreamBody::new(futures::stream::repeat_with(|| {
                Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b" ")))
            })),
            watch: false,
            seen: 0,
            deadline: Box::pin(tokio::time::sleep(within)),
            within,
            failed: false,
        };
        for _ in 0..100 {
            assert!(body.frame().await.unwrap().is_ok());
        }
        tokio::time::advance(within).await;
        let err = body.frame().await.unwrap().unwrap_err().to_string();
        assert!(err.contains("did not end within 2s"), "{err}");
        assert!(body.frame().await.is_none());
    }

    #[test]
    fn only_watch_requests_are_watches() {
        let request = |uri: &str| Request::get(uri).body(()).unwrap();
        assert!(is_watch(&request(
            "/api/v1/namespaces/llm/pods?&watch=true&timeoutSeconds=290"
        )));
        assert!(is_watch(&request("/api/v1/pods?watch=1")));
        assert!(!is_watch(&request(
            "/api/v1/pods?limit=500&labelSelector=watch%3Dtrue"
        )));
        assert!(!is_watch(&request("/api/v1/pods")));
    }
}
