//! What other router replicas report, through the public API: their
//! decisions ([`Router::learn`]) and their load ([`PeerLoads`]) steer this
//! router's own decisions.

use radixgate_routing::policy::CacheAware;
use radixgate_routing::{
    Branch, CacheAwareConfig, CacheReport, HotSpotRule, Learned, PeerLoad, PeerLoads, PolicyConfig,
    Registry, WILDCARD_MODEL, WorkerSpec,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn text(tag: &str) -> String {
    format!(
        "<system>{}</system><user>{tag}",
        "be brief and exact. ".repeat(10)
    )
}

fn registry() -> Registry {
    Registry::new(Arc::new(CacheAware::new(CacheAwareConfig {
        hot_spot: HotSpotRule::Off,
        ..CacheAwareConfig::default()
    })))
}

#[test]
fn a_learned_prefix_routes_to_the_worker_a_peer_chose() {
    let mut reg = registry();
    for u in ["http://a:1", "http://b:1", "http://c:1"] {
        reg.add(WorkerSpec::new(u).with_models(["m"])).unwrap();
    }
    let router = reg.router();
    let prompt = text("long shared context");
    assert_eq!(router.learn("m", "http://c:1/", &prompt), Learned::Inserted);
    for _ in 0..5 {
        let d = router
            .select(Some("m"), &format!("{prompt} and more"), None, &[])
            .unwrap()
            .decision;
        assert_eq!(d.explanation().branch, Branch::CacheHit);
        assert_eq!(d.worker().url(), "http://c:1");
    }
}

#[test]
fn learning_refuses_unknown_workers_and_pools() {
    let mut reg = registry();
    reg.add(WorkerSpec::new("http://a:1").with_models(["m"]))
        .unwrap();
    let router = reg.router();
    let t = text("x");
    assert_eq!(router.learn("m", "http://z:1", &t), Learned::UnknownWorker);
    assert_eq!(
        router.learn("other", "http://a:1", &t),
        Learned::UnknownModel
    );
    assert_eq!(
        router.learn(WILDCARD_MODEL, "http://a:1", &t),
        Learned::UnknownModel,
        "a named-model worker is not in the wildcard pool"
    );
    assert!(router.policy().trees().unwrap().get("other").is_none());

    let mut rr = Registry::new(
        PolicyConfig::RoundRobin(Default::default())
            .build()
            .unwrap(),
    );
    rr.add(WorkerSpec::new("http://a:1")).unwrap();
    assert_eq!(
        rr.router().learn(WILDCARD_MODEL, "http://a:1", &t),
        Learned::NoTrees
    );
}

#[test]
fn the_decision_says_what_it_inserted() {
    let mut reg = registry();
    reg.add(WorkerSpec::new("http://a:1")).unwrap();
    let t = text("y");
    let mut d = reg.router().select(None, &t, None, &[]).unwrap().decision;
    assert_eq!(d.inserted_text(&t), Some(t.as_str()));
    d.undo_insert(&t);
    assert_eq!(d.inserted_text(&t), None, "taken back: nothing to share");
}

#[test]
fn a_peers_decisions_keep_a_workers_share_within_its_cache() {
    // Worker a holds 1,000 tokens; worker b says nothing of its cache.
    let mut reg = registry();
    reg.add(
        WorkerSpec::new("http://a:1")
            .with_models(["m"])
            .with_kv_capacity_tokens(Some(1_000)),
    )
    .unwrap();
    reg.add(WorkerSpec::new("http://b:1").with_models(["m"]))
        .unwrap();
    let router = reg.router();
    // One answer teaches the model 2 characters a token: a's cache holds
    // 2,000 characters.
    let t = "z".repeat(1_000);
    let mut d = router.select(Some("m"), &t, None, &[]).unwrap().decision;
    d.take_cache_feedback().expect("a tree decision").apply(
        &t,
        CacheReport {
            prompt_tokens: 500,
            cached_tokens: 0,
        },
    );
    let policy = router.policy();
    let trees = policy.trees().expect("cache_aware keeps trees");
    assert_eq!(trees.chars_per_token_of("m"), Some(2.0));
    let set = router.snapshot();
    let tenant = |url: &str| set.by_url(url).expect("a worker").id().tenant();
    let (a, b) = (tenant("http://a:1"), tenant("http://b:1"));
    let before = (trees.tenant_chars(a), trees.tenant_chars(b));
    // 300 new 600-character prompts a peer sent to each.
    for i in 0..300 {
        let text = format!("{i:04}{}", "x".repeat(596));
        for url in ["http://a:1", "http://b:1"] {
            assert_eq!(router.learn("m", url, &text), Learned::Inserted);
        }
    }
    let a_held = trees.tenant_chars(a);
    assert!(a_held <= 2_000, "a holds {a_held} characters of its 2,000");
    assert!(
        trees.tenant_chars(b) >= before.1 + 150_000,
        "b's cache is unknown: nothing is bounded"
    );
    let rate = trees.bound_eviction_rates();
    assert!(
        rate.iter().any(|(m, r)| m == "m" && *r > 0.1),
        "the peer's inserts that evicted count: {rate:?}"
    );
}

#[test]
fn peer_load_turns_a_balanced_pool_imbalanced() {
    let mut reg = registry();
    let a = reg.add(WorkerSpec::new("http://a:1")).unwrap();
    reg.add(WorkerSpec::new("http://b:1")).unwrap();
    let router = reg.router();
    let prompt = text("held by a");
    assert_eq!(
        router.learn(WILDCARD_MODEL, "http://a:1", &prompt),
        Learned::Inserted
    );
    let mut peers = PeerLoads::new(Duration::from_millis(300));
    let now = Instant::now();
    peers.report(
        9,
        1,
        now,
        vec![PeerLoad {
            url: "http://a:1".into(),
            in_flight: 200,
            pending_prefill: 0,
        }],
    );
    peers.apply(router.snapshot().workers());
    let d = router.select(None, &prompt, None, &[]).unwrap().decision;
    assert_eq!(d.explanation().branch, Branch::Imbalanced);
    assert_eq!(d.worker().url(), "http://b:1", "a is loaded by a peer");
    drop(d);
    peers.expire(now + Duration::from_secs(1));
    peers.apply(router.snapshot().workers());
    assert_eq!(a.routing_load(), 0);
    // The report expired: balanced again, a cache hit (a and b both hold
    // the prompt now: b was sent it while a was loaded).
    let d = router.select(None, &prompt, None, &[]).unwrap().decision;
    assert_eq!(
        d.explanation().branch,
        Branch::CacheHit,
        "the report expired"
    );
}

/// Whether `changes` holds a permit (a change not waited for yet); takes it.
fn changed(changes: &tokio::sync::Notify) -> bool {
    let notified = changes.notified();
    tokio::pin!(notified);
    notified.enable()
}

/// Replica sync's publisher waits on `load_changes` instead of polling:
/// every change of a worker's own load (a decision, its prefill done, its
/// end) must reach it, and nothing else may.
#[test]
fn own_load_changes_signal_the_router_s_waiter() {
    let mut reg = registry();
    for u in ["http://a:1", "http://b:1"] {
        reg.add(WorkerSpec::new(u).with_models(["m"])).unwrap();
    }
    let router = reg.router();
    let changes = router.load_changes();
    assert!(!changed(&changes), "nothing changed yet");
    let mut decision = router
        .select(Some("m"), &text("a question"), None, &[])
        .unwrap()
        .decision;
    assert!(changed(&changes), "a decision takes load");
    assert!(!changed(&changes), "one permit per wait");
    let mut peers = PeerLoads::new(Duration::from_millis(300));
    peers.report(
        9,
        1,
        Instant::now(),
        vec![PeerLoad {
            url: "http://b:1".into(),
            in_flight: 4,
            pending_prefill: 0,
        }],
    );
    peers.apply(router.snapshot().workers());
    assert!(!changed(&changes), "peers' load is not this replica's own");
    let prefill = decision.worker().pending_prefill();
    decision.first_token(Duration::from_millis(5));
    assert_eq!(
        changed(&changes),
        prefill > 0,
        "releasing predicted prefill ({prefill} chars) is a change"
    );
    drop(decision);
    assert!(changed(&changes), "the end releases load");
}

#[test]
fn the_next_expiry_is_the_oldest_report_s() {
    let mut peers = PeerLoads::new(Duration::from_millis(300));
    assert_eq!(peers.next_expiry(), None);
    let t0 = Instant::now();
    let load = |url: &str| {
        vec![PeerLoad {
            url: url.into(),
            in_flight: 1,
            pending_prefill: 0,
        }]
    };
    peers.report(1, 1, t0 + Duration::from_millis(50), load("http://a:1"));
    peers.report(2, 1, t0, load("http://b:1"));
    assert_eq!(peers.next_expiry(), Some(t0 + Duration::from_millis(300)));
    peers.expire(t0 + Duration::from_millis(301));
    assert_eq!(peers.next_expiry(), Some(t0 + Duration::from_millis(350)));
}

/// The worker index (0-3 of `http://w0:1`..) the first decision of a fresh
/// registry with `config`, staggered at `start` (if any), goes to, by every
/// path a request may take: the policy, and the least-loaded pick.
fn first_choices(config: &PolicyConfig, start: Option<usize>, reload: bool) -> (usize, usize) {
    let mut reg = Registry::new(config.build().unwrap());
    for i in 0..4 {
        reg.add(WorkerSpec::new(format!("http://w{i}:1"))).unwrap();
    }
    if let Some(start) = start {
        reg.stagger(start);
    }
    if reload {
        // A reload's new policy starts where the registry says.
        reg.set_policy(config.build().unwrap());
    }
    let router = reg.router();
    let index = |url: &str| {
        url["http://w".len()..]
            .trim_end_matches(":1")
            .parse()
            .unwrap()
    };
    // Each decision's load is released before the next one.
    let by_policy = index(
        router
            .select(None, &text("first"), None, &[])
            .unwrap()
            .decision
            .worker()
            .url(),
    );
    let least = index(
        router
            .select_least_loaded(None, &[])
            .unwrap()
            .decision
            .worker()
            .url(),
    );
    (by_policy, least)
}

#[test]
fn a_staggered_registry_breaks_a_cold_starts_ties_elsewhere() {
    // Every worker idle, no tree, no fit: every policy faces a tie, which
    // its rotation breaks. Replicas that start their rotations in different
    // places send their first requests to different workers.
    for config in [
        PolicyConfig::default(),
        PolicyConfig::PrefillAware(Default::default()),
        PolicyConfig::LeastLoad(Default::default()),
        PolicyConfig::RoundRobin(Default::default()),
    ] {
        assert_eq!(first_choices(&config, None, false), (0, 0), "{config:?}");
        for start in 0..8 {
            for reload in [false, true] {
                assert_eq!(
                    first_choices(&config, Some(start), reload),
                    (start % 4, start % 4),
                    "{config:?} from {start}, reload {reload}"
                );
            }
        }
    }
}
