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
        speeds: PoolSpeeds::default(),
        replicas: ReplicaConfig::default(),
        exact_events: false,
    }
}

pub(super) fn shared_prefix(zipf: f64) -> WorkloadConfig {
    WorkloadConfig::SharedPrefix(SharedPrefixConfig {
        groups: 6,
        prompts_per_group: 16,
        system_tokens: 512,
        question_tokens: 32,
        output_tokens: 8,
        zipf,
    })
}

pub(super) fn multi_turn() -> WorkloadConfig {
    WorkloadConfig::MultiTurn(MultiTurnConfig {
        conversations: 40,
        turns: 4,
        system_tokens: 128,
        user_tokens: 48,
        output_tokens: 16,
        think_ms: 50.0,
    })
}

pub(super) fn policy(name: &str) -> Contender {
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
        "oracle_ttft",
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
    for concurrency in [0, 100_001, 100_000_000] {
        cfg.arrivals = Arrivals::Closed { concurrency };
        let err = run(&cfg, &Contender::Oracle).unwrap_err().to_string();
        assert!(err.contains("--concurrency must be in 1..=100000"), "{err}");
    }
    let err = args::contender("fastest", 0).unwrap_err().to_string();
    assert!(
        err.contains("\"fastest\" (use cache_aware, prefill_aware, round_robin, random, power_of_two, least_load, consistent_hash, oracle or oracle_ttft)"),
        "{err}"
    );
}

#[test]
fn a_slower_pool_takes_its_factor_longer_request_by_request() {
    // One request at a time, routed the same way: every step of every
    // request is twice as long at half speed, so each TTFT doubles.
    let cfg = small(2, shared_prefix(0.5), Arrivals::Closed { concurrency: 1 });
    let slow = SimConfig {
        speeds: PoolSpeeds {
            initial: vec![0.5, 0.5],
            changes: Vec::new(),
        },
        ..cfg.clone()
    };
    let who = policy("round_robin");
    let (a, b) = (run(&cfg, &who).unwrap(), run(&slow, &who).unwrap());
    assert_eq!(a.completed, b.completed);
    assert_eq!(a.cached_tokens, b.cached_tokens);
    for (x, y) in a.ttft_ms.iter().zip(&b.ttft_ms) {
        assert!((y - 2.0 * x).abs() < 1e-3, "{y} vs 2 x {x}");
    }
    // One slow worker of two: only its requests (every other one) slow down.
    let one = SimConfig {
        speeds: PoolSpeeds {
            initial: vec![0.5],
            changes: Vec::new(),
        },
        ..cfg.clone()
    };
    let c = run(&one, &who).unwrap();
    let doubled = a
        .ttft_ms
        .iter()
        .zip(&c.ttft_ms)
        .filter(|(x, y)| (*y - 2.0 * *x).abs() < 1e-3)
        .count();
    let same = a
        .ttft_ms
        .iter()
        .zip(&c.ttft_ms)
        .filter(|(x, y)| (*y - *x).abs() < 1e-3)
        .count();
    assert_eq!(doubled + same, a.ttft_ms.len());
    assert!(
        doubled.abs_diff(same) <= 1,
        "{doubled} doubled, {same} same"
    );
}

#[test]
fn a_speed_change_takes_effect_at_its_simulated_time() {
    let cfg = small(1, shared_prefix(0.5), Arrivals::Closed { concurrency: 1 });
    let who = policy("round_robin");
    let with = |change: &str| {
        let c = SimConfig {
            speeds: PoolSpeeds {
                initial: Vec::new(),
                changes: vec![SpeedChange::parse(change).unwrap()],
            },
            ..cfg.clone()
        };
        run(&c, &who).unwrap()
    };
    let base = run(&cfg, &who).unwrap();
    let half = run(
        &SimConfig {
            speeds: PoolSpeeds {
                initial: vec![0.5],
                changes: Vec::new(),
            },
            ..cfg.clone()
        },
        &who,
    )
    .unwrap();
    // At time 0 the change precedes the first step: the same as starting
    // slow (but for the event itself). After the run it changes nothing.
    let first = with("0@0=0.5");
    assert_eq!(first.events, half.events + 1);
    assert!(first.ttft_ms == half.ttft_ms && first.e2e_ms == half.e2e_ms);
    assert_eq!(first.end, half.end);
    let late = with("0@100000=0.5");
    assert_eq!(late.ttft_ms, base.ttft_ms);
    assert_eq!(late.end, base.end);
    // Half-way through: the first requests as fast as before, the last
    // ones twice as slow, the end in between.
    let mid_secs = base.end.as_secs_f64() / 2.0;
    let mid = with(&format!("0@{mid_secs}=0.5"));
    let n = base.ttft_ms.len();
    assert_eq!(mid.ttft_ms[..10], base.ttft_ms[..10]);
    for k in n - 10..n {
        assert!(
            (mid.ttft_ms[k] - 2.0 * base.ttft_ms[k]).abs() < 1e-3,
            "request {k}: {} vs 2 x {}",
            mid.ttft_ms[k],
            base.ttft_ms[k]
        );
    }
    assert!(base.end < mid.end && mid.end < half.end);
    // Back to full speed later: the tail is as fast as the base run's.
    let back = SimConfig {
        speeds: PoolSpeeds {
            initial: vec![0.5],
            changes: vec![SpeedChange::parse("0@0.5=1").unwrap()],
        },
        ..cfg.clone()
    };
    let back = run(&back, &who).unwrap();
    assert_eq!(back.ttft_ms[n - 10..], base.ttft_ms[n - 10..]);
}

fn parse(argv: &[&str]) -> SimulateArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimulateArgs,
    }
    Cli::try_parse_from(std::iter::once("simulate").chain(argv.iter().copied()))
        .unwrap()
        .args
}

#[test]
fn timeline_shows_traffic_leaving_a_worker_that_slowed_down() {
    let small_load = [
        "--workers",
        "2",
        "--groups",
        "4",
        "--system-tokens",
        "256",
        "--question-tokens",
        "32",
        "--output-tokens",
        "8",
        "--rate",
        "40",
        "--requests",
        "600",
        "--seed",
        "3",
        "--speed-change",
        "0@5=0.2",
        "--timeline-secs",
        "5",
        "--policies",
        "round_robin,oracle",
    ];
    let report = parse(&small_load).execute().unwrap();
    let share = |row: &PolicyReport, k: usize| {
        let w = &row.timeline.as_ref().unwrap().windows[k].workers;
        w[0].dispatched as f64 / (w[0].dispatched + w[1].dispatched) as f64
    };
    for row in &report.rows {
        let t = row.timeline.as_ref().expect("asked for");
        assert_eq!(t.window_secs, 5.0);
        // 600 requests at 40/s: about 15 s, three windows.
        assert!((3..=4).contains(&t.windows.len()), "{}", t.windows.len());
        let total: u64 = t
            .windows
            .iter()
            .flat_map(|w| &w.workers)
            .map(|c| c.dispatched)
            .sum();
        assert_eq!(total, row.completed + row.failed);
    }
    let (rr, oracle) = (&report.rows[0], &report.rows[1]);
    assert!((share(rr, 1) - 0.5).abs() < 0.02, "round robin alternates");
    // Round robin keeps sending to the slow worker, whose TTFT grows.
    let ttft = |k: usize| rr.timeline.as_ref().unwrap().windows[k].workers[0].ttft_mean_ms;
    let (before, after) = (ttft(0).unwrap(), ttft(1).unwrap());
    assert!(after > 2.0 * before, "{before} -> {after} ms");
    assert!(
        share(oracle, 1) < share(oracle, 0) - 0.1,
        "the oracle moves traffic off the slow worker: {} -> {}",
        share(oracle, 0),
        share(oracle, 1)
    );
    // The text report prints the timeline only when asked.
    let text = report.table();
    assert!(text.contains("timeline per 5 s"), "{text}");
    let without: Vec<&str> = small_load[..small_load.len() - 4].to_vec();
    let plain = parse(&without).execute().unwrap();
    assert!(plain.rows.iter().all(|r| r.timeline.is_none()));
    assert!(!plain.table().contains("timeline"));
    let json = serde_json::to_value(&plain).unwrap();
    assert!(json["rows"][0].get("timeline").is_none());
    let mut bad = parse(&without);
    bad.timeline_secs = Some(-1.0);
    assert!(
        bad.execute()
            .unwrap_err()
            .to_string()
            .contains("--timeline-secs")
    );
}

#[test]
fn pool_speed_flags_are_checked_against_the_pool() {
    let a = parse(&["--workers", "4", "--worker-speeds", "0.5,1"]);
    let c = a.sim_config().unwrap();
    assert_eq!(c.speeds.initial, [0.5, 1.0]);
    assert_eq!(c.speeds.initial_speed(3, 1.0), 1.0);
    let a = parse(&[
        "--workers",
        "2",
        "--speed-change",
        "1@10=0.5",
        "--speed-change",
        "1@20=1",
    ]);
    assert_eq!(a.sim_config().unwrap().speeds.changes.len(), 2);
    for (argv, expect) in [
        (
            &["--workers", "2", "--worker-speeds", "1,1,0.5"][..],
            "3 speeds for 2 workers",
        ),
        (&["--worker-speeds", "0"][..], "speed of worker 0"),
        (
            &["--workers", "2", "--speed-change", "2@1=0.5"][..],
            "no worker 2 in a pool of 2",
        ),
        (&["--speed-change", "0@1"][..], "expected W@T=F"),
        (&["--speed-change", "0@1=0"][..], "--speed-change 0@1=0"),
    ] {
        let e = parse(argv).sim_config().unwrap_err().to_string();
        assert!(e.contains(expect), "{argv:?}: {e}");
    }
}

/// With caches far smaller than the working set, a tree that only
/// remembers (no bound from the workers' cache size) keeps prefixes the
/// engines have evicted; exact matches from the engines' KV caches do not,
/// and a tree kept within each worker's cache comes closer to them.
#[test]
fn exact_events_see_evictions_the_tree_cannot() {
    let mut cfg = small(
        4,
        WorkloadConfig::SharedPrefix(SharedPrefixConfig {
            groups: 48,
            prompts_per_group: 16,
            system_tokens: 1024,
            question_tokens: 32,
            output_tokens: 8,
            zipf: 0.6,
        }),
        Arrivals::Poisson { rate: 40.0 },
    );
    cfg.worker.engine.kv_capacity_tokens = 8_000;
    cfg.max_requests = Some(600);
    let hit = |s: &RunStats| s.cached_tokens as f64 / s.prompt_tokens as f64;
    let Contender::Policy(bounded) = policy("cache_aware") else {
        unreachable!("a policy")
    };
    let unbounded = sweep::apply(
        &bounded,
        &vec![("correction.capacity_bound".to_owned(), false.into())],
    )
    .unwrap();
    let approx = cluster::run(&cfg, &Contender::Policy(unbounded.clone())).unwrap();
    let within = cluster::run(&cfg, &Contender::Policy(bounded)).unwrap();
    cfg.exact_events = true;
    let exact = cluster::run(&cfg, &Contender::Policy(unbounded)).unwrap();
    let oracle = cluster::run(&cfg, &Contender::Oracle).unwrap();
    eprintln!(
        "hit rate: approximate {:.3}, within the caches {:.3}, exact {:.3}, oracle {:.3}",
        hit(&approx),
        hit(&within),
        hit(&exact),
        hit(&oracle)
    );
    assert_eq!(exact.completed, approx.completed);
    assert!(hit(&exact) > hit(&approx));
    assert!(hit(&within) > hit(&approx));
}
