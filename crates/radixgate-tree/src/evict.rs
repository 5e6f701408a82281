//! Eviction: least-recently-used leaves of a tenant go first.
//!
//! Each tenant keeps an *eviction log* (`tenant.rs`): a queue of `(time,
//! node)` entries in increasing time. An insert appends one entry for the node where its text
//! ends — O(1), no ordered-set update per node on the hot path. An entry is
//! *valid* while the node (same generation) is still held by the tenant with
//! that very `last_access`; anything else is stale and skipped when met.
//!
//! Why the first valid entry is always the tenant's least-recently-used leaf:
//! a node's time is the newest insert through it, so a parent is never older
//! than its child; the text with time `T` ended at the entry's node, so no
//! held child can have time `T`, and any older child would have had an older
//! valid entry, already evicted. When a whole leaf goes and its parent becomes
//! a leaf with the same time, the parent is pushed to the front (it is the
//! new minimum); a parent that becomes a leaf with a newer time normally has
//! its own entry (an insert ended at it), but a trim can take the child that
//! carried its time, so it gets one in time order if it has none; when an eviction stops inside an edge, the edge is split and
//! the kept upper part is pushed to the front (or, when the tenant is the
//! edge's only holder, the edge is shortened in place: no split, no copy).
//! `Tree::check_invariants` verifies that every tenant leaf has a valid entry
//! and that logs are sorted.
//!
//! Cost: each evicted node costs O(log) work plus the stale entries skipped,
//! and every entry is appended once, so eviction is proportional to what it
//! evicts, not to the tree (BENCHMARKS.md: ~0.3 µs per evicted node on a
//! first pass, against ~100 µs for merely walking a 16 M-char tree). Logs
//! are compacted (stale entries dropped) when they double, which keeps them
//! at most about twice the live entries.
//!
//! Eviction is exact to the character: it stops at the budget by splitting
//! the last edge, so `evict(max)` leaves every tenant at exactly `min(size,
//! max)` and the global bound lands on its low watermark. The global bound
//! evicts across tenants in one total LRU order (times are unique per
//! insert), down to `max - max / LOW_WATERMARK_DIV` so that a burst of inserts
//! pays for eviction in batches, not on every insert.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::node::{Arena, NodeId, ROOT};
use crate::tenant::{LruEntry, TenantState};
use crate::text::byte_offset_of_char;
use crate::tree::{Inner, release, split};
use crate::{Insertion, TenantId};

/// The global bound evicts down to `max - max / LOW_WATERMARK_DIV` chars.
const LOW_WATERMARK_DIV: usize = 16;

/// What a bound of `bound` chars evicts down to once exceeded
/// ([`crate::Tree::insert_within`]): 15/16 of it, so that eviction comes in
/// batches.
pub fn low_watermark(bound: usize) -> usize {
    bound - bound / LOW_WATERMARK_DIV
}

impl Inner {
    /// Brings every tenant to at most `max` chars; returns the chars evicted.
    pub(crate) fn evict_each(&mut self, max: usize) -> usize {
        let over: Vec<TenantId> = self
            .tenants
            .iter()
            .filter(|(_, s)| s.size > max)
            .map(|(&t, _)| t)
            .collect();
        over.into_iter()
            .map(|tenant| self.evict_tenant_to(tenant, max))
            .sum()
    }

    /// After the insert of `receipt`: its tenant's `bound`
    /// ([`Self::enforce_tenant_bound`], the chars evicted counted on the
    /// receipt), then the tree's ([`Self::enforce_total_bound`]).
    pub(crate) fn enforce_bounds(
        &mut self,
        mut receipt: Insertion,
        bound: Option<usize>,
    ) -> Insertion {
        if let Some(bound) = bound {
            receipt.bound_evicted = self.enforce_tenant_bound(receipt.tenant, bound);
        }
        self.enforce_total_bound();
        receipt
    }

    /// After an insert for `tenant`: if it holds more than `bound` chars,
    /// evicts its least-recently-used leaves down to the low watermark
    /// ([`low_watermark`]); returns the chars evicted.
    fn enforce_tenant_bound(&mut self, tenant: TenantId, bound: usize) -> usize {
        if self.tenants.get(&tenant).is_none_or(|s| s.size <= bound) {
            return 0;
        }
        self.evict_tenant_to(tenant, low_watermark(bound))
    }

    /// Evicts `tenant`'s least-recently-used leaves until it holds at most
    /// `target` chars; returns the chars evicted.
    fn evict_tenant_to(&mut self, tenant: TenantId, target: usize) -> usize {
        let mut evicted = 0;
        while let Some(excess) = self
            .tenants
            .get(&tenant)
            .and_then(|s| s.size.checked_sub(target))
            .filter(|&excess| excess > 0)
        {
            let step = self.evict_step(tenant, excess, 0);
            if step == 0 {
                break;
            }
            evicted += step;
        }
        evicted
    }

    /// After an insert: if all tenants together hold more than
    /// `max_total_chars`, evicts across tenants down to the low watermark;
    /// returns the chars evicted.
    fn enforce_total_bound(&mut self) -> usize {
        if self.weight() <= self.max_total_chars {
            return 0;
        }
        let target = low_watermark(self.max_total_chars);
        self.evict_global(target)
    }

    /// Evicts in global LRU order until the tree weighs at most `target`
    /// ([`Inner::weight`]); returns the chars evicted.
    fn evict_global(&mut self, target: usize) -> usize {
        let mut heap = BinaryHeap::with_capacity(self.tenants.len());
        for (&tenant, state) in &mut self.tenants {
            if let Some(e) = state.front(&self.arena, tenant) {
                heap.push(Reverse((e.time, tenant)));
            }
        }
        let mut evicted = 0;
        while self.weight() > target {
            let Some(Reverse((_, tenant))) = heap.pop() else {
                break;
            };
            evicted += self.evict_step(tenant, self.weight() - target, self.node_chars);
            if let Some(state) = self.tenants.get_mut(&tenant)
                && let Some(e) = state.front(&self.arena, tenant)
            {
                heap.push(Reverse((e.time, tenant)));
            }
        }
        evicted
    }

    /// Evicts at most `budget` (> 0) chars from `tenant`'s least-recently-used
    /// leaf; returns the chars evicted (0 when the tenant holds nothing).
    /// `split_cost` is what a split's new node weighs against the budget
    /// (the global bound's `node_chars`; 0 for a tenant's own bound): a
    /// shared edge cut inside evicts that much more, so that the step
    /// still frees `budget`, and is released whole when that reaches its
    /// length. (Otherwise each split would add back what it freed, and the
    /// next step cut the same path again, 64 characters at a time.)
    fn evict_step(&mut self, tenant: TenantId, budget: usize, split_cost: usize) -> usize {
        let Self {
            arena,
            tenants,
            stored_chars,
            tenant_chars,
            ..
        } = self;
        let Some(state) = tenants.get_mut(&tenant) else {
            return 0;
        };
        let Some(entry) = state.front(arena, tenant) else {
            return 0;
        };
        state.lru.pop_front();
        let node = entry.node;
        let edge_chars = arena[node].edge_chars as usize;
        let budget = if arena[node].holders.len() > 1 && budget < edge_chars {
            budget.saturating_add(split_cost)
        } else {
            budget
        };
        let evicted = if edge_chars <= budget {
            let parent = arena[node].parent;
            let evicted = release(arena, stored_chars, node, tenant);
            // The parent may now be a leaf of this same insert: it is next.
            if parent != ROOT
                && let Some(h) = arena[parent].holder(tenant)
                && h.held_children == 0
            {
                if h.last_access == entry.time {
                    push_front(state, arena, entry.time, parent);
                } else {
                    // A newer parent whose own newest child a trim took
                    // (`trim.rs`): it may have no entry yet.
                    state.log_leaf(arena, parent, tenant);
                }
            }
            evicted
        } else {
            // Keep the first chars of the edge, evict the rest.
            let keep = edge_chars - budget;
            let cut = byte_offset_of_char(&arena[node].edge, keep);
            if arena[node].holders.len() == 1 {
                // Only this tenant holds it (so it has no children): shorten
                // the edge in place instead of splitting and freeing.
                let n = &mut arena[node];
                let mut edge = String::from(std::mem::take(&mut n.edge));
                edge.truncate(cut);
                n.edge = edge.into_boxed_str();
                n.edge_chars -= budget as u32;
                arena.reshaped();
                *stored_chars -= budget;
                push_front(state, arena, entry.time, node);
                budget
            } else {
                let upper = split(arena, node, cut);
                push_front(state, arena, entry.time, upper);
                release(arena, stored_chars, node, tenant)
            }
        };
        state.size -= evicted;
        *tenant_chars -= evicted;
        if state.size == 0 {
            tenants.remove(&tenant);
        }
        evicted
    }

    /// Drops every claim of `tenant`; returns the chars it held.
    pub(crate) fn remove_tenant(&mut self, tenant: TenantId) -> usize {
        let Some(state) = self.tenants.remove(&tenant) else {
            return 0;
        };
        // Pre-order over the nodes it holds (prefix-closed, so a walk from
        // the root finds all of them); releasing in reverse frees children
        // before their parents.
        let mut order = Vec::new();
        let mut stack = vec![ROOT];
        while let Some(n) = stack.pop() {
            if n != ROOT {
                order.push(n);
            }
            let children = &self.arena[n].children;
            stack.extend(
                children
                    .iter()
                    .map(|&(_, c)| c)
                    .filter(|&c| self.arena[c].holds(tenant)),
            );
        }
        for n in order.into_iter().rev() {
            release(&mut self.arena, &mut self.stored_chars, n, tenant);
        }
        self.tenant_chars -= state.size;
        state.size
    }
}

fn push_front(state: &mut TenantState, arena: &Arena, time: u64, node: NodeId) {
    state.lru.push_front(LruEntry::new(arena, time, node));
}
