use super::*;
use futures::FutureExt;
use std::sync::Mutex;

fn gate(limit: Option<usize>, queue_size: usize, timeout_secs: u64) -> Admission {
    Admission::new(
        &AdmissionConfig {
            max_concurrent_requests: limit,
            queue_size,
            queue_timeout_secs: timeout_secs,
        },
        &Metrics::new(),
    )
}

/// Lets spawned tasks run until they block.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[test]
fn the_permit_can_live_in_a_response_body() {
    fn owned<T: Send + Sync + 'static>() {}
    owned::<AdmissionPermit>();
    owned::<Admission>();
}

#[tokio::test(start_paused = true)]
async fn unlimited_admits_everything_and_tracks_nothing() {
    let gate = gate(None, 0, 1);
    let permits: Vec<_> = (0..1000)
        .map(|_| {
            gate.acquire(Priority::Normal)
                .now_or_never()
                .expect("ready")
                .expect("admitted")
        })
        .collect();
    assert_eq!(permits.len(), 1000);
    assert_eq!(
        (gate.in_flight(), gate.queued(), gate.limit()),
        (0, 0, None)
    );
}

#[tokio::test(start_paused = true)]
async fn the_limit_is_respected_and_a_drop_admits_the_next() {
    let gate = gate(Some(2), 10, 60);
    let a = gate.acquire(Priority::Normal).await.expect("first");
    let a_waited = a.waited();
    let _b = gate.acquire(Priority::Normal).await.expect("second");
    assert_eq!(gate.in_flight(), 2);
    let waiter = tokio::spawn({
        let gate = gate.clone();
        async move { gate.acquire(Priority::Normal).await }
    });
    settle().await;
    assert!(!waiter.is_finished(), "third waits");
    assert_eq!((gate.in_flight(), gate.queued()), (2, 1));
    drop(a);
    let c = waiter
        .await
        .expect("task")
        .expect("admitted after the drop");
    assert_eq!((gate.in_flight(), gate.queued()), (2, 0));
    // Only the one that queued says it waited (`proxy.rs` refuses such a
    // one at the end of the shutdown grace period).
    assert!(!a_waited && c.waited());
    drop(c);
    assert_eq!(gate.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once() {
    let gate = gate(Some(1), 2, 60);
    let _held = gate.acquire(Priority::Normal).await.expect("first");
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let gate = gate.clone();
            tokio::spawn(async move { gate.acquire(Priority::Normal).await })
        })
        .collect();
    settle().await;
    assert_eq!(gate.queued(), 2);
    let refused = gate
        .acquire(Priority::Normal)
        .now_or_never()
        .expect("no waiting when full");
    assert!(matches!(
        refused,
        Err(GatewayError::QueueFull { queue_size: 2 })
    ));
    for w in waiters {
        w.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn zero_queue_refuses_when_all_slots_are_taken() {
    let gate = gate(Some(1), 0, 60);
    let held = gate.acquire(Priority::Normal).await.expect("first");
    let refused = gate
        .acquire(Priority::Normal)
        .now_or_never()
        .expect("immediate");
    assert!(matches!(refused, Err(GatewayError::QueueFull { .. })));
    drop(held);
    assert!(
        gate.acquire(Priority::Normal)
            .now_or_never()
            .expect("immediate")
            .is_ok()
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_times_out_and_gives_its_place_back() {
    let gate = gate(Some(1), 1, 2);
    let _held = gate.acquire(Priority::Normal).await.expect("first");
    let started = Instant::now();
    let err = gate.acquire(Priority::Normal).await.expect_err("times out");
    match err {
        GatewayError::QueueTimeout { waited } => {
            assert_eq!(waited, Duration::from_secs(2));
            assert_eq!(started.elapsed(), Duration::from_secs(2));
        }
        other => panic!("expected QueueTimeout, got {other:?}"),
    }
    assert_eq!(gate.queued(), 0);
    assert_eq!(err_status(&gate).await, 503);
}

/// `queue_timeout_secs: 0` is no queue timeout, as 0 is for the other
/// timeouts: a waiter waits for its slot (the request timeout, if any,
/// still bounds it) rather than being refused at once after queueing.
#[tokio::test(start_paused = true)]
async fn a_zero_queue_timeout_waits_for_the_slot() {
    let gate = gate(Some(1), 1, 0);
    let held = gate.acquire(Priority::Normal).await.expect("first");
    let waiter = tokio::spawn({
        let gate = gate.clone();
        async move { gate.acquire(Priority::Normal).await.map(drop) }
    });
    settle().await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    settle().await;
    assert!(
        !waiter.is_finished(),
        "the waiter was answered without a slot"
    );
    assert_eq!(gate.queued(), 1);
    drop(held);
    waiter
        .await
        .expect("task")
        .expect("admitted once the slot is free");
    assert_eq!((gate.in_flight(), gate.queued()), (0, 0));
}

/// The status of the next timed-out request, as the client would see it.
async fn err_status(gate: &Admission) -> u16 {
    gate.acquire(Priority::Normal)
        .await
        .expect_err("times out")
        .status()
        .as_u16()
}

#[tokio::test(start_paused = true)]
async fn waiters_are_admitted_in_arrival_order() {
    let gate = gate(Some(1), 10, 60);
    let held = gate.acquire(Priority::Normal).await.expect("first");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for id in 0..6 {
        let (gate, order) = (gate.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let permit = gate.acquire(Priority::Normal).await.expect("admitted");
            order.lock().expect("lock").push(id);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(permit);
        }));
        settle().await; // each registers before the next arrives
    }
    assert_eq!(gate.queued(), 6);
    drop(held);
    // A newcomer after the release must queue behind them, not barge in.
    assert!(gate.acquire(Priority::Normal).now_or_never().is_none());
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(*order.lock().expect("lock"), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!((gate.in_flight(), gate.queued()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_leaks_nothing() {
    let gate = gate(Some(1), 1, 60);
    let held = gate.acquire(Priority::Normal).await.expect("first");
    // The client goes away while waiting: the future is dropped.
    let cancelled =
        tokio::time::timeout(Duration::from_secs(1), gate.acquire(Priority::Normal)).await;
    assert!(cancelled.is_err(), "still waiting when cancelled");
    assert_eq!(gate.queued(), 0, "queue place given back");
    // The queue (size 1) has room again, and the slot goes to the live waiter.
    let waiter = tokio::spawn({
        let gate = gate.clone();
        async move { gate.acquire(Priority::Normal).await }
    });
    settle().await;
    assert_eq!(gate.queued(), 1);
    drop(held);
    let permit = waiter.await.expect("task").expect("admitted");
    assert_eq!(gate.in_flight(), 1);
    drop(permit);
    assert_eq!((gate.in_flight(), gate.queued()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn aborted_tasks_release_permits_and_places() {
    let gate = gate(Some(2), 4, 60);
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire(Priority::Normal).await;
            std::future::pending::<()>().await;
        }));
    }
    settle().await;
    assert_eq!((gate.in_flight(), gate.queued()), (2, 4));
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.expect_err("aborted").is_cancelled());
    }
    assert_eq!((gate.in_flight(), gate.queued()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn higher_priority_waiters_go_first_and_fifo_within_a_level() {
    let gate = gate(Some(1), 10, 60);
    let held = gate.acquire(Priority::Normal).await.expect("first");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let arrivals = [
        ("low-1", Priority::Low),
        ("normal-1", Priority::Normal),
        ("low-2", Priority::Low),
        ("high-1", Priority::High),
        ("normal-2", Priority::Normal),
        ("high-2", Priority::High),
    ];
    for (name, priority) in arrivals {
        let (gate, order) = (gate.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let permit = gate.acquire(priority).await.expect("admitted");
            order.lock().expect("lock").push(name);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(permit);
        }));
        settle().await;
    }
    assert_eq!(gate.queued(), 6);
    drop(held);
    // A high-priority newcomer still queues: the freed slot was handed over.
    assert!(gate.acquire(Priority::High).now_or_never().is_none());
    for t in tasks {
        t.await.expect("task");
    }
    let expected = ["high-1", "high-2", "normal-1", "normal-2", "low-1", "low-2"];
    assert_eq!(*order.lock().expect("lock"), expected);
    assert_eq!((gate.in_flight(), gate.queued()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_slot_handed_to_a_waiter_that_gave_up_is_passed_on() {
    let gate = gate(Some(1), 10, 60);
    let held = gate.acquire(Priority::Normal).await.expect("first");
    let mut quitter = Box::pin(gate.acquire(Priority::High));
    assert!((&mut quitter).now_or_never().is_none(), "queued");
    let patient = tokio::spawn({
        let gate = gate.clone();
        async move { gate.acquire(Priority::Low).await }
    });
    settle().await;
    assert_eq!(gate.queued(), 2);
    // The slot goes to the quitter, which is dropped before it looks.
    drop(held);
    drop(quitter);
    let permit = patient
        .await
        .expect("task")
        .expect("the slot was passed on");
    assert_eq!((gate.in_flight(), gate.queued()), (1, 0));
    drop(permit);
    assert_eq!(gate.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_takes_a_higher_priority_in_place_of_its_newest_lowest() {
    let gate = gate(Some(1), 2, 60);
    let held = gate.acquire(Priority::Normal).await.expect("first");
    let queue = |priority| {
        let gate = gate.clone();
        tokio::spawn(async move { gate.acquire(priority).await })
    };
    let low_1 = queue(Priority::Low);
    settle().await;
    let normal = queue(Priority::Normal);
    settle().await;
    assert_eq!(gate.queued(), 2);
    // As low as the lowest waiter: no place for it.
    let refused = gate.acquire(Priority::Low).now_or_never().expect("at once");
    assert!(matches!(refused, Err(GatewayError::QueueFull { .. })));
    // A high one takes the low one's place; the low one is refused.
    let high = queue(Priority::High);
    let displaced = low_1.await.expect("task");
    assert!(matches!(displaced, Err(GatewayError::QueueFull { .. })));
    assert_eq!(gate.queued(), 2);
    // Nobody below normal waits now: another normal one is refused.
    let refused = gate
        .acquire(Priority::Normal)
        .now_or_never()
        .expect("at once");
    assert!(matches!(refused, Err(GatewayError::QueueFull { .. })));
    drop(held);
    let high = high.await.expect("task").expect("admitted first");
    assert_eq!(gate.queued(), 1);
    drop(high);
    let normal = normal.await.expect("task").expect("admitted next");
    drop(normal);
    assert_eq!((gate.in_flight(), gate.queued()), (0, 0));
}
