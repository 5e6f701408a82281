//! Per-tenant bookkeeping: a tenant's size and its eviction log.
//!
//! Both the insert path (`tree.rs`, which appends to the log) and eviction
//! (`evict.rs`, which consumes it) work on this state, so it lives apart from
//! either: `tree.rs` and `evict.rs` each depend on this module and `evict.rs`
//! on `tree.rs`, never the other way round.
//!
//! The log is a queue of `(time, node)` entries in increasing time, one per
//! insert (see `evict.rs` for why its first valid entry is always the
//! tenant's least-recently-used leaf). An entry is *valid* while the node
//! (same generation) is still held by the tenant with that very
//! `last_access`; stale entries are skipped when met and dropped in bulk when
//! the log doubles, which keeps it at most about twice the live entries.

use std::collections::VecDeque;

use crate::TenantId;
use crate::node::{Arena, NodeId, ROOT};

/// Logs shorter than this are never compacted.
const MIN_COMPACT_LEN: usize = 64;

/// "Tenant may evict `node` once it is a leaf with `last_access == time`".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LruEntry {
    pub(crate) time: u64,
    pub(crate) node: NodeId,
    pub(crate) generation: u32,
}

impl LruEntry {
    /// An entry for `node` as it is now (its current generation).
    pub(crate) fn new(arena: &Arena, time: u64, node: NodeId) -> Self {
        Self {
            time,
            node,
            generation: arena[node].generation,
        }
    }

    /// Whether the entry still names a leaf the tenant holds at `time`.
    pub(crate) fn is_valid(&self, arena: &Arena, tenant: TenantId) -> bool {
        let n = &arena[self.node];
        n.generation == self.generation
            && n.holder(tenant).is_some_and(|h| h.last_access == self.time)
    }
}

/// Per-tenant bookkeeping.
#[derive(Debug)]
pub(crate) struct TenantState {
    /// Characters held by the tenant (its [`crate::Tree::tenant_size`]).
    pub(crate) size: usize,
    /// Eviction log, oldest first.
    pub(crate) lru: VecDeque<LruEntry>,
    /// Compact `lru` once it grows past this length.
    compact_at: usize,
}

impl Default for TenantState {
    fn default() -> Self {
        Self {
            size: 0,
            lru: VecDeque::new(),
            compact_at: MIN_COMPACT_LEN,
        }
    }
}

impl TenantState {
    /// Gives `node` an entry, in time order, if it is now a leaf the tenant
    /// holds and has no entry with its time (a trim, `trim.rs`, can leave a
    /// node whose time no leaf below carries).
    pub(crate) fn log_leaf(&mut self, arena: &Arena, node: NodeId, tenant: TenantId) {
        if node == ROOT {
            return;
        }
        let Some(h) = arena[node].holder(tenant) else {
            return;
        };
        if h.held_children != 0 {
            return;
        }
        let entry = LruEntry::new(arena, h.last_access, node);
        let from = self.lru.partition_point(|e| e.time < entry.time);
        let to = self.lru.partition_point(|e| e.time <= entry.time);
        if !self.lru.range(from..to).any(|e| *e == entry) {
            self.lru.insert(to, entry);
        }
    }

    /// Drops stale entries once the log has doubled since the last compaction.
    pub(crate) fn compact_if_needed(&mut self, arena: &Arena, tenant: TenantId) {
        if self.lru.len() > self.compact_at {
            self.lru.retain(|e| e.is_valid(arena, tenant));
            self.lru.shrink_to(self.lru.len() * 2);
            self.compact_at = (self.lru.len() * 2).max(MIN_COMPACT_LEN);
        }
    }

    /// The oldest valid entry, after dropping stale ones in front of it.
    pub(crate) fn front(&mut self, arena: &Arena, tenant: TenantId) -> Option<LruEntry> {
        while let Some(&e) = self.lru.front() {
            if e.is_valid(arena, tenant) {
                return Some(e);
            }
            self.lru.pop_front();
        }
        None
    }
}
