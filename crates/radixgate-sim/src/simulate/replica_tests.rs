//! Whole simulated runs with several router replicas: one replica is the
//! single router, replicas without sync lose hits, a short sync keeps them,
//! and a longer delay does no better than a shorter one.

use super::tests::{multi_turn, policy, shared_prefix, small};
use super::*;
use crate::load::Assign;

fn replicas(count: usize, sync_ms: Option<u64>) -> ReplicaConfig {
    ReplicaConfig {
        count,
        sync_delay: sync_ms.map(Duration::from_millis),
        spread: Assign::RoundRobin,
    }
}

fn fingerprint(s: &RunStats) -> (u64, u64, u64, u128, u64) {
    let ttft: f64 = s.ttft_ms.iter().sum();
    (
        s.completed,
        s.cached_tokens,
        s.events,
        s.end.as_nanos(),
        ttft.to_bits(),
    )
}

/// Recorded from the simulator before replicas existed (git 529529d), for
/// `small(4, …)` runs: (policy, closed or Poisson, workload) → completed,
/// cached tokens, events, end (ns), bits of the TTFT sum. cache_aware's
/// multi-turn rows (1 and 3) re-recorded when hot matches changed its
/// decisions there, and again when a hot match went to the least-loaded
/// worker near the best (`hot_margin`); each time the three replica
/// settings of every row still agreed with each other, event for event.
const SINGLE_ROUTER: [(u64, u64, u64, u128, u64); 12] = [
    (300, 160320, 1403, 1660173105, 4657940966202227375),
    (160, 39168, 1608, 1915796515, 4654719706262736876),
    (300, 160320, 2181, 6103880367, 4656611615069512489),
    (160, 39296, 1590, 3298152728, 4653917587734088051),
    (300, 159808, 1419, 1684717203, 4658189467601476239),
    (160, 38128, 1653, 1943407762, 4655020548890480199),
    (300, 160320, 1892, 6103880367, 4657029949477902491),
    (160, 38688, 1768, 3298152728, 4653669455794935376),
    (300, 146064, 1691, 1819744800, 4660680724935447722),
    (160, 26208, 1674, 2106907255, 4657568039730705525),
    (300, 145776, 2615, 6099194985, 4657037003225425689),
    (160, 25648, 2146, 3302472728, 4654843475744604737),
];

#[test]
fn one_replica_is_the_single_router_run_event_for_event() {
    let mut k = 0;
    for name in ["cache_aware", "prefill_aware", "least_load"] {
        for arrivals in [
            Arrivals::Closed { concurrency: 8 },
            Arrivals::Poisson { rate: 50.0 },
        ] {
            for wl in [shared_prefix(1.0), multi_turn()] {
                let base = small(4, wl, arrivals);
                for one in [
                    ReplicaConfig::default(),
                    replicas(1, None),
                    ReplicaConfig {
                        spread: Assign::BySession,
                        ..replicas(1, Some(100))
                    },
                ] {
                    let cfg = SimConfig {
                        replicas: one,
                        ..base.clone()
                    };
                    let got = fingerprint(&run(&cfg, &policy(name)).unwrap());
                    assert_eq!(got, SINGLE_ROUTER[k], "{name} {arrivals:?} case {k}");
                }
                k += 1;
            }
        }
    }
}

/// Hit rates of cache_aware on a shared-prefix load at each replica
/// setting, and the single router's.
fn hit_rate(cfg: &SimConfig, r: ReplicaConfig) -> f64 {
    let cfg = SimConfig {
        replicas: r,
        ..cfg.clone()
    };
    let s = run(&cfg, &policy("cache_aware")).unwrap();
    assert_eq!(s.completed + s.failed, 300);
    s.cached_tokens as f64 / s.prompt_tokens as f64
}

/// 16 groups of a 512-token system prompt over 4 workers, 300 requests:
/// a replica that does not know where a group went sends it elsewhere.
fn busy_shared_prefix() -> SimConfig {
    let wl = WorkloadConfig::SharedPrefix(crate::workload::SharedPrefixConfig {
        groups: 16,
        prompts_per_group: 16,
        system_tokens: 512,
        question_tokens: 32,
        output_tokens: 8,
        zipf: 0.5,
    });
    small(4, wl, Arrivals::Poisson { rate: 80.0 })
}

#[test]
fn four_replicas_without_sync_lose_hits_on_shared_prefixes() {
    let cfg = busy_shared_prefix();
    let one = hit_rate(&cfg, replicas(1, None));
    let alone = hit_rate(&cfg, replicas(4, None));
    // Measured: 0.780 against 0.882.
    assert!(
        alone < 0.95 * one,
        "no sync {alone:.3} vs one router {one:.3}"
    );
}

#[test]
fn four_replicas_with_a_1ms_sync_keep_the_single_routers_hit_rate() {
    let cfg = busy_shared_prefix();
    let one = hit_rate(&cfg, replicas(1, None));
    for spread in [Assign::RoundRobin, Assign::BySession] {
        let synced = hit_rate(
            &cfg,
            ReplicaConfig {
                spread,
                ..replicas(4, Some(1))
            },
        );
        assert!(
            synced >= 0.98 * one,
            "{spread:?}: sync 1 ms {synced:.3} vs one router {one:.3}"
        );
    }
}

#[test]
fn a_longer_sync_delay_does_not_beat_a_shorter_one() {
    let cfg = busy_shared_prefix();
    let rates: Vec<f64> = [Some(1), Some(10), Some(100), Some(1000), None]
        .into_iter()
        .map(|d| hit_rate(&cfg, replicas(4, d)))
        .collect();
    for (k, pair) in rates.windows(2).enumerate() {
        assert!(pair[1] <= pair[0] + 0.01, "step {k}: {rates:?}");
    }
    assert!(rates[3] < rates[0], "1 s is worse than 1 ms: {rates:?}");
}

#[test]
fn replicas_starting_together_send_their_first_requests_apart() {
    // Four requests at once, one per replica, before any sync message can
    // arrive: each replica sees an idle pool with nothing learned, a tie
    // its rotation breaks. Started at the same place, all four rotations
    // would pick the first worker (measured: [4, 0, 0, 0]).
    for name in ["cache_aware", "prefill_aware", "least_load", "round_robin"] {
        let base = small(4, multi_turn(), Arrivals::Closed { concurrency: 4 });
        let cfg = SimConfig {
            max_requests: Some(4),
            replicas: replicas(4, Some(1000)),
            ..base
        };
        let s = run(&cfg, &policy(name)).unwrap();
        assert_eq!(s.per_worker, vec![1, 1, 1, 1], "{name}");
    }
}
