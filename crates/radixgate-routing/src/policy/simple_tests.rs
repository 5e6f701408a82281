//! Tests of the load-only and hashing policies.

use super::testutil::{hold, pick, workers};
use super::*;

fn counts(policy: &dyn Policy, ws: &[Arc<Worker>], n: usize) -> Vec<usize> {
    let mut counts = vec![0; ws.len()];
    for i in 0..n {
        counts[pick(policy, ws, &format!("request {i}")).0 as usize] += 1;
    }
    counts
}

#[test]
fn round_robin_cycles_over_available_workers() {
    let p = RoundRobin::new();
    let ws = workers(4);
    let order: Vec<u32> = (0..8).map(|_| pick(&p, &ws, "x").0).collect();
    assert_eq!(order, vec![0, 1, 2, 3, 0, 1, 2, 3]);
    ws[2].set_healthy(false);
    let c = counts(&p, &ws, 400);
    assert_eq!(c[2], 0);
    assert_eq!(c.iter().sum::<usize>(), 400);
    assert!(c[0] >= 100 && c[1] >= 100 && c[3] >= 100, "{c:?}");
}

#[test]
fn random_is_reproducible_uniform_and_skips_unavailable() {
    let ws = workers(4);
    let a: Vec<u32> = {
        let p = Random::new(Some(9));
        (0..50).map(|_| pick(&p, &ws, "x").0).collect()
    };
    let b: Vec<u32> = {
        let p = Random::new(Some(9));
        (0..50).map(|_| pick(&p, &ws, "x").0).collect()
    };
    assert_eq!(a, b);
    ws[0].set_breaker(crate::BreakerState::Open);
    let c = counts(&Random::new(Some(1)), &ws, 3000);
    assert_eq!(c[0], 0);
    assert!(c[1..].iter().all(|&n| (800..1200).contains(&n)), "{c:?}");
}

#[test]
fn power_of_two_avoids_the_loaded_worker() {
    let p = PowerOfTwo::new(Some(5));
    let ws = workers(2);
    let _g = hold(&ws[0], 10);
    for _ in 0..50 {
        assert_eq!(pick(&p, &ws, "x"), ws[1].id());
    }
    // With many workers, the most loaded one is only chosen if both samples
    // hit it, which cannot happen (samples are distinct).
    let ws = workers(5);
    let _g = hold(&ws[3], 10);
    assert_eq!(counts(&p, &ws, 500)[3], 0);
    ws[1].set_healthy(false);
    assert_eq!(counts(&p, &ws, 500)[1], 0);
}

#[test]
fn least_load_takes_the_shortest_queue_and_rotates_ties() {
    let p = LeastLoad::new();
    let ws = workers(3);
    let _g0 = hold(&ws[0], 3);
    let _g1 = hold(&ws[1], 1);
    let _g2 = hold(&ws[2], 2);
    let d = p.select(&RequestView::new("m", "x"), &ws).unwrap();
    assert_eq!(d.worker().id(), ws[1].id());
    assert_eq!(
        d.rendered().to_string(),
        "least_load branch=least_load worker=w1:8000 load=1 min=1 max=3 available=3"
    );
    drop(d);
    let idle = workers(4);
    let c = counts(&p, &idle, 40);
    assert_eq!(c, vec![10, 10, 10, 10]);
}

fn ring(ws: &[Arc<Worker>]) -> ConsistentHash {
    let p = ConsistentHash::new(160, 1.25);
    for w in ws {
        p.on_worker_added(w);
    }
    p
}

fn owner(p: &ConsistentHash, ws: &[Arc<Worker>], key: &str) -> WorkerId {
    p.select(&RequestView::new("m", "").with_routing_key(Some(key)), ws)
        .unwrap()
        .worker()
        .id()
}

#[test]
fn consistent_hash_is_sticky_and_moves_few_keys_on_pool_changes() {
    let ws = workers(11);
    let ten = &ws[..10];
    let p = ring(ten);
    let keys: Vec<String> = (0..2000).map(|i| format!("session-{i}")).collect();
    let before: Vec<WorkerId> = keys.iter().map(|k| owner(&p, ten, k)).collect();
    let again: Vec<WorkerId> = keys.iter().map(|k| owner(&p, ten, k)).collect();
    assert_eq!(before, again, "sticky");
    let mut share = [0usize; 10];
    for o in &before {
        share[o.0 as usize] += 1;
    }
    assert!(share.iter().all(|&s| (100..320).contains(&s)), "{share:?}");

    // Add an 11th worker: only keys that now belong to it move (~1/11).
    p.on_worker_added(&ws[10]);
    let after_add: Vec<WorkerId> = keys.iter().map(|k| owner(&p, &ws, k)).collect();
    let moved = before
        .iter()
        .zip(&after_add)
        .filter(|(a, b)| a != b)
        .count();
    assert!(
        after_add
            .iter()
            .zip(&before)
            .all(|(a, b)| a == b || a.0 == 10)
    );
    assert!((80..330).contains(&moved), "moved {moved} of 2000");

    // Remove worker 3: only its keys move.
    p.on_worker_removed(&ws[3]);
    let rest: Vec<Arc<Worker>> = ws.iter().filter(|w| w.id().0 != 3).cloned().collect();
    let after_remove: Vec<WorkerId> = keys.iter().map(|k| owner(&p, &rest, k)).collect();
    for ((a, b), k) in after_add.iter().zip(&after_remove).zip(&keys) {
        assert!(a == b || a.0 == 3, "{k} moved from {a} to {b}");
    }
}

#[test]
fn consistent_hash_bounds_load_and_skips_unavailable_owners() {
    let ws = workers(4);
    let p = ring(&ws);
    let key = "user-42";
    let home = owner(&p, &ws, key);
    let home_w = ws[home.0 as usize].clone();
    // Over the bound: ceil(1.25 * (8 + 1) / 4) = 3 <= 8, so the key overflows.
    let _g = hold(&home_w, 8);
    let d = p
        .select(&RequestView::new("m", "").with_routing_key(Some(key)), &ws)
        .unwrap();
    assert_ne!(d.worker().id(), home);
    assert_eq!(d.explanation().branch, Branch::HashRingOverflow);
    drop(d);
    drop(_g);
    home_w.set_healthy(false);
    assert_ne!(owner(&p, &ws, key), home);
    home_w.set_healthy(true);
    home_w.set_breaker(crate::BreakerState::Open);
    assert_ne!(owner(&p, &ws, key), home);
    home_w.set_breaker(crate::BreakerState::Closed);
    assert_eq!(owner(&p, &ws, key), home, "back home after recovery");
    let d = p.select(&RequestView::new("m", "no key"), &ws).unwrap();
    assert_eq!(d.explanation().branch, Branch::NoRoutingKey);
}

/// The decision says when a key left its owner: an owner that is
/// unhealthy (or its breaker open) passes the key on clockwise, as one
/// over the load bound does, and the header and the decisions' metric
/// read `hash_ring_overflow`, not `hash_ring`. A worker of another pool
/// on the ring is no owner of this pool's keys: passing it is no overflow.
#[test]
fn a_key_whose_owner_is_unavailable_overflows() {
    let ws = workers(4);
    let p = ring(&ws);
    let keys: Vec<String> = (0..200).map(|i| format!("session-{i}")).collect();
    let homes: Vec<WorkerId> = keys.iter().map(|k| owner(&p, &ws, k)).collect();
    let down = ws[1].clone();
    down.set_healthy(false);
    let pool_of_three: Vec<Arc<Worker>> = ws.iter().filter(|w| w.id().0 != 1).cloned().collect();
    for (key, home) in keys.iter().zip(&homes) {
        let view = RequestView::new("m", "").with_routing_key(Some(key));
        let d = p.select(&view, &ws).unwrap();
        let want = if *home == down.id() {
            Branch::HashRingOverflow
        } else {
            Branch::HashRing
        };
        assert_ne!(d.worker().id(), down.id());
        assert_eq!(d.explanation().branch, want, "{key}: home {home}");
        drop(d);
        // Worker 1 in another pool: this pool's owner is the next one.
        let d = p.select(&view, &pool_of_three).unwrap();
        assert_eq!(d.explanation().branch, Branch::HashRing, "{key}");
    }
}
