//! Hot-spot protection under a zipf-skewed workload.
//!
//! Replay: 4 workers, 8 hot prefixes drawn with zipf exponent 2.0 (the top
//! prefix is ~65% of traffic), each request = prefix (2,000 chars) + a unique
//! question. Load is simulated with real guards: each request stays in
//! flight until `HOLD` later requests have been routed, so the pool runs at
//! a steady `HOLD` requests in flight. Deterministic (fixed seed).
//!
//! "Hit" here is what a worker cache that can hold all 8 prefixes would see:
//! the chosen worker was sent that prefix before. Compared: the seed rule
//! (no hot-spot protection), the relative cap (the rule before the cost
//! model), the default `predicted_ttft` rule, prefill_aware
//! (guards keep their predicted prefill until dropped), round_robin.
//! Run with `--nocapture` to see the table.

use radixgate_routing::{
    CacheAwareConfig, HotSpotRule, LoadGuard, PolicyConfig, Registry, WorkerSpec,
};
use std::collections::{HashSet, VecDeque};

const WORKERS: usize = 4;
const PREFIXES: usize = 8;
const REQUESTS: usize = 2000;
const HOLD: usize = 16;
const ZIPF_S: f64 = 2.0;

/// Each worker's fair share of the requests.
const MEAN_SHARE: f64 = 1.0 / WORKERS as f64;
/// The default hot-spot rule lets a holder take a hit while its load is at
/// most `factor` (1.5) times the pool's mean load. Every request here stays
/// in flight for the same number of decisions, so a worker's share of the
/// requests follows its share of the load: the busiest worker's share should
/// stay within the same factor of the mean share.
const SHARE_FACTOR: f64 = 1.5;
/// What the factor does not cover, as a share of all requests: the rule's
/// `slack` (a holder may also run a few requests above the least-loaded
/// worker, which the factor alone would not allow at a low mean) and the
/// cold start before every worker holds the hot prefix. Small enough that
/// the seed rule (no protection, above 0.5) is far outside the bound.
const SHARE_SLACK: f64 = 0.05;

struct Outcome {
    counts: Vec<usize>,
    hits: usize,
    peak_load: usize,
}

/// xorshift64*: a fixed, dependency-free generator for the replay.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn zipf_ranks(n: usize, seed: u64) -> Vec<usize> {
    let weights: Vec<f64> = (1..=PREFIXES)
        .map(|r| 1.0 / (r as f64).powf(ZIPF_S))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut rng = Rng(seed);
    (0..n)
        .map(|_| {
            let mut u = rng.next_f64() * total;
            weights
                .iter()
                .position(|&w| {
                    u -= w;
                    u < 0.0
                })
                .unwrap_or(PREFIXES - 1)
        })
        .collect()
}

fn replay(config: PolicyConfig) -> Outcome {
    let mut reg = Registry::new(config.build().unwrap());
    let router = reg.router();
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| reg.add(WorkerSpec::new(format!("http://w{i}:1"))).unwrap())
        .collect();
    let prefixes: Vec<String> = (0..PREFIXES)
        .map(|p| {
            format!(
                "[prefix {p}] {}",
                "a long shared system prompt. ".repeat(70)
            )
        })
        .collect();
    let mut in_flight: VecDeque<LoadGuard> = VecDeque::new();
    let mut seen: HashSet<(u32, usize)> = HashSet::new();
    let mut out = Outcome {
        counts: vec![0; WORKERS],
        hits: 0,
        peak_load: 0,
    };
    for (i, rank) in zipf_ranks(REQUESTS, 0x5eed).into_iter().enumerate() {
        let text = format!("{}question {i}: why?", prefixes[rank]);
        let d = router.select(None, &text, None, &[]).unwrap().decision;
        let id = d.worker().id().0;
        out.counts[id as usize] += 1;
        if !seen.insert((id, rank)) {
            out.hits += 1;
        }
        in_flight.push_back(d.into_guard());
        if in_flight.len() > HOLD {
            in_flight.pop_front();
        }
        let peak = workers.iter().map(|w| w.load()).max().unwrap();
        out.peak_load = out.peak_load.max(peak);
    }
    out
}

#[test]
fn relative_cap_spreads_hot_prefixes_and_keeps_affinity() {
    let seed_rule = replay(PolicyConfig::CacheAware(CacheAwareConfig {
        hot_spot: HotSpotRule::Off,
        ..CacheAwareConfig::default()
    }));
    let capped = replay(PolicyConfig::CacheAware(CacheAwareConfig::seed_rule()));
    let by_ttft = replay(PolicyConfig::default());
    let round_robin = replay(PolicyConfig::RoundRobin(Default::default()));
    let prefill = replay(PolicyConfig::PrefillAware(Default::default()));
    let share = |o: &Outcome| *o.counts.iter().max().unwrap() as f64 / REQUESTS as f64;
    let hit_rate = |o: &Outcome| o.hits as f64 / REQUESTS as f64;
    eprintln!("policy                 requests per worker     max share  hit rate  peak in-flight");
    for (name, o) in [
        ("cache_aware, seed rule", &seed_rule),
        ("cache_aware, rel. cap ", &capped),
        ("cache_aware, ttft     ", &by_ttft),
        ("prefill_aware         ", &prefill),
        ("round_robin           ", &round_robin),
    ] {
        eprintln!(
            "{name} {:<24} {:>8.3} {:>9.3} {:>10}",
            format!("{:?}", o.counts),
            share(o),
            hit_rate(o),
            o.peak_load
        );
    }
    // Without protection the top prefix's holder takes most requests.
    assert!(share(&seed_rule) > 0.5, "seed rule {:?}", seed_rule.counts);
    // With the cap, the busiest worker takes at most what the rule lets a
    // holder run to: the mean share times the factor, plus the slack...
    let bound = MEAN_SHARE * SHARE_FACTOR + SHARE_SLACK;
    assert!(
        share(&capped) <= bound,
        "capped {:?}: busiest share {:.3} above {bound:.3}",
        capped.counts,
        share(&capped)
    );
    assert!(
        share(&seed_rule) > bound,
        "the bound must tell the two apart"
    );
    assert!(capped.peak_load < seed_rule.peak_load);
    // ...while nearly every request still lands on a worker holding its prefix
    // (at most one cold miss per worker and prefix).
    assert!(capped.hits >= REQUESTS - WORKERS * PREFIXES);
    assert!(hit_rate(&capped) > hit_rate(&round_robin) - 0.01);
    assert_eq!(round_robin.counts, vec![REQUESTS / WORKERS; WORKERS]);
    // The prefill-cost policy also replicates the hot prefix rather than
    // queueing behind its holder.
    assert!(
        share(&prefill) < share(&seed_rule),
        "prefill {:?}",
        prefill.counts
    );
    assert!(prefill.hits >= REQUESTS - WORKERS * PREFIXES);
    // The default rule decides by predicted time to first token. Here the
    // questions are a few characters, so a hit costs a holder almost no
    // prefill and nothing here slows it down: it keeps every hit.
    assert!(by_ttft.hits >= REQUESTS - WORKERS * PREFIXES);
}
