//! Nodes of the compressed radix tree and the arena that owns them.
//!
//! A node owns one edge: a non-empty run of characters (root excepted, whose
//! edge is empty). Nodes live in one `Vec` and refer to each other by `u32`
//! index, so a node costs no pointer chasing through separate boxes and the
//! whole tree is guarded by the single lock in [`crate::Tree`].
//!
//! Invariants (checked by `Tree::check_invariants`):
//! - every non-root node is held by at least one tenant; a tenant that holds a
//!   node holds its parent (holding a text holds all its prefixes), with a
//!   `last_access` at the parent no older than at the child;
//! - a tenant holds either all of an edge or none of it: a text that ends, or
//!   an eviction that stops, inside an edge first splits that edge;
//! - children are sorted by their edge's first character (distinct by
//!   construction), so lookup is a binary search over a small inline-ish vec
//!   instead of a hash map per node;
//! - holders are sorted by tenant id, so the thousand-tenant case is a binary
//!   search (one holder, the common case, is stored inline), and `held_children` counts the children the same tenant holds, so
//!   "is this node a leaf for tenant t" is O(log tenants), not O(children).
//!
//! A freed slot bumps its `generation`, so stale eviction-log entries that
//! still name the slot are recognised and skipped.

use smallvec::SmallVec;

use crate::TenantId;

/// Holders of a node: most nodes (every unique suffix) have exactly one,
/// which then lives inline in the node instead of in its own allocation.
pub(crate) type Holders = SmallVec<[Holder; 1]>;

/// Index of a node in the [`Arena`].
pub(crate) type NodeId = u32;

/// The root: empty edge, never held, never freed.
pub(crate) const ROOT: NodeId = 0;

/// A tenant's claim on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) tenant: TenantId,
    /// How many children of this node the same tenant holds (0: a leaf for it).
    pub(crate) held_children: u32,
    /// Logical time of the tenant's newest insert through this node.
    pub(crate) last_access: u64,
}

/// One node of the tree.
#[derive(Debug, Default)]
pub(crate) struct Node {
    /// The characters on the edge from the parent to this node.
    pub(crate) edge: Box<str>,
    /// `edge.chars().count()`, kept so full-edge matches need no counting.
    pub(crate) edge_chars: u32,
    pub(crate) parent: NodeId,
    pub(crate) generation: u32,
    /// `(first char of the child's edge, child)`, sorted by char.
    pub(crate) children: Vec<(char, NodeId)>,
    /// Tenants holding this node, sorted by tenant.
    pub(crate) holders: Holders,
    /// Inserts through this node, decayed by the clock (see `demand.rs`).
    pub(crate) demand: f32,
    /// Clock (low 32 bits) of the newest insert through this node.
    pub(crate) touched: u32,
}

impl Node {
    /// A fresh node; the arena fills in the generation.
    pub(crate) fn new(edge: Box<str>, parent: NodeId) -> Self {
        let edge_chars = u32::try_from(crate::text::count_chars(&edge)).unwrap_or(u32::MAX);
        Self {
            edge,
            edge_chars,
            parent,
            ..Self::default()
        }
    }

    /// The child whose edge starts with `c`.
    #[inline]
    pub(crate) fn child(&self, c: char) -> Option<NodeId> {
        self.children
            .binary_search_by_key(&c, |&(k, _)| k)
            .ok()
            .map(|i| self.children[i].1)
    }

    #[inline]
    pub(crate) fn holder_index(&self, tenant: TenantId) -> Result<usize, usize> {
        self.holders.binary_search_by_key(&tenant, |h| h.tenant)
    }

    #[inline]
    pub(crate) fn holder(&self, tenant: TenantId) -> Option<&Holder> {
        self.holder_index(tenant).ok().map(|i| &self.holders[i])
    }

    #[inline]
    pub(crate) fn holder_mut(&mut self, tenant: TenantId) -> Option<&mut Holder> {
        self.holder_index(tenant).ok().map(|i| &mut self.holders[i])
    }

    #[inline]
    pub(crate) fn holds(&self, tenant: TenantId) -> bool {
        self.holder_index(tenant).is_ok()
    }
}

/// Slots per arena chunk. Chunks never move or grow, so the arena wastes at
/// most one partly filled chunk instead of the up-to-half-empty tail a
/// doubling `Vec` keeps (measured: it took a 100-byte-prompt tree from 5.1 to
/// 9 bytes per stored char once the node count crossed a power of two).
const CHUNK_BITS: u32 = 10;
const CHUNK: usize = 1 << CHUNK_BITS;

/// Owner of all nodes; slot 0 is the root.
#[derive(Debug)]
pub(crate) struct Arena {
    chunks: Vec<Vec<Node>>,
    free: Vec<NodeId>,
    slots: usize,
    live: usize,
    /// Bumped by every change to which nodes exist, their links or their
    /// edges: a path recorded under one value is still the tree's path
    /// while the value stays (see `Trail`).
    shape: u64,
}

impl Default for Arena {
    fn default() -> Self {
        let mut first = Vec::with_capacity(CHUNK);
        first.push(Node::default());
        Self {
            chunks: vec![first],
            free: Vec::new(),
            slots: 1,
            live: 0,
            shape: 0,
        }
    }
}

impl std::ops::Index<NodeId> for Arena {
    type Output = Node;
    #[inline]
    fn index(&self, id: NodeId) -> &Node {
        &self.chunks[(id >> CHUNK_BITS) as usize][id as usize & (CHUNK - 1)]
    }
}

impl std::ops::IndexMut<NodeId> for Arena {
    #[inline]
    fn index_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.chunks[(id >> CHUNK_BITS) as usize][id as usize & (CHUNK - 1)]
    }
}

impl Arena {
    /// Stores `node` in a free slot (or a new one) and returns its id.
    pub(crate) fn alloc(&mut self, mut node: Node) -> NodeId {
        self.live += 1;
        self.reshaped();
        if let Some(id) = self.free.pop() {
            node.generation = self[id].generation;
            self[id] = node;
            id
        } else {
            let id = NodeId::try_from(self.slots).expect("more than 2^32 tree nodes");
            if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
                self.chunks.push(Vec::with_capacity(CHUNK));
            }
            if let Some(chunk) = self.chunks.last_mut() {
                chunk.push(node);
            }
            self.slots += 1;
            id
        }
    }

    /// Unlinks a node that has no holders and no children, and frees its slot.
    pub(crate) fn free(&mut self, id: NodeId) {
        debug_assert!(id != ROOT);
        let node = &mut self[id];
        debug_assert!(node.holders.is_empty() && node.children.is_empty());
        let first = crate::text::first_char(&node.edge);
        let parent = node.parent;
        let generation = node.generation.wrapping_add(1);
        *node = Node {
            generation,
            ..Node::default()
        };
        self.unlink_child(parent, first);
        self.reshaped();
        self.free.push(id);
        self.live -= 1;
    }

    /// Adds `child` (whose edge starts with `first`) under `parent`.
    pub(crate) fn link_child(&mut self, parent: NodeId, first: char, child: NodeId) {
        self.reshaped();
        let children = &mut self[parent].children;
        match children.binary_search_by_key(&first, |&(k, _)| k) {
            Ok(i) => children[i].1 = child,
            Err(i) => children.insert(i, (first, child)),
        }
    }

    fn unlink_child(&mut self, parent: NodeId, first: char) {
        let children = &mut self[parent].children;
        if let Ok(i) = children.binary_search_by_key(&first, |&(k, _)| k) {
            children.remove(i);
        }
    }

    /// Records a change of shape: nodes, links or edges (every change but
    /// an edge shortened in place goes through `alloc`, `free` or
    /// `link_child`, which call this).
    pub(crate) fn reshaped(&mut self) {
        self.shape = self.shape.wrapping_add(1);
    }

    /// The shape counter: equal values, the same nodes, links and edges.
    pub(crate) fn shape(&self) -> u64 {
        self.shape
    }

    /// Live nodes, root excluded.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Every slot id, live or free (for whole-tree walks in stats and checks).
    pub(crate) fn slots(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.chunks
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, n)| (i as NodeId, n))
    }

    /// Whether slot `id` holds a live node (root included).
    pub(crate) fn is_live(&self, id: NodeId) -> bool {
        id == ROOT || !self[id].holders.is_empty()
    }

    /// Bytes owned by the arena's own vectors (not the nodes' heap parts).
    pub(crate) fn own_bytes(&self) -> usize {
        self.chunks.len() * CHUNK * std::mem::size_of::<Node>()
            + self.chunks.capacity() * std::mem::size_of::<Vec<Node>>()
            + self.free.capacity() * std::mem::size_of::<NodeId>()
    }
}
