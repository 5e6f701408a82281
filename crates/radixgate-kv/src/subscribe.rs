//! An async subscriber to one engine's KV-event publisher.
//!
//! [`run`] owns a SUB socket (the pure-Rust `zeromq` crate, on tokio)
//! connected to the publisher, and reports to its caller through a channel:
//! [`Update::Batch`] for each decoded batch in sequence order, and the
//! stream's standing as [`Update::Live`] / [`Update::Stale`] transitions, plus
//! [`Update::Restarted`] when the publisher started over.
//!
//! **Exactness.** The worker's index is exact when every batch since a
//! known-empty cache was applied. The subscriber knows that in three ways:
//! it saw sequence 0 (the publisher's start, directly or by replay); a
//! batch carried `AllBlocksCleared`; or it was exact and no sequence was
//! missed since. Until then it reports nothing but batches: the caller
//! starts every worker as stale and waits for `Live`.
//!
//! **Gaps.** A sequence above the next expected one is a gap. With a replay
//! endpoint, a DEALER socket asks for the missing sequences (the engines'
//! ROUTER streams every buffered batch from the one asked for, then the
//! end marker; see [`crate::wire`]), and the gap is filled when they all
//! come back in order within the timeout. Otherwise the stream is stale
//! (the batches go on being delivered, so the caller may keep an
//! approximate index) until exactness returns.
//!
//! **Duplicates.** The batch last heard, heard again (the same sequence,
//! payload and stream id), is skipped: it was delivered already.
//!
//! **Restarts.** Any other sequence below the expected one, or a new
//! publisher stream id, means the publisher restarted: `Restarted` tells
//! the caller to drop the worker's blocks, and the new stream is exact
//! from its sequence 0 on. A publisher that restarted while the connection
//! was down may be heard again at a sequence that looks like a
//! continuation; with a replay
//! endpoint, the first message after each reconnect is checked against
//! it: a replay socket holding another batch than the last one heard
//! under that sequence is a new publisher's.
//!
//! **Disconnects.** The socket monitor's `Disconnected`, or a failed
//! receive, makes a live stream stale and starts reconnecting with a
//! doubling delay; after a reconnect, the next sequence decides (nothing
//! missed: live again; a gap: as above). The delay starts again from its
//! base only after a connection that delivered a message and was not cut
//! off for a frame over the size limit: a publisher that sends one too
//! large each time, or a peer that accepts and drops, was dialled again
//! every base delay for ever, each time a WARN.
//!
//! Limits of the protocol, not of this code: joining a publisher that has
//! run longer than its replay buffer leaves the stream stale until the
//! engine clears its cache or restarts (what it held before cannot be
//! learned; vLLM's newer snapshot endpoint could, and is not read here);
//! and a restart whose first heard sequence is not below the expected one,
//! from a publisher without stream ids or a replay socket, cannot be told
//! from continuity.
//!
//! **Memory.** A batch holds its block hashes and token ids until the
//! caller has applied it and dropped its [`Update::Batch`]. However many
//! batches the channel has room for, those not yet dropped hold at most
//! [`MAX_QUEUED_VALUES`] of them: the subscriber waits (reading nothing
//! more from its socket) until the caller catches up, as it does when the
//! channel is full.
//!
//! The task ends when the caller drops the receiving side of the channel.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{Semaphore, mpsc};
use zeromq::{
    DealerSocket, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage,
};

use crate::error::WireError;
use crate::event::{EventBatch, KvEvent};
use crate::guard::{Guarded, Unopened};
use crate::keys::digest_bytes;
use crate::wire::{ReplayReply, replay_request, split_message, split_replay_reply};

/// Where and how to subscribe.
#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    /// The publisher's endpoint, e.g. `tcp://10.0.0.5:5557`.
    pub endpoint: String,
    /// The topic prefix to subscribe to (the engines' default is empty).
    pub topic: String,
    /// The publisher's replay endpoint, when it has one.
    pub replay_endpoint: Option<String>,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// The first delay between reconnection attempts; it doubles up to
    /// `max_reconnect_delay`.
    pub reconnect_delay: Duration,
    /// The longest delay between reconnection attempts.
    pub max_reconnect_delay: Duration,
    /// How long a replay may wait for each reply.
    pub replay_timeout: Duration,
    /// The longest frame, and message, the publisher may send; one
    /// declared longer ends the connection ([`StaleReason::Oversized`]).
    pub max_message_bytes: u64,
}

/// [`SubscriberConfig::max_message_bytes`]'s default: 64 MiB, where an
/// engine's batch of a million-token prompt's blocks is a few MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 64 << 20;

impl SubscriberConfig {
    /// A configuration with the default timings for `endpoint` and `topic`.
    pub fn new(endpoint: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            topic: topic.into(),
            replay_endpoint: None,
            connect_timeout: Duration::from_secs(2),
            reconnect_delay: Duration::from_millis(100),
            max_reconnect_delay: Duration::from_secs(5),
            replay_timeout: Duration::from_secs(1),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

/// The most block hashes and token ids (with one per event) that one
/// subscriber's batches hold between their decoding and their drop by the
/// caller: 32 MiB of hashes, or two batches of a million-token prompt at
/// one token per block. Without it, a channel of `n` batches could hold
/// `n` times the largest batch a payload decodes to
/// ([`crate::wire::MAX_PAYLOAD_VALUES`]): with the gateway's 1,024, 32 GiB
/// for one worker that floods.
pub const MAX_QUEUED_VALUES: usize = 1 << 22;

/// A batch's share of [`MAX_QUEUED_VALUES`], given back when it is dropped.
#[derive(Debug)]
pub struct Queued {
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// What the subscriber reports.
#[derive(Debug)]
pub enum Update {
    /// A decoded batch, in sequence order.
    Batch {
        /// Its sequence number.
        seq: u64,
        /// The batch.
        batch: EventBatch,
        /// Its share of the queued values, held until this is dropped.
        queued: Queued,
    },
    /// The index fed by this stream is exact from here on.
    Live,
    /// The index fed by this stream is no longer exact.
    Stale(StaleReason),
    /// The publisher restarted: drop the worker's blocks before applying
    /// what follows.
    Restarted,
}

/// Why a stream went stale.
#[derive(Debug)]
pub enum StaleReason {
    /// The connection was lost or could not be made.
    Disconnected,
    /// Sequences were missed and no replay filled them.
    Gap {
        /// The sequence expected.
        expected: u64,
        /// The sequence received.
        got: u64,
    },
    /// A message could not be decoded.
    Decode(WireError),
    /// The publisher declared a frame or message longer than
    /// [`SubscriberConfig::max_message_bytes`]; the connection was ended
    /// before any of it was read.
    Oversized {
        /// The length it declared.
        declared: u64,
        /// The limit.
        limit: u64,
    },
    /// No directory would take the size guard's local socket
    /// (`$XDG_RUNTIME_DIR`, `$TMPDIR` or `/tmp`, `/dev/shm`): not
    /// subscribed.
    NoLocalSocket,
}

struct State {
    /// The values of the batches sent and not yet dropped
    /// ([`MAX_QUEUED_VALUES`]).
    queued: Arc<Semaphore>,
    /// The next sequence wanted; `None` before the first message of a
    /// publisher lifetime.
    expected: Option<u64>,
    stream_id: Option<[u8; 16]>,
    /// Every batch since a known-empty cache was delivered.
    exact: bool,
    /// `Live` was the last standing reported.
    live: bool,
    /// The last published message heard: its sequence and a digest of its
    /// payload, which the same publisher's replay socket holds under it.
    last: Option<(u64, u64)>,
    /// A connection ended since the last message: its publisher may have
    /// restarted meanwhile.
    reconnected: bool,
}

impl Default for State {
    fn default() -> Self {
        Self {
            queued: Arc::new(Semaphore::new(MAX_QUEUED_VALUES)),
            expected: None,
            stream_id: None,
            exact: false,
            live: false,
            last: None,
            reconnected: false,
        }
    }
}

/// The receiver is gone: stop.
struct Closed;

impl State {
    async fn send(tx: &mpsc::Sender<Update>, update: Update) -> Result<(), Closed> {
        tx.send(update).await.map_err(|_| Closed)
    }

    async fn lose(
        &mut self,
        tx: &mpsc::Sender<Update>,
        exactness: bool,
        why: StaleReason,
    ) -> Result<(), Closed> {
        if exactness {
            self.exact = false;
        }
        if self.live {
            self.live = false;
            Self::send(tx, Update::Stale(why)).await?;
        }
        Ok(())
    }

    /// The publisher sent what the subscriber refuses to read: said every
    /// time, live or not, since it never becomes live that way.
    async fn refuse(&mut self, tx: &mpsc::Sender<Update>, why: StaleReason) -> Result<(), Closed> {
        self.live = false;
        Self::send(tx, Update::Stale(why)).await
    }

    async fn deliver(
        &mut self,
        tx: &mpsc::Sender<Update>,
        seq: u64,
        batch: EventBatch,
    ) -> Result<(), Closed> {
        if batch.events.iter().any(|e| matches!(e, KvEvent::Cleared)) {
            self.exact = true;
        }
        self.expected = Some(seq.wrapping_add(1));
        let values = batch.values().min(MAX_QUEUED_VALUES);
        let permit = self
            .queued
            .clone()
            .acquire_many_owned(u32::try_from(values).unwrap_or(u32::MAX))
            .await
            .map_err(|_| Closed)?;
        let queued = Queued { _permit: permit };
        Self::send(tx, Update::Batch { seq, batch, queued }).await
    }

    async fn on_message(
        &mut self,
        cfg: &SubscriberConfig,
        tx: &mpsc::Sender<Update>,
        frames: Vec<Bytes>,
    ) -> Result<(), Closed> {
        let message = match split_message(&frames) {
            Ok(m) => m,
            Err(e) => return self.lose(tx, true, StaleReason::Decode(e)).await,
        };
        let digest = digest_bytes(message.payload);
        if self.last == Some((message.seq, digest)) && message.stream_id == self.stream_id {
            // The batch last heard, heard again: already delivered.
            return Ok(());
        }
        let mut restarted = match (self.expected, message.stream_id, self.stream_id) {
            (_, Some(new), Some(old)) if new != old => true,
            (Some(expected), ..) => message.seq < expected,
            _ => false,
        };
        // Heard again after a reconnect, at a sequence that looks like a
        // continuation: the replay socket says whose it is.
        if std::mem::take(&mut self.reconnected)
            && !restarted
            && message.stream_id.is_none()
            && let Some(endpoint) = &cfg.replay_endpoint
            && self.holds_last(cfg, endpoint).await == Some(false)
        {
            restarted = true;
        }
        self.stream_id = message.stream_id;
        if restarted {
            self.expected = None;
            self.exact = false;
            Self::send(tx, Update::Restarted).await?;
        }
        let want = self.expected.unwrap_or(0);
        if self.expected.is_none() && message.seq == 0 {
            // The publisher's first batch: its cache was empty before it.
            self.exact = true;
        }
        if message.seq > want {
            let filled = match &cfg.replay_endpoint {
                Some(endpoint) => self.replay(cfg, endpoint, want, message.seq, tx).await?,
                None => false,
            };
            if !filled {
                let gap = StaleReason::Gap {
                    expected: self.expected.unwrap_or(want),
                    got: message.seq,
                };
                self.lose(tx, true, gap).await?;
            }
        }
        match message.decode() {
            Ok(batch) => self.deliver(tx, message.seq, batch).await?,
            Err(e) => {
                self.expected = Some(message.seq.wrapping_add(1));
                self.lose(tx, true, StaleReason::Decode(e)).await?;
            }
        }
        self.last = Some((message.seq, digest));
        if self.exact && !self.live {
            self.live = true;
            Self::send(tx, Update::Live).await?;
        }
        Ok(())
    }

    /// Whether the replay socket holds the last message heard under its
    /// sequence: `Some(false)` when it holds another batch there (the
    /// publisher restarted), `None` when it cannot say.
    async fn holds_last(&self, cfg: &SubscriberConfig, endpoint: &str) -> Option<bool> {
        let (seq, digest) = self.last?;
        let (mut socket, _guarded) = ask_replay(cfg, endpoint, seq).await?;
        let reply = tokio::time::timeout(cfg.replay_timeout, socket.recv())
            .await
            .ok()?
            .ok()?
            .into_vec();
        match split_replay_reply(&reply).ok()? {
            ReplayReply::Batch { seq: at, payload } if at == seq => {
                Some(digest_bytes(payload) == digest)
            }
            _ => None,
        }
    }

    /// Asks the replay socket for `from..until` and delivers what comes
    /// back in order; true when all of it came.
    async fn replay(
        &mut self,
        cfg: &SubscriberConfig,
        endpoint: &str,
        from: u64,
        until: u64,
        tx: &mpsc::Sender<Update>,
    ) -> Result<bool, Closed> {
        // Exactness through a replay needs the stream before it exact, or
        // the replay to start at the publisher's first batch.
        let was_exact = self.exact || (self.expected.is_none() && from == 0);
        let Some((mut socket, _guarded)) = ask_replay(cfg, endpoint, from).await else {
            return Ok(false);
        };
        let mut next = from;
        while next < until {
            let reply = match tokio::time::timeout(cfg.replay_timeout, socket.recv()).await {
                Ok(Ok(reply)) => reply.into_vec(),
                _ => return Ok(false),
            };
            let (seq, payload) = match split_replay_reply(&reply) {
                Ok(ReplayReply::Batch { seq, payload }) => (seq, payload),
                Ok(ReplayReply::End) | Err(_) => return Ok(false),
            };
            if seq < next {
                continue;
            }
            if seq > next {
                // The publisher's buffer no longer holds `next`.
                return Ok(false);
            }
            let Ok(batch) = crate::wire::decode_payload(payload) else {
                return Ok(false);
            };
            self.deliver(tx, seq, batch).await?;
            next += 1;
        }
        if was_exact {
            self.exact = true;
        }
        Ok(true)
    }
}

/// A DEALER connected (through the size guard) to the replay socket at
/// `endpoint` that asked for every batch from `from` on.
async fn ask_replay(
    cfg: &SubscriberConfig,
    endpoint: &str,
    from: u64,
) -> Option<(DealerSocket, Guarded)> {
    let guarded = Guarded::open(endpoint, cfg.connect_timeout, cfg.max_message_bytes)
        .await
        .ok()?;
    let mut socket = DealerSocket::with_options(options(cfg));
    let connected =
        tokio::time::timeout(cfg.connect_timeout, socket.connect(guarded.endpoint())).await;
    if !matches!(connected, Ok(Ok(()))) {
        return None;
    }
    let request = vec![Bytes::new(), Bytes::copy_from_slice(&replay_request(from))];
    let request = ZmqMessage::try_from(request).ok()?;
    socket.send(request).await.ok()?;
    Some((socket, guarded))
}

fn options(cfg: &SubscriberConfig) -> SocketOptions {
    let mut options = SocketOptions::default();
    options.connect_timeout(cfg.connect_timeout);
    options
}

/// Subscribes to `cfg.endpoint` and reports through `tx` until `tx`'s
/// receiver is dropped. See the module docs.
pub async fn run(cfg: SubscriberConfig, tx: mpsc::Sender<Update>) {
    let mut state = State::default();
    let mut delay = cfg.reconnect_delay;
    loop {
        if tx.is_closed() {
            return;
        }
        let guarded =
            Guarded::open(&cfg.endpoint, cfg.connect_timeout, cfg.max_message_bytes).await;
        let mut socket = SubSocket::with_options(options(&cfg));
        let mut monitor = socket.monitor();
        let subscribed = socket.subscribe(&cfg.topic).await.is_ok();
        let connected = match &guarded {
            Ok(guarded) if subscribed => matches!(
                tokio::time::timeout(cfg.connect_timeout, socket.connect(guarded.endpoint())).await,
                Ok(Ok(()))
            ),
            _ => false,
        };
        // Whether this connection delivered anything: only then (and not
        // cut off for a frame over the limit) does the next attempt start
        // again at the base delay.
        let mut heard = false;
        if connected {
            loop {
                tokio::select! {
                    message = socket.recv() => match message {
                        Ok(m) => {
                            heard = true;
                            if state.on_message(&cfg, &tx, m.into_vec()).await.is_err() {
                                return;
                            }
                        }
                        Err(_) => break,
                    },
                    event = monitor.next() => match event {
                        Some(SocketEvent::Disconnected(_)) | None => break,
                        Some(_) => {}
                    },
                    () = tx.closed() => return,
                }
            }
            state.reconnected = true;
        }
        let cut_off = matches!(guarded.as_ref().map(Guarded::oversized), Ok(Some(_)));
        let lost = match guarded.as_ref().map(Guarded::oversized) {
            Ok(Some(declared)) => {
                let why = StaleReason::Oversized {
                    declared,
                    limit: cfg.max_message_bytes,
                };
                state.refuse(&tx, why).await
            }
            Err(Unopened::NoLocalSocket) => state.refuse(&tx, StaleReason::NoLocalSocket).await,
            Ok(None) | Err(Unopened::Unreachable) => {
                state.lose(&tx, false, StaleReason::Disconnected).await
            }
        };
        if lost.is_err() {
            return;
        }
        drop(socket);
        drop(guarded);
        if heard && !cut_off {
            delay = cfg.reconnect_delay;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = tx.closed() => return,
        }
        delay = (delay * 2).min(cfg.max_reconnect_delay);
    }
}
