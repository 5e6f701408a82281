//! The event queue of the simulator: a min-heap on `(time, class, seq)`.
//!
//! Ordering is total and independent of the heap's internals: events fire
//! in time order; at equal times by class — worker speed changes first (a
//! step that starts at the change's time runs at the new speed), then
//! engine step results and KV transfers landing (a worker's results at `t`
//! are visible to a decision at `t`, as the HTTP worker publishes its load
//! before delivering a step's events), then the periodic load poll, tree eviction and messages
//! between router replicas, then request issues; and within a class in the
//! order they were scheduled (`seq`, a counter). So a run is a pure
//! function of its inputs.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;

/// What happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Speed change `0` of the run's list takes effect.
    SpeedChange(usize),
    /// Engine `0`'s current step completes; its results become visible.
    StepDone(usize),
    /// Request `0`'s KV has reached its decode worker (prefill/decode runs
    /// only).
    KvArrived(u64),
    /// Refresh every worker's reported load from its engine (`/get_load`).
    Poll,
    /// Run the policy's tree eviction (the gateway's background task).
    Evict,
    /// The oldest message between router replicas arrives
    /// ([`replicas`](super::replicas)).
    Sync,
    /// Issuer `0` (a client, or the arrival process) asks the workload for
    /// its next request.
    Issue(usize),
}

impl Kind {
    fn class(self) -> u8 {
        match self {
            Kind::SpeedChange(_) => 0,
            Kind::StepDone(_) | Kind::KvArrived(_) => 1,
            Kind::Poll | Kind::Evict | Kind::Sync => 2,
            Kind::Issue(_) => 3,
        }
    }

    /// Whether the event is upkeep — periodic, or a change of the pool's
    /// conditions — rather than work (it must not keep a finished run
    /// alive).
    pub fn is_upkeep(self) -> bool {
        matches!(
            self,
            Kind::Poll | Kind::Evict | Kind::Sync | Kind::SpeedChange(_)
        )
    }
}

/// A scheduled event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// When it fires (simulated time since the start).
    pub at: Duration,
    seq: u64,
    /// What it is.
    pub kind: Kind,
}

impl Event {
    fn key(&self) -> (Duration, u8, u64) {
        (self.at, self.kind.class(), self.seq)
    }
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: `BinaryHeap` is a max-heap.
        other.key().cmp(&self.key())
    }
}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The queue, with a count of the non-upkeep events in it.
#[derive(Debug, Default)]
pub struct Queue {
    heap: BinaryHeap<Event>,
    seq: u64,
    work: usize,
}

impl Queue {
    /// Schedules `kind` at `at`.
    pub fn push(&mut self, at: Duration, kind: Kind) {
        self.seq += 1;
        if !kind.is_upkeep() {
            self.work += 1;
        }
        self.heap.push(Event {
            at,
            seq: self.seq,
            kind,
        });
    }

    /// The earliest event.
    pub fn pop(&mut self) -> Option<Event> {
        let ev = self.heap.pop()?;
        if !ev.kind.is_upkeep() {
            self.work -= 1;
        }
        Some(ev)
    }

    /// Non-upkeep events still scheduled.
    pub fn work(&self) -> usize {
        self.work
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_then_class_then_schedule_order() {
        let mut q = Queue::default();
        let t = Duration::from_millis;
        q.push(t(5), Kind::Issue(0));
        q.push(t(5), Kind::Issue(1));
        q.push(t(5), Kind::Poll);
        q.push(t(5), Kind::StepDone(3));
        q.push(t(1), Kind::Issue(9));
        q.push(t(5), Kind::StepDone(2));
        q.push(t(5), Kind::SpeedChange(0));
        assert_eq!(q.work(), 5);
        let order: Vec<Kind> = std::iter::from_fn(|| q.pop()).map(|e| e.kind).collect();
        assert_eq!(
            order,
            vec![
                Kind::Issue(9),
                Kind::SpeedChange(0),
                Kind::StepDone(3),
                Kind::StepDone(2),
                Kind::Poll,
                Kind::Issue(0),
                Kind::Issue(1),
            ]
        );
        assert_eq!(q.work(), 0);
    }
}
