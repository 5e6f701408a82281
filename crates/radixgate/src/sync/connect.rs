//! The NATS client: TLS, credentials, reconnecting with back-off, and
//! connection events turned into logs and the `connected` gauge.

use super::{Identity, SyncMetrics};
use crate::config::{SyncAuth, SyncConfig};
use async_nats::{Client, ConnectOptions, Event, ServerAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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

/// How often a connection that keeps failing says so again.
const FAILING_EVERY: Duration = Duration::from_secs(60);

/// Once a minute at most: how often a condition that keeps recurring
/// (a connection that keeps failing, errors the server keeps reporting)
/// is logged again.
#[derive(Debug, Default)]
struct Throttle {
    /// Since the count was last taken back ([`Failures::recovered`]).
    total: u64,
    /// Since the last line logged.
    unlogged: u64,
    logged: Option<Instant>,
}

impl Throttle {
    /// One more occurrence at `now`: `Some((total, since_last_logged))`
    /// when a line is due (the first one, or a minute after the last).
    fn note(&mut self, now: Instant) -> Option<(u64, u64)> {
        self.total += 1;
        let due = self
            .logged
            .is_none_or(|at| now.saturating_duration_since(at) >= FAILING_EVERY);
        if !due {
            self.unlogged += 1;
            return None;
        }
        let since = std::mem::take(&mut self.unlogged) + 1;
        self.logged = Some(now);
        Some((self.total, since))
    }
}

/// A connection's failed attempts since it was last up: the client tries
/// again every 2 s at most, for ever, and each attempt's WARN (with an
/// ERROR of the client's own for a refused sign-in) buried everything
/// else in the log. The first failure is logged, then one line a minute
/// with the count, and the reconnect with the count in all.
///
/// A `std` mutex: the client's event task is its one writer, and it holds
/// it for a few assignments.
#[derive(Debug, Default)]
struct Failures {
    state: Mutex<Throttle>,
}

impl Failures {
    fn failed(&self, lane: &'static str, error: &str) {
        let due = self
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(Instant::now());
        let Some((total, since)) = due else {
            return;
        };
        let hint = hint(error);
        if total == 1 {
            tracing::warn!(
                lane,
                error,
                "replica sync: cannot connect to NATS{hint}; routing on local state, \
                 retrying every 2 s (logged again once a minute while it fails)"
            );
        } else {
            tracing::warn!(
                lane,
                error,
                failed_attempts = total,
                since_last_logged = since,
                "replica sync: still cannot connect to NATS{hint}; routing on local state, retrying"
            );
        }
    }

    /// Connected: the failed attempts before it, and a clean slate.
    fn recovered(&self) -> u64 {
        std::mem::take(&mut *self.state.lock().unwrap_or_else(|e| e.into_inner())).total
    }
}

/// What the server reported as an error on an open connection (`-ERR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reported {
    /// It refused to pass on a message this replica published to one of
    /// its sync subjects: its peers never see it.
    PublishRefused,
    /// Another permission it refused: a subscription, or the JetStream
    /// API (the warm-start stream).
    Permission,
    Other,
}

impl Reported {
    /// `error` as the client hands it over; `ours` is the prefix of this
    /// cluster's sync subjects.
    fn of(error: &str, ours: &str) -> Self {
        const PUBLISH: &str = "permissions violation for publish to ";
        let lower = error.to_ascii_lowercase();
        match lower.find(PUBLISH) {
            Some(at)
                if error[at + PUBLISH.len()..]
                    .trim_start_matches('"')
                    .starts_with(ours) =>
            {
                Self::PublishRefused
            }
            _ if lower.contains("permissions violation") => Self::Permission,
            _ => Self::Other,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Errors the server reports on an open connection. A permission the
/// server's config leaves out is reported once per message or request
/// it refuses, and each was an ERROR line: a dozen a second from a busy
/// replica whose user may not publish on the sync subjects, with every
/// refused message counted as sent. Such a refusal is counted as dropped
/// (`refused`); each kind is logged once, then once a minute with a count.
#[derive(Debug, Default)]
struct ServerErrors {
    kinds: Mutex<[Throttle; 3]>,
}

impl ServerErrors {
    fn reported(&self, lane: &'static str, error: &str, ours: &str, metrics: &SyncMetrics) {
        let kind = Reported::of(error, ours);
        if kind == Reported::PublishRefused {
            metrics.dropped("refused", 1);
        }
        let due =
            self.kinds.lock().unwrap_or_else(|e| e.into_inner())[kind.index()].note(Instant::now());
        let Some((total, since)) = due else {
            return;
        };
        let what = match kind {
            Reported::PublishRefused => {
                "the NATS server refused a message this replica published, and its \
                 peers get none of them: grant its user publish on radixgate.sync.> \
                 (docs/sync.md, Warm start, names every permission sync needs)"
            }
            Reported::Permission => {
                "the NATS server refused this replica a permission: check its user's \
                 permissions against those docs/sync.md (Warm start) names"
            }
            Reported::Other => "NATS server error",
        };
        tracing::error!(
            lane,
            error,
            reported = total,
            since_last_logged = since,
            "replica sync: {what} (logged again once a minute while it goes on)"
        );
    }
}

/// What to check for a connection error, where the error says.
fn hint(error: &str) -> &'static str {
    let error = error.to_ascii_lowercase();
    if error.contains("authorization") || error.contains("authentication") {
        " (the server refused the sign-in: check sync.auth, the --sync-token, \
         --sync-user/--sync-password, --sync-nkey-seed-file or --sync-creds-file \
         flags, against the server's users)"
    } else if error.contains("nonce") {
        " (signing in failed: check the nkey seed or .creds file in sync.auth)"
    } else if error.contains("tls") {
        " (TLS: check sync.tls against the server's certificate and whether it \
         requires TLS)"
    } else {
        ""
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
    let failures = Arc::new(Failures::default());
    let server_errors = Arc::new(ServerErrors::default());
    let ours: Arc<str> = me.subject("").into();
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
            let failures = failures.clone();
            let server_errors = server_errors.clone();
            let ours = ours.clone();
            async move {
                match event {
                    Event::Connected => {
                        if let Some(connects) = connects {
                            connects.send_modify(|n| *n += 1);
                        }
                        link.set(&metrics, true);
                        let failed = failures.recovered();
                        tracing::info!(lane, failed_attempts = failed, "replica sync: connected to NATS");
                    }
                    Event::Disconnected => {
                        link.set(&metrics, false);
                        tracing::warn!(lane, "replica sync: disconnected from NATS; routing on local state, reconnecting");
                    }
                    Event::ServerError(err) => {
                        server_errors.reported(lane, &err.to_string(), &ours, &metrics);
                    }
                    Event::ClientError(err) => failures.failed(lane, &err.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_sign_in_names_the_settings_to_check() {
        assert!(hint("authorization violation").contains("sync.auth"));
        assert!(hint("failed signing nonce").contains("sync.auth"));
        assert_eq!(hint("IO error"), "");
    }

    #[test]
    fn a_refused_publish_on_the_sync_subjects_is_told_from_other_errors() {
        let ours = "radixgate.sync.prod.";
        let of = |e: &str| Reported::of(e, ours);
        assert_eq!(
            of(r#"nats: Permissions Violation for Publish to "radixgate.sync.prod.load""#),
            Reported::PublishRefused
        );
        // Another cluster's subjects, the JetStream API, a subscription.
        for other in [
            r#"nats: Permissions Violation for Publish to "radixgate.sync.test.load""#,
            r#"nats: Permissions Violation for Publish to "$JS.API.STREAM.INFO.X""#,
            r#"nats: Permissions Violation for Subscription to "radixgate.sync.prod.inserts""#,
        ] {
            assert_eq!(of(other), Reported::Permission, "{other}");
        }
        assert_eq!(of("nats: maximum payload exceeded"), Reported::Other);
    }

    #[test]
    fn a_recurring_condition_is_logged_once_a_minute_with_its_count() {
        let mut t = Throttle::default();
        let start = Instant::now();
        assert_eq!(t.note(start), Some((1, 1)));
        for i in 1..=5 {
            assert_eq!(t.note(start + Duration::from_secs(i)), None);
        }
        assert_eq!(t.note(start + FAILING_EVERY), Some((7, 6)));
    }

    #[test]
    fn failures_are_counted_until_the_connection_is_up() {
        let f = Failures::default();
        for _ in 0..5 {
            f.failed("inserts", "IO error");
        }
        let s = f.state.lock().unwrap();
        assert_eq!((s.total, s.unlogged), (5, 4));
        drop(s);
        assert_eq!(f.recovered(), 5);
        assert_eq!(f.recovered(), 0);
    }
}
