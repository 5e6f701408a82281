//! The approximate multi-tenant radix tree that cache-aware routing is built on.
//!
//! One [`Tree`] records, for many tenants (workers), which request texts were
//! sent to them. It answers "which tenant most likely still holds the longest
//! prefix of this text in its KV cache?" without a tokenizer: it stores raw
//! Unicode characters on compressed edges and every count it reports is in
//! characters. It is *approximate* because it models what was sent, not what
//! the worker's cache really kept.
//!
//! # Semantics
//! - Holding a text holds all of its prefixes. A tenant's size is the number
//!   of distinct characters (prefix positions) it holds.
//! - Recency is a logical clock: each [`Tree::insert`] call takes the next
//!   tick, and every position on the inserted path gets that time for that
//!   tenant. Matching does not touch recency. Same calls, same tree.
//! - Eviction removes a tenant's least-recently-used *leaf* characters first
//!   and is exact to the character (see `evict.rs`). [`Tree::evict`] is the
//!   periodic per-tenant pass; [`TreeConfig::max_total_chars`] is the global
//!   bound enforced inline by inserts, so memory stays bounded between passes
//!   no matter how many tenants there are (it counts each node as
//!   [`TreeConfig::node_chars`] characters more, so that it bounds memory
//!   whatever the texts' shape).
//!
//! # Layout (one concept per file)
//! `node.rs` nodes and their arena; `text.rs` byte-level UTF-8 helpers;
//! `tenant.rs` a tenant's size and eviction log; `tree.rs` insert, match and
//! structural edits; `undo.rs` taking an insert back; `trim.rs` cutting a tenant's path
//! where its worker reported holding less; `evict.rs` per-tenant and global eviction, tenant
//! removal; `stats.rs` size figures and the invariant check; `types.rs` the
//! public value types. Dependencies point one way: `evict.rs` builds on
//! `tree.rs`, and both on `tenant.rs` and `node.rs`.
//!
//! # Concurrency, and why this lock
//! All state sits in one arena behind one `parking_lot::RwLock`. Matches (the
//! per-request hot path) take the read lock and run in parallel: they write
//! nothing shared, because recency changes only on insert. Inserts,
//! evictions and removals take the write lock. Alternatives considered:
//! per-node locks turn every step of a walk into a lock acquisition and make
//! splits and evictions, which edit parent and child together, a
//! lock-ordering problem; atomics per node for recency would only help if
//! matches touched recency, which they do not; sharding the root by first
//! character does not help the common case where all prompts start with the
//! same system prompt. One writer at a time costs little: an insert of a
//! 4 KiB prompt takes under a microsecond (BENCHMARKS.md), far below any
//! router's request rate. `parking_lot` rather than `std` for its task-fair
//! policy: a steady stream of readers cannot starve inserts.
//!
//! Costs: match and insert are one `memcmp` per edge on the path plus a
//! binary search per node; only the unmatched tail of a text is counted in
//! characters. Eviction costs O(log) per evicted node (see `evict.rs`).
//! Memory is one 88-byte node slot per edge plus the edge bytes (see
//! BENCHMARKS.md for bytes per stored character).

mod demand;
mod error;
mod evict;
mod node;
mod stats;
mod tenant;
mod text;
mod tree;
mod trim;
mod types;
mod undo;

#[cfg(test)]
mod tests;

pub use error::TreeError;
pub use evict::low_watermark;
pub use text::{cap_chars, count_chars};
pub use tree::Trail;
pub use types::{
    DEFAULT_NODE_CHARS, EvictionReport, PrefixMatch, TenantDepth, TenantHit, TenantId, TenantMatch,
    TenantMatches, TreeConfig, TreeStats,
};
pub use undo::Insertion;

use parking_lot::RwLock;

/// The multi-tenant tree. `Send + Sync`; share it behind an `Arc`.
pub struct Tree {
    config: TreeConfig,
    inner: RwLock<tree::Inner>,
}

impl Default for Tree {
    fn default() -> Self {
        Self::new(TreeConfig::default())
    }
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Tree {
    /// An empty tree.
    pub fn new(config: TreeConfig) -> Self {
        let inner = RwLock::new(tree::Inner::new(config.max_total_chars, config.node_chars));
        Self { config, inner }
    }

    /// The settings this tree was built with.
    pub fn config(&self) -> &TreeConfig {
        &self.config
    }

    /// Records that `tenant` was sent `text`: the tenant now holds every
    /// prefix of it, with the newest logical time along the path. Then, if
    /// all tenants together hold more than `max_total_chars` (each node
    /// counted as `node_chars` more), evicts least-recently-used leaves
    /// across tenants down to the low watermark.
    /// An empty text holds nothing (it still takes a clock tick).
    ///
    /// The returned [`Insertion`] can take the insert back with
    /// [`Tree::undo_insert`] (the worker rejected the request); dropping it
    /// costs nothing.
    pub fn insert(&self, text: &str, tenant: TenantId) -> Insertion {
        self.insert_within(text, tenant, None)
    }

    /// [`Tree::insert`], then, when `tenant` holds more than `bound`
    /// characters, evicts its least-recently-used leaves down to the bound's
    /// low watermark (`bound - bound / 16`, so that eviction comes in
    /// batches, not on every insert). The bound of a worker whose KV cache
    /// holds about that much: the tree then forgets what the cache, evicting
    /// least-recently-used too, has most likely lost.
    pub fn insert_within(&self, text: &str, tenant: TenantId, bound: Option<usize>) -> Insertion {
        let mut inner = self.inner.write();
        let receipt = inner.insert(text, tenant);
        inner.enforce_bounds(receipt, bound)
    }

    /// [`Tree::insert`] of the `text` that [`Tree::tenant_matches`] returned
    /// `matched` for: the same insert, without comparing the text again
    /// along the path that walk took, unless the tree changed shape since
    /// (another insert added or split a node, or an eviction removed one).
    /// `matched` must be of this very text; a match of another one makes
    /// the tree record a text that was never inserted.
    pub fn insert_matched(
        &self,
        text: &str,
        tenant: TenantId,
        matched: &TenantMatches,
    ) -> Insertion {
        self.insert_matched_within(text, tenant, matched, None)
    }

    /// [`Tree::insert_matched`] with [`Tree::insert_within`]'s bound.
    pub fn insert_matched_within(
        &self,
        text: &str,
        tenant: TenantId,
        matched: &TenantMatches,
        bound: Option<usize>,
    ) -> Insertion {
        let mut inner = self.inner.write();
        let receipt = inner.insert_trailed(text, tenant, &matched.trail);
        inner.enforce_bounds(receipt, bound)
    }

    /// Takes back an insert of `text` (the very text given to
    /// [`Tree::insert`]): removes the tenant's claim on the part of `text`
    /// it did not hold before that insert, as far as no later insert for
    /// the same tenant went through it since. What the tenant held before,
    /// and every other tenant's claims, stay as they are; the kept prefix
    /// keeps the insert's recency. Returns the characters removed.
    pub fn undo_insert(&self, text: &str, receipt: Insertion) -> usize {
        self.inner.write().undo(text, receipt)
    }

    /// The longest prefix of `text` held by any tenant, and every tenant
    /// holding all of it with its `last_access` there.
    pub fn prefix_match(&self, text: &str) -> PrefixMatch {
        let inner = self.inner.read();
        let walk = inner.walk(text, None);
        let tenants = if walk.chars == 0 {
            Vec::new()
        } else {
            inner.arena[walk.node]
                .holders
                .iter()
                .map(|h| TenantHit {
                    tenant: h.tenant,
                    last_access: h.last_access,
                })
                .collect()
        };
        drop(inner);
        // Full edges carry their char count, so only the unmatched rest of
        // the text still needs counting.
        let input_chars = walk.chars + text::count_chars(&text[walk.bytes..]);
        PrefixMatch {
            matched_chars: walk.chars,
            input_chars,
            tenants,
        }
    }

    /// The longest prefix of `text` held by `tenant`.
    pub fn prefix_match_for(&self, text: &str, tenant: TenantId) -> TenantMatch {
        let walk = self.inner.read().walk(text, Some(tenant));
        TenantMatch {
            matched_chars: walk.chars,
            input_chars: walk.chars + text::count_chars(&text[walk.bytes..]),
        }
    }

    /// Every tenant's own match of `text` (what [`prefix_match_for`] gives
    /// for each tenant), from one walk: the deepest node of the text's path
    /// a tenant holds ends its match, since holding a node holds its
    /// ancestors. Costs one walk plus the holders of the nodes on the path,
    /// where `prefix_match_for` per tenant would walk once per tenant.
    ///
    /// `share` is the demand on the match: the share of the tree's recent
    /// inserts (about the last 512, decayed) whose text ran through the
    /// match's character `matched_chars - within + 1` (`within` 1: its
    /// last character; a router that treats matches within G characters
    /// of the deepest as equal passes G, so that the share is that of the
    /// part every such holder holds). 0 when nothing matched, and while its
    /// decayed count is under 3 (about four recent inserts).
    ///
    /// [`prefix_match_for`]: Self::prefix_match_for
    pub fn tenant_matches(&self, text: &str, within: usize) -> TenantMatches {
        let inner = self.inner.read();
        let (walk, tenants, share, trail) = inner.walk_all(text, within);
        drop(inner);
        TenantMatches {
            share,
            trail,
            matched_chars: walk.chars,
            input_chars: walk.chars + text::count_chars(&text[walk.bytes..]),
            tenants,
        }
    }

    /// Cuts `tenant`'s path along `text` after its first `keep`
    /// characters: the worker reported holding only that much of it. Drops
    /// the tenant's claim on every text sharing more than `keep` characters
    /// with `text` (a KV cache is prefix-closed) that it last got before
    /// `older_than` (pass [`Insertion::time`] of the request's insert to
    /// keep what was sent since, the request included; `u64::MAX` for a
    /// plain cut). Texts branching off at or above the cut and other tenants
    /// stay. Returns the characters removed.
    pub fn trim(&self, text: &str, tenant: TenantId, keep: usize, older_than: u64) -> usize {
        self.inner.write().trim(text, tenant, keep, older_than)
    }

    /// Forgets everything `tenant` holds (e.g. the worker left the pool).
    pub fn remove_tenant(&self, tenant: TenantId) {
        self.inner.write().remove_tenant(tenant);
    }

    /// Characters held by `tenant` (0 if unknown).
    pub fn tenant_size(&self, tenant: TenantId) -> usize {
        self.inner.read().tenants.get(&tenant).map_or(0, |s| s.size)
    }

    /// Tenants holding at least one character, sorted.
    pub fn tenants(&self) -> Vec<TenantId> {
        let mut v: Vec<TenantId> = self.inner.read().tenants.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Evicts least-recently-used leaves of every tenant above
    /// `max_chars_per_tenant` until it holds exactly that many characters.
    /// Cost grows with what is evicted (plus one pass over the tenant table).
    pub fn evict(&self, max_chars_per_tenant: usize) -> EvictionReport {
        EvictionReport {
            evicted_chars: self.inner.write().evict_each(max_chars_per_tenant),
        }
    }

    /// Size figures (walks every node: for metrics and tests, not per request).
    pub fn stats(&self) -> TreeStats {
        self.inner.read().stats()
    }

    /// Checks every internal invariant (sizes equal recomputed sums,
    /// parent/child links, no empty edges but the root's, eviction logs cover
    /// every leaf). O(nodes × children); for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), TreeError> {
        self.inner.read().check_invariants()
    }
}
