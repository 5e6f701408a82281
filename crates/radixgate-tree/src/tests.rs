//! Unit tests: edge splits, UTF-8 handling, eviction order, the global bound
//! and scale edge cases. Randomised agreement with a reference model lives in
//! `tests/model.rs`, the multi-threaded stress test in `tests/stress.rs`.

use crate::{TenantHit, TenantId, TenantMatch, Tree, TreeConfig};

const A: TenantId = TenantId(1);
const B: TenantId = TenantId(2);

fn checked(tree: &Tree) {
    tree.check_invariants().expect("invariants hold");
}

/// A tree whose global bound counts characters alone.
fn bounded(max: usize) -> Tree {
    Tree::new(TreeConfig {
        max_total_chars: max,
        node_chars: 0,
    })
}

#[test]
fn empty_tree_and_empty_text() {
    let tree = Tree::default();
    let m = tree.prefix_match("");
    assert_eq!((m.matched_chars, m.input_chars, m.tenants.len()), (0, 0, 0));
    tree.insert("", A);
    assert_eq!(tree.tenant_size(A), 0);
    assert!(tree.tenants().is_empty());
    assert_eq!(tree.prefix_match("abc").matched_chars, 0);
    assert_eq!(tree.stats().nodes, 0);
    checked(&tree);
}

#[test]
fn diverging_insert_splits_the_edge() {
    let tree = Tree::default();
    tree.insert("hello world", A);
    tree.insert("hello there", B);
    // "hello " + "world" + "there".
    let s = tree.stats();
    assert_eq!((s.nodes, s.chars, s.tenant_chars), (3, 16, 22));
    let m = tree.prefix_match("hello wide");
    assert_eq!(m.matched_chars, 7);
    assert_eq!(
        m.tenants.iter().map(|h| h.tenant).collect::<Vec<_>>(),
        vec![A]
    );
    let m = tree.prefix_match("help");
    assert_eq!(m.matched_chars, 3);
    assert_eq!(m.tenants.len(), 2);
    checked(&tree);
}

#[test]
fn text_ending_inside_an_edge_splits_it() {
    let tree = Tree::default();
    tree.insert("abcdef", A);
    tree.insert("abc", B);
    assert_eq!(tree.stats().nodes, 2);
    assert_eq!(tree.tenant_size(B), 3);
    assert_eq!(tree.prefix_match_for("abcdef", B).matched_chars, 3);
    assert_eq!(tree.prefix_match_for("abcdef", A).matched_chars, 6);
    let m = tree.prefix_match("abcd");
    assert_eq!(
        m.tenants,
        vec![TenantHit {
            tenant: A,
            last_access: 1
        }]
    );
    checked(&tree);
}

#[test]
fn multibyte_chars_sharing_a_first_byte_are_never_split() {
    let tree = Tree::default();
    // 'é' is C3 A9 and 'è' is C3 A8: the byte-level common prefix ends
    // inside the character.
    tree.insert("xé日", A);
    tree.insert("xè🙂", B);
    let m = tree.prefix_match("xèz");
    assert_eq!((m.matched_chars, m.input_chars), (2, 3));
    assert_eq!(m.tenants.len(), 1);
    assert_eq!(tree.prefix_match("xê").matched_chars, 1);
    assert_eq!(tree.stats().chars, 5);
    assert_eq!(tree.tenant_size(A), 3);
    checked(&tree);
}

#[test]
fn last_access_is_the_newest_insert_through_the_node() {
    let tree = Tree::default();
    tree.insert("system: be brief. q1", A); // time 1
    tree.insert("system: be brief. q2", B); // time 2
    tree.insert("system: be brief. q3", A); // time 3
    let m = tree.prefix_match("system: be brief. other");
    assert_eq!(
        m.tenants,
        vec![
            TenantHit {
                tenant: A,
                last_access: 3
            },
            TenantHit {
                tenant: B,
                last_access: 2
            },
        ]
    );
    assert_eq!(
        tree.prefix_match_for("system: be brief. q2", A),
        TenantMatch {
            matched_chars: 19,
            input_chars: 20
        }
    );
}

#[test]
fn eviction_takes_least_recently_used_leaves_first() {
    let tree = Tree::default();
    tree.insert("common-old", A); // 1
    tree.insert("common-new", A); // 2
    tree.insert("zzz", A); // 3
    assert_eq!(tree.tenant_size(A), 7 + 3 + 3 + 3);
    // Drop 3 chars: exactly the oldest leaf "old".
    assert_eq!(tree.evict(13).evicted_chars, 3);
    assert_eq!(tree.prefix_match_for("common-old", A).matched_chars, 7);
    assert_eq!(tree.prefix_match_for("common-new", A).matched_chars, 10);
    // Next oldest is "new", then its parent "common-" (same insert), which
    // is older than "zzz".
    assert_eq!(tree.evict(3).evicted_chars, 10);
    assert_eq!(tree.prefix_match_for("common-new", A).matched_chars, 0);
    assert_eq!(tree.prefix_match_for("zzz", A).matched_chars, 3);
    checked(&tree);
}

#[test]
fn a_bounded_insert_forgets_the_tenants_least_recently_used_leaves() {
    let tree = Tree::default();
    assert_eq!(
        tree.insert_within("aaaa-old", A, Some(32)).bound_evicted(),
        0
    ); // 1
    tree.insert_within("bbbb-new", A, Some(32)); // 2
    tree.insert_within("shared", B, Some(32));
    assert_eq!(tree.tenant_size(A), 16);
    // 27 chars: over the bound of 20, so A goes down to 20 - 20 / 16 = 19,
    // the oldest leaf first: exactly "aaaa-old", which the receipt counts.
    let receipt = tree.insert_within("cccc-newest", A, Some(20));
    assert_eq!(receipt.bound_evicted(), 8);
    assert_eq!(tree.tenant_size(A), 19);
    assert_eq!(tree.prefix_match_for("aaaa-old", A).matched_chars, 0);
    assert_eq!(tree.prefix_match_for("bbbb-new", A).matched_chars, 8);
    assert_eq!(tree.prefix_match_for("cccc-newest", A).matched_chars, 11);
    // Within the bound nothing goes; other tenants are untouched.
    assert_eq!(
        tree.insert_within("cccc-newest", A, Some(20))
            .bound_evicted(),
        0
    );
    assert_eq!(tree.tenant_size(A), 19);
    assert_eq!(tree.tenant_size(B), 6);
    checked(&tree);
}

#[test]
fn eviction_stops_inside_an_edge_at_the_exact_budget() {
    let tree = Tree::default();
    tree.insert("abcdefghij", A);
    tree.insert("abcdefghij", B);
    assert_eq!(tree.evict(4).evicted_chars, 12);
    assert_eq!(tree.tenant_size(A), 4);
    assert_eq!(tree.prefix_match_for("abcdefghij", A).matched_chars, 4);
    // Shared nodes stay until the last holder lets go.
    assert_eq!(tree.stats().chars, 4);
    checked(&tree);
    assert_eq!(tree.evict(0).evicted_chars, 8);
    assert_eq!(tree.stats().nodes, 0);
    assert!(tree.tenants().is_empty());
    checked(&tree);
}

#[test]
fn eviction_keeps_other_tenants_intact() {
    let tree = Tree::default();
    tree.insert("shared prefix / a", A);
    tree.insert("shared prefix / b", B);
    tree.evict(0);
    assert!(tree.tenants().is_empty());
    tree.insert("shared prefix / a", A);
    tree.insert("shared prefix / b", B);
    tree.remove_tenant(A);
    assert_eq!(tree.tenant_size(A), 0);
    assert_eq!(tree.prefix_match("shared prefix / a").matched_chars, 16);
    assert_eq!(
        tree.prefix_match_for("shared prefix / b", B).matched_chars,
        17
    );
    assert_eq!(tree.stats().chars, 17);
    checked(&tree);
}

#[test]
fn global_bound_evicts_oldest_across_tenants_to_the_low_watermark() {
    let tree = bounded(160);
    for i in 0..10u32 {
        tree.insert(&format!("{i:02}-{}", "x".repeat(17)), TenantId(i % 3));
        assert!(tree.stats().tenant_chars <= 160);
        checked(&tree);
    }
    // The 9th insert reached 174 > 160: down to 150 (160 - 160/16), oldest first.
    // Only the "0" shared with younger texts is left of "00-…".
    assert_eq!(tree.prefix_match("00-x").matched_chars, 1);
    assert_eq!(tree.prefix_match("09-xxxxxxxxxxxxxxxxx").matched_chars, 20);
    let s = tree.stats();
    assert!(s.tenant_chars <= 160 && s.tenant_chars >= 150, "{s:?}");
}

/// Prompts crafted so that each insert adds a one-character leaf: the
/// bound, which counts every node as 64 characters more, holds the tree's
/// memory near what it would be for as many characters of real prompts
/// (about 2 bytes each), not at 145 bytes a counted character.
#[test]
fn global_bound_counts_nodes_so_one_character_leaves_cannot_outgrow_it() {
    let bound = 100_000;
    let tree = Tree::new(TreeConfig {
        max_total_chars: bound,
        ..TreeConfig::default()
    });
    let alphabet: Vec<char> = ('a'..='z').chain('A'..='Z').chain('0'..='9').collect();
    let mut texts = Vec::with_capacity(60_000);
    'all: for a in &alphabet {
        for b in &alphabet {
            for c in &alphabet {
                texts.push(format!("P{a}{b}{c}"));
                if texts.len() == 60_000 {
                    break 'all;
                }
            }
        }
    }
    let mut last = String::new();
    for text in texts {
        tree.insert(&text, A);
        last = text;
    }
    let s = tree.stats();
    checked(&tree);
    assert!(
        s.tenant_chars + s.nodes * crate::DEFAULT_NODE_CHARS <= bound,
        "{s:?}"
    );
    assert!(s.estimated_bytes <= 4 * bound, "{s:?}");
    // Recent texts are still held.
    assert_eq!(tree.prefix_match(&last).matched_chars, 4);
}

/// Two workers share a long text; a third one's insert takes the tree
/// just over its bound. The global eviction takes what the bound needs
/// from the oldest holder of the shared path, with one split, not the
/// whole path in splits of one node's weight each (which left the other
/// holder's path in 137 pieces).
#[test]
fn global_eviction_of_a_shared_path_stops_at_the_bound() {
    let long = "s".repeat(10_000);
    let tree = Tree::new(TreeConfig {
        max_total_chars: 2 * 10_000 + 100,
        ..TreeConfig::default()
    });
    tree.insert(&long, A);
    tree.insert(&long, B);
    tree.insert(&"c".repeat(100), TenantId(3));
    checked(&tree);
    let s = tree.stats();
    // 20,100 characters and two nodes (192) were over 20,100: down to the
    // low watermark (18,844), the shared path cut once.
    assert!(s.nodes <= 4, "{s:?}");
    assert!(
        s.tenant_chars + s.nodes * crate::DEFAULT_NODE_CHARS <= 2 * 10_000 + 100,
        "{s:?}"
    );
    assert!(tree.tenant_size(A) >= 8_000, "{}", tree.tenant_size(A));
    assert_eq!(tree.tenant_size(B), 10_000);
}

#[test]
fn global_bound_of_zero_keeps_nothing() {
    let tree = bounded(0);
    tree.insert("anything", A);
    assert_eq!(
        tree.stats(),
        crate::TreeStats {
            estimated_bytes: tree.stats().estimated_bytes,
            ..Default::default()
        }
    );
    checked(&tree);
}

#[test]
fn burst_under_global_bound_stays_bounded_and_consistent() {
    let tree = bounded(5_000);
    for i in 0..2_000u32 {
        let text = format!("system prompt {} / user {i} asks something", i % 7);
        tree.insert(&text, TenantId(i % 16));
    }
    let s = tree.stats();
    assert!(s.tenant_chars <= 5_000 && s.chars <= s.tenant_chars);
    checked(&tree);
}

#[test]
fn thousands_of_tenants_on_one_prefix() {
    let tree = Tree::default();
    for t in 0..3_000u32 {
        tree.insert("the same system prompt", TenantId(t));
    }
    let m = tree.prefix_match("the same system prompt, then a question");
    assert_eq!(m.matched_chars, 22);
    assert_eq!(m.tenants.len(), 3_000);
    assert!(m.tenants.windows(2).all(|w| w[0].tenant < w[1].tenant));
    tree.evict(10);
    assert_eq!(tree.tenant_size(TenantId(1_234)), 10);
    assert_eq!(
        tree.prefix_match("the same system prompt").matched_chars,
        10
    );
    checked(&tree);
}

#[test]
fn megabyte_texts() {
    let tree = Tree::default();
    let big: String = "日本語のテキスト".repeat(1 << 15); // 256 Ki chars, 768 KiB
    let mut other = big.clone();
    other.push('!');
    tree.insert(&big, A);
    tree.insert(&other, B);
    let m = tree.prefix_match(&other);
    assert_eq!(
        (m.matched_chars, m.input_chars),
        (big.chars().count() + 1, big.chars().count() + 1)
    );
    tree.evict(1_000);
    assert_eq!(tree.prefix_match_for(&big, A).matched_chars, 1_000);
    checked(&tree);
}

#[test]
fn many_nodes_span_several_arena_chunks() {
    let tree = Tree::default();
    for i in 0..5_000u32 {
        tree.insert(&format!("{i:x}/{}", i % 7), TenantId(i % 3));
    }
    assert!(tree.stats().nodes > 3 * 1024);
    checked(&tree);
    tree.evict(100);
    checked(&tree);
    for i in 0..5_000u32 {
        tree.insert(&format!("again {i}"), B);
    }
    checked(&tree);
    assert_eq!(tree.prefix_match("again 4999").matched_chars, 10);
}

#[test]
fn reinserting_after_removal_reuses_freed_slots() {
    let tree = Tree::default();
    for round in 0..3 {
        for i in 0..50 {
            tree.insert(&format!("p{}-{round}", i % 5), A);
        }
        checked(&tree);
        tree.remove_tenant(A);
        assert_eq!(tree.stats().nodes, 0);
    }
}

#[test]
fn readers_share_the_lock() {
    let tree = Tree::default();
    tree.insert("abc", A);
    let held = tree.inner.read();
    std::thread::scope(|s| {
        s.spawn(|| {
            // A second reader gets in while the first still holds the lock;
            // a writer does not.
            assert!(tree.inner.try_read().is_some());
            assert!(tree.inner.try_write().is_none());
        });
    });
    drop(held);
    assert_eq!(tree.prefix_match("abd").matched_chars, 2);
}

#[test]
fn node_slot_stays_small() {
    // BENCHMARKS.md's bytes-per-char figures were measured with an 80-byte
    // slot; the demand count (`demand.rs`) added 8.
    assert!(std::mem::size_of::<crate::node::Node>() <= 88);
}

#[test]
fn tree_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tree>();
}

/// `n` texts: `hot` of every 4 behind one prefix, the rest behind another,
/// each with its own numbered suffix.
fn three_hot_one_cold(tree: &Tree, n: usize) {
    for i in 0..n {
        let prefix = if i % 4 == 3 {
            "cold prefix|"
        } else {
            "hot prefix|"
        };
        tree.insert(&format!("{prefix}{i:05}"), A);
    }
}

#[test]
fn demand_share_is_the_part_of_recent_inserts_through_the_match() {
    let tree = Tree::default();
    three_hot_one_cold(&tree, 2000);
    // 'x' starts no suffix: the match ends at the end of the prefix.
    let hot = tree.tenant_matches("hot prefix|x", 1);
    let cold = tree.tenant_matches("cold prefix|x", 1);
    assert_eq!(hot.matched_chars, "hot prefix|".len());
    assert!((hot.share - 0.75).abs() < 0.03, "{}", hot.share);
    assert!((cold.share - 0.25).abs() < 0.03, "{}", cold.share);
    // Nothing matched: no demand.
    assert_eq!(tree.tenant_matches("zzz", 1).share, 0.0);
    checked(&tree);
}

#[test]
fn a_young_trees_shares_are_not_biased_low() {
    let tree = Tree::default();
    three_hot_one_cold(&tree, 40);
    let hot = tree.tenant_matches("hot prefix|x", 1).share;
    assert!((hot - 0.75).abs() < 0.05, "{hot}");
}

#[test]
fn a_share_needs_a_few_inserts_and_fades_without_them() {
    let tree = Tree::default();
    tree.insert("a document|q1", A);
    tree.insert("a document|q2", A);
    assert_eq!(tree.tenant_matches("a document|x", 1).share, 0.0);
    for q in 3..=5 {
        tree.insert(&format!("a document|q{q}"), A);
    }
    assert!(tree.tenant_matches("a document|x", 1).share > 0.5);
    for i in 0..3000 {
        tree.insert(&format!("something else {i}"), B);
    }
    assert_eq!(tree.tenant_matches("a document|x", 1).share, 0.0);
}

#[test]
fn within_reads_the_share_of_the_part_near_holders_share() {
    let tree = Tree::default();
    // Every text shares "prefix|q"; the digit after it splits them ten ways.
    for i in 0..1000 {
        tree.insert(&format!("prefix|q{}{i:04}", i % 10), A);
    }
    let text = "prefix|q7x";
    let m = tree.tenant_matches(text, 1);
    assert_eq!(m.matched_chars, "prefix|q7".len());
    // The last matched character is in one tenth of the texts...
    assert!((m.share - 0.1).abs() < 0.03, "{}", m.share);
    // ...the one three characters back is in all of them.
    let m = tree.tenant_matches(text, 3);
    assert!(m.share > 0.95, "{}", m.share);
}
