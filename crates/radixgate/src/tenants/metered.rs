//! A tenant's response body: passed through frame by frame, unchanged, while
//! its tail is kept for the usage scan ([`crate::usage`]); the tokens found
//! are charged to the tenant and counted in its metrics once, when the body
//! ends.
//!
//! "Ends" is the earliest sure point: a body of known length is done when
//! its last byte passes, before that frame is handed on, so the charge lands
//! before the client can send its next request; a chunked body (a stream)
//! when its end is read; a body the client drops, when it is dropped.

use super::Tenant;
use crate::state::Shared;
use crate::usage::UsageTail;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

/// A response body that charges its tenant for the tokens it reports.
pub(crate) struct Metered<B> {
    inner: B,
    tail: UsageTail,
    /// The body's length when it is known in advance.
    length: Option<u64>,
    seen: u64,
    /// Who to charge; taken when charged.
    charge: Option<(Arc<Tenant>, Arc<Shared>)>,
}

impl<B: Body> Metered<B> {
    pub(crate) fn new(inner: B, tenant: Arc<Tenant>, shared: Arc<Shared>) -> Self {
        let length = inner.size_hint().exact();
        Self {
            inner,
            tail: UsageTail::new(),
            length,
            seen: 0,
            charge: Some((tenant, shared)),
        }
    }
}

impl<B> Metered<B> {
    fn finish(&mut self) {
        let Some((tenant, shared)) = self.charge.take() else {
            return;
        };
        if let Some(tokens) = self.tail.tokens() {
            tenant.charge(tokens);
            shared.tenant_metrics.tokens(tenant.name(), tokens);
        }
    }
}

impl<B> Body for Metered<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.tail.push(data);
                    this.seen += data.len() as u64;
                    if this.length == Some(this.seen) {
                        this.finish();
                    }
                }
            }
            Some(Err(_)) | None => this.finish(),
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Metered<B> {
    fn drop(&mut self) {
        self.finish();
    }
}
