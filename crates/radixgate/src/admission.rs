//! Admission control: at most `max_concurrent_requests` requests in flight,
//! up to `queue_size` more waiting in line, each for at most
//! `queue_timeout_secs`.
//!
//! A request either gets an [`AdmissionPermit`] at once, waits in the queue
//! for one, or is refused: [`GatewayError::QueueFull`] (429) at once when the
//! queue is full, [`GatewayError::QueueTimeout`] (503) when it waited too
//! long. The permit is owned and `'static`; it is meant to live inside the
//! response body, next to the worker's load guard, and gives its slot back
//! when dropped, however the response ends.
//!
//! With no limit configured [`Admission::acquire`] is a branch on a `None`:
//! no atomic, no allocation.
//!
//! Concurrency: slots are a tokio [`Semaphore`], which is fair (waiters are
//! served first come, first served, and a newcomer cannot take a freed permit
//! ahead of them). The queue length is an `AtomicUsize` reserved by a
//! compare-and-swap before waiting and given back by a guard's `Drop`, so a
//! waiter whose future is cancelled (the client disconnected) frees its queue
//! place too. No lock is taken.
//!
//! The gate owns its metrics: it counts its refusals by reason where it
//! refuses, and [`Admission::publish_metrics`] (called on the upkeep tick)
//! sets the in-flight and queued gauges, so they are exported from the
//! first tick on and read at the same moments as the worker gauges.

use crate::config::AdmissionConfig;
use crate::error::GatewayError;
use crate::metrics::{Describe, LabelledCounters, Metrics, OneGauge};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

pub(crate) const IN_FLIGHT: Describe = Describe::new(
    "radixgate_admission_in_flight_requests",
    "Requests holding an admission slot.",
);
pub(crate) const QUEUED: Describe = Describe::new(
    "radixgate_admission_queued_requests",
    "Requests waiting for an admission slot.",
);
pub(crate) const REJECTED: Describe = Describe::new(
    "radixgate_admission_rejected_total",
    "Requests refused by admission control, by reason (queue_full, queue_timeout).",
);

/// The gateway's admission gate. Cheap to clone; clones share the limit
/// and the metrics.
#[derive(Clone, Debug)]
pub struct Admission {
    limited: Option<Arc<Limited>>,
    metrics: Arc<AdmissionMetrics>,
}

/// The gate's metric families.
#[derive(Debug)]
struct AdmissionMetrics {
    in_flight: OneGauge,
    queued: OneGauge,
    rejected: LabelledCounters,
}

#[derive(Debug)]
struct Limited {
    slots: Arc<Semaphore>,
    limit: usize,
    queue_size: usize,
    queue_timeout: Duration,
    queued: AtomicUsize,
}

/// One admitted request's slot; dropping it admits the next in line.
#[derive(Debug)]
#[must_use = "the slot is given back as soon as the permit is dropped"]
pub struct AdmissionPermit {
    _slot: Option<OwnedSemaphorePermit>,
}

/// Gives a reserved queue place back, including when the wait is cancelled.
struct QueuePlace<'a>(&'a AtomicUsize);

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    /// Builds the gate from its config (validated: a limit is at least 1),
    /// with its metric families in `metrics`.
    pub fn new(config: &AdmissionConfig, metrics: &Metrics) -> Self {
        let limited = config.max_concurrent_requests.map(|limit| {
            // The semaphore's own ceiling; far above any sane limit.
            let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
            Arc::new(Limited {
                slots: Arc::new(Semaphore::new(limit)),
                limit,
                queue_size: config.queue_size,
                queue_timeout: Duration::from_secs(config.queue_timeout_secs),
                queued: AtomicUsize::new(0),
            })
        });
        let metrics = Arc::new(AdmissionMetrics {
            in_flight: metrics.gauge(&IN_FLIGHT),
            queued: metrics.gauge(&QUEUED),
            rejected: metrics.labelled_counters(&REJECTED, "reason"),
        });
        Self { limited, metrics }
    }

    /// Waits for a slot, in arrival order. Fails at once with `QueueFull`
    /// when `queue_size` requests are already waiting, and with
    /// `QueueTimeout` after waiting `queue_timeout_secs`.
    pub async fn acquire(&self) -> Result<AdmissionPermit, GatewayError> {
        let Some(limited) = &self.limited else {
            return Ok(AdmissionPermit { _slot: None });
        };
        // A free slot is only available when nobody is waiting (the fair
        // semaphore hands released permits to waiters first), so this does
        // not jump the queue.
        if let Ok(slot) = Arc::clone(&limited.slots).try_acquire_owned() {
            return Ok(AdmissionPermit { _slot: Some(slot) });
        }
        let reserved = limited
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued < limited.queue_size).then_some(queued + 1)
            });
        if reserved.is_err() {
            // A slot may have come free since the first try.
            return match Arc::clone(&limited.slots).try_acquire_owned() {
                Ok(slot) => Ok(AdmissionPermit { _slot: Some(slot) }),
                Err(_) => {
                    self.metrics.rejected.increment("queue_full");
                    Err(GatewayError::QueueFull {
                        queue_size: limited.queue_size,
                    })
                }
            };
        }
        let _place = QueuePlace(&limited.queued);
        let started = Instant::now();
        let wait = Arc::clone(&limited.slots).acquire_owned();
        match tokio::time::timeout(limited.queue_timeout, wait).await {
            Ok(Ok(slot)) => Ok(AdmissionPermit { _slot: Some(slot) }),
            // The semaphore is never closed; treat it as a timeout rather
            // than panic if that ever changes.
            Ok(Err(_)) | Err(_) => {
                self.metrics.rejected.increment("queue_timeout");
                Err(GatewayError::QueueTimeout {
                    waited: started.elapsed(),
                })
            }
        }
    }

    /// The concurrency limit, if any.
    pub fn limit(&self) -> Option<usize> {
        self.limited.as_ref().map(|l| l.limit)
    }

    /// Requests holding a permit now (0 when unlimited: not tracked).
    pub fn in_flight(&self) -> usize {
        self.limited
            .as_ref()
            .map_or(0, |l| l.limit - l.slots.available_permits())
    }

    /// Requests waiting in the queue now.
    pub fn queued(&self) -> usize {
        self.limited
            .as_ref()
            .map_or(0, |l| l.queued.load(Ordering::Acquire))
    }

    /// Sets the in-flight and queued gauges to the counts now.
    pub fn publish_metrics(&self) {
        self.metrics.in_flight.set(self.in_flight() as f64);
        self.metrics.queued.set(self.queued() as f64);
    }
}

#[cfg(test)]
mod tests;
