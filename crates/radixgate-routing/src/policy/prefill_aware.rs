//! prefill_aware: always the worker that would give this request its first
//! token soonest, by the cost model alone.
//!
//! It is cache_aware's `predicted_ttft` rule with no margin
//! ([`PrefillAwareConfig::as_cache_aware`]): a holder of the prefix wins
//! only while its predicted time to first token (queued prefill + this
//! request's uncached part, over the worker's learned speed, plus the
//! in-flight term; see `cost.rs`) is the least in the pool; a low-match
//! request goes to the quickest worker. This is the greedy choice the
//! simulator's oracle makes with true engine state, made with what a router
//! can know. It was a separate formula in characters before the cost model;
//! the two are now one code path, so the policies differ only in their
//! bound.

use super::{CacheAware, Decision, Policy, Trees};
use crate::config::PrefillAwareConfig;
use crate::{RequestView, RoutingError, Worker};
use radixgate_tree::Tree;
use std::sync::Arc;

/// The greedy TTFT policy.
#[derive(Debug)]
pub struct PrefillAware {
    inner: CacheAware,
}

impl PrefillAware {
    /// A greedy TTFT policy (config validated by
    /// [`PrefillAwareConfig::validate`]).
    pub fn new(config: PrefillAwareConfig) -> Self {
        Self {
            inner: CacheAware::new(config.as_cache_aware()),
        }
    }

    /// The tree of a pool key, if a request for it was routed.
    pub fn tree(&self, model: &str) -> Option<Arc<Tree>> {
        self.inner.tree(model)
    }

    #[cfg(test)]
    fn trees_for_test(&self) -> &Trees {
        self.inner.trees().expect("cache_aware keeps trees")
    }
}

impl Policy for PrefillAware {
    fn name(&self) -> &'static str {
        "prefill_aware"
    }

    fn stagger(&self, start: usize) {
        self.inner.stagger(start);
    }

    fn select(
        &self,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError> {
        self.inner.decide(self.name(), req, workers)
    }

    fn trees(&self) -> Option<&Trees> {
        self.inner.trees()
    }

    fn correction(&self) -> Option<crate::CorrectionConfig> {
        self.inner.correction()
    }

    fn cost_model(&self) -> Option<&crate::CostModelConfig> {
        self.inner.cost_model()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Branch;
    use super::super::testutil::{hold, workers};
    use super::*;
    use crate::LoadGuard;

    fn route(p: &PrefillAware, ws: &[Arc<Worker>], text: &str) -> Decision {
        p.select(&RequestView::new("m", text), ws).unwrap()
    }

    #[test]
    fn the_holder_wins_until_its_queued_prefill_outweighs_a_miss() {
        let p = PrefillAware::new(PrefillAwareConfig::default());
        let ws = workers(3);
        let prompt = "x".repeat(10_000);
        let tree = p.trees_for_test().get_or_create("m");
        tree.insert(&prompt, ws[1].id().tenant());
        let d = route(&p, &ws, &format!("{prompt}?"));
        assert_eq!(d.worker().id(), ws[1].id());
        assert_eq!(d.explanation().branch, Branch::CacheHit);
        assert_eq!(d.explanation().matched_chars, Some(10_000));
        assert_eq!(ws[1].pending_prefill(), 1, "one uncached char predicted");
        let shown = d.rendered().to_string();
        assert!(
            shown.contains(" ttft=") && shown.contains(" alt="),
            "{shown}"
        );
        drop(d);
        // 15,000 chars of queued prefill on the holder: a full miss
        // elsewhere (10,001 chars) is quicker.
        let mut queued = LoadGuard::with_prefill(ws[1].clone(), 15_000);
        let d = route(&p, &ws, &format!("{prompt}!"));
        assert_ne!(d.worker().id(), ws[1].id());
        assert_eq!(d.explanation().branch, Branch::HotSpotSpill);
        assert_eq!(d.explanation().matched_chars, Some(0));
        assert_eq!(d.worker().pending_prefill(), 10_001);
        drop(d);
        // Once that prefill is done, the holder is the quickest again for a
        // text only it holds.
        let only_holder = "z".repeat(10_000);
        tree.insert(&only_holder, ws[1].id().tenant());
        queued.prefill_done();
        assert_eq!(ws[1].pending_prefill(), 0);
        assert_eq!(route(&p, &ws, &only_holder).worker().id(), ws[1].id());
        drop(queued);
    }

    #[test]
    fn in_flight_load_counts_and_ties_rotate() {
        let p = PrefillAware::new(PrefillAwareConfig::default());
        let ws = workers(2);
        let _busy = hold(&ws[0], 3);
        // No match anywhere: equal prefill, worker 0 has 3 in flight.
        assert_eq!(route(&p, &ws, "abc").worker().id(), ws[1].id());
        let idle = workers(4);
        let mut seen = [0usize; 4];
        for i in 0..8 {
            seen[route(&p, &idle, &format!("{i}-distinct")).worker().id().0 as usize] += 1;
        }
        assert_eq!(seen, [2, 2, 2, 2]);
    }

    #[test]
    fn unavailable_workers_are_never_chosen() {
        let p = PrefillAware::new(PrefillAwareConfig::default());
        let ws = workers(2);
        p.trees_for_test()
            .get_or_create("m")
            .insert("held text", ws[0].id().tenant());
        ws[0].set_healthy(false);
        for _ in 0..5 {
            assert_eq!(route(&p, &ws, "held text").worker().id(), ws[1].id());
        }
        ws[1].set_healthy(false);
        assert!(p.select(&RequestView::new("m", "x"), &ws).is_err());
    }
}
