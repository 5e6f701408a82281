//! Fault knobs of one simulated worker, settable at start-up (flags) and at
//! run time (`POST /admin/faults`).
//!
//! Knobs: `error_rate` (fraction of generation requests answered with a 500,
//! drawn from a seeded generator, so a run is repeatable), `latency_ms`
//! (added before a generation request is processed), `hang` (generation
//! requests are accepted and never answered), `refuse` (the listener is
//! closed and open connections dropped, until cleared), `die_after_chunks`
//! (a streamed response is cut, without `[DONE]`, after K SSE events),
//! `slow_start_secs` (connections refused for S seconds after start, or
//! after the knob is set at run time), `unhealthy` (`/health` and
//! `/health_generate` answer 503), `slowdown` (every engine step started
//! while it is set takes that many times longer: a worker that turned slow,
//! e.g. thermally throttled or sharing its GPU), and two for the KV-event
//! publisher: `kv_events_stopped` (its sockets closed; clearing it restarts
//! it as a new publisher, sequence from 0) and `kv_events_drop` (the next N
//! batches after the knobs are set are withheld from subscribers but kept
//! for replay: a sequence gap), and one for prefill workers:
//! `drop_transfers` (that fraction of finished prefills never mark their
//! KV ready, so the decode worker's pull times out; drawn from the same
//! seeded generator). And `strict_models`: a generation request naming a
//! model the worker does not serve (its model, or a LoRA adapter loaded
//! into it) gets vLLM's 404 ("The model `m` does not exist."), where it is
//! otherwise served whatever it names; with the adapters loaded and
//! unloaded at run time, a worker that stops serving a model it was
//! listed with.
//!
//! Concurrency: the knobs and the generator sit behind one `parking_lot`
//! mutex: critical sections are a few loads or one random draw and never
//! cross an `.await`. Changes are announced on a `watch` channel that the
//! accept loop listens to (to close or reopen the listener). The engine task
//! reads `slowdown` once per step from a [`SlowdownCell`], an atomic, so the
//! step loop never takes the knobs' lock; a step already under way when the
//! knob changes keeps its duration. The KV-event publisher task gets its two
//! knobs on a `watch` channel of their own, on every change.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::SimError;

/// The largest accepted `slowdown`.
pub const MAX_SLOWDOWN: f64 = 1000.0;

/// The fault knobs (all off by default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultConfig {
    /// Fraction (0..=1) of generation requests answered with HTTP 500.
    pub error_rate: f64,
    /// Milliseconds added before each generation request is processed.
    pub latency_ms: u64,
    /// Accept generation requests and never answer them.
    pub hang: bool,
    /// Refuse connections (listener closed) until cleared.
    pub refuse: bool,
    /// Cut each streamed response after this many SSE events (no `[DONE]`).
    pub die_after_chunks: Option<u32>,
    /// Refuse connections for this many seconds after start (or after set).
    pub slow_start_secs: f64,
    /// Health endpoints answer 503.
    pub unhealthy: bool,
    /// Engine steps started while set take this many times longer
    /// (1 = none; 1..=1000).
    pub slowdown: f64,
    /// Seed of the error-rate draws.
    pub seed: u64,
    /// The KV-event publisher is stopped: sockets closed, batches lost
    /// (counted). Clearing it starts a new publisher on the same
    /// endpoints, as a restarted engine's: sequence from 0, empty replay
    /// buffer.
    pub kv_events_stopped: bool,
    /// Withhold the next N KV-event batches (after the knobs are set, or
    /// after start) from subscribers, keeping them for replay: subscribers
    /// see a sequence gap of N.
    pub kv_events_drop: u32,
    /// The KV-event publisher keeps its sockets and publishes nothing:
    /// batches are discarded (counted), as when an engine's publishing
    /// thread hangs while the engine serves. Subscribers see an idle
    /// engine whose cache changes unreported.
    pub kv_events_frozen: bool,
    /// Prefill workers: fraction (0..=1) of finished prefills whose KV is
    /// never marked ready, so the decode worker's pull times out.
    pub drop_transfers: f64,
    /// A generation request naming a model this worker does not serve
    /// (its model, or an adapter loaded) is answered 404, as vLLM answers
    /// it; off, any model named is served.
    pub strict_models: bool,
}

/// The fault knobs the KV-event publisher follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct KvEventsFaults {
    /// `kv_events_stopped`.
    pub(crate) stopped: bool,
    /// `kv_events_drop`.
    pub(crate) drop: u32,
    /// `kv_events_frozen`.
    pub(crate) frozen: bool,
}

impl From<&FaultConfig> for KvEventsFaults {
    fn from(c: &FaultConfig) -> Self {
        Self {
            stopped: c.kv_events_stopped,
            drop: c.kv_events_drop,
            frozen: c.kv_events_frozen,
        }
    }
}

impl Default for FaultConfig {
    fn default() -> Self {
        Self {
            error_rate: 0.0,
            latency_ms: 0,
            hang: false,
            refuse: false,
            die_after_chunks: None,
            slow_start_secs: 0.0,
            unhealthy: false,
            slowdown: 1.0,
            seed: 0,
            kv_events_stopped: false,
            kv_events_drop: 0,
            kv_events_frozen: false,
            drop_transfers: 0.0,
            strict_models: false,
        }
    }
}

impl FaultConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), SimError> {
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err(SimError::Config(format!(
                "faults.error_rate must be in 0..=1, got {}",
                self.error_rate
            )));
        }
        if !(0.0..=1.0).contains(&self.drop_transfers) {
            return Err(SimError::Config(format!(
                "faults.drop_transfers must be in 0..=1, got {}",
                self.drop_transfers
            )));
        }
        if !self.slow_start_secs.is_finite() || !(0.0..=86_400.0).contains(&self.slow_start_secs) {
            return Err(SimError::Config(format!(
                "faults.slow_start_secs must be in 0..=86400, got {}",
                self.slow_start_secs
            )));
        }
        if !self.slowdown.is_finite() || !(1.0..=MAX_SLOWDOWN).contains(&self.slowdown) {
            return Err(SimError::Config(format!(
                "faults.slowdown must be in 1..={MAX_SLOWDOWN} (1 = none), got {}",
                self.slowdown
            )));
        }
        if self.latency_ms > 3_600_000 {
            return Err(SimError::Config(
                "faults.latency_ms must be at most one hour".into(),
            ));
        }
        Ok(())
    }
}

/// Whether the listener should accept now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Accepting {
    /// Accept connections.
    Yes,
    /// Refuse until the knobs change.
    NoUntilChanged,
    /// Refuse until this instant (slow start), or until the knobs change.
    NoUntil(Instant),
}

struct Inner {
    config: FaultConfig,
    rng: StdRng,
    slow_until: Option<Instant>,
}

/// The `slowdown` knob as the engine task reads it: an `f64` stored as its
/// bits (written by the admin handler, read once per step).
#[derive(Debug, Clone)]
pub(crate) struct SlowdownCell(Arc<AtomicU64>);

impl SlowdownCell {
    fn new(factor: f64) -> Self {
        Self(Arc::new(AtomicU64::new(factor.to_bits())))
    }

    /// The current factor (1 = none).
    pub(crate) fn get(&self) -> f64 {
        // Relaxed: one independent value; a step that reads the old one
        // just started before the change.
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, factor: f64) {
        self.0.store(factor.to_bits(), Ordering::Relaxed);
    }
}

/// The live fault state of one worker.
pub(crate) struct Faults {
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
    slowdown: SlowdownCell,
    kv_events: watch::Sender<KvEventsFaults>,
}

impl Faults {
    /// Knobs as given at start-up; slow start counts from now.
    pub(crate) fn new(config: FaultConfig) -> Self {
        let (changed, _) = watch::channel(0);
        let slowdown = SlowdownCell::new(config.slowdown);
        let (kv_events, _) = watch::channel(KvEventsFaults::from(&config));
        let inner = Inner {
            rng: StdRng::seed_from_u64(config.seed),
            slow_until: slow_until(&config),
            config,
        };
        Self {
            inner: Mutex::new(inner),
            changed,
            slowdown,
            kv_events,
        }
    }

    /// A receiver of the KV-event publisher's knobs, marked changed on every
    /// `set` (so setting `kv_events_drop` again re-arms it).
    pub(crate) fn kv_events(&self) -> watch::Receiver<KvEventsFaults> {
        self.kv_events.subscribe()
    }

    /// The cell the engine task reads `slowdown` from.
    pub(crate) fn slowdown(&self) -> SlowdownCell {
        self.slowdown.clone()
    }

    /// The current knobs.
    pub(crate) fn get(&self) -> FaultConfig {
        self.inner.lock().config.clone()
    }

    /// Replaces the knobs (validated); reseeds the generator and restarts
    /// the slow-start clock.
    pub(crate) fn set(&self, config: FaultConfig) -> Result<(), SimError> {
        config.validate()?;
        {
            let mut inner = self.inner.lock();
            inner.rng = StdRng::seed_from_u64(config.seed);
            inner.slow_until = slow_until(&config);
            self.slowdown.set(config.slowdown);
            self.kv_events.send_replace(KvEventsFaults::from(&config));
            inner.config = config;
        }
        self.changed.send_modify(|v| *v += 1);
        Ok(())
    }

    /// A receiver that wakes on every change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Whether to accept connections now.
    pub(crate) fn accepting(&self) -> Accepting {
        let inner = self.inner.lock();
        if inner.config.refuse {
            return Accepting::NoUntilChanged;
        }
        match inner.slow_until {
            Some(t) if Instant::now() < t => Accepting::NoUntil(t),
            _ => Accepting::Yes,
        }
    }

    /// Whether a request must name a model this worker serves.
    pub(crate) fn strict_models(&self) -> bool {
        self.inner.lock().config.strict_models
    }

    /// One draw: should this generation request fail?
    pub(crate) fn draw_error(&self) -> bool {
        let mut inner = self.inner.lock();
        let rate = inner.config.error_rate;
        rate > 0.0 && inner.rng.random::<f64>() < rate
    }

    /// One draw: should this prefill's KV never be marked ready?
    pub(crate) fn draw_drop_transfer(&self) -> bool {
        let mut inner = self.inner.lock();
        let rate = inner.config.drop_transfers;
        rate > 0.0 && inner.rng.random::<f64>() < rate
    }
}

fn slow_until(config: &FaultConfig) -> Option<Instant> {
    (config.slow_start_secs > 0.0)
        .then(|| Instant::now() + Duration::from_secs_f64(config.slow_start_secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_draws_are_seeded_and_near_the_rate() {
        let cfg = FaultConfig {
            error_rate: 0.25,
            seed: 7,
            ..FaultConfig::default()
        };
        let a = Faults::new(cfg.clone());
        let b = Faults::new(cfg);
        let da: Vec<bool> = (0..2000).map(|_| a.draw_error()).collect();
        let db: Vec<bool> = (0..2000).map(|_| b.draw_error()).collect();
        assert_eq!(da, db);
        let n = da.iter().filter(|&&x| x).count();
        assert!((400..600).contains(&n), "{n} errors of 2000 at rate 0.25");
    }

    #[test]
    fn refuse_and_validation() {
        let f = Faults::new(FaultConfig::default());
        assert_eq!(f.accepting(), Accepting::Yes);
        let rx = f.subscribe();
        f.set(FaultConfig {
            refuse: true,
            ..FaultConfig::default()
        })
        .unwrap();
        assert!(rx.has_changed().unwrap());
        assert_eq!(f.accepting(), Accepting::NoUntilChanged);
        let bad = FaultConfig {
            error_rate: 2.0,
            ..FaultConfig::default()
        };
        assert!(f.set(bad).is_err());
        assert!(
            f.get().refuse,
            "a rejected change leaves the knobs as they were"
        );
    }

    #[test]
    fn slowdown_reaches_the_engine_cell_and_is_validated() {
        let f = Faults::new(FaultConfig {
            slowdown: 3.0,
            ..FaultConfig::default()
        });
        let cell = f.slowdown();
        assert_eq!(cell.get(), 3.0);
        f.set(FaultConfig::default()).unwrap();
        assert_eq!(cell.get(), 1.0, "replacing the knobs clears it");
        for bad in [0.5, 0.0, -2.0, 1000.5, f64::NAN, f64::INFINITY] {
            let e = f
                .set(FaultConfig {
                    slowdown: bad,
                    ..FaultConfig::default()
                })
                .unwrap_err()
                .to_string();
            assert!(e.contains("faults.slowdown"), "{bad}: {e}");
            assert_eq!(cell.get(), 1.0, "a rejected change leaves the cell");
        }
        // JSON without the knob: none.
        let c: FaultConfig = serde_json::from_str(r#"{"hang": false}"#).unwrap();
        assert_eq!(c.slowdown, 1.0);
    }
}
