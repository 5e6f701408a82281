//! The publisher: queued decisions go out `batch_ms` after the first of
//! them as one insert batch (or a few, each under [`MAX_BATCH_BYTES`]), and
//! the load report goes out when it changed, or every `load_period_ms`
//! while this replica has anything in flight. It wakes only for these: an
//! idle replica's publisher does not run at all (it ticked every `batch_ms`
//! before, 100 wake-ups a second whatever the traffic).
//!
//! While NATS is disconnected nothing is handed to the client (it would
//! buffer, then block): batches are dropped and counted `disconnected`.

use super::dict::Outgoing;
use super::wire::{self, Header, Inserts, WireEntry, WorkerLoad};
use super::{Identity, Routed, SyncMetrics, now_ms};
use crate::config::SyncConfig;
use async_nats::Client;
use async_nats::connection::State;
use radixgate_routing::Router;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Largest insert batch payload; NATS refuses payloads over its
/// `max_payload` (1 MiB unless configured).
const MAX_BATCH_BYTES: usize = 512 << 10;

struct Publisher {
    client: Client,
    me: Identity,
    metrics: Arc<SyncMetrics>,
    inserts_subject: String,
    load_subject: String,
    insert_seq: u64,
    load_seq: u64,
}

impl Publisher {
    fn header(&self, seq: u64) -> Header {
        Header {
            cluster: self.me.cluster.clone(),
            replica: self.me.replica.clone(),
            instance: self.me.instance,
            seq,
            sent_ms: now_ms(),
        }
    }

    async fn send(&self, subject: &str, payload: Vec<u8>, items: u64) {
        if self.client.connection_state() != State::Connected {
            self.metrics.dropped("disconnected", items);
            return;
        }
        let len = payload.len();
        match self
            .client
            .publish(subject.to_owned(), payload.into())
            .await
        {
            Ok(()) => self.metrics.sent(len),
            Err(err) => {
                tracing::debug!(error = %err, "replica sync: publish failed");
                self.metrics.dropped("publish_error", items);
            }
        }
    }

    async fn send_inserts(&mut self, batch: Inserts) {
        self.insert_seq += 1;
        let n = batch.entries.len() as u64;
        let payload = wire::encode_inserts(&self.header(self.insert_seq), &batch);
        let subject = self.inserts_subject.clone();
        self.send(&subject, payload, n).await;
    }

    async fn send_load(&mut self, loads: &[WorkerLoad]) {
        self.load_seq += 1;
        let payload = wire::encode_load(&self.header(self.load_seq), loads);
        let subject = self.load_subject.clone();
        self.send(&subject, payload, 1).await;
    }
}

/// This replica's own non-zero loads, by worker URL, in worker order.
fn own_loads(router: &Router) -> Vec<WorkerLoad> {
    router
        .snapshot()
        .workers()
        .iter()
        .filter(|w| w.load() > 0 || w.pending_prefill() > 0)
        .map(|w| WorkerLoad {
            url: w.url().to_owned(),
            in_flight: u32::try_from(w.load()).unwrap_or(u32::MAX),
            pending_prefill: w.pending_prefill() as u64,
        })
        .collect()
}

/// The shortest gap between two load reports. Under steady traffic the
/// load changes many times a second, and a report per change (each decoded
/// by every peer) took sync's extra router CPU from 13.5-14.5% to 17% in
/// docs/sync.md's side-by-side runs.
const LOAD_COALESCE: Duration = Duration::from_millis(25);

/// Publishes until `stop`. Nothing runs on a timer while there is nothing
/// to say: the task sleeps until a decision is queued (then waits
/// `batch_ms` for more to join its batch) or the router signals that a
/// worker's own load changed (then reports at once, unless the last report
/// is under [`LOAD_COALESCE`] old: then when it is). While the load it last
/// reported is non-zero it repeats it every `load_period_ms`, so peers never
/// expire a live report.
pub(super) async fn run(
    client: Client,
    me: Identity,
    config: SyncConfig,
    mut rx: mpsc::Receiver<Routed>,
    router: Router,
    metrics: Arc<SyncMetrics>,
    stop: CancellationToken,
) {
    let mut p = Publisher {
        inserts_subject: me.subject("inserts"),
        load_subject: me.subject("load"),
        client,
        me,
        metrics,
        insert_seq: 0,
        load_seq: 0,
    };
    let mut dict = Outgoing::new(config.reference_window_bytes);
    let window = config.reference_window_bytes as u64;
    let batch_wait = Duration::from_millis(config.batch_ms);
    let period = Duration::from_millis(config.load_period_ms);
    let changes = router.load_changes();
    // The decisions waiting for their batch, and when it goes out.
    let mut queued: Vec<Routed> = Vec::new();
    let mut batch_due: Option<Instant> = None;
    let mut queue_open = true;
    // A load change was signalled and not reported yet.
    let mut load_changed = false;
    let mut last_load: Vec<WorkerLoad> = Vec::new();
    let mut last_load_at = Instant::now();
    loop {
        let load_due = if load_changed {
            Some(last_load_at + LOAD_COALESCE)
        } else if !last_load.is_empty() {
            Some(last_load_at + period)
        } else {
            None
        };
        let wake = [batch_due, load_due].into_iter().flatten().min();
        tokio::select! {
            _ = stop.cancelled() => return,
            item = rx.recv(), if queue_open && batch_due.is_none() => match item {
                Some(item) => {
                    queued.push(item);
                    batch_due = Some(Instant::now() + batch_wait);
                }
                None => queue_open = false,
            },
            _ = changes.notified(), if !load_changed => load_changed = true,
            _ = super::sleep_until_some(wake) => {}
        }
        let now = Instant::now();
        if batch_due.is_some_and(|due| now >= due) {
            batch_due = None;
            while let Ok(item) = rx.try_recv() {
                queued.push(item);
            }
            send_batches(&mut p, &mut dict, window, std::mem::take(&mut queued)).await;
        }
        // Load: on change, coalesced to one report per LOAD_COALESCE, and
        // at least every period while non-zero.
        let since = now.duration_since(last_load_at);
        let periodic = !last_load.is_empty() && since >= period;
        if (load_changed && since >= LOAD_COALESCE) || periodic {
            load_changed = false;
            let loads = own_loads(&router);
            if loads != last_load || (periodic && !loads.is_empty()) {
                p.send_load(&loads).await;
                last_load = loads;
                last_load_at = Instant::now();
            }
        }
    }
}

/// Sends `items` as insert batches, each under [`MAX_BATCH_BYTES`].
async fn send_batches(p: &mut Publisher, dict: &mut Outgoing, window: u64, items: Vec<Routed>) {
    let mut batch = Inserts {
        window,
        first_entry: dict.next_id(),
        entries: Vec::with_capacity(items.len()),
    };
    let mut bytes = 0;
    for item in items {
        let text = item.text.as_bytes();
        let encoded = dict.encode(text);
        let cut = encoded.base.map_or(0, |(_, len)| len as usize);
        let suffix = text[cut..].to_vec();
        bytes += suffix.len() + item.url.len() + item.model.len() + 8;
        batch.entries.push(WireEntry {
            model: item.model,
            url: item.url,
            base: encoded.base,
            suffix,
        });
        if bytes >= MAX_BATCH_BYTES {
            let full = std::mem::replace(
                &mut batch,
                Inserts {
                    window,
                    first_entry: dict.next_id(),
                    entries: Vec::new(),
                },
            );
            p.send_inserts(full).await;
            bytes = 0;
        }
    }
    if !batch.entries.is_empty() {
        p.send_inserts(batch).await;
    }
}
