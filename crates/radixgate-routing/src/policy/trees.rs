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
//! client, so the number of trees is bounded by the configured models.

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use radixgate_tree::{TenantId, Tree, TreeConfig};
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
}

/// The per-model prefix trees of one policy, and their upkeep.
#[derive(Debug)]
pub struct Trees {
    map: ArcSwap<HashMap<String, Arc<Tree>>>,
    add: Mutex<()>,
    upkeep: TreeUpkeep,
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

    /// The tree of `model`, if a request for it was routed.
    pub fn get(&self, model: &str) -> Option<Arc<Tree>> {
        self.map.load().get(model).cloned()
    }

    /// The tree of `model`, created on first use.
    pub(crate) fn get_or_create(&self, model: &str) -> Arc<Tree> {
        if let Some(t) = self.map.load().get(model) {
            return t.clone();
        }
        let _writer = self.add.lock();
        let current = self.map.load_full();
        if let Some(t) = current.get(model) {
            return t.clone();
        }
        let tree = Arc::new(Tree::new(TreeConfig {
            max_total_chars: self.upkeep.max_total_chars,
        }));
        let mut next = (*current).clone();
        next.insert(model.to_owned(), tree.clone());
        self.map.store(Arc::new(next));
        tree
    }

    /// Forgets a tenant in every tree.
    pub(crate) fn remove_tenant(&self, tenant: TenantId) {
        for tree in self.map.load().values() {
            tree.remove_tenant(tenant);
        }
    }

    /// One eviction pass over every tree, down to `max_tree_size` characters
    /// per tenant; characters evicted.
    pub(crate) fn evict_now(&self) -> usize {
        self.map
            .load()
            .values()
            .map(|t| t.evict(self.upkeep.max_tree_size).evicted_chars)
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
            .map(|t| t.tenant_size(tenant))
            .sum()
    }
}
