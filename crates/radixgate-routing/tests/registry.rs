//! The registry and router through the public API: snapshots, model pools,
//! health and removal as the gateway will drive them.

use radixgate_routing::policy::{CacheAware, ConsistentHash};
use radixgate_routing::{
    Branch, CacheAwareConfig, HotSpotRule, Policy, PolicyConfig, Registry, RoutingError, Worker,
    WorkerSpec,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

fn text(tag: &str) -> String {
    format!(
        "<system>{}</system><user>{tag}",
        "be brief and exact. ".repeat(10)
    )
}

fn cache_aware() -> Arc<CacheAware> {
    Arc::new(CacheAware::new(CacheAwareConfig {
        hot_spot: HotSpotRule::Off,
        ..CacheAwareConfig::default()
    }))
}

#[test]
fn add_remove_and_health_publish_new_snapshots() {
    let mut reg = Registry::new(PolicyConfig::default().build().unwrap());
    let router = reg.router();
    assert_eq!(
        router.select(None, "x", None, &[]).unwrap_err(),
        RoutingError::NoWorkers
    );
    let a = reg.add(WorkerSpec::new("http://a:1/")).unwrap();
    let g1 = router.snapshot().generation();
    assert!(matches!(
        reg.add(WorkerSpec::new("http://a:1")),
        Err(RoutingError::DuplicateWorker { .. })
    ));
    for bad in ["a:1", "http://", "ftp://x", "http://a b"] {
        assert!(
            matches!(
                reg.add(WorkerSpec::new(bad)),
                Err(RoutingError::InvalidWorker { .. })
            ),
            "{bad}"
        );
    }
    // `*` names the pool of workers that serve any model: no worker's
    // model may take it.
    for models in [vec![String::new()], vec!["m".to_owned(), "*".to_owned()]] {
        assert!(
            matches!(
                reg.add(WorkerSpec::new("http://b:1").with_models(models.clone())),
                Err(RoutingError::InvalidWorker { .. })
            ),
            "{models:?}"
        );
    }
    assert!(reg.set_health(a.id(), false).unwrap());
    assert!(
        !reg.set_health(a.id(), false).unwrap(),
        "no change, no publish"
    );
    let g2 = router.snapshot().generation();
    assert!(g2 > g1);
    let err = router.select(None, "x", None, &[]).unwrap_err();
    assert_eq!(err, RoutingError::NoHealthyWorker { model: "*".into() });
    assert!(err.retryable());
    reg.remove(a.id()).unwrap();
    assert_eq!(
        reg.remove(a.id()).unwrap_err(),
        RoutingError::UnknownWorker { id: a.id().0 }
    );
    assert!(router.snapshot().workers().is_empty());
}

#[test]
fn unhealthy_worker_is_never_chosen_and_keeps_its_tree() {
    let policy = cache_aware();
    let mut reg = Registry::new(policy.clone());
    let router = reg.router();
    let ws: Vec<_> = (0..3)
        .map(|i| reg.add(WorkerSpec::new(format!("http://w{i}:1"))).unwrap())
        .collect();
    let t = text("only mine");
    let owner = router
        .select(None, &t, None, &[])
        .unwrap()
        .decision
        .worker()
        .clone();
    reg.set_health(owner.id(), false).unwrap();
    for i in 0..30 {
        let d = router
            .select(None, &format!("{t} {i}"), None, &[])
            .unwrap()
            .decision;
        assert_ne!(d.worker().id(), owner.id());
    }
    let tree = policy.tree("*").unwrap();
    assert_eq!(
        tree.prefix_match_for(&t, owner.id().tenant()).matched_chars,
        t.chars().count(),
        "the outage did not wipe the record"
    );
    reg.set_health(owner.id(), true).unwrap();
    // A text only the recovered worker ever held goes back to it.
    let solo = format!("{t}!solo");
    tree.insert(&solo, owner.id().tenant());
    assert_eq!(
        router
            .select(None, &solo, None, &[])
            .unwrap()
            .decision
            .worker()
            .id(),
        owner.id()
    );
    assert_eq!(ws.len(), 3);
}

#[test]
fn removed_worker_is_never_chosen_and_others_keep_their_trees() {
    let policy = cache_aware();
    let mut reg = Registry::new(policy.clone());
    let router = reg.router();
    for i in 0..3 {
        reg.add(WorkerSpec::new(format!("http://w{i}:1"))).unwrap();
    }
    // Texts that differ from their first character: spread over the pool.
    let distinct = |i: usize| format!("{i:02}|{}", "lorem ipsum ".repeat(20));
    let owners: Vec<_> = (0..6)
        .map(|i| {
            router
                .select(None, &distinct(i), None, &[])
                .unwrap()
                .decision
                .worker()
                .id()
        })
        .collect();
    let gone = owners[0];
    let removed = reg.remove(gone).unwrap();
    assert_eq!(policy.cached_chars(gone), Some(0), "its record is dropped");
    let mut kept = 0;
    for (i, &was) in owners.iter().enumerate() {
        let d = router
            .select(None, &distinct(i), None, &[])
            .unwrap()
            .decision;
        assert_ne!(d.worker().id(), gone);
        if was != gone {
            assert_eq!(d.worker().id(), was, "others keep their affinity");
            assert_eq!(d.explanation().branch, Branch::CacheHit);
            kept += 1;
        }
    }
    assert_eq!(kept, 4, "misses were spread two per worker");
    assert_eq!(removed.load(), 0);
}

/// One worker of `llama` and two of `qwen`, added to `reg`.
fn llama_and_two_qwen(reg: &mut Registry) -> (Arc<Worker>, Vec<Arc<Worker>>) {
    let llama = reg
        .add(WorkerSpec::new("http://l:1").with_models(["llama"]))
        .unwrap();
    let qwen = (0..2)
        .map(|i| {
            reg.add(WorkerSpec::new(format!("http://q{i}:1")).with_models(["qwen"]))
                .unwrap()
        })
        .collect();
    (llama, qwen)
}

#[test]
fn models_are_isolated() {
    let policy = cache_aware();
    let mut reg = Registry::new(policy.clone());
    let router = reg.router();
    let (llama, qwen) = llama_and_two_qwen(&mut reg);
    let t = text("same words, different models");
    for _ in 0..20 {
        assert_eq!(
            router
                .select(Some("llama"), &t, None, &[])
                .unwrap()
                .decision
                .worker()
                .id(),
            llama.id()
        );
        let routed = router.select(Some("qwen"), &t, None, &[]).unwrap();
        // The pool's model is the metrics label.
        assert_eq!(routed.model.as_deref(), Some("qwen"));
        let d = routed.decision;
        assert!(qwen.iter().any(|w| w.id() == d.worker().id()));
    }
    assert_eq!(
        policy
            .tree("qwen")
            .unwrap()
            .prefix_match_for(&t, llama.id().tenant())
            .matched_chars,
        0
    );
    assert_eq!(
        policy.tree("llama").unwrap().stats().tenant_chars,
        t.chars().count()
    );
    let err = router.select(Some("mistral"), &t, None, &[]).unwrap_err();
    assert_eq!(
        err,
        RoutingError::UnknownModel {
            model: "mistral".into()
        }
    );
    assert!(matches!(
        router.select(None, &t, None, &[]),
        Err(RoutingError::ModelRequired { .. })
    ));
    assert_eq!(
        router.snapshot().models().collect::<Vec<_>>(),
        ["llama", "qwen"]
    );
}

#[test]
fn consistent_hash_follows_registry_changes() {
    let policy = Arc::new(ConsistentHash::new(160, 1.25));
    let mut reg = Registry::new(policy as Arc<dyn Policy>);
    let router = reg.router();
    let ws: Vec<_> = (0..4)
        .map(|i| reg.add(WorkerSpec::new(format!("http://w{i}:1"))).unwrap())
        .collect();
    let owner = router
        .select(None, "", Some("session-7"), &[])
        .unwrap()
        .decision
        .worker()
        .id();
    for _ in 0..10 {
        let d = router
            .select(None, "", Some("session-7"), &[])
            .unwrap()
            .decision;
        assert_eq!(d.worker().id(), owner);
        assert_eq!(d.explanation().branch, Branch::HashRing);
    }
    reg.remove(owner).unwrap();
    let next = router
        .select(None, "", Some("session-7"), &[])
        .unwrap()
        .decision
        .worker()
        .id();
    assert_ne!(next, owner);
    assert!(ws.iter().any(|w| w.id() == next));
}

/// A retry that excludes a session key's owner (it answered a 5xx, or
/// its connection failed) sends the key to the next worker clockwise: an
/// overflow, as for an owner that is unhealthy, and the decision (the
/// `x-radixgate-decision` header, the decisions' metric) says so rather
/// than `hash_ring`, as if the key were at home.
#[test]
fn a_retry_that_excludes_a_keys_owner_overflows() {
    let policy = Arc::new(ConsistentHash::new(160, 1.25));
    let mut reg = Registry::new(policy as Arc<dyn Policy>);
    let router = reg.router();
    for i in 0..4 {
        reg.add(WorkerSpec::new(format!("http://w{i}:1"))).unwrap();
    }
    for key in ["session-1", "session-2", "session-3"] {
        let home = router.select(None, "", Some(key), &[]).unwrap().decision;
        assert_eq!(home.explanation().branch, Branch::HashRing, "{key}");
        let owner = home.worker().id();
        drop(home);
        let retry = router.select(None, "", Some(key), &[owner]).unwrap();
        let retry = retry.decision;
        assert_ne!(retry.worker().id(), owner, "{key}");
        assert_eq!(
            retry.explanation().branch,
            Branch::HashRingOverflow,
            "{key}: a retry away from the key's owner"
        );
    }
}

#[test]
fn retries_can_exclude_the_workers_already_tried() {
    let policy = cache_aware();
    let mut reg = Registry::new(policy.clone());
    let router = reg.router();
    let ws: Vec<_> = (0..3)
        .map(|i| reg.add(WorkerSpec::new(format!("http://w{i}:1"))).unwrap())
        .collect();
    let t = text("retry me");
    let first = router
        .select(None, &t, None, &[])
        .unwrap()
        .decision
        .worker()
        .id();
    let second = router.select(None, &t, None, &[first]).unwrap();
    // The wildcard pool names no model, so it gives no metrics label.
    assert_eq!(second.model, None);
    let second = second.decision;
    assert_ne!(second.worker().id(), first);
    let tried = [first, second.worker().id()];
    let third = router.select(None, &t, None, &tried).unwrap().decision;
    assert!(!tried.contains(&third.worker().id()));
    let all: Vec<_> = ws.iter().map(|w| w.id()).collect();
    assert_eq!(
        router.select(None, &t, None, &all).unwrap_err(),
        RoutingError::NoHealthyWorker { model: "*".into() }
    );
    // The excluded holder keeps its record.
    let tree = policy.tree("*").unwrap();
    assert_eq!(
        tree.prefix_match_for(&t, first.tenant()).matched_chars,
        t.chars().count()
    );
}

#[test]
fn least_loaded_selection_ignores_the_policy_and_its_trees() {
    let policy = cache_aware();
    let mut reg = Registry::new(policy.clone());
    let router = reg.router();
    let ws: Vec<_> = (0..2)
        .map(|i| {
            reg.add(WorkerSpec::new(format!("http://w{i}:1")).with_models(["llama"]))
                .unwrap()
        })
        .collect();
    // Two requests held on one worker by the policy's prefix match...
    let t = text("held");
    let held: Vec<_> = (0..2)
        .map(|_| router.select(Some("llama"), &t, None, &[]).unwrap())
        .collect();
    let busy = held[0].decision.worker().id();
    assert_eq!(held[1].decision.worker().id(), busy);
    // ...so the least-loaded choice is the other one, and its pool's model
    // is the metrics label.
    let routed = router.select_least_loaded(Some("llama"), &[]).unwrap();
    assert_ne!(routed.decision.worker().id(), busy);
    assert_eq!(routed.model.as_deref(), Some("llama"));
    assert_eq!(routed.decision.explanation().branch, Branch::LeastLoad);
    assert_eq!(routed.decision.worker().load(), 1, "it holds load too");
    // Excluded workers are left out; unknown models are refused alike.
    let only = router
        .select_least_loaded(Some("llama"), &[ws[1].id()])
        .unwrap();
    assert_eq!(only.decision.worker().id(), ws[0].id());
    assert_eq!(
        router.select_least_loaded(Some("qwen"), &[]).unwrap_err(),
        RoutingError::UnknownModel {
            model: "qwen".into()
        }
    );
    // Nothing of it reached the tree: the other worker holds no text.
    let tree = policy.tree("llama").unwrap();
    let other = ws.iter().find(|w| w.id() != busy).unwrap();
    assert_eq!(
        tree.prefix_match_for(&t, other.id().tenant()).matched_chars,
        0
    );
}

#[test]
fn handles_cross_threads_and_tasks() {
    fn send_sync_static<T: Send + Sync + 'static>() {}
    fn send_static<T: Send + 'static>() {}
    send_sync_static::<radixgate_routing::Router>();
    send_sync_static::<Registry>();
    send_sync_static::<Arc<dyn Policy>>();
    send_sync_static::<radixgate_routing::WorkerSet>();
    send_static::<radixgate_routing::Decision>();
    send_static::<radixgate_routing::LoadGuard>();
}

/// Decisions made while workers come and go: a decision that chose a
/// worker just as it was removed (it loaded the worker set before the
/// removal was published) leaves nothing of it in the trees, where no
/// one would ever forget it again.
#[test]
fn a_decision_racing_a_removal_leaves_no_record_of_the_removed_worker() {
    let mut reg = Registry::new(PolicyConfig::default().build().unwrap());
    let router = reg.router();
    reg.add(WorkerSpec::new("http://stays:1")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let deciders: Vec<_> = (0..2)
        .map(|t| {
            let (router, stop) = (router.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // No shared prefix: each is a miss, which goes to the
                    // worker with the smallest tree, the one just added.
                    let _ = router.select(None, &format!("{t} request {i}"), None, &[]);
                    i += 1;
                }
            })
        })
        .collect();
    let mut removed = Vec::new();
    for n in 0..3000 {
        let w = reg.add(WorkerSpec::new(format!("http://w{n}:1"))).unwrap();
        std::thread::yield_now();
        reg.remove(w.id()).unwrap();
        removed.push(w.id());
    }
    stop.store(true, Ordering::Relaxed);
    for decider in deciders {
        decider.join().unwrap();
    }
    let policy = reg.policy();
    let trees = policy.trees().unwrap();
    let left: Vec<_> = removed
        .iter()
        .filter(|id| trees.tenant_chars(id.tenant()) > 0)
        .collect();
    assert!(
        left.is_empty(),
        "removed workers still in the tree: {left:?}"
    );
}

/// A model whose last worker leaves takes its tree with it: the tree's
/// memory (its node arena stays allocated however many tenants leave
/// it) and its per-model figures (the eviction rates the metrics
/// export) go, while the models still served keep theirs. Before, every
/// model ever served kept its tree for the life of the process.
#[test]
fn a_model_whose_last_worker_leaves_takes_its_tree_with_it() {
    let policy = cache_aware();
    let mut reg = Registry::new(policy.clone());
    let router = reg.router();
    let (llama, qwen) = llama_and_two_qwen(&mut reg);
    let any = reg.add(WorkerSpec::new("http://any:1")).unwrap();
    let t = text("a prompt");
    for model in ["llama", "qwen", "mistral"] {
        drop(router.select(Some(model), &t, None, &[]).unwrap());
    }
    let models = |policy: &CacheAware| -> Vec<String> {
        let trees = policy.trees().unwrap();
        trees.eviction_rates().into_iter().map(|(m, _)| m).collect()
    };
    assert_eq!(models(&policy), ["*", "llama", "qwen"]);
    // One of qwen's workers left: its pool, and its tree, stay.
    reg.remove(qwen[0].id()).unwrap();
    assert!(policy.tree("qwen").is_some());
    reg.remove(qwen[1].id()).unwrap();
    assert!(policy.tree("qwen").is_none(), "qwen's tree outlived it");
    reg.remove(any.id()).unwrap();
    assert!(
        policy.tree("*").is_none(),
        "the wildcard pool's tree outlived it"
    );
    assert_eq!(models(&policy), ["llama"]);
    assert_eq!(
        policy
            .tree("llama")
            .unwrap()
            .tenant_size(llama.id().tenant()),
        t.chars().count()
    );
    // A model that comes back starts a tree of its own.
    reg.add(WorkerSpec::new("http://q2:1").with_models(["qwen"]))
        .unwrap();
    drop(router.select(Some("qwen"), &t, None, &[]).unwrap());
    assert_eq!(models(&policy), ["llama", "qwen"]);
}

/// A worker relisted in place (a LoRA adapter loaded, another unloaded)
/// keeps its id, load and its records for the models it still serves;
/// its records for the model it left go, with the model's tree where no
/// other worker serves it, and requests for it no longer reach it.
#[test]
fn a_worker_relisted_in_place_keeps_its_records_for_the_models_it_kept() {
    let policy = cache_aware();
    let mut reg = Registry::new(policy.clone());
    let router = reg.router();
    let spec = |url: &str| WorkerSpec::new(url).with_models(["base", "lora-a"]);
    let w = reg.add(spec("http://a:1")).unwrap();
    let other = reg.add(spec("http://b:1")).unwrap();
    let t = text("an adapter's prompt");
    // `w` alone holds the prompt, for both models.
    for model in ["base", "lora-a"] {
        let d = router.select(Some(model), &t, None, &[other.id()]);
        assert_eq!(d.unwrap().decision.worker().id(), w.id());
    }
    let held = router
        .select(Some("base"), &t, None, &[other.id()])
        .unwrap();
    let generation = router.snapshot().generation();

    let relisted = reg
        .relist(
            w.id(),
            vec!["base".into(), "lora-b".into()],
            Default::default(),
            None,
            &[],
        )
        .unwrap();
    assert!(Arc::ptr_eq(&relisted, &w), "the same worker, not a new one");
    assert!(router.snapshot().generation() > generation);
    assert_eq!(&*w.models(), ["base", "lora-b"]);
    assert_eq!(w.load(), 1, "its request in flight still counts");
    drop(held);
    let size = |model: &str| policy.tree(model).unwrap().tenant_size(w.id().tenant());
    assert_eq!(
        size("base"),
        t.chars().count(),
        "the base model's record kept"
    );
    assert_eq!(size("lora-a"), 0, "the adapter it left is forgotten");
    let pool = |model: &str| -> Vec<u32> {
        let set = router.snapshot();
        let pool = set.resolve(Some(model)).unwrap();
        pool.workers.iter().map(|w| w.id().0).collect()
    };
    assert_eq!(pool("lora-a"), [other.id().0]);
    assert_eq!(pool("lora-b"), [w.id().0]);
    let d = router.select(Some("base"), &t, None, &[]).unwrap().decision;
    assert_eq!(d.worker().id(), w.id(), "{}", d.rendered());
    assert_eq!(d.explanation().branch, Branch::CacheHit);
    drop(d);

    // The other worker leaves too: lora-a's tree goes with the last.
    reg.relist(
        other.id(),
        vec!["base".into()],
        Default::default(),
        None,
        &[],
    )
    .unwrap();
    assert!(policy.tree("lora-a").is_none(), "lora-a's tree outlived it");
    assert!(matches!(
        reg.relist(w.id(), vec!["*".into()], Default::default(), None, &[]),
        Err(RoutingError::InvalidWorker { .. })
    ));
    assert_eq!(
        &*w.models(),
        ["base", "lora-b"],
        "a refused list changes nothing"
    );
}

/// The work of a request with 100 characters to prefill on an idle worker.
fn uncached_100() -> radixgate_routing::Work {
    radixgate_routing::Work {
        queued_chars: 0,
        uncached_chars: 100,
        in_flight: 0,
    }
}

/// A request's first token teaches the cost-model fit of the model it
/// was routed for, even when the worker's list changed while it ran (an
/// adapter listed before its own unloaded, moving its place in the list).
/// Before, the guard kept the model's place as the decision read it and
/// taught whichever fit sat there at the first token: here the base
/// model's, with the adapter's own fit left unfitted.
#[test]
fn a_first_token_after_a_relist_teaches_the_fit_of_its_own_model() {
    use radixgate_routing::{CostModelConfig, LoadGuard};
    use std::time::Duration;
    let mut reg = Registry::new(cache_aware());
    let spec = WorkerSpec::new("http://a:1").with_models(["base", "lora-a", "lora-b"]);
    let w = reg.add(spec).unwrap();
    let work = uncached_100();
    let cost = CostModelConfig::default();
    let mut guard = LoadGuard::with_prediction(w.clone(), w.cost_slot("lora-b"), work, cost);
    reg.relist(
        w.id(),
        vec!["base".into(), "lora-b".into()],
        Default::default(),
        None,
        &[],
    )
    .unwrap();
    guard.first_token(Duration::from_millis(40));
    drop(guard);
    let seen = |model: &str| w.ttft_observations(w.cost_slot(model));
    assert_eq!(seen("lora-b"), 1, "the adapter's fit learned nothing");
    assert_eq!(
        seen("base"),
        0,
        "the base model's fit learned the adapter's wait"
    );
}

/// An adapter loaded again from another path is relisted in one step: its
/// records and its fit start afresh (its cache is not the old one) while
/// the worker stays in the adapter's pool throughout, its other models'
/// records kept. It was relisted in two (without the adapter, then with
/// it), so a worker alone serving the adapter left its pool between them.
#[test]
fn an_adapter_loaded_again_starts_afresh_in_one_relist() {
    use radixgate_routing::CostModelConfig;
    use std::time::Duration;
    let policy = cache_aware();
    let mut reg = Registry::new(policy.clone());
    let router = reg.router();
    let w = reg
        .add(WorkerSpec::new("http://a:1").with_models(["base", "lora-a"]))
        .unwrap();
    let t = text("an adapter's prompt");
    for model in ["base", "lora-a"] {
        drop(router.select(Some(model), &t, None, &[]).unwrap());
    }
    let work = uncached_100();
    let cost = CostModelConfig::default();
    for model in ["base", "lora-a"] {
        w.observe_ttft(w.cost_slot(model), work, Duration::from_millis(40), &cost);
    }
    let generation = router.snapshot().generation();
    reg.relist(
        w.id(),
        vec!["base".into(), "lora-a".into()],
        Default::default(),
        None,
        &["lora-a".to_owned()],
    )
    .unwrap();
    assert_eq!(
        router.snapshot().generation(),
        generation + 1,
        "one snapshot published"
    );
    let size = |model: &str| policy.tree(model).unwrap().tenant_size(w.id().tenant());
    assert_eq!(
        size("base"),
        t.chars().count(),
        "the base model's record kept"
    );
    assert_eq!(size("lora-a"), 0, "the reloaded adapter's record forgotten");
    let seen = |model: &str| w.ttft_observations(w.cost_slot(model));
    assert_eq!((seen("base"), seen("lora-a")), (1, 0));
}
