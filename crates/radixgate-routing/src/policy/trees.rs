//! One radix tree per pool key (model), shared by the prefix-aware policies,
//! and the upkeep those trees need: eviction on a timer, forgetting a removed
//! worker, the per-worker cache record. A policy that keeps trees returns them
//! from [`Policy::trees`](super::Policy::trees) and the trait's default
//! methods do the upkeep, so it is written once, here.
//!
//! The map sits behind an `ArcSwap`, so the per-request lookup is lock-free;
//! a `Mutex` serialises the rare writers that add a model (double-checked, so
//! two first requests for a model create one tree). Trees synchronise
//! internally. Keys come from the worker set's pools, never straight from a
//! client, so the number of trees is bounded by the configured models; a
//! model's tree is dropped once no worker serves it
//! ([`Trees::retain_models`]).

use crate::Worker;
use crate::correction::{CorrectionConfig, ModelTruth};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use radixgate_tree::{TenantId, Tree, TreeConfig, cap_chars};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The size bounds and eviction timer of a policy's trees (the same three
/// settings of [`CacheAwareConfig`](crate::CacheAwareConfig) and
/// [`PrefillAwareConfig`](crate::PrefillAwareConfig)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TreeUpkeep {
    /// Hard bound on all workers' characters in one tree, kept by inserts.
    pub(crate) max_total_chars: usize,
    /// Characters each worker may keep in a tree after an eviction pass.
    pub(crate) max_tree_size: usize,
    /// Seconds between background eviction passes; 0: no background pass.
    pub(crate) eviction_interval_secs: u64,
    /// Characters of a request's routing text that are matched and
    /// inserted; the rest is ignored (see [`Trees::cap`]).
    pub(crate) max_routing_text_chars: usize,
}

/// The per-model prefix trees of one policy, and their upkeep.
#[derive(Debug)]
pub struct Trees {
    map: ArcSwap<HashMap<String, Model>>,
    add: Mutex<()>,
    upkeep: TreeUpkeep,
}

/// One model's tree and its correction state (`correction.rs`), created
/// together and found by one lookup.
#[derive(Clone, Debug)]
pub(crate) struct Model {
    pub(crate) tree: Arc<Tree>,
    pub(crate) truth: Arc<ModelTruth>,
}

impl Trees {
    /// No trees yet; each one is created with `upkeep`'s bounds.
    pub(crate) fn new(upkeep: TreeUpkeep) -> Self {
        Self {
            map: ArcSwap::from_pointee(HashMap::new()),
            add: Mutex::new(()),
            upkeep,
        }
    }

    /// The first `max_routing_text_chars` characters of `text`, cut on a
    /// char boundary: what is matched and inserted. A prefix of a few
    /// hundred thousand characters decides the route as well as the whole
    /// text does, and one huge prompt cannot fill the tree.
    pub(crate) fn cap<'a>(&self, text: &'a str) -> &'a str {
        cap_chars(text, self.upkeep.max_routing_text_chars)
    }

    /// The tree of `model`, if a request for it was routed.
    pub fn get(&self, model: &str) -> Option<Arc<Tree>> {
        self.map.load().get(model).map(|m| m.tree.clone())
    }

    /// The tree of `model`, created on first use.
    #[cfg(test)]
    pub(crate) fn get_or_create(&self, model: &str) -> Arc<Tree> {
        self.model(model).tree
    }

    /// The tree and correction state of `model`, created on first use.
    pub(crate) fn model(&self, model: &str) -> Model {
        if let Some(m) = self.map.load().get(model) {
            return m.clone();
        }
        let _writer = self.add.lock();
        let current = self.map.load_full();
        if let Some(m) = current.get(model) {
            return m.clone();
        }
        let created = Model {
            tree: Arc::new(Tree::new(TreeConfig {
                max_total_chars: self.upkeep.max_total_chars,
                ..TreeConfig::default()
            })),
            truth: Arc::new(ModelTruth::default()),
        };
        let mut next = (*current).clone();
        next.insert(model.to_owned(), created.clone());
        self.map.store(Arc::new(next));
        created
    }

    /// The learned characters per token of every model, sorted by model.
    pub fn chars_per_token(&self) -> Vec<(String, f64)> {
        self.per_model(|t| t.rate().chars_per_token())
    }

    /// Every model's eviction rate (the share of its recent answers that
    /// trimmed its tree; [`ModelTruth::eviction_rate`]), sorted by model.
    pub fn eviction_rates(&self) -> Vec<(String, f64)> {
        self.per_model(|t| Some(t.eviction_rate()))
    }

    /// Every model's bound eviction rate (the share of its recent inserts
    /// that evicted to stay within their worker's cache;
    /// [`ModelTruth::bound_eviction_rate`]), sorted by model.
    pub fn bound_eviction_rates(&self) -> Vec<(String, f64)> {
        self.per_model(|t| Some(t.bound_eviction_rate()))
    }

    /// `figure` of every model's correction state that has one, sorted by
    /// model.
    fn per_model(&self, figure: impl Fn(&ModelTruth) -> Option<f64>) -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = self
            .map
            .load()
            .iter()
            .filter_map(|(m, r)| figure(&r.truth).map(|f| (m.clone(), f)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The learned characters per token of `model`, once learned.
    pub fn chars_per_token_of(&self, model: &str) -> Option<f64> {
        self.map.load().get(model)?.truth.rate().chars_per_token()
    }

    /// Records `text` (capped as a decision's would be) for `worker` in the
    /// tree of `model`, created on first use: a decision another router
    /// replica made. With `correction`, the worker's share stays within its
    /// cache as after the policy's own inserts, and the insert counts
    /// towards the model's bound eviction rate. Callers pass only pool keys
    /// of the worker set.
    pub(crate) fn insert_for(
        &self,
        model: &str,
        text: &str,
        worker: &Worker,
        correction: Option<CorrectionConfig>,
    ) {
        let Model { tree, truth } = self.model(model);
        let bound = correction.and_then(|c| c.tree_bound(worker, &truth));
        let receipt = tree.insert_within(self.cap(text), worker.id().tenant(), bound);
        truth.count_insert(bound, &receipt);
    }

    /// Drops the tree and correction state of every model `served` says
    /// no worker serves any more: a tree keeps its node arena however
    /// many tenants leave it, and its model's figures would be reported
    /// for ever. A model that comes back starts a new tree. Takes the
    /// writers' lock only when there is something to drop.
    pub(crate) fn retain_models(&self, served: impl Fn(&str) -> bool) {
        if self.map.load().keys().all(|m| served(m)) {
            return;
        }
        let _writer = self.add.lock();
        let current = self.map.load_full();
        let next: HashMap<String, Model> = current
            .iter()
            .filter(|(m, _)| served(m))
            .map(|(m, r)| (m.clone(), r.clone()))
            .collect();
        self.map.store(Arc::new(next));
    }

    /// Forgets a tenant in every tree.
    pub(crate) fn remove_tenant(&self, tenant: TenantId) {
        for m in self.map.load().values() {
            m.tree.remove_tenant(tenant);
            m.truth.forget(tenant);
        }
    }

    /// Forgets a tenant in the trees of the models `gone` names (a worker
    /// that no longer serves them).
    pub(crate) fn remove_tenant_where(&self, tenant: TenantId, gone: impl Fn(&str) -> bool) {
        for (model, m) in self.map.load().iter() {
            if gone(model) {
                m.tree.remove_tenant(tenant);
                m.truth.forget(tenant);
            }
        }
    }

    /// One eviction pass over every tree, down to `max_tree_size` characters
    /// per tenant; characters evicted.
    pub(crate) fn evict_now(&self) -> usize {
        self.map
            .load()
            .values()
            .map(|m| m.tree.evict(self.upkeep.max_tree_size).evicted_chars)
            .sum()
    }

    /// How often the background eviction should run; `None`: never.
    pub fn eviction_interval(&self) -> Option<Duration> {
        (self.upkeep.eviction_interval_secs > 0)
            .then(|| Duration::from_secs(self.upkeep.eviction_interval_secs))
    }

    /// A tenant's characters over all trees.
    pub fn tenant_chars(&self, tenant: TenantId) -> usize {
        self.map
            .load()
            .values()
            .map(|m| m.tree.tenant_size(tenant))
            .sum()
    }
}
