//! Worker speeds in a simulated pool: each worker's speed at the start
//! (`--worker-speeds 0.5,1,1,1`) and changes at given simulated times
//! (`--speed-change W@T=F`), so a run can hold a slower GPU among faster
//! ones, or a worker that slows down (or recovers) mid-run.
//!
//! A speed is the engine's `timing.speed`: every step's duration is divided
//! by it. A change is an event of the simulation ([`Kind::SpeedChange`]):
//! steps that start at or after its time run at the new speed; a step under
//! way keeps the duration it started with, as on a real worker.
//!
//! [`Kind::SpeedChange`]: super::events::Kind::SpeedChange

use std::time::Duration;

use crate::SimError;
use crate::engine::check_speed;

/// The longest simulated time a speed change may be scheduled at (a year;
/// a bound only so that the time converts to a `Duration` without panic).
const MAX_AT_SECS: f64 = 365.0 * 86_400.0;

/// Speeds of the workers of one simulated pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolSpeeds {
    /// Speed of worker i at the start; workers past the end of the list run
    /// at the worker config's speed (1 unless `--speed` says otherwise).
    pub initial: Vec<f64>,
    /// Changes during the run, in any order.
    pub changes: Vec<SpeedChange>,
}

impl PoolSpeeds {
    /// Checks the speeds and that every worker named is in a pool of
    /// `workers`.
    pub fn validate(&self, workers: usize) -> Result<(), SimError> {
        if self.initial.len() > workers {
            return Err(SimError::Config(format!(
                "--worker-speeds gives {} speeds for {workers} workers",
                self.initial.len()
            )));
        }
        for (i, &s) in self.initial.iter().enumerate() {
            check_speed(&format!("--worker-speeds: the speed of worker {i}"), s)?;
        }
        for c in &self.changes {
            if c.worker >= workers {
                return Err(SimError::Config(format!(
                    "--speed-change {c}: no worker {} in a pool of {workers} (workers count from 0)",
                    c.worker
                )));
            }
            check_speed(&format!("--speed-change {c}: the speed"), c.speed)?;
        }
        Ok(())
    }

    /// Worker `i`'s speed at the start, given the worker config's `base`.
    pub fn initial_speed(&self, i: usize, base: f64) -> f64 {
        self.initial.get(i).copied().unwrap_or(base)
    }
}

/// At simulated time `at`, worker `worker`'s speed becomes `speed`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeedChange {
    /// The worker (0-based index in the pool).
    pub worker: usize,
    /// When, from the start of the run.
    pub at: Duration,
    /// The new speed.
    pub speed: f64,
}

impl SpeedChange {
    /// Parses `W@T=F`: worker index W, time T in simulated seconds (a
    /// decimal number), new speed F. The speed's range and W's are checked
    /// by [`PoolSpeeds::validate`], which knows the pool.
    pub fn parse(text: &str) -> Result<Self, SimError> {
        let bad = |why: String| {
            SimError::Config(format!(
                "--speed-change {text:?}: {why} (expected W@T=F, e.g. 0@10=0.5: worker 0 runs at half speed from simulated second 10)"
            ))
        };
        let (worker, rest) = text
            .split_once('@')
            .ok_or_else(|| bad("no '@' between the worker and the time".into()))?;
        let (at, speed) = rest
            .split_once('=')
            .ok_or_else(|| bad("no '=' between the time and the speed".into()))?;
        let worker: usize = worker
            .trim()
            .parse()
            .map_err(|_| bad(format!("the worker {worker:?} is not an index (0, 1, ...)")))?;
        let secs: f64 = at
            .trim()
            .parse()
            .map_err(|_| bad(format!("the time {at:?} is not a number of seconds")))?;
        if !secs.is_finite() || !(0.0..=MAX_AT_SECS).contains(&secs) {
            return Err(bad(format!(
                "the time must be in 0..={MAX_AT_SECS} seconds, got {secs}"
            )));
        }
        let speed: f64 = speed
            .trim()
            .parse()
            .map_err(|_| bad(format!("the speed {speed:?} is not a number")))?;
        Ok(Self {
            worker,
            at: Duration::from_secs_f64(secs),
            speed,
        })
    }
}

impl std::fmt::Display for SpeedChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}@{}={}",
            self.worker,
            self.at.as_secs_f64(),
            self.speed
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        SpeedChange::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn parses_changes_and_names_what_is_wrong() {
        assert_eq!(
            SpeedChange::parse("2@10.5=0.25").unwrap(),
            SpeedChange {
                worker: 2,
                at: Duration::from_millis(10_500),
                speed: 0.25
            }
        );
        assert_eq!(SpeedChange::parse(" 0 @ 0 = 1 ").unwrap().worker, 0);
        assert!(err("1=0.5").contains("no '@'"));
        assert!(err("1@5").contains("no '='"));
        assert!(err("x@5=1").contains("worker \"x\""));
        assert!(err("-1@5=1").contains("worker \"-1\""));
        assert!(err("1@soon=1").contains("time \"soon\""));
        assert!(err("1@-3=1").contains("time must be"));
        assert!(err("1@inf=1").contains("time must be"));
        assert!(err("1@5=fast").contains("speed \"fast\""));
        assert!(err("1@5=fast").contains("expected W@T=F"));
    }

    #[test]
    fn validation_knows_the_pool() {
        let ok = PoolSpeeds {
            initial: vec![0.5, 1.0],
            changes: vec![SpeedChange::parse("3@1=2").unwrap()],
        };
        ok.validate(4).unwrap();
        assert_eq!(ok.initial_speed(0, 1.0), 0.5);
        assert_eq!(ok.initial_speed(3, 0.8), 0.8, "missing entries: the base");
        let e = ok.validate(3).unwrap_err().to_string();
        assert!(e.contains("no worker 3 in a pool of 3"), "{e}");
        let e = ok.validate(1).unwrap_err().to_string();
        assert!(e.contains("2 speeds for 1 workers"), "{e}");
        let zero = PoolSpeeds {
            initial: vec![1.0, 0.0],
            ..PoolSpeeds::default()
        };
        let e = zero.validate(2).unwrap_err().to_string();
        assert!(e.contains("speed of worker 1"), "{e}");
        let too_fast = PoolSpeeds {
            changes: vec![SpeedChange::parse("0@1=500").unwrap()],
            ..PoolSpeeds::default()
        };
        let e = too_fast.validate(1).unwrap_err().to_string();
        assert!(e.contains("--speed-change 0@1=500"), "{e}");
    }
}
