//! A weighted blend of other workloads.
//!
//! Each request comes from a part drawn by weight; if that part has nothing
//! ready, the others are tried in order. Session and group ids are
//! namespaced (`id * parts + index`) so parts never collide, and replies are
//! routed back to the part that issued the session. Trace replay cannot be
//! blended (its arrivals are fixed), nor can a blend be nested.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::rng::{SplitMix64, key};
use super::{Poll, SessionId, TextShape, Workload, WorkloadConfig};
use crate::SimError;

const MIX: u64 = 51;

/// One part of a blend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixedPart {
    /// Relative weight (> 0).
    pub weight: f64,
    /// The workload.
    pub workload: WorkloadConfig,
}

/// Settings of [`Mixed`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixedConfig {
    /// The parts.
    pub parts: Vec<MixedPart>,
}

impl Default for MixedConfig {
    /// Shared-prefix 4 : multi-turn 3 : agentic 2 : long-doc 1, each with its
    /// own defaults.
    fn default() -> Self {
        let part = |weight, workload| MixedPart { weight, workload };
        Self {
            parts: vec![
                part(4.0, WorkloadConfig::SharedPrefix(Default::default())),
                part(3.0, WorkloadConfig::MultiTurn(Default::default())),
                part(2.0, WorkloadConfig::Agentic(Default::default())),
                part(1.0, WorkloadConfig::LongDoc(Default::default())),
            ],
        }
    }
}

impl MixedConfig {
    /// Checks weights and parts.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.parts.is_empty() {
            return Err(SimError::Config("mixed: no parts".into()));
        }
        for p in &self.parts {
            if !p.weight.is_finite() || p.weight <= 0.0 {
                return Err(SimError::Config(format!(
                    "mixed: weight must be > 0, got {}",
                    p.weight
                )));
            }
            match &p.workload {
                WorkloadConfig::Trace(_) | WorkloadConfig::Mixed(_) => {
                    return Err(SimError::Config(format!(
                        "mixed: a {} workload cannot be blended",
                        p.workload.name()
                    )));
                }
                w => w.validate()?,
            }
        }
        Ok(())
    }
}

/// The blended workload.
pub struct Mixed {
    parts: Vec<Box<dyn Workload>>,
    cumulative: Vec<f64>,
    rng: SplitMix64,
}

impl std::fmt::Debug for Mixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mixed")
            .field("parts", &self.parts.len())
            .finish()
    }
}

impl Mixed {
    /// Builds the blend (validates `cfg`); each part gets its own seed.
    pub fn new(cfg: MixedConfig, seed: u64, shape: TextShape) -> Result<Self, SimError> {
        cfg.validate()?;
        let mut parts = Vec::with_capacity(cfg.parts.len());
        let mut cumulative = Vec::with_capacity(cfg.parts.len());
        let mut acc = 0.0;
        for (i, p) in cfg.parts.iter().enumerate() {
            parts.push(p.workload.build(key(seed, &[MIX, i as u64]), shape)?);
            acc += p.weight;
            cumulative.push(acc);
        }
        Ok(Self {
            parts,
            cumulative,
            rng: SplitMix64::new(key(seed, &[MIX])),
        })
    }

    fn n(&self) -> u64 {
        self.parts.len() as u64
    }
}

impl Workload for Mixed {
    fn next(&mut self, now: Duration) -> Poll {
        let total = *self.cumulative.last().unwrap_or(&1.0);
        let u = self.rng.next_f64() * total;
        let first = self
            .cumulative
            .partition_point(|&c| c <= u)
            .min(self.parts.len() - 1);
        let n = self.n();
        let mut earliest: Option<Duration> = None;
        let mut awaiting = false;
        for k in 0..self.parts.len() {
            let i = (first + k) % self.parts.len();
            match self.parts[i].next(now) {
                Poll::Ready(mut spec) => {
                    spec.session = spec.session * n + i as u64;
                    spec.group = spec.group * n + i as u64;
                    return Poll::Ready(spec);
                }
                Poll::NotBefore(t) => earliest = Some(earliest.map_or(t, |e| e.min(t))),
                Poll::AwaitReply => awaiting = true,
                Poll::Done => {}
            }
        }
        match (earliest, awaiting) {
            (Some(t), _) => Poll::NotBefore(t),
            (None, true) => Poll::AwaitReply,
            (None, false) => Poll::Done,
        }
    }

    fn on_reply(&mut self, session: SessionId, reply: &str, now: Duration) {
        let n = self.n();
        if let Some(p) = self.parts.get_mut((session % n) as usize) {
            p.on_reply(session / n, reply, now);
        }
    }

    fn on_failure(&mut self, session: SessionId, now: Duration) {
        let n = self.n();
        if let Some(p) = self.parts.get_mut((session % n) as usize) {
            p.on_failure(session / n, now);
        }
    }
}
