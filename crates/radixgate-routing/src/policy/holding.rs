//! What a decode worker holds: in a prefill/decode disaggregated pool
//! every prompt a decode worker generates from has been moved into its
//! KV cache, so the decode pool has a prefix record too, whatever policy
//! chooses its workers.
//!
//! [`Holding`] wraps the decode pool's policy. It lets the inner policy
//! choose; if that policy keeps no trees of its own (a load policy, the
//! default for decode), it records the prompt for the chosen worker in a
//! tree it keeps, exactly as a prefix-aware policy records its own
//! decisions. Either way the decision then says how much of the prompt the
//! worker already held before ([`Decision::held_chars`]): what the gateway
//! needs to send a request that decode can finish alone to decode alone,
//! skipping the prefill pool. The tree's upkeep (eviction, forgetting a
//! removed worker, the correction from reported cached tokens) is the same
//! [`Trees`] code as every other policy's.

use super::trees::TreeUpkeep;
use super::{Decision, Policy, Trees};
use crate::correction::CorrectionConfig;
use crate::{CacheAwareConfig, RequestView, RoutingError, Worker};
use std::sync::Arc;

/// A decode pool's policy plus the prefix record of its workers.
#[derive(Debug)]
pub struct Holding {
    inner: Arc<dyn Policy>,
    /// The record, when `inner` keeps no trees of its own.
    own: Option<Trees>,
    correction: CorrectionConfig,
}

impl Holding {
    /// Wraps `inner`; a record of its own (when `inner` keeps none) is
    /// bounded and evicted by `bounds`' tree settings.
    pub fn new(inner: Arc<dyn Policy>, bounds: &CacheAwareConfig) -> Self {
        let own = inner.trees().is_none().then(|| {
            Trees::new(TreeUpkeep {
                max_total_chars: bounds.max_total_chars,
                max_tree_size: bounds.max_tree_size,
                eviction_interval_secs: bounds.eviction_interval_secs,
                max_routing_text_chars: bounds.max_routing_text_chars,
            })
        });
        Self {
            inner,
            own,
            correction: bounds.correction,
        }
    }
}

impl Policy for Holding {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn stagger(&self, start: usize) {
        self.inner.stagger(start);
    }

    fn select(
        &self,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError> {
        let decision = self.inner.select(req, workers)?;
        let Some(trees) = &self.own else {
            // A prefix-aware policy recorded its decision itself.
            return Ok(decision);
        };
        let super::trees::Model { tree, truth } = trees.model(req.model);
        let text = trees.cap(req.text);
        let bound = self.correction.tree_bound(decision.worker(), &truth);
        let receipt = tree.insert_within(text, decision.worker().id().tenant(), bound);
        truth.count_insert(bound, &receipt);
        Ok(decision.with_insert(tree, receipt, text, None, truth, self.correction))
    }

    fn on_worker_added(&self, worker: &Arc<Worker>) {
        self.inner.on_worker_added(worker);
    }

    fn trees(&self) -> Option<&Trees> {
        self.own.as_ref().or_else(|| self.inner.trees())
    }

    fn correction(&self) -> Option<CorrectionConfig> {
        match self.own {
            Some(_) => Some(self.correction),
            None => self.inner.correction(),
        }
    }

    fn cost_model(&self) -> Option<&crate::CostModelConfig> {
        self.inner.cost_model()
    }

    fn on_worker_removed(&self, worker: &Worker) {
        self.inner.on_worker_removed(worker);
        if let Some(trees) = &self.own {
            trees.remove_tenant(worker.id().tenant());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{CacheAware, LeastLoad};
    use crate::{WorkerId, WorkerSpec};

    fn workers(n: u32) -> Vec<Arc<Worker>> {
        (0..n)
            .map(|i| {
                Arc::new(Worker::new(
                    WorkerId(i),
                    WorkerSpec::new(format!("http://d{i}:1")),
                ))
            })
            .collect()
    }

    #[test]
    fn a_load_policy_gains_a_record_of_what_each_worker_was_sent() {
        let pool = workers(2);
        let holding = Holding::new(Arc::new(LeastLoad::new()), &CacheAwareConfig::default());
        let text = "<system>a long shared document<user>first question";
        let first = holding.select(&RequestView::new("m", text), &pool).unwrap();
        assert_eq!(first.held_chars(), Some(0));
        let chosen = first.worker().id();
        // Its load keeps the next request off the first worker…
        let second = holding.select(&RequestView::new("m", text), &pool).unwrap();
        assert_ne!(second.worker().id(), chosen);
        assert_eq!(second.held_chars(), Some(0));
        drop((first, second));
        // …and once both are idle, whichever is chosen held the whole text.
        let third = holding.select(&RequestView::new("m", text), &pool).unwrap();
        assert_eq!(third.held_chars(), Some(text.chars().count()));
        assert_eq!(
            holding.cached_chars(chosen),
            Some(text.chars().count()),
            "the record is the wrapper's trees"
        );
        drop(third);
        holding.on_worker_removed(&pool[chosen.0 as usize]);
        assert_eq!(holding.cached_chars(chosen), Some(0));
    }

    #[test]
    fn a_prefix_aware_policy_keeps_its_own_record() {
        let pool = workers(2);
        let inner: Arc<dyn Policy> = Arc::new(CacheAware::new(CacheAwareConfig::default()));
        let holding = Holding::new(inner, &CacheAwareConfig::default());
        let text = "<user>the same prompt twice";
        drop(holding.select(&RequestView::new("m", text), &pool).unwrap());
        let again = holding.select(&RequestView::new("m", text), &pool).unwrap();
        assert_eq!(again.held_chars(), Some(text.chars().count()));
        let tree = holding.trees().unwrap().get("m").unwrap();
        assert_eq!(
            tree.tenant_size(again.worker().id().tenant()),
            text.chars().count(),
            "recorded once, by cache_aware"
        );
    }
}
