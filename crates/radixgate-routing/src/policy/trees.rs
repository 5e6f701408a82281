//! One radix tree per pool key (model), shared by the prefix-aware policies.
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

/// The per-model trees of one policy.
#[derive(Debug)]
pub(crate) struct Trees {
    map: ArcSwap<HashMap<String, Arc<Tree>>>,
    add: Mutex<()>,
    max_total_chars: usize,
}

impl Trees {
    /// Trees whose global bound is `max_total_chars` each.
    pub(crate) fn new(max_total_chars: usize) -> Self {
        Self {
            map: ArcSwap::from_pointee(HashMap::new()),
            add: Mutex::new(()),
            max_total_chars,
        }
    }

    /// The tree of `model`, if one was created.
    pub(crate) fn get(&self, model: &str) -> Option<Arc<Tree>> {
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
            max_total_chars: self.max_total_chars,
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

    /// One eviction pass over every tree; characters evicted.
    pub(crate) fn evict(&self, max_chars_per_tenant: usize) -> usize {
        self.map
            .load()
            .values()
            .map(|t| t.evict(max_chars_per_tenant).evicted_chars)
            .sum()
    }

    /// A tenant's characters over all trees.
    pub(crate) fn tenant_chars(&self, tenant: TenantId) -> usize {
        self.map
            .load()
            .values()
            .map(|t| t.tenant_size(tenant))
            .sum()
    }
}
