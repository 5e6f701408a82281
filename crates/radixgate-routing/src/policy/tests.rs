//! Tests of the cache_aware policy (the others are in `simple_tests.rs`).

use super::testutil::{hold, pick, workers};
use super::*;
use crate::config::{CacheAwareConfig, HotSpotRule, LowMatchTarget};
use crate::{ExactMatches, WorkerSpec};
use proptest::prelude::*;

fn cache_aware(cfg: CacheAwareConfig) -> CacheAware {
    cfg.validate().expect("valid test config");
    CacheAware::new(cfg)
}

fn seed_rule() -> CacheAwareConfig {
    CacheAwareConfig {
        hot_spot: HotSpotRule::Off,
        ..CacheAwareConfig::default()
    }
}

fn long_text(tag: &str) -> String {
    format!("{tag}: {}", "you are a helpful assistant. ".repeat(8))
}

#[test]
fn same_text_goes_to_the_same_worker() {
    for cfg in [seed_rule(), CacheAwareConfig::default()] {
        let p = cache_aware(cfg);
        let ws = workers(4);
        for tag in ["alpha", "beta", "gamma", "delta", "epsilon"] {
            let text = long_text(tag);
            let first = pick(&p, &ws, &text);
            for _ in 0..10 {
                assert_eq!(pick(&p, &ws, &text), first, "{tag}");
            }
        }
    }
}

#[test]
fn a_prefix_or_an_extension_goes_to_the_same_worker() {
    let p = cache_aware(CacheAwareConfig::default());
    let ws = workers(4);
    // Occupy the other workers' trees with unrelated texts first.
    for tag in ["a", "b", "c", "d", "e", "f"] {
        pick(&p, &ws, &long_text(tag));
    }
    let turn1 = format!("<system>{}<user>hello", "rules. ".repeat(20));
    let owner = pick(&p, &ws, &turn1);
    let prefix: String = turn1.chars().take(turn1.chars().count() / 2).collect();
    assert_eq!(pick(&p, &ws, &prefix), owner);
    let turn2 = format!("{turn1}<assistant>hi<user>and more");
    assert_eq!(pick(&p, &ws, &turn2), owner);
}

#[test]
fn twenty_in_flight_versus_zero_always_picks_the_idle_worker() {
    for hot_spot in [HotSpotRule::Off, HotSpotRule::default()] {
        let p = cache_aware(CacheAwareConfig {
            balance_abs_threshold: 5,
            balance_rel_threshold: 2.0,
            hot_spot,
            ..CacheAwareConfig::default()
        });
        let ws = workers(2);
        let text = long_text("busy");
        // Make worker 0 the holder of the text.
        p.tree_or_create("m").insert(&text, ws[0].id().tenant());
        let _busy = hold(&ws[0], 20);
        for _ in 0..50 {
            let d = p.select(&RequestView::new("m", &text), &ws).unwrap();
            assert_eq!(d.worker().id(), ws[1].id());
            assert_eq!(d.explanation().branch, Branch::Imbalanced);
        }
    }
}

#[test]
fn with_live_events_the_safety_net_sends_a_text_where_it_is_being_computed() {
    let p = cache_aware(CacheAwareConfig {
        balance_abs_threshold: 5,
        balance_rel_threshold: 2.0,
        ..CacheAwareConfig::default()
    });
    let ws = workers(4);
    let text = long_text("agent");
    let tree = p.tree_or_create("m");
    // Worker 0 holds the text and runs 20 requests; the safety net already
    // sent the text to worker 2 (in the tree, not yet in its engine's
    // events: its prefill is still running).
    tree.insert(&text, ws[0].id().tenant());
    tree.insert(&text, ws[2].id().tenant());
    let _busy = hold(&ws[0], 20);
    let _computing = hold(&ws[2], 1);
    let live = [
        (ws[0].id(), 64),
        (ws[1].id(), 0),
        (ws[2].id(), 0),
        (ws[3].id(), 0),
    ];
    let exact = ExactMatches {
        input_tokens: 64,
        live: &live,
    };
    let ask = |text: &str, exact: Option<ExactMatches<'_>>| {
        let req = RequestView::new("m", text).with_exact(exact);
        let d = p.select(&req, &ws).expect("a worker");
        (d.worker().id(), d.explanation().branch)
    };
    // Not the busy holder, not an idle worker that would start a second
    // copy: the worker computing it.
    for _ in 0..4 {
        assert_eq!(ask(&text, Some(exact)), (ws[2].id(), Branch::Imbalanced));
    }
    // Without events the net keeps its shortest queue.
    let (id, branch) = ask(&text, None);
    assert!(id == ws[1].id() || id == ws[3].id(), "{id:?}");
    assert_eq!(branch, Branch::Imbalanced);
    // A text no relief worker holds or computes: the shortest queue.
    let (id, branch) = ask(&long_text("new"), Some(exact));
    assert!(id == ws[1].id() || id == ws[3].id(), "{id:?}");
    assert_eq!(branch, Branch::Imbalanced);
}

#[test]
fn ties_at_the_matched_node_go_by_load_then_recency() {
    let p = cache_aware(seed_rule());
    let ws = workers(3);
    let text = long_text("shared");
    let tree = p.tree_or_create("m");
    tree.insert(&text, ws[2].id().tenant());
    tree.insert(&text, ws[0].id().tenant()); // most recent holder
    assert_eq!(
        pick(&p, &ws, &text),
        ws[0].id(),
        "recency breaks a load tie"
    );
    // (that pick refreshed worker 0's recency; load still decides first)
    let _g = hold(&ws[0], 1);
    assert_eq!(pick(&p, &ws, &text), ws[2].id(), "load before recency");
}

#[test]
fn holders_are_found_in_slices_not_in_id_order() {
    let p = cache_aware(seed_rule());
    let mut ws = workers(12);
    ws.reverse();
    let text = long_text("unsorted");
    let tree = p.tree_or_create("m");
    tree.insert(&text, WorkerId(3).tenant());
    tree.insert(&text, WorkerId(9).tenant());
    let _g = hold(&ws[2], 1); // worker 9 (reversed slice) is busier
    assert_eq!(pick(&p, &ws, &text), WorkerId(3));
}

#[test]
fn misses_spread_over_tied_workers_instead_of_piling_on_the_first() {
    for low_match in [LowMatchTarget::MinLoad, LowMatchTarget::SmallestTree] {
        let p = cache_aware(CacheAwareConfig {
            low_match,
            ..seed_rule()
        });
        let ws = workers(4);
        let mut counts = [0usize; 4];
        // Distinct first characters: every request is a miss; loads stay 0.
        for i in 0..40u32 {
            let text = format!("{}{}", char::from_u32(0x4e00 + i).unwrap(), "x".repeat(50));
            counts[pick(&p, &ws, &text).0 as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c >= 5), "{low_match:?}: {counts:?}");
    }
}

#[test]
fn smallest_tree_target_prefers_the_emptiest_cache() {
    let p = cache_aware(CacheAwareConfig {
        low_match: LowMatchTarget::SmallestTree,
        ..seed_rule()
    });
    let ws = workers(3);
    let tree = p.tree_or_create("m");
    tree.insert(&"a".repeat(500), ws[0].id().tenant());
    tree.insert(&"b".repeat(300), ws[1].id().tenant());
    tree.insert(&"c".repeat(100), ws[2].id().tenant());
    let d = p
        .select(&RequestView::new("m", "zzz unrelated"), &ws)
        .unwrap();
    assert_eq!(d.worker().id(), ws[2].id());
    assert_eq!(d.explanation().branch, Branch::LowMatchSmallestTree);
}

#[test]
fn an_unavailable_holder_is_skipped_for_the_next_best_match_and_keeps_its_tree() {
    let p = cache_aware(seed_rule());
    let ws = workers(3);
    let tree = p.tree_or_create("m");
    let base = long_text("doc");
    let deep = format!("{base} and the deepest part");
    tree.insert(&deep, ws[0].id().tenant());
    tree.insert(&base, ws[1].id().tenant());
    ws[0].set_healthy(false);
    for _ in 0..5 {
        let d = p.select(&RequestView::new("m", &deep), &ws).unwrap();
        assert_ne!(d.worker().id(), ws[0].id());
        assert_eq!(d.worker().id(), ws[1].id(), "the next-best holder");
    }
    // Worker 0's record survived its outage.
    let full = deep.chars().count();
    assert_eq!(
        tree.prefix_match_for(&deep, ws[0].id().tenant())
            .matched_chars,
        full
    );
    // An open breaker is skipped the same way.
    ws[0].set_healthy(true);
    ws[1].set_breaker(crate::BreakerState::Open);
    let only0 = format!("{deep}!");
    tree.insert(&only0, ws[0].id().tenant());
    assert_eq!(pick(&p, &ws, &only0), ws[0].id(), "back after recovery");
    for _ in 0..5 {
        assert_ne!(pick(&p, &ws, &base), ws[1].id());
    }
}

#[test]
fn imbalance_is_computed_over_available_workers_only() {
    let p = cache_aware(CacheAwareConfig {
        balance_abs_threshold: 5,
        balance_rel_threshold: 2.0,
        ..seed_rule()
    });
    let ws = workers(3);
    let text = long_text("held");
    p.tree_or_create("m").insert(&text, ws[0].id().tenant());
    let _g0 = hold(&ws[0], 10);
    let _g1 = hold(&ws[1], 9);
    // Worker 2 is idle but down: counting it would call the pool imbalanced.
    ws[2].set_healthy(false);
    let d = p.select(&RequestView::new("m", &text), &ws).unwrap();
    assert_eq!(d.explanation().branch, Branch::CacheHit);
    assert_eq!(d.worker().id(), ws[0].id());
}

#[test]
fn hot_spot_cap_spills_a_hit_to_the_least_loaded_worker() {
    let p = cache_aware(CacheAwareConfig {
        hot_spot: HotSpotRule::RelativeCap {
            slack: 2,
            factor: 1.5,
        },
        ..CacheAwareConfig::default()
    });
    let ws = workers(4);
    let text = long_text("hot");
    p.tree_or_create("m").insert(&text, ws[0].id().tenant());
    let _g = hold(&ws[0], 2);
    // load 2 <= max(0 + 2, 1.5 * 0.5): the hit is honoured.
    assert_eq!(pick(&p, &ws, &text), ws[0].id());
    let _g2 = hold(&ws[0], 1);
    // load 3 > max(2, 1.5 * 0.75): spill, and the spill target now holds it.
    let d = p.select(&RequestView::new("m", &text), &ws).unwrap();
    assert_eq!(d.explanation().branch, Branch::HotSpotSpill);
    let spill = d.worker().id();
    assert_ne!(spill, ws[0].id());
    drop(d);
    assert_eq!(pick(&p, &ws, &text), spill, "a second holder, less loaded");
}

#[test]
fn models_have_separate_trees() {
    let p = cache_aware(seed_rule());
    let ws = workers(4);
    let text = long_text("shared across models");
    let a = p.select(&RequestView::new("a", &text), &ws).unwrap();
    let a_id = a.worker().id();
    drop(a);
    let b = p.select(&RequestView::new("b", &text), &ws).unwrap();
    assert_eq!(b.explanation().branch, Branch::LowMatchSmallestTree);
    assert_eq!(b.explanation().matched_chars, Some(0));
    assert!(p.tree("a").unwrap().prefix_match(&text).matched_chars > 0);
    assert_eq!(
        p.tree("b")
            .unwrap()
            .prefix_match_for(&text, a_id.tenant())
            .matched_chars,
        if b.worker().id() == a_id {
            text.chars().count()
        } else {
            0
        }
    );
}

#[test]
fn empty_text_and_no_available_worker() {
    let p = cache_aware(CacheAwareConfig::default());
    let ws = workers(2);
    let d = p.select(&RequestView::new("m", ""), &ws).unwrap();
    assert_eq!(d.explanation().match_rate(), Some(0.0));
    drop(d);
    for w in &ws {
        w.set_healthy(false);
    }
    assert_eq!(
        p.select(&RequestView::new("m", "x"), &ws).unwrap_err(),
        RoutingError::NoHealthyWorker { model: "m".into() }
    );
    assert!(p.select(&RequestView::new("m", "x"), &[]).is_err());
}

#[test]
fn explanation_reads_as_one_header_line() {
    let p = cache_aware(CacheAwareConfig::default());
    let ws = workers(2);
    let text = long_text("explain");
    drop(p.select(&RequestView::new("m", &text), &ws).unwrap());
    let _g = hold(&ws[1], 1);
    let d = p.select(&RequestView::new("m", &text), &ws).unwrap();
    let line = d.rendered().to_string();
    assert!(
        line.starts_with("cache_aware branch=cache_hit worker=w"),
        "{line}"
    );
    assert!(line.contains(" match=1.000 "), "{line}");
    assert!(line.contains(" min=0 max=1 available=2 ttft="), "{line}");
    let (_, alt) = line.rsplit_once(" alt=").expect("an alternative's TTFT");
    assert!(
        alt.ends_with("ms") && alt.trim_end_matches("ms").parse::<f64>().is_ok(),
        "{line}"
    );
    assert!(line.is_ascii() && !line.contains(['\n', ',', '"']));
}

#[test]
fn eviction_bounds_each_worker_and_the_global_bound_holds_between_passes() {
    let p = cache_aware(CacheAwareConfig {
        max_tree_size: 100,
        max_total_chars: 1400,
        ..seed_rule()
    });
    let ws = workers(2);
    for i in 0..40 {
        pick(&p, &ws, &format!("{i:03}{}", "y".repeat(40)));
        let stats = p.tree("m").unwrap().stats();
        // The bound counts each node as DEFAULT_NODE_CHARS characters too.
        let weight = stats.tenant_chars + stats.nodes * radixgate_tree::DEFAULT_NODE_CHARS;
        assert!(weight <= 1400, "{stats:?}");
    }
    assert!(p.evict_now() > 0);
    for w in &ws {
        assert!(p.cached_chars(w.id()).unwrap() <= 100);
    }
}

#[tokio::test(start_paused = true)]
async fn background_eviction_runs_on_its_interval_and_stops_on_cancel() {
    let cfg = CacheAwareConfig {
        max_tree_size: 50,
        eviction_interval_secs: 10,
        ..seed_rule()
    };
    let p: Arc<dyn Policy> = Arc::new(cache_aware(cfg.clone()));
    let ws = workers(1);
    for i in 0..10 {
        pick(&*p, &ws, &format!("{i}{}", "z".repeat(30)));
    }
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = crate::spawn_eviction(p.clone(), cancel.clone()).expect("enabled");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(p.cached_chars(ws[0].id()).unwrap() > 50, "not yet");
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        p.cached_chars(ws[0].id()).unwrap() <= 50,
        "after one interval"
    );
    cancel.cancel();
    task.await.unwrap();

    let off: Arc<dyn Policy> = Arc::new(cache_aware(CacheAwareConfig {
        eviction_interval_secs: 0,
        ..cfg
    }));
    assert!(crate::spawn_eviction(off, CancellationToken::new()).is_none());
}

use tokio_util::sync::CancellationToken;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The branch taken is `Imbalanced` exactly when the DESIGN §1 formula
    /// over the available workers' loads says so. Thresholds are drawn near
    /// the loads' own spread and ratio so the boundaries (`max - min == abs`,
    /// `max == rel * min`) are hit often, not by luck.
    #[test]
    fn imbalance_decision_equals_the_formula(
        loads in proptest::collection::vec((0usize..120, any::<bool>()), 1..7),
        abs_offset in -3i64..=3,
        rel_mode in 0u8..3,
        rel_random in 1.0f64..4.0,
    ) {
        let up: Vec<usize> = loads.iter().filter(|l| l.1).map(|l| l.0).collect();
        let (min, max) = (
            up.iter().copied().min().unwrap_or(0),
            up.iter().copied().max().unwrap_or(0),
        );
        let abs = ((max - min) as i64 + abs_offset).max(0) as usize;
        let rel = match rel_mode {
            // exactly the ratio: `max > rel * min` is false at equality
            0 if min > 0 => max as f64 / min as f64,
            1 if min > 0 => (max as f64 / min as f64 - 0.01).max(1.0),
            _ => rel_random,
        };
        let p = cache_aware(CacheAwareConfig {
            balance_abs_threshold: abs,
            balance_rel_threshold: rel,
            ..seed_rule()
        });
        let ws = workers(loads.len());
        let mut guards = Vec::new();
        for (w, &(load, up)) in ws.iter().zip(&loads) {
            guards.push(hold(w, load));
            w.set_healthy(up);
        }
        let text = long_text("prop");
        let result = p.select(&RequestView::new("m", &text), &ws);
        if up.is_empty() {
            prop_assert!(result.is_err());
            return Ok(());
        }
        let expected = max - min > abs && max as f64 > rel * min as f64;
        let d = result.unwrap();
        prop_assert_eq!(d.explanation().branch == Branch::Imbalanced, expected);
        prop_assert!(d.worker().is_available());
        if expected {
            prop_assert_eq!(d.worker().load() - 1, min);
        }
    }
}

fn granular(g: usize) -> CacheAware {
    cache_aware(CacheAwareConfig {
        match_granularity_chars: g,
        ..seed_rule()
    })
}

#[test]
fn matches_within_the_granularity_tie_and_go_by_load() {
    let ws = workers(3);
    let system = long_text("system");
    let text = format!("{system}<user>What is a page?");
    for (g, want) in [(1, 0), (64, 1)] {
        let p = granular(g);
        let tree = p.tree_or_create("m");
        // Worker 0 matches 2 more characters ("at") than worker 1.
        tree.insert(&format!("{system}<user>Where"), ws[1].id().tenant());
        tree.insert(&format!("{system}<user>Whatever"), ws[0].id().tenant());
        let _busy = hold(&ws[0], 1);
        let d = p.select(&RequestView::new("m", &text), &ws).unwrap();
        assert_eq!(d.worker().id(), ws[want].id(), "granularity {g}");
        assert_eq!(d.explanation().branch, Branch::CacheHit);
        let matched = d.explanation().matched_chars.unwrap();
        let prefix = format!("{system}<user>Wh").chars().count();
        assert_eq!(matched, if want == 0 { prefix + 2 } else { prefix });
    }
}

#[test]
fn a_match_deeper_by_more_than_the_granularity_wins_over_load() {
    let ws = workers(3);
    let system = long_text("system");
    let tail = "x".repeat(70);
    let text = format!("{system}{tail} and a question");
    let p = granular(64);
    let tree = p.tree_or_create("m");
    tree.insert(&system, ws[1].id().tenant());
    tree.insert(&format!("{system}{tail}"), ws[0].id().tenant());
    let _busy = hold(&ws[0], 1);
    assert_eq!(pick(&p, &ws, &text), ws[0].id(), "70 chars deeper");
    // Among near matches the least loaded wins, and on equal load the deeper.
    let _busy1 = hold(&ws[1], 1);
    assert_eq!(pick(&p, &ws, &text), ws[0].id());
}

#[test]
fn the_fallback_match_uses_the_granularity_too() {
    let ws = workers(3);
    let base = long_text("doc");
    let deep = format!("{base}<deepest>");
    for (g, want) in [(1, 1), (64, 2)] {
        let p = granular(g);
        let tree = p.tree_or_create("m");
        tree.insert(&deep, ws[0].id().tenant());
        tree.insert(&format!("{base}<deep"), ws[1].id().tenant());
        tree.insert(&base, ws[2].id().tenant());
        ws[0].set_healthy(false);
        let _busy = hold(&ws[1], 1);
        let d = p.select(&RequestView::new("m", &deep), &ws).unwrap();
        assert_eq!(d.worker().id(), ws[want].id(), "granularity {g}");
        assert_eq!(d.explanation().branch, Branch::CacheHitFallback);
        ws[0].set_healthy(true);
    }
}

/// Teaches `w`'s fit for model "m" that it prefills `chars_per_sec`
/// characters per second (plus 5 ms), from a spread of observations.
fn teach(w: &Worker, chars_per_sec: f64) {
    let cost = crate::CostModelConfig::default();
    for i in 0..200usize {
        let work = crate::Work {
            queued_chars: (i * 7919) % 20_000,
            uncached_chars: (i * 104_729) % 8_000,
            in_flight: i % 5,
        };
        let secs = 0.005 + work.prefill_chars() as f64 / chars_per_sec;
        w.observe_ttft(0, work, std::time::Duration::from_secs_f64(secs), &cost);
    }
}

#[test]
fn predicted_ttft_keeps_a_hit_until_the_holder_is_much_slower_then_spills() {
    let p = cache_aware(CacheAwareConfig::default());
    let ws = workers(3);
    for w in &ws {
        teach(w, 150_000.0);
    }
    // A 4,000-char shared prefix held by worker 1 only.
    let prefix = "p".repeat(4_000);
    p.tree_or_create("m").insert(&prefix, ws[1].id().tenant());
    let ask = |q: &str| {
        let d = p
            .select(&RequestView::new("m", &format!("{prefix}{q}")), &ws)
            .unwrap();
        (
            d.worker().id(),
            d.explanation().branch,
            d.rendered().to_string(),
        )
    };
    let (id, branch, shown) = ask("first?");
    assert_eq!((id, branch), (ws[1].id(), Branch::CacheHit), "{shown}");
    // 5,000 chars queued on the holder (about 40 ms against 32 ms for a
    // miss elsewhere): within the bound (1.5 × 32 + 10 ms) plus the term
    // for the 4,000 chars a spill would repeat.
    let queued = LoadGuard::with_prefill(ws[1].clone(), 5_000);
    let (id, branch, shown) = ask("second?");
    assert_eq!((id, branch), (ws[1].id(), Branch::CacheHit), "{shown}");
    drop(queued);
    // 20,000 chars queued (about 140 ms): the quickest worker takes it.
    let queued = LoadGuard::with_prefill(ws[1].clone(), 20_000);
    let (id, branch, shown) = ask("third?");
    assert_ne!(id, ws[1].id(), "{shown}");
    assert_eq!(branch, Branch::HotSpotSpill, "{shown}");
    drop(queued);
    // The in-flight rule would have kept the hit: the holder has nothing
    // in flight.
    let seed = cache_aware(CacheAwareConfig::seed_rule());
    seed.tree_or_create("m")
        .insert(&prefix, ws[1].id().tenant());
    let _queued = LoadGuard::with_prefill(ws[1].clone(), 20_000);
    assert_eq!(pick(&seed, &ws, &format!("{prefix}fourth?")), ws[1].id());
}

/// The default config with the hot-match test scaled by `hot_share` and
/// its margin `hot_margin`.
fn with_hot(hot_share: f64, hot_margin: f64) -> CacheAwareConfig {
    let HotSpotRule::PredictedTtft {
        margin,
        slack_ms,
        reuse_ms,
        overflow_margin,
        ..
    } = CacheAwareConfig::default().hot_spot
    else {
        panic!("the default rule is predicted_ttft")
    };
    CacheAwareConfig {
        hot_spot: HotSpotRule::PredictedTtft {
            margin,
            slack_ms,
            reuse_ms,
            overflow_margin,
            hot_share,
            hot_margin,
        },
        ..CacheAwareConfig::default()
    }
}

fn with_hot_share(hot_share: f64) -> CacheAwareConfig {
    let HotSpotRule::PredictedTtft { hot_margin, .. } = CacheAwareConfig::default().hot_spot else {
        panic!("the default rule is predicted_ttft")
    };
    with_hot(hot_share, hot_margin)
}

#[test]
fn a_hot_prefix_goes_to_an_idle_worker_nearly_as_quick_as_its_busy_holders() {
    // A short system prompt that every request starts with, held by three
    // of four workers, each running two requests (decoding: nothing left
    // to prefill); the fourth is idle and holds nothing. The cost model
    // learned that requests in flight do not delay a first token (the
    // `teach` fit: 5 ms plus prefill), so a holder is the quickest worker,
    // by the 0.8 ms the idle one would spend on the prompt.
    let ws = workers(4);
    for w in &ws {
        teach(w, 150_000.0);
    }
    let system = "s".repeat(120);
    let policy = |hot_margin| {
        let p = cache_aware(with_hot(1.5, hot_margin));
        let tree = p.tree_or_create("m");
        for i in 0..90 {
            tree.insert(&format!("{system}{i:03}"), ws[i % 3].id().tenant());
        }
        p
    };
    let _running: Vec<LoadGuard> = ws[..3]
        .iter()
        .flat_map(|w| [LoadGuard::acquire(w.clone()), LoadGuard::acquire(w.clone())])
        .collect();
    let ask = |p: &CacheAware, q: &str| {
        let d = p
            .select(&RequestView::new("m", &format!("{system}{q}")), &ws)
            .unwrap();
        (d.worker().id(), d.explanation().branch)
    };
    // Within the default margin of the best, the idle worker takes it, and
    // then holds it: the next one is a hit there.
    let p = policy(0.25);
    assert_eq!(ask(&p, "q0"), (ws[3].id(), Branch::HotSpotSpill));
    assert_eq!(ask(&p, "q1"), (ws[3].id(), Branch::CacheHit));
    // With no margin only the quickest qualify: a busy holder.
    let strict = policy(0.0);
    let (id, branch) = ask(&strict, "q0");
    assert_ne!(id, ws[3].id());
    assert_eq!(branch, Branch::CacheHit);
}

#[test]
fn a_hot_prefix_spreads_while_a_cold_one_stays_with_its_holder() {
    let ws = workers(4);
    for w in &ws {
        teach(w, 150_000.0);
    }
    let (hot, cold) = ("h".repeat(4_000), "c".repeat(4_000));
    // 100 recent requests, all sent to worker 1: 9 in 10 behind the hot
    // prefix (0.9 of the traffic: more than one worker's share of four),
    // the rest behind the cold one (0.1: less).
    let policy = |hot_share| {
        let p = cache_aware(with_hot_share(hot_share));
        let tree = p.tree_or_create("m");
        for i in 0..100 {
            let prefix = if i % 10 == 0 { &cold } else { &hot };
            tree.insert(&format!("{prefix}{i:03}"), ws[1].id().tenant());
        }
        p
    };
    let ask = |p: &CacheAware, prefix: &str, q: &str| {
        let d = p
            .select(&RequestView::new("m", &format!("{prefix}{q}")), &ws)
            .unwrap();
        (d.worker().id(), d.explanation().branch)
    };
    // 5,000 chars queued on the holder: slower than a miss elsewhere, but
    // within the bound for a hit (the first predicted_ttft test).
    let _queued = LoadGuard::with_prefill(ws[1].clone(), 5_000);
    let p = policy(1.0);
    assert_eq!(ask(&p, &cold, "a?"), (ws[1].id(), Branch::CacheHit));
    let (id, branch) = ask(&p, &hot, "b?");
    assert_ne!(id, ws[1].id());
    assert_eq!(branch, Branch::HotSpotSpill);
    // The worker it went to holds it now, and is the quickest holder.
    assert_eq!(ask(&p, &hot, "c?"), (id, Branch::CacheHit));
    // With the test off the hot prefix stays too.
    let off = policy(0.0);
    assert_eq!(ask(&off, &hot, "b?"), (ws[1].id(), Branch::CacheHit));
}

#[test]
fn while_the_pool_overflows_a_busy_holder_spills_sooner() {
    let p = cache_aware(CacheAwareConfig::default());
    let ws = workers(3);
    for w in &ws {
        teach(w, 150_000.0);
    }
    // Two 4,000-char prefixes held by worker 1 only (a spill makes the
    // quickest worker a holder too, so each is spilled at most once).
    let (a, b) = ("a".repeat(4_000), "b".repeat(4_000));
    for prefix in [&a, &b] {
        p.tree_or_create("m").insert(prefix, ws[1].id().tenant());
    }
    // 18,100 chars queued on the holder: about 126 ms, against 32 ms for
    // a miss elsewhere. Within 1.5 × 32 + 10 ms plus the repeat term
    // (27 ms² / reuse_ms 10 = 71 ms), beyond 1.3 × 32 + 10 + 71 ms.
    let _queued = LoadGuard::with_prefill(ws[1].clone(), 18_100);
    let ask = |prefix: &str, q: &str| {
        let d = p
            .select(&RequestView::new("m", &format!("{prefix}{q}")), &ws)
            .unwrap();
        (d.worker().id(), d.explanation().branch)
    };
    assert_eq!(ask(&a, "1?"), (ws[1].id(), Branch::CacheHit));
    // 256 answers, 3 of which trimmed: 1.2% of recent answers showed an
    // eviction, so the overflow margin applies.
    let truth = p.trees().expect("a tree policy").model("m").truth;
    for i in 0..256 {
        truth.count_answer(i % 100 == 0);
    }
    assert!(truth.overflowing());
    let (id, branch) = ask(&b, "2?");
    assert_ne!(id, ws[1].id());
    assert_eq!(branch, Branch::HotSpotSpill);
    // Matches from live event streams are the engine's own: the margin
    // stays. (One token per character; worker 1 holds 4,000.)
    let text = format!("{}4?", "c".repeat(4_000));
    let live = [(ws[0].id(), 0), (ws[1].id(), 4_000), (ws[2].id(), 0)];
    let exact = ExactMatches {
        input_tokens: text.len(),
        live: &live,
    };
    let req = RequestView::new("m", &text).with_exact(Some(exact));
    let d = p.select(&req, &ws).unwrap();
    assert_eq!(
        (d.worker().id(), d.explanation().branch),
        (ws[1].id(), Branch::CacheHit)
    );
    // Evictions stop: the rate decays below one in a hundred and the
    // default margin is back.
    for _ in 0..256 {
        truth.count_answer(false);
    }
    assert!(!truth.overflowing());
    assert_eq!(ask(&a, "3?"), (ws[1].id(), Branch::CacheHit));
}

#[test]
fn new_prompts_avoid_a_slow_worker_and_an_unmeasured_one_is_taken_as_its_peers() {
    let p = cache_aware(CacheAwareConfig::default());
    let ws = workers(3);
    teach(&ws[0], 150_000.0);
    teach(&ws[1], 15_000.0); // ten times slower
    // Worker 2 has not answered yet: it is predicted as the mean of its
    // peers, so it is neither ignored nor preferred blindly.
    let mut seen = [0usize; 3];
    for i in 0..12 {
        let text = format!("{i} {}", "fresh prompt text ".repeat(300));
        let d = p.select(&RequestView::new("m", &text), &ws).unwrap();
        seen[d.worker().id().0 as usize] += 1;
        assert_eq!(d.explanation().branch, Branch::LowMatchSmallestTree);
    }
    assert_eq!(seen[1], 0, "the slow worker got new prompts: {seen:?}");
    assert!(seen[0] > 0, "{seen:?}");
    // The unmeasured worker's prediction sits between the two fits: slower
    // than the fast one, so it gets fewer (here: none) of the prompts.
    let prompt = "x".repeat(6_000);
    let fast = ws[0].ttft_coefficients(0, &crate::CostModelConfig::default());
    let slow = ws[1].ttft_coefficients(0, &crate::CostModelConfig::default());
    let work = crate::Work {
        uncached_chars: prompt.len(),
        ..crate::Work::default()
    };
    assert!(slow.predict_ms(work) > 5.0 * fast.predict_ms(work));
    assert!(ws[2].ttft_fit(0).is_none());
}

#[test]
fn a_live_event_stream_overrides_the_tree_and_the_others_keep_it() {
    let p = cache_aware(CacheAwareConfig::default());
    let ws = workers(3);
    let text = long_text("events");
    // The tree's guess: worker `owner` holds the text.
    let owner = pick(&p, &ws, &text);
    let select = |live: &[(WorkerId, usize)]| {
        let exact = ExactMatches {
            input_tokens: 64,
            live,
        };
        let req = RequestView::new("m", &text).with_exact(Some(exact));
        let d = p.select(&req, &ws).expect("a worker");
        (d.worker().id(), d.explanation().exact)
    };
    let other = ws.iter().map(|w| w.id()).find(|&id| id != owner).unwrap();
    // The owner's engine says it evicted everything, another holds it all.
    let mut live = vec![(owner, 0), (other, 64)];
    live.sort_unstable();
    assert_eq!(select(&live), (other, true));
    // Now the tree guesses both hold it (the last decision inserted it for
    // `other`). The owner's stream is not live, so its tree record stands;
    // the other's live stream says it holds nothing.
    assert_eq!(select(&[(other, 0)]), (owner, false));
}

#[test]
fn with_exact_matches_a_text_nobody_holds_goes_back_where_the_tree_sent_it() {
    let p = cache_aware(CacheAwareConfig::default());
    let ws = workers(3);
    let text = long_text("evicted everywhere");
    let owner = pick(&p, &ws, &text);
    let live: Vec<(WorkerId, usize)> = ws.iter().map(|w| (w.id(), 0)).collect();
    let req = RequestView::new("m", &text).with_exact(Some(ExactMatches {
        input_tokens: 64,
        live: &live,
    }));
    for _ in 0..4 {
        let d = p.select(&req, &ws).expect("a worker");
        assert_eq!(d.worker().id(), owner);
        assert_eq!(d.explanation().branch, Branch::LowMatchAffinity);
        assert_eq!(d.explanation().matched_chars, Some(0));
    }
}

#[test]
fn each_worker_is_scored_by_its_own_match_in_any_slice_order() {
    let p = cache_aware(CacheAwareConfig::default());
    let ws = workers(5);
    let texts: Vec<String> = (0..5).map(|i| long_text(&format!("doc {i}"))).collect();
    // Each text lands on a worker of the pool in id order.
    let owners: Vec<WorkerId> = texts.iter().map(|t| pick(&p, &ws, t)).collect();
    // In another order (not the registry's), every text still goes to the
    // worker that holds it, and its match is the whole text.
    let shuffled = vec![
        ws[3].clone(),
        ws[0].clone(),
        ws[4].clone(),
        ws[1].clone(),
        ws[2].clone(),
    ];
    for (t, owner) in texts.iter().zip(&owners) {
        let d = p.select(&RequestView::new("m", t), &shuffled).unwrap();
        assert_eq!(d.worker().id(), *owner);
        assert_eq!(d.explanation().branch, Branch::CacheHit);
        assert_eq!(d.explanation().matched_chars, Some(t.chars().count()));
    }
}

mod cache_bound;
