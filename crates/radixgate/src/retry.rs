//! Retrying a request on another worker: which failed attempts are worth
//! another try, and how long to wait before it.
//!
//! This is the one statement of the retry rule; the request path's attempt
//! loop ([`crate::proxy`]) and [`GatewayError::retryable`] both ask it.
//!
//! An attempt is retried only while nothing has reached the client, and only
//! when the failure says "this worker, now" rather than "this request": the
//! worker could not be reached, it answered 5xx or 429 (overloaded), or it
//! sent no first byte within the first-byte timeout (hung).
//! Another worker may well succeed then. Any other answer, success or client
//! error, belongs to the request and is passed through as it is.
//!
//! The pause between attempts grows geometrically up to a cap, and each
//! pause is jittered so that requests that failed together (one worker went
//! down under all of them) do not all come back at the same instant.

use crate::config::RetryConfig;
use crate::error::GatewayError;
use axum::http::StatusCode;
use rand::Rng;
use std::time::Duration;

mod budget;
mod paused;
pub(crate) use budget::{RetryBudget, Spent, Verdict};
pub(crate) use paused::Paused;

/// Whether a worker's answer with `status`, before any byte of it reached
/// the client, is worth trying on another worker: a server error (5xx) or
/// "too many requests" (429).
pub fn retryable_status(status: StatusCode) -> bool {
    status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS
}

/// Whether a failed attempt may succeed on another worker: a worker that
/// could not be reached or broke the connection before answering (it may
/// have begun the work: an engine that resets a connection has usually
/// restarted, and the work is lost), or one that answered with a
/// [retryable status](retryable_status), or a vLLM prefill worker that
/// answered without the `kv_transfer_params` decode needs (that worker's
/// setup or answer, not the request: another prefill worker serves it).
/// Everything else is the request's own fault or the gateway's, and
/// another worker would not change it.
pub fn retryable(err: &GatewayError) -> bool {
    match err {
        GatewayError::Connect { .. }
        | GatewayError::UpstreamClosed { .. }
        | GatewayError::UpstreamInvalid { .. }
        | GatewayError::FirstByteTimeout { .. }
        | GatewayError::WorkerLost { .. }
        | GatewayError::NoTransferParams { .. } => true,
        GatewayError::UpstreamStatus { status, .. } => retryable_status(*status),
        GatewayError::Disaggregated { source, .. } => retryable(source),
        _ => false,
    }
}

/// How many workers may break the connection on one request (take it and
/// close without answering, as an engine does when its process dies)
/// before it is retried no more. One broken connection is most often the
/// worker's own end (a restart, an out-of-memory kill), and another worker
/// answers; two on one request suggest the request kills engines (a prompt
/// that trips a crash), and each further retry would take down one more
/// worker, the pool in `max_retries` + 1 tries.
pub const MAX_BROKEN_CONNECTIONS: u32 = 2;

/// Counts the workers that broke the connection on one request (see
/// [`MAX_BROKEN_CONNECTIONS`]); a request that did so lately (one of the
/// [`Suspects`]) may break one only.
#[derive(Debug)]
pub(crate) struct Broken<'a> {
    suspects: &'a Suspects,
    model: Option<&'a str>,
    text: &'a str,
    body: &'a [u8],
    broke: u32,
    /// How many may break it; looked up at the first that does, so that
    /// a request no worker breaks costs nothing here.
    limit: Option<u32>,
}

impl<'a> Broken<'a> {
    /// The count for the request for `model` with routing text `text`
    /// and body `body`.
    pub(crate) fn new(
        suspects: &'a Suspects,
        model: Option<&'a str>,
        text: &'a str,
        body: &'a [u8],
    ) -> Self {
        Self {
            suspects,
            model,
            text,
            body,
            broke: 0,
            limit: None,
        }
    }

    /// Takes a failed attempt's error; the error to give up with instead
    /// of retrying, once `failure` makes too many broken connections (the
    /// request is then a suspect).
    pub(crate) fn count(&mut self, failure: GatewayError) -> Result<GatewayError, GatewayError> {
        let closed = match &failure {
            GatewayError::UpstreamClosed { .. } => true,
            GatewayError::Disaggregated { source, .. } => {
                matches!(**source, GatewayError::UpstreamClosed { .. })
            }
            _ => false,
        };
        if !closed {
            return Ok(failure);
        }
        self.broke += 1;
        let print = || Suspects::print(self.model, self.text, self.body);
        let limit = *self.limit.get_or_insert_with(|| {
            if self.suspects.holds(print) {
                1
            } else {
                MAX_BROKEN_CONNECTIONS
            }
        });
        if self.broke < limit {
            return Ok(failure);
        }
        let before = limit < MAX_BROKEN_CONNECTIONS;
        tracing::warn!(
            broke = self.broke,
            before,
            error = %failure,
            "workers broke the connection on this request; not retried, in case it is what breaks them"
        );
        self.suspects.add(print());
        Err(GatewayError::BrokeWorkers {
            broke: self.broke,
            before,
            last: Box::new(failure),
        })
    }
}

/// How long a request that broke workers' connections stays a suspect.
const SUSPECT_FOR: Duration = Duration::from_secs(600);

/// The most suspects held; the oldest goes first.
const MAX_SUSPECTS: usize = 1024;

/// The requests that broke [`MAX_BROKEN_CONNECTIONS`] workers' connections
/// in the last [`SUSPECT_FOR`], by a hash of their model and routing text
/// (of their body where they have none: a request routed by load or not
/// routed at all, whose routing text is empty, is not every other such
/// request for its model).
/// The same request again (most often the client's own retry: OpenAI's
/// SDKs retry a 502 twice) goes to one worker only, and is not retried if
/// that one breaks too: a prompt that crashes engines takes down one more
/// worker per client retry, not two. If the breaks were chance (two
/// workers restarting at once), a healthy worker answers it at the first
/// try. A request is looked up only once a worker has broken the
/// connection on it, and nothing is hashed while no suspect is held.
#[derive(Debug, Default)]
pub(crate) struct Suspects {
    held: parking_lot::Mutex<Vec<(u64, std::time::Instant)>>,
    any: std::sync::atomic::AtomicBool,
}

impl Suspects {
    /// The request for `model` with routing text `text` and body `body`,
    /// as the suspects are held: by its text, or its body where its text is
    /// empty.
    fn print(model: Option<&str>, text: &str, body: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        let hasher = foldhash::quality::FixedState::with_seed(0x5eed_b40c);
        match text {
            "" => hasher.hash_one((model, false, body)),
            text => hasher.hash_one((model, true, text)),
        }
    }

    /// Whether the request whose [`print`](Self::print) `print` makes is
    /// a suspect; it is made only while some suspect is held.
    fn holds(&self, print: impl FnOnce() -> u64) -> bool {
        use std::sync::atomic::Ordering;
        if !self.any.load(Ordering::Relaxed) {
            return false;
        }
        let print = print();
        let mut held = self.held.lock();
        let now = std::time::Instant::now();
        held.retain(|&(_, since)| now.duration_since(since) < SUSPECT_FOR);
        self.any.store(!held.is_empty(), Ordering::Relaxed);
        held.iter().any(|&(p, _)| p == print)
    }

    fn add(&self, print: u64) {
        let mut held = self.held.lock();
        held.retain(|&(p, _)| p != print);
        if held.len() >= MAX_SUSPECTS {
            held.remove(0);
        }
        held.push((print, std::time::Instant::now()));
        self.any.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The `reason` label a retry is counted under in the metrics.
pub(crate) fn reason(err: &GatewayError) -> &'static str {
    match err {
        GatewayError::Connect { .. } => "connect",
        GatewayError::UpstreamClosed { .. } => "closed",
        GatewayError::UpstreamInvalid { .. } => "invalid",
        GatewayError::FirstByteTimeout { .. } | GatewayError::RequestTimeout { .. } => "timeout",
        GatewayError::WorkerLost { moved: true, .. } => "moved",
        GatewayError::WorkerLost { .. } => "worker_lost",
        GatewayError::Disaggregated { source, .. } => reason(source),
        GatewayError::ModelNotServed { .. } => "model_not_served",
        _ => "status",
    }
}

/// The pauses between one request's attempts: the first is
/// `initial_backoff_ms`, each next one `backoff_multiplier` times longer but
/// at most `max_backoff_ms`, and every pause is jittered by
/// ±`jitter_factor`.
#[derive(Clone, Debug)]
pub struct Backoff {
    next: Duration,
    multiplier: f64,
    max: Duration,
    jitter_factor: f64,
}

impl Backoff {
    /// The back-off of a request's first retry.
    pub fn new(config: &RetryConfig) -> Self {
        Self {
            next: Duration::from_millis(config.initial_backoff_ms),
            multiplier: config.backoff_multiplier,
            max: Duration::from_millis(config.max_backoff_ms),
            jitter_factor: config.jitter_factor,
        }
    }

    /// The pause before the next attempt, jittered with `rng`; the one after
    /// it grows by the multiplier, up to the cap. The first pause is the
    /// initial back-off as configured (validation keeps it within the cap).
    pub fn pause(&mut self, rng: &mut impl Rng) -> Duration {
        let pause = jitter(self.next, self.jitter_factor, rng);
        self.next = scaled(self.next, self.multiplier).min(self.max);
        pause
    }
}

/// `base` spread uniformly by ±`factor` (never below zero); `base` itself
/// when `factor` is not positive (or not a number), without drawing from
/// `rng`. A factor above 1 counts as 1.
pub fn jitter(base: Duration, factor: f64, rng: &mut impl Rng) -> Duration {
    // NaN takes this branch too.
    if factor.is_nan() || factor <= 0.0 {
        return base;
    }
    let factor = factor.min(1.0);
    let spread = rng.random_range(-factor..=factor);
    scaled(base, 1.0 + spread)
}

/// `d * by`, saturating: validation bounds the settings, but the request
/// path must not panic on a value that slipped through (`Duration::mul_f64`
/// panics on overflow, NaN and negative factors).
fn scaled(d: Duration, by: f64) -> Duration {
    if by.is_nan() || by <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(d.as_secs_f64() * by).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn closed() -> GatewayError {
        GatewayError::UpstreamClosed {
            worker: "w".into(),
            source: "reset".into(),
        }
    }

    /// An attempt moved off a worker ejected as an outlier (slow, failing
    /// nothing) is told apart from one whose worker went away, in the
    /// retries' and the upstream errors' counts.
    #[test]
    fn a_moved_attempt_is_counted_as_moved_not_as_a_lost_worker() {
        let lost = |moved| GatewayError::WorkerLost {
            worker: "w".into(),
            after: Duration::from_secs(1),
            moved,
        };
        assert_eq!(reason(&lost(true)), "moved");
        assert_eq!(reason(&lost(false)), "worker_lost");
        assert_eq!(crate::proxy::no_first_byte_kind(&lost(true)), "moved");
        assert_eq!(
            crate::proxy::no_first_byte_kind(&lost(false)),
            "worker_lost"
        );
    }

    #[test]
    fn two_broken_connections_end_a_request_and_make_it_a_suspect() {
        let suspects = Suspects::default();
        let held = |model, text: &str| suspects.holds(|| Suspects::print(model, text, b"{}"));
        let mut broken = Broken::new(&suspects, Some("m"), "poison", b"{}");
        assert!(broken.count(upstream(StatusCode::BAD_GATEWAY)).is_ok());
        assert!(broken.count(closed()).is_ok());
        let err = broken.count(closed()).unwrap_err();
        assert!(matches!(
            err,
            GatewayError::BrokeWorkers {
                broke: 2,
                before: false,
                ..
            }
        ));
        assert!(held(Some("m"), "poison"));
        assert!(!held(None, "poison") && !held(Some("m"), "poisons"));
        // Another body of the same text is the same request.
        let mut again = Broken::new(&suspects, Some("m"), "poison", b"{\"n\":2}");
        let err = again.count(closed()).unwrap_err();
        assert!(matches!(
            err,
            GatewayError::BrokeWorkers {
                broke: 1,
                before: true,
                ..
            }
        ));
        // The oldest suspect goes when too many are held.
        for i in 0..MAX_SUSPECTS {
            suspects.add(Suspects::print(None, &i.to_string(), b""));
        }
        assert!(!held(Some("m"), "poison"));
        assert!(held(None, "1") && held(None, &(MAX_SUSPECTS - 1).to_string()));
    }

    #[test]
    fn a_request_without_routing_text_is_a_suspect_by_its_body() {
        let suspects = Suspects::default();
        let mut broken = Broken::new(&suspects, Some("m"), "", b"{\"query\":\"a\"}");
        assert!(broken.count(closed()).is_ok());
        assert!(broken.count(closed()).is_err());
        let held = |body: &[u8]| suspects.holds(|| Suspects::print(Some("m"), "", body));
        assert!(held(b"{\"query\":\"a\"}"));
        assert!(!held(b"{\"query\":\"b\"}"));
        // A text equal to the body's bytes is another request.
        assert!(!suspects.holds(|| Suspects::print(Some("m"), "{\"query\":\"a\"}", b"")));
    }

    fn upstream(status: StatusCode) -> GatewayError {
        GatewayError::UpstreamStatus {
            worker: "http://w:1".into(),
            status,
            message: None,
            retry_after: None,
        }
    }

    fn connect() -> GatewayError {
        GatewayError::Connect {
            worker: "http://w:1".into(),
            source: "refused".into(),
        }
    }

    #[test]
    fn server_errors_and_429_are_retried_other_answers_are_not() {
        for code in [500, 502, 503, 504, 429] {
            let status = StatusCode::from_u16(code).unwrap();
            assert!(retryable_status(status), "{code}");
            assert!(retryable(&upstream(status)), "{code}");
        }
        for code in [200, 201, 204, 301, 400, 401, 404, 413, 422] {
            let status = StatusCode::from_u16(code).unwrap();
            assert!(!retryable_status(status), "{code}");
            assert!(!retryable(&upstream(status)), "{code}");
        }
    }

    #[test]
    fn unreachable_workers_are_retried_gateway_and_client_errors_are_not() {
        assert!(retryable(&connect()));
        assert_eq!(reason(&connect()), "connect");
        let hung = GatewayError::FirstByteTimeout {
            worker: "http://w:1".into(),
            after: Duration::from_secs(1),
        };
        assert!(retryable(&hung));
        assert_eq!(reason(&hung), "timeout");
        assert_eq!(reason(&upstream(StatusCode::BAD_GATEWAY)), "status");
        for err in [
            GatewayError::Unauthorized,
            GatewayError::ShuttingDown,
            GatewayError::QueueFull { queue_size: 1 },
            GatewayError::NoHealthyWorker {
                model: Some("m".into()),
                why: "none is healthy".into(),
            },
            GatewayError::RequestTimeout {
                after: Duration::from_secs(1),
            },
            // Retries already spent are not retried again.
            GatewayError::RetriesExhausted {
                attempts: 2,
                last: Box::new(connect()),
            },
        ] {
            assert!(!retryable(&err), "{err}");
            assert_eq!(retryable(&err), err.retryable());
        }
    }

    #[test]
    fn back_off_starts_at_the_initial_value_grows_and_stops_at_the_cap() {
        let config = RetryConfig {
            max_retries: 10,
            initial_backoff_ms: 100,
            max_backoff_ms: 1000,
            backoff_multiplier: 2.0,
            jitter_factor: 0.0,
            ..RetryConfig::default()
        };
        let mut backoff = Backoff::new(&config);
        let mut rng = StdRng::seed_from_u64(7);
        let pauses: Vec<u64> = (0..7)
            .map(|_| backoff.pause(&mut rng).as_millis() as u64)
            .collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn back_off_with_multiplier_one_stays_put() {
        let config = RetryConfig {
            backoff_multiplier: 1.0,
            jitter_factor: 0.0,
            ..RetryConfig::default()
        };
        let mut backoff = Backoff::new(&config);
        let mut rng = StdRng::seed_from_u64(7);
        let first = backoff.pause(&mut rng);
        assert_eq!(first, Duration::from_millis(config.initial_backoff_ms));
        assert!((0..5).all(|_| backoff.pause(&mut rng) == first));
    }

    #[test]
    fn jitter_stays_within_its_factor_and_spreads() {
        let base = Duration::from_millis(1000);
        let mut rng = StdRng::seed_from_u64(42);
        let draws: Vec<Duration> = (0..1000).map(|_| jitter(base, 0.2, &mut rng)).collect();
        let (low, high) = (base.mul_f64(0.8), base.mul_f64(1.2));
        assert!(draws.iter().all(|d| (low..=high).contains(d)));
        // Spread both ways, not a constant offset.
        assert!(draws.iter().any(|d| *d < base.mul_f64(0.9)));
        assert!(draws.iter().any(|d| *d > base.mul_f64(1.1)));
    }

    #[test]
    fn jitter_never_goes_below_zero_and_zero_factor_is_exact() {
        let base = Duration::from_millis(50);
        let mut rng = StdRng::seed_from_u64(1);
        assert!((0..200).all(|_| jitter(base, 1.0, &mut rng) <= base * 2));
        assert_eq!(jitter(base, 0.0, &mut rng), base);
        assert_eq!(jitter(base, -0.5, &mut rng), base);
    }

    #[test]
    fn absurd_settings_saturate_instead_of_panicking() {
        // The issue's `--retry-backoff-multiplier 1e300`, with the cap out
        // of the way: validation refuses it, the arithmetic survives it.
        let config = RetryConfig {
            max_retries: 10,
            initial_backoff_ms: 50,
            max_backoff_ms: u64::MAX,
            backoff_multiplier: 1e300,
            jitter_factor: 1.0,
            ..RetryConfig::default()
        };
        let mut backoff = Backoff::new(&config);
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..5 {
            let _ = backoff.pause(&mut rng);
        }
        for factor in [f64::NAN, f64::INFINITY, 2.0] {
            let _ = jitter(Duration::MAX, factor, &mut rng);
        }
        for multiplier in [f64::NAN, f64::INFINITY, -1.0, 0.0] {
            let mut b = Backoff::new(&RetryConfig {
                backoff_multiplier: multiplier,
                ..config.clone()
            });
            let _ = (b.pause(&mut rng), b.pause(&mut rng));
        }
    }

    #[test]
    fn jittered_back_off_stays_around_its_schedule() {
        let config = RetryConfig {
            max_retries: 5,
            initial_backoff_ms: 100,
            max_backoff_ms: 300,
            backoff_multiplier: 2.0,
            jitter_factor: 0.5,
            ..RetryConfig::default()
        };
        let mut backoff = Backoff::new(&config);
        let mut rng = StdRng::seed_from_u64(3);
        for base in [100u64, 200, 300, 300] {
            let pause = backoff.pause(&mut rng).as_secs_f64() * 1000.0;
            let base = base as f64;
            assert!(
                pause >= base * 0.5 - 1e-6 && pause <= base * 1.5 + 1e-6,
                "{pause} vs {base}"
            );
        }
    }
}
