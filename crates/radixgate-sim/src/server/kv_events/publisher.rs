//! The publisher: an engine-side sink and the task that owns the sockets.
//!
//! Cost to the engine loop: [`EventSink::send`] numbers a batch and
//! `try_send`s it on a bounded channel; encoding and socket writes happen in
//! the publisher task. When the channel is full the batch is dropped and
//! counted, and its number is spent anyway, so subscribers see a sequence
//! gap rather than contiguous numbers over lost events.
//!
//! Sequence numbers: a batch's sequence is its number minus the number the
//! publisher instance started from (0 for the first; the next batch's for
//! one restarted by the fault), so they count from 0 like a fresh engine's
//! publisher (a `count()` per publisher in vLLM and SGLang), and any batch
//! lost before the socket (queue overflow) leaves a hole.
//!
//! Replay (vLLM's and SGLang's `_service_replay`): the ROUTER socket takes
//! `[identity, empty delimiter, start]` as a REQ client sends it (we also
//! take `[identity, start]` from a DEALER that sends no delimiter), where
//! `start` is a big-endian integer (8 bytes from the engines' clients). It
//! answers `[identity, delimiter, sequence (8 bytes BE), payload]` for each
//! buffered batch with sequence >= start, oldest first, then `[identity,
//! delimiter, -1 (8 bytes BE, signed), empty]`; the client sees `[seq,
//! payload]` frames after its socket strips the envelope. A start frame
//! longer than 8 bytes gets only the end marker. The buffer keeps the
//! last `replay_batches` batches, including batches withheld from PUB by
//! the drop fault.
//!
//! Faults (from the worker's knobs, on every change): `kv_events_stopped`
//! closes both sockets and discards batches (counted) until cleared, then
//! binds the same endpoints again as a new publisher: sequence from 0,
//! empty replay buffer, as a restarted engine's would be.
//! `kv_events_drop: N` withholds the next N batches from PUB, keeping them
//! for replay: a gap a subscriber can repair. `kv_events_frozen` discards
//! batches (counted as stopped ones) with the sockets open: nothing tells
//! a subscriber, as when an engine's publishing thread hangs.
//!
//! Concurrency: one task owns both sockets; the engine task talks to it
//! only through the channel; counters are atomics read by `/metrics`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::encode::{Format, encode_batch};
use super::{KvEventsConfig, parse_endpoint};
use crate::engine::CacheEvent;
use crate::error::SimError;
use crate::server::faults::KvEventsFaults;

/// The replay end marker: -1 as 8 bytes big-endian.
const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Counters of one publisher, for `/metrics` and tests.
#[derive(Debug, Default)]
pub(crate) struct PublisherStats {
    /// Batches sent on the PUB socket.
    pub(crate) published: AtomicU64,
    /// Batches dropped because the queue to the publisher was full.
    pub(crate) dropped_overflow: AtomicU64,
    /// Batches discarded while the publisher was stopped (fault).
    pub(crate) dropped_stopped: AtomicU64,
    /// Batches withheld from PUB by the drop fault (kept for replay).
    pub(crate) withheld: AtomicU64,
    /// Replay requests answered.
    pub(crate) replays: AtomicU64,
    /// The PUB and replay endpoints as bound (ports resolved).
    pub(crate) bound: Mutex<(Option<String>, Option<String>)>,
}

/// A snapshot of a publisher's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvEventsCounters {
    /// Batches sent on the PUB socket.
    pub published: u64,
    /// Batches dropped because the queue to the publisher was full (each
    /// leaves a sequence gap).
    pub dropped_overflow: u64,
    /// Batches discarded while the publisher was stopped (fault).
    pub dropped_stopped: u64,
    /// Batches withheld from PUB by the drop fault (kept for replay).
    pub withheld: u64,
    /// Replay requests answered.
    pub replays: u64,
}

impl PublisherStats {
    /// The counters now.
    pub(crate) fn counters(&self) -> KvEventsCounters {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        KvEventsCounters {
            published: get(&self.published),
            dropped_overflow: get(&self.dropped_overflow),
            dropped_stopped: get(&self.dropped_stopped),
            withheld: get(&self.withheld),
            replays: get(&self.replays),
        }
    }
}

/// One engine step's events, numbered by the sink.
#[derive(Debug)]
struct Batch {
    number: u64,
    ts: f64,
    events: Vec<CacheEvent>,
}

/// The engine task's end: hands batches to the publisher without waiting.
#[derive(Debug)]
pub(crate) struct EventSink {
    tx: mpsc::Sender<Batch>,
    next: u64,
    stats: Arc<PublisherStats>,
}

impl EventSink {
    /// Queues `events` as one batch (nothing when empty). Never waits: a
    /// full queue drops the batch, counts it and spends its number.
    pub(crate) fn send(&mut self, events: Vec<CacheEvent>) {
        if events.is_empty() {
            return;
        }
        let number = self.next;
        self.next += 1;
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        if let Err(mpsc::error::TrySendError::Full(_)) =
            self.tx.try_send(Batch { number, ts, events })
        {
            self.stats.dropped_overflow.fetch_add(1, Ordering::Relaxed);
        }
        // Closed: the publisher has shut down with the worker; nothing to
        // count.
    }
}

/// A running publisher: its stats and its task.
#[derive(Debug)]
pub(crate) struct Publisher {
    pub(crate) stats: Arc<PublisherStats>,
}

struct Sockets {
    publish: PubSocket,
    replay: Option<RouterSocket>,
}

/// The publisher task's state.
struct Task {
    config: KvEventsConfig,
    format: Format,
    topic: Bytes,
    stats: Arc<PublisherStats>,
    /// Endpoints to bind: as configured first, then as first bound (so a
    /// restart after binding port 0 comes back on the same port).
    publish_at: String,
    replay_at: Option<String>,
    sockets: Option<Sockets>,
    /// The number of the first batch of this publisher instance.
    base: Option<u64>,
    buffer: VecDeque<(u64, Bytes)>,
    withhold: u32,
    frozen: bool,
}

impl Publisher {
    /// Binds the sockets (unless the `stopped` fault is on) and starts the
    /// task; returns the publisher and the engine's sink. Fails when an
    /// endpoint cannot be bound.
    pub(crate) async fn start(
        config: &KvEventsConfig,
        block_size: usize,
        mut faults: watch::Receiver<KvEventsFaults>,
        shutdown: CancellationToken,
    ) -> Result<(Self, EventSink), SimError> {
        config.validate()?;
        let endpoint = |what: &str, ep: &str| -> Result<String, SimError> {
            let (host, port) = parse_endpoint(what, ep)?;
            Ok(format!("tcp://{host}:{port}"))
        };
        let stats = Arc::new(PublisherStats::default());
        let knobs = *faults.borrow_and_update();
        let mut task = Task {
            format: Format {
                shape: config.shape,
                hash: config.hash,
                block_size,
                data_parallel_rank: config.data_parallel_rank,
            },
            topic: Bytes::from(config.topic.clone().into_bytes()),
            stats: stats.clone(),
            publish_at: endpoint("kv_events.endpoint", &config.endpoint)?,
            replay_at: (!config.replay_endpoint.is_empty())
                .then(|| endpoint("kv_events.replay_endpoint", &config.replay_endpoint))
                .transpose()?,
            sockets: None,
            // The first instance counts from number 0, so a batch lost to
            // overflow before the first one published is a gap too.
            base: Some(0),
            buffer: VecDeque::new(),
            withhold: knobs.drop,
            frozen: knobs.frozen,
            config: config.clone(),
        };
        if !knobs.stopped {
            task.open().await?;
        }
        let (tx, rx) = mpsc::channel(config.queue_batches);
        tokio::spawn(task.run(rx, faults, shutdown));
        let sink = EventSink {
            tx,
            next: 0,
            stats: stats.clone(),
        };
        Ok((Self { stats }, sink))
    }
}

impl Task {
    /// Binds both sockets as a new publisher instance.
    async fn open(&mut self) -> Result<(), SimError> {
        let bind_err = |what: &str, ep: &str, e: zeromq::ZmqError| {
            SimError::Config(format!("cannot bind {what} {ep}: {e}"))
        };
        let mut publish = PubSocket::new();
        let bound = publish
            .bind(&self.publish_at)
            .await
            .map_err(|e| bind_err("kv_events.endpoint", &self.publish_at, e))?;
        self.publish_at = bound.to_string();
        let replay = match &self.replay_at {
            Some(at) => {
                let mut r = RouterSocket::new();
                let bound = r
                    .bind(at)
                    .await
                    .map_err(|e| bind_err("kv_events.replay_endpoint", at, e))?;
                self.replay_at = Some(bound.to_string());
                Some(r)
            }
            None => None,
        };
        *self.stats.bound.lock() = (Some(self.publish_at.clone()), self.replay_at.clone());
        self.sockets = Some(Sockets { publish, replay });
        Ok(())
    }

    /// Opens the sockets as a new instance: sequence from the next batch,
    /// nothing to replay.
    async fn restart(&mut self) -> Result<(), SimError> {
        self.base = None;
        self.buffer.clear();
        self.open().await
    }

    async fn close(&mut self) {
        if let Some(s) = self.sockets.take() {
            let _ = s.publish.close().await;
            if let Some(r) = s.replay {
                let _ = r.close().await;
            }
        }
        *self.stats.bound.lock() = (None, None);
    }

    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Batch>,
        mut faults: watch::Receiver<KvEventsFaults>,
        shutdown: CancellationToken,
    ) {
        loop {
            let replay = self.sockets.as_mut().and_then(|s| s.replay.as_mut());
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                changed = faults.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let knobs = *faults.borrow_and_update();
                    self.follow(knobs).await;
                }
                batch = rx.recv() => match batch {
                    Some(b) => self.publish(b).await,
                    None => break,
                },
                request = recv_or_pending(replay) => {
                    if let Ok(m) = request {
                        self.answer_replay(m).await;
                    }
                }
            }
        }
        self.close().await;
    }

    /// Applies changed fault knobs.
    async fn follow(&mut self, knobs: KvEventsFaults) {
        self.withhold = knobs.drop;
        self.frozen = knobs.frozen;
        match (knobs.stopped, self.sockets.is_some()) {
            (true, true) => {
                self.close().await;
                tracing::info!("kv events: publisher stopped (fault)");
            }
            (false, false) => match self.restart().await {
                Ok(()) => {
                    tracing::info!(endpoint = %self.publish_at, "kv events: publisher restarted")
                }
                Err(e) => tracing::warn!(error = %e, "kv events: publisher restart failed"),
            },
            _ => {}
        }
    }

    async fn publish(&mut self, batch: Batch) {
        let Some(sockets) = self.sockets.as_mut().filter(|_| !self.frozen) else {
            self.stats.dropped_stopped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let base = *self.base.get_or_insert(batch.number);
        let seq = batch.number - base;
        let payload = Bytes::from(encode_batch(&self.format, batch.ts, &batch.events));
        if self.withhold > 0 {
            self.withhold -= 1;
            self.stats.withheld.fetch_add(1, Ordering::Relaxed);
        } else {
            let frames = vec![
                self.topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload.clone(),
            ];
            let msg = ZmqMessage::try_from(frames).expect("three frames");
            match sockets.publish.send(msg).await {
                Ok(()) => {
                    self.stats.published.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => tracing::warn!(error = %e, seq, "kv events: publish failed"),
            }
        }
        if self.replay_at.is_some() {
            if self.buffer.len() == self.config.replay_batches {
                self.buffer.pop_front();
            }
            self.buffer.push_back((seq, payload));
        }
    }

    async fn answer_replay(&mut self, request: ZmqMessage) {
        let Some(router) = self.sockets.as_mut().and_then(|s| s.replay.as_mut()) else {
            return;
        };
        let mut frames = request.into_vecdeque();
        let Some(identity) = frames.pop_front() else {
            return;
        };
        // REQ clients put an empty delimiter before the body; answer in the
        // same envelope.
        let delimited = frames.len() == 2 && frames[0].is_empty();
        let start = match (frames.len(), delimited) {
            (2, true) => frames.get(1),
            (1, _) => frames.front(),
            _ => None,
        }
        .and_then(|f| (f.len() <= 8).then(|| f.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b))));
        let envelope = |rest: [Bytes; 2]| {
            let mut v = vec![identity.clone()];
            if delimited {
                v.push(Bytes::new());
            }
            v.extend(rest);
            ZmqMessage::try_from(v).expect("non-empty")
        };
        if let Some(start) = start {
            for (seq, payload) in self.buffer.iter().filter(|(s, _)| *s >= start) {
                let m = envelope([Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()]);
                if router.send(m).await.is_err() {
                    return; // the client went away
                }
            }
        } else {
            tracing::warn!(
                frames = frames.len() + 1,
                "kv events: malformed replay request"
            );
        }
        let _ = router
            .send(envelope([Bytes::from_static(&END_SEQ), Bytes::new()]))
            .await;
        self.stats.replays.fetch_add(1, Ordering::Relaxed);
    }
}

async fn recv_or_pending(socket: Option<&mut RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match socket {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_event() -> Vec<CacheEvent> {
        vec![CacheEvent::Removed { hashes: vec![1] }]
    }

    /// A full queue drops the batch, counts it, and spends its number, so
    /// the sequence the publisher derives from numbers shows the gap.
    #[tokio::test]
    async fn overflow_drops_count_and_leave_a_numbering_gap() {
        let (tx, mut rx) = mpsc::channel(2);
        let stats = Arc::new(PublisherStats::default());
        let mut sink = EventSink {
            tx,
            next: 0,
            stats: stats.clone(),
        };
        sink.send(Vec::new());
        for _ in 0..4 {
            sink.send(one_event());
        }
        assert_eq!(stats.counters().dropped_overflow, 2);
        assert_eq!(
            rx.recv().await.unwrap().number,
            0,
            "empty batches are not sent"
        );
        assert_eq!(rx.recv().await.unwrap().number, 1);
        sink.send(one_event());
        assert_eq!(
            rx.recv().await.unwrap().number,
            4,
            "numbers 2 and 3 were spent"
        );
    }
}
