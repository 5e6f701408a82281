//! Guard storms: many threads route and drop guards in scrambled order while
//! the single writer flips health and adds/removes workers. Afterwards every
//! worker's load and pending prefill is back to zero and every request was
//! counted once.
//!
//! `pending_prefill() == 0` only checks something for a policy whose guards
//! carry prefill (prefill_aware), so its storm also asserts that prefill was
//! in fact added during the storm: a guard that leaked its prefill count on
//! any drop order would then fail the final check.

use radixgate_routing::{PolicyConfig, Registry, WorkerSpec};
use std::collections::VecDeque;
use std::thread;

const THREADS: usize = 8;
const PER_THREAD: usize = 1500;

/// Whether the policy's decisions put predicted prefill on the worker.
#[derive(Clone, Copy, PartialEq)]
enum Prefill {
    Carried,
    Never,
}

fn storm(config: PolicyConfig, prefill: Prefill) {
    let mut reg = Registry::new(config.build().unwrap());
    let router = reg.router();
    let mut all: Vec<_> = (0..6)
        .map(|i| reg.add(WorkerSpec::new(format!("http://w{i}:1"))).unwrap())
        .collect();
    let readers: Vec<_> = (0..THREADS)
        .map(|t| {
            let router = router.clone();
            thread::spawn(move || {
                let mut held = VecDeque::new();
                let mut routed = 0usize;
                let mut carried = 0usize;
                let mut x = t as u64 + 1;
                for i in 0..PER_THREAD {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let text = format!("{:02} shared prefix {}", x % 16, i % 7);
                    let key = format!("s{}", x % 50);
                    // Errors are allowed mid-storm (all down for a moment);
                    // what matters is that every guard taken is released.
                    if let Ok(d) = router.select(None, &text, Some(&key), &[]) {
                        routed += 1;
                        // While this decision's guard is alive, its prefill
                        // (if any) is counted on the worker.
                        if d.decision.worker().pending_prefill() > 0 {
                            carried += 1;
                        }
                        held.push_back(d.decision.into_guard());
                    }
                    // Release a pseudo-random number of guards, oldest or newest.
                    for _ in 0..(x % 3) {
                        if x.is_multiple_of(2) {
                            held.pop_front();
                        } else {
                            held.pop_back();
                        }
                    }
                }
                (routed, carried)
            })
        })
        .collect();
    // The single writer: health flaps, a worker comes and goes.
    let mut round = 0u32;
    while !readers.iter().all(|r| r.is_finished()) && round < 10_000 {
        let w = all[round as usize % 5].id();
        reg.set_health(w, round.is_multiple_of(2)).unwrap();
        if round.is_multiple_of(10) {
            let extra = reg
                .add(WorkerSpec::new(format!("http://extra{round}:1")))
                .unwrap();
            all.push(extra.clone());
            if round.is_multiple_of(20) {
                reg.remove(extra.id()).unwrap();
            }
        }
        round += 1;
        thread::yield_now();
    }
    let (routed, carried) = readers
        .into_iter()
        .map(|r| r.join().unwrap())
        .fold((0, 0), |(r, c), (routed, carried)| {
            (r + routed, c + carried)
        });
    assert!(routed > THREADS * PER_THREAD / 2, "{routed} routed");
    match prefill {
        // Enough decisions carried prefill that a leak would show below.
        Prefill::Carried => assert!(carried > routed / 100, "{carried} of {routed}"),
        Prefill::Never => assert_eq!(carried, 0),
    }
    for w in &all {
        assert_eq!(w.load(), 0, "{w:?}");
        assert_eq!(w.pending_prefill(), 0, "{w:?}");
    }
    let processed: u64 = all.iter().map(|w| w.processed()).sum();
    assert_eq!(processed, routed as u64);
}

#[test]
fn cache_aware_storm_returns_every_load_and_prefill_to_zero() {
    // Every rule carries the cost model's predicted prefill in its guards.
    storm(PolicyConfig::default(), Prefill::Carried);
    storm(
        PolicyConfig::CacheAware(radixgate_routing::CacheAwareConfig::seed_rule()),
        Prefill::Carried,
    );
}

#[test]
fn prefill_aware_storm_returns_every_load_and_prefill_to_zero() {
    storm(
        PolicyConfig::PrefillAware(Default::default()),
        Prefill::Carried,
    );
}

#[test]
fn other_policies_storm_returns_every_load_to_zero() {
    for name in [
        "round_robin",
        "random",
        "power_of_two",
        "least_load",
        "consistent_hash",
    ] {
        let cfg: PolicyConfig = serde_json::from_str(&format!(r#"{{"policy":"{name}"}}"#)).unwrap();
        storm(cfg, Prefill::Never);
    }
}
