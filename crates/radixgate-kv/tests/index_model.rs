//! The index against a naive model: random stores, removals, clears and
//! worker removals from several workers with two block sizes, then every
//! document's prefix matched both ways.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use proptest::prelude::*;
use radixgate_kv::keys::{block_keys_from, next_key, root_key};
use radixgate_kv::{
    ApplyStats, BlockStored, EngineHash, IndexLimits, KvEvent, KvIndex, MAX_BLOCK_SIZES_PER_WORKER,
    WorkerKey,
};

const WORKERS: u32 = 4;

/// Worker `w` uses block size 2 or 4, so both key spaces are exercised.
fn block_size(w: WorkerKey) -> u32 {
    if w.is_multiple_of(2) { 2 } else { 4 }
}

/// A few documents over a tiny alphabet: they share many prefixes.
fn docs() -> Vec<Vec<u32>> {
    vec![
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
        vec![1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0],
        vec![1, 2, 3, 4, 9, 9, 9, 9, 9, 9, 9, 9, 1, 1, 1, 1],
        vec![5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5],
    ]
}

/// What a real engine does: a block's hash names its whole prefix.
fn engine_hash(prefix: &[u32], bs: u32) -> EngineHash {
    let mut h = DefaultHasher::new();
    (prefix, bs).hash(&mut h);
    EngineHash(h.finish())
}

#[derive(Clone, Debug)]
enum Op {
    /// Worker stores blocks `start..start + count` of a document, with the
    /// parent hash of block `start - 1`; `alias` replaces one block's hash
    /// by a small integer (an engine reusing a handle); `bad_shape` drops a
    /// token.
    Store {
        w: WorkerKey,
        doc: usize,
        start: usize,
        count: usize,
        alias: Option<(usize, u64)>,
        bad_shape: bool,
    },
    /// Worker removes block `block` of a document, or a small-integer hash.
    Remove {
        w: WorkerKey,
        doc: usize,
        block: usize,
        alias: Option<u64>,
    },
    Clear {
        w: WorkerKey,
    },
    RemoveWorker {
        w: WorkerKey,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..WORKERS, 0usize..4, 0usize..8, 1usize..5, prop::option::weighted(0.1, (0usize..4, 0u64..6)), prop::bool::weighted(0.05))
            .prop_map(|(w, doc, start, count, alias, bad_shape)| Op::Store { w, doc, start, count, alias, bad_shape }),
        3 => (0..WORKERS, 0usize..4, 0usize..8, prop::option::weighted(0.1, 0u64..6))
            .prop_map(|(w, doc, block, alias)| Op::Remove { w, doc, block, alias }),
        1 => (0..WORKERS).prop_map(|w| Op::Clear { w }),
        1 => (0..WORKERS).prop_map(|w| Op::RemoveWorker { w }),
    ]
}

/// Turns an op into the events a worker would send.
fn events(op: &Op, docs: &[Vec<u32>]) -> (WorkerKey, Vec<KvEvent>) {
    match *op {
        Op::Store {
            w,
            doc,
            start,
            count,
            alias,
            bad_shape,
        } => {
            let bs = block_size(w) as usize;
            let d = &docs[doc];
            let blocks = d.len() / bs;
            let start = start % blocks;
            let end = (start + count).min(blocks);
            let mut hashes: Vec<EngineHash> = (start..end)
                .map(|b| engine_hash(&d[..(b + 1) * bs], bs as u32))
                .collect();
            if let Some((i, h)) = alias {
                let n = hashes.len();
                hashes[i % n] = EngineHash(h);
            }
            let mut token_ids = d[start * bs..end * bs].to_vec();
            if bad_shape {
                token_ids.pop();
            }
            let parent = (start > 0).then(|| engine_hash(&d[..start * bs], bs as u32));
            let e = BlockStored {
                block_hashes: hashes,
                parent,
                token_ids,
                block_size: bs as u32,
                lora_id: None,
                extra_keys: Vec::new(),
            };
            (w, vec![KvEvent::Stored(e)])
        }
        Op::Remove {
            w,
            doc,
            block,
            alias,
        } => {
            let bs = block_size(w) as usize;
            let d = &docs[doc];
            let block = block % (d.len() / bs);
            let h = alias
                .map(EngineHash)
                .unwrap_or_else(|| engine_hash(&d[..(block + 1) * bs], bs as u32));
            (w, vec![KvEvent::Removed(vec![h])])
        }
        Op::Clear { w } => (w, vec![KvEvent::Cleared]),
        Op::RemoveWorker { w } => (w, Vec::new()),
    }
}

/// The model: a flat list of (worker, engine hash) → (key, block size,
/// references), scanned for everything.
#[derive(Default)]
struct Model {
    limits: IndexLimits,
    held: HashMap<(WorkerKey, EngineHash), (u64, u32, u32)>,
}

impl Model {
    fn worker_blocks(&self, w: WorkerKey) -> usize {
        self.held.keys().filter(|(x, _)| *x == w).count()
    }

    fn apply(&mut self, w: WorkerKey, events: &[KvEvent], stats: &mut ApplyStats) {
        for e in events {
            match e {
                KvEvent::Stored(s) => {
                    let n = s.block_hashes.len() as u64;
                    let bs = s.block_size as usize;
                    if s.token_ids.len() != s.block_hashes.len() * bs {
                        stats.bad_shape += n;
                        continue;
                    }
                    let mut key = match s.parent {
                        None => root_key(s.lora_id),
                        Some(p) => match self.held.get(&(w, p)) {
                            Some(&(k, b, _)) if b == s.block_size => k,
                            _ => {
                                stats.unknown_parent += n;
                                continue;
                            }
                        },
                    };
                    for (i, h) in s.block_hashes.iter().enumerate() {
                        key = next_key(key, &s.token_ids[i * bs..(i + 1) * bs]);
                        match self.held.get_mut(&(w, *h)) {
                            Some(v) if v.0 == key && v.1 == s.block_size => v.2 += 1,
                            Some(v) => *v = (key, s.block_size, 1),
                            None => {
                                if self.worker_blocks(w) >= self.limits.max_blocks_per_worker
                                    || self.held.len() >= self.limits.max_blocks_total
                                {
                                    stats.over_capacity += n - i as u64;
                                    break;
                                }
                                self.held.insert((w, *h), (key, s.block_size, 1));
                            }
                        }
                        stats.stored += 1;
                    }
                }
                KvEvent::Removed(hashes) => {
                    for h in hashes {
                        match self.held.get_mut(&(w, *h)) {
                            Some(v) => {
                                v.2 -= 1;
                                if v.2 == 0 {
                                    self.held.remove(&(w, *h));
                                }
                                stats.removed += 1;
                            }
                            None => stats.unknown_removed += 1,
                        }
                    }
                }
                KvEvent::Cleared => {
                    let before = self.held.len();
                    self.held.retain(|(x, _), _| *x != w);
                    stats.cleared += (before - self.held.len()) as u64;
                }
            }
        }
    }

    /// Leading blocks of `tokens` (in tokens) worker `w` holds.
    fn matched(&self, w: WorkerKey, tokens: &[u32]) -> usize {
        let bs = block_size(w);
        let keys = block_keys_from(root_key(None), tokens, bs as usize);
        let holds = |k: u64| {
            self.held
                .iter()
                .any(|((x, _), v)| *x == w && v.0 == k && v.1 == bs)
        };
        keys.iter().take_while(|&&k| holds(k)).count() * bs as usize
    }
}

fn check(ops: Vec<Op>, limits: IndexLimits) -> Result<(), TestCaseError> {
    let docs = docs();
    let mut index = KvIndex::with_limits(limits);
    let mut model = Model {
        limits,
        ..Model::default()
    };
    for op in &ops {
        let (w, evs) = events(op, &docs);
        let mut want = ApplyStats::default();
        if let Op::RemoveWorker { .. } = op {
            model.apply(w, &[KvEvent::Cleared], &mut want);
            prop_assert_eq!(index.remove_worker(w) as u64, want.cleared);
        } else {
            model.apply(w, &evs, &mut want);
            prop_assert_eq!(index.apply(w, &evs), want, "{:?}", op);
        }
        prop_assert_eq!(index.blocks(), model.held.len());
        prop_assert_eq!(index.is_full(), model.held.len() >= limits.max_blocks_total);
    }
    for w in 0..WORKERS {
        prop_assert_eq!(index.worker_blocks(w), model.worker_blocks(w));
    }
    for doc in &docs {
        for len in [doc.len(), doc.len() - 3, 8] {
            let tokens = &doc[..len];
            let want: Vec<(WorkerKey, usize)> = (0..WORKERS)
                .map(|w| (w, model.matched(w, tokens)))
                .filter(|&(_, n)| n > 0)
                .collect();
            prop_assert_eq!(
                index.match_tokens(tokens, None),
                want.clone(),
                "tokens {:?}",
                tokens
            );
            for bs in [2u32, 4] {
                let keys = block_keys_from(root_key(None), tokens, bs as usize);
                let got: Vec<(WorkerKey, usize)> = index
                    .match_keys(bs, &keys)
                    .into_iter()
                    .map(|(w, blocks)| (w, blocks * bs as usize))
                    .collect();
                let want_bs: Vec<_> = want
                    .iter()
                    .copied()
                    .filter(|&(w, _)| block_size(w) == bs)
                    .collect();
                prop_assert_eq!(got, want_bs);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn index_matches_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        check(ops, IndexLimits::default())?;
    }

    /// With small caps, refusals happen and must be the model's.
    #[test]
    fn index_matches_the_model_under_limits(ops in proptest::collection::vec(op(), 1..60)) {
        check(ops, IndexLimits { max_blocks_per_worker: 5, max_blocks_total: 12 })?;
    }
}

#[test]
fn lora_blocks_match_only_their_adapter() {
    let tokens: Vec<u32> = (0..8).collect();
    let mut index = KvIndex::new();
    let stored = |lora_id| {
        KvEvent::Stored(BlockStored {
            block_hashes: vec![EngineHash(1), EngineHash(2)],
            parent: None,
            token_ids: tokens.clone(),
            block_size: 4,
            lora_id,
            extra_keys: Vec::new(),
        })
    };
    index.apply(0, &[stored(Some(3))]);
    assert!(index.match_tokens(&tokens, None).is_empty());
    assert_eq!(index.match_tokens(&tokens, Some(3)), vec![(0, 8)]);
    index.apply(1, &[stored(None)]);
    assert_eq!(index.match_tokens(&tokens, None), vec![(1, 8)]);
    assert!(index.bytes_estimate() > 0);
    assert_eq!(index.keys(), 4);
}

/// Blocks a vLLM engine computed with extra keys (a request's
/// `cache_salt`, an adapter's name, an image's hash: its events'
/// `extra_keys`) are not the same tokens' blocks without them: a request
/// without is matched only up to the first such block, and not on the
/// blocks chained after it. Before, they were indexed as the plain
/// blocks, and a plain request was matched on a salted prefix the engine
/// could not use for it.
#[test]
fn blocks_with_extra_keys_match_no_request_without_them() {
    let tokens: Vec<u32> = (0..16).collect();
    let mut index = KvIndex::new();
    // Worker 0: blocks 0..2 plain, block 2 salted, and block 3 chained
    // after it in a later event.
    let mut first = store(&[1, 2, 3], None, &tokens[..12], 4);
    if let KvEvent::Stored(s) = &mut first {
        s.extra_keys = vec![0, 0, 77];
    }
    index.apply(0, &[first, store(&[4], Some(3), &tokens[12..], 4)]);
    assert_eq!(index.match_tokens(&tokens, None), vec![(0, 8)]);
    // Worker 1 holds them all plain: the only whole match.
    index.apply(1, &[store(&[1, 2, 3, 4], None, &tokens, 4)]);
    let mut matched = index.match_tokens(&tokens, None);
    matched.sort();
    assert_eq!(matched, vec![(0, 8), (1, 16)]);
    // Salted from the first block: nothing of it.
    let mut salted = store(&[9, 10], None, &tokens[..8], 4);
    if let KvEvent::Stored(s) = &mut salted {
        s.extra_keys = vec![5, 0];
    }
    index.apply(2, &[salted]);
    assert!(
        !index
            .match_tokens(&tokens, None)
            .iter()
            .any(|(w, _)| *w == 2)
    );
    // Its removal is by engine hash, as any other's.
    index.apply(0, &[KvEvent::Removed(vec![EngineHash(3), EngineHash(4)])]);
    assert_eq!(index.blocks(), 2 + 4 + 2);
}

fn store(hashes: &[u64], parent: Option<u64>, tokens: &[u32], bs: u32) -> KvEvent {
    KvEvent::Stored(BlockStored {
        block_hashes: hashes.iter().copied().map(EngineHash).collect(),
        parent: parent.map(EngineHash),
        token_ids: tokens.to_vec(),
        block_size: bs,
        lora_id: None,
        extra_keys: Vec::new(),
    })
}

#[test]
fn a_reused_engine_handle_takes_its_new_meaning() {
    let (a, b) = ([1, 2, 3, 4], [5, 6, 7, 8]);
    let mut index = KvIndex::new();
    index.apply(0, &[store(&[1], None, &a, 4)]);
    assert_eq!(index.match_tokens(&a, None), vec![(0, 4)]);
    // The engine says hash 1 is now block `b`.
    index.apply(0, &[store(&[1], None, &b, 4)]);
    assert!(index.match_tokens(&a, None).is_empty());
    assert_eq!(index.match_tokens(&b, None), vec![(0, 4)]);
    assert_eq!(index.blocks(), 1);
    let stats = index.apply(0, &[KvEvent::Removed(vec![EngineHash(1)])]);
    assert_eq!((stats.removed, index.blocks(), index.keys()), (1, 0, 0));
    assert!(index.match_tokens(&b, None).is_empty());
}

#[test]
fn a_block_stored_twice_needs_two_removals() {
    let a = [1, 2, 3, 4];
    let mut index = KvIndex::new();
    index.apply(0, &[store(&[1], None, &a, 4), store(&[1], None, &a, 4)]);
    index.apply(0, &[KvEvent::Removed(vec![EngineHash(1)])]);
    assert_eq!(index.match_tokens(&a, None), vec![(0, 4)]);
    index.apply(0, &[KvEvent::Removed(vec![EngineHash(1)])]);
    assert!(index.match_tokens(&a, None).is_empty());
}

#[test]
fn over_capacity_refuses_the_rest_of_the_chain_and_keeps_what_is_held() {
    let tokens: Vec<u32> = (0..16).collect();
    let limits = IndexLimits {
        max_blocks_per_worker: 3,
        max_blocks_total: 5,
    };
    let mut index = KvIndex::with_limits(limits);
    let stats = index.apply(0, &[store(&[1, 2, 3, 4], None, &tokens, 4)]);
    assert_eq!((stats.stored, stats.over_capacity), (3, 1));
    assert_eq!(index.match_tokens(&tokens, None), vec![(0, 12)]);
    // The total cap: worker 1 gets the 2 blocks left in all.
    let stats = index.apply(1, &[store(&[1, 2, 3, 4], None, &tokens, 4)]);
    assert_eq!((stats.stored, stats.over_capacity), (2, 2));
    assert_eq!(index.match_tokens(&tokens, None), vec![(0, 12), (1, 8)]);
    // Removals make room again.
    index.apply(0, &[KvEvent::Removed(vec![EngineHash(3)])]);
    let stats = index.apply(1, &[store(&[3], Some(2), &tokens[8..12], 4)]);
    assert_eq!((stats.stored, stats.over_capacity), (1, 0));
}

#[test]
fn an_unknown_parent_skips_the_event() {
    let tokens: Vec<u32> = (0..8).collect();
    let mut index = KvIndex::new();
    let stats = index.apply(0, &[store(&[2], Some(1), &tokens[4..], 4)]);
    assert_eq!((stats.stored, stats.unknown_parent), (0, 1));
    // A parent known with another block size is unknown too.
    index.apply(0, &[store(&[1, 9], None, &tokens[..4], 2)]);
    let stats = index.apply(0, &[store(&[2], Some(9), &tokens[4..], 4)]);
    assert_eq!(stats.unknown_parent, 1);
    assert!(
        index
            .match_tokens(&tokens, None)
            .iter()
            .all(|&(_, n)| n == 4)
    );
}

/// Every block size seen costs each match a pass over the prompt: a
/// publisher that reports many is held to a few at once, and a size whose
/// blocks are all gone is forgotten.
#[test]
fn block_sizes_are_few_and_forgotten_when_empty() {
    let mut index = KvIndex::new();
    let tokens: Vec<u32> = (0..64).collect();
    let mut over = 0;
    for bs in 1..=1000u32 {
        let block: Vec<u32> = (0..bs).collect();
        over += index
            .apply(0, &[store(&[u64::from(bs)], None, &block, bs)])
            .over_capacity;
    }
    let sizes = index.block_sizes().count();
    assert!(
        sizes <= MAX_BLOCK_SIZES_PER_WORKER,
        "{sizes} block sizes held"
    );
    assert_eq!(over, 1000 - sizes as u64);
    // All removed: no size is left to scan.
    let removed: Vec<EngineHash> = (1..=1000).map(EngineHash).collect();
    index.apply(0, &[KvEvent::Removed(removed)]);
    assert_eq!(index.blocks(), 0);
    assert_eq!(index.block_sizes().count(), 0);
    // And a new size is taken again.
    let stats = index.apply(0, &[store(&[7], None, &tokens[..16], 16)]);
    assert_eq!((stats.stored, stats.over_capacity), (1, 0));
    assert_eq!(index.match_tokens(&tokens, None), vec![(0, 16)]);
}

/// One publisher's many block sizes do not crowd out another worker's
/// own: each worker holds a few sizes at most, and the index more than
/// one worker's share.
#[test]
fn one_workers_block_sizes_leave_room_for_anothers() {
    let mut index = KvIndex::new();
    for bs in 1..=100u32 {
        let block: Vec<u32> = (0..bs).collect();
        index.apply(0, &[store(&[u64::from(bs)], None, &block, bs)]);
    }
    assert_eq!(index.block_sizes().count(), MAX_BLOCK_SIZES_PER_WORKER);
    let tokens: Vec<u32> = (0..64).collect();
    let stats = index.apply(1, &[store(&[7], None, &tokens[..16], 16)]);
    assert_eq!((stats.stored, stats.over_capacity), (1, 0));
    assert!(index.match_tokens(&tokens, None).contains(&(1, 16)));
    // Its sizes are counted out as its blocks go.
    let removed: Vec<EngineHash> = (1..=2).map(EngineHash).collect();
    index.apply(0, &[KvEvent::Removed(removed)]);
    let block: Vec<u32> = (0..5).collect();
    let stats = index.apply(0, &[store(&[500], None, &block, 5)]);
    assert_eq!((stats.stored, stats.over_capacity), (1, 0));
}
