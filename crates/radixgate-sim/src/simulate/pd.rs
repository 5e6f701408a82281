//! `radixgate simulate --pd P:D`: prefill/decode disaggregation against a
//! co-located pool of the same size, on the same workload and seed.
//!
//! Arms, in the report's order:
//! - `co-located`: P+D ordinary workers routed by the prefill policy (the
//!   pool a team would run without PD; [`cluster::run`]);
//! - `pd`: P prefill and D decode workers ([`pd_cluster::run`]);
//! - `pd` again with the other prefill policy (round_robin, or cache_aware
//!   when the prefill policy is round_robin), to show what cache awareness
//!   on the prefill pool is worth;
//! - with `--pd-skip-prefill-tokens N` (N > 0), `pd+skip`: the first PD
//!   arm, sending a request to decode alone when its decode worker holds all
//!   but at most N of its prompt tokens (the router's rule, with the decode
//!   engine's true cache in place of the router's prediction).
//!
//! The KV transfer's defaults describe an 8B-class model over one fast
//! link: [`DEFAULT_KV_BYTES_PER_TOKEN`] is Llama-3-8B's KV per token (the
//! engine model's own default model, see `engine::config`), and
//! [`DEFAULT_TRANSFER_BANDWIDTH`] is one 400 Gb/s RDMA NIC (50 GB/s), the
//! usual per-GPU network of disaggregated deployments; both are the
//! simulated worker's own defaults (`radixgate worker --transfer-bandwidth`,
//! `--kv-bytes-per-token`). At those, an 8,192-token prompt moves in
//! 21.5 ms. The decode policy's default is the router's (`pd.decode_policy`).

use std::time::{Duration, Instant};

use radixgate_routing::PolicyConfig;

use super::args::contender;
use super::pd_report::{ArmReport, PdReport};
use super::{Contender, SimConfig, cluster, pd_cluster};
use crate::SimError;
use crate::server::pd::{MAX_KV_BYTES_PER_TOKEN, TRANSFER_BANDWIDTH_RANGE};

/// KV bytes per token when none is given: Llama-3-8B's (2 x 32 layers x 8
/// KV heads x 128 x 2 bytes), as the engine model's defaults assume; the
/// simulated worker's `--kv-bytes-per-token` default.
pub use crate::server::pd::DEFAULT_KV_BYTES_PER_TOKEN;

/// Transfer bandwidth when none is given, bytes per second: one 400 Gb/s
/// RDMA NIC; the simulated worker's `--transfer-bandwidth` default.
pub use crate::server::pd::DEFAULT_TRANSFER_BANDWIDTH;

/// Largest `--pd-skip-prefill-tokens`, the router's limit: beyond a few
/// thousand tokens, decode would run a long prefill itself.
pub const MAX_SKIP_PREFILL_TOKENS: usize = 1 << 16;

/// The prefill policy when none is given.
pub const DEFAULT_PREFILL_POLICY: &str = "cache_aware";

/// The decode policy when none is given: the router's `pd.decode_policy`
/// default.
pub const DEFAULT_DECODE_POLICY: &str = "power_of_two";

/// Most workers in one pool (the co-located pool is their sum).
const MAX_POOL: usize = 2048;

/// `P:D`: prefill and decode workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PdShape {
    /// Prefill workers.
    pub prefill: usize,
    /// Decode workers.
    pub decode: usize,
}

impl PdShape {
    /// Parses `--pd`'s value, e.g. `2:2`.
    pub fn parse(s: &str) -> Result<Self, SimError> {
        let bad = |why: &str| SimError::Config(format!("--pd {s:?}: {why}"));
        let (p, d) = s
            .split_once(':')
            .ok_or_else(|| bad("expected P:D, the prefill and decode worker counts, e.g. 2:2"))?;
        let count = |v: &str, pool: &str| -> Result<usize, SimError> {
            let n: usize = v.trim().parse().map_err(|_| {
                bad(&format!(
                    "the {pool} worker count {v:?} is not a whole number (expected P:D, e.g. 2:2)"
                ))
            })?;
            if n == 0 {
                return Err(bad(&format!("the {pool} pool needs at least 1 worker")));
            }
            if n > MAX_POOL {
                return Err(bad(&format!(
                    "the {pool} pool may have at most {MAX_POOL} workers, got {n}"
                )));
            }
            Ok(n)
        };
        Ok(Self {
            prefill: count(p, "prefill")?,
            decode: count(d, "decode")?,
        })
    }
}

/// How KV moves from a prefill worker to a decode worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transfer {
    /// Link bandwidth, bytes per second.
    pub bytes_per_sec: f64,
    /// KV bytes per prompt token.
    pub kv_bytes_per_token: u64,
}

impl Default for Transfer {
    fn default() -> Self {
        Self {
            bytes_per_sec: DEFAULT_TRANSFER_BANDWIDTH,
            kv_bytes_per_token: DEFAULT_KV_BYTES_PER_TOKEN,
        }
    }
}

impl Transfer {
    /// A transfer at `bytes_per_sec` of `kv_bytes_per_token`, checked.
    pub fn new(bytes_per_sec: f64, kv_bytes_per_token: u64) -> Result<Self, SimError> {
        let t = Self {
            bytes_per_sec,
            kv_bytes_per_token,
        };
        t.validate()?;
        Ok(t)
    }

    /// Bandwidth finite, at least 1 MB/s and at most 100 TB/s; KV per token
    /// at least one byte.
    pub fn validate(&self) -> Result<(), SimError> {
        let (least, most) = TRANSFER_BANDWIDTH_RANGE;
        if !(least..=most).contains(&self.bytes_per_sec) {
            return Err(SimError::Config(format!(
                "--pd-transfer-bandwidth must be in {least}..={most} bytes per second \
                 (50000000000 is one 400 Gb/s NIC), got {}",
                self.bytes_per_sec
            )));
        }
        if !(1..=MAX_KV_BYTES_PER_TOKEN).contains(&self.kv_bytes_per_token) {
            return Err(SimError::Config(format!(
                "--pd-kv-bytes-per-token must be in 1..={MAX_KV_BYTES_PER_TOKEN}, got {}",
                self.kv_bytes_per_token
            )));
        }
        Ok(())
    }

    /// How long `tokens` tokens of KV take on the link.
    pub fn time(&self, tokens: usize) -> Duration {
        Duration::from_secs_f64(tokens as f64 * self.kv_bytes_per_token as f64 / self.bytes_per_sec)
    }
}

/// One PD arm: the pools, their policies, the link, and prefill skipping.
#[derive(Debug, Clone, PartialEq)]
pub struct PdArm {
    /// Prefill workers.
    pub prefill_workers: usize,
    /// Decode workers.
    pub decode_workers: usize,
    /// The prefill pool's policy.
    pub prefill_policy: PolicyConfig,
    /// The decode pool's policy.
    pub decode_policy: PolicyConfig,
    /// How the KV moves.
    pub transfer: Transfer,
    /// Send a request to decode alone when its decode worker lacks at most
    /// this many of its prompt tokens (`None`: never).
    pub skip_prefill_below: Option<usize>,
}

impl PdArm {
    /// Both pools non-empty, the link valid.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.prefill_workers == 0 || self.decode_workers == 0 {
            return Err(SimError::Config(format!(
                "a PD run needs at least one prefill and one decode worker, got {}:{}",
                self.prefill_workers, self.decode_workers
            )));
        }
        self.transfer.validate()
    }
}

/// Everything `--pd` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct PdPlan {
    /// The pools' sizes.
    pub shape: PdShape,
    /// The prefill pool's policy (and the co-located pool's).
    pub prefill_policy: PolicyConfig,
    /// The decode pool's policy.
    pub decode_policy: PolicyConfig,
    /// How the KV moves.
    pub transfer: Transfer,
    /// The skip-prefill arm's `--pd-skip-prefill-tokens`, if it runs (never
    /// 0: that is the router's "never", and no arm runs).
    pub skip_prefill_tokens: Option<usize>,
}

/// The policy `--prefill-policy`/`--decode-policy` (`flag`) names: one a
/// router runs, not one of the simulator's oracles.
pub fn router_policy(flag: &str, name: &str, seed: u64) -> Result<PolicyConfig, SimError> {
    match contender(name.trim(), seed).map_err(|e| SimError::Config(format!("{flag}: {e}")))? {
        Contender::Policy(p) => Ok(p),
        other => Err(SimError::Config(format!(
            "{flag}: {} is the simulator's reference, not a policy a router runs (use {})",
            other.name(),
            PolicyConfig::NAMES.join(", ")
        ))),
    }
}

/// `--pd-skip-prefill-tokens`, checked as the router checks it: at most
/// [`MAX_SKIP_PREFILL_TOKENS`]; 0 means never, so no pd+skip arm.
pub fn skip_prefill_tokens(tokens: Option<usize>) -> Result<Option<usize>, SimError> {
    match tokens {
        Some(n) if n > MAX_SKIP_PREFILL_TOKENS => Err(SimError::Config(format!(
            "--pd-skip-prefill-tokens must be at most {MAX_SKIP_PREFILL_TOKENS} tokens, got {n}"
        ))),
        Some(0) | None => Ok(None),
        some => Ok(some),
    }
}

impl PdPlan {
    fn arm(&self, prefill_policy: &PolicyConfig, skip: Option<usize>) -> PdArm {
        PdArm {
            prefill_workers: self.shape.prefill,
            decode_workers: self.shape.decode,
            prefill_policy: prefill_policy.clone(),
            decode_policy: self.decode_policy.clone(),
            transfer: self.transfer,
            skip_prefill_below: skip,
        }
    }

    /// The prefill policy the comparison arm runs: round_robin, or
    /// cache_aware when round_robin is the prefill policy.
    fn other_prefill_policy(&self, seed: u64) -> Result<PolicyConfig, SimError> {
        let name = if self.prefill_policy.name() == "round_robin" {
            "cache_aware"
        } else {
            "round_robin"
        };
        router_policy("--prefill-policy", name, seed)
    }

    /// Runs every arm on `cfg` (whose `workers` is replaced by P+D) and
    /// reports.
    pub fn execute(&self, cfg: &SimConfig) -> Result<PdReport, SimError> {
        let cfg = SimConfig {
            workers: self.shape.prefill + self.shape.decode,
            ..cfg.clone()
        };
        cfg.validate()?;
        self.transfer.validate()?;
        let mut report = PdReport {
            workload: cfg.workload.name().into(),
            arrivals: cfg.arrivals.describe(),
            seed: cfg.seed,
            api: cfg.api.path().into(),
            prefill_workers: self.shape.prefill,
            decode_workers: self.shape.decode,
            transfer_bandwidth: self.transfer.bytes_per_sec,
            kv_bytes_per_token: self.transfer.kv_bytes_per_token,
            skip_prefill_tokens: self.skip_prefill_tokens,
            arms: Vec::new(),
        };
        let started = Instant::now();
        let co = cluster::run(&cfg, &Contender::Policy(self.prefill_policy.clone()))?;
        report.arms.push(ArmReport::colocated(
            &self.prefill_policy,
            &co,
            started.elapsed().as_secs_f64(),
        ));
        let mut arms = vec![("pd", self.arm(&self.prefill_policy, None))];
        arms.push(("pd", self.arm(&self.other_prefill_policy(cfg.seed)?, None)));
        if let Some(t) = self.skip_prefill_tokens {
            arms.push(("pd+skip", self.arm(&self.prefill_policy, Some(t))));
        }
        for (name, arm) in &arms {
            let started = Instant::now();
            let stats = pd_cluster::run(&cfg, arm)?;
            report.arms.push(ArmReport::pd(
                name,
                arm,
                &stats,
                started.elapsed().as_secs_f64(),
            ));
        }
        Ok(report)
    }
}
