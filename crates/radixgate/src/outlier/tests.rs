use super::*;
use radixgate_routing::WorkerSpec;

/// Worker `i` at `http://w{i}:1`, `spec` changing the rest of a plain one.
fn worker(i: u32, spec: impl FnOnce(WorkerSpec) -> WorkerSpec) -> Arc<Worker> {
    Arc::new(Worker::new(
        WorkerId(i),
        spec(WorkerSpec::new(format!("http://w{i}:1"))),
    ))
}

fn pool(n: u32) -> Vec<Arc<Worker>> {
    (0..n).map(|i| worker(i, |s| s)).collect()
}

/// Whether `events` are worker `i`'s return alone.
fn returned_alone(events: &[Event], i: u32) -> bool {
    matches!(events, [Event::Returned { worker }] if worker.id() == WorkerId(i))
}

fn config() -> OutlierConfig {
    OutlierConfig {
        min_samples: 5,
        max_ejection_percent: 50,
        ..OutlierConfig::default()
    }
}

/// `n` samples of `ms` for worker `i`.
fn feed(o: &Outliers, i: u32, ms: u64, n: usize) {
    for _ in 0..n {
        o.sample(WorkerId(i), Duration::from_millis(ms));
    }
}

fn ejected(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Ejected { worker, .. } => Some(worker.id().0),
            Event::Returned { .. } => None,
        })
        .collect()
}

/// A worker is judged against the workers of its model: a pool that
/// serves a small and a large model (the large one's first tokens ten
/// times slower) ejects none of the large model's workers for being slower
/// than the small model's, and still ejects one slow among its own.
#[tokio::test(start_paused = true)]
async fn a_worker_is_judged_against_the_workers_of_its_model() {
    let serving = |i: u32, model: &str| worker(i, |s| s.with_models([model]));
    let o = Outliers::new(config());
    let ws = vec![
        serving(0, "small"),
        serving(1, "small"),
        serving(2, "small"),
        serving(3, "large"),
        serving(4, "large"),
    ];
    for i in 0..3 {
        feed(&o, i, 200, 10);
    }
    feed(&o, 3, 2_000, 10);
    feed(&o, 4, 2_400, 10);
    assert!(ejected(&o.evaluate(&ws, Instant::now())).is_empty());
    // Among its own, a slow one is an outlier.
    let ws = [ws, vec![serving(5, "large"), serving(6, "large")]].concat();
    feed(&o, 5, 2_200, 10);
    feed(&o, 6, 30_000, 10);
    assert_eq!(ejected(&o.evaluate(&ws, Instant::now())), [6]);
}

#[tokio::test(start_paused = true)]
async fn a_slow_worker_is_ejected_then_returns_and_stays_out_longer_next_time() {
    let o = Outliers::new(config());
    let ws = pool(4);
    for i in 0..3 {
        feed(&o, i, 200, 10);
    }
    feed(&o, 3, 5_000, 10);
    let events = o.evaluate(&ws, Instant::now());
    assert_eq!(ejected(&events), [3]);
    assert!(ws[3].is_ejected() && !ws[3].is_available());
    let Event::Ejected { duration, .. } = &events[0] else {
        unreachable!()
    };
    assert_eq!(*duration, Duration::from_secs(30));

    tokio::time::advance(Duration::from_secs(29)).await;
    assert!(o.evaluate(&ws, Instant::now()).is_empty());
    assert!(ws[3].is_ejected());
    tokio::time::advance(Duration::from_secs(1)).await;
    let events = o.evaluate(&ws, Instant::now());
    assert!(returned_alone(&events, 3), "{events:?}");
    assert!(ws[3].is_available());

    // Judged afresh: still slow, so out again, twice as long.
    feed(&o, 3, 5_000, 10);
    let events = o.evaluate(&ws, Instant::now());
    let Some(Event::Ejected { duration, .. }) = events.first() else {
        panic!("{events:?}")
    };
    assert_eq!(*duration, Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn small_gaps_few_samples_and_similar_workers_are_left_alone() {
    let o = Outliers::new(config());
    let ws = pool(3);
    // Five times slower, but by only 400 ms: under min_gap_ms.
    feed(&o, 0, 100, 10);
    feed(&o, 1, 100, 10);
    feed(&o, 2, 500, 10);
    assert!(o.evaluate(&ws, Instant::now()).is_empty());
    // Far slower, but too few samples.
    let o = Outliers::new(config());
    feed(&o, 0, 100, 10);
    feed(&o, 1, 100, 10);
    feed(&o, 2, 60_000, 4);
    assert!(o.evaluate(&ws, Instant::now()).is_empty());
    // Slower, but within the factor.
    let o = Outliers::new(config());
    feed(&o, 0, 2_000, 10);
    feed(&o, 1, 2_000, 10);
    feed(&o, 2, 9_000, 10);
    assert!(o.evaluate(&ws, Instant::now()).is_empty());
}

#[tokio::test(start_paused = true)]
async fn never_the_last_available_worker_and_never_above_the_cap() {
    let o = Outliers::new(config());
    let ws = pool(2);
    ws[0].set_breaker(radixgate_routing::BreakerState::Open);
    feed(&o, 0, 100, 10);
    feed(&o, 1, 60_000, 10);
    assert!(
        o.evaluate(&ws, Instant::now()).is_empty(),
        "w1 is all that is left"
    );
    assert!(ws[1].is_available());

    let o = Outliers::new(OutlierConfig {
        max_ejection_percent: 10,
        ..config()
    });
    let ws = pool(6);
    for i in 0..4 {
        feed(&o, i, 100, 10);
    }
    feed(&o, 4, 30_000, 10);
    feed(&o, 5, 60_000, 10);
    // 10% of six rounds down to none, but one may always go: the worst.
    assert_eq!(ejected(&o.evaluate(&ws, Instant::now())), [5]);
    assert!(!ws[4].is_ejected());

    let off = Outliers::new(OutlierConfig {
        enabled: false,
        ..config()
    });
    feed(&off, 0, 100, 10);
    feed(&off, 1, 60_000, 10);
    assert!(off.evaluate(&pool(2), Instant::now()).is_empty());
}

/// Three workers of which the third, far slower, is ejected; then the
/// first's breaker opens, so only the second serves beside it.
fn third_ejected() -> (Outliers, Vec<Arc<Worker>>) {
    let o = Outliers::new(config());
    let ws = pool(3);
    feed(&o, 0, 100, 10);
    feed(&o, 1, 100, 10);
    feed(&o, 2, 60_000, 10);
    assert_eq!(ejected(&o.evaluate(&ws, Instant::now())), [2]);
    ws[0].set_breaker(radixgate_routing::BreakerState::Open);
    (o, ws)
}

/// An ejected worker returns before its time once no other available
/// worker serves its models (here their breakers opened): a slow worker
/// is better than an empty pool.
#[tokio::test(start_paused = true)]
async fn an_ejected_worker_returns_early_when_no_peer_is_left() {
    let (o, ws) = third_ejected();
    assert!(o.evaluate(&ws, Instant::now()).is_empty(), "w1 serves");
    assert!(ws[2].is_ejected());
    ws[1].set_breaker(radixgate_routing::BreakerState::Open);
    let events = o.evaluate(&ws, Instant::now());
    assert!(returned_alone(&events, 2), "{events:?}");
    assert!(ws[2].is_available());
}

/// A request that found no worker returns the ejected ones left alone for
/// their models at once, as the next evaluation would, and only those.
#[tokio::test(start_paused = true)]
async fn a_rescue_returns_only_workers_left_alone() {
    let (o, ws) = third_ejected();
    assert!(o.rescue(&ws).is_empty(), "w1 serves");
    assert!(ws[2].is_ejected());
    ws[1].set_breaker(radixgate_routing::BreakerState::Open);
    let returned: Vec<u32> = o.rescue(&ws).iter().map(|w| w.id().0).collect();
    assert_eq!(returned, [2]);
    assert!(ws[2].is_available());
    assert!(o.rescue(&ws).is_empty(), "nothing left to return");
    // Judged afresh, and not reported again by the evaluation.
    assert!(o.evaluate(&ws, Instant::now()).is_empty());
}

/// Disaggregated: a worker's peers are the workers of its role. A decode
/// worker is never ejected for the prefill workers that serve its model
/// (they cannot decode), and an ejected one returns once no other decode
/// worker is available, whatever prefill workers are left.
#[tokio::test(start_paused = true)]
async fn a_workers_peers_are_the_workers_of_its_role() {
    let role = |i: u32, role: radixgate_routing::WorkerRole| worker(i, |s| s.with_role(role));
    use radixgate_routing::WorkerRole::{Decode, Prefill};
    // The one decode worker, slow next to the prefill workers: the last of
    // its role, kept.
    let o = Outliers::new(config());
    let ws = vec![role(0, Prefill), role(1, Prefill), role(2, Decode)];
    feed(&o, 0, 100, 10);
    feed(&o, 1, 100, 10);
    feed(&o, 2, 60_000, 10);
    assert!(o.evaluate(&ws, Instant::now()).is_empty());
    assert!(ws[2].is_available());

    // Two decode workers, one ejected; the other's breaker opens: the
    // ejected one returns though the prefill worker is available.
    let o = Outliers::new(config());
    let ws = vec![role(0, Prefill), role(1, Decode), role(2, Decode)];
    feed(&o, 1, 100, 10);
    feed(&o, 2, 60_000, 10);
    assert_eq!(ejected(&o.evaluate(&ws, Instant::now())), [2]);
    ws[1].set_breaker(radixgate_routing::BreakerState::Open);
    let events = o.evaluate(&ws, Instant::now());
    assert!(returned_alone(&events, 2), "{events:?}");
    assert!(ws[2].is_available());
}

#[tokio::test(start_paused = true)]
async fn the_ewma_follows_recent_samples() {
    let o = Outliers::new(config());
    let ws = pool(3);
    feed(&o, 0, 100, 10);
    feed(&o, 1, 100, 10);
    feed(&o, 2, 10_000, 10);
    // It recovered before the evaluation: recent samples dominate.
    feed(&o, 2, 100, 20);
    assert!(o.evaluate(&ws, Instant::now()).is_empty());
}
