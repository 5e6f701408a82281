//! Taking an insert back: the worker rejected the request (a 400 or 413
//! answer), so the text never reached its cache and the tree should not
//! claim it did.
//!
//! Precision: [`Inner::insert`] returns an [`Insertion`] receipt with the
//! insert's logical time and how many characters of the text the tenant
//! already held. The undo walks the tenant's path along the same text and
//! releases, leaf-first, only the nodes deeper than that prefix that still
//! carry the insert's own time and are leaves for the tenant (the way
//! eviction releases leaves, `evict.rs`). So it never removes what the
//! tenant held before, never touches another tenant, and stops at anything
//! a later insert for the same tenant re-stamped (that request did reach
//! the worker). The kept prefix keeps the insert's recency: restoring older
//! times would need a log of them per insert, and one request's recency is
//! harmless. Runs under the write lock, like every edit.

use crate::TenantId;
use crate::node::ROOT;
use crate::tenant::LruEntry;
use crate::text::{byte_offset_of_char, first_char};
use crate::tree::{Inner, release, split};

/// What `Inner::insert` did for its tenant, so that `Inner::undo` can
/// take it back precisely.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insertion {
    /// The tenant the text was inserted for.
    pub(crate) tenant: TenantId,
    /// The insert's logical time.
    pub(crate) time: u64,
    /// Characters of the text the tenant already held before the insert.
    pub(crate) held_chars: usize,
    /// Characters of the tenant's least-recently-used leaves that the
    /// insert's bound evicted ([`crate::Tree::insert_within`]).
    pub(crate) bound_evicted: usize,
}

impl Insertion {
    /// The tenant the text was inserted for.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// The insert's logical time (see [`crate::Tree::trim`]).
    pub fn time(&self) -> u64 {
        self.time
    }

    /// Characters of the text the tenant already held before the insert
    /// (what an undo keeps).
    pub fn held_chars(&self) -> usize {
        self.held_chars
    }

    /// Characters of the tenant's least-recently-used leaves that the
    /// insert's bound evicted (0 without a bound, or within it).
    pub fn bound_evicted(&self) -> usize {
        self.bound_evicted
    }
}

impl Inner {
    /// Takes back what the insert of `receipt` added for its tenant along
    /// `text` (the same text): the tenant's claims deeper than the
    /// `held_chars` it already held, as far as they are still the insert's
    /// own (held with its time, and a leaf for the tenant). A later insert
    /// through the same nodes for the same tenant re-stamps them and so
    /// keeps them; what eviction already took is simply gone. Other tenants
    /// are untouched, and the prefix the tenant held before keeps its
    /// claim (with the insert's recency). Returns the characters removed.
    pub(crate) fn undo(&mut self, text: &str, receipt: Insertion) -> usize {
        let Insertion {
            tenant,
            time,
            held_chars: keep,
            ..
        } = receipt;
        // The tenant's path along `text`: the deepest node it holds whose
        // edge the text covers whole, and that node's depth in chars.
        let mut node = ROOT;
        let mut depth = 0;
        let mut pos = 0;
        while pos < text.len() {
            let rest = &text[pos..];
            let Some(child) = self.arena[node].child(first_char(rest)) else {
                break;
            };
            let next = &self.arena[child];
            let edge = next.edge.as_bytes();
            if !next.holds(tenant) || !rest.as_bytes().starts_with(edge) {
                break;
            }
            depth += next.edge_chars as usize;
            pos += edge.len();
            node = child;
        }
        let Some(state) = self.tenants.get_mut(&tenant) else {
            return 0;
        };
        let mut removed = 0;
        while node != ROOT && depth > keep {
            let Some(h) = self.arena[node].holder(tenant) else {
                break;
            };
            if h.last_access != time || h.held_children != 0 {
                break;
            }
            let edge_chars = self.arena[node].edge_chars as usize;
            let parent = self.arena[node].parent;
            if depth - edge_chars >= keep {
                removed += release(&mut self.arena, &mut self.stored_chars, node, tenant);
                depth -= edge_chars;
                node = parent;
            } else {
                // The edge crosses the kept prefix: keep its upper part.
                let cut = byte_offset_of_char(&self.arena[node].edge, edge_chars - (depth - keep));
                let upper = split(&mut self.arena, node, cut);
                removed += release(&mut self.arena, &mut self.stored_chars, node, tenant);
                depth = keep;
                node = upper;
            }
        }
        state.size -= removed;
        self.tenant_chars -= removed;
        if state.size == 0 {
            self.tenants.remove(&tenant);
        } else if removed > 0 && node != ROOT {
            let stamped = self.arena[node]
                .holder(tenant)
                .is_some_and(|h| h.last_access == time);
            if stamped {
                // The kept prefix ends at a node stamped with the insert's
                // time, and the entry that would have found it once it
                // became a leaf named the tail just removed: it needs its
                // own, in time order (a later insert may already have
                // appended). Its other children are older, so their entries
                // come first, as after any insert that ends inside the tree.
                let entry = LruEntry::new(&self.arena, time, node);
                let at = state.lru.partition_point(|e| e.time <= time);
                state.lru.insert(at, entry);
            } else {
                // A newer node left a leaf: its own newest child may have
                // been taken by a trim (`trim.rs`), so it may have no entry.
                state.log_leaf(&self.arena, node, tenant);
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use crate::{TenantId, Tree, TreeConfig};

    const A: TenantId = TenantId(1);
    const B: TenantId = TenantId(2);

    fn checked(tree: &Tree) {
        tree.check_invariants().unwrap();
    }

    #[test]
    fn undo_of_a_new_text_leaves_the_tree_as_it_was() {
        let tree = Tree::default();
        tree.insert("system: be brief", A);
        tree.insert("system: other", B);
        let before = tree.stats();
        let receipt = tree.insert("system: be brief. user: a huge rejected prompt", A);
        assert_eq!(receipt.held_chars(), "system: be brief".len());
        let removed = tree.undo_insert("system: be brief. user: a huge rejected prompt", receipt);
        assert_eq!(removed, ". user: a huge rejected prompt".len());
        checked(&tree);
        let after = tree.stats();
        assert_eq!(
            (after.chars, after.tenant_chars),
            (before.chars, before.tenant_chars)
        );
        assert_eq!(tree.tenant_size(A), "system: be brief".len());
        assert_eq!(tree.tenant_size(B), "system: other".len());
    }

    #[test]
    fn undo_splits_an_edge_at_the_kept_prefix_and_keeps_other_tenants() {
        let tree = Tree::default();
        tree.insert("abcdefgh", B);
        tree.insert("abc", A);
        let receipt = tree.insert("abcdefgh", A);
        assert_eq!(receipt.held_chars(), 3);
        assert_eq!(tree.undo_insert("abcdefgh", receipt), 5);
        checked(&tree);
        assert_eq!(tree.tenant_size(A), 3);
        assert_eq!(tree.tenant_size(B), 8);
        assert_eq!(tree.prefix_match_for("abcdefgh", A).matched_chars, 3);
        assert_eq!(tree.prefix_match("abcdefgh").matched_chars, 8);
    }

    #[test]
    fn a_later_insert_for_the_same_tenant_keeps_its_claim() {
        let tree = Tree::default();
        let first = tree.insert("shared prefix and more", A);
        tree.insert("shared prefix and more", A);
        assert_eq!(tree.undo_insert("shared prefix and more", first), 0);
        checked(&tree);
        assert_eq!(tree.tenant_size(A), "shared prefix and more".len());
    }

    #[test]
    fn undo_of_a_tenants_only_text_forgets_the_tenant_and_eviction_still_works() {
        let tree = Tree::default();
        let r = tree.insert("héllo wörld", A);
        assert_eq!(tree.undo_insert("héllo wörld", r), 11);
        assert_eq!(tree.tenants(), Vec::<TenantId>::new());
        assert_eq!(tree.stats().nodes, 0);
        tree.insert("abc", A);
        tree.insert("abd", A);
        let r = tree.insert("abcxyz", A);
        tree.insert("q", A);
        assert_eq!(tree.undo_insert("abcxyz", r), 3);
        checked(&tree);
        // The kept leaf "abc" carries the undone insert's time, between
        // "abd" and "q": eviction takes "d", then "c", and keeps "q".
        assert_eq!(tree.evict(3).evicted_chars, 2);
        checked(&tree);
        assert_eq!(tree.prefix_match_for("abd", A).matched_chars, 2);
        assert_eq!(tree.prefix_match_for("abc", A).matched_chars, 2);
        assert_eq!(tree.prefix_match_for("q", A).matched_chars, 1);
    }

    #[test]
    fn undo_after_the_global_bound_evicted_part_of_it_is_safe() {
        let tree = Tree::new(TreeConfig {
            max_total_chars: 16,
            node_chars: 0,
        });
        tree.insert("0123456789", B);
        let r = tree.insert("abcdefghijklmnop", A);
        checked(&tree);
        tree.undo_insert("abcdefghijklmnop", r);
        checked(&tree);
        assert_eq!(tree.tenant_size(A), 0);
    }
}
