//! Property tests: the tree against the naive reference model over random
//! operation sequences, with a small alphabet of 1- to 4-byte characters
//! (including two that share a first byte) so that prefixes collide often and
//! edges get split inside and next to multi-byte sequences.

mod reference;

use proptest::prelude::*;
use radixgate_tree::{Insertion, TenantId, TenantMatches, Tree, TreeConfig};
use reference::Model;

#[derive(Clone, Debug)]
enum Op {
    Insert(String, u32),
    /// An insert after `tenant_matches` of the same text, with (`Some`)
    /// another insert between the two.
    InsertMatched(String, u32, Option<(String, u32)>),
    Match(String),
    MatchFor(String, u32),
    MatchAll(String),
    Remove(u32),
    Evict(usize),
    Undo(usize),
    /// A random text, or (`Some(i)`, when there are any) an inserted one.
    /// ... cut before the `older` of its insert time, else plainly.
    Trim(String, Option<usize>, u32, usize, Option<u64>),
}

/// 'é' (C3 A9) and 'è' (C3 A8) share their first byte.
const ALPHABET: &[char] = &['a', 'b', 'é', 'è', '日', '🙂'];

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(ALPHABET), 0..10)
        .prop_map(|cs| cs.into_iter().collect())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (text(), 0..4u32).prop_map(|(s, t)| Op::Insert(s, t)),
        4 => (text(), 0..4u32, prop::option::of((text(), 0..4u32)))
            .prop_map(|(s, t, between)| Op::InsertMatched(s, t, between)),
        3 => text().prop_map(Op::Match),
        2 => (text(), 0..4u32).prop_map(|(s, t)| Op::MatchFor(s, t)),
        2 => text().prop_map(Op::MatchAll),
        1 => (0..4u32).prop_map(Op::Remove),
        1 => (0..25usize).prop_map(Op::Evict),
        2 => (0..8usize).prop_map(Op::Undo),
        3 => (text(), prop::option::of(0..8usize), 0..4u32, 0..10usize, prop::option::of(0..4u64))
            .prop_map(|(s, i, t, k, o)| Op::Trim(s, i, t, k, o)),
    ]
}

fn bound() -> impl Strategy<Value = usize> {
    prop_oneof![Just(usize::MAX), 0..80usize]
}

fn check_sizes(tree: &Tree, model: &Model) -> Result<(), TestCaseError> {
    for t in 0..4 {
        prop_assert_eq!(
            tree.tenant_size(TenantId(t)),
            model.tenant_size(TenantId(t))
        );
    }
    prop_assert_eq!(tree.tenants(), model.tenants());
    let stats = tree.stats();
    prop_assert_eq!(stats.tenant_chars, model.total());
    prop_assert_eq!(stats.chars, model.distinct());
    if let Err(e) = tree.check_invariants() {
        return Err(TestCaseError::fail(e.to_string()));
    }
    Ok(())
}

/// Applies to the model an insert the tree took as `receipt`, and checks
/// they agree.
fn inserted(
    tree: &Tree,
    model: &mut Model,
    receipts: &mut Vec<(String, Insertion, u64)>,
    max_total: usize,
    s: &str,
    t: u32,
    receipt: Insertion,
) -> Result<(), TestCaseError> {
    let (time, held) = model.insert(s, TenantId(t));
    prop_assert_eq!(receipt.held_chars(), held);
    receipts.push((s.to_owned(), receipt, time));
    if max_total != usize::MAX {
        prop_assert!(tree.stats().tenant_chars <= max_total);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn tree_agrees_with_reference_model(max_total in bound(), ops in prop::collection::vec(op(), 1..60)) {
        let tree = Tree::new(TreeConfig {
            max_total_chars: max_total,
            // The model bounds characters alone.
            node_chars: 0,
        });
        let mut model = Model::new(max_total);
        let mut receipts = Vec::new();
        for op in &ops {
            match op {
                Op::Insert(s, t) => {
                    let receipt = tree.insert(s, TenantId(*t));
                    inserted(&tree, &mut model, &mut receipts, max_total, s, *t, receipt)?;
                }
                Op::InsertMatched(s, t, between) => {
                    let matched = tree.tenant_matches(s, 1);
                    if let Some((b, u)) = between {
                        tree.insert(b, TenantId(*u));
                        model.insert(b, TenantId(*u));
                    }
                    let receipt = tree.insert_matched(s, TenantId(*t), &matched);
                    inserted(&tree, &mut model, &mut receipts, max_total, s, *t, receipt)?;
                }
                Op::Match(s) => prop_assert_eq!(tree.prefix_match(s), model.prefix_match(s)),
                Op::MatchFor(s, t) => prop_assert_eq!(
                    tree.prefix_match_for(s, TenantId(*t)),
                    model.prefix_match_for(s, TenantId(*t))
                ),
                Op::MatchAll(s) => {
                    // The demand share has tests of its own (src/tests.rs).
                    let got = TenantMatches {
                        share: 0.0,
                        trail: Default::default(),
                        ..tree.tenant_matches(s, 1)
                    };
                    prop_assert_eq!(got, model.tenant_matches(s));
                }
                Op::Remove(t) => {
                    tree.remove_tenant(TenantId(*t));
                    model.remove_tenant(TenantId(*t));
                }
                Op::Evict(max) => {
                    let report = tree.evict(*max);
                    prop_assert_eq!(report.evicted_chars, model.evict(*max));
                }
                Op::Undo(i) if !receipts.is_empty() => {
                    let (s, receipt, time) = receipts.remove(i % receipts.len());
                    let tenant = receipt.tenant();
                    let removed = tree.undo_insert(&s, receipt);
                    prop_assert_eq!(removed, model.undo(&s, tenant, time, receipt.held_chars()));
                }
                Op::Undo(_) => {}
                Op::Trim(s, i, t, keep, older) => {
                    // An inserted text, cut at its insert's time minus
                    // `older` (what a correction passes), or a random one.
                    let (s, older_than) = match i {
                        Some(i) if !receipts.is_empty() => {
                            let (s, receipt, _) = &receipts[i % receipts.len()];
                            let older_than = older.map_or(u64::MAX, |o| receipt.time().saturating_sub(o));
                            (s, older_than)
                        }
                        _ => (s, u64::MAX),
                    };
                    let removed = tree.trim(s, TenantId(*t), *keep, older_than);
                    prop_assert_eq!(removed, model.trim(s, TenantId(*t), *keep, older_than));
                }
            }
            check_sizes(&tree, &model)?;
        }
        // Every text the model holds is matched in full by the tree too.
        for t in model.tenants() {
            prop_assert!(tree.tenant_size(t) > 0);
        }
        // At most one tick per op, two for an insert with another between.
        prop_assert!(model.clock() as usize <= 2 * ops.len());
    }
}
