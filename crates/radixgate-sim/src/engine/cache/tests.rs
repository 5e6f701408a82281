//! Unit and property tests of the paged prefix cache.

use super::*;
use proptest::prelude::*;

fn seq(start: u64, len: usize) -> Vec<u64> {
    (start..start + len as u64).collect()
}

/// Caches `tokens` as a finished request would: acquire, extend, release.
fn cache_seq(c: &mut KvCache, tokens: &[u64]) -> bool {
    let hashes = c.block_hashes(tokens);
    let matched = c.match_blocks(&hashes);
    let mut reserved = hashes.len() - matched;
    let Some(path) = c.acquire(&hashes, matched, reserved) else {
        return false;
    };
    let full = c.extend(&path, &hashes, tokens, &mut reserved);
    c.release(path, 0);
    c.release(full, reserved);
    true
}

#[test]
fn finished_sequences_stay_cached_and_match_by_prefix() {
    let mut c = KvCache::new(4, 100);
    assert!(cache_seq(&mut c, &seq(0, 10)));
    assert_eq!(c.tree_blocks(), 2);
    assert_eq!(c.reserved_blocks(), 0);
    assert_eq!(c.cached_prefix_tokens(&seq(0, 10)), 8);
    assert_eq!(c.cached_prefix_tokens(&seq(0, 6)), 4);
    let mut other = seq(0, 5);
    other.extend([99, 98, 97, 96]);
    assert_eq!(c.cached_prefix_tokens(&other), 4);
    assert_eq!(c.cached_prefix_tokens(&seq(1, 10)), 0);
    c.check_invariants();
}

#[test]
fn lru_evicts_least_recent_leaf_first() {
    // Room for 4 blocks; A and B are two-block sequences sharing nothing.
    let mut c = KvCache::new(2, 4);
    let a = seq(0, 4);
    let b = seq(100, 4);
    assert!(cache_seq(&mut c, &a));
    assert!(cache_seq(&mut c, &b));
    // Touch A so that B is least recently used.
    assert!(cache_seq(&mut c, &a));
    // A new two-block sequence needs two blocks: B's two go, leaf first.
    assert!(cache_seq(&mut c, &seq(200, 2)));
    assert_eq!(c.cached_prefix_tokens(&a), 4);
    assert_eq!(
        c.cached_prefix_tokens(&b),
        2,
        "B's leaf goes before its root"
    );
    assert!(cache_seq(&mut c, &seq(300, 2)));
    assert_eq!(c.cached_prefix_tokens(&b), 0);
    assert_eq!(c.cached_prefix_tokens(&a), 4);
    c.check_invariants();
}

#[test]
fn acquire_fails_without_side_effects_when_pinned_blocks_fill_capacity() {
    let mut c = KvCache::new(2, 3);
    let hashes = c.block_hashes(&seq(0, 6));
    let path = c.acquire(&hashes, 0, 3).expect("fits");
    assert_eq!(c.used_blocks(), 3);
    let other = c.block_hashes(&seq(50, 2));
    assert!(c.acquire(&other, 0, 1).is_none());
    assert_eq!(c.used_blocks(), 3);
    let mut reserved = 3;
    let full = c.extend(&path, &hashes, &seq(0, 6), &mut reserved);
    c.release(path, 0);
    c.release(full, reserved);
    // Now the three blocks are cache, evictable for a new request.
    let p2 = c.acquire(&other, 0, 1).expect("evicts one");
    assert_eq!(c.cached_prefix_tokens(&seq(0, 6)), 4);
    c.release(p2, 1);
    c.check_invariants();
}

#[test]
fn flush_evicts_only_unpinned_blocks() {
    let mut c = KvCache::new(2, 10);
    assert!(cache_seq(&mut c, &seq(0, 4)));
    let hashes = c.block_hashes(&seq(100, 4));
    let mut reserved = 2;
    let p = c.acquire(&hashes, 0, 2).unwrap();
    let full = c.extend(&p, &hashes, &seq(100, 4), &mut reserved);
    c.release(p, 0);
    assert_eq!(c.flush(), 2);
    assert_eq!(c.cached_prefix_tokens(&seq(100, 4)), 4);
    assert_eq!(c.cached_prefix_tokens(&seq(0, 4)), 0);
    c.release(full, reserved);
    c.check_invariants();
}

#[test]
fn events_report_stored_runs_with_parent_and_tokens_then_evictions() {
    let mut c = KvCache::new(2, 4);
    c.record_events(true);
    let a = seq(0, 5); // two full blocks and a partial one
    assert!(cache_seq(&mut c, &a));
    let ha = c.block_hashes(&a);
    assert_eq!(
        c.take_events(),
        vec![CacheEvent::Stored {
            hashes: ha.clone(),
            parent: None,
            tokens: seq(0, 4),
        }]
    );
    // Extending A by one block reports only the new block, under A's last.
    let mut a2 = seq(0, 4);
    a2.extend([50, 51]);
    assert!(cache_seq(&mut c, &a2));
    let ha2 = c.block_hashes(&a2);
    assert_eq!(
        c.take_events(),
        vec![CacheEvent::Stored {
            hashes: vec![ha2[2]],
            parent: Some(ha[1]),
            tokens: vec![50, 51],
        }]
    );
    assert!(c.take_events().is_empty(), "taking empties the log");
    // Two new blocks need room and one is free: A2's leaf goes (the LRU
    // leaf), reported before the store.
    let b = seq(100, 4);
    assert!(cache_seq(&mut c, &b));
    let hb = c.block_hashes(&b);
    assert_eq!(
        c.take_events(),
        vec![
            CacheEvent::Removed {
                hashes: vec![ha2[2]],
            },
            CacheEvent::Stored {
                hashes: hb,
                parent: None,
                tokens: b,
            },
        ]
    );
    // A flush that empties the cache is one `Cleared`.
    assert_eq!(c.flush(), 4);
    assert_eq!(c.take_events(), vec![CacheEvent::Cleared]);
    // Off: nothing is logged.
    c.record_events(false);
    assert!(cache_seq(&mut c, &a));
    assert!(c.take_events().is_empty());
}

#[test]
fn a_flush_that_leaves_pinned_blocks_reports_removals() {
    let mut c = KvCache::new(2, 10);
    c.record_events(true);
    assert!(cache_seq(&mut c, &seq(0, 2)));
    let pinned = seq(100, 2);
    let hashes = c.block_hashes(&pinned);
    let mut reserved = 1;
    let p = c.acquire(&hashes, 0, 1).unwrap();
    let full = c.extend(&p, &hashes, &pinned, &mut reserved);
    c.release(p, 0);
    c.take_events();
    assert_eq!(c.flush(), 1);
    assert_eq!(
        c.take_events(),
        vec![CacheEvent::Removed {
            hashes: c.block_hashes(&seq(0, 2)),
        }]
    );
    c.release(full, reserved);
}

/// Applies `events` to `set` as a subscriber would, checking each store
/// against the chain: its parent is held (or it starts at the root), and
/// its tokens hash, from the parent, to its hashes.
fn apply_events(
    c: &KvCache,
    set: &mut std::collections::HashSet<u64>,
    parents: &std::collections::HashMap<u64, Vec<u64>>,
    events: Vec<CacheEvent>,
) -> Result<(), TestCaseError> {
    for e in events {
        match e {
            CacheEvent::Stored {
                hashes,
                parent,
                tokens,
            } => {
                prop_assert_eq!(tokens.len(), hashes.len() * c.block_size());
                let mut full = match parent {
                    Some(p) => {
                        prop_assert!(set.contains(&p), "parent not held");
                        parents[&p].clone()
                    }
                    None => Vec::new(),
                };
                let depth = full.len() / c.block_size();
                full.extend(&tokens);
                prop_assert_eq!(&c.block_hashes(&full)[depth..], &hashes[..]);
                for h in hashes {
                    prop_assert!(set.insert(h), "stored twice");
                }
            }
            CacheEvent::Removed { hashes } => {
                for h in hashes {
                    prop_assert!(set.remove(&h), "removed a block not held");
                }
            }
            CacheEvent::Cleared => set.clear(),
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    /// Start a request on sequence family `fam` of `len` tokens, reserving `extra` blocks.
    Start {
        fam: u64,
        len: usize,
        extra: usize,
    },
    /// Commit the prompt of running request `i` (modulo count).
    Commit(usize),
    /// Finish running request `i` (modulo count).
    Finish(usize),
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..4, 0usize..40, 0usize..4).prop_map(|(fam, len, extra)| Op::Start { fam, len, extra }),
        3 => any::<usize>().prop_map(Op::Commit),
        3 => any::<usize>().prop_map(Op::Finish),
        1 => Just(Op::Flush),
    ]
}

struct Running {
    tokens: Vec<u64>,
    hashes: Vec<u64>,
    path: PinnedPath,
    reserved: usize,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Capacity is never exceeded, pinned blocks are never evicted, and the
    /// bookkeeping agrees with a recount after every operation.
    #[test]
    fn invariants_hold_under_random_operations(ops in proptest::collection::vec(op(), 1..80), cap in 1usize..24) {
        let mut c = KvCache::new(4, cap);
        let mut running: Vec<Running> = Vec::new();
        for op in ops {
            match op {
                Op::Start { fam, len, extra } => {
                    // Families share prefixes: family f is f*1000.. with a
                    // per-length tail, so prefixes overlap across requests.
                    let tokens: Vec<u64> = (0..len as u64).map(|i| fam * 1000 + i).collect();
                    let hashes = c.block_hashes(&tokens);
                    let matched = c.match_blocks(&hashes);
                    let need = hashes.len() - matched + extra;
                    let before = c.used_blocks();
                    match c.acquire(&hashes, matched, need) {
                        Some(path) => running.push(Running { tokens, hashes, path, reserved: need }),
                        None => prop_assert_eq!(c.used_blocks(), before),
                    }
                }
                Op::Commit(i) if !running.is_empty() => {
                    let i = i % running.len();
                    let r = &mut running[i];
                    let new = c.extend(&r.path, &r.hashes, &r.tokens, &mut r.reserved);
                    let old = std::mem::replace(&mut r.path, new);
                    c.release(old, 0);
                }
                Op::Finish(i) if !running.is_empty() => {
                    let r = running.swap_remove(i % running.len());
                    c.release(r.path, r.reserved);
                }
                Op::Flush => { c.flush(); }
                _ => {}
            }
            c.check_invariants();
            // Every pinned path's blocks are still in the cache.
            for r in &running {
                prop_assert!(c.match_blocks(&r.hashes[..r.path.blocks()]) == r.path.blocks());
            }
        }
        for r in running.drain(..) {
            c.release(r.path, r.reserved);
        }
        c.check_invariants();
        prop_assert_eq!(c.reserved_blocks(), 0);
        prop_assert_eq!(c.unpinned_blocks(), c.tree_blocks());
    }

    /// A subscriber that applies the event log holds exactly the cache's
    /// blocks after every operation, and every store is a valid chain.
    #[test]
    fn events_replay_to_the_cached_set(ops in proptest::collection::vec(op(), 1..80), cap in 1usize..24) {
        let mut c = KvCache::new(4, cap);
        c.record_events(true);
        let mut running: Vec<Running> = Vec::new();
        let mut set = std::collections::HashSet::new();
        // Every prefix the test made, by its last block's hash.
        let mut prefixes = std::collections::HashMap::new();
        for op in ops {
            match op {
                Op::Start { fam, len, extra } => {
                    let tokens: Vec<u64> = (0..len as u64).map(|i| fam * 1000 + i).collect();
                    let hashes = c.block_hashes(&tokens);
                    for (i, h) in hashes.iter().enumerate() {
                        prefixes.insert(*h, tokens[..(i + 1) * 4].to_vec());
                    }
                    let matched = c.match_blocks(&hashes);
                    let need = hashes.len() - matched + extra;
                    if let Some(path) = c.acquire(&hashes, matched, need) {
                        running.push(Running { tokens, hashes, path, reserved: need });
                    }
                }
                Op::Commit(i) if !running.is_empty() => {
                    let i = i % running.len();
                    let r = &mut running[i];
                    let new = c.extend(&r.path, &r.hashes, &r.tokens, &mut r.reserved);
                    let old = std::mem::replace(&mut r.path, new);
                    c.release(old, 0);
                }
                Op::Finish(i) if !running.is_empty() => {
                    let r = running.swap_remove(i % running.len());
                    c.release(r.path, r.reserved);
                }
                Op::Flush => { c.flush(); }
                _ => {}
            }
            let events = c.take_events();
            apply_events(&c, &mut set, &prefixes, events)?;
            let mut held: Vec<u64> = c.index.keys().copied().collect();
            let mut seen: Vec<u64> = set.iter().copied().collect();
            held.sort_unstable();
            seen.sort_unstable();
            prop_assert_eq!(held, seen);
        }
        for r in running.drain(..) {
            c.release(r.path, r.reserved);
        }
    }
}
