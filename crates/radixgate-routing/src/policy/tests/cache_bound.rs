//! Tests of the cache_aware policy with each worker's tree bounded by the
//! KV cache it reports.

use super::*;

/// Worker `i` (as `workers` makes them) whose KV cache holds `tokens`.
fn with_cache(i: u32, tokens: Option<u64>) -> Arc<Worker> {
    Arc::new(Worker::new(
        WorkerId(i),
        WorkerSpec::new(format!("http://w{i}:8000")).with_kv_capacity_tokens(tokens),
    ))
}

/// Teaches `p` that model "m" has 2 characters a token.
fn two_chars_a_token(p: &CacheAware) {
    let model = p.trees().expect("a tree policy").model("m");
    model.truth.rate().observe(2_000, 1_000);
}

#[test]
fn inserts_that_evict_to_stay_within_a_cache_make_the_pool_overflow() {
    // Worker 0 holds 1,000 tokens (2,000 characters), worker 1 a million.
    let ws = [with_cache(0, Some(1_000)), with_cache(1, Some(1_000_000))];
    for (w, overflows) in [(&ws[0], true), (&ws[1], false)] {
        let p = cache_aware(CacheAwareConfig::default());
        two_chars_a_token(&p);
        // 300 new 600-character prompts: a cache of 2,000 characters
        // keeps about three of them, one of a million all.
        for i in 0..300 {
            let text = format!("{i:04}{}", "x".repeat(596));
            let d = p.select(&RequestView::new("m", &text), std::slice::from_ref(w));
            assert_eq!(d.expect("a worker").worker().id(), w.id());
        }
        let truth = p.trees().expect("a tree policy").model("m").truth;
        assert_eq!(truth.eviction_rate(), 0.0, "no answer trimmed");
        assert_eq!(
            truth.overflowing(),
            overflows,
            "{}",
            truth.bound_eviction_rate()
        );
    }
}

#[test]
fn a_worker_keeps_its_share_of_the_tree_within_the_cache_it_reports() {
    // Worker 0 holds 1,000 tokens; worker 1 says nothing of its cache.
    let ws = [with_cache(0, Some(1_000)), with_cache(1, None)];
    let texts: Vec<String> = (0..5).map(|i| format!("{i}{}", "x".repeat(599))).collect();
    let size_after = |p: &CacheAware, w: &Arc<Worker>| {
        for text in &texts {
            let d = p.select(&RequestView::new("m", text), std::slice::from_ref(w));
            assert_eq!(d.expect("a worker").worker().id(), w.id());
        }
        p.tree_or_create("m").tenant_size(w.id().tenant())
    };
    for bounded in [true, false] {
        let mut cfg = CacheAwareConfig::default();
        cfg.correction.capacity_bound = bounded;
        let p = cache_aware(cfg);
        // Before the model's characters per token are learned, no bound.
        assert_eq!(size_after(&p, &ws[0]), 3_000);
        // 2 characters a token: worker 0's cache holds 2,000 characters,
        // and from its next insert on the tree keeps it at most that (down
        // to the watermark 2,000 - 2,000 / 16 = 1,875 when over), oldest
        // texts first.
        two_chars_a_token(&p);
        let held = size_after(&p, &ws[0]);
        let tree = p.tree_or_create("m");
        if bounded {
            assert_eq!(held, 1_875);
            assert_eq!(
                tree.prefix_match_for(&texts[4], ws[0].id().tenant())
                    .matched_chars,
                600
            );
            assert_eq!(
                tree.prefix_match_for(&texts[0], ws[0].id().tenant())
                    .matched_chars,
                0
            );
        } else {
            assert_eq!(held, 3_000);
        }
        // A worker whose cache is unknown is bounded by max_tree_size only.
        assert_eq!(size_after(&p, &ws[1]), 3_000);
    }
}

#[test]
fn among_workers_whose_caches_are_full_the_least_loaded_takes_a_new_prompt() {
    let ws: Vec<Arc<Worker>> = (0..3).map(|i| with_cache(i, Some(1_000))).collect();
    for w in &ws {
        teach(w, 150_000.0);
    }
    let p = cache_aware(CacheAwareConfig::default());
    // 2 characters a token: each cache holds 2,000 characters, full from
    // the watermark 1,875 on.
    two_chars_a_token(&p);
    let tree = p.tree_or_create("m");
    for (w, chars) in ws.iter().zip([1_990, 1_880, 1_950]) {
        tree.insert(
            &format!("{}{}", w.id().0, "y".repeat(chars - 1)),
            w.id().tenant(),
        );
    }
    let new_prompt = |tag: &str| {
        let text = format!("{tag} {}", "fresh prompt text ".repeat(20));
        let d = p.select(&RequestView::new("m", &text), &ws).unwrap();
        assert_eq!(d.explanation().branch, Branch::LowMatchSmallestTree);
        d.worker().id()
    };
    // All three are full: worker 1's smaller tree is no more room, and the
    // least loaded takes the prompt (worker 1 has one in flight).
    let _busy = hold(&ws[1], 1);
    let _busier = hold(&ws[2], 2);
    assert_eq!(new_prompt("a"), ws[0].id());
    // A worker below the watermark has room: its smaller tree wins.
    tree.remove_tenant(ws[2].id().tenant());
    assert_eq!(new_prompt("b"), ws[2].id());
}

#[test]
fn with_exact_matches_a_text_being_computed_stays_there_once_copies_evict() {
    // Three workers of 10,000 tokens, 2 characters a token: 20,000
    // characters of cache each, full from 18,750 (the low watermark).
    let ws: Vec<Arc<Worker>> = (0..3).map(|i| with_cache(i, Some(10_000))).collect();
    let text = format!("computing: {}", "a long shared document. ".repeat(400));
    let chars = text.chars().count();
    // Every engine's events say it holds none of the text.
    let live: Vec<(WorkerId, usize)> = ws.iter().map(|w| (w.id(), 0)).collect();
    let exact = ExactMatches {
        input_tokens: chars / 2,
        live: &live,
    };
    let req = RequestView::new("m", &text).with_exact(Some(exact));
    for full in [false, true] {
        let p = cache_aware(CacheAwareConfig::default());
        two_chars_a_token(&p);
        let tree = p.tree_or_create("m");
        if full {
            for (i, w) in ws.iter().enumerate() {
                tree.insert(&format!("{i} {}", "f".repeat(18_800)), w.id().tenant());
            }
        }
        // The first request starts computing the text on one worker and
        // is still in flight there, behind 6 more requests.
        let first = p.select(&req, &ws).expect("a worker");
        let at = first.worker().clone();
        let _busy = hold(&at, 6);
        let d = p.select(&req, &ws).expect("a worker");
        let e = d.explanation();
        if full {
            // A second copy would evict another worker's cache: the text
            // counts as held where it is being computed.
            assert_eq!(d.worker().id(), at.id());
            assert_eq!(e.branch, Branch::CacheHit);
            assert_eq!(e.matched_chars, Some(chars));
            assert!(!e.exact, "the match is the tree's, not the events'");
        } else {
            // Room everywhere: a second copy on an idle worker is quicker.
            assert_ne!(d.worker().id(), at.id(), "{:?}", e.branch);
            assert_eq!(e.matched_chars, Some(0));
        }
        drop(d);
        // Once the first request is answered its text is in the engine's
        // events if it is held at all: they say it is not.
        drop(first);
        let d = p.select(&req, &ws).expect("a worker");
        assert_eq!(d.explanation().matched_chars, Some(0), "full: {full}");
    }
}
