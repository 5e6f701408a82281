//! The subscriber against real ZMQ sockets made here on loopback: a PUB
//! publishing engine-format messages and, for replay, a ROUTER answering
//! the way the engines' replay socket does.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use radixgate_kv::subscribe::{MAX_QUEUED_VALUES, StaleReason, SubscriberConfig, Update, run};
use rmpv::Value;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

const TOPIC: &str = "kv-events";

fn stored_payload(seq: u64) -> Vec<u8> {
    batch(
        vec![stored_array(
            vec![uint(seq)],
            Value::Nil,
            &[1, 2, 3, 4],
            4,
            Value::Nil,
        )],
        Value::Nil,
    )
}

fn cleared_payload() -> Vec<u8> {
    batch(vec![cleared_array()], Value::Nil)
}

fn message(frames: Vec<Vec<u8>>) -> ZmqMessage {
    let frames: Vec<Bytes> = frames.into_iter().map(Bytes::from).collect();
    ZmqMessage::try_from(frames).expect("frames")
}

async fn publish(socket: &mut PubSocket, seq: u64, payload: Vec<u8>) {
    let frames = vec![
        TOPIC.as_bytes().to_vec(),
        seq.to_be_bytes().to_vec(),
        payload,
    ];
    socket.send(message(frames)).await.expect("publish");
}

async fn next(rx: &mut mpsc::Receiver<Update>) -> Update {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an update within 10 s")
        .expect("the subscriber is running")
}

async fn expect_batch(rx: &mut mpsc::Receiver<Update>, want: u64) {
    match next(rx).await {
        Update::Batch { seq, .. } => assert_eq!(seq, want),
        other => panic!("expected batch {want}, got {other:?}"),
    }
}

/// Publishes from `seq` on, `payload(seq)` each, until the subscriber
/// reports something (a SUB only gets what is published after its
/// subscription reached the PUB); returns the first update and the next
/// sequence to publish.
async fn publish_until_heard(
    socket: &mut PubSocket,
    rx: &mut mpsc::Receiver<Update>,
    mut seq: u64,
    payload: impl Fn(u64) -> Vec<u8>,
    buffer: Option<&Buffer>,
) -> (Update, u64) {
    for _ in 0..200 {
        if let Some(b) = buffer {
            b.lock().expect("buffer").push((seq, payload(seq)));
        }
        publish(socket, seq, payload(seq)).await;
        seq += 1;
        if let Ok(Some(u)) = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await {
            return (u, seq);
        }
    }
    panic!("the subscriber heard nothing in 200 messages");
}

async fn bind_pub(endpoint: &str) -> (PubSocket, String) {
    let mut socket = PubSocket::new();
    let bound = socket.bind(endpoint).await.expect("bind PUB");
    (socket, bound.to_string())
}

fn config(endpoint: &str) -> SubscriberConfig {
    let mut cfg = SubscriberConfig::new(endpoint, TOPIC);
    cfg.reconnect_delay = Duration::from_millis(20);
    cfg.max_reconnect_delay = Duration::from_millis(200);
    cfg
}

/// Batches sent to the caller and not yet dropped hold at most
/// `MAX_QUEUED_VALUES`, however much room the channel has: the subscriber
/// waits for the caller, as it does for a full channel.
#[tokio::test]
async fn batches_not_yet_dropped_hold_at_most_the_queued_values() {
    let (mut publisher, endpoint) = bind_pub("tcp://127.0.0.1:0").await;
    let (tx, mut rx) = mpsc::channel(64);
    let task = tokio::spawn(run(config(&endpoint), tx));
    let (_, seq) =
        publish_until_heard(&mut publisher, &mut rx, 0, |_| cleared_payload(), None).await;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {}
    // Each holds more than half of the budget.
    let half = MAX_QUEUED_VALUES / 2;
    for s in seq..seq + 3 {
        publish(&mut publisher, s, removed_of_tiny_hashes(half)).await;
    }
    let settle = || tokio::time::sleep(Duration::from_millis(700));
    settle().await;
    assert_eq!(rx.len(), 1, "one batch sent, the next waiting");
    let first = next(&mut rx).await;
    settle().await;
    assert_eq!(rx.len(), 0, "the first still held");
    drop(first);
    expect_batch(&mut rx, seq + 1).await;
    expect_batch(&mut rx, seq + 2).await;
    task.abort();
}

#[tokio::test]
async fn gaps_restarts_and_disconnects_without_replay() {
    let (mut publisher, endpoint) = bind_pub("tcp://127.0.0.1:0").await;
    let (tx, mut rx) = mpsc::channel(64);
    let task = tokio::spawn(run(config(&endpoint), tx));

    // Whatever the first sequence heard, a clear makes the stream exact.
    let (first, mut seq) =
        publish_until_heard(&mut publisher, &mut rx, 0, |_| cleared_payload(), None).await;
    assert!(matches!(first, Update::Batch { .. }), "{first:?}");
    assert!(matches!(next(&mut rx).await, Update::Live));

    publish(&mut publisher, seq, stored_payload(seq)).await;
    expect_batch(&mut rx, seq).await;
    // Skip one sequence: no replay, so the stream goes stale.
    publish(&mut publisher, seq + 2, stored_payload(seq + 2)).await;
    match next(&mut rx).await {
        Update::Stale(StaleReason::Gap { expected, got }) => {
            assert_eq!((expected, got), (seq + 1, seq + 2))
        }
        other => panic!("expected a gap, got {other:?}"),
    }
    expect_batch(&mut rx, seq + 2).await;
    seq += 3;
    // Still stale: a stored batch does not repair it, a clear does.
    publish(&mut publisher, seq, stored_payload(seq)).await;
    expect_batch(&mut rx, seq).await;
    publish(&mut publisher, seq + 1, cleared_payload()).await;
    expect_batch(&mut rx, seq + 1).await;
    assert!(matches!(next(&mut rx).await, Update::Live));

    // The publisher restarts its sequence.
    publish(&mut publisher, 0, stored_payload(0)).await;
    assert!(matches!(next(&mut rx).await, Update::Restarted));
    expect_batch(&mut rx, 0).await;

    // The publisher goes away: stale. A new one on the same port, once
    // heard with a clear, makes it live again.
    drop(publisher);
    assert!(matches!(
        next(&mut rx).await,
        Update::Stale(StaleReason::Disconnected)
    ));
    let (mut publisher, again) = bind_pub(&endpoint).await;
    assert_eq!(again, endpoint);
    let mut live = false;
    let (mut update, _) =
        publish_until_heard(&mut publisher, &mut rx, 0, |_| cleared_payload(), None).await;
    for _ in 0..10 {
        if matches!(update, Update::Live) {
            live = true;
            break;
        }
        update = next(&mut rx).await;
    }
    assert!(live, "live again after the reconnect");

    drop(rx);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the subscriber stops when its receiver is dropped")
        .expect("no panic");
}

type Buffer = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// A replay socket as the engines run it: a ROUTER that answers a start
/// sequence with every buffered batch from it on, then the end marker.
async fn replay_server(buffer: Buffer) -> String {
    let mut router = RouterSocket::new();
    let endpoint = router
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind ROUTER")
        .to_string();
    tokio::spawn(async move {
        while let Ok(request) = router.recv().await {
            let frames = request.into_vec();
            let [id, _, start] = &frames[..] else {
                continue;
            };
            let start = u64::from_be_bytes(start[..8].try_into().expect("8 bytes"));
            let batches: Vec<(u64, Vec<u8>)> = buffer
                .lock()
                .expect("buffer")
                .iter()
                .filter(|(s, _)| *s >= start)
                .cloned()
                .collect();
            for (seq, payload) in batches {
                let reply = vec![id.to_vec(), Vec::new(), seq.to_be_bytes().to_vec(), payload];
                if router.send(message(reply)).await.is_err() {
                    break;
                }
            }
            let end = vec![
                id.to_vec(),
                Vec::new(),
                (-1i64).to_be_bytes().to_vec(),
                Vec::new(),
            ];
            let _ = router.send(message(end)).await;
        }
    });
    endpoint
}

/// A subscriber with a replay socket, live on a publisher: whatever the
/// first sequence it heard, replay filled everything before it (batches
/// 0, 1, ... in order, then live). Returns the replay buffer, the
/// publisher and its endpoint, the updates, the subscriber's task and the
/// next sequence to publish.
async fn live_with_replay() -> (
    Buffer,
    PubSocket,
    String,
    mpsc::Receiver<Update>,
    tokio::task::JoinHandle<()>,
    u64,
) {
    let buffer: Buffer = Arc::default();
    let replay = replay_server(buffer.clone()).await;
    let (mut publisher, endpoint) = bind_pub("tcp://127.0.0.1:0").await;
    let (tx, mut rx) = mpsc::channel(1024);
    let mut cfg = config(&endpoint);
    cfg.replay_endpoint = Some(replay);
    let task = tokio::spawn(run(cfg, tx));
    let (first, seq) =
        publish_until_heard(&mut publisher, &mut rx, 0, stored_payload, Some(&buffer)).await;
    assert!(matches!(first, Update::Batch { seq: 0, .. }), "{first:?}");
    for want in 1..seq {
        expect_batch(&mut rx, want).await;
    }
    assert!(matches!(next(&mut rx).await, Update::Live));
    (buffer, publisher, endpoint, rx, task, seq)
}

#[tokio::test]
async fn gaps_are_filled_by_replay() {
    let (buffer, mut publisher, _, mut rx, task, mut seq) = live_with_replay().await;

    // Two batches the subscriber never sees live come back by replay.
    for s in seq..seq + 2 {
        buffer.lock().expect("buffer").push((s, stored_payload(s)));
    }
    buffer
        .lock()
        .expect("buffer")
        .push((seq + 2, stored_payload(seq + 2)));
    publish(&mut publisher, seq + 2, stored_payload(seq + 2)).await;
    for want in seq..seq + 3 {
        expect_batch(&mut rx, want).await;
    }
    seq += 3;

    // A batch the replay buffer lost: stale.
    buffer
        .lock()
        .expect("buffer")
        .push((seq + 1, stored_payload(seq + 1)));
    publish(&mut publisher, seq + 1, stored_payload(seq + 1)).await;
    match next(&mut rx).await {
        Update::Stale(StaleReason::Gap { expected, got }) => {
            assert_eq!((expected, got), (seq, seq + 1))
        }
        other => panic!("expected a gap, got {other:?}"),
    }
    expect_batch(&mut rx, seq + 1).await;
    drop(rx);
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
}

/// A publisher written by hand, byte for byte (ZMTP 3.0, NULL mechanism),
/// so that it can send what no ZMQ library would: it greets, says READY as
/// a PUB, reads what the subscriber sends (its greeting, READY and
/// subscription), then writes `then` and holds the connection open.
async fn hand_written_publisher(then: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("tcp://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move {
        let mut greeting = vec![0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3, 0];
        greeting.extend(b"NULL");
        greeting.resize(64, 0);
        let mut ready = vec![5];
        ready.extend(b"READY");
        ready.push(11);
        ready.extend(b"Socket-Type");
        ready.extend(3u32.to_be_bytes());
        ready.extend(b"PUB");
        let mut opening = greeting;
        opening.extend([0x04, ready.len() as u8]);
        opening.extend(ready);
        let mut held = Vec::new();
        // Each connection (the subscriber reconnects after a cut) gets the
        // same; the streams are kept so that only the guard ends them.
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut theirs = [0u8; 256];
            if stream.write_all(&opening).await.is_err() || stream.read(&mut theirs).await.is_err()
            {
                continue;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = stream.write_all(&then).await;
            held.push(stream);
        }
    });
    endpoint
}

/// One message frame as ZMTP writes it (`more`: frames follow).
fn zmtp_frame(more: bool, body: &[u8]) -> Vec<u8> {
    let more = u8::from(more);
    let mut out = if body.len() > 255 {
        let mut head = vec![more | 0x02];
        head.extend((body.len() as u64).to_be_bytes());
        head
    } else {
        vec![more, body.len() as u8]
    };
    out.extend(body);
    out
}

#[tokio::test]
async fn a_publisher_that_declares_a_huge_frame_is_cut_off_not_read() {
    // A whole message first (batch 0, a clear: the stream goes live), then
    // a frame whose 9-byte header declares 64 TiB. The ZMQ client alone
    // set that much aside at once, and the process aborted.
    let mut then = zmtp_frame(true, TOPIC.as_bytes());
    then.extend(zmtp_frame(true, &0u64.to_be_bytes()));
    then.extend(zmtp_frame(false, &cleared_payload()));
    then.push(0x02);
    then.extend((1u64 << 46).to_be_bytes());
    let endpoint = hand_written_publisher(then).await;
    let (tx, mut rx) = mpsc::channel(64);
    let task = tokio::spawn(run(config(&endpoint), tx));
    expect_batch(&mut rx, 0).await;
    assert!(matches!(next(&mut rx).await, Update::Live));
    match next(&mut rx).await {
        Update::Stale(StaleReason::Oversized { declared, limit }) => {
            assert_eq!(declared, 1 << 46);
            assert_eq!(limit, 64 << 20);
        }
        other => panic!("expected the frame refused, got {other:?}"),
    }
    // It reconnects, is sent the same, and says so again each time (the
    // replayed batch 0 is a restart: the publisher began again), waiting
    // twice as long each time up to the most: 40, 80, 160, 200, 200 ms
    // after the first five refusals. (It waited the base 20 ms each time,
    // for ever: the caller's WARN came ten times a second.)
    let first = std::time::Instant::now();
    let mut refused = 1;
    while refused < 6 {
        match next(&mut rx).await {
            Update::Stale(StaleReason::Oversized { .. }) => refused += 1,
            Update::Batch { .. } | Update::Live | Update::Restarted => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let waited = first.elapsed();
    assert!(
        waited >= Duration::from_millis(40 + 80 + 160 + 200 + 200),
        "five retries in {waited:?}"
    );
    drop(rx);
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
}

#[tokio::test]
async fn a_message_that_never_ends_is_cut_off_at_the_limit() {
    // Frames of 1,000 bytes, each announcing more: nothing past the limit
    // is read, whatever each frame's own length.
    let mut then = Vec::new();
    for _ in 0..200 {
        then.extend(zmtp_frame(true, &[7u8; 1_000]));
    }
    let endpoint = hand_written_publisher(then).await;
    let (tx, mut rx) = mpsc::channel(64);
    let mut cfg = config(&endpoint);
    cfg.max_message_bytes = 100_000;
    let task = tokio::spawn(run(cfg, tx));
    match next(&mut rx).await {
        Update::Stale(StaleReason::Oversized { declared, limit }) => {
            assert_eq!(limit, 100_000);
            assert_eq!(declared, 101_000, "refused at the frame that crosses it");
        }
        other => panic!("expected the message refused, got {other:?}"),
    }
    drop(rx);
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
}

/// A subscriber with a replay socket, live on a publisher, which then
/// goes away (the subscriber sees the disconnect). Returns the replay
/// buffer, the publisher's endpoint, the updates, the subscriber's task
/// and the next sequence the publisher would have sent.
async fn live_then_lost() -> (
    Buffer,
    String,
    mpsc::Receiver<Update>,
    tokio::task::JoinHandle<()>,
    u64,
) {
    let (buffer, publisher, endpoint, mut rx, task, seq) = live_with_replay().await;
    drop(publisher);
    assert!(matches!(
        next(&mut rx).await,
        Update::Stale(StaleReason::Disconnected)
    ));
    (buffer, endpoint, rx, task, seq)
}

/// An engine that restarted while the subscriber was away, and published
/// as many batches as it had before by the time the subscriber heard it
/// again, numbers them as if it went on: nothing on the wire says that
/// its cache started empty. Its replay socket does: the batch it holds
/// under the last sequence heard before is not the one heard. The
/// subscriber asks, once per reconnect, and reports the restart (its
/// blocks were kept for good before, as the new engine's).
#[tokio::test]
async fn a_restart_hidden_by_the_sequence_is_told_by_the_replay() {
    let (buffer, endpoint, mut rx, task, seq) = live_then_lost().await;
    // The engine restarts: a new publisher on the same port, a new
    // replay buffer, batches of its own under the old numbers, the first
    // `seq` of them published before the subscriber is back.
    let reborn = |s: u64| stored_payload(1_000 + s);
    {
        let mut b = buffer.lock().expect("buffer");
        b.clear();
        b.extend((0..seq).map(|s| (s, reborn(s))));
    }
    let (mut publisher, again) = bind_pub(&endpoint).await;
    assert_eq!(again, endpoint);
    let (update, _) =
        publish_until_heard(&mut publisher, &mut rx, seq, reborn, Some(&buffer)).await;
    assert!(matches!(update, Update::Restarted), "{update:?}");
    drop(rx);
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
}

/// The same engine heard again after a lost connection (a network blip)
/// is not taken for a restart: its replay socket holds the very batch
/// last heard, and the stream goes on from where it was, its gap filled.
#[tokio::test]
async fn the_same_publisher_heard_again_is_no_restart() {
    let (buffer, endpoint, mut rx, task, seq) = live_then_lost().await;
    // The same engine, its buffer as it was, going on from `seq`.
    let (mut publisher, again) = bind_pub(&endpoint).await;
    assert_eq!(again, endpoint);
    let (update, _) =
        publish_until_heard(&mut publisher, &mut rx, seq, stored_payload, Some(&buffer)).await;
    assert!(
        matches!(update, Update::Batch { seq: s, .. } if s == seq),
        "{update:?}"
    );
    drop(rx);
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
}

/// A batch heard twice (the same sequence and the same payload, e.g. a
/// publisher that re-sends its last batch) is the same batch, not a
/// restart: it is skipped, the worker keeps its blocks and the stream
/// stays live. A different payload under that sequence is a restart.
#[tokio::test]
async fn a_batch_heard_twice_is_no_restart() {
    let (mut publisher, endpoint) = bind_pub("tcp://127.0.0.1:0").await;
    let (tx, mut rx) = mpsc::channel(64);
    let task = tokio::spawn(run(config(&endpoint), tx));
    let (_, seq) =
        publish_until_heard(&mut publisher, &mut rx, 0, |_| cleared_payload(), None).await;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {}

    publish(&mut publisher, seq, stored_payload(seq)).await;
    expect_batch(&mut rx, seq).await;
    publish(&mut publisher, seq, stored_payload(seq)).await;
    publish(&mut publisher, seq + 1, stored_payload(seq + 1)).await;
    expect_batch(&mut rx, seq + 1).await;

    // Under the same sequence, another batch: a new publisher's.
    publish(&mut publisher, seq + 1, stored_payload(seq + 2)).await;
    let update = next(&mut rx).await;
    assert!(matches!(update, Update::Restarted), "{update:?}");
    drop(rx);
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
}
