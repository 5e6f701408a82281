//! least_load: the available worker with the fewest requests in flight
//! (shortest queue). Ties rotate, so idle pools are filled evenly.

use super::{Branch, Decision, Loads, Policy};
use crate::{RequestView, RoutingError, Worker};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The shortest-queue policy.
#[derive(Debug, Default)]
pub struct LeastLoad {
    turn: AtomicUsize,
}

impl LeastLoad {
    /// A shortest-queue policy.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Policy for LeastLoad {
    fn name(&self) -> &'static str {
        "least_load"
    }

    fn stagger(&self, start: usize) {
        self.turn.store(start, Ordering::Relaxed);
    }

    fn select(
        &self,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError> {
        let loads = Loads::read(req, workers)?;
        let idx = loads.least_loaded(self.turn.fetch_add(1, Ordering::Relaxed));
        let worker = &workers[idx];
        Ok(Decision::new(
            worker,
            loads.explain(self.name(), Branch::LeastLoad, worker, idx),
        ))
    }
}
