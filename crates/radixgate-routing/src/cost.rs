//! The time-to-first-token cost model: how long a request would wait for its
//! first token on a worker, learned online from the first bytes the router
//! sees.
//!
//! What a request waits for on a worker is the prefill queued ahead of it,
//! its own uncached prompt, and a fixed part (a forward pass, the network),
//! stretched a little by every request running there (decode steps share
//! the batch). The router knows each of these: the queued prefill is the
//! uncached part of the requests it sent there that have not had their
//! first token yet ([`Worker::pending_prefill`]); the uncached part comes
//! from its tree; the in-flight count from the load guards. So per worker
//! (and per model it serves):
//!
//! ```text
//! ttft = base + per_kchar * (queued + uncached) / 1024 + per_request * in_flight
//! ```
//!
//! The three coefficients are fitted online, by exponentially weighted
//! least squares over the worker's observed first tokens (each observation
//! is the work the decision saw and the time to the first byte), with a
//! ridge pull towards a configured seed so that a worker that has answered
//! nothing yet, or whose observations all look alike, still predicts
//! sensibly. Old observations fade with a configurable window; an
//! observation far off the current prediction (a pause, a lost packet) is
//! clipped to within a factor of it before it counts, so one outlier moves
//! the fit little while a worker that really turns slow moves it within a
//! window. Nothing here reads a clock: the caller passes the elapsed time,
//! so the simulator drives it in simulated time.
//!
//! Concurrency: predictions read three atomics (a decision reads them for
//! every candidate); an observation takes the estimator's mutex for a
//! few dozen floating-point operations and republishes the coefficients.
//! A reader may see coefficients from two consecutive fits: each is a
//! hint, and the next decision sees the rest.
//!
//! [`Worker::pending_prefill`]: crate::Worker::pending_prefill

use crate::RoutingError;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Settings of the cost model: the seed a worker starts from and how fast
/// the fit forgets.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostModelConfig {
    /// Seed: a worker's prefill speed, prompt characters per second, until
    /// its own first tokens say otherwise. Default 150,000 (about 37k
    /// tokens/s: an 8B model on one H100; the fit moves off it within a
    /// window of observations).
    pub prefill_chars_per_sec: f64,
    /// Seed: the fixed part of a first token, milliseconds (one forward
    /// pass and the network). Default 5.
    pub base_ms: f64,
    /// Seed: milliseconds each request in flight on the worker adds to a
    /// first token. Default 0.05.
    pub per_request_ms: f64,
    /// Observations over which old ones fade (the fit's memory); at least
    /// 2. Default 32: a worker that turns slow is seen as slow after a few
    /// dozen of its first tokens, i.e. within seconds at a few requests per
    /// second.
    pub window: u32,
}

impl Default for CostModelConfig {
    fn default() -> Self {
        Self {
            prefill_chars_per_sec: 150_000.0,
            base_ms: 5.0,
            per_request_ms: 0.05,
            window: 32,
        }
    }
}

impl CostModelConfig {
    /// Checks ranges; the error names the offending key.
    pub fn validate(&self) -> Result<(), RoutingError> {
        let positive = |key: &'static str, v: f64, max: f64| {
            if v.is_finite() && v > 0.0 && v <= max {
                Ok(())
            } else {
                Err(RoutingError::config(
                    key,
                    format!("must be a number above 0 and at most {max}, got {v}"),
                ))
            }
        };
        positive(
            "cost.prefill_chars_per_sec",
            self.prefill_chars_per_sec,
            1e12,
        )?;
        for (key, v) in [
            ("cost.base_ms", self.base_ms),
            ("cost.per_request_ms", self.per_request_ms),
        ] {
            if !v.is_finite() || !(0.0..=1e6).contains(&v) {
                return Err(RoutingError::config(
                    key,
                    format!("must be a number from 0 to 1000000, got {v}"),
                ));
            }
        }
        if !(2..=1_000_000).contains(&self.window) {
            return Err(RoutingError::config(
                "cost.window",
                format!("must be from 2 to 1000000, got {}", self.window),
            ));
        }
        Ok(())
    }

    /// The seed as coefficients.
    pub(crate) fn seed(&self) -> Coefficients {
        Coefficients {
            base_ms: self.base_ms,
            per_kchar_ms: KCHAR / self.prefill_chars_per_sec * 1000.0,
            per_request_ms: self.per_request_ms,
        }
    }
}

/// Characters per unit of the work coefficient.
const KCHAR: f64 = 1024.0;
/// Requests per unit of the in-flight coefficient in the fit (features are
/// scaled to similar magnitudes so the ridge pull is even).
const REQUESTS: f64 = 8.0;
/// An observation counts at most this factor above or below the current
/// prediction.
const CLIP: f64 = 4.0;
/// Weight of the seed in the fit, in observations.
const PRIOR: f64 = 1.0;

/// The model's three coefficients (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Coefficients {
    /// Milliseconds of every first token.
    pub base_ms: f64,
    /// Milliseconds per 1,024 characters of prefill (queued + own).
    pub per_kchar_ms: f64,
    /// Milliseconds per request in flight.
    pub per_request_ms: f64,
}

impl Coefficients {
    /// The mean of `fits` (`None` if there are none): what a worker that
    /// has not answered yet is assumed to be, given its peers.
    pub fn mean(fits: impl IntoIterator<Item = Coefficients>) -> Option<Coefficients> {
        let mut n = 0.0;
        let mut sum = [0.0; 3];
        for c in fits {
            n += 1.0;
            sum[0] += c.base_ms;
            sum[1] += c.per_kchar_ms;
            sum[2] += c.per_request_ms;
        }
        (n > 0.0).then(|| Coefficients {
            base_ms: sum[0] / n,
            per_kchar_ms: sum[1] / n,
            per_request_ms: sum[2] / n,
        })
    }

    /// Predicted time to first token for `work`, in milliseconds.
    pub fn predict_ms(&self, work: Work) -> f64 {
        self.base_ms
            + self.per_kchar_ms * work.prefill_chars() as f64 / KCHAR
            + self.per_request_ms * work.in_flight as f64
    }

    /// The worker's prefill speed these imply, characters per second.
    pub fn prefill_chars_per_sec(&self) -> f64 {
        KCHAR / self.per_kchar_ms * 1000.0
    }

    /// In the fit's scaled coordinates.
    fn scaled(self) -> [f64; 3] {
        [
            self.base_ms,
            self.per_kchar_ms,
            self.per_request_ms * REQUESTS,
        ]
    }

    fn from_scaled(t: [f64; 3]) -> Self {
        Self {
            base_ms: t[0],
            per_kchar_ms: t[1],
            per_request_ms: t[2] / REQUESTS,
        }
    }
}

/// What a request would wait behind on a worker, as a decision sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Prefill characters already queued there (sent, no first token yet).
    pub queued_chars: usize,
    /// This request's characters the worker is not predicted to hold.
    pub uncached_chars: usize,
    /// Requests in flight there.
    pub in_flight: usize,
}

impl Work {
    /// Queued plus own prefill characters.
    pub fn prefill_chars(&self) -> usize {
        self.queued_chars.saturating_add(self.uncached_chars)
    }

    fn features(&self) -> [f64; 3] {
        [
            1.0,
            self.prefill_chars() as f64 / KCHAR,
            self.in_flight as f64 / REQUESTS,
        ]
    }
}

/// One worker's fit for one model: published coefficients plus the
/// weighted sums they are solved from.
pub(crate) struct Estimator {
    /// `f64` bits of base, per-kchar and per-request; NaN until the first
    /// observation (then the seed is used).
    published: [AtomicU64; 3],
    fit: Mutex<Fit>,
}

/// Exponentially weighted normal equations of the fit.
#[derive(Default)]
struct Fit {
    /// Σ w x xᵀ, upper triangle: [00, 01, 02, 11, 12, 22].
    xx: [f64; 6],
    /// Σ w x t.
    xt: [f64; 3],
    /// Observations taken (saturating).
    count: u64,
}

impl Default for Estimator {
    fn default() -> Self {
        let nan = f64::NAN.to_bits();
        Self {
            published: [
                AtomicU64::new(nan),
                AtomicU64::new(nan),
                AtomicU64::new(nan),
            ],
            fit: Mutex::new(Fit::default()),
        }
    }
}

impl Estimator {
    /// The current coefficients, or `seed` before any observation.
    pub(crate) fn coefficients(&self, seed: &Coefficients) -> Coefficients {
        self.fitted().unwrap_or(*seed)
    }

    /// The fitted coefficients, `None` before the first observation. The
    /// three are stored one by one (NaN before the first fit): a read
    /// between the first fit's stores is no fit yet, never a NaN one.
    pub(crate) fn fitted(&self) -> Option<Coefficients> {
        let read = |i: usize| f64::from_bits(self.published[i].load(Ordering::Relaxed));
        let fit = Coefficients {
            base_ms: read(0),
            per_kchar_ms: read(1),
            per_request_ms: read(2),
        };
        [fit.base_ms, fit.per_kchar_ms, fit.per_request_ms]
            .iter()
            .all(|v| v.is_finite())
            .then_some(fit)
    }

    /// Observations taken so far.
    pub(crate) fn observations(&self) -> u64 {
        self.fit.lock().count
    }

    /// Takes one observation: a request that saw `work` got its first
    /// token after `elapsed`.
    pub(crate) fn observe(&self, work: Work, elapsed: Duration, cfg: &CostModelConfig) {
        let seed = cfg.seed();
        let current = self.coefficients(&seed);
        let predicted = current.predict_ms(work).max(1e-3);
        let t = (elapsed.as_secs_f64() * 1000.0).clamp(predicted / CLIP, predicted * CLIP);
        let x = work.features();
        let decay = 1.0 - 1.0 / f64::from(cfg.window.max(2));
        let mut fit = self.fit.lock();
        let Fit { xx, xt, count } = &mut *fit;
        for v in xx.iter_mut().chain(xt.iter_mut()) {
            *v *= decay;
        }
        let mut k = 0;
        for i in 0..3 {
            for j in i..3 {
                xx[k] += x[i] * x[j];
                k += 1;
            }
            xt[i] += x[i] * t;
        }
        *count = count.saturating_add(1);
        let Some(solved) = solve_ridge(xx, xt, seed.scaled()) else {
            return;
        };
        let seed_rate = seed.per_kchar_ms;
        let fitted = Coefficients::from_scaled(solved);
        // A fit may swing negative on a handful of similar observations;
        // keep it physical: no negative time, and some cost per character.
        let fitted = Coefficients {
            base_ms: fitted.base_ms.max(0.0),
            per_kchar_ms: fitted.per_kchar_ms.max(seed_rate * 1e-3),
            per_request_ms: fitted.per_request_ms.max(0.0),
        };
        for (slot, v) in
            self.published
                .iter()
                .zip([fitted.base_ms, fitted.per_kchar_ms, fitted.per_request_ms])
        {
            slot.store(v.to_bits(), Ordering::Relaxed);
        }
    }
}

/// Solves `(XX + PRIOR·I) θ = Xt + PRIOR·seed` for the symmetric 3×3 `XX`
/// given as its upper triangle. `None` if it is singular or not finite.
fn solve_ridge(xx: &[f64; 6], xt: &[f64; 3], seed: [f64; 3]) -> Option<[f64; 3]> {
    let a = [
        [xx[0] + PRIOR, xx[1], xx[2]],
        [xx[1], xx[3] + PRIOR, xx[4]],
        [xx[2], xx[4], xx[5] + PRIOR],
    ];
    let b = [
        xt[0] + PRIOR * seed[0],
        xt[1] + PRIOR * seed[1],
        xt[2] + PRIOR * seed[2],
    ];
    let det = |m: &[[f64; 3]; 3]| {
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    };
    let d = det(&a);
    if !d.is_finite() || d.abs() < 1e-12 {
        return None;
    }
    // Cramer's rule: small, branch-free, and exact enough for 3×3.
    let mut out = [0.0; 3];
    for (col, o) in out.iter_mut().enumerate() {
        let mut m = a;
        for (row, v) in b.iter().enumerate() {
            m[row][col] = *v;
        }
        *o = det(&m) / d;
    }
    out.iter().all(|v| v.is_finite()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three coefficients are published one by one: a decision that
    /// reads between the first fit's stores sees the first alone, and
    /// takes the seed rather than a NaN prediction.
    #[test]
    fn a_half_published_first_fit_is_no_fit() {
        let estimator = Estimator::default();
        assert!(estimator.fitted().is_none());
        estimator.published[0].store(2.0f64.to_bits(), Ordering::Relaxed);
        assert!(estimator.fitted().is_none(), "{:?}", estimator.fitted());
        estimator.published[1].store(0.5f64.to_bits(), Ordering::Relaxed);
        assert!(estimator.fitted().is_none());
        estimator.published[2].store(1.0f64.to_bits(), Ordering::Relaxed);
        let fit = estimator.fitted().unwrap();
        assert_eq!(
            (fit.base_ms, fit.per_kchar_ms, fit.per_request_ms),
            (2.0, 0.5, 1.0)
        );
    }

    fn work(prefill: usize, in_flight: usize) -> Work {
        Work {
            queued_chars: prefill / 2,
            uncached_chars: prefill - prefill / 2,
            in_flight,
        }
    }

    /// A worker that really takes `base + per_kchar·k + per_request·n` ms.
    fn truth(c: Coefficients, w: Work) -> Duration {
        Duration::from_secs_f64(c.predict_ms(w) / 1000.0)
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-9)
    }

    #[test]
    fn before_any_observation_the_seed_predicts() {
        let cfg = CostModelConfig::default();
        let e = Estimator::default();
        let c = e.coefficients(&cfg.seed());
        assert_eq!(c, cfg.seed());
        // 150k chars/s: 15,000 chars take 100 ms, plus the 5 ms base.
        let ms = c.predict_ms(Work {
            queued_chars: 10_000,
            uncached_chars: 5_000,
            in_flight: 0,
        });
        assert!(close(ms, 105.0, 1e-9), "{ms}");
        assert!(close(c.prefill_chars_per_sec(), 150_000.0, 1e-9));
    }

    #[test]
    fn the_fit_finds_a_worker_far_from_the_seed() {
        let cfg = CostModelConfig::default();
        // Three times slower per character than the seed, a larger base.
        let real = Coefficients {
            base_ms: 12.0,
            per_kchar_ms: 3.0 * cfg.seed().per_kchar_ms,
            per_request_ms: 0.2,
        };
        let e = Estimator::default();
        for i in 0..400usize {
            let w = work((i * 7919) % 40_000, (i * 31) % 50);
            e.observe(w, truth(real, w), &cfg);
        }
        let got = e.coefficients(&cfg.seed());
        assert!(close(got.per_kchar_ms, real.per_kchar_ms, 0.05), "{got:?}");
        assert!(close(got.base_ms, real.base_ms, 0.15), "{got:?}");
        // The seed's pull shows most on the intercept, least where the
        // observations were.
        for (w, rel) in [
            (work(0, 0), 0.15),
            (work(20_000, 10), 0.05),
            (work(60_000, 40), 0.05),
        ] {
            let (p, t) = (got.predict_ms(w), real.predict_ms(w));
            assert!(close(p, t, rel), "{w:?}: predicted {p} ms, real {t} ms");
        }
    }

    #[test]
    fn a_worker_that_turns_slow_is_seen_within_a_few_windows() {
        let cfg = CostModelConfig::default();
        let fast = Coefficients {
            base_ms: 5.0,
            per_kchar_ms: 7.0,
            per_request_ms: 0.05,
        };
        let slow = Coefficients {
            base_ms: 20.0,
            per_kchar_ms: 28.0,
            per_request_ms: 0.2,
        };
        let e = Estimator::default();
        let mut i = 0usize;
        let mut feed = |e: &Estimator, c: Coefficients, n: usize| {
            for _ in 0..n {
                let w = work((i * 7919) % 20_000, (i * 13) % 20);
                e.observe(w, truth(c, w), &cfg);
                i += 1;
            }
        };
        feed(&e, fast, 200);
        let probe = work(8_000, 4);
        let before = e.coefficients(&cfg.seed()).predict_ms(probe);
        assert!(close(before, fast.predict_ms(probe), 0.05), "{before}");
        // Four times slower: within three windows the prediction has moved
        // most of the way.
        feed(&e, slow, 3 * cfg.window as usize);
        let after = e.coefficients(&cfg.seed()).predict_ms(probe);
        assert!(
            after > 0.8 * slow.predict_ms(probe),
            "after {after} ms, slow truth {} ms",
            slow.predict_ms(probe)
        );
    }

    #[test]
    fn one_outlier_barely_moves_the_fit() {
        let cfg = CostModelConfig::default();
        let real = Coefficients {
            base_ms: 5.0,
            per_kchar_ms: 7.0,
            per_request_ms: 0.05,
        };
        let e = Estimator::default();
        for i in 0..200usize {
            let w = work((i * 7919) % 20_000, i % 10);
            e.observe(w, truth(real, w), &cfg);
        }
        let probe = work(8_000, 4);
        let before = e.coefficients(&cfg.seed()).predict_ms(probe);
        // A 30-second pause on a tiny request.
        e.observe(work(100, 1), Duration::from_secs(30), &cfg);
        let after = e.coefficients(&cfg.seed()).predict_ms(probe);
        assert!(after < 1.5 * before, "{before} → {after}");
        assert_eq!(e.observations(), 201);
    }

    #[test]
    fn identical_observations_stay_finite_and_near_the_seed_shape() {
        let cfg = CostModelConfig::default();
        let e = Estimator::default();
        let w = work(4_096, 2);
        for _ in 0..1000 {
            e.observe(w, Duration::from_millis(40), &cfg);
        }
        let c = e.coefficients(&cfg.seed());
        let p = c.predict_ms(w);
        assert!(close(p, 40.0, 0.05), "{c:?} predicts {p}");
        assert!(c.base_ms >= 0.0 && c.per_kchar_ms > 0.0 && c.per_request_ms >= 0.0);
    }

    #[test]
    fn bad_settings_are_named() {
        for (cfg, key) in [
            (
                CostModelConfig {
                    prefill_chars_per_sec: 0.0,
                    ..CostModelConfig::default()
                },
                "cost.prefill_chars_per_sec",
            ),
            (
                CostModelConfig {
                    base_ms: f64::NAN,
                    ..CostModelConfig::default()
                },
                "cost.base_ms",
            ),
            (
                CostModelConfig {
                    window: 1,
                    ..CostModelConfig::default()
                },
                "cost.window",
            ),
        ] {
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
        CostModelConfig::default().validate().unwrap();
    }
}
