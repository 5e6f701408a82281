//! Router replicas sharing one view of the pool, over NATS.
//!
//! Each replica publishes what it routed (model, worker URL, the routing
//! text it inserted into its tree) and its per-worker load; every replica
//! applies the others' decisions to its own trees ([`Router::learn`]) and
//! routes on its own load plus theirs ([`PeerLoads`]). The wire format is
//! [`wire`]'s; repeated prefixes travel as references ([`dict`]).
//!
//! Subjects, all under `radixgate.sync.<cluster>.`: `inserts` (batches of
//! decisions, also captured by the JetStream stream `RADIXGATE-<cluster>`
//! with a bounded age and size) and `load` (load reports, core NATS only:
//! a report is stale in 300 ms, so keeping it is pointless). Load reports
//! on their own go over a second connection, by a thread of their own that
//! sends and reads them once per `load_period_ms` ([`lane`]).
//!
//! Warm start: the insert receiver reads the stream through an ordered
//! consumer from its oldest message, so a starting replica replays what the
//! cluster routed recently and then follows live, in one ordered sequence
//! that also resumes after a reconnect. `/readiness` waits for it (see
//! [`SyncHandle::ready`]). Without JetStream on the server it falls back to
//! a core subscription, with a WARN.
//!
//! Faults: the request path only ever does a `try_send` into a bounded
//! queue ([`SyncHandle::routed`]), or pushes a first token onto a bounded
//! list ([`SyncHandle::first_token`]): when it is full, the item is
//! dropped and counted. The publisher drops (and counts) what it cannot send while
//! NATS is disconnected. async-nats reconnects with back-off; everything
//! keeps routing on local state meanwhile.
//!
//! Concurrency: two tasks (publisher, insert receiver) on the serving
//! runtime and the load lane's thread, each owning its state; they share
//! the router handle, the metric families, the readiness flag (an atomic)
//! and [`lane::Shared`]: the peers' reports and the first tokens waiting,
//! each behind a mutex held only to read or swap a list.
//!
//! [`Router::learn`]: radixgate_routing::Router::learn
//! [`PeerLoads`]: radixgate_routing::PeerLoads

mod clocks;
mod connect;
mod dict;
mod lane;
mod metrics;
mod publish;
mod receive;
mod wire;

use crate::config::SyncConfig;
use crate::metrics::Metrics;
pub(crate) use metrics::SyncMetrics;
use radixgate_routing::Router;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A decision to share: the worker and the text the policy inserted.
#[derive(Debug)]
pub(crate) struct Routed {
    pub(crate) model: String,
    pub(crate) url: String,
    pub(crate) text: String,
}

/// Who this process is, in its messages.
#[derive(Clone, Debug)]
pub(crate) struct Identity {
    pub(crate) cluster: String,
    pub(crate) replica: String,
    pub(crate) instance: u64,
}

impl Identity {
    fn subject(&self, what: &str) -> String {
        format!("radixgate.sync.{}.{what}", self.cluster)
    }

    fn stream(&self) -> String {
        format!("RADIXGATE-{}", self.cluster)
    }

    /// The header of this process's message numbered `seq`, stamped now.
    fn header(&self, seq: u64) -> wire::Header {
        wire::Header {
            cluster: self.cluster.clone(),
            replica: self.replica.clone(),
            instance: self.instance,
            seq,
            sent_ms: now_ms(),
        }
    }
}

/// What became of a message given to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Handed {
    Yes,
    /// Not while disconnected: the client would buffer, then block.
    Disconnected,
    /// The client refused it.
    Refused,
}

impl Handed {
    /// The `dropped` reason of a message not handed over.
    fn dropped_as(self) -> Option<&'static str> {
        match self {
            Self::Yes => None,
            Self::Disconnected => Some("disconnected"),
            Self::Refused => Some("publish_error"),
        }
    }
}

/// Gives `payload` to the client for `subject`, counted sent if it takes
/// it; nothing is handed over while disconnected.
async fn hand_over(
    client: &async_nats::Client,
    subject: &str,
    payload: bytes::Bytes,
    metrics: &SyncMetrics,
) -> Handed {
    if client.connection_state() != async_nats::connection::State::Connected {
        return Handed::Disconnected;
    }
    let len = payload.len();
    match client.publish(subject.to_owned(), payload).await {
        Ok(()) => {
            metrics.sent(len);
            Handed::Yes
        }
        Err(err) => {
            tracing::debug!(error = %err, "replica sync: publish failed");
            Handed::Refused
        }
    }
}

/// The request path's handle on sync.
#[derive(Debug)]
pub(crate) struct SyncHandle {
    queue: mpsc::Sender<Routed>,
    lane: Arc<lane::Shared>,
    ready: Arc<AtomicBool>,
    metrics: Arc<SyncMetrics>,
}

impl SyncHandle {
    /// Queues a decision for publishing as it goes out to the worker;
    /// never waits. A full queue drops it (counted
    /// `radixgate_sync_dropped_total{reason="queue_full"}`).
    pub(crate) fn routed(&self, model: &str, url: &str, text: &str) {
        let item = Routed {
            model: model.to_owned(),
            url: url.to_owned(),
            text: text.to_owned(),
        };
        if let Err(err) = self.queue.try_send(item) {
            let reason = match err {
                mpsc::error::TrySendError::Full(_) => "queue_full",
                mpsc::error::TrySendError::Closed(_) => "stopped",
            };
            self.metrics.dropped(reason, 1);
        }
    }

    /// Keeps a first token this replica's cost model learned from on the
    /// worker at `url`, for the others' fits; never waits. It goes with the
    /// next decision's insert batch (as an entry without text, which
    /// builds before it insert as nothing), or else with the load lane's
    /// next report. Beyond `queue_capacity` waiting it is dropped
    /// (counted `queue_full`).
    pub(crate) fn first_token(
        &self,
        model: &str,
        url: &str,
        observed: radixgate_routing::Observation,
    ) {
        let first = wire::FirstToken {
            model: model.to_owned(),
            url: url.to_owned(),
            observed: observed.into(),
        };
        if !self.lane.first_token(first) {
            self.metrics.dropped("queue_full", 1);
        }
    }

    /// Whether the warm start is over: the history was replayed, or there
    /// was none, or the wait for it ran out.
    pub(crate) fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// Starts sync: connects (in the background: a NATS server that is down
/// at start-up is retried, and routing does not wait for it) and spawns
/// the publisher and receivers on the current runtime, stopped by `stop`.
/// `models_lag`: how long after a peer this replica may find a model
/// loaded into a worker at run time (a LoRA adapter), by its health
/// checks' next read of the worker's models; the peers' decisions for it
/// are held that long.
pub(crate) fn spawn(
    config: &SyncConfig,
    models_lag: std::time::Duration,
    router: Router,
    metrics: &Metrics,
    stop: CancellationToken,
) -> Result<SyncHandle, crate::config::ConfigError> {
    let auth = config.auth.resolve()?;
    let identity = Identity {
        cluster: config.cluster.clone(),
        replica: config
            .replica_id
            .clone()
            .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>())),
        instance: rand::random(),
    };
    let metrics = Arc::new(SyncMetrics::new(metrics));
    let ready = Arc::new(AtomicBool::new(false));
    let (queue, rx) = mpsc::channel(config.queue_capacity);
    let config = config.clone();
    let task_metrics = metrics.clone();
    let task_ready = ready.clone();
    tracing::info!(
        replica = %identity.replica,
        cluster = %identity.cluster,
        urls = ?config.urls,
        auth = auth.kind(),
        "replica sync: connecting to NATS"
    );
    if let Some(ms) = config.load_coalesce_ms {
        tracing::warn!(
            load_coalesce_ms = ms,
            "sync.load_coalesce_ms has no effect since the load lane (load reports go once per sync.load_period_ms); remove it from the config"
        );
    }
    let lane_shared = lane::Shared::new(&config, router.clone());
    let handle_lane = lane_shared.clone();
    let lane = lane::spawn(
        config.clone(),
        auth.clone(),
        identity.clone(),
        lane_shared.clone(),
        metrics.clone(),
        stop.clone(),
    )
    .map_err(|e| crate::config::ConfigError::Invalid {
        key: "sync",
        reason: format!("cannot start the load lane's thread: {e}"),
    })?;
    tokio::spawn(async move {
        let (connects, reconnected) = tokio::sync::watch::channel(0);
        let client = match connect::connect(
            &config,
            auth,
            &identity,
            task_metrics.clone(),
            connect::Link::Inserts,
            Some(Arc::new(connects)),
        )
        .await
        {
            Ok(client) => client,
            Err(err) => {
                tracing::error!(error = %err, "replica sync: cannot set up the NATS client; routing on local state only");
                task_ready.store(true, Ordering::Release);
                stop.cancelled().await;
                lane.join().await;
                return;
            }
        };
        let delivery = Arc::new(publish::Delivery::default());
        let publisher = tokio::spawn(publish::run(
            client.clone(),
            identity.clone(),
            config.clone(),
            rx,
            publish::Outlets {
                lane: lane_shared.clone(),
                metrics: task_metrics.clone(),
                delivery: delivery.clone(),
                reconnected: reconnected.clone(),
            },
            stop.clone(),
        ));
        let inserts = tokio::spawn(receive::inserts(
            client.clone(),
            identity,
            config,
            router,
            task_metrics,
            receive::Handoff {
                lane: lane_shared,
                ready: task_ready,
                reconnected,
                delivery,
                models_lag,
            },
            stop.clone(),
        ));
        stop.cancelled().await;
        let _ = tokio::join!(publisher, inserts, lane.join());
        // Sends what is buffered before the connection closes.
        let _ = client.flush().await;
    });
    Ok(SyncHandle {
        queue,
        lane: handle_lane,
        ready,
        metrics,
    })
}

/// Wall-clock milliseconds since the Unix epoch (message timestamps; lag).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
