//! Tests of the engine: caching across requests, FIFO admission, the step
//! budget, timing monotonicity, and a property test of the whole machine.

use super::*;
use proptest::prelude::*;

fn cfg() -> EngineConfig {
    EngineConfig {
        block_size: 4,
        kv_capacity_tokens: 400,
        max_running_requests: 8,
        max_batch_tokens: 64,
        timing: TimingConfig::default(),
    }
}

fn req(id: ReqId, prompt: Vec<u64>, out: usize) -> EngineRequest {
    let mut final_tokens = prompt.clone();
    final_tokens.extend((0..out as u64).map(|i| 1_000_000 + id * 1000 + i));
    EngineRequest {
        id,
        prompt,
        final_tokens,
        max_new_tokens: out,
    }
}

/// Steps until idle, returning all finished records in completion order.
fn run(e: &mut Engine, now: &mut Duration) -> Vec<Finished> {
    let mut done = Vec::new();
    for _ in 0..10_000 {
        let out = e.step(*now);
        if out.is_idle() {
            break;
        }
        *now += out.duration;
        done.extend(out.finished);
    }
    assert!(e.is_idle(), "engine did not drain");
    done
}

#[test]
fn a_speed_change_applies_to_the_next_step_only() {
    let mut e = Engine::new(cfg()).unwrap();
    let mut twin = Engine::new(cfg()).unwrap();
    for x in [&mut e, &mut twin] {
        x.submit(req(1, (0..40).collect(), 4), Duration::ZERO)
            .unwrap();
    }
    let first = e.step(Duration::ZERO);
    assert_eq!(first.duration, twin.step(Duration::ZERO).duration);
    // The change lands while the first step is under way: that step keeps
    // its duration, the following ones take twice as long.
    e.set_speed(0.5).unwrap();
    assert_eq!(e.config().timing.speed, 0.5);
    let t = first.duration;
    for _ in 0..3 {
        let slow = e.step(t);
        let full = twin.step(t);
        assert!(!slow.is_idle());
        assert_eq!(slow.decode_seqs, full.decode_seqs);
        let (a, b) = (
            slow.duration.as_nanos() as i128,
            full.duration.as_nanos() as i128,
        );
        assert!((a - 2 * b).abs() <= 2, "{a} vs 2 x {b}");
    }
    assert!(e.set_speed(0.0).is_err() && e.set_speed(f64::NAN).is_err());
    assert_eq!(e.config().timing.speed, 0.5, "a bad speed changes nothing");
}

#[test]
fn repeated_prompt_hits_the_cache() {
    let mut e = Engine::new(cfg()).unwrap();
    let mut now = Duration::ZERO;
    let prompt: Vec<u64> = (0..40).collect();
    e.submit(req(1, prompt.clone(), 3), now).unwrap();
    let first = run(&mut e, &mut now);
    assert_eq!(first[0].cached_tokens, 0);
    e.submit(req(2, prompt.clone(), 3), now).unwrap();
    let second = run(&mut e, &mut now);
    // 40 tokens: blocks up to token 39 (exclusive of the last token) = 36.
    assert_eq!(second[0].cached_tokens, 36);
    assert_eq!(e.counters().cached_tokens, 36);
}

#[test]
fn next_turn_hits_prompt_and_reply() {
    let mut e = Engine::new(cfg()).unwrap();
    let mut now = Duration::ZERO;
    let turn1 = req(1, (0..20).collect(), 8);
    let history = turn1.final_tokens.clone();
    e.submit(turn1, now).unwrap();
    run(&mut e, &mut now);
    let mut p2 = history.clone();
    p2.extend(500..510);
    e.submit(req(2, p2, 2), now).unwrap();
    let done = run(&mut e, &mut now);
    assert_eq!(
        done[0].cached_tokens, 28,
        "20 prompt + 8 reply tokens = 7 blocks"
    );
}

#[test]
fn prompt_is_shareable_once_prefilled() {
    let mut e = Engine::new(cfg()).unwrap();
    let mut now = Duration::ZERO;
    let prompt: Vec<u64> = (0..32).collect();
    e.submit(req(1, prompt.clone(), 50), now).unwrap();
    // Prefill 32 tokens in one step; request 1 keeps decoding.
    let out = e.step(now);
    assert_eq!(out.first_token, vec![1]);
    now += out.duration;
    e.submit(req(2, prompt, 1), now).unwrap();
    let done = run(&mut e, &mut now);
    let r2 = done.iter().find(|f| f.id == 2).unwrap();
    assert_eq!(r2.cached_tokens, 28);
}

#[test]
fn fifo_head_that_does_not_fit_blocks_the_queue() {
    let mut c = cfg();
    c.kv_capacity_tokens = 40; // 10 blocks
    let mut e = Engine::new(c).unwrap();
    let now = Duration::ZERO;
    e.submit(req(1, (0..24).collect(), 4), now).unwrap(); // 7 blocks
    e.submit(req(2, (100..124).collect(), 4), now).unwrap(); // 7 blocks: must wait
    e.submit(req(3, vec![7, 8], 1), now).unwrap(); // 1 block: would fit, but FIFO
    e.step(now);
    let load = e.load();
    assert_eq!(load.running, 1);
    assert_eq!(load.waiting, 2);
    assert!(load.kv_used_tokens <= 40);
}

#[test]
fn oversize_request_is_rejected_at_submit() {
    let mut c = cfg();
    c.kv_capacity_tokens = 16;
    let mut e = Engine::new(c).unwrap();
    assert!(
        e.submit(req(1, (0..20).collect(), 1), Duration::ZERO)
            .is_err()
    );
    assert!(
        e.submit(req(2, (0..4).collect(), 1), Duration::ZERO)
            .is_ok()
    );
    assert!(
        e.submit(req(2, (0..4).collect(), 1), Duration::ZERO)
            .is_err(),
        "duplicate id"
    );
}

#[test]
fn cancel_frees_everything() {
    let mut e = Engine::new(cfg()).unwrap();
    e.submit(req(1, (0..30).collect(), 100), Duration::ZERO)
        .unwrap();
    e.submit(req(2, (0..30).collect(), 100), Duration::ZERO)
        .unwrap();
    e.step(Duration::ZERO);
    assert!(e.cancel(1));
    assert!(e.cancel(2));
    assert!(!e.cancel(2));
    assert!(e.is_idle());
    assert_eq!(e.cache().reserved_blocks(), 0);
    assert_eq!(e.cache().unpinned_blocks(), e.cache().tree_blocks());
}

#[test]
fn decode_steps_get_slower_with_batch_size_and_prefill_with_uncached_tokens() {
    let t = TimingConfig::default();
    assert!(t.step_duration(0, 64, 64_000) > t.step_duration(0, 1, 1000));
    assert!(t.step_duration(4000, 0, 0) > t.step_duration(100, 0, 0));
    // A cached prompt prefills faster than an uncached one.
    let mut e = Engine::new(cfg()).unwrap();
    let mut now = Duration::ZERO;
    let p: Vec<u64> = (0..60).collect();
    e.submit(req(1, p.clone(), 1), now).unwrap();
    let cold = e.step(now).duration;
    now += cold;
    run(&mut e, &mut now);
    e.submit(req(2, p, 1), now).unwrap();
    let warm = e.step(now).duration;
    assert!(warm < cold);
}

#[test]
fn same_inputs_give_identical_runs() {
    let go = || {
        let mut e = Engine::new(cfg()).unwrap();
        let mut now = Duration::ZERO;
        let mut log = Vec::new();
        for id in 0..30u64 {
            let prompt: Vec<u64> = (0..(id % 7) * 9 + 5).map(|t| (id % 3) * 100 + t).collect();
            e.submit(req(id, prompt, (id % 5) as usize + 1), now)
                .unwrap();
            let o = e.step(now);
            now += o.duration;
            log.push((o.duration, o.progressed, o.finished));
        }
        log.push((now, Vec::new(), run(&mut e, &mut now)));
        log
    };
    assert_eq!(go(), go());
}

#[test]
fn load_reports_queue_and_pending_prefill() {
    let mut c = cfg();
    c.max_running_requests = 1;
    let mut e = Engine::new(c).unwrap();
    e.submit(req(1, (0..40).collect(), 5), Duration::ZERO)
        .unwrap();
    e.submit(req(2, (100..130).collect(), 5), Duration::ZERO)
        .unwrap();
    let l = e.load();
    assert_eq!((l.running, l.waiting, l.pending_prefill_tokens), (0, 2, 70));
    e.step(Duration::ZERO);
    let l = e.load();
    assert_eq!((l.running, l.waiting, l.pending_prefill_tokens), (1, 1, 30));
    assert!(l.kv_used_tokens >= 48, "prompt + output reserved");
    assert!(e.cancel(2));
    assert_eq!(e.load().pending_prefill_tokens, 0);
}

#[test]
fn invalid_configs_are_rejected() {
    let mut c = cfg();
    c.max_batch_tokens = 2;
    assert!(Engine::new(c).is_err());
    let mut c = cfg();
    c.timing.token_us = f64::NAN;
    assert!(Engine::new(c).is_err());
    let mut c = cfg();
    c.kv_capacity_tokens = 1;
    assert!(Engine::new(c).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Across random workloads: the step budget and the running limit hold
    /// every step, KV use never exceeds capacity, admission and first
    /// tokens follow submission order for identical-size requests, and every
    /// request finishes exactly once with its requested output.
    #[test]
    fn machine_invariants(
        reqs in proptest::collection::vec((0u64..3, 1usize..60, 0usize..12, 0u64..5), 1..40),
        cap in 20usize..200,
        budget in 8usize..48,
        max_running in 1usize..8,
    ) {
        let c = EngineConfig {
            block_size: 4,
            kv_capacity_tokens: cap,
            max_running_requests: max_running,
            max_batch_tokens: budget.max(max_running),
            timing: TimingConfig::default(),
        };
        let mut e = Engine::new(c.clone()).unwrap();
        let mut now = Duration::ZERO;
        let mut accepted = Vec::new();
        for (id, (fam, len, out, gap)) in reqs.into_iter().enumerate() {
            let prompt: Vec<u64> = (0..len as u64).map(|i| fam * 10_000 + i).collect();
            if e.submit(req(id as u64, prompt, out), now).is_ok() {
                accepted.push((id as u64, out));
            }
            for _ in 0..gap {
                let o = e.step(now);
                now += o.duration;
                prop_assert!(o.prefill_tokens + o.decode_seqs <= c.max_batch_tokens);
                prop_assert!(e.load().running <= c.max_running_requests);
                prop_assert!(e.load().kv_used_tokens <= e.load().kv_capacity_tokens);
            }
        }
        let mut finished = Vec::new();
        let mut first = Vec::new();
        for _ in 0..100_000 {
            let o = e.step(now);
            if o.is_idle() { break; }
            prop_assert!(o.prefill_tokens + o.decode_seqs <= c.max_batch_tokens);
            prop_assert!(e.load().kv_used_tokens <= e.load().kv_capacity_tokens);
            now += o.duration;
            first.extend(o.first_token.iter().copied());
            finished.extend(o.finished);
        }
        prop_assert!(e.is_idle());
        prop_assert_eq!(e.cache().reserved_blocks(), 0);
        let mut ids: Vec<u64> = finished.iter().map(|f| f.id).collect();
        ids.sort_unstable();
        ids.dedup();
        prop_assert!(ids.len() == finished.len() && ids.len() <= accepted.len());
        for f in &finished {
            let out = accepted.iter().find(|a| a.0 == f.id).unwrap().1;
            prop_assert_eq!(f.completion_tokens, out);
            prop_assert!(f.cached_tokens < f.prompt_tokens);
        }
        prop_assert_eq!(e.counters().finished as usize, accepted.len());
        e.cache().check_invariants();
    }

    /// FIFO fairness: with identical requests, first tokens come in
    /// submission order.
    #[test]
    fn identical_requests_are_served_in_order(n in 1usize..30, len in 1usize..40, max_running in 1usize..6) {
        let c = EngineConfig { block_size: 4, kv_capacity_tokens: 4000, max_running_requests: max_running, max_batch_tokens: 32, timing: TimingConfig::default() };
        let mut e = Engine::new(c).unwrap();
        for id in 0..n as u64 {
            let prompt: Vec<u64> = (0..len as u64).map(|i| id * 1000 + i).collect();
            e.submit(req(id, prompt, 2), Duration::ZERO).unwrap();
        }
        let mut first = Vec::new();
        let mut now = Duration::ZERO;
        loop {
            let o = e.step(now);
            if o.is_idle() { break; }
            now += o.duration;
            first.extend(o.first_token);
        }
        let sorted = { let mut s = first.clone(); s.sort_unstable(); s };
        prop_assert_eq!(first, sorted);
    }
}

#[test]
fn a_transferred_prompt_is_cached_whole_and_only_decodes() {
    let mut e = Engine::new(cfg()).unwrap();
    let prompt: Vec<u64> = (0..42).collect();
    e.submit_transferred(req(1, prompt.clone(), 3), Duration::ZERO)
        .unwrap();
    assert_eq!(e.load().pending_prefill_tokens, 0, "nothing to prefill");
    let first = e.step(Duration::ZERO);
    assert_eq!(first.prefill_tokens, 0);
    assert_eq!(first.admitted, vec![(1, 42)]);
    assert_eq!(first.progressed, vec![(1, 1)], "the first step decodes");
    assert_eq!(first.first_token, vec![1], "and reports its first token");
    let mut now = first.duration;
    let done = run(&mut e, &mut now);
    assert_eq!(done[0].cached_tokens, 42);
    assert_eq!(done[0].completion_tokens, 3);
    // Its full blocks are now this engine's cache: a local request for the
    // same prompt hits them (all but the last token, as always).
    assert_eq!(e.cached_prefix_tokens(&prompt), 40);
    e.submit(req(2, prompt, 1), now).unwrap();
    let out = e.step(now);
    assert_eq!(out.admitted, vec![(2, 40)]);
    // Nothing to generate: it completes without a step.
    e.submit_transferred(req(3, (100..120).collect(), 0), now)
        .unwrap();
    let mut t = now;
    let done = run(&mut e, &mut t);
    let three = done.iter().find(|f| f.id == 3).unwrap();
    assert_eq!((three.cached_tokens, three.completion_tokens), (20, 0));
}
