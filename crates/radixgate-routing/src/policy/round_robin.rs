//! round_robin: each request to the next available worker in turn.
//!
//! One atomic counter; a request whose turn lands on an unavailable worker
//! goes to the next available one after it, so skipping a down worker does
//! not shift its share onto a single neighbour for long.

use super::{Branch, Decision, Loads, Policy};
use crate::{RequestView, RoutingError, Worker};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The round-robin policy; the baseline every other policy is measured
/// against.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoundRobin {
    /// A round-robin policy starting at the first worker.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn stagger(&self, start: usize) {
        self.next.store(start, Ordering::Relaxed);
    }

    fn select(
        &self,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError> {
        let loads = Loads::read(req, workers)?;
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % workers.len();
        // The first available worker at or after the turn, wrapping around.
        let pos = loads.candidates.partition_point(|c| c.idx < turn);
        let idx = loads.candidates[pos % loads.candidates.len()].idx;
        let worker = &workers[idx];
        Ok(Decision::new(
            worker,
            loads.explain(self.name(), Branch::RoundRobin, worker, idx),
        ))
    }
}
