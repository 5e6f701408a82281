//! Trimming one tenant's claim on a text: the worker reported that it held
//! less of the text than the tree predicted (its own cache evicted what the
//! router still remembers), so the tree should forget the rest.
//!
//! [`Inner::trim`] cuts the tenant's path along the text after `keep`
//! characters and drops the tenant's claim on everything below the cut: the
//! rest of this text *and* every other text the tenant holds through the
//! character after the cut. Engine KV caches are prefix-closed (a block is
//! only reachable through the blocks before it), so a worker that lost
//! position `keep + 1` of this text has lost every longer text through it
//! too. Texts that branch off at or above the cut are untouched, and so is
//! every other tenant.
//!
//! The eviction log stays exact: the dropped nodes' entries become stale
//! (their holder is gone or the slot freed), and when the node at the cut
//! becomes a leaf for the tenant it gets an entry with its own time, in time
//! order, unless one is already there (an insert ended at it). Its time is
//! the newest on the tenant's path below it (inserts stamp whole paths), so
//! the "first valid entry is the least-recently-used leaf" argument of
//! `evict.rs` still holds. Runs under the write lock, like every edit.

use crate::TenantId;
use crate::node::ROOT;
use crate::tenant::LruEntry;
use crate::text::{byte_offset_of_char, first_char};
use crate::tree::{Inner, release, split};

impl Inner {
    /// Drops `tenant`'s claim on every position of `text` after the first
    /// `keep` characters, with everything it holds below them. Returns the
    /// characters removed (0 when the tenant held no more than `keep` of
    /// `text`).
    pub(crate) fn trim(&mut self, text: &str, tenant: TenantId, keep: usize) -> usize {
        // Find the tenant's node holding character `keep + 1` of the text:
        // walk its path while the text covers whole edges and they end at or
        // above the cut.
        let mut node = ROOT;
        let mut depth = 0;
        let mut pos = 0;
        let (cut_node, start) = loop {
            if pos >= text.len() {
                return 0;
            }
            let rest = &text[pos..];
            let Some(child) = self.arena[node].child(first_char(rest)) else {
                return 0;
            };
            let next = &self.arena[child];
            if !next.holds(tenant) {
                return 0;
            }
            let edge_chars = next.edge_chars as usize;
            if depth + edge_chars > keep {
                // The cut lies in this edge.
                break (child, depth);
            }
            let edge = next.edge.as_bytes();
            if !rest.as_bytes().starts_with(edge) {
                return 0;
            }
            depth += edge_chars;
            pos += edge.len();
            node = child;
        };
        // The text must match the edge at least through char `keep + 1`.
        let edge = &self.arena[cut_node].edge;
        let need = byte_offset_of_char(edge, keep - start + 1);
        if !text[pos..].as_bytes().starts_with(&edge.as_bytes()[..need]) {
            return 0;
        }
        let kept = if keep > start {
            // Keep the edge's upper part: split it off at the cut.
            let cut = byte_offset_of_char(edge, keep - start);
            split(&mut self.arena, cut_node, cut)
        } else {
            node
        };
        let top = cut_node;
        // Pre-order over what the tenant holds from `top` down; releasing
        // in reverse frees children before their parents.
        let mut order = Vec::new();
        let mut stack = vec![top];
        while let Some(n) = stack.pop() {
            order.push(n);
            stack.extend(
                self.arena[n]
                    .children
                    .iter()
                    .map(|&(_, c)| c)
                    .filter(|&c| self.arena[c].holds(tenant)),
            );
        }
        let mut removed = 0;
        for n in order.into_iter().rev() {
            removed += release(&mut self.arena, &mut self.stored_chars, n, tenant);
        }
        let Some(state) = self.tenants.get_mut(&tenant) else {
            return removed;
        };
        state.size -= removed;
        self.tenant_chars -= removed;
        if state.size == 0 {
            self.tenants.remove(&tenant);
            return removed;
        }
        if kept != ROOT
            && let Some(h) = self.arena[kept].holder(tenant)
            && h.held_children == 0
        {
            let entry = LruEntry::new(&self.arena, h.last_access, kept);
            let from = state.lru.partition_point(|e| e.time < entry.time);
            let to = state.lru.partition_point(|e| e.time <= entry.time);
            if !state.lru.range(from..to).any(|e| *e == entry) {
                state.lru.insert(to, entry);
            }
        }
        removed
    }
}
