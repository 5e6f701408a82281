//! What one router replica learns from another through the public API: a
//! peer's routing decision applied as a remote insert (worker found by URL,
//! whatever its id here), and a peer's load counted by the policies.

use radixgate_routing::{CacheAwareConfig, HotSpotRule, PolicyConfig, Registry, WorkerSpec};

fn text(tag: &str) -> String {
    format!(
        "<system>{}</system><user>{tag}",
        "answer in one short sentence. ".repeat(10)
    )
}

fn seed_rule() -> PolicyConfig {
    PolicyConfig::CacheAware(CacheAwareConfig {
        hot_spot: HotSpotRule::Off,
        ..CacheAwareConfig::default()
    })
}

/// A registry over `urls`, added in that order (so ids follow the order).
fn replica(policy: PolicyConfig, urls: &[&str]) -> Registry {
    let mut reg = Registry::new(policy.build().unwrap());
    for u in urls {
        reg.add(WorkerSpec::new(*u).with_models(["m"])).unwrap();
    }
    reg
}

#[test]
fn a_peers_insert_lands_on_the_worker_with_that_url_here() {
    // The two replicas number the workers differently.
    let a = replica(seed_rule(), &["http://w0:1", "http://w1:1", "http://w2:1"]);
    let b = replica(seed_rule(), &["http://w2:1", "http://w1:1", "http://w0:1"]);
    let (ra, rb) = (a.router(), b.router());
    let t = text("alpha");
    let routed = ra.select(Some("m"), &t, None, &[]).unwrap();
    let url = routed.decision.worker().url().to_owned();
    let model = routed.model.clone();
    drop(routed);
    // Before the sync, b knows nothing: the match is empty.
    let before = rb.select(Some("m"), &t, None, &[]).unwrap();
    assert_eq!(before.decision.explanation().matched_chars, Some(0));
    drop(before);
    let c = replica(seed_rule(), &["http://w2:1", "http://w1:1", "http://w0:1"]);
    let rc = c.router();
    assert!(rc.apply_remote_insert(model.as_deref(), &format!("{url}/"), &t));
    for _ in 0..5 {
        let d = rc.select(Some("m"), &t, None, &[]).unwrap().decision;
        assert_eq!(d.worker().url(), url, "the peer's worker, found by URL");
        assert_eq!(d.explanation().matched_chars, Some(t.chars().count()));
    }
}

#[test]
fn remote_inserts_that_cannot_apply_are_refused() {
    let r = replica(seed_rule(), &["http://w0:1"]).router();
    assert!(!r.apply_remote_insert(Some("m"), "http://gone:1", "x"));
    assert!(!r.apply_remote_insert(Some("other"), "http://w0:1", "x"));
    let rr = replica(
        serde_json::from_str(r#"{"policy":"round_robin"}"#).unwrap(),
        &["http://w0:1"],
    )
    .router();
    assert!(
        !rr.apply_remote_insert(Some("m"), "http://w0:1", "x"),
        "no tree"
    );
}

#[test]
fn peer_load_moves_balancing_decisions() {
    let reg = replica(
        serde_json::from_str(r#"{"policy":"least_load"}"#).unwrap(),
        &["http://w0:1", "http://w1:1"],
    );
    let r = reg.router();
    let ws = r.snapshot().workers().to_vec();
    ws[0].set_peer_load(5, 0);
    for _ in 0..4 {
        let d = r.select(Some("m"), "x", None, &[]).unwrap().decision;
        assert_eq!(d.worker().url(), "http://w1:1", "w0 is busy elsewhere");
    }
    ws[0].set_peer_load(0, 0);
    ws[1].set_peer_load(5, 0);
    let d = r.select(Some("m"), "x", None, &[]).unwrap().decision;
    assert_eq!(d.worker().url(), "http://w0:1");
}
