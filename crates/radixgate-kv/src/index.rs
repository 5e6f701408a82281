//! The exact index of one model: chained block keys → the workers whose GPU
//! cache holds them, learned from the workers' own events.
//!
//! Two maps hold it:
//!
//! - per block size, `key → holders`, the holders a short vector sorted by
//!   worker, each with a reference count; workers with different block
//!   sizes live in different key spaces, because a key chains over
//!   `block_size` tokens at a time;
//! - per worker, `engine hash → (key, block size, references)`: the engine's
//!   hash is only a handle, to place the next event's first block after its
//!   parent and to find what a removal means.
//!
//! References count: an engine may hold two blocks with the same hash (vLLM
//! keeps duplicates until one is freed) and reports a store and a removal
//! for each, so a key stays held until as many removals as stores came.
//! A store of a known engine hash under a different key replaces its old
//! meaning (the engine reused the handle).
//!
//! Bounds: [`IndexLimits`] caps the engine hashes held per worker and in
//! all, and [`MAX_BLOCK_SIZES`] the block sizes held at once (each costs
//! every match a pass over the prompt; a size is forgotten once none of its
//! blocks is held). Engines evict on their own, so hitting a cap means an engine that
//! stores without ever reporting removals (or a cache far larger than
//! configured). Blocks past a cap are refused, from the first refused block
//! to the end of that event (the rest of the chain could not be matched
//! anyway), and counted in [`ApplyStats::over_capacity`]; what is held
//! stays. The caller should take a worker whose events overflow as stale.
//!
//! Concurrency: none inside. One owner applies events (`&mut self`);
//! readers share snapshots or a lock chosen by the caller.

use hashbrown::HashMap;
use smallvec::SmallVec;

use crate::event::{BlockStored, EngineHash, KvEvent};
use crate::keys;

/// The most block sizes the index holds blocks of at once. An engine has
/// one block size (a hybrid model's cache groups a few); each size held
/// costs every match its own pass over the prompt, so publishers that
/// report one size after another cannot make every request slower.
/// Blocks of a further size are refused as over capacity.
pub const MAX_BLOCK_SIZES: usize = 8;

/// The most block sizes one worker holds blocks of at once; blocks of a
/// further size are refused as that worker's over capacity. Without it,
/// one publisher reporting [`MAX_BLOCK_SIZES`] sizes had the next worker's
/// first blocks (of a size of its own) refused, and that worker taken as
/// stale for it: now it takes four such publishers.
pub const MAX_BLOCK_SIZES_PER_WORKER: usize = 2;

/// A worker's small integer id, chosen by the caller.
pub type WorkerKey = u32;

/// Caps on the index's size, in engine blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexLimits {
    /// Most blocks one worker may hold in the index.
    pub max_blocks_per_worker: usize,
    /// Most blocks all workers together may hold.
    pub max_blocks_total: usize,
}

impl Default for IndexLimits {
    /// 2^20 blocks a worker (16 M tokens at 16 per block, several times a
    /// large GPU's KV cache), 2^24 in all.
    fn default() -> Self {
        Self {
            max_blocks_per_worker: 1 << 20,
            max_blocks_total: 1 << 24,
        }
    }
}

/// What applying events did, in blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Blocks stored (including repeated stores of a held block).
    pub stored: u64,
    /// Blocks removed.
    pub removed: u64,
    /// Blocks dropped by `AllBlocksCleared`.
    pub cleared: u64,
    /// Stored blocks skipped because their event's parent hash is not held
    /// by that worker (with that block size).
    pub unknown_parent: u64,
    /// Stored blocks skipped because their event's token count is not
    /// `block_size` per hash.
    pub bad_shape: u64,
    /// Removals of hashes the worker does not hold.
    pub unknown_removed: u64,
    /// Stored blocks refused by a limit.
    pub over_capacity: u64,
}

impl ApplyStats {
    /// Adds another's counts to this one.
    pub fn add(&mut self, other: &ApplyStats) {
        self.stored += other.stored;
        self.removed += other.removed;
        self.cleared += other.cleared;
        self.unknown_parent += other.unknown_parent;
        self.bad_shape += other.bad_shape;
        self.unknown_removed += other.unknown_removed;
        self.over_capacity += other.over_capacity;
    }
}

/// Workers holding one key, sorted by worker, with reference counts.
type Holders = SmallVec<[(WorkerKey, u32); 2]>;

#[derive(Clone, Copy, Debug)]
struct Held {
    key: u64,
    block_size: u32,
    refs: u32,
}

#[derive(Default)]
struct Worker {
    engine: HashMap<EngineHash, Held>,
    /// The block sizes of `engine`'s entries, with how many of each.
    sizes: SmallVec<[(u32, usize); 2]>,
}

impl Worker {
    fn holds_size(&self, block_size: u32) -> bool {
        self.sizes.iter().any(|&(b, _)| b == block_size)
    }

    /// Counts an entry of `block_size` in (`up`) or out.
    fn count_size(&mut self, block_size: u32, up: bool) {
        match self.sizes.iter().position(|&(b, _)| b == block_size) {
            Some(i) if up => self.sizes[i].1 += 1,
            Some(i) => {
                self.sizes[i].1 -= 1;
                if self.sizes[i].1 == 0 {
                    self.sizes.swap_remove(i);
                }
            }
            None if up => self.sizes.push((block_size, 1)),
            None => {}
        }
    }
}

/// The exact index of one model. See the module docs.
#[derive(Default)]
pub struct KvIndex {
    limits: IndexLimits,
    by_size: HashMap<u32, HashMap<u64, Holders>>,
    workers: HashMap<WorkerKey, Worker>,
    blocks: usize,
}

impl KvIndex {
    /// An empty index with the default limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index with these limits.
    pub fn with_limits(limits: IndexLimits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// Applies one worker's events, in order.
    pub fn apply(&mut self, worker: WorkerKey, events: &[KvEvent]) -> ApplyStats {
        let mut stats = ApplyStats::default();
        for event in events {
            match event {
                KvEvent::Stored(stored) => self.store(worker, stored, &mut stats),
                KvEvent::Removed(hashes) => self.remove(worker, hashes, &mut stats),
                KvEvent::Cleared => stats.cleared += self.clear(worker) as u64,
            }
        }
        stats
    }

    fn store(&mut self, worker: WorkerKey, event: &BlockStored, stats: &mut ApplyStats) {
        let n = event.block_hashes.len() as u64;
        let block_size = event.block_size;
        let bs = block_size as usize;
        if bs == 0 || event.token_ids.len() != event.block_hashes.len() * bs {
            stats.bad_shape += n;
            return;
        }
        let worker_is_full = self.workers.get(&worker).is_some_and(|w| {
            !w.holds_size(block_size) && w.sizes.len() >= MAX_BLOCK_SIZES_PER_WORKER
        });
        if worker_is_full
            || !self.by_size.contains_key(&block_size) && self.by_size.len() >= MAX_BLOCK_SIZES
        {
            stats.over_capacity += n;
            return;
        }
        let mut key = match event.parent {
            None => keys::root_key(event.lora_id),
            Some(parent) => match self
                .workers
                .get(&worker)
                .and_then(|w| w.engine.get(&parent))
            {
                Some(held) if held.block_size == block_size => held.key,
                _ => {
                    stats.unknown_parent += n;
                    return;
                }
            },
        };
        let chain = event
            .block_hashes
            .iter()
            .zip(event.token_ids.chunks_exact(bs));
        for (i, (hash, block)) in chain.enumerate() {
            key = keys::next_key(key, block);
            if let Some(&extra) = event.extra_keys.get(i)
                && extra != 0
            {
                key = keys::with_extra(key, extra);
            }
            if !self.store_one(worker, *hash, key, block_size) {
                stats.over_capacity += n - i as u64;
                return;
            }
            stats.stored += 1;
        }
    }

    /// Stores one block under `key`; false when a limit refused it.
    fn store_one(
        &mut self,
        worker: WorkerKey,
        hash: EngineHash,
        key: u64,
        block_size: u32,
    ) -> bool {
        let state = self.workers.entry(worker).or_default();
        let old = state.engine.get(&hash).copied();
        match old {
            Some(held) if held.key == key && held.block_size == block_size => {
                if held.refs == u32::MAX {
                    return true;
                }
                if let Some(h) = state.engine.get_mut(&hash) {
                    h.refs += 1;
                }
            }
            // The engine reused the handle: forget its old meaning.
            Some(held) => {
                state.engine.insert(
                    hash,
                    Held {
                        key,
                        block_size,
                        refs: 1,
                    },
                );
                state.count_size(held.block_size, false);
                state.count_size(block_size, true);
                release(
                    &mut self.by_size,
                    held.block_size,
                    held.key,
                    worker,
                    held.refs,
                );
            }
            None => {
                if state.engine.len() >= self.limits.max_blocks_per_worker
                    || self.blocks >= self.limits.max_blocks_total
                {
                    return false;
                }
                state.engine.insert(
                    hash,
                    Held {
                        key,
                        block_size,
                        refs: 1,
                    },
                );
                state.count_size(block_size, true);
                self.blocks += 1;
            }
        }
        add_holder(self.by_size.entry(block_size).or_default(), key, worker, 1);
        true
    }

    fn remove(&mut self, worker: WorkerKey, hashes: &[EngineHash], stats: &mut ApplyStats) {
        let Some(state) = self.workers.get_mut(&worker) else {
            stats.unknown_removed += hashes.len() as u64;
            return;
        };
        for hash in hashes {
            let Some(held) = state.engine.get_mut(hash) else {
                stats.unknown_removed += 1;
                continue;
            };
            held.refs -= 1;
            let Held {
                key,
                block_size,
                refs,
            } = *held;
            if refs == 0 {
                state.engine.remove(hash);
                state.count_size(block_size, false);
                self.blocks -= 1;
            }
            release(&mut self.by_size, block_size, key, worker, 1);
            stats.removed += 1;
        }
    }

    /// Drops everything `worker` holds; returns how many blocks that was.
    fn clear(&mut self, worker: WorkerKey) -> usize {
        let Some(state) = self.workers.get_mut(&worker) else {
            return 0;
        };
        let n = state.engine.len();
        state.sizes.clear();
        for (_, held) in state.engine.drain() {
            if let Some(m) = self.by_size.get_mut(&held.block_size) {
                drop_holder(m, held.key, worker, held.refs);
            }
        }
        self.by_size.retain(|_, m| !m.is_empty());
        self.blocks -= n;
        n
    }

    /// Forgets a worker entirely (it left, or its stream went stale and
    /// will be rebuilt); returns how many blocks it held.
    pub fn remove_worker(&mut self, worker: WorkerKey) -> usize {
        let n = self.clear(worker);
        self.workers.remove(&worker);
        n
    }

    /// For each worker holding at least the first of `keys` (computed with
    /// `block_size`), how many leading keys it holds without a gap; sorted
    /// by worker.
    pub fn match_keys(&self, block_size: u32, keys: &[u64]) -> Vec<(WorkerKey, usize)> {
        let Some(map) = self.by_size.get(&block_size) else {
            return Vec::new();
        };
        let Some(first) = keys.first().and_then(|k| map.get(k)) else {
            return Vec::new();
        };
        let mut active: SmallVec<[WorkerKey; 16]> = first.iter().map(|&(w, _)| w).collect();
        let mut out = Vec::with_capacity(active.len());
        for (depth, key) in keys.iter().enumerate().skip(1) {
            let holders: &[(WorkerKey, u32)] = map.get(key).map_or(&[], |h| h.as_slice());
            // Both lists are sorted by worker: one merge pass.
            let mut j = 0;
            active.retain(|w| {
                while j < holders.len() && holders[j].0 < *w {
                    j += 1;
                }
                let keep = j < holders.len() && holders[j].0 == *w;
                if !keep {
                    out.push((*w, depth));
                }
                keep
            });
            if active.is_empty() {
                break;
            }
        }
        out.extend(active.iter().map(|&w| (w, keys.len())));
        out.sort_unstable();
        out
    }

    /// For each worker, the longest prefix of `tokens` (in tokens) it
    /// holds, over every block size the index has seen; sorted by worker.
    /// `lora_id` picks the adapter the request runs with.
    pub fn match_tokens(&self, tokens: &[u32], lora_id: Option<i64>) -> Vec<(WorkerKey, usize)> {
        let mut out: Vec<(WorkerKey, usize)> = Vec::new();
        for &block_size in self.by_size.keys() {
            let keys = keys::block_keys_from(keys::root_key(lora_id), tokens, block_size as usize);
            for (w, blocks) in self.match_keys(block_size, &keys) {
                out.push((w, blocks * block_size as usize));
            }
        }
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        out.dedup_by_key(|e| e.0);
        out
    }

    /// The block sizes seen so far.
    pub fn block_sizes(&self) -> impl Iterator<Item = u32> + '_ {
        self.by_size.keys().copied()
    }

    /// Whether the index holds `max_blocks_total` blocks: a store refused
    /// now was refused for the whole index, not for its worker.
    pub fn is_full(&self) -> bool {
        self.blocks >= self.limits.max_blocks_total
    }

    /// Engine blocks held, all workers together.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Engine blocks one worker holds.
    pub fn worker_blocks(&self, worker: WorkerKey) -> usize {
        self.workers.get(&worker).map_or(0, |w| w.engine.len())
    }

    /// Distinct keys held, all block sizes together.
    pub fn keys(&self) -> usize {
        self.by_size.values().map(HashMap::len).sum()
    }

    /// An estimate of the heap the index uses, from its tables' capacities
    /// (one control byte per slot) and spilled holder lists.
    pub fn bytes_estimate(&self) -> usize {
        let key_slot = std::mem::size_of::<(u64, Holders)>() + 1;
        let engine_slot = std::mem::size_of::<(EngineHash, Held)>() + 1;
        let keys: usize = self
            .by_size
            .values()
            .map(|m| {
                m.capacity() * key_slot
                    + m.values()
                        .filter(|h| h.spilled())
                        .map(|h| h.capacity() * std::mem::size_of::<(WorkerKey, u32)>())
                        .sum::<usize>()
            })
            .sum();
        let engine: usize = self
            .workers
            .values()
            .map(|w| w.engine.capacity() * engine_slot)
            .sum();
        keys + engine
    }
}

fn add_holder(map: &mut HashMap<u64, Holders>, key: u64, worker: WorkerKey, refs: u32) {
    let holders = map.entry(key).or_default();
    match holders.binary_search_by_key(&worker, |&(w, _)| w) {
        Ok(i) => holders[i].1 = holders[i].1.saturating_add(refs),
        Err(i) => holders.insert(i, (worker, refs)),
    }
}

/// Drops `refs` of `worker`'s hold on `key` of `block_size`, and the block
/// size once no block of it is held.
fn release(
    by_size: &mut HashMap<u32, HashMap<u64, Holders>>,
    block_size: u32,
    key: u64,
    worker: WorkerKey,
    refs: u32,
) {
    if let Some(m) = by_size.get_mut(&block_size) {
        drop_holder(m, key, worker, refs);
        if m.is_empty() {
            by_size.remove(&block_size);
        }
    }
}

fn drop_holder(map: &mut HashMap<u64, Holders>, key: u64, worker: WorkerKey, refs: u32) {
    let Some(holders) = map.get_mut(&key) else {
        return;
    };
    if let Ok(i) = holders.binary_search_by_key(&worker, |&(w, _)| w) {
        holders[i].1 = holders[i].1.saturating_sub(refs);
        if holders[i].1 == 0 {
            holders.remove(i);
        }
    }
    if holders.is_empty() {
        map.remove(&key);
    }
}
