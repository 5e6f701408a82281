//! The paged KV cache: a radix structure of full token blocks.
//!
//! Role: decide how many prompt tokens a request finds cached, hold the
//! pages of running requests, keep finished requests' pages as reusable
//! prefix cache, and evict least-recently-used leaves when room is needed.
//!
//! Shape: every full block of `block_size` tokens is one node, identified by
//! a chain hash of all tokens from the start of the sequence to the end of
//! the block (so equal hashes mean equal prefixes, up to 64-bit collisions,
//! which we accept). A node's parent is the block before it.
//!
//! Invariants (tested by the property tests in `cache/tests.rs`):
//! - `tree_blocks + reserved_blocks <= capacity_blocks`, always;
//! - a pinned node's ancestors are pinned (pins are taken on whole paths from
//!   the root), so only unpinned nodes with no children are evictable, and
//!   every unpinned node can eventually be evicted leaf-first;
//! - pinned nodes are never evicted, so node ids held in a [`PinnedPath`]
//!   stay valid until released;
//! - eviction takes the evictable leaf with the oldest access tick.
//!
//! Events: when [`KvCache::record_events`] is on, every change to the set
//! of cached blocks is logged as a [`CacheEvent`], in order, for the
//! worker's KV-event publisher: a run of blocks entering the tree (with the
//! hash of the block before the run and the run's token ids), blocks
//! evicted, and the whole tree emptied by a flush. Replaying the log on an
//! empty set gives exactly the cache's set of block hashes (property test
//! `events_replay_to_the_cached_set`). Off, it costs one branch per change.
//!
//! Concurrency: none; the cache is owned by one engine, driven by one task.

use std::collections::{BTreeSet, HashMap};

/// A node index into the cache's slab.
type NodeId = u32;

const ROOT_HASH: u64 = 0x243f_6a88_85a3_08d3;

/// A change to the set of cached blocks, as KV-event publishers report it
/// (vLLM's and SGLang's `BlockStored`, `BlockRemoved`, `AllBlocksCleared`).
/// Hashes are this cache's chain hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Consecutive blocks of one sequence entered the cache.
    Stored {
        /// The blocks' chain hashes, root-most first.
        hashes: Vec<u64>,
        /// The hash of the block before the first one; `None` at the root.
        parent: Option<u64>,
        /// The blocks' token ids, `block_size` per block, in order.
        tokens: Vec<u64>,
    },
    /// Blocks left the cache (evicted).
    Removed {
        /// Their chain hashes.
        hashes: Vec<u64>,
    },
    /// Every block left the cache (a flush that emptied it).
    Cleared,
}

#[derive(Debug, Clone)]
struct Node {
    hash: u64,
    parent: Option<NodeId>,
    children: u32,
    pins: u32,
    last_access: u64,
}

/// A pinned path of blocks from the root, owned by one running request.
/// It must be handed back with [`KvCache::release`]; dropping it leaks the
/// pins (the engine owns every path and releases each exactly once).
#[derive(Debug, Default)]
#[must_use = "a pinned path must be released"]
pub struct PinnedPath {
    nodes: Vec<NodeId>,
}

impl PinnedPath {
    /// Number of blocks on the path.
    pub fn blocks(&self) -> usize {
        self.nodes.len()
    }
}

/// The paged prefix cache of one worker.
#[derive(Debug)]
pub struct KvCache {
    block_size: usize,
    capacity_blocks: usize,
    nodes: Vec<Option<Node>>,
    free_slots: Vec<NodeId>,
    index: HashMap<u64, NodeId>,
    evictable: BTreeSet<(u64, NodeId)>,
    tick: u64,
    tree_blocks: usize,
    unpinned_blocks: usize,
    reserved_blocks: usize,
    evicted_blocks: u64,
    /// The event log, when recording (see the module doc).
    events: Option<Vec<CacheEvent>>,
}

impl KvCache {
    /// An empty cache of `capacity_blocks` blocks of `block_size` tokens.
    pub fn new(block_size: usize, capacity_blocks: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            capacity_blocks,
            nodes: Vec::new(),
            free_slots: Vec::new(),
            index: HashMap::new(),
            evictable: BTreeSet::new(),
            tick: 0,
            tree_blocks: 0,
            unpinned_blocks: 0,
            reserved_blocks: 0,
            evicted_blocks: 0,
            events: None,
        }
    }

    /// Starts (or stops, dropping what was logged) recording [`CacheEvent`]s.
    pub fn record_events(&mut self, on: bool) {
        self.events = on.then(Vec::new);
    }

    /// The events logged since the last call, oldest first (empty when not
    /// recording).
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Capacity in blocks.
    pub fn capacity_blocks(&self) -> usize {
        self.capacity_blocks
    }

    /// Blocks held by the prefix tree (pinned or cached).
    pub fn tree_blocks(&self) -> usize {
        self.tree_blocks
    }

    /// Blocks in the tree that no running request pins (reusable cache).
    pub fn unpinned_blocks(&self) -> usize {
        self.unpinned_blocks
    }

    /// Blocks reserved by running requests but not yet in the tree.
    pub fn reserved_blocks(&self) -> usize {
        self.reserved_blocks
    }

    /// Blocks in use: tree plus reservations. Never above capacity.
    pub fn used_blocks(&self) -> usize {
        self.tree_blocks + self.reserved_blocks
    }

    /// Blocks evicted since creation.
    pub fn evicted_blocks(&self) -> u64 {
        self.evicted_blocks
    }

    /// The chain hashes of the full blocks of `tokens`.
    pub fn block_hashes(&self, tokens: &[u64]) -> Vec<u64> {
        let mut h = ROOT_HASH;
        tokens
            .chunks_exact(self.block_size)
            .map(|block| {
                for &t in block {
                    h = mix(h ^ t);
                }
                h
            })
            .collect()
    }

    /// How many leading blocks of `hashes` are cached (read-only: does not
    /// touch the LRU order).
    pub fn match_blocks(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.index.contains_key(h))
            .count()
    }

    /// How many leading tokens of `tokens` are cached, in whole blocks
    /// (read-only; for oracles and reports).
    pub fn cached_prefix_tokens(&self, tokens: &[u64]) -> usize {
        self.match_blocks(&self.block_hashes(tokens)) * self.block_size
    }

    /// Pins the first `matched` blocks of `hashes` (which must be cached)
    /// and reserves `extra` further blocks, evicting unpinned leaves if
    /// needed. Returns `None`, changing nothing, when it cannot fit.
    pub fn acquire(&mut self, hashes: &[u64], matched: usize, extra: usize) -> Option<PinnedPath> {
        let matched = matched.min(self.match_blocks(hashes));
        let ids: Vec<NodeId> = hashes[..matched].iter().map(|h| self.index[h]).collect();
        let matched_unpinned = ids.iter().filter(|&&id| self.node(id).pins == 0).count();
        let free = self.capacity_blocks - self.used_blocks();
        if free + (self.unpinned_blocks - matched_unpinned) < extra {
            return None;
        }
        let path = PinnedPath { nodes: ids };
        self.pin(&path);
        self.make_room(extra);
        self.reserved_blocks += extra;
        Some(path)
    }

    /// Extends `base` along `hashes` (whose first blocks must agree with
    /// `base` up to where they diverge), creating missing blocks from
    /// `reserved` (the request's own reservation) first and then from free
    /// or evictable room. Stops early, without error, when no room is left.
    /// `tokens` are the tokens `hashes` were computed from (reported with
    /// the new blocks when recording events). Returns the new pinned path;
    /// `base` stays pinned until released.
    pub fn extend(
        &mut self,
        base: &PinnedPath,
        hashes: &[u64],
        tokens: &[u64],
        reserved: &mut usize,
    ) -> PinnedPath {
        debug_assert!(hashes.len() * self.block_size <= tokens.len());
        let common = base
            .nodes
            .iter()
            .zip(hashes)
            .take_while(|(id, h)| self.node(**id).hash == **h)
            .count();
        let mut path = PinnedPath {
            nodes: base.nodes[..common].to_vec(),
        };
        self.pin(&path);
        // The run of blocks created here, as (first index, count), for the
        // event log.
        let mut run: Option<(usize, usize)> = None;
        for (i, &h) in hashes.iter().enumerate().skip(common) {
            if let Some(&id) = self.index.get(&h) {
                // A block that exists after one we created would mean a
                // chain-hash collision; end the run so events stay exact.
                self.log_stored(hashes, tokens, run.take());
                // Already there (another request computed it): pin it, and
                // our reserved block for it is not needed.
                self.pin_one(id);
                path.nodes.push(id);
                if *reserved > 0 {
                    *reserved -= 1;
                    self.reserved_blocks -= 1;
                }
                continue;
            }
            if *reserved > 0 {
                *reserved -= 1;
                self.reserved_blocks -= 1;
            } else {
                // Protect the path being built from eviction: it is pinned.
                if self.capacity_blocks - self.used_blocks() == 0 && !self.evict_one() {
                    break;
                }
            }
            let parent = path.nodes.last().copied();
            let id = self.insert(h, parent);
            path.nodes.push(id);
            match &mut run {
                Some((_, n)) => *n += 1,
                None => run = Some((i, 1)),
            }
        }
        self.log_stored(hashes, tokens, run);
        path
    }

    /// Logs blocks `first..first + n` of `hashes` as stored.
    fn log_stored(&mut self, hashes: &[u64], tokens: &[u64], run: Option<(usize, usize)>) {
        let (Some(log), Some((first, n))) = (self.events.as_mut(), run) else {
            return;
        };
        let bs = self.block_size;
        log.push(CacheEvent::Stored {
            hashes: hashes[first..first + n].to_vec(),
            parent: first.checked_sub(1).map(|p| hashes[p]),
            tokens: tokens[first * bs..(first + n) * bs].to_vec(),
        });
    }

    /// Unpins `path` and returns `unused_reserved` reserved blocks.
    pub fn release(&mut self, path: PinnedPath, unused_reserved: usize) {
        self.tick += 1;
        let tick = self.tick;
        // Unpin deepest first so that leaves join the evictable set with
        // the same tick as their ancestors but in leaf-first order.
        for &id in path.nodes.iter().rev() {
            let (now_free, leaf) = {
                let n = self.node_mut(id);
                n.pins -= 1;
                n.last_access = tick;
                (n.pins == 0, n.children == 0)
            };
            if now_free {
                self.unpinned_blocks += 1;
                if leaf {
                    self.evictable.insert((tick, id));
                }
            }
        }
        self.reserved_blocks -= unused_reserved;
    }

    /// Evicts every unpinned block (SGLang's `/flush_cache`). Returns how
    /// many were evicted. When that empties the cache, the event log says
    /// so with one [`CacheEvent::Cleared`] instead of the removals.
    pub fn flush(&mut self) -> usize {
        // Where the log stood, to replace this flush's removals.
        let mark = self.events.as_ref().map(|log| {
            let tail = match log.last() {
                Some(CacheEvent::Removed { hashes }) => hashes.len(),
                _ => 0,
            };
            (log.len(), tail)
        });
        let mut n = 0;
        while self.evict_one() {
            n += 1;
        }
        if let (Some(log), Some((len, tail)), true) =
            (self.events.as_mut(), mark, self.tree_blocks == 0 && n > 0)
        {
            log.truncate(len);
            if let Some(CacheEvent::Removed { hashes }) = log.last_mut() {
                hashes.truncate(tail);
            }
            log.push(CacheEvent::Cleared);
        }
        n
    }

    /// Evicts LRU leaves until `need` blocks are free (or nothing is left
    /// to evict).
    fn make_room(&mut self, need: usize) {
        while self.capacity_blocks - self.used_blocks() < need {
            if !self.evict_one() {
                break;
            }
        }
    }

    fn evict_one(&mut self) -> bool {
        let Some((_, id)) = self.evictable.pop_first() else {
            return false;
        };
        let node = self.nodes[id as usize]
            .take()
            .expect("evictable node exists");
        debug_assert!(node.pins == 0 && node.children == 0);
        self.index.remove(&node.hash);
        self.free_slots.push(id);
        self.tree_blocks -= 1;
        self.unpinned_blocks -= 1;
        self.evicted_blocks += 1;
        if let Some(log) = self.events.as_mut() {
            // Evictions in a row share one event, as one step's do.
            match log.last_mut() {
                Some(CacheEvent::Removed { hashes }) => hashes.push(node.hash),
                _ => log.push(CacheEvent::Removed {
                    hashes: vec![node.hash],
                }),
            }
        }
        if let Some(p) = node.parent {
            let parent = self.node_mut(p);
            parent.children -= 1;
            if parent.children == 0 && parent.pins == 0 {
                let key = (parent.last_access, p);
                self.evictable.insert(key);
            }
        }
        true
    }

    /// Creates a pinned node under `parent`.
    fn insert(&mut self, hash: u64, parent: Option<NodeId>) -> NodeId {
        self.tick += 1;
        let node = Node {
            hash,
            parent,
            children: 0,
            pins: 1,
            last_access: self.tick,
        };
        let id = match self.free_slots.pop() {
            Some(id) => {
                self.nodes[id as usize] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                NodeId::try_from(self.nodes.len() - 1).expect("fewer than 2^32 blocks")
            }
        };
        if let Some(p) = parent {
            let pn = self.node_mut(p);
            pn.children += 1;
            // A pinned parent is never in the evictable set; nothing to fix.
        }
        self.index.insert(hash, id);
        self.tree_blocks += 1;
        id
    }

    fn pin(&mut self, path: &PinnedPath) {
        for &id in &path.nodes {
            self.pin_one(id);
        }
    }

    fn pin_one(&mut self, id: NodeId) {
        self.tick += 1;
        let tick = self.tick;
        let n = self.node_mut(id);
        let old = (n.last_access, n.pins, n.children);
        n.pins += 1;
        n.last_access = tick;
        if old.1 == 0 {
            self.unpinned_blocks -= 1;
            if old.2 == 0 {
                self.evictable.remove(&(old.0, id));
            }
        }
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes[id as usize].as_ref().expect("live node")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id as usize].as_mut().expect("live node")
    }

    /// Checks every invariant; for tests.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        assert!(self.used_blocks() <= self.capacity_blocks);
        let live: Vec<(NodeId, &Node)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i as NodeId, n)))
            .collect();
        assert_eq!(live.len(), self.tree_blocks);
        assert_eq!(
            live.iter().filter(|(_, n)| n.pins == 0).count(),
            self.unpinned_blocks
        );
        for (id, n) in &live {
            let kids = live.iter().filter(|(_, c)| c.parent == Some(*id)).count();
            assert_eq!(kids as u32, n.children);
            if let (true, Some(p)) = (n.pins > 0, n.parent) {
                assert!(self.node(p).pins > 0, "pinned node under unpinned parent");
            }
            let evictable = n.pins == 0 && n.children == 0;
            assert_eq!(evictable, self.evictable.contains(&(n.last_access, *id)));
            assert_eq!(self.index[&n.hash], *id);
        }
        assert_eq!(
            self.evictable.len(),
            live.iter()
                .filter(|(_, n)| n.pins == 0 && n.children == 0)
                .count()
        );
    }
}

/// A 64-bit mixing step (splitmix64's finaliser) for chain hashes.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests;
