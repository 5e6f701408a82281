//! Tests of whole simulated runs: determinism, conservation, ordering, and
//! the oracle as an upper bound on small cases.

use super::*;
use crate::engine::EngineConfig;
use crate::workload::{MultiTurnConfig, SharedPrefixConfig};
use radixgate_routing::CacheAwareConfig;

pub(super) fn small(workers: usize, workload: WorkloadConfig, arrivals: Arrivals) -> SimConfig {
    SimConfig {
        workers,
        worker: WorkerConfig {
            engine: EngineConfig {
                kv_capacity_tokens: 200_000,
                ..EngineConfig::default()
            },
            ..WorkerConfig::default()
        },
        workload,
        shape: TextShape::default(),
        seed: 7,
        api: Api::ChatCompletions,
        arrivals,
        max_requests: Some(300),
        duration: None,
        load_poll: Some(Duration::from_millis(100)),
    }
}

fn shared_prefix(zipf: f64) -> WorkloadConfig {
    WorkloadConfig::SharedPrefix(SharedPrefixConfig {
        groups: 6,
        prompts_per_group: 16,
        system_tokens: 512,
        question_tokens: 32,
        output_tokens: 8,
        zipf,
    })
}

fn multi_turn() -> WorkloadConfig {
    WorkloadConfig::MultiTurn(MultiTurnConfig {
        conversations: 40,
        turns: 4,
        system_tokens: 128,
        user_tokens: 48,
        output_tokens: 16,
        think_ms: 50.0,
    })
}

fn policy(name: &str) -> Contender {
    args::contender(name, 7).unwrap()
}

fn all() -> Vec<Contender> {
    [
        "cache_aware",
        "prefill_aware",
        "round_robin",
        "least_load",
        "random",
        "power_of_two",
        "consistent_hash",
        "oracle",
    ]
    .into_iter()
    .map(policy)
    .collect()
}

#[test]
fn same_seed_same_results_and_another_seed_differs() {
    for wl in [shared_prefix(1.0), multi_turn()] {
        for arrivals in [
            Arrivals::Closed { concurrency: 8 },
            Arrivals::Poisson { rate: 50.0 },
        ] {
            let cfg = small(3, wl.clone(), arrivals);
            for who in all() {
                let a = run(&cfg, &who).unwrap();
                let b = run(&cfg, &who).unwrap();
                assert_eq!(a, b, "{} {arrivals:?}", who.name());
            }
            let other = SimConfig {
                seed: 8,
                ..cfg.clone()
            };
            let who = policy("cache_aware");
            assert_ne!(run(&cfg, &who).unwrap(), run(&other, &who).unwrap());
        }
    }
}

#[test]
fn every_request_completes_exactly_once() {
    for (wl, expected) in [(shared_prefix(0.0), 300), (multi_turn(), 160)] {
        for arrivals in [
            Arrivals::Closed { concurrency: 5 },
            Arrivals::Poisson { rate: 200.0 },
        ] {
            let cfg = small(4, wl.clone(), arrivals);
            for who in all() {
                let s = run(&cfg, &who).unwrap();
                let name = who.name();
                assert_eq!(s.completed, expected, "{name} {arrivals:?}");
                assert_eq!(s.failed, 0);
                assert_eq!(s.per_worker.iter().sum::<u64>(), s.completed, "{name}");
                assert_eq!(s.ttft_ms.len() as u64, s.completed);
                assert_eq!(s.e2e_ms.len() as u64, s.completed);
                // Per request, in completion order: first token no later
                // than the last, and both after the arrival.
                for (t, e) in s.ttft_ms.iter().zip(&s.e2e_ms) {
                    assert!(*t > 0.0 && t <= e, "{name}: ttft {t} e2e {e}");
                }
                let e2e_sorted = s.e2e_ms.iter().all(|e| e.is_finite());
                assert!(e2e_sorted);
                assert!(s.cached_tokens <= s.prompt_tokens);
            }
        }
    }
}

#[test]
fn oversized_requests_fail_and_end_their_session() {
    let mut cfg = small(2, multi_turn(), Arrivals::Closed { concurrency: 4 });
    // The first turns fit a worker; a later turn (with the history) does not.
    cfg.worker.engine.kv_capacity_tokens = 320;
    let s = run(&cfg, &policy("cache_aware")).unwrap();
    // Each conversation fails once, then ends (no reply to continue from).
    assert_eq!(s.failed, 40, "{s:?}");
    assert!(s.completed >= 40 && s.completed + s.failed < 160, "{s:?}");
}

#[test]
fn oracle_hit_rate_bounds_every_policy_at_light_load() {
    for wl in [shared_prefix(0.0), shared_prefix(1.2), multi_turn()] {
        for workers in [2, 4] {
            let cfg = small(workers, wl.clone(), Arrivals::Closed { concurrency: 1 });
            let hit = |s: &RunStats| s.cached_tokens as f64 / s.prompt_tokens as f64;
            let oracle = hit(&run(&cfg, &Contender::Oracle).unwrap());
            for who in all() {
                let h = hit(&run(&cfg, &who).unwrap());
                assert!(
                    h <= oracle + 1e-9,
                    "{} on {} x{workers}: {h} > oracle {oracle}",
                    who.name(),
                    wl.name()
                );
            }
            let rr = hit(&run(&cfg, &policy("round_robin")).unwrap());
            assert!(
                oracle > rr,
                "the oracle must beat the floor: {oracle} vs {rr}"
            );
        }
    }
}

#[test]
fn cache_aware_beats_round_robin_on_shared_prefixes() {
    let cfg = small(4, shared_prefix(0.0), Arrivals::Closed { concurrency: 8 });
    let ca = run(
        &cfg,
        &Contender::Policy(PolicyConfig::CacheAware(CacheAwareConfig::default())),
    )
    .unwrap();
    let rr = run(&cfg, &policy("round_robin")).unwrap();
    assert!(
        ca.cached_tokens > rr.cached_tokens,
        "{} vs {}",
        ca.cached_tokens,
        rr.cached_tokens
    );
}

#[test]
fn duration_stops_issuing_and_in_flight_requests_finish() {
    let mut cfg = small(2, shared_prefix(0.0), Arrivals::Poisson { rate: 100.0 });
    cfg.max_requests = None;
    cfg.duration = Some(Duration::from_secs(1));
    let s = run(&cfg, &policy("round_robin")).unwrap();
    // About 100 arrivals in one second, all completed after it.
    assert!((50..=150).contains(&s.completed), "{}", s.completed);
    assert!(s.end >= Duration::from_millis(900));
}

#[test]
fn bad_configs_are_clear_errors() {
    let mut cfg = small(0, shared_prefix(0.0), Arrivals::Closed { concurrency: 1 });
    assert!(
        run(&cfg, &Contender::Oracle)
            .unwrap_err()
            .to_string()
            .contains("--workers")
    );
    cfg.workers = 2;
    cfg.arrivals = Arrivals::Closed { concurrency: 0 };
    assert!(run(&cfg, &Contender::Oracle).is_err());
    assert!(args::contender("fastest", 0).is_err());
}
