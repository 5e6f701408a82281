//! The tree's state behind the lock: insert, match and the structural edits
//! (split an edge, add a leaf, drop a tenant's claim) that eviction reuses.
//! Eviction builds on this module (`evict.rs`); this module knows nothing of
//! eviction, only of the per-tenant log it appends to (`tenant.rs`).
//!
//! Everything here runs with the lock already taken: `&self` methods under the
//! read lock, `&mut self` under the write lock (see [`crate::Tree`]). The
//! logical clock lives here too, so every insert gets a distinct, increasing
//! time that no other insert shares — eviction order is then a total order
//! and the tree is deterministic for a given sequence of calls.

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::node::{Arena, Holder, Node, NodeId, ROOT};
use crate::tenant::{LruEntry, TenantState};
use crate::text::{common_prefix_len, count_chars, first_char, floor_char_boundary};
use crate::undo::Insertion;
use crate::{TenantDepth, TenantId};

/// Edges longer than this are stored as a chain of nodes, so that a char
/// count always fits the node's `u32`.
const MAX_EDGE_BYTES: usize = 1 << 30;

/// The whole mutable state of a [`crate::Tree`].
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) arena: Arena,
    pub(crate) tenants: HashMap<TenantId, TenantState>,
    /// Last logical time handed out (one tick per insert call).
    pub(crate) clock: u64,
    /// Sum of all tenants' sizes.
    pub(crate) tenant_chars: usize,
    /// Sum of all edges' chars (shared prefixes once).
    pub(crate) stored_chars: usize,
    /// Hard bound on the tree's weight ([`Inner::weight`]) after every
    /// insert.
    pub(crate) max_total_chars: usize,
    /// What the bound counts a node as, in characters.
    pub(crate) node_chars: usize,
}

/// Where a walk down the tree stopped.
pub(crate) struct Walk {
    /// Characters of the text matched.
    pub(crate) chars: usize,
    /// The node whose edge contains the end of the match (root if none).
    pub(crate) node: NodeId,
    /// Bytes of the text matched.
    pub(crate) bytes: usize,
}

/// The whole-edge nodes of a walk, for an insert of the same text after it
/// ([`crate::Tree::insert_matched`]): valid while the tree's shape counter
/// is what it was at the walk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trail {
    shape: u64,
    text_bytes: usize,
    /// Node and the text's bytes through the end of its edge, from the top.
    nodes: SmallVec<[(NodeId, usize); 8]>,
}

impl Trail {
    /// Whether the trail is a path of `text` in `arena` (for debug checks).
    fn follows(&self, arena: &Arena, text: &str) -> bool {
        let mut from = 0;
        self.nodes.iter().all(|&(id, through)| {
            let ok = text.get(from..through) == Some(&*arena[id].edge);
            from = through;
            ok
        })
    }
}

impl Inner {
    pub(crate) fn new(max_total_chars: usize, node_chars: usize) -> Self {
        Self {
            arena: Arena::default(),
            tenants: HashMap::new(),
            clock: 0,
            tenant_chars: 0,
            stored_chars: 0,
            max_total_chars,
            node_chars,
        }
    }

    /// What the global bound holds to: the tenants' characters, and
    /// `node_chars` for each node.
    pub(crate) fn weight(&self) -> usize {
        self.tenant_chars
            .saturating_add(self.node_chars.saturating_mul(self.arena.live()))
    }

    /// Follows `text` down from the root as far as it matches, only through
    /// nodes held by `only` when given.
    pub(crate) fn walk(&self, text: &str, only: Option<TenantId>) -> Walk {
        self.walk_visiting(text, only, |_, _, _| {})
    }

    /// [`walk`](Self::walk), calling `visit(node, chars matched through it)`
    /// for every node entered, top down (the last one possibly cut inside
    /// its edge).
    fn walk_visiting(
        &self,
        text: &str,
        only: Option<TenantId>,
        mut visit: impl FnMut(NodeId, usize, Option<usize>),
    ) -> Walk {
        let arena = &self.arena;
        let mut node = ROOT;
        let mut pos = 0;
        let mut chars = 0;
        while pos < text.len() {
            let rest = &text[pos..];
            let Some(child) = arena[node].child(first_char(rest)) else {
                break;
            };
            let next = &arena[child];
            if only.is_some_and(|t| !next.holds(t)) {
                break;
            }
            let edge = next.edge.as_bytes();
            let common = common_prefix_len(edge, rest.as_bytes());
            node = child;
            if common == edge.len() {
                chars += next.edge_chars as usize;
                pos += common;
                visit(child, chars, Some(pos));
            } else {
                // The child was found by its first char, so `cut` > 0.
                let cut = floor_char_boundary(rest, common);
                chars += count_chars(&rest[..cut]);
                pos += cut;
                visit(child, chars, None);
                break;
            }
        }
        Walk {
            chars,
            node,
            bytes: pos,
        }
    }

    /// Like [`walk`](Self::walk) without a tenant filter, also collecting
    /// every holder along the path with the depth of the deepest path node
    /// it holds (sorted by tenant), the demand share (`demand.rs`) of the
    /// path node holding the match's character `chars - within + 1` (0 when
    /// nothing matched), and the trail for an insert of the same text.
    pub(crate) fn walk_all(
        &self,
        text: &str,
        within: usize,
    ) -> (Walk, Vec<TenantDepth>, f64, Trail) {
        let arena = &self.arena;
        // Nodes on the path with the characters matched through each.
        let mut path: SmallVec<[(NodeId, usize); 16]> = SmallVec::new();
        let mut trail = Trail {
            shape: arena.shape(),
            text_bytes: text.len(),
            nodes: SmallVec::new(),
        };
        let walk = self.walk_visiting(text, None, |id, chars, whole| {
            path.push((id, chars));
            if let Some(bytes) = whole {
                trail.nodes.push((id, bytes));
            }
        });
        // Holding is prefix-closed, so the first node's holders (sorted by
        // tenant, as every node's are) are every tenant on the path; going
        // deeper, each holder's depth and access time are overwritten by
        // the deeper node's, found by a search forward from the previous
        // holder's place.
        let mut depths: Vec<TenantDepth> = path.first().map_or_else(Vec::new, |&(id, depth)| {
            arena[id]
                .holders
                .iter()
                .map(|h| TenantDepth {
                    tenant: h.tenant,
                    matched_chars: depth,
                    last_access: h.last_access,
                })
                .collect()
        });
        for &(id, depth) in path.iter().skip(1) {
            let mut from = 0;
            for h in &arena[id].holders {
                from += depths[from..].partition_point(|d| d.tenant < h.tenant);
                let d = TenantDepth {
                    tenant: h.tenant,
                    matched_chars: depth,
                    last_access: h.last_access,
                };
                match depths.get_mut(from) {
                    Some(at) if at.tenant == h.tenant => *at = d,
                    // (Not above: an invariant broken; still reported.)
                    _ => depths.insert(from, d),
                }
            }
        }
        // The node holding the match's character `chars - within + 1`.
        let from = walk.chars.saturating_sub(within.saturating_sub(1)).max(1);
        let share = path
            .iter()
            .find(|&&(_, chars)| chars >= from)
            .map_or(0.0, |&(id, _)| crate::demand::share(&arena[id], self.clock));
        (walk, depths, share, trail)
    }

    /// Records that `tenant` was sent `text` at a new logical time. The
    /// caller then enforces the bounds (`Inner::enforce_bounds`,
    /// in `evict.rs`), under the same write lock. Returns the receipt that
    /// `Inner::undo` takes back.
    pub(crate) fn insert(&mut self, text: &str, tenant: TenantId) -> Insertion {
        self.insert_along(text, tenant, &[])
    }

    /// [`insert`](Self::insert) of `text`, a walk of which `trail` recorded:
    /// while the tree's shape is what the walk saw, its whole-edge nodes are
    /// taken without comparing the text again. Otherwise a plain insert.
    pub(crate) fn insert_trailed(
        &mut self,
        text: &str,
        tenant: TenantId,
        trail: &Trail,
    ) -> Insertion {
        if trail.shape != self.arena.shape() || trail.text_bytes != text.len() {
            return self.insert(text, tenant);
        }
        debug_assert!(trail.follows(&self.arena, text), "a trail of another text");
        self.insert_along(text, tenant, &trail.nodes)
    }

    /// The insert, with `known` the path's first nodes (each with the
    /// text's bytes through the end of its edge) already matched in full.
    fn insert_along(
        &mut self,
        text: &str,
        tenant: TenantId,
        known: &[(NodeId, usize)],
    ) -> Insertion {
        self.clock += 1;
        let now = self.clock;
        let mut receipt = Insertion {
            tenant,
            time: now,
            held_chars: 0,
            bound_evicted: 0,
        };
        if text.is_empty() {
            return receipt;
        }
        let Self {
            arena,
            tenants,
            stored_chars,
            tenant_chars,
            ..
        } = self;
        let state = tenants.entry(tenant).or_default();
        let size_before = state.size;
        let mut node = ROOT;
        let mut pos = 0;
        // Counts the insert through `next` and gives it to the tenant,
        // adding what it held there already to the receipt.
        let mut enter = |arena: &mut Arena, state: &mut TenantState, next: NodeId| {
            crate::demand::bump(&mut arena[next], now);
            if touch(arena, state, next, tenant, now) {
                receipt.held_chars += arena[next].edge_chars as usize;
            }
        };
        for &(next, through) in known {
            enter(arena, state, next);
            (node, pos) = (next, through);
        }
        let end = loop {
            if pos == text.len() {
                break node;
            }
            let rest = &text[pos..];
            let Some(child) = arena[node].child(first_char(rest)) else {
                break add_leaves(arena, state, stored_chars, node, rest, tenant, now);
            };
            let edge = arena[child].edge.as_bytes();
            let common = common_prefix_len(edge, rest.as_bytes());
            let next = if common == edge.len() {
                pos += common;
                child
            } else {
                let cut = floor_char_boundary(rest, common);
                pos += cut;
                split(arena, child, cut)
            };
            // Holding is prefix-closed, so the nodes the tenant already
            // held form the top of this path: their sum is what it held.
            enter(arena, state, next);
            node = next;
        };
        state.lru.push_back(LruEntry::new(arena, now, end));
        state.compact_if_needed(arena, tenant);
        *tenant_chars += state.size - size_before;
        receipt
    }
}

/// Marks `node` (whose parent the tenant already holds) as held by `tenant`
/// at `now`; returns whether the tenant held it already.
fn touch(
    arena: &mut Arena,
    state: &mut TenantState,
    node: NodeId,
    tenant: TenantId,
    now: u64,
) -> bool {
    let n = &mut arena[node];
    match n.holder_index(tenant) {
        Ok(i) => {
            n.holders[i].last_access = now;
            true
        }
        Err(i) => {
            n.holders.insert(
                i,
                Holder {
                    tenant,
                    held_children: 0,
                    last_access: now,
                },
            );
            state.size += n.edge_chars as usize;
            let parent = n.parent;
            count_held_child(arena, parent, tenant, 1);
            false
        }
    }
}

/// Adjusts the parent's count of children held by `tenant` (root keeps none).
pub(crate) fn count_held_child(arena: &mut Arena, parent: NodeId, tenant: TenantId, delta: i32) {
    if parent == ROOT {
        return;
    }
    if let Some(h) = arena[parent].holder_mut(tenant) {
        h.held_children = h.held_children.saturating_add_signed(delta);
    }
}

/// Hangs `rest` (non-empty) under `parent` as new nodes held only by `tenant`;
/// returns the deepest one.
fn add_leaves(
    arena: &mut Arena,
    state: &mut TenantState,
    stored_chars: &mut usize,
    mut parent: NodeId,
    mut rest: &str,
    tenant: TenantId,
    now: u64,
) -> NodeId {
    while !rest.is_empty() {
        let cut = floor_char_boundary(rest, rest.len().min(MAX_EDGE_BYTES));
        let (piece, tail) = rest.split_at(cut);
        let mut node = Node::new(piece.into(), parent);
        crate::demand::bump(&mut node, now);
        node.holders.push(Holder {
            tenant,
            held_children: 0,
            last_access: now,
        });
        let chars = node.edge_chars as usize;
        let id = arena.alloc(node);
        arena.link_child(parent, first_char(piece), id);
        count_held_child(arena, parent, tenant, 1);
        state.size += chars;
        *stored_chars += chars;
        parent = id;
        rest = tail;
    }
    parent
}

/// Splits `node`'s edge at byte `cut` (a char boundary strictly inside it).
/// A new node takes the upper part; `node` keeps the lower part, its id, its
/// children and its end depth, so eviction-log entries naming it stay valid.
/// Returns the new upper node.
pub(crate) fn split(arena: &mut Arena, node: NodeId, cut: usize) -> NodeId {
    let n = &mut arena[node];
    debug_assert!(cut > 0 && cut < n.edge.len());
    let upper_edge: Box<str> = n.edge[..cut].into();
    n.edge = n.edge[cut..].into();
    let lower_first = first_char(&n.edge);
    let upper_first = first_char(&upper_edge);
    let parent = n.parent;
    let mut upper = Node::new(upper_edge, parent);
    n.edge_chars -= upper.edge_chars;
    upper.holders = n
        .holders
        .iter()
        .map(|h| Holder {
            held_children: 1,
            ..*h
        })
        .collect();
    upper.children = vec![(lower_first, node)];
    upper.demand = arena[node].demand;
    upper.touched = arena[node].touched;
    let id = arena.alloc(upper);
    arena[node].parent = id;
    arena.link_child(parent, upper_first, id);
    id
}

/// Drops `tenant`'s claim on `node` (a leaf for it) and frees the node when
/// nobody holds it any more. Returns the chars the tenant lost.
pub(crate) fn release(
    arena: &mut Arena,
    stored_chars: &mut usize,
    node: NodeId,
    tenant: TenantId,
) -> usize {
    let n = &mut arena[node];
    let Ok(i) = n.holder_index(tenant) else {
        return 0;
    };
    debug_assert_eq!(n.holders[i].held_children, 0);
    n.holders.remove(i);
    let chars = n.edge_chars as usize;
    let parent = n.parent;
    let empty = n.holders.is_empty();
    count_held_child(arena, parent, tenant, -1);
    if empty {
        *stored_chars -= chars;
        arena.free(node);
    }
    chars
}
