//! Policy configuration: one serde schema, tagged by policy name.
//!
//! [`PolicyConfig`] is the routing part of the gateway's config file (and
//! what the simulator sweeps). Every struct denies unknown fields, so a typo
//! is a start-up error, and [`PolicyConfig::validate`] checks ranges with a
//! message naming the key. [`PolicyConfig::build`] is the only place a
//! policy name turns into a policy.
//!
//! Defaults are SGLang router's where it has the parameter (DESIGN §1):
//! `cache_threshold` 0.3, `balance_abs_threshold` 64,
//! `balance_rel_threshold` 1.5, `eviction_interval_secs` 120,
//! `max_tree_size` 2^26. The offline simulator's sweeps (`docs/defaults.md`)
//! kept the first three (lower `balance_abs_threshold` or higher
//! `cache_threshold` lost hit rate and TTFT) and chose radixgate's own:
//! `low_match` smallest_tree, `hot_spot` relative_cap with slack 8 and
//! factor 1.5, `match_granularity_chars` 64.

use crate::RoutingError;
use crate::correction::CorrectionConfig;
use crate::cost::CostModelConfig;
use crate::policy::{
    CacheAware, ConsistentHash, LeastLoad, Policy, PowerOfTwo, PrefillAware, Random, RoundRobin,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The routing policy and its settings, e.g. in YAML:
/// `{ policy: cache_aware, cache_threshold: 0.5 }` or
/// `{ policy: round_robin }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum PolicyConfig {
    /// Prefix-affinity routing with load balancing (the default).
    CacheAware(CacheAwareConfig),
    /// Least predicted prefill work (uncached prompt + queued work).
    PrefillAware(PrefillAwareConfig),
    /// Next worker in turn.
    RoundRobin(RoundRobinConfig),
    /// Uniformly random.
    Random(RandomConfig),
    /// Less loaded of two random workers.
    PowerOfTwo(PowerOfTwoConfig),
    /// Shortest queue.
    LeastLoad(LeastLoadConfig),
    /// Sticky sessions on a routing key, with bounded load.
    ConsistentHash(ConsistentHashConfig),
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self::CacheAware(CacheAwareConfig::default())
    }
}

impl PolicyConfig {
    /// The policy's name as spelled in config files.
    pub fn name(&self) -> &'static str {
        match self {
            Self::CacheAware(_) => "cache_aware",
            Self::PrefillAware(_) => "prefill_aware",
            Self::RoundRobin(_) => "round_robin",
            Self::Random(_) => "random",
            Self::PowerOfTwo(_) => "power_of_two",
            Self::LeastLoad(_) => "least_load",
            Self::ConsistentHash(_) => "consistent_hash",
        }
    }

    /// Checks every value's range.
    pub fn validate(&self) -> Result<(), RoutingError> {
        match self {
            Self::CacheAware(c) => c.validate(),
            Self::PrefillAware(c) => c.validate(),
            Self::ConsistentHash(c) => c.validate(),
            Self::RoundRobin(_) | Self::Random(_) | Self::PowerOfTwo(_) | Self::LeastLoad(_) => {
                Ok(())
            }
        }
    }

    /// The tree bounds (size, eviction, routing-text cap, correction) this
    /// policy's trees have, as cache_aware settings; a policy without trees
    /// has cache_aware's defaults. A decode pool's prefix record
    /// ([`Holding`](crate::policy::Holding)) takes the prefill policy's.
    pub fn tree_bounds(&self) -> CacheAwareConfig {
        match self {
            Self::CacheAware(c) => c.clone(),
            Self::PrefillAware(c) => c.as_cache_aware(),
            _ => CacheAwareConfig::default(),
        }
    }

    /// Validates, then builds the policy.
    pub fn build(&self) -> Result<Arc<dyn Policy>, RoutingError> {
        self.validate()?;
        Ok(match self {
            Self::CacheAware(c) => Arc::new(CacheAware::new(c.clone())),
            Self::PrefillAware(c) => Arc::new(PrefillAware::new(c.clone())),
            Self::RoundRobin(_) => Arc::new(RoundRobin::new()),
            Self::Random(c) => Arc::new(Random::new(c.seed)),
            Self::PowerOfTwo(c) => Arc::new(PowerOfTwo::new(c.seed)),
            Self::LeastLoad(_) => Arc::new(LeastLoad::new()),
            Self::ConsistentHash(c) => {
                Arc::new(ConsistentHash::new(c.virtual_nodes, c.load_factor))
            }
        })
    }
}

/// Where a request goes when its prefix match is too short.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LowMatchTarget {
    /// The least-loaded worker.
    MinLoad,
    /// The worker whose tree holds the fewest characters (most free cache),
    /// ties by load. Default, chosen with `radixgate simulate`
    /// (`docs/defaults.md`): new prefixes spread by cache footprint, so
    /// they land where they displace the least, and no worker ends up
    /// holding far more prefixes than it can cache. Against `min_load` it
    /// gave an equal or lower mean TTFT on every synthetic workload at 4 and
    /// 8 workers (e.g. zipf-skewed shared prefixes, 8 workers: 30 → 25 ms),
    /// a hit rate within 0.4 points, and a lower request spread on the
    /// mixed workload (1.29 → 1.19).
    #[default]
    SmallestTree,
}

/// Hot-spot protection for cache hits: when a holder of the request's
/// prefix is too busy to take it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case", deny_unknown_fields)]
pub enum HotSpotRule {
    /// Always honour a hit (the seed router's behaviour).
    Off,
    /// Honour a hit only while the holder's in-flight load is at most
    /// `max(min_load + slack, factor * mean_load)` over available workers;
    /// otherwise the least-loaded worker takes it (and becomes a holder).
    /// With `low_match: smallest_tree`, this is the rule radixgate shipped
    /// before the cost model (`CacheAwareConfig::seed_rule`).
    RelativeCap {
        /// Requests a holder may run above the least-loaded worker.
        #[serde(default = "default_slack")]
        slack: usize,
        /// Multiple of the mean load a holder may reach.
        #[serde(default = "default_factor")]
        factor: f64,
    },
    /// Decide by predicted time to first token (the cost model, `cost`):
    /// a hit is honoured while the holder's predicted TTFT is at most
    /// `best * (1 + margin) + slack_ms + repeat_ms² / reuse_ms`, where
    /// `best` is the least predicted TTFT in the pool and `repeat_ms` the
    /// predicted time the quickest worker would spend prefilling what the
    /// holder already holds; otherwise the least-loaded worker (the
    /// quickest of equals) takes it and becomes a holder. The last term is
    /// what a spill costs others: the pool computes that prefix again, and
    /// the requests that reach the
    /// quickest worker while it does (about `repeat_ms / reuse_ms` of
    /// them, `reuse_ms` standing for the gap between arrivals there) each
    /// wait up to `repeat_ms` behind it. Spilling a short hot prefix is
    /// cheap; spilling a long document rarely pays. Low-match requests go to the
    /// `low_match` target among the workers within `best * (1 + margin) +
    /// slack_ms`. Default.
    ///
    /// A match drawing more than its holders' share of the traffic is hot:
    /// `hot_share * share * workers >= holders`, with `share` the part of
    /// the recent requests whose text ran through it (the tree's demand
    /// count) and `holders` the workers holding it. A hot match goes to the
    /// least-loaded worker among those predicted within `best * (1 +
    /// hot_margin)` (a holder before a non-holder of the same load, then
    /// the quicker), so the prefix spreads over as many workers as its
    /// traffic needs, and its load stays even while it does.
    PredictedTtft {
        /// Relative slack over the best worker's predicted TTFT.
        #[serde(default = "default_ttft_margin")]
        margin: f64,
        /// Absolute slack, milliseconds.
        #[serde(default = "default_ttft_slack_ms")]
        slack_ms: f64,
        /// Scale of the repeated-prefill term, milliseconds (0: no term).
        #[serde(default = "default_ttft_reuse_ms")]
        reuse_ms: f64,
        /// `margin` while the pool overflows: at least one in a hundred of
        /// its recent answers reported a cache that had evicted what the
        /// tree said it held (correction's trims), or of its recent inserts
        /// evicted to keep a worker's share of the tree within its cache
        /// (`correction.capacity_bound`). A hit is then worth less than it
        /// looks, and tree sizes no longer say where there is room.
        #[serde(default = "default_ttft_overflow_margin")]
        overflow_margin: f64,
        /// Scale of the hot-match test (0: no match is hot).
        #[serde(default = "default_ttft_hot_share")]
        hot_share: f64,
        /// Relative slack over the best worker's predicted TTFT within
        /// which a hot match goes to the least-loaded worker.
        #[serde(default = "default_ttft_hot_margin")]
        hot_margin: f64,
    },
}

/// 8, chosen with `radixgate simulate` (`docs/defaults.md`): a holder may run
/// a few requests above the least-loaded worker before a hit spills, which
/// keeps long shared documents on their holders (long-doc, 2 workers: hit
/// rate 88% → 97% against slack 2) at a small cost in spread (≤ 1.16 on the
/// synthetic workloads up to 32 workers, except the mixed one).
fn default_slack() -> usize {
    8
}

fn default_factor() -> f64 {
    1.5
}

/// See `docs/defaults.md`, "The cost model".
fn default_ttft_margin() -> f64 {
    0.5
}

/// See `docs/correction.md`, "When the caches overflow".
fn default_ttft_overflow_margin() -> f64 {
    0.3
}

/// See `docs/defaults.md`, "The cost model".
fn default_ttft_slack_ms() -> f64 {
    10.0
}

/// See `docs/defaults.md`, "The cost model" and "A long document is
/// rarely worth computing twice".
fn default_ttft_reuse_ms() -> f64 {
    10.0
}

/// See `docs/defaults.md`, "Hot matches".
fn default_ttft_hot_share() -> f64 {
    1.5
}

/// See `docs/defaults.md`, "Hot matches".
fn default_ttft_hot_margin() -> f64 {
    0.25
}

impl HotSpotRule {
    /// The seed rule's cap: slack 8, factor 1.5.
    pub fn seed() -> Self {
        Self::RelativeCap {
            slack: default_slack(),
            factor: default_factor(),
        }
    }
}

impl Default for HotSpotRule {
    fn default() -> Self {
        Self::PredictedTtft {
            margin: default_ttft_margin(),
            slack_ms: default_ttft_slack_ms(),
            reuse_ms: default_ttft_reuse_ms(),
            overflow_margin: default_ttft_overflow_margin(),
            hot_share: default_ttft_hot_share(),
            hot_margin: default_ttft_hot_margin(),
        }
    }
}

/// The default of `max_routing_text_chars` (see [`CacheAwareConfig`]).
pub(crate) const DEFAULT_MAX_ROUTING_TEXT_CHARS: usize = 1 << 18;

/// Settings of [`CacheAware`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheAwareConfig {
    /// A hit needs `matched / input` strictly above this (`0..=1`).
    pub cache_threshold: f64,
    /// Imbalance needs `max - min` above this.
    pub balance_abs_threshold: usize,
    /// Imbalance needs `max` above this times `min` (`>= 1`).
    pub balance_rel_threshold: f64,
    /// Seconds between background eviction passes; 0 disables the task.
    pub eviction_interval_secs: u64,
    /// Characters each worker may keep in a tree after an eviction pass.
    pub max_tree_size: usize,
    /// Hard bound on all workers' characters in one model's tree, enforced
    /// on every insert, independent of the number of workers (so memory
    /// stays bounded between passes and does not grow with N). Each node
    /// counts as [`radixgate_tree::DEFAULT_NODE_CHARS`] characters more, so
    /// the bound holds memory whatever the prompts' shape.
    pub max_total_chars: usize,
    /// Target of low-match requests.
    pub low_match: LowMatchTarget,
    /// Hot-spot protection.
    pub hot_spot: HotSpotRule,
    /// Holders whose match is shorter than the deepest by less than this
    /// many characters count as tied with the deepest holder (ties go by
    /// load, then by depth, then recency). A KV cache reuses whole pages
    /// (vLLM: 16 tokens, about 64 characters), so a match a few characters
    /// longer saves no prefill. 0 or 1: only the deepest holders tie.
    /// Default 64, chosen with `radixgate simulate` (`docs/defaults.md`):
    /// a request that shares a system prompt no longer follows the few
    /// characters its question shares with an old one to a single worker,
    /// so such requests spread by load (shared-prefix, 8 workers: hit rate 92.1% → 93.0%,
    /// mean TTFT 38 → 35 ms; no workload worse beyond seed noise).
    pub match_granularity_chars: usize,
    /// Characters of a request's routing text that are matched and
    /// inserted into the tree; the rest is ignored (cut on a char
    /// boundary). Default 262144 (256 Ki chars, about 64k tokens): a
    /// shared prefix that long decides the route as well as the whole
    /// prompt does, and one 50 MB prompt cannot put 50 MB into the tree
    /// (nor cost a 50 MB match). Long-context prompts beyond it still
    /// route by their first 256 Ki characters.
    pub max_routing_text_chars: usize,
    /// The TTFT cost model (read by the `predicted_ttft` hot-spot rule,
    /// learned in every mode, and shown in the decision header).
    pub cost: CostModelConfig,
    /// Correction of the tree from the `cached_tokens` workers report
    /// (`correction.rs`).
    pub correction: CorrectionConfig,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        Self {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            eviction_interval_secs: 120,
            max_tree_size: 1 << 26,
            max_total_chars: 1 << 28,
            low_match: LowMatchTarget::default(),
            hot_spot: HotSpotRule::default(),
            match_granularity_chars: 64,
            max_routing_text_chars: DEFAULT_MAX_ROUTING_TEXT_CHARS,
            cost: CostModelConfig::default(),
            correction: CorrectionConfig::default(),
        }
    }
}

impl CacheAwareConfig {
    /// Checks ranges; the error names the offending key.
    pub fn validate(&self) -> Result<(), RoutingError> {
        if !(0.0..=1.0).contains(&self.cache_threshold) {
            return Err(RoutingError::config(
                "cache_threshold",
                format!("must be between 0 and 1, got {}", self.cache_threshold),
            ));
        }
        if !self.balance_rel_threshold.is_finite() || self.balance_rel_threshold < 1.0 {
            return Err(RoutingError::config(
                "balance_rel_threshold",
                format!(
                    "must be a finite number >= 1, got {}",
                    self.balance_rel_threshold
                ),
            ));
        }
        validate_text_cap(self.max_routing_text_chars)?;
        self.correction.validate()?;
        if self.balance_rel_threshold > MAX_RATIO {
            return Err(RoutingError::config(
                "balance_rel_threshold",
                format!(
                    "must be at most {MAX_RATIO}, got {}",
                    self.balance_rel_threshold
                ),
            ));
        }
        at_most(
            "balance_abs_threshold",
            self.balance_abs_threshold,
            MAX_LOAD,
        )?;
        at_most(
            "match_granularity_chars",
            self.match_granularity_chars,
            MAX_GRANULARITY_CHARS,
        )?;
        validate_tree_bounds(
            self.eviction_interval_secs,
            self.max_tree_size,
            self.max_total_chars,
        )?;
        if let HotSpotRule::RelativeCap { slack, factor } = self.hot_spot {
            if !factor.is_finite() || !(1.0..=MAX_RATIO).contains(&factor) {
                return Err(RoutingError::config(
                    "hot_spot.factor",
                    format!("must be a finite number between 1 and {MAX_RATIO}, got {factor}"),
                ));
            }
            at_most("hot_spot.slack", slack, MAX_LOAD)?;
        }
        if let HotSpotRule::PredictedTtft {
            margin,
            slack_ms,
            reuse_ms,
            overflow_margin,
            hot_share,
            hot_margin,
        } = self.hot_spot
        {
            if !reuse_ms.is_finite() || !(0.0..=MAX_TTFT_SLACK_MS).contains(&reuse_ms) {
                return Err(RoutingError::config(
                    "hot_spot.reuse_ms",
                    format!(
                        "must be a finite number between 0 and {MAX_TTFT_SLACK_MS}, got {reuse_ms}"
                    ),
                ));
            }
            for (key, margin) in [
                ("hot_spot.margin", margin),
                ("hot_spot.overflow_margin", overflow_margin),
                ("hot_spot.hot_share", hot_share),
                ("hot_spot.hot_margin", hot_margin),
            ] {
                if !margin.is_finite() || !(0.0..=MAX_RATIO).contains(&margin) {
                    return Err(RoutingError::config(
                        key,
                        format!("must be a finite number between 0 and {MAX_RATIO}, got {margin}"),
                    ));
                }
            }
            if !slack_ms.is_finite() || !(0.0..=MAX_TTFT_SLACK_MS).contains(&slack_ms) {
                return Err(RoutingError::config(
                    "hot_spot.slack_ms",
                    format!(
                        "must be a finite number between 0 and {MAX_TTFT_SLACK_MS}, got {slack_ms}"
                    ),
                ));
            }
        }
        self.cost.validate()
    }

    /// The rule radixgate routed by before the cost model, exactly: the
    /// in-flight hot-spot cap (slack 8, factor 1.5) and the smallest-tree
    /// low-match target, other settings at their defaults. Kept for
    /// comparison (`radixgate simulate --policies cache_aware_seed`).
    pub fn seed_rule() -> Self {
        Self {
            hot_spot: HotSpotRule::seed(),
            low_match: LowMatchTarget::SmallestTree,
            ..Self::default()
        }
    }
}

/// Largest `hot_spot.slack_ms` (a minute).
const MAX_TTFT_SLACK_MS: f64 = 60_000.0;

/// Settings of [`PrefillAware`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefillAwareConfig {
    /// The TTFT cost model, as in [`CacheAwareConfig`].
    pub cost: CostModelConfig,
    /// As in [`CacheAwareConfig`].
    pub eviction_interval_secs: u64,
    /// As in [`CacheAwareConfig`].
    pub max_tree_size: usize,
    /// As in [`CacheAwareConfig`].
    pub max_total_chars: usize,
    /// As in [`CacheAwareConfig`].
    pub max_routing_text_chars: usize,
    /// As in [`CacheAwareConfig`].
    pub correction: CorrectionConfig,
}

impl Default for PrefillAwareConfig {
    fn default() -> Self {
        let c = CacheAwareConfig::default();
        Self {
            cost: c.cost,
            eviction_interval_secs: c.eviction_interval_secs,
            max_tree_size: c.max_tree_size,
            max_total_chars: c.max_total_chars,
            max_routing_text_chars: c.max_routing_text_chars,
            correction: c.correction,
        }
    }
}

impl PrefillAwareConfig {
    /// The cache_aware settings prefill_aware runs as: always the worker
    /// with the least predicted TTFT (`predicted_ttft` with no margin), the
    /// least loaded among equals.
    pub fn as_cache_aware(&self) -> CacheAwareConfig {
        CacheAwareConfig {
            hot_spot: HotSpotRule::PredictedTtft {
                margin: 0.0,
                slack_ms: 0.0,
                reuse_ms: 0.0,
                overflow_margin: 0.0,
                hot_share: 0.0,
                hot_margin: 0.0,
            },
            low_match: LowMatchTarget::MinLoad,
            cost: self.cost,
            eviction_interval_secs: self.eviction_interval_secs,
            max_tree_size: self.max_tree_size,
            max_total_chars: self.max_total_chars,
            max_routing_text_chars: self.max_routing_text_chars,
            correction: self.correction,
            ..CacheAwareConfig::default()
        }
    }

    /// Checks ranges; the error names the offending key.
    pub fn validate(&self) -> Result<(), RoutingError> {
        self.cost.validate()?;
        validate_tree_bounds(
            self.eviction_interval_secs,
            self.max_tree_size,
            self.max_total_chars,
        )?;
        validate_text_cap(self.max_routing_text_chars)?;
        self.correction.validate()
    }
}

/// Longest eviction period: a day (trees would grow to their hard bound
/// long before), and small enough that a timer never overflows.
const MAX_EVICTION_INTERVAL_SECS: u64 = 86_400;
/// Largest load-like setting (requests): far above any pool's in-flight
/// count, and small enough that adding a load to it never overflows.
const MAX_LOAD: usize = 1_000_000;
/// Largest ratio-like setting (relative thresholds, factors).
const MAX_RATIO: f64 = 1_000.0;
/// Largest `match_granularity_chars` (1 Mi characters).
const MAX_GRANULARITY_CHARS: usize = 1 << 20;

fn at_most<T: PartialOrd + std::fmt::Display>(
    field: &'static str,
    value: T,
    max: T,
) -> Result<(), RoutingError> {
    if value > max {
        return Err(RoutingError::config(
            field,
            format!("must be at most {max}, got {value}"),
        ));
    }
    Ok(())
}

fn validate_text_cap(max_routing_text_chars: usize) -> Result<(), RoutingError> {
    if max_routing_text_chars == 0 {
        return Err(RoutingError::config(
            "max_routing_text_chars",
            "must be at least 1",
        ));
    }
    Ok(())
}

fn validate_tree_bounds(
    eviction_interval_secs: u64,
    max_tree_size: usize,
    max_total_chars: usize,
) -> Result<(), RoutingError> {
    at_most(
        "eviction_interval_secs",
        eviction_interval_secs,
        MAX_EVICTION_INTERVAL_SECS,
    )?;
    if max_tree_size == 0 {
        return Err(RoutingError::config("max_tree_size", "must be at least 1"));
    }
    if max_total_chars < max_tree_size {
        return Err(RoutingError::config(
            "max_total_chars",
            format!("must be at least max_tree_size ({max_tree_size}), got {max_total_chars}"),
        ));
    }
    Ok(())
}

/// Settings of [`RoundRobin`] (none yet).
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoundRobinConfig {}

/// Settings of [`LeastLoad`] (none yet).
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeastLoadConfig {}

/// Settings of [`Random`].
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RandomConfig {
    /// Seed for reproducible choices; unset: a fresh seed per process.
    pub seed: Option<u64>,
}

/// Settings of [`PowerOfTwo`].
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PowerOfTwoConfig {
    /// Seed for reproducible choices; unset: a fresh seed per process.
    pub seed: Option<u64>,
}

/// Settings of [`ConsistentHash`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsistentHashConfig {
    /// Ring points per worker (more: smoother shares, larger ring).
    pub virtual_nodes: usize,
    /// A worker takes a key only while its in-flight load is below
    /// `ceil(load_factor * (total + 1) / workers)` (`>= 1`).
    pub load_factor: f64,
}

impl Default for ConsistentHashConfig {
    fn default() -> Self {
        Self {
            virtual_nodes: 160,
            load_factor: 1.25,
        }
    }
}

impl ConsistentHashConfig {
    /// Checks ranges; the error names the offending key.
    pub fn validate(&self) -> Result<(), RoutingError> {
        if self.virtual_nodes == 0 || self.virtual_nodes > 10_000 {
            return Err(RoutingError::config(
                "virtual_nodes",
                format!("must be between 1 and 10000, got {}", self.virtual_nodes),
            ));
        }
        if !self.load_factor.is_finite() || !(1.0..=MAX_RATIO).contains(&self.load_factor) {
            return Err(RoutingError::config(
                "load_factor",
                format!(
                    "must be a finite number between 1 and {MAX_RATIO}, got {}",
                    self.load_factor
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<PolicyConfig, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let PolicyConfig::CacheAware(c) = parse(r#"{"policy":"cache_aware"}"#).unwrap() else {
            panic!("wrong variant")
        };
        assert_eq!(c, CacheAwareConfig::default());
        assert_eq!(c.cache_threshold, 0.3);
        assert_eq!(c.balance_abs_threshold, 64);
        assert_eq!(c.balance_rel_threshold, 1.5);
        assert_eq!(c.eviction_interval_secs, 120);
        assert_eq!(c.max_tree_size, 1 << 26);
        assert_eq!(c.match_granularity_chars, 64);
        assert_eq!(PolicyConfig::default().name(), "cache_aware");
    }

    #[test]
    fn every_policy_parses_and_builds() {
        for (json, name) in [
            (
                r#"{"policy":"cache_aware","cache_threshold":0.5,"low_match":"smallest_tree","hot_spot":{"rule":"off"}}"#,
                "cache_aware",
            ),
            (
                r#"{"policy":"prefill_aware","cost":{"window":16}}"#,
                "prefill_aware",
            ),
            (r#"{"policy":"round_robin"}"#, "round_robin"),
            (r#"{"policy":"random","seed":3}"#, "random"),
            (r#"{"policy":"power_of_two"}"#, "power_of_two"),
            (r#"{"policy":"least_load"}"#, "least_load"),
            (
                r#"{"policy":"consistent_hash","virtual_nodes":10}"#,
                "consistent_hash",
            ),
        ] {
            let cfg = parse(json).unwrap();
            assert_eq!(cfg.name(), name);
            assert_eq!(cfg.build().unwrap().name(), name);
        }
    }

    #[test]
    fn unknown_fields_and_policies_are_rejected() {
        let err = parse(r#"{"policy":"cache_aware","cache_treshold":0.5}"#).unwrap_err();
        assert!(err.to_string().contains("cache_treshold"), "{err}");
        assert!(parse(r#"{"policy":"round_robin","seed":1}"#).is_err());
        assert!(parse(r#"{"policy":"fastest"}"#).is_err());
        assert!(
            parse(r#"{"policy":"cache_aware","hot_spot":{"rule":"relative_cap","slak":1}}"#)
                .is_err()
        );
    }

    #[test]
    fn out_of_range_values_name_their_key() {
        let bad = |c: CacheAwareConfig| match c.validate().unwrap_err() {
            RoutingError::InvalidConfig { field, .. } => field,
            other => panic!("unexpected {other:?}"),
        };
        let d = CacheAwareConfig::default;
        assert_eq!(
            bad(CacheAwareConfig {
                cache_threshold: 1.5,
                ..d()
            }),
            "cache_threshold"
        );
        assert_eq!(
            bad(CacheAwareConfig {
                cache_threshold: f64::NAN,
                ..d()
            }),
            "cache_threshold"
        );
        assert_eq!(
            bad(CacheAwareConfig {
                balance_rel_threshold: 0.9,
                ..d()
            }),
            "balance_rel_threshold"
        );
        assert_eq!(
            bad(CacheAwareConfig {
                max_tree_size: 0,
                ..d()
            }),
            "max_tree_size"
        );
        assert_eq!(
            bad(CacheAwareConfig {
                max_total_chars: 10,
                ..d()
            }),
            "max_total_chars"
        );
        assert_eq!(
            bad(CacheAwareConfig {
                hot_spot: HotSpotRule::RelativeCap {
                    slack: 1,
                    factor: 0.5
                },
                ..d()
            }),
            "hot_spot.factor"
        );
        for (margin, overflow_margin, hot_share, hot_margin, key) in [
            (-1.0, 0.3, 1.0, 0.25, "hot_spot.margin"),
            (0.5, f64::INFINITY, 1.0, 0.25, "hot_spot.overflow_margin"),
            (0.5, -0.1, 1.0, 0.25, "hot_spot.overflow_margin"),
            (0.5, 0.3, f64::NAN, 0.25, "hot_spot.hot_share"),
            (0.5, 0.3, -1.0, 0.25, "hot_spot.hot_share"),
            (0.5, 0.3, 1.0, -0.5, "hot_spot.hot_margin"),
            (0.5, 0.3, 1.0, f64::NAN, "hot_spot.hot_margin"),
        ] {
            let rule = HotSpotRule::PredictedTtft {
                margin,
                slack_ms: 10.0,
                reuse_ms: 50.0,
                overflow_margin,
                hot_share,
                hot_margin,
            };
            assert_eq!(
                bad(CacheAwareConfig {
                    hot_spot: rule,
                    ..d()
                }),
                key
            );
        }
        let msg = PolicyConfig::CacheAware(CacheAwareConfig {
            cache_threshold: -0.1,
            ..d()
        })
        .build()
        .unwrap_err()
        .to_string();
        assert_eq!(
            msg,
            "invalid routing configuration: `cache_threshold` must be between 0 and 1, got -0.1"
        );
        assert!(
            ConsistentHashConfig {
                virtual_nodes: 0,
                ..Default::default()
            }
            .validate()
            .is_err()
        );
        for (config, key) in [
            (
                CacheAwareConfig {
                    eviction_interval_secs: u64::MAX,
                    ..d()
                },
                "eviction_interval_secs",
            ),
            (
                CacheAwareConfig {
                    balance_rel_threshold: 1e300,
                    ..d()
                },
                "balance_rel_threshold",
            ),
            (
                CacheAwareConfig {
                    hot_spot: HotSpotRule::RelativeCap {
                        slack: usize::MAX,
                        factor: 1.5,
                    },
                    ..d()
                },
                "hot_spot.slack",
            ),
            (
                CacheAwareConfig {
                    match_granularity_chars: usize::MAX,
                    ..d()
                },
                "match_granularity_chars",
            ),
        ] {
            assert_eq!(bad(config), key);
        }
        assert!(
            PrefillAwareConfig {
                eviction_interval_secs: MAX_EVICTION_INTERVAL_SECS + 1,
                ..Default::default()
            }
            .validate()
            .is_err()
        );
        assert!(
            ConsistentHashConfig {
                load_factor: f64::MAX,
                ..Default::default()
            }
            .validate()
            .is_err()
        );
        assert!(
            ConsistentHashConfig {
                load_factor: 0.5,
                ..Default::default()
            }
            .validate()
            .is_err()
        );
    }
}
