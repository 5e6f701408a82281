use super::*;
use std::sync::Barrier;
use std::thread;

fn config(failures: u32, successes: u32, timeout_secs: u64) -> BreakerConfig {
    BreakerConfig {
        enabled: true,
        failure_threshold: failures,
        success_threshold: successes,
        timeout_duration_secs: timeout_secs,
    }
}

fn secs(t0: Instant, s: f64) -> Instant {
    t0 + Duration::from_secs_f64(s)
}

fn fail(b: &Arc<Breaker>, now: Instant) -> Option<BreakerState> {
    b.try_acquire(now)
        .expect("admitted")
        .record(Outcome::Failure, now)
}

fn succeed(b: &Arc<Breaker>, now: Instant) -> Option<BreakerState> {
    b.try_acquire(now)
        .expect("admitted")
        .record(Outcome::Success, now)
}

/// Opens a fresh breaker at `t0` with `failures` failures.
fn opened(cfg: &BreakerConfig, probes: u32) -> (Arc<Breaker>, Instant) {
    let b = Arc::new(Breaker::with_half_open_probes(cfg, probes));
    let t0 = Instant::now();
    for _ in 1..cfg.failure_threshold {
        assert_eq!(fail(&b, t0), None);
    }
    assert_eq!(fail(&b, t0), Some(BreakerState::Open));
    (b, t0)
}

#[test]
fn consecutive_failures_open_it_and_a_success_resets_the_count() {
    let b = Arc::new(Breaker::new(&config(3, 1, 10)));
    let t0 = Instant::now();
    assert_eq!(fail(&b, t0), None);
    assert_eq!(fail(&b, t0), None);
    assert_eq!(succeed(&b, t0), None, "a success resets the streak");
    assert_eq!(fail(&b, t0), None);
    assert_eq!(fail(&b, t0), None);
    assert_eq!(b.state(t0), BreakerState::Closed);
    assert_eq!(b.transitions(), 0);
    assert_eq!(fail(&b, t0), Some(BreakerState::Open));
    assert_eq!(b.state(t0), BreakerState::Open);
    assert!(b.try_acquire(t0).is_none());
    assert!(!b.is_available(t0));
    assert_eq!(b.transitions(), 1);
    assert_eq!(b.retry_in(secs(t0, 4.0)), Duration::from_secs(6));
}

#[test]
fn open_waits_for_the_timeout_then_admits_one_probe() {
    let (b, t0) = opened(&config(2, 1, 10), 1);
    let before = secs(t0, 9.999);
    assert_eq!(b.state(before), BreakerState::Open);
    assert!(b.try_acquire(before).is_none());
    let at = secs(t0, 10.0);
    assert_eq!(b.state(at), BreakerState::HalfOpen);
    assert!(b.is_available(at));
    let probe = b.try_acquire(at).expect("probe after the timeout");
    assert!(probe.is_probe());
    assert_eq!(b.transitions(), 2);
    assert!(b.try_acquire(at).is_none(), "only one probe at a time");
    assert!(!b.is_available(at));
    assert_eq!(
        probe.record(Outcome::Success, at),
        Some(BreakerState::Closed)
    );
    assert_eq!(b.state(at), BreakerState::Closed);
    assert_eq!(b.transitions(), 3);
    assert!(!b.try_acquire(at).expect("closed admits").is_probe());
}

#[test]
fn success_threshold_probes_close_it() {
    let (b, t0) = opened(&config(1, 3, 5), 1);
    let at = secs(t0, 5.0);
    assert_eq!(succeed(&b, at), None);
    assert_eq!(succeed(&b, at), None);
    assert_eq!(b.state(at), BreakerState::HalfOpen);
    assert_eq!(succeed(&b, at), Some(BreakerState::Closed));
    assert_eq!(b.transitions(), 3);
}

#[test]
fn a_failed_probe_reopens_and_restarts_the_timer() {
    let (b, t0) = opened(&config(1, 2, 10), 1);
    let probe_at = secs(t0, 10.0);
    let probe = b.try_acquire(probe_at).expect("probe");
    let failed_at = secs(t0, 12.0);
    assert_eq!(
        probe.record(Outcome::Failure, failed_at),
        Some(BreakerState::Open)
    );
    assert!(b.try_acquire(secs(t0, 21.9)).is_none(), "timer restarted");
    assert_eq!(b.state(secs(t0, 21.9)), BreakerState::Open);
    assert!(b.try_acquire(secs(t0, 22.0)).is_some());
    // closed→open, open→half, half→open, open→half
    assert_eq!(b.transitions(), 4);
}

#[test]
fn a_dropped_probe_frees_its_slot_without_counting() {
    let (b, t0) = opened(&config(1, 1, 1), 1);
    let at = secs(t0, 1.0);
    let probe = b.try_acquire(at).expect("probe");
    assert!(b.try_acquire(at).is_none());
    drop(probe);
    assert_eq!(b.state(at), BreakerState::HalfOpen);
    assert!(b.try_acquire(at).is_some(), "slot freed");
}

#[test]
fn stale_permits_do_not_count_in_a_later_period() {
    let cfg = config(1, 2, 1);
    let b = Arc::new(Breaker::with_half_open_probes(&cfg, 2));
    let t0 = Instant::now();
    // Admitted while closed, finishes after the breaker opened.
    let early = b.try_acquire(t0).expect("closed");
    assert_eq!(fail(&b, t0), Some(BreakerState::Open));
    assert_eq!(early.record(Outcome::Success, t0), None);
    assert_eq!(
        b.state(t0),
        BreakerState::Open,
        "a stale success does not close"
    );

    // Two probes; one fails and reopens; the other finishes in the next period.
    let at = secs(t0, 1.0);
    let p1 = b.try_acquire(at).expect("probe 1");
    let p2 = b.try_acquire(at).expect("probe 2");
    assert_eq!(p1.record(Outcome::Failure, at), Some(BreakerState::Open));
    let later = secs(t0, 2.0);
    let p3 = b.try_acquire(later).expect("probe of the next period");
    assert_eq!(
        p2.record(Outcome::Success, later),
        None,
        "stale probe ignored"
    );
    let w = Word::unpack(b.word.load(Ordering::Acquire));
    assert_eq!((w.state, w.probes, w.count), (HALF_OPEN, 1, 0));
    assert_eq!(p3.record(Outcome::Success, later), None);
    assert_eq!(succeed(&b, later), Some(BreakerState::Closed));
}

#[test]
fn zero_timeout_periods_still_have_distinct_stamps() {
    let cfg = config(1, 1, 0);
    let b = Arc::new(Breaker::with_half_open_probes(&cfg, 2));
    let t0 = Instant::now();
    assert_eq!(fail(&b, t0), Some(BreakerState::Open));
    let p1 = b.try_acquire(t0).expect("probe");
    let p2 = b.try_acquire(t0).expect("probe");
    assert_eq!(p1.record(Outcome::Failure, t0), Some(BreakerState::Open));
    let p3 = b
        .try_acquire(t0)
        .expect("probe of the next period, same instant");
    assert_eq!(p2.record(Outcome::Success, t0), None, "stale");
    assert_eq!(b.state(t0), BreakerState::HalfOpen);
    assert_eq!(p3.record(Outcome::Success, t0), Some(BreakerState::Closed));
}

#[test]
fn disabled_always_allows() {
    let mut cfg = config(1, 1, 10);
    cfg.enabled = false;
    let b = Arc::new(Breaker::new(&cfg));
    let t0 = Instant::now();
    for _ in 0..10 {
        assert_eq!(fail(&b, t0), None);
    }
    assert_eq!(b.state(t0), BreakerState::Closed);
    assert!(b.is_available(t0));
    assert_eq!(b.transitions(), 0);
}

#[test]
fn concurrent_half_open_probes_are_bounded() {
    const THREADS: usize = 8;
    const PROBES: u32 = 3;
    for _round in 0..20 {
        let (b, t0) = opened(&config(1, 10, 1), PROBES);
        let at = secs(t0, 1.0);
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let (b, barrier) = (Arc::clone(&b), Arc::clone(&barrier));
                thread::spawn(move || {
                    barrier.wait();
                    b.try_acquire(at)
                })
            })
            .collect();
        let permits: Vec<Permit> = handles
            .into_iter()
            .filter_map(|h| h.join().expect("thread"))
            .collect();
        assert_eq!(permits.len(), PROBES as usize);
        assert!(permits.iter().all(Permit::is_probe));
        drop(permits);
        let w = Word::unpack(b.word.load(Ordering::Acquire));
        assert_eq!((w.state, w.probes), (HALF_OPEN, 0));
    }
}

/// A tiny deterministic generator (no dependency needed for a test).
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn a_multi_threaded_storm_ends_consistent() {
    const THREADS: u64 = 4;
    const OPS: usize = 20_000;
    let cfg = config(3, 2, 1);
    let b = Arc::new(Breaker::with_half_open_probes(&cfg, 2));
    let t0 = Instant::now();
    let clock_ms = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let (b, clock_ms) = (Arc::clone(&b), Arc::clone(&clock_ms));
            thread::spawn(move || {
                let mut seed = 0x9E37_79B9_7F4A_7C15 ^ (i + 1);
                let (mut opens, mut closes) = (0u64, 0u64);
                let mut held = Vec::new();
                for _ in 0..OPS {
                    let r = next(&mut seed);
                    let now_ms = clock_ms.fetch_add(r % 3, Ordering::Relaxed);
                    let now = t0 + Duration::from_millis(now_ms);
                    if let Some(p) = b.try_acquire(now) {
                        held.push(p);
                    }
                    // Finish a held permit at random: success, failure or drop.
                    if !held.is_empty() && r % 5 < 3 {
                        let p = held.swap_remove((r as usize / 7) % held.len());
                        let changed = match r % 7 {
                            0 => {
                                drop(p);
                                None
                            }
                            1..=3 => p.record(Outcome::Failure, now),
                            _ => p.record(Outcome::Success, now),
                        };
                        match changed {
                            Some(BreakerState::Open) => opens += 1,
                            Some(BreakerState::Closed) => closes += 1,
                            Some(BreakerState::HalfOpen) => unreachable!("record never half-opens"),
                            None => {}
                        }
                    }
                }
                drop(held);
                (opens, closes)
            })
        })
        .collect();
    let (mut opens, mut closes) = (0, 0);
    for h in handles {
        let (o, c) = h.join().expect("thread");
        opens += o;
        closes += c;
    }
    let w = Word::unpack(b.word.load(Ordering::Acquire));
    assert!(opens > 0 && closes > 0, "the storm exercised the cycle");
    assert_eq!(w.probes, 0, "every probe was released");
    // A path from Closed: every half-open follows an open, every close a
    // half-open; which counts are equal depends on where it stopped.
    let half_opens = b.transitions() - opens - closes;
    match w.state {
        CLOSED => {
            assert_eq!(half_opens, opens);
            assert!(w.count < 3);
        }
        OPEN => assert_eq!(half_opens + 1, opens),
        _ => {
            assert_eq!(half_opens, opens);
        }
    }
    assert!(closes <= half_opens);
    // And it still works: far in the future, two successes close it.
    let later = t0 + Duration::from_secs(3600);
    for _ in 0..2 {
        if b.state(later) != BreakerState::Closed {
            succeed(&b, later);
        }
    }
    assert_eq!(b.state(later), BreakerState::Closed);
}

/// Whether a worker gave an attempt its first byte since another was
/// sent: a worker that answers others is not hung for the one the request
/// timeout ended.
#[test]
fn an_answer_is_seen_by_the_attempts_sent_before_it_only() {
    let b = Breaker::new(&config(5, 1, 10));
    let t0 = Instant::now();
    assert!(!b.answered_since(t0));
    b.note_answer(secs(t0, 2.0));
    assert!(b.answered_since(t0));
    assert!(b.answered_since(secs(t0, 2.0)));
    assert!(!b.answered_since(secs(t0, 2.5)));
    // An earlier answer noted late does not move it back.
    b.note_answer(secs(t0, 1.0));
    assert!(b.answered_since(secs(t0, 1.5)));
}
