//! Sync's metric families (names fixed: the bench reads them).

use crate::metrics::{Describe, Family, LabelledCounters, Metrics, OneCounter, OneGauge};
use metrics::Counter;

const SENT: Describe = Describe::new(
    "radixgate_sync_messages_sent_total",
    "Sync messages this replica published to NATS (insert batches and load reports).",
);
const RECEIVED: Describe = Describe::new(
    "radixgate_sync_messages_received_total",
    "Sync messages received from NATS, own and ignored ones included.",
);
const BYTES_SENT: Describe = Describe::new(
    "radixgate_sync_bytes_sent_total",
    "Payload bytes of the sync messages published.",
);
const BYTES_RECEIVED: Describe = Describe::new(
    "radixgate_sync_bytes_received_total",
    "Payload bytes of the sync messages received.",
);
const DROPPED: Describe = Describe::new(
    "radixgate_sync_dropped_total",
    "Decisions or reports not published, by reason (queue_full; disconnected: kept for a reconnect past the bound, or a load report while disconnected; publish_error, stopped; refused: the NATS server refused it, a permission missing).",
);
const IGNORED: Describe = Describe::new(
    "radixgate_sync_ignored_total",
    "Received messages, entries or first tokens not applied, by reason (malformed, version, foreign_cluster, own, unknown_worker, unknown_model, no_trees, missing_base, expired).",
);
const LEARNED: Describe = Describe::new(
    "radixgate_sync_entries_learned_total",
    "Peers' routing decisions applied to this replica's trees.",
);
const OBSERVED: Describe = Describe::new(
    "radixgate_sync_first_tokens_learned_total",
    "Peers' first-token observations this replica's TTFT cost model learned from.",
);
const TEXTS_CUT: Describe = Describe::new(
    "radixgate_sync_texts_cut_total",
    "Routed texts published cut to their head, to fit the NATS server's max_payload.",
);
const RESENT: Describe = Describe::new(
    "radixgate_sync_batches_resent_total",
    "Insert batches published again after a reconnect: not seen back from the stream (sent into a connection that died, or kept while disconnected).",
);
const CONNECTED: Describe = Describe::new(
    "radixgate_sync_connected",
    "Whether this replica's NATS connection for decisions and the stream is connected (1) or not (0).",
);
const LANE_CONNECTED: Describe = Describe::new(
    "radixgate_sync_load_lane_connected",
    "Whether this replica's load lane (its second NATS connection, for load reports) is connected (1) or not (0).",
);
const STREAM: Describe = Describe::new(
    "radixgate_sync_stream",
    "Whether this replica's insert feed reads the JetStream stream (1: warm start and catching up after a disconnect) or not (0: only live core NATS, the stream refused or not set up yet; or no feed, NATS away).",
);
const LAG: Describe = Describe::seconds(
    "radixgate_sync_lag_seconds",
    "Delay from a peer's publishing to this replica applying, of the latest live insert batch.",
);

/// The sync families of one gateway.
#[derive(Debug)]
pub(crate) struct SyncMetrics {
    sent: OneCounter,
    received: OneCounter,
    bytes_sent: OneCounter,
    bytes_received: OneCounter,
    dropped: Family<&'static str, Counter>,
    ignored: LabelledCounters,
    learned: OneCounter,
    observed: OneCounter,
    texts_cut: OneCounter,
    resent: OneCounter,
    connected: OneGauge,
    lane_connected: OneGauge,
    stream: OneGauge,
    lag: OneGauge,
}

impl SyncMetrics {
    pub(crate) fn new(metrics: &Metrics) -> Self {
        let m = Self {
            sent: metrics.counter(&SENT),
            received: metrics.counter(&RECEIVED),
            bytes_sent: metrics.counter(&BYTES_SENT),
            bytes_received: metrics.counter(&BYTES_RECEIVED),
            dropped: metrics.counters(&DROPPED),
            ignored: metrics.labelled_counters(&IGNORED, "reason"),
            learned: metrics.counter(&LEARNED),
            observed: metrics.counter(&OBSERVED),
            texts_cut: metrics.counter(&TEXTS_CUT),
            resent: metrics.counter(&RESENT),
            connected: metrics.gauge(&CONNECTED),
            lane_connected: metrics.gauge(&LANE_CONNECTED),
            stream: metrics.gauge(&STREAM),
            lag: metrics.gauge(&LAG),
        };
        // Exported from the start, so a scrape shows sync is on.
        m.connected.set(0.0);
        m.lane_connected.set(0.0);
        m.stream.set(0.0);
        m
    }

    pub(crate) fn sent(&self, bytes: usize) {
        self.sent.add(1);
        self.bytes_sent.add(bytes as u64);
    }

    pub(crate) fn received(&self, bytes: usize) {
        self.received.add(1);
        self.bytes_received.add(bytes as u64);
    }

    pub(crate) fn dropped(&self, reason: &'static str, n: u64) {
        self.dropped.with(
            &reason,
            || reason,
            || vec![metrics::Label::from_static_parts("reason", reason)],
            |c| c.increment(n),
        );
    }

    pub(crate) fn learned(&self) {
        self.learned.add(1);
    }

    pub(crate) fn observed(&self) {
        self.observed.add(1);
    }

    pub(crate) fn text_cut(&self) {
        self.texts_cut.add(1);
    }

    pub(crate) fn resent(&self, batches: u64) {
        self.resent.add(batches);
    }

    pub(crate) fn ignored(&self, reason: &'static str) {
        self.ignored.increment(reason);
    }

    pub(crate) fn connected(&self, up: bool) {
        self.connected.set(if up { 1.0 } else { 0.0 });
    }

    pub(crate) fn lane_connected(&self, up: bool) {
        self.lane_connected.set(if up { 1.0 } else { 0.0 });
    }

    pub(crate) fn stream(&self, on: bool) {
        self.stream.set(if on { 1.0 } else { 0.0 });
    }

    pub(crate) fn lag(&self, seconds: f64) {
        self.lag.set(seconds);
    }
}
