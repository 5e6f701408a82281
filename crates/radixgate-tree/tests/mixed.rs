//! Every way the router changes a tree, mixed at random: plain and
//! matched inserts within per-tenant bounds, undo, trim, eviction and
//! tenant removal, over one- to four-byte characters (two of them sharing
//! their first byte), under a global bound with and without a per-node
//! weight. After every step the tree's own invariants hold (they recount
//! its sizes), each bound given is kept, and at the end removing every
//! tenant leaves nothing. `model.rs` checks matches against a reference;
//! this checks the operations it leaves out.

use proptest::prelude::*;
use radixgate_tree::{Insertion, TenantId, Tree, TreeConfig, low_watermark};

const ALPHABET: &[char] = &['a', 'b', 'é', 'è', '日', '🙂'];

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(ALPHABET), 0..12)
        .prop_map(|cs| cs.into_iter().collect())
}

#[derive(Clone, Debug)]
enum Op {
    Insert(String, u32, Option<usize>),
    Matched(String, u32, Option<usize>, Option<(String, u32)>),
    Undo(usize),
    Trim(usize, usize),
    Evict(usize),
    Remove(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (text(), 0..3u32, prop::option::of(0..30usize)).prop_map(|(s, t, b)| Op::Insert(s, t, b)),
        3 => (text(), 0..3u32, prop::option::of(0..30usize), prop::option::of((text(), 0..3u32))).prop_map(|(s, t, b, x)| Op::Matched(s, t, b, x)),
        3 => (0..10usize).prop_map(Op::Undo),
        2 => (0..10usize, 0..8usize).prop_map(|(i, k)| Op::Trim(i, k)),
        1 => (0..20usize).prop_map(Op::Evict),
        1 => (0..3u32).prop_map(Op::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]
    #[test]
    fn every_operation_mixed_keeps_the_bounds_and_the_counts(max in prop_oneof![Just(usize::MAX), 0..400usize], node_chars in prop_oneof![Just(0usize), Just(4), Just(64)], ops in prop::collection::vec(op(), 1..60)) {
        let tree = Tree::new(TreeConfig { max_total_chars: max, node_chars });
        let mut receipts: Vec<(String, Insertion)> = Vec::new();
        for op in &ops {
            match op {
                Op::Insert(s, t, b) => {
                    let r = tree.insert_within(s, TenantId(*t), *b);
                    if let Some(b) = b { prop_assert!(tree.tenant_size(TenantId(*t)) <= *b); let _ = low_watermark(*b); }
                    receipts.push((s.clone(), r));
                    let st = tree.stats();
                    if max != usize::MAX { prop_assert!(st.tenant_chars + node_chars * st.nodes <= max, "{st:?}"); }
                }
                Op::Matched(s, t, b, x) => {
                    let m = tree.tenant_matches(s, 1);
                    if let Some((x, u)) = x { tree.insert(x, TenantId(*u)); }
                    let r = tree.insert_matched_within(s, TenantId(*t), &m, *b);
                    if let Some(b) = b { prop_assert!(tree.tenant_size(TenantId(*t)) <= *b); }
                    receipts.push((s.clone(), r));
                }
                Op::Undo(i) => if let Some((s, r)) = receipts.get(*i) { tree.undo_insert(s, *r); },
                Op::Trim(i, k) => if let Some((s, r)) = receipts.get(*i) { tree.trim(s, r.tenant(), *k, r.time()); },
                Op::Evict(m) => { tree.evict(*m); for t in tree.tenants() { prop_assert!(tree.tenant_size(t) <= *m); } }
                Op::Remove(t) => { tree.remove_tenant(TenantId(*t)); prop_assert_eq!(tree.tenant_size(TenantId(*t)), 0); }
            }
            if let Err(e) = tree.check_invariants() { return Err(TestCaseError::fail(format!("{e} after {op:?}"))); }
        }
        for t in tree.tenants() { tree.remove_tenant(t); }
        let st = tree.stats();
        prop_assert_eq!((st.nodes, st.chars, st.tenant_chars), (0, 0, 0));
    }
}
