//! Trimming one tenant's claim on a text: the worker reported that it held
//! less of the text than the tree predicted (its own cache evicted what the
//! router still remembers), so the tree should forget what it lost.
//!
//! [`Inner::trim`] cuts the tenant's path along the text after `keep`
//! characters: it drops the tenant's claim on every text it holds that
//! shares more than `keep` characters with this one — the rest of this text
//! and every other text through the character after the cut — as far as
//! the tenant last got it before `older_than`. Engine KV caches are
//! prefix-closed (a block is only reachable through the blocks before it),
//! so a worker that had lost position `keep + 1` of this text had lost
//! every longer text through it too. `older_than` keeps what was sent to
//! the worker since the cache was looked at (the request itself, when the
//! caller passes its insert's time: the worker has just computed it). With
//! `u64::MAX` the cut is plain. Texts branching off at or above the cut and
//! other tenants are untouched.
//!
//! Because an insert stamps its whole path, a node's time is never older
//! than its children's: the nodes older than `older_than` below the cut
//! form whole subtrees, each released leaf-first like `remove_tenant` does.
//! The eviction log stays exact: the dropped nodes' entries become stale
//! (holder gone or slot freed), and a node that becomes a leaf for the
//! tenant gets an entry with its own time, in time order, unless one is
//! there already (an insert ended at it). Its time is the newest below it,
//! so the "first valid entry is the least-recently-used leaf" argument of
//! `evict.rs` still holds. Runs under the write lock, like every edit.

use crate::TenantId;
use crate::node::{NodeId, ROOT};
use crate::text::{byte_offset_of_char, first_char};
use crate::tree::{Inner, release, split};

impl Inner {
    /// Drops `tenant`'s claims on texts sharing more than `keep` characters
    /// with `text` that it last got before `older_than`. Returns the
    /// characters removed.
    pub(crate) fn trim(
        &mut self,
        text: &str,
        tenant: TenantId,
        keep: usize,
        older_than: u64,
    ) -> usize {
        // The tenant's node holding character `keep + 1` of the text: walk
        // its path while the text covers whole edges ending at or above the
        // cut.
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
        // The text must reach the character after the cut.
        let edge = &self.arena[cut_node].edge;
        let need = byte_offset_of_char(edge, keep - start + 1);
        if !text.as_bytes()[pos..].starts_with(&edge.as_bytes()[..need]) {
            return 0;
        }
        let old = |inner: &Self, n: NodeId| {
            inner.arena[n]
                .holder(tenant)
                .is_some_and(|h| h.last_access < older_than)
        };
        // Roots of the subtrees to drop, and the nodes that lose children.
        let mut roots = Vec::new();
        let mut parents = Vec::new();
        if old(self, cut_node) {
            let parent = if keep > start {
                // Keep the edge's upper part: split it off at the cut.
                let cut = byte_offset_of_char(edge, keep - start);
                split(&mut self.arena, cut_node, cut)
            } else {
                node
            };
            roots.push(cut_node);
            parents.push(parent);
        } else {
            let mut stack = vec![cut_node];
            while let Some(n) = stack.pop() {
                let mut lost = false;
                for &(_, c) in &self.arena[n].children {
                    if !self.arena[c].holds(tenant) {
                        continue;
                    }
                    if old(self, c) {
                        roots.push(c);
                        lost = true;
                    } else {
                        stack.push(c);
                    }
                }
                if lost {
                    parents.push(n);
                }
            }
        }
        let mut removed = 0;
        for root in roots {
            removed += self.release_subtree(root, tenant);
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
        for p in parents {
            state.log_leaf(&self.arena, p, tenant);
        }
        removed
    }

    /// Releases `tenant`'s claim on `top` and everything it holds below;
    /// returns the chars released (sizes are the caller's to fix).
    fn release_subtree(&mut self, top: NodeId, tenant: TenantId) -> usize {
        // Pre-order; releasing in reverse frees children before parents.
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
        order
            .into_iter()
            .rev()
            .map(|n| release(&mut self.arena, &mut self.stored_chars, n, tenant))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use crate::{TenantId, Tree};

    const A: TenantId = TenantId(1);
    const B: TenantId = TenantId(2);

    #[test]
    fn a_correction_drops_stale_siblings_and_keeps_the_request_and_others() {
        let tree = Tree::default();
        tree.insert("system prompt: q1", A);
        tree.insert("system prompt: q2", A);
        tree.insert("system prompt: q1", B);
        tree.insert("sys other", A);
        // The worker reports it held only "sys" of the next request.
        let r = tree.insert("system prompt: q3", A);
        let removed = tree.trim("system prompt: q3", A, 3, r.time());
        tree.check_invariants().unwrap();
        // The "1" and "2" branches older than the request go; the shared
        // "system prompt: q" is the request's own path, just computed.
        assert_eq!(removed, 2);
        assert_eq!(
            tree.prefix_match_for("system prompt: q1", A).matched_chars,
            16
        );
        assert_eq!(
            tree.prefix_match_for("system prompt: q3", A).matched_chars,
            17
        );
        assert_eq!(tree.prefix_match_for("sys other", A).matched_chars, 9);
        assert_eq!(
            tree.prefix_match_for("system prompt: q1", B).matched_chars,
            17
        );
        // A plain cut takes the request's own path too.
        assert_eq!(tree.trim("system prompt: q3", A, 3, u64::MAX), 14);
        tree.check_invariants().unwrap();
        assert_eq!(
            tree.prefix_match_for("system prompt: q3", A).matched_chars,
            3
        );
        assert_eq!(tree.tenant_size(A), 9);
    }

    #[test]
    fn a_parent_whose_newest_child_was_trimmed_stays_evictable() {
        // "éa" is newer than "éé": trimming it leaves "é" with a time no
        // leaf below carries. Evicting "éé", or undoing its insert, must
        // leave "é" a leaf with an eviction entry.
        for undo in [false, true] {
            let tree = Tree::default();
            let first = tree.insert("éé", A);
            tree.insert("éa", A);
            assert_eq!(tree.trim("éa", A, 1, u64::MAX), 1);
            tree.check_invariants().unwrap();
            if undo {
                assert_eq!(tree.undo_insert("éé", first), 1);
            } else {
                assert_eq!(tree.evict(1).evicted_chars, 1);
            }
            tree.check_invariants().unwrap();
            assert_eq!(tree.evict(0).evicted_chars, 1);
            assert_eq!(tree.tenant_size(A), 0);
        }
    }
}
