//! Multi-threaded stress: writers insert, evict and remove while readers
//! match, under a small global bound; after the threads join, every internal
//! invariant must hold and the bound must be respected.

use std::sync::Arc;
use std::thread;

use radixgate_tree::{TenantId, Tree, TreeConfig};

/// A small deterministic generator (no shared RNG between threads).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn prompt(rng: &mut XorShift) -> String {
    const PIECES: &[&str] = &["sys-A ", "sys-B ", "régime ", "日本 ", "🙂", "q", "x"];
    let n = 1 + rng.next() % 8;
    (0..n)
        .map(|_| PIECES[(rng.next() % PIECES.len() as u64) as usize])
        .collect()
}

#[test]
fn concurrent_inserts_matches_and_evictions_keep_invariants() {
    const MAX: usize = 2_000;
    let tree = Arc::new(Tree::new(TreeConfig {
        max_total_chars: MAX,
        ..TreeConfig::default()
    }));
    let mut handles = Vec::new();
    for w in 0..6u64 {
        let tree = Arc::clone(&tree);
        handles.push(thread::spawn(move || {
            let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (w + 1));
            for i in 0..3_000u64 {
                let text = prompt(&mut rng);
                let tenant = TenantId((rng.next() % 32) as u32);
                match (w % 3, i % 50) {
                    (0, 0) => {
                        tree.evict(40);
                    }
                    (1, 0) => tree.remove_tenant(tenant),
                    (2, _) => {
                        let m = tree.prefix_match(&text);
                        assert!(m.matched_chars <= m.input_chars);
                        assert_eq!(m.tenants.is_empty(), m.matched_chars == 0);
                        // Other threads insert between the two calls, so the
                        // tenant's match may exceed the earlier global one;
                        // each answer must still be consistent in itself.
                        let one = tree.prefix_match_for(&text, tenant);
                        assert!(one.matched_chars <= one.input_chars);
                        assert_eq!(one.input_chars, m.input_chars);
                    }
                    _ => {
                        tree.insert(&text, tenant);
                    }
                }
            }
        }));
    }
    for h in handles {
        h.join().expect("worker thread panicked");
    }
    tree.check_invariants()
        .expect("invariants hold after the threads join");
    let stats = tree.stats();
    assert!(stats.tenant_chars <= MAX, "{stats:?}");
    assert!(stats.chars <= stats.tenant_chars);
    let sum: usize = tree.tenants().iter().map(|&t| tree.tenant_size(t)).sum();
    assert_eq!(sum, stats.tenant_chars);
}
