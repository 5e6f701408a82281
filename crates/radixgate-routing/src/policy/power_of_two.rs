//! power_of_two: sample two distinct available workers at random and take the
//! less loaded (by the router's in-flight count).
//!
//! Two samples already cut the maximum queue length exponentially compared
//! with one (the "power of two choices"), at O(1) cost per decision.

use super::{Branch, Decision, Loads, Policy};
use crate::mix::AtomicRng;
use crate::{RequestView, RoutingError, Worker};
use std::sync::Arc;

/// The power-of-two-choices policy.
#[derive(Debug)]
pub struct PowerOfTwo {
    rng: AtomicRng,
}

impl PowerOfTwo {
    /// A power-of-two policy; `seed` makes its choices reproducible.
    pub fn new(seed: Option<u64>) -> Self {
        Self {
            rng: seed.map_or_else(AtomicRng::from_entropy, AtomicRng::new),
        }
    }
}

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn select(
        &self,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError> {
        let loads = Loads::read(req, workers)?;
        let n = loads.candidates.len();
        let a = self.rng.below(n);
        let chosen = if n == 1 {
            loads.candidates[a]
        } else {
            // A second index distinct from the first, uniformly.
            let b = (a + 1 + self.rng.below(n - 1)) % n;
            let (ca, cb) = (loads.candidates[a], loads.candidates[b]);
            // The first sample wins a tie.
            if cb.load < ca.load { cb } else { ca }
        };
        let worker = &workers[chosen.idx];
        Ok(Decision::new(
            worker,
            loads.explain(self.name(), Branch::PowerOfTwo, worker, chosen.idx),
        ))
    }
}
