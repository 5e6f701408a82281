//! Admission control: at most `max_concurrent_requests` requests in flight,
//! up to `queue_size` more waiting in line, each for at most
//! `queue_timeout_secs` (0 = no limit, as for the other timeouts); the line
//! is ordered by the tenant's [`Priority`].
//!
//! A request either gets an [`AdmissionPermit`] at once, waits in the queue
//! for one, or is refused: [`GatewayError::QueueFull`] (429) at once when the
//! queue is full, [`GatewayError::QueueTimeout`] (503) when it waited too
//! long. A full queue still takes a request of a higher priority than its
//! lowest waiter: that level's newest waiter gives its place up and is
//! refused as if it had found the queue full, so a batch tenant that fills
//! the queue cannot lock interactive ones out of it. The permit is owned
//! and `'static`; it is meant to live inside the response body, next to the
//! worker's load guard, and gives its slot back when dropped, however the
//! response ends.
//!
//! A freed slot goes to the first waiter of the highest priority that has
//! any (first come, first served within a priority), and is handed over
//! directly: a newcomer never takes a slot while anyone waits, so nobody is
//! overtaken except by a higher priority. Low priority can starve while
//! higher-priority work keeps the slots busy; its queue timeout bounds how
//! long it waits before it is told so.
//!
//! With no limit configured [`Admission::acquire`] is a branch on a `None`:
//! no lock, no allocation.
//!
//! Concurrency: the slot count and the three queues sit under one
//! `parking_lot::Mutex`, held for a few field updates and never across an
//! `.await` (a waiter parks on its own oneshot channel, outside the lock).
//! One lock, not atomics, because a release must pop a waiter and hand it
//! the slot as one step, or a newcomer could slip in between. A waiter whose
//! future is dropped (timeout, client gone) takes itself out of its queue;
//! if a slot was handed to it in the meantime, it passes the slot on.
//!
//! The gate owns its metrics: it counts its refusals by reason where it
//! refuses, and [`Admission::publish_metrics`] (called on the upkeep tick)
//! sets the in-flight and queued gauges, so they are exported from the
//! first tick on and read at the same moments as the worker gauges.

use crate::config::AdmissionConfig;
use crate::error::GatewayError;
use crate::metrics::{Describe, LabelledCounters, Metrics, OneGauge};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Where a tenant's requests stand in the admission queue: `high` before
/// `normal` before `low`. Three named levels rather than numbers: operators
/// sort tenants into "interactive", "default" and "batch", and a fixed set
/// keeps the queue a fixed array.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Served after everyone else (batch jobs).
    Low,
    /// The default.
    #[default]
    Normal,
    /// Served first (interactive users).
    High,
}

impl Priority {
    /// Every level, highest first: the order queues are served in.
    const SERVED_FIRST: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    fn index(self) -> usize {
        self as usize
    }

    /// The level's name, as configured.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Normal => "normal",
            Self::High => "high",
        }
    }
}

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
    limit: usize,
    queue_size: usize,
    /// `None`: `queue_timeout_secs: 0`, no limit on the wait.
    queue_timeout: Option<Duration>,
    slots: Mutex<Slots>,
}

/// The state behind the lock.
#[derive(Debug, Default)]
struct Slots {
    in_flight: usize,
    /// Waiters by [`Priority::index`], each first come, first served.
    queues: [VecDeque<Waiter>; 3],
    queued: usize,
    next_id: u64,
}

/// One queued request: its ticket and the channel its turn arrives on.
#[derive(Debug)]
struct Waiter {
    id: u64,
    slot: oneshot::Sender<Turn>,
}

/// How a waiter's wait ends, other than by its timeout.
#[derive(Debug, PartialEq, Eq)]
enum Turn {
    /// A slot was handed to it.
    Admitted,
    /// A request of a higher priority took its place in a full queue.
    Displaced,
}

/// One admitted request's slot; dropping it admits the next in line.
#[derive(Debug)]
#[must_use = "the slot is given back as soon as the permit is dropped"]
pub struct AdmissionPermit {
    slot: Option<Arc<Limited>>,
    /// Whether the request waited in the queue for it.
    waited: bool,
}

impl AdmissionPermit {
    /// Whether the request waited in the queue for its slot (false for
    /// one admitted at once, or without a limit).
    pub fn waited(&self) -> bool {
        self.waited
    }
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        if let Some(limited) = self.slot.take() {
            limited.release();
        }
    }
}

impl Slots {
    /// Makes room in a full queue for a newcomer of `priority`: the newest
    /// waiter of the lowest priority below it, if any, leaves the queue and
    /// is told so. False when every waiter's priority is as high.
    fn displace_below(&mut self, priority: Priority) -> bool {
        for lower in Priority::SERVED_FIRST.into_iter().rev() {
            if lower >= priority {
                return false;
            }
            // A waiter whose receiver is gone (see `release`) frees its
            // place all the same.
            if let Some(waiter) = self.queues[lower.index()].pop_back() {
                self.queued -= 1;
                let _ = waiter.slot.send(Turn::Displaced);
                return true;
            }
        }
        false
    }
}

impl Limited {
    /// The refusal of a request the queue has no place for.
    fn full(&self) -> GatewayError {
        GatewayError::QueueFull {
            queue_size: self.queue_size,
        }
    }

    /// Gives a slot back: to the best waiter still waiting, else to the pool.
    fn release(&self) {
        let mut slots = self.slots.lock();
        for priority in Priority::SERVED_FIRST {
            while let Some(waiter) = slots.queues[priority.index()].pop_front() {
                slots.queued -= 1;
                // A waiter whose receiver is gone was cancelled between its
                // timeout and its clean-up; try the next one.
                if waiter.slot.send(Turn::Admitted).is_ok() {
                    return;
                }
            }
        }
        slots.in_flight -= 1;
    }
}

/// Takes a queued waiter out of line if its wait ends without a slot
/// (timeout or cancellation); passes on a slot handed to it meanwhile.
struct QueuePlace {
    limited: Arc<Limited>,
    priority: Priority,
    id: u64,
    slot: oneshot::Receiver<Turn>,
    /// Its wait is over and nothing is left to give back.
    done: bool,
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut slots = self.limited.slots.lock();
        let queue = &mut slots.queues[self.priority.index()];
        if let Some(at) = queue.iter().position(|w| w.id == self.id) {
            queue.remove(at);
            slots.queued -= 1;
            return;
        }
        drop(slots);
        // Not in line any more: `release` (or a newcomer that displaced
        // it) popped it, and under the lock has sent its turn by now. A
        // slot nobody will use here is passed on.
        if self.slot.try_recv() == Ok(Turn::Admitted) {
            self.limited.release();
        }
    }
}

impl Admission {
    /// Builds the gate from its config (validated: a limit is at least 1),
    /// with its metric families in `metrics`.
    pub fn new(config: &AdmissionConfig, metrics: &Metrics) -> Self {
        let limited = config.max_concurrent_requests.map(|limit| {
            Arc::new(Limited {
                limit: limit.max(1),
                queue_size: config.queue_size,
                queue_timeout: (config.queue_timeout_secs > 0)
                    .then(|| Duration::from_secs(config.queue_timeout_secs)),
                slots: Mutex::new(Slots::default()),
            })
        });
        let metrics = Arc::new(AdmissionMetrics {
            in_flight: metrics.gauge(&IN_FLIGHT),
            queued: metrics.gauge(&QUEUED),
            rejected: metrics.labelled_counters(&REJECTED, "reason"),
        });
        Self { limited, metrics }
    }

    /// Waits for a slot, behind every earlier waiter of the same or a higher
    /// priority. Fails at once with `QueueFull` when `queue_size` requests
    /// of the same or a higher priority are already waiting, and with
    /// `QueueTimeout` after waiting `queue_timeout_secs` (0: no limit; the
    /// request timeout still ends the wait). A waiter whose
    /// place a higher priority takes fails with `QueueFull` then.
    pub async fn acquire(&self, priority: Priority) -> Result<AdmissionPermit, GatewayError> {
        let Some(limited) = &self.limited else {
            return Ok(AdmissionPermit {
                slot: None,
                waited: false,
            });
        };
        let admitted = |waited| AdmissionPermit {
            slot: Some(Arc::clone(limited)),
            waited,
        };
        let mut place = {
            let mut slots = limited.slots.lock();
            // A slot is only ever free when nobody waits (a release hands
            // it straight to a waiter), so taking it jumps no queue.
            if slots.in_flight < limited.limit {
                slots.in_flight += 1;
                return Ok(admitted(false));
            }
            if slots.queued >= limited.queue_size && !slots.displace_below(priority) {
                drop(slots);
                self.metrics.rejected.increment("queue_full");
                return Err(limited.full());
            }
            let (tx, rx) = oneshot::channel();
            let id = slots.next_id;
            slots.next_id += 1;
            slots.queues[priority.index()].push_back(Waiter { id, slot: tx });
            slots.queued += 1;
            QueuePlace {
                limited: Arc::clone(limited),
                priority,
                id,
                slot: rx,
                done: false,
            }
        };
        let started = Instant::now();
        let turn = match limited.queue_timeout {
            Some(after) => tokio::time::timeout(after, &mut place.slot).await,
            None => Ok((&mut place.slot).await),
        };
        match turn {
            Ok(Ok(Turn::Admitted)) => {
                place.done = true;
                Ok(admitted(true))
            }
            Ok(Ok(Turn::Displaced)) => {
                place.done = true;
                self.metrics.rejected.increment("queue_full");
                Err(limited.full())
            }
            // The sender is only dropped unsent when the gate is; treat that
            // like a timeout rather than panic.
            Ok(Err(_)) | Err(_) => {
                self.metrics.rejected.increment("queue_timeout");
                Err(GatewayError::QueueTimeout {
                    waited: started.elapsed(),
                })
            }
        }
    }

    /// Counts a wait the request's own timeout ended before the queue's
    /// did (it is answered as a queue timeout).
    pub(crate) fn queue_timed_out(&self) {
        self.metrics.rejected.increment("queue_timeout");
    }

    /// The concurrency limit, if any.
    pub fn limit(&self) -> Option<usize> {
        self.limited.as_ref().map(|l| l.limit)
    }

    /// Requests holding a permit now (0 when unlimited: not tracked).
    pub fn in_flight(&self) -> usize {
        self.limited
            .as_ref()
            .map_or(0, |l| l.slots.lock().in_flight)
    }

    /// Requests waiting in the queue now.
    pub fn queued(&self) -> usize {
        self.limited.as_ref().map_or(0, |l| l.slots.lock().queued)
    }

    /// Sets the in-flight and queued gauges to the counts now.
    pub fn publish_metrics(&self) {
        self.metrics.in_flight.set(self.in_flight() as f64);
        self.metrics.queued.set(self.queued() as f64);
    }
}

#[cfg(test)]
mod tests;
