//! The publisher: queued decisions go out `batch_ms` after the first of
//! them as one insert batch (or a few, each under [`MAX_BATCH_BYTES`]), the
//! last of which carries this replica's load report; first tokens go with
//! the next batch (within `load_period_ms`); the load report also
//! goes out on its own when it changed and no batch is due (at most one per
//! `load_coalesce_ms`, 25), and on every multiple of `load_period_ms` of
//! the wall clock while this replica has anything in flight. It wakes only
//! for these: an idle replica's publisher does not run at all (it ticked
//! every `batch_ms` before, 100 wake-ups a second whatever the traffic).
//!
//! While NATS is disconnected nothing is handed to the client (it would
//! buffer, then block): batches are dropped and counted `disconnected`.

use super::dict::Outgoing;
use super::wire::{self, Header, Inserts, Observed, WireEntry, WorkerLoad};
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

    /// The number the next load report goes out with, on its own or with a
    /// batch.
    fn next_load_seq(&mut self) -> u64 {
        self.load_seq += 1;
        self.load_seq
    }

    async fn send_inserts(&mut self, batch: Inserts) {
        self.insert_seq += 1;
        let n = batch.entries.len() as u64;
        let payload = wire::encode_inserts(&self.header(self.insert_seq), &batch);
        let subject = self.inserts_subject.clone();
        self.send(&subject, payload, n).await;
    }

    async fn send_load(&mut self, loads: &[WorkerLoad]) {
        let seq = self.next_load_seq();
        let payload = wire::encode_load(&self.header(seq), loads);
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

/// How long after a wall-clock time `wall` (since the Unix epoch) the next
/// multiple of `step` since the epoch comes, strictly after it.
fn to_next_multiple(wall: Duration, step: Duration) -> Duration {
    let step_ns = step.as_nanos().max(1);
    let into = wall.as_nanos() % step_ns;
    Duration::from_nanos((step_ns - into) as u64)
}

/// Two reads of the wall clock and the monotonic one disagree by this much
/// at most, as far as [`on_grid`] is concerned.
const CLOCK_SLACK: Duration = Duration::from_micros(50);

/// The first instant after `after` (by more than [`CLOCK_SLACK`], so that
/// an instant on the grid is not given back as its own successor) that
/// falls on a multiple of `step` of the wall clock. Periodic reports go out
/// on this grid, the same for every replica (to the accuracy of their
/// clocks), so the reports of all busy peers reach a replica together and
/// are read in one wake-up instead of one each.
fn on_grid(after: Instant, step: Duration) -> Instant {
    let after = after + CLOCK_SLACK;
    let now = Instant::now();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let wall_after = if after >= now {
        wall + (after - now)
    } else {
        wall.saturating_sub(now - after)
    };
    after + to_next_multiple(wall_after, step)
}

/// Publishes until `stop`. Nothing runs on a timer while there is nothing
/// to say: the task sleeps until a decision is queued (then waits
/// `batch_ms` for more to join its batch) or the router signals that a
/// worker's own load changed. A change is reported at once, unless the last
/// report is under `load_coalesce_ms` old (then when it is). While the load
/// it last reported is non-zero it reports again on every multiple of
/// `load_period_ms` of the wall clock, so peers never expire a live report.
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
    // The shortest gap between two load reports that announce a change.
    // Under steady traffic the load changes many times a second, and a
    // report per change (each read by every peer) took sync's extra router
    // CPU from 13.5-14.5% to 17% in docs/sync.md's side-by-side runs.
    let coalesce = Duration::from_millis(config.load_coalesce_ms);
    let changes = router.load_changes();
    // The decisions waiting for their batch, and when it goes out.
    let mut queued: Vec<Routed> = Vec::new();
    let mut batch_due: Option<Instant> = None;
    // First tokens alone wait for the next decision's batch, at most a
    // load period (as fresh as the peers' view of the loads they are
    // fitted against): one more batch per request would be one more
    // message read by every peer (and by this replica, back from the
    // stream).
    let first_token_wait = period;
    let mut first_tokens_due: Option<Instant> = None;
    let mut queue_open = true;
    // A change was signalled and not reported yet.
    let mut changed = false;
    let mut last_load: Vec<WorkerLoad> = Vec::new();
    let mut last_load_at = Instant::now();
    // The next periodic report, while the last one was non-zero.
    let mut tick: Option<Instant> = None;
    loop {
        // A change waits for a batch that is due anyway (at most
        // `batch_ms`), and goes with it: at a worker's first token the
        // decision is queued and the load falls at once, and one message
        // wakes each peer once, where two woke it twice.
        let change_due = changed.then(|| batch_due.unwrap_or(last_load_at + coalesce));
        let wake = [batch_due, change_due, tick, first_tokens_due]
            .into_iter()
            .flatten()
            .min();
        tokio::select! {
            _ = stop.cancelled() => return,
            item = rx.recv(), if queue_open && batch_due.is_none() => match item {
                Some(item) => {
                    let now = Instant::now();
                    if enqueue(&mut queued, &mut first_tokens_due, item, now + first_token_wait) {
                        batch_due = Some(now + batch_wait);
                    }
                }
                None => queue_open = false,
            },
            _ = changes.notified(), if !changed => changed = true,
            _ = super::sleep_until_some(wake) => {}
        }
        let now = Instant::now();
        if first_tokens_due.is_some_and(|due| now >= due) {
            // No decision came to carry them.
            batch_due = Some(now);
        }
        if batch_due.is_some_and(|due| now >= due) {
            batch_due = None;
            first_tokens_due = None;
            while let Ok(item) = rx.try_recv() {
                queued.push(item);
            }
            // Every batch carries the loads as they are now: a report that
            // costs no message of its own.
            let loads = own_loads(&router);
            let seq = p.next_load_seq();
            let items = std::mem::take(&mut queued);
            send_batches(&mut p, &mut dict, window, items, (seq, loads.clone())).await;
            changed = false;
            last_load_at = Instant::now();
            tick = (!loads.is_empty()).then(|| on_grid(last_load_at, period));
            last_load = loads;
        }
        let change_now = changed && change_due.is_some_and(|due| now >= due);
        let tick_now = tick.is_some_and(|due| now >= due);
        if change_now && !tick_now && batch_due.is_none() && queue_open {
            // The request path raises the load as it routes a request just
            // before it queues the decision: if that is in, the change
            // waits for its batch. (A first token alone does not make one.)
            let mut decision = false;
            while let Ok(item) = rx.try_recv() {
                decision |= enqueue(
                    &mut queued,
                    &mut first_tokens_due,
                    item,
                    now + first_token_wait,
                );
            }
            if decision {
                batch_due = Some(now + batch_wait);
                continue;
            }
        }
        if change_now || tick_now {
            changed = false;
            let loads = own_loads(&router);
            if tick_now || loads != last_load {
                p.send_load(&loads).await;
                last_load_at = Instant::now();
            }
            tick = (!loads.is_empty()).then(|| on_grid(last_load_at, period));
            last_load = loads;
        }
    }
}

/// Queues `item` for the next batch: a decision makes one due (the
/// caller's to schedule; true); a first token alone only waits for one, at
/// most until `first_token_by`.
fn enqueue(
    queued: &mut Vec<Routed>,
    first_tokens_due: &mut Option<Instant>,
    item: Routed,
    first_token_by: Instant,
) -> bool {
    let decision = !item.text.is_empty();
    if !decision {
        first_tokens_due.get_or_insert(first_token_by);
    }
    queued.push(item);
    decision
}

/// Sends `items` as insert batches, each under [`MAX_BATCH_BYTES`]; the
/// last one carries `load`, this replica's load report numbered so.
async fn send_batches(
    p: &mut Publisher,
    dict: &mut Outgoing,
    window: u64,
    items: Vec<Routed>,
    load: (u64, Vec<WorkerLoad>),
) {
    let mut batch = Inserts {
        window,
        first_entry: dict.next_id(),
        entries: Vec::with_capacity(items.len()),
        load: None,
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
            observed: item.observed.map(Observed::from),
        });
        if bytes >= MAX_BATCH_BYTES {
            let full = std::mem::replace(
                &mut batch,
                Inserts {
                    window,
                    first_entry: dict.next_id(),
                    entries: Vec::new(),
                    load: None,
                },
            );
            p.send_inserts(full).await;
            bytes = 0;
        }
    }
    // The report goes even if the last cut left no entry.
    batch.load = Some(load);
    p.send_inserts(batch).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_is_the_next_multiple_strictly_after() {
        let step = Duration::from_millis(100);
        let ms = Duration::from_millis;
        assert_eq!(to_next_multiple(ms(1_000_030), step), ms(70));
        assert_eq!(to_next_multiple(ms(1_000_099), step), ms(1));
        // On a multiple: the next one, a whole step on.
        assert_eq!(to_next_multiple(ms(1_000_000), step), step);
        assert_eq!(
            to_next_multiple(Duration::from_nanos(1), step),
            ms(100) - Duration::from_nanos(1)
        );
        // A zero step never divides by zero.
        assert_eq!(
            to_next_multiple(ms(5), Duration::ZERO),
            Duration::from_nanos(1)
        );
    }

    #[test]
    fn grid_instants_are_at_most_a_step_ahead_and_a_step_apart() {
        let step = Duration::from_millis(100);
        let start = Instant::now();
        let first = on_grid(start, step);
        assert!(first > start && first - start <= step);
        let second = on_grid(first, step);
        // Not the same instant again: the next multiple, a step on, give or
        // take the clocks' reads.
        let gap = second - first;
        assert!(
            gap > step - CLOCK_SLACK && gap <= step + CLOCK_SLACK,
            "{gap:?}"
        );
        let past = on_grid(start - Duration::from_millis(250), step);
        assert!(past <= start - Duration::from_millis(150) + CLOCK_SLACK);
    }
}
