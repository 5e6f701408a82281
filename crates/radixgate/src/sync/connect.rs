//! The NATS client: TLS, credentials, reconnecting with back-off, and
//! connection events turned into logs and the `connected` gauge.

use super::{Identity, SyncMetrics};
use crate::config::{SyncAuth, SyncConfig};
use async_nats::{Client, ConnectOptions, Event, ServerAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Longest pause between reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A replica's two NATS connections.
#[derive(Clone, Copy, Debug)]
pub(super) enum Link {
    /// Decisions and the stream: the `connected` gauge.
    Inserts,
    /// Load reports ([`super::lane`]): the `load_lane_connected` gauge.
    LoadLane,
}

impl Link {
    /// Its name in the logs.
    fn name(self) -> &'static str {
        match self {
            Self::Inserts => "inserts",
            Self::LoadLane => "load lane",
        }
    }

    fn set(self, metrics: &SyncMetrics, up: bool) {
        match self {
            Self::Inserts => metrics.connected(up),
            Self::LoadLane => metrics.lane_connected(up),
        }
    }
}

/// Builds the client. It connects in the background and keeps
/// reconnecting, with back-off from 50 ms doubling up to 2 s, forever:
/// a replica never gives up on NATS, it routes on local state meanwhile.
/// `connects`, if given, counts the connections made (the first and
/// every reconnect).
pub(super) async fn connect(
    config: &SyncConfig,
    auth: SyncAuth,
    me: &Identity,
    metrics: Arc<SyncMetrics>,
    link: Link,
    connects: Option<Arc<watch::Sender<u64>>>,
) -> Result<Client, async_nats::ConnectError> {
    let lane = link.name();
    let addrs: Vec<ServerAddr> = config
        .urls
        .iter()
        .map(|u| u.parse::<ServerAddr>())
        .collect::<Result<_, _>>()
        .map_err(|e| {
            async_nats::ConnectError::with_source(async_nats::ConnectErrorKind::ServerParse, e)
        })?;
    let mut options = ConnectOptions::new()
        .name(format!("radixgate/{}/{lane}", me.replica))
        // The server does not hand this connection back what it published
        // itself: a replica skipped its own load reports after decoding
        // them, one in N of all it received. JetStream is not affected: the
        // stream stores every batch, and the consumer delivers this
        // replica's own ones too (screened out by their header, see
        // `receive::screen`).
        .no_echo()
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(2))
        .ping_interval(Duration::from_secs(5))
        .reconnect_delay_callback(|attempts| {
            let step = Duration::from_millis(50).saturating_mul(1 << attempts.min(6) as u32);
            step.min(MAX_BACKOFF)
        })
        .event_callback(move |event| {
            let metrics = metrics.clone();
            let connects = connects.clone();
            async move {
                match event {
                    Event::Connected => {
                        if let Some(connects) = connects {
                            connects.send_modify(|n| *n += 1);
                        }
                        link.set(&metrics, true);
                        tracing::info!(lane, "replica sync: connected to NATS");
                    }
                    Event::Disconnected => {
                        link.set(&metrics, false);
                        tracing::warn!(lane, "replica sync: disconnected from NATS; routing on local state, reconnecting");
                    }
                    Event::ServerError(err) => {
                        tracing::error!(lane, error = %err, "replica sync: NATS server error (wrong credentials or permissions?)");
                    }
                    Event::ClientError(err) => {
                        tracing::warn!(lane, error = %err, "replica sync: NATS client error");
                    }
                    Event::SlowConsumer(_) => {
                        tracing::warn!(lane, "replica sync: NATS reports this replica as a slow consumer");
                    }
                    other => tracing::info!(lane, event = %other, "replica sync: NATS event"),
                }
            }
        });
    options = match auth {
        SyncAuth::None => options,
        SyncAuth::Token(t) => options.token(t),
        SyncAuth::UserPassword(u, p) => options.user_and_password(u, p),
        SyncAuth::NkeySeed(seed) => options.nkey(seed),
        SyncAuth::Creds(text) => options.credentials(&text).map_err(|e| {
            async_nats::ConnectError::with_source(async_nats::ConnectErrorKind::Authentication, e)
        })?,
    };
    let tls = &config.tls;
    if tls.required {
        options = options.require_tls(true);
    }
    if let Some(ca) = &tls.ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    options.connect(addrs).await
}
