//! What became of each exported span: sent to the collector, or dropped
//! (the queue was full, or the post of its batch failed), counted so that
//! `/metrics` shows spans being lost (`radixgate_otlp_spans_total`).
//!
//! The SDK's batch processor drops a span silently when its queue is full
//! (its one warning goes to the SDK's internal log, which is not built
//! in), and keeps no count anyone can read. So the queue's bound is kept
//! here, in front of it ([`Gate`]): a span ending takes a place (one
//! atomic add) or is counted dropped; a batch frees its places as it is
//! handed to the exporter ([`Counted`]), whose answer counts the batch
//! exported or dropped. A place is taken before the span enters the
//! processor's channel and freed after it left it, so the channel (as
//! long as the bound) never holds more than the places taken and never
//! drops a span itself.
//!
//! Concurrency: one exporter per process (the `tracing` subscriber is
//! global), so the counts are process-wide atomics ([`COUNTS`]); each
//! gateway's upkeep tick publishes them ([`SpanMetrics`]) while export is
//! on.

use crate::metrics::{Describe, Family, Metrics};
use ::metrics::{Counter, Label};
use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

const SPANS: Describe = Describe::new(
    "radixgate_otlp_spans_total",
    "Spans of the OTLP export by what became of them: exported (the collector accepted their batch), dropped_queue_full (the export queue was full), dropped_export_failed (their batch's post failed, retries included).",
);

/// The process's counts.
pub(super) static COUNTS: Counts = Counts::new();

/// Spans waiting for export, and what became of the others.
#[derive(Debug)]
pub(super) struct Counts {
    /// Places taken in the export queue.
    queued: AtomicUsize,
    exported: AtomicU64,
    queue_full: AtomicU64,
    export_failed: AtomicU64,
}

impl Counts {
    const fn new() -> Self {
        Self {
            queued: AtomicUsize::new(0),
            exported: AtomicU64::new(0),
            queue_full: AtomicU64::new(0),
            export_failed: AtomicU64::new(0),
        }
    }

    /// Takes a place for a span in a queue of `bound`; false (and the
    /// span counted dropped) when there is none.
    fn enter(&self, bound: usize) -> bool {
        // A load first: while the queue stays full, a dropped span costs
        // a shared read and one add, not a write and its undoing.
        let taken = self.queued.load(Ordering::Relaxed) < bound
            && match self.queued.fetch_add(1, Ordering::AcqRel) < bound {
                true => true,
                false => {
                    self.queued.fetch_sub(1, Ordering::AcqRel);
                    false
                }
            };
        if !taken {
            self.queue_full.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// `n` spans left the queue for the exporter.
    fn leave(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The SDK's batch processor behind a queue bound kept here.
#[derive(Debug)]
pub(super) struct Gate<P> {
    inner: P,
    bound: usize,
}

impl<P> Gate<P> {
    /// At most `bound` spans queued in `inner`, whose own queue must be
    /// at least as long.
    pub(super) fn new(inner: P, bound: usize) -> Self {
        Self { inner, bound }
    }
}

impl<P: SpanProcessor> SpanProcessor for Gate<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if COUNTS.enter(self.bound) {
            self.inner.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter, counting each batch by its answer.
#[derive(Debug)]
pub(super) struct Counted<E>(pub(super) E);

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        COUNTS.leave(n);
        let result = self.0.export(batch).await;
        let outcome = match result {
            Ok(()) => &COUNTS.exported,
            Err(_) => &COUNTS.export_failed,
        };
        outcome.fetch_add(n as u64, Ordering::Relaxed);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

/// `radixgate_otlp_spans_total`, published from [`COUNTS`].
pub(crate) struct SpanMetrics(Family<&'static str, Counter>);

impl SpanMetrics {
    /// The family, at its counts now (every outcome from the start, so
    /// that an alert on a rate has a series to read).
    pub(crate) fn new(metrics: &Metrics) -> Self {
        let this = Self(metrics.counters(&SPANS));
        this.publish();
        this
    }

    /// Publishes the counts now.
    pub(crate) fn publish(&self) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (outcome, total) in [
            ("exported", get(&COUNTS.exported)),
            ("dropped_queue_full", get(&COUNTS.queue_full)),
            ("dropped_export_failed", get(&COUNTS.export_failed)),
        ] {
            self.0.with(
                &outcome,
                || outcome,
                || vec![Label::new("outcome", outcome)],
                |c| c.absolute(total),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_and_counts_until_a_batch_leaves() {
        let counts = Counts::new();
        assert!(counts.enter(2) && counts.enter(2));
        assert!(!counts.enter(2) && !counts.enter(2));
        assert_eq!(counts.queue_full.load(Ordering::Relaxed), 2);
        assert_eq!(counts.queued.load(Ordering::Relaxed), 2);
        counts.leave(2);
        assert!(counts.enter(2));
        assert_eq!(counts.queued.load(Ordering::Relaxed), 1);
    }
}
