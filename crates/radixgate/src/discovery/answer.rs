//! The API server's answers, held to a size: a layer in the kube client's
//! stack that fails an answer's body once it passes its bound.
//!
//! kube reads a list answer (and an error's) whole into memory, and a
//! watch's line by line with no limit on a line, so an API server that
//! sent an endless answer, or one that never ended its line, grew the
//! router's memory until it was killed. Now a list (or any answer but a
//! watch) may be [`MAX_LIST_BYTES`] long, and each line of a watch, which
//! is one event, [`MAX_EVENT_BYTES`]: an object the API server stores is
//! at most a few MiB (etcd's request limit, 1.5 MiB by default), and a
//! page of a list at most 500 of them (kube-runtime's page size), when the
//! API server pages it. An answer past its bound fails as any broken
//! answer does: the watcher retries with back-off, the router keeps the
//! workers it knows, and the WARN says which bound.

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tower::{BoxError, Layer, Service};

/// The most a list answer (or any answer but a watch) may be.
pub(super) const MAX_LIST_BYTES: usize = 64 << 20;

/// The most one line of a watch, one event, may be.
pub(super) const MAX_EVENT_BYTES: usize = 16 << 20;

/// An answer passed its bound.
#[derive(Debug, thiserror::Error)]
pub(super) enum TooLarge {
    /// A list answer (or an error's) passed [`MAX_LIST_BYTES`].
    #[error("the API server's answer is over {} MiB; given up on", MAX_LIST_BYTES >> 20)]
    List,
    /// A watch line passed [`MAX_EVENT_BYTES`].
    #[error("a watch event from the API server is over {} MiB; given up on", MAX_EVENT_BYTES >> 20)]
    Event,
}

/// The layer: each answer's body bounded, a watch's per line.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Bounded;

impl<S> Layer<S> for Bounded {
    type Service = BoundedService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BoundedService { inner }
    }
}

/// The client's service, its answers bounded.
#[derive(Clone, Debug)]
pub(super) struct BoundedService<S> {
    inner: S,
}

impl<S, B, R> Service<Request<R>> for BoundedService<S>
where
    S: Service<Request<R>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<BoundedBody<B>>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<R>) -> Self::Future {
        let watch = is_watch(&request);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| BoundedBody {
                inner: body,
                watch,
                seen: 0,
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
    /// Past its bound: nothing more is read.
    failed: bool,
}

impl<B> BoundedBody<B> {
    /// Counts `data`; the error once past the bound.
    fn count(&mut self, data: &[u8]) -> Result<(), TooLarge> {
        if !self.watch {
            self.seen = self.seen.saturating_add(data.len());
            return match self.seen > MAX_LIST_BYTES {
                true => Err(TooLarge::List),
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
            true => Err(TooLarge::Event),
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
            failed: false,
        }
    }

    #[test]
    fn a_list_is_bounded_in_all() {
        let mut list = body(false);
        let chunk = vec![b'\n'; 1 << 20];
        for _ in 0..MAX_LIST_BYTES >> 20 {
            assert!(list.count(&chunk).is_ok());
        }
        assert!(matches!(list.count(b"x"), Err(TooLarge::List)));
    }

    #[test]
    fn a_watch_is_bounded_per_line() {
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
        assert!(matches!(body(true).count(&over), Err(TooLarge::Event)));
        let mut watch = body(true);
        assert!(watch.count(b"{}\n").is_ok());
        assert!(watch.count(&long).is_ok());
        assert!(matches!(watch.count(b"xx\n{}\n"), Err(TooLarge::Event)));
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
