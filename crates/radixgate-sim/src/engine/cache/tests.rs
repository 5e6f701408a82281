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
    let full = c.extend(&path, &hashes, &mut reserved);
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
    let full = c.extend(&path, &hashes, &mut reserved);
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
    let full = c.extend(&p, &hashes, &mut reserved);
    c.release(p, 0);
    assert_eq!(c.flush(), 2);
    assert_eq!(c.cached_prefix_tokens(&seq(100, 4)), 4);
    assert_eq!(c.cached_prefix_tokens(&seq(0, 4)), 0);
    c.release(full, reserved);
    c.check_invariants();
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
                        Some(path) => running.push(Running { hashes, path, reserved: need }),
                        None => prop_assert_eq!(c.used_blocks(), before),
                    }
                }
                Op::Commit(i) if !running.is_empty() => {
                    let i = i % running.len();
                    let r = &mut running[i];
                    let new = c.extend(&r.path, &r.hashes, &mut r.reserved);
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
}
