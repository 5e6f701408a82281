//! random: a uniformly random available worker.
//!
//! The generator is seeded (configurable) and lock-free, so the simulator can
//! replay a run exactly and the request path never contends on a lock.

use super::{Branch, Decision, Loads, Policy};
use crate::mix::AtomicRng;
use crate::{RequestView, RoutingError, Worker};
use std::sync::Arc;

/// The random policy.
#[derive(Debug)]
pub struct Random {
    rng: AtomicRng,
}

impl Random {
    /// A random policy; `seed` makes its choices reproducible.
    pub fn new(seed: Option<u64>) -> Self {
        Self {
            rng: seed.map_or_else(AtomicRng::from_entropy, AtomicRng::new),
        }
    }
}

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn select(
        &self,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError> {
        let loads = Loads::read(req, workers)?;
        let idx = loads.candidates[self.rng.below(loads.candidates.len())].idx;
        let worker = &workers[idx];
        Ok(Decision::new(
            worker,
            loads.explain(self.name(), Branch::Random, worker, idx),
        ))
    }
}
