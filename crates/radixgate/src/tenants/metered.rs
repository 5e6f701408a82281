//! A tenant's response body: passed through frame by frame, while its tail
//! is kept for the usage scan ([`crate::usage`]); the tokens found are
//! charged to the tenant and counted in its metrics once, when the body
//! ends. For a tenant with a token limit ([`Metering`]), an answer that
//! reports none is charged an estimate, one cut short at least its prompt
//! and the output it was sent, and a usage event asked for in the client's
//! stead is taken out ([`UsageEventFilter`]); every other body passes
//! unchanged.
//!
//! A stream whose first event (after a Responses or Messages preamble) is
//! an error event is a refusal, not an answer: a worker that turns a
//! request down under a 200 (SGLang streams a prompt too long for the
//! model so) generated nothing. It is charged only what it reports, as
//! the same refusal answered whole (a 4xx) is, not the estimate of a
//! prompt no worker read. An error event the gateway ends a stream with
//! is not the worker's refusal.
//!
//! An answer about a stored Responses API response (its create, a read
//! by its id) is charged only the tokens not charged for that response
//! before ([`crate::responses::charged`]): reading it again costs nothing.
//!
//! "Ends" is the earliest sure point: a body of known length (or one that
//! says it has ended) is done when its last byte passes, before that frame
//! is handed on, so the charge lands before the client can send its next
//! request; a chunked body (a stream) when its end is read; a body the
//! client drops, when it is dropped (cut short).

use super::usage_event::UsageEventFilter;
use super::{Metering, Tenant};
use crate::preamble::Preamble;
use crate::responses::charged::StoredAnswer;
use crate::state::Shared;
use crate::usage::{ItemReports, Output, UsageTail};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

/// The most tokens one answer is taken to report: more is a worker's lie
/// (the trace recorder's bound on a prompt, 2^24, well past any context
/// window).
const MAX_REPORTED_TOKENS: u64 = crate::record::line::MAX_INPUT_TOKENS;

/// The most of a stream read for its first event past any preamble (a
/// few hundred bytes, as a rule): one that has not begun by then is taken
/// for an answer.
const OPENING_LIMIT: usize = 64 * 1024;

/// A response body that charges its tenant for the tokens it reports.
pub(crate) struct Metered<B> {
    inner: B,
    tail: UsageTail,
    /// A `/generate` batch's items: one report each, more than the tail
    /// holds. Read on a `/generate` answer only.
    items: Option<ItemReports>,
    /// The body's length when it is known in advance.
    length: Option<u64>,
    seen: u64,
    /// Who to charge; taken when charged.
    charge: Option<(Arc<Tenant>, Arc<Shared>)>,
    /// A metered answer: its estimate, counted as it passes.
    estimate: Option<(Metering, Output)>,
    /// Takes out the usage event the client did not ask for.
    filter: Option<UsageEventFilter>,
    /// The inner body has ended (what the filter held is being passed on).
    ended: bool,
    /// The stored response the answer is about, charged once.
    stored: Option<StoredAnswer>,
    /// A metered stream's scan for its first event past any preamble,
    /// until it is found.
    opening: Option<Preamble>,
    /// That first event is an error event: the worker refused the request.
    refused: bool,
}

impl<B: Body> Metered<B> {
    /// `metering` for a worker's successful answer to a tenant with a token
    /// limit; `sse` whether it is an event stream; `generate` whether it
    /// answers SGLang's `/generate` (its batch items' reports are read);
    /// `stored` the stored response it is about, if any.
    pub(crate) fn new(
        inner: B,
        tenant: Arc<Tenant>,
        shared: Arc<Shared>,
        metering: Option<Metering>,
        sse: bool,
        generate: bool,
        stored: Option<StoredAnswer>,
    ) -> Self {
        let filter = metering
            .as_ref()
            .filter(|m| m.strip_usage_event && sse)
            .map(|_| UsageEventFilter::new());
        // Filtered, the length changes: none is promised.
        let length = inner.size_hint().exact().filter(|_| filter.is_none());
        let opening = (metering.is_some() && sse).then(Preamble::default);
        Self {
            inner,
            tail: UsageTail::new(),
            items: generate.then(ItemReports::new),
            length,
            seen: 0,
            charge: Some((tenant, shared)),
            estimate: metering.map(|m| {
                let output = Output {
                    sse,
                    ..Output::default()
                };
                (m, output)
            }),
            filter,
            ended: false,
            stored,
            opening,
            refused: false,
        }
    }
}

impl<B> Metered<B> {
    /// Charges the answer, `whole` when its body ended, not cut short (its
    /// client gone, its worker failed).
    fn finish(&mut self, whole: bool) {
        let Some((tenant, shared)) = self.charge.take() else {
            return;
        };
        // An event stream the gateway ended early (its worker broke off)
        // ends with an error event and looks whole from here.
        let cut = self.estimate.as_ref().is_some_and(|(m, _)| m.was_cut());
        let whole = whole && !cut;
        // A refusal is charged what it reports alone (see the module doc).
        let refused = self.refused && !cut;
        // A count no answer can have is a worker's lie: charged as an
        // answer that reports none, not a debt no tenant could pay back.
        let plausible = |n: &u64| *n <= MAX_REPORTED_TOKENS;
        let reported = self
            .items
            .as_ref()
            .and_then(ItemReports::tokens)
            .or_else(|| self.tail.tokens());
        let reported = reported.filter(|n| {
            if !plausible(n) {
                tracing::warn!(
                    tokens = n,
                    tenant = tenant.name(),
                    "a worker reported more tokens than any answer has; charged as unreported"
                );
            }
            plausible(n)
        });
        // An answer cut short may have reported its prompt alone (an
        // Anthropic stream counts its output only in its last events): its
        // output is charged as sent, past what was reported of it.
        let estimate = match &self.estimate {
            Some((metering, output)) if !refused && (reported.is_none() || !whole) => {
                let prompt = self.tail.usage().counts.prompt.filter(plausible);
                Some(
                    prompt
                        .unwrap_or(metering.prompt_tokens)
                        .saturating_add(metering.output_tokens(output)),
                )
            }
            _ => None,
        };
        let tokens = match (reported, estimate) {
            (Some(reported), Some(estimate)) => Some(reported.max(estimate)),
            (reported, estimate) => reported.or(estimate),
        };
        // A stored response's tokens, once: an answer about one owes only
        // what was not charged for it before.
        let tokens = match (tokens, self.stored.as_ref().and_then(StoredAnswer::id)) {
            (Some(tokens), Some(id)) => Some(shared.responses.charge(id, tokens)),
            (tokens, _) => tokens,
        };
        if let Some(tokens) = tokens {
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
        loop {
            if this.ended {
                let rest = this.filter.as_mut().map(UsageEventFilter::finish);
                this.filter = None;
                return Poll::Ready(rest.filter(|r| !r.is_empty()).map(|r| Ok(Frame::data(r))));
            }
            let polled = ready!(Pin::new(&mut this.inner).poll_frame(cx));
            let data = match &polled {
                Some(Ok(frame)) => frame.data_ref(),
                Some(Err(_)) => {
                    this.finish(false);
                    return Poll::Ready(polled);
                }
                None => {
                    this.finish(true);
                    this.ended = true;
                    continue;
                }
            };
            let Some(data) = data else {
                return Poll::Ready(polled);
            };
            this.tail.push(data);
            if let Some(scan) = &mut this.opening {
                if scan.feed(data) {
                    this.refused = scan.found_error();
                    this.opening = None;
                } else if this.seen >= OPENING_LIMIT as u64 {
                    this.opening = None;
                }
            }
            if let Some(items) = &mut this.items {
                items.push(data);
            }
            this.seen += data.len() as u64;
            if let Some((_, output)) = &mut this.estimate {
                output.frame(data);
            }
            // A body that says it has ended is not polled again (hyper
            // drops it): its last byte is its end, not a client leaving.
            if this.length == Some(this.seen) || this.inner.is_end_stream() {
                this.finish(true);
            }
            let Some(filter) = &mut this.filter else {
                return Poll::Ready(polled);
            };
            let passed = filter.push(data);
            if !passed.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(passed))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.filter.is_none()
            || self.inner.is_end_stream() && !self.filter.as_ref().is_some_and(|f| f.holds())
    }

    fn size_hint(&self) -> SizeHint {
        if self.filter.is_some() {
            return SizeHint::default();
        }
        self.inner.size_hint()
    }
}

impl<B> Drop for Metered<B> {
    fn drop(&mut self) {
        self.finish(false);
    }
}
