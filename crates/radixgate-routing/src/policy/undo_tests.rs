//! Taking a decision's tree insert back, and the routing-text cap.

use super::testutil::workers;
use super::{CacheAware, Policy, PrefillAware};
use crate::config::{CacheAwareConfig, PrefillAwareConfig};
use crate::{RequestView, WILDCARD_MODEL};

#[test]
fn undo_takes_back_only_what_the_rejected_request_added() {
    let ws = workers(2);
    let policy = CacheAware::new(CacheAwareConfig::default());
    let shared = format!("system: {}", "be terse. ".repeat(100));
    let first = policy
        .select(&RequestView::new(WILDCARD_MODEL, &shared), &ws)
        .unwrap();
    let id = first.worker().id();
    let held = policy.cached_chars(id).unwrap();
    let rejected_text = format!("{shared}user: {}", "x".repeat(200));
    let mut rejected = policy
        .select(&RequestView::new(WILDCARD_MODEL, &rejected_text), &ws)
        .unwrap();
    assert_eq!(rejected.worker().id(), id, "a cache hit on the holder");
    assert!(policy.cached_chars(id).unwrap() > held);
    assert_eq!(
        rejected.undo_insert(&rejected_text),
        rejected_text.len() - shared.len()
    );
    assert_eq!(
        policy.cached_chars(id).unwrap(),
        held,
        "the shared prefix stays"
    );
    assert_eq!(rejected.undo_insert(&rejected_text), 0, "taken once");
    policy
        .tree(WILDCARD_MODEL)
        .unwrap()
        .check_invariants()
        .unwrap();
}

#[test]
fn routing_text_is_capped_before_matching_and_inserting() {
    let ws = workers(2);
    let policy = CacheAware::new(CacheAwareConfig {
        max_routing_text_chars: 100,
        ..CacheAwareConfig::default()
    });
    let huge = "é".repeat(10_000);
    let mut d = policy
        .select(&RequestView::new(WILDCARD_MODEL, &huge), &ws)
        .unwrap();
    assert_eq!(d.explanation().input_chars, 100);
    assert_eq!(policy.cached_chars(d.worker().id()), Some(100));
    let again = policy
        .select(&RequestView::new(WILDCARD_MODEL, &huge), &ws)
        .unwrap();
    assert_eq!(again.explanation().input_chars, 100);
    assert_eq!(again.explanation().matched_chars, Some(100));
    drop(again);
    assert_eq!(d.undo_insert(&huge), 0, "the second insert re-stamped it");

    let prefill = PrefillAware::new(PrefillAwareConfig {
        max_routing_text_chars: 7,
        ..PrefillAwareConfig::default()
    });
    let mut d = prefill
        .select(&RequestView::new(WILDCARD_MODEL, &huge), &ws)
        .unwrap();
    assert_eq!(d.explanation().input_chars, 7);
    assert_eq!(prefill.cached_chars(d.worker().id()), Some(7));
    assert_eq!(d.undo_insert(&huge), 7);
    assert_eq!(prefill.cached_chars(d.worker().id()), Some(0));
}
