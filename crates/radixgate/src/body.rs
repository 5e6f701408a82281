//! Reading a request body within three bounds: its size, its time, and the
//! memory all buffered bodies share; and telling a client that left
//! part-way from a body that is broken.
//!
//! - **Size**: a declared `Content-Length` over `max_payload_size` is refused
//!   (413) before a byte is read. Refusing before the body is first polled
//!   also answers `Expect: 100-continue` with the 413 itself: hyper sends
//!   `100 Continue` only when the body is first polled. A body without a
//!   length (chunked) is refused as soon as it grows past the limit.
//! - **End**: a body whose client went away before its end (a connection
//!   closed part-way, an HTTP/2 stream reset) is
//!   [`GatewayError::ClientLeft`], counted as 499, not a bad request (400):
//!   that is for a body whose framing is broken.
//! - **Time**: the whole body must arrive within `body_read_timeout_secs`,
//!   or the client gets 408 — its own fault, never a 504 that blames a
//!   worker.
//! - **Memory**: every buffered byte is reserved from one [`BodyBudget`]
//!   shared by all connections and serving threads (`max_buffered_body_bytes`);
//!   a request that would exceed it gets 503 with `Retry-After` (and
//!   `Connection: close`: the rest of its body is not read). Bytes are
//!   reserved as they arrive, not as declared: a client that declares the
//!   largest body and sends a few bytes holds only those (a few such
//!   connections held the whole budget when a declared length was
//!   reserved whole). A declared length that does not fit in what is left
//!   is refused before a byte is read; a large body's buffer, too, grows
//!   with the bytes that came, up to the declared length.
//!   The reservation is a [`Reservation`] owned by the returned [`Bytes`]
//!   (`Bytes::from_owner`): it goes back to the budget when the last clone
//!   of the body is dropped — after the retries are over and the worker's
//!   copy is sent — and never by hand.
//!
//! Concurrency: the budget is one `AtomicUsize` changed by compare-and-swap;
//! no lock, nothing held across an `.await`.

use crate::error::GatewayError;
use axum::body::Body;
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use http_body_util::BodyExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The bytes of request bodies all requests together may hold. Cheap to
/// clone; clones share the budget.
#[derive(Clone, Debug)]
pub struct BodyBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: usize,
    used: AtomicUsize,
}

/// Bytes taken from a [`BodyBudget`]; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Inner>,
    bytes: usize,
}

impl BodyBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                limit,
                used: AtomicUsize::new(0),
            }),
        }
    }

    /// Reserves `bytes`, or `None` when they would exceed the budget.
    pub fn reserve(&self, bytes: usize) -> Option<Reservation> {
        let mut reservation = Reservation {
            budget: self.inner.clone(),
            bytes: 0,
        };
        reservation.grow(bytes).then_some(reservation)
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.inner.used.load(Ordering::Acquire)
    }

    /// The configured budget.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }
}

impl Reservation {
    /// Takes `more` bytes too; false (and nothing taken) when they would
    /// exceed the budget.
    pub fn grow(&mut self, more: usize) -> bool {
        if more == 0 {
            return true;
        }
        let limit = self.budget.limit;
        let taken = self
            .budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(more).filter(|&total| total <= limit)
            });
        if taken.is_ok() {
            self.bytes += more;
        }
        taken.is_ok()
    }

    /// Bytes this reservation holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A body's bytes with the reservation that pays for them: the owner behind
/// the [`Bytes`] [`read`] returns.
struct Budgeted {
    data: Vec<u8>,
    _reservation: Reservation,
}

impl AsRef<[u8]> for Budgeted {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// The three bounds a body is read within.
#[derive(Clone, Debug)]
pub struct BodyLimits {
    /// Largest body in bytes (`max_payload_size`).
    pub max_size: usize,
    /// Longest the whole body may take to arrive.
    pub timeout: Duration,
    /// The budget shared by all requests.
    pub budget: BodyBudget,
}

/// The declared `Content-Length`, if there is a valid one. hyper has already
/// refused a malformed or conflicting length, so an unreadable one here
/// only means there is none (a chunked body).
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The largest declared length given its whole buffer before its bytes
/// come; a larger body's buffer starts at this once its first bytes
/// come and doubles from there as they do, up to the declared length.
const FIRST_BUFFER: usize = 64 << 10;

/// Reads the whole body within `limits`. Checks the declared length
/// against the size limit and the budget left before polling the body at
/// all, and reserves bytes as they come (see the module doc).
pub async fn read(
    headers: &HeaderMap,
    body: Body,
    limits: &BodyLimits,
) -> Result<Bytes, GatewayError> {
    let too_large = || GatewayError::PayloadTooLarge {
        limit: limits.max_size,
    };
    let exhausted = || GatewayError::BodyBudgetExhausted {
        budget: limits.budget.limit(),
        unread: true,
    };
    let declared = match declared_length(headers) {
        Some(length) => Some(
            usize::try_from(length)
                .ok()
                .filter(|&n| n <= limits.max_size)
                .ok_or_else(too_large)?,
        ),
        None => None,
    };
    let budget = &limits.budget;
    if declared.is_some_and(|n| n > budget.limit().saturating_sub(budget.used())) {
        return Err(exhausted());
    }
    let mut reservation = budget.reserve(0).ok_or_else(exhausted)?;
    // A small declared body gets its buffer at once, as it always did; a
    // large one only as its bytes come.
    let mut data = Vec::with_capacity(declared.filter(|&n| n <= FIRST_BUFFER).unwrap_or(0));
    let collect = async {
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|err| match client_left(&err) {
                true => GatewayError::ClientLeft,
                false => GatewayError::BadBody(err.to_string()),
            })?;
            let Ok(chunk) = frame.into_data() else {
                continue; // trailers: not part of the bytes forwarded
            };
            let total = data.len() + chunk.len();
            if total > limits.max_size {
                return Err(too_large());
            }
            if !reservation.grow(chunk.len()) {
                return Err(exhausted());
            }
            if data.capacity() - data.len() < chunk.len() {
                // Doubling from `FIRST_BUFFER`, but never past a declared
                // length (hyper holds the body to it).
                let doubled = (data.capacity() * 2).max(FIRST_BUFFER).max(total);
                let want = declared.map_or(doubled, |n| doubled.min(n).max(total));
                data.reserve_exact(want - data.len());
            }
            data.extend_from_slice(&chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(limits.timeout, collect).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => return Err(err),
        Err(_) => {
            return Err(GatewayError::BodyTimeout {
                after: limits.timeout,
            });
        }
    }
    Ok(Bytes::from_owner(Budgeted {
        data,
        _reservation: reservation,
    }))
}

/// Whether a body's error is its client going away part-way, not bytes
/// that break HTTP's framing (a bad chunk size, a 400). hyper's error says
/// which: over HTTP/1 it holds the I/O error that ended the connection
/// (an end of file before the body's end, a reset); over HTTP/2 it holds
/// the stream's error (its client reset it, or the connection went) and
/// no I/O error at all. A stream h2 itself reset for broken framing counts
/// as gone too: its client is told by the reset and can get no answer.
fn client_left(err: &axum::Error) -> bool {
    use std::error::Error as _;
    let mut cause = err.source();
    let mut from_hyper = false;
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return from_hyper
                && matches!(
                    io.kind(),
                    std::io::ErrorKind::UnexpectedEof
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::BrokenPipe
                );
        }
        from_hyper |= error.is::<hyper::Error>();
        cause = error.source();
    }
    from_hyper
}

/// `data`, a body the gateway made from one it read (an edit of it), paid
/// for from `budget` like the one read: 503 when it does not fit.
pub fn budgeted(data: Vec<u8>, budget: &BodyBudget) -> Result<Bytes, GatewayError> {
    let reservation = budget
        .reserve(data.len())
        .ok_or(GatewayError::BodyBudgetExhausted {
            budget: budget.limit(),
            unread: false,
        })?;
    Ok(Bytes::from_owner(Budgeted {
        data,
        _reservation: reservation,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_the_budget_and_give_it_back_on_drop() {
        let budget = BodyBudget::new(100);
        let mut a = budget.reserve(60).unwrap();
        assert!(budget.reserve(41).is_none(), "over the budget");
        assert!(!a.grow(41));
        assert_eq!(budget.used(), 60);
        assert!(a.grow(40));
        assert_eq!(budget.used(), 100);
        drop(a);
        assert_eq!(budget.used(), 0);
        assert!(budget.reserve(usize::MAX).is_none());
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn the_bytes_own_the_reservation() {
        let limits = BodyLimits {
            max_size: 10,
            timeout: Duration::from_secs(5),
            budget: BodyBudget::new(15),
        };
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, "8".parse().unwrap());
        let bytes = read(&headers, Body::from("12345678"), &limits)
            .await
            .unwrap();
        assert_eq!(&bytes[..], b"12345678");
        assert_eq!(limits.budget.used(), 8);
        let retry_copy = bytes.clone();
        drop(bytes);
        assert_eq!(limits.budget.used(), 8, "a clone still holds the body");
        // A chunked body that would not fit beside it.
        let chunked = read(&HeaderMap::new(), Body::from("12345678"), &limits).await;
        assert!(matches!(
            chunked,
            Err(GatewayError::BodyBudgetExhausted { .. })
        ));
        drop(retry_copy);
        assert_eq!(limits.budget.used(), 0);
        let chunked = read(&HeaderMap::new(), Body::from("12345678"), &limits).await;
        assert_eq!(chunked.unwrap().len(), 8);
        assert_eq!(limits.budget.used(), 0);
        let long = read(&HeaderMap::new(), Body::from("12345678901"), &limits).await;
        assert!(matches!(
            long,
            Err(GatewayError::PayloadTooLarge { limit: 10 })
        ));
        headers.insert(header::CONTENT_LENGTH, "11".parse().unwrap());
        let declared = read(&headers, Body::from("12345678901"), &limits).await;
        assert!(matches!(
            declared,
            Err(GatewayError::PayloadTooLarge { limit: 10 })
        ));
        assert_eq!(limits.budget.used(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_times_out() {
        let limits = BodyLimits {
            max_size: 100,
            timeout: Duration::from_secs(30),
            budget: BodyBudget::new(100),
        };
        let stalled = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from("{")) })
            .chain(futures::stream::pending());
        let result = read(&HeaderMap::new(), Body::from_stream(stalled), &limits).await;
        assert!(matches!(result, Err(GatewayError::BodyTimeout { .. })));
        assert_eq!(limits.budget.used(), 0);
    }

    /// Bytes are paid for as they come: a declared length holds nothing
    /// before its bytes arrive, and one over what is left is refused
    /// before the body is polled (a polled body here would time out).
    #[tokio::test(start_paused = true)]
    async fn a_declared_length_is_checked_against_the_budget_left_not_reserved() {
        let limits = BodyLimits {
            max_size: 100,
            timeout: Duration::from_secs(30),
            budget: BodyBudget::new(150),
        };
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, "100".parse().unwrap());
        let (sent, rest) = tokio::sync::oneshot::channel::<()>();
        let slow = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from("{")) })
            .chain(futures::stream::once(async {
                let _ = rest.await;
                Ok(Bytes::from(vec![b' '; 99]))
            }));
        let reading = tokio::spawn({
            let (headers, limits) = (headers.clone(), limits.clone());
            async move { read(&headers, Body::from_stream(slow), &limits).await }
        });
        while limits.budget.used() == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(limits.budget.used(), 1, "only the byte that came");
        // 100 declared, 149 left: read.
        let body = Bytes::from(vec![b' '; 100]);
        let other = read(&headers, Body::from(body), &limits).await.unwrap();
        assert_eq!(limits.budget.used(), 101);
        // 100 declared, 49 left: refused at once, the body never polled.
        let never = Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>());
        let refused = read(&headers, never, &limits).await;
        assert!(
            matches!(refused, Err(GatewayError::BodyBudgetExhausted { .. })),
            "{refused:?}"
        );
        drop(other);
        sent.send(()).unwrap();
        let slow = reading.await.unwrap().unwrap();
        assert_eq!(slow.len(), 100);
        assert_eq!(limits.budget.used(), 100);
        drop(slow);
        assert_eq!(limits.budget.used(), 0);
    }

    use futures::StreamExt as _;
}
