//! The publisher: a queued decision goes out at once as an insert batch
//! (or a few, each under [`MAX_BATCH_BYTES`] and the server's
//! `max_payload`) unless the last batch went
//! under `batch_ms` ago; then it waits until `batch_ms` after that one,
//! with whatever else comes meanwhile. The last batch carries this
//! replica's loads as they are then, and the first tokens waiting (else
//! the load lane sends them). It wakes only for these, and for a
//! reconnect: an idle replica's publisher does not run at all. Load
//! reports on their own (the refresh, a fall at a request's end) are the
//! load lane's ([`super::lane`]).
//!
//! A batch is kept until it comes back from the stream (the insert feed
//! delivers this replica's own batches too, [`Delivery`]): one written
//! into a connection that died before the client noticed (up to two
//! missed pings, 10-15 s) is lost with it, and so is one the client was
//! never handed while it knew it was disconnected. At every reconnect
//! what was not seen back goes again, in order, so the peers learn what
//! this replica routed while it was cut off. They apply an entry once
//! (`receive::Seen`), so a batch that had reached the stream after all
//! costs nothing but its bytes. At most [`MAX_UNCONFIRMED_BYTES`] are
//! kept; a batch never handed to the client that falls out of it is
//! counted dropped (`disconnected`). Over core NATS (no stream) nothing
//! comes back: what is handed over is not kept, what waited for a
//! reconnect goes once.

use super::dict::Outgoing;
use super::lane::Shared;
use super::wire::{self, FirstToken, Inserts, WireEntry, WorkerLoad};
use super::{Handed, Identity, Routed, SyncMetrics, hand_over};
use crate::config::SyncConfig;
use async_nats::Client;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Largest insert batch payload, unless the server's `max_payload` (1 MiB
/// unless configured) is smaller: NATS refuses a payload over it.
const MAX_BATCH_BYTES: usize = 512 << 10;

/// The most bytes of insert batches kept until they are seen back from
/// the stream: a 10-15 s cut at a few long-prompt decisions a second is a
/// few MiB.
pub(super) const MAX_UNCONFIRMED_BYTES: usize = 16 << 20;

/// What the insert feed tells the publisher: how far this replica's own
/// batches have come back from the stream, and whether they will.
#[derive(Debug, Default)]
pub(super) struct Delivery {
    /// The number of the last own batch seen back.
    stored: AtomicU64,
    /// The feed reads the stream (else core NATS, which sends nothing
    /// back to its sender).
    on_stream: AtomicBool,
}

impl Delivery {
    /// An own batch came back from the stream: it, and every batch before
    /// it, is stored.
    pub(super) fn seen_back(&self, seq: u64) {
        self.stored.fetch_max(seq, Ordering::AcqRel);
    }

    /// The feed switched to the stream (`true`) or to core NATS.
    pub(super) fn on_stream(&self, on: bool) {
        self.on_stream.store(on, Ordering::Release);
    }

    fn stored(&self) -> u64 {
        self.stored.load(Ordering::Acquire)
    }

    fn coming_back(&self) -> bool {
        self.on_stream.load(Ordering::Acquire)
    }
}

/// An insert batch not known to be stored.
#[derive(Debug)]
struct Kept {
    seq: u64,
    payload: Bytes,
    entries: u64,
    /// When it was made: one older than the stream keeps history is not
    /// sent again (a starting replica would not replay it either).
    made: Instant,
    /// Handed to the client once (else it waited for a connection).
    handed: bool,
}

/// Insert batches not yet seen back from the stream, oldest first.
#[derive(Debug, Default)]
struct Unconfirmed {
    batches: VecDeque<Kept>,
    bytes: usize,
}

impl Unconfirmed {
    fn keep(&mut self, batch: Kept, metrics: &SyncMetrics) {
        self.bytes += batch.payload.len();
        self.batches.push_back(batch);
        // What is kept before each oldest one goes.
        let mut bytes = self.bytes;
        self.forget_oldest(metrics, |b| {
            let over = bytes > MAX_UNCONFIRMED_BYTES;
            bytes -= b.payload.len();
            over
        });
    }

    /// Forgets the batches made before `since`.
    fn stale(&mut self, since: Instant, metrics: &SyncMetrics) {
        self.forget_oldest(metrics, |b| b.made < since);
    }

    /// Forgets the oldest batches numbered `stored` or less that were
    /// handed over (the stream keeps one connection's batches in order).
    /// One never handed over is not stored, whatever came back after it:
    /// after a reconnect a new batch can go, and come back, before those
    /// kept meanwhile are sent again; it and those after it stay until it
    /// is sent (some then go twice; receivers apply an entry once).
    fn confirmed(&mut self, stored: u64, metrics: &SyncMetrics) {
        self.forget_oldest(metrics, |b| b.handed && b.seq <= stored);
    }

    /// Forgets the oldest batches while `old` says so; one never handed to
    /// the client is counted dropped.
    fn forget_oldest(&mut self, metrics: &SyncMetrics, mut old: impl FnMut(&Kept) -> bool) {
        while let Some(b) = self.batches.front()
            && old(b)
        {
            self.bytes -= b.payload.len();
            if !b.handed {
                metrics.dropped("disconnected", b.entries);
            }
            self.batches.pop_front();
        }
    }

    /// Keeps only the batches `keep` says to.
    fn retain(&mut self, keep: impl FnMut(&Kept) -> bool) {
        self.batches.retain(keep);
        self.bytes = self.batches.iter().map(|b| b.payload.len()).sum();
    }
}

struct Publisher {
    client: Client,
    me: Identity,
    metrics: Arc<SyncMetrics>,
    inserts_subject: String,
    insert_seq: u64,
    delivery: Arc<Delivery>,
    unconfirmed: Unconfirmed,
    /// How long the stream keeps history (`sync.history_secs`).
    history: Duration,
}

impl Publisher {
    async fn send_inserts(&mut self, batch: Inserts) {
        self.insert_seq += 1;
        let entries = batch.entries.len() as u64;
        let payload = Bytes::from(wire::encode_inserts(
            &self.me.header(self.insert_seq),
            &batch,
        ));
        self.unconfirmed
            .confirmed(self.delivery.stored(), &self.metrics);
        let handed = hand_over(
            &self.client,
            &self.inserts_subject,
            payload.clone(),
            &self.metrics,
        )
        .await;
        let keep = match handed {
            Handed::Yes => self.delivery.coming_back(),
            Handed::Disconnected => true,
            Handed::Refused => {
                self.metrics.dropped("publish_error", entries);
                false
            }
        };
        if keep {
            let kept = Kept {
                seq: self.insert_seq,
                payload,
                entries,
                made: Instant::now(),
                handed: handed == Handed::Yes,
            };
            self.unconfirmed.keep(kept, &self.metrics);
        }
    }

    /// After a reconnect: sends again, in order, every batch not seen back
    /// from the stream.
    async fn resend(&mut self) {
        self.unconfirmed
            .confirmed(self.delivery.stored(), &self.metrics);
        if let Some(since) = Instant::now().checked_sub(self.history) {
            self.unconfirmed.stale(since, &self.metrics);
        }
        if self.unconfirmed.batches.is_empty() {
            return;
        }
        let mut sent = 0;
        let mut refused = Vec::new();
        for b in &mut self.unconfirmed.batches {
            match hand_over(
                &self.client,
                &self.inserts_subject,
                b.payload.clone(),
                &self.metrics,
            )
            .await
            {
                Handed::Yes => {
                    b.handed = true;
                    sent += 1;
                }
                // Gone again: the next reconnect sends the rest.
                Handed::Disconnected => break,
                Handed::Refused => {
                    self.metrics.dropped("publish_error", b.entries);
                    refused.push(b.seq);
                }
            }
        }
        if !refused.is_empty() {
            self.unconfirmed.retain(|b| !refused.contains(&b.seq));
        }
        self.metrics.resent(sent);
        tracing::info!(
            batches = sent,
            "replica sync: reconnected; sent again the insert batches not seen back from the stream"
        );
        if !self.delivery.coming_back() {
            // Core NATS: nothing will confirm what went.
            self.unconfirmed.retain(|b| !b.handed);
        }
    }
}

/// What the publisher shares with the rest of sync.
pub(super) struct Outlets {
    /// Loads and first tokens to take along.
    pub(super) lane: Arc<Shared>,
    pub(super) metrics: Arc<SyncMetrics>,
    /// How far own batches came back from the stream.
    pub(super) delivery: Arc<Delivery>,
    /// The count of the client's connections: at each new one, what was
    /// not seen back goes again.
    pub(super) reconnected: watch::Receiver<u64>,
}

/// Publishes until `stop`, at most one batch per `batch_ms`. Nothing runs
/// on a timer while there is nothing to say: the task sleeps until a
/// decision is queued.
pub(super) async fn run(
    client: Client,
    me: Identity,
    config: SyncConfig,
    mut rx: mpsc::Receiver<Routed>,
    out: Outlets,
    stop: CancellationToken,
) {
    let Outlets {
        lane,
        metrics,
        delivery,
        mut reconnected,
    } = out;
    let mut p = Publisher {
        inserts_subject: me.subject("inserts"),
        client,
        me,
        metrics,
        insert_seq: 0,
        delivery,
        unconfirmed: Unconfirmed::default(),
        history: Duration::from_secs(config.history_secs),
    };
    let mut dict = Outgoing::new(
        config.reference_window_bytes,
        super::dict::renew_after(Duration::from_secs(config.history_secs)),
    );
    let window = config.reference_window_bytes as u64;
    let batch_wait = Duration::from_millis(config.batch_ms);
    let mut last_batch: Option<Instant> = None;
    loop {
        let first = tokio::select! {
            // A reconnect first: what was kept goes before anything new,
            // so that a new batch's references to it resolve.
            biased;
            _ = stop.cancelled() => return,
            Ok(()) = reconnected.changed() => {
                p.resend().await;
                continue;
            }
            item = rx.recv() => match item {
                Some(item) => item,
                None => {
                    stop.cancelled().await;
                    return;
                }
            },
        };
        // After a quiet spell a decision goes at once, on the thread that
        // just routed it: waiting `batch_ms` for company that rarely comes
        // at a few requests a second cost a timer's wake-up per decision,
        // and kept it from the peers that much longer. Within `batch_ms` of
        // the last batch, what comes waits to go together then.
        if let Some(due) = last_batch
            .map(|at| at + batch_wait)
            .filter(|due| *due > Instant::now())
        {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(due) => {}
            }
        }
        // A reconnect while this decision waited: the same.
        if reconnected.has_changed().unwrap_or(false) {
            reconnected.borrow_and_update();
            p.resend().await;
        }
        let mut items = vec![first];
        while let Ok(item) = rx.try_recv() {
            items.push(item);
        }
        // Every batch carries the loads as they are now (the peers hear of
        // a request's start with its decision) and the first tokens that
        // wait for the load lane: neither costs a message of its own.
        let loads = (lane.next_load_seq(), lane.own_loads());
        let firsts = lane.take_first_tokens();
        send_batches(&mut p, &mut dict, window, items, firsts, loads).await;
        last_batch = Some(Instant::now());
    }
}

/// Sends `items` as insert batches, each within [`MAX_BATCH_BYTES`] (but
/// for one long text alone), the server's `max_payload` and
/// [`wire::MAX_BATCH_TEXT`] of texts once rebuilt; the last one
/// carries `firsts` (entries without text) and `load`, this replica's
/// load report numbered so. A text that would not fit in a batch of its
/// own goes cut to its head ([`fit`]).
async fn send_batches(
    p: &mut Publisher,
    dict: &mut Outgoing,
    window: u64,
    items: Vec<Routed>,
    firsts: Vec<FirstToken>,
    load: (u64, Vec<WorkerLoad>),
) {
    // Decisions are grouped up to MAX_BATCH_BYTES (or the server's
    // limit, if smaller); one long text may take all the server accepts.
    // Every batch keeps room for the load report, though only the last
    // carries it. (Before the first connection the client knows no limit;
    // nothing is sent then.)
    let frame = wire::inserts_frame_bound(&p.me.header(0), Some(load.1.as_slice()));
    // No receiver decodes more than MAX_MESSAGE, nor rebuilds a longer
    // text, whatever the server would take.
    let accepted = match p.client.max_payload() {
        0 => MAX_BATCH_BYTES,
        n => n.min(wire::MAX_MESSAGE),
    };
    let whole = accepted.saturating_sub(frame);
    let room = accepted.min(MAX_BATCH_BYTES).saturating_sub(frame);
    let mut batch = Inserts {
        window,
        first_entry: dict.next_id(),
        entries: Vec::with_capacity(items.len()),
        load: None,
    };
    let now = std::time::Instant::now();
    let mut bytes = 0;
    // The bytes of text the batch's entries rebuild, references and all:
    // receivers refuse a batch of more than MAX_BATCH_TEXT.
    let mut texts = 0;
    for item in items {
        let fixed = wire::entry_bound(0, &item.model, &item.url);
        let text = fit(&item.text, whole.saturating_sub(fixed), &p.metrics);
        // Decided before the text takes its number: a reference only
        // shortens what is sent.
        let most = wire::entry_bound(text.len(), &item.model, &item.url);
        if (bytes + most > room || texts + text.len() > wire::MAX_BATCH_TEXT)
            && !batch.entries.is_empty()
        {
            send_full(p, dict, window, &mut batch).await;
            bytes = 0;
            texts = 0;
        }
        texts += text.len();
        let encoded = dict.encode(text.as_bytes(), now);
        let cut = encoded.base.map_or(0, |(_, len)| len as usize);
        let suffix = text.as_bytes()[cut..].to_vec();
        bytes += wire::entry_bound(suffix.len(), &item.model, &item.url);
        batch.entries.push(WireEntry {
            model: item.model.into(),
            url: item.url.into(),
            base: encoded.base,
            suffix,
            observed: None,
        });
    }
    for f in firsts {
        let most = wire::entry_bound(0, &f.model, &f.url);
        if bytes + most > room && !batch.entries.is_empty() {
            send_full(p, dict, window, &mut batch).await;
            bytes = 0;
        }
        bytes += most;
        // An empty text: nothing to refer to, nothing to insert.
        let encoded = dict.encode(b"", now);
        batch.entries.push(WireEntry {
            model: f.model.into(),
            url: f.url.into(),
            base: encoded.base,
            suffix: Vec::new(),
            observed: Some(f.observed),
        });
    }
    // The report goes even if the last cut left no entry.
    batch.load = Some(load);
    p.send_inserts(batch).await;
}

/// Sends `batch` and starts the next one in its place.
async fn send_full(p: &mut Publisher, dict: &Outgoing, window: u64, batch: &mut Inserts) {
    let next = Inserts {
        window,
        first_entry: dict.next_id(),
        entries: Vec::new(),
        load: None,
    };
    p.send_inserts(std::mem::replace(batch, next)).await;
}

/// `text`, or as much of its head as fits in `room` bytes, cut at a
/// character's boundary (counted `radixgate_sync_texts_cut_total`): the
/// worker was sent all of it, so it holds that head, and a peer that
/// learns the head routes its repeats as hits. Sent whole, a text over
/// the server's `max_payload` would be refused, and with it every other
/// decision of its batch.
fn fit<'a>(text: &'a str, room: usize, metrics: &SyncMetrics) -> &'a str {
    if text.len() <= room {
        return text;
    }
    metrics.text_cut();
    &text[..text.floor_char_boundary(room)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn batch(seq: u64, len: usize, handed: bool) -> Kept {
        Kept {
            seq,
            payload: Bytes::from(vec![0u8; len]),
            entries: 2,
            made: Instant::now(),
            handed,
        }
    }

    #[test]
    fn batches_are_kept_until_seen_back_and_within_the_bound() {
        let metrics = SyncMetrics::new(&Metrics::new());
        let mut kept = Unconfirmed::default();
        for seq in 1..=4 {
            kept.keep(batch(seq, 100, true), &metrics);
        }
        kept.confirmed(2, &metrics);
        let seqs: Vec<u64> = kept.batches.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, [3, 4]);
        assert_eq!(kept.bytes, 200);
        // Past the bound the oldest go.
        let big = MAX_UNCONFIRMED_BYTES / 2;
        kept.keep(batch(5, big, false), &metrics);
        kept.keep(batch(6, big, false), &metrics);
        let seqs: Vec<u64> = kept.batches.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, [5, 6]);
        assert_eq!(kept.bytes, 2 * big);
        kept.keep(batch(7, 1, true), &metrics);
        let seqs: Vec<u64> = kept.batches.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, [6, 7], "batch 5 was never handed over: dropped");
        kept.confirmed(u64::MAX, &metrics);
        let seqs: Vec<u64> = kept.batches.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, [6, 7], "batch 6 was never handed over: not stored");
        kept.batches[0].handed = true;
        kept.confirmed(u64::MAX, &metrics);
        assert!(kept.batches.is_empty());
        assert_eq!(kept.bytes, 0);
    }

    /// After a reconnect a batch can be handed over (and come back) before
    /// the ones kept while disconnected are sent again: its number coming
    /// back does not make them stored.
    #[test]
    fn a_later_batch_seen_back_does_not_confirm_one_never_handed_over() {
        let registry = Metrics::new();
        let metrics = SyncMetrics::new(&registry);
        let mut kept = Unconfirmed::default();
        kept.keep(batch(1, 10, true), &metrics);
        kept.keep(batch(2, 10, false), &metrics);
        kept.keep(batch(3, 10, true), &metrics);
        kept.confirmed(3, &metrics);
        let seqs: Vec<u64> = kept.batches.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, [2, 3], "batch 2 waits to be sent again");
        assert!(
            !registry.render().contains("reason=\"disconnected\"} 2"),
            "{}",
            registry.render()
        );
    }

    #[test]
    fn batches_older_than_the_history_are_not_sent_again() {
        let metrics = SyncMetrics::new(&Metrics::new());
        let mut kept = Unconfirmed::default();
        let mut old = batch(1, 10, false);
        old.made -= Duration::from_secs(700);
        kept.keep(old, &metrics);
        kept.keep(batch(2, 10, false), &metrics);
        kept.stale(Instant::now() - Duration::from_secs(600), &metrics);
        let seqs: Vec<u64> = kept.batches.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, [2]);
        assert_eq!(kept.bytes, 10);
    }
}
