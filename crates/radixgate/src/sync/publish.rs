//! The publisher: a queued decision goes out at once as an insert batch
//! (or a few, each under [`MAX_BATCH_BYTES`] and the server's
//! `max_payload`) unless the last batch went
//! under `batch_ms` ago; then it waits until `batch_ms` after that one,
//! with whatever else comes meanwhile. The last batch carries this
//! replica's loads as they are then, and the first tokens waiting (else
//! the load lane sends them). It wakes only for these: an idle replica's
//! publisher does not run at all. Load reports
//! on their own (the refresh, a fall at a request's end) are the load
//! lane's ([`super::lane`]).
//!
//! While NATS is disconnected nothing is handed to the client (it would
//! buffer, then block): batches are dropped and counted `disconnected`.

use super::dict::Outgoing;
use super::lane::Shared;
use super::wire::{self, FirstToken, Inserts, WireEntry, WorkerLoad};
use super::{Identity, Routed, SyncMetrics};
use crate::config::SyncConfig;
use async_nats::Client;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Largest insert batch payload, unless the server's `max_payload` (1 MiB
/// unless configured) is smaller: NATS refuses a payload over it.
const MAX_BATCH_BYTES: usize = 512 << 10;

struct Publisher {
    client: Client,
    me: Identity,
    metrics: Arc<SyncMetrics>,
    inserts_subject: String,
    insert_seq: u64,
}

impl Publisher {
    async fn send_inserts(&mut self, batch: Inserts) {
        self.insert_seq += 1;
        let n = batch.entries.len() as u64;
        let payload = wire::encode_inserts(&self.me.header(self.insert_seq), &batch);
        super::publish(
            &self.client,
            &self.inserts_subject,
            payload,
            n,
            &self.metrics,
        )
        .await;
    }
}

/// Publishes until `stop`, at most one batch per `batch_ms`. Nothing runs
/// on a timer while there is nothing to say: the task sleeps until a
/// decision is queued.
pub(super) async fn run(
    client: Client,
    me: Identity,
    config: SyncConfig,
    mut rx: mpsc::Receiver<Routed>,
    lane: Arc<Shared>,
    metrics: Arc<SyncMetrics>,
    stop: CancellationToken,
) {
    let mut p = Publisher {
        inserts_subject: me.subject("inserts"),
        client,
        me,
        metrics,
        insert_seq: 0,
    };
    let mut dict = Outgoing::new(config.reference_window_bytes);
    let window = config.reference_window_bytes as u64;
    let batch_wait = Duration::from_millis(config.batch_ms);
    let mut last_batch: Option<Instant> = None;
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return,
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
/// for one long text alone) and the server's `max_payload`; the last one
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
    let accepted = match p.client.max_payload() {
        0 => MAX_BATCH_BYTES,
        n => n,
    };
    let whole = accepted.saturating_sub(frame);
    let room = accepted.min(MAX_BATCH_BYTES).saturating_sub(frame);
    let mut batch = Inserts {
        window,
        first_entry: dict.next_id(),
        entries: Vec::with_capacity(items.len()),
        load: None,
    };
    let mut bytes = 0;
    for item in items {
        let fixed = wire::entry_bound(0, &item.model, &item.url);
        let text = fit(&item.text, whole.saturating_sub(fixed), &p.metrics);
        // Decided before the text takes its number: a reference only
        // shortens what is sent.
        let most = wire::entry_bound(text.len(), &item.model, &item.url);
        if bytes + most > room && !batch.entries.is_empty() {
            send_full(p, dict, window, &mut batch).await;
            bytes = 0;
        }
        let encoded = dict.encode(text.as_bytes());
        let cut = encoded.base.map_or(0, |(_, len)| len as usize);
        let suffix = text.as_bytes()[cut..].to_vec();
        bytes += wire::entry_bound(suffix.len(), &item.model, &item.url);
        batch.entries.push(WireEntry {
            model: item.model,
            url: item.url,
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
        let encoded = dict.encode(b"");
        batch.entries.push(WireEntry {
            model: f.model,
            url: f.url,
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
