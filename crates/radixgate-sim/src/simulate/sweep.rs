//! Parameter sweeps over policy settings: `--sweep cache_threshold=0.1,0.3`.
//!
//! A key names a field of a policy's config as in the gateway's YAML
//! (`cache_threshold`, `balance_abs_threshold`, `low_match`,
//! `cost.window`, …); nested fields use dots (`hot_spot.slack`,
//! `hot_spot.factor`, `hot_spot.rule`). Values are JSON scalars
//! (`0.3`, `64`) or bare words (`smallest_tree`, `off`). Settings are
//! applied through the policy's own serde schema, so a typo or a value of
//! the wrong type is the same error the gateway would give, and ranges are
//! checked by the policy's `validate`.
//!
//! Each policy is swept over the product of the axes whose keys it has; a
//! policy with none of the keys runs once, as a baseline.
//!
//! Two keys are settings of the run, not of a policy: `replicas` (router
//! replicas) and `sync_delay_ms` (a number, or `off` for no sync). Every
//! policy runs at every point of their grid ([`run_grid`]); points that
//! differ only in the sync delay of a single router are one point.

use radixgate_routing::PolicyConfig;
use serde_json::{Map, Value};

use super::replicas::ReplicaConfig;
use crate::SimError;

/// The keys that set the run's router replicas rather than a policy.
pub const RUN_KEYS: [&str; 2] = ["replicas", "sync_delay_ms"];

/// Whether `key` is one of [`RUN_KEYS`].
pub fn is_run_key(key: &str) -> bool {
    RUN_KEYS.contains(&key)
}

/// One `--sweep KEY=V1,V2,…`.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// The setting, dotted for nested fields.
    pub key: String,
    /// Its values, in the order given.
    pub values: Vec<Value>,
}

/// One point of a grid: settings in axis order.
pub type Point = Vec<(String, Value)>;

impl Axis {
    /// Parses `KEY=V1,V2,…`.
    pub fn parse(s: &str) -> Result<Self, SimError> {
        let bad = |why: &str| SimError::Config(format!("--sweep {s:?}: {why}"));
        let (key, values) = s
            .split_once('=')
            .ok_or_else(|| bad("expected KEY=V1,V2,…"))?;
        let key = key.trim();
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(bad("empty setting name"));
        }
        let mut parsed = Vec::new();
        for v in values.split(',').map(str::trim).filter(|v| !v.is_empty()) {
            let value = match serde_json::from_str(v) {
                Ok(value) => value,
                // JSON has no NaN or infinity; Rust's float parser takes
                // them, so name them here rather than let the setting
                // refuse a string.
                Err(_) if v.parse::<f64>().is_ok_and(|x| !x.is_finite()) => {
                    return Err(bad(&format!("{v} is not a finite number")));
                }
                Err(_) => Value::String(v.to_owned()),
            };
            parsed.push(value);
        }
        let values = parsed;
        if values.is_empty() {
            return Err(bad("no values"));
        }
        Ok(Self {
            key: key.to_owned(),
            values,
        })
    }
}

/// The policy's config as a JSON object (its serde form).
fn as_object(cfg: &PolicyConfig) -> Map<String, Value> {
    match serde_json::to_value(cfg) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// Whether `cfg`'s schema has the (dotted) setting `key`.
pub fn has_key(cfg: &PolicyConfig, key: &str) -> bool {
    let obj = as_object(cfg);
    let mut parts = key.split('.');
    let first = parts.next().unwrap_or_default();
    if first == "policy" {
        return false;
    }
    match (obj.get(first), parts.next()) {
        (Some(_), None) => true,
        // Nested (`hot_spot` is a tagged enum: any of its fields may be
        // set, even those its current variant lacks).
        (Some(Value::Object(_)), Some(_)) => true,
        _ => false,
    }
}

/// The grid of `axes` that applies to `cfg`: one empty point when none do.
pub fn grid_for(cfg: &PolicyConfig, axes: &[Axis]) -> Vec<Point> {
    let mut points: Vec<Point> = vec![Vec::new()];
    for axis in axes.iter().filter(|a| has_key(cfg, &a.key)) {
        points = points
            .into_iter()
            .flat_map(|p| {
                axis.values.iter().map(move |v| {
                    let mut p = p.clone();
                    p.push((axis.key.clone(), v.clone()));
                    p
                })
            })
            .collect();
    }
    points
}

/// `cfg` with the settings of `point` applied and validated.
pub fn apply(cfg: &PolicyConfig, point: &Point) -> Result<PolicyConfig, SimError> {
    let mut obj = as_object(cfg);
    // A rule change replaces the whole hot-spot object first, so fields of
    // the old variant do not leak into the new one.
    let mut ordered: Vec<&(String, Value)> = point.iter().collect();
    ordered.sort_by_key(|(k, _)| !k.ends_with(".rule"));
    for (key, value) in ordered {
        let parts: Vec<&str> = key.split('.').collect();
        match parts.as_slice() {
            [field] => {
                obj.insert((*field).to_owned(), value.clone());
            }
            ["hot_spot", "rule"] => {
                let mut m = Map::new();
                m.insert("rule".into(), value.clone());
                obj.insert("hot_spot".into(), Value::Object(m));
            }
            [outer, inner] => {
                let slot = obj
                    .entry((*outer).to_owned())
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = slot {
                    m.insert((*inner).to_owned(), value.clone());
                }
            }
            _ => {
                return Err(SimError::Config(format!(
                    "--sweep {key}: settings nest at most one level"
                )));
            }
        }
    }
    let out: PolicyConfig = serde_json::from_value(Value::Object(obj))
        .map_err(|e| SimError::Config(format!("--sweep {}: {e}", describe(point))))?;
    out.validate()?;
    Ok(out)
}

/// The replica settings of the product of the run axes among `axes`
/// (the others are ignored), each with its label (`replicas=4
/// sync_delay_ms=10`); `base` alone, unlabelled, when there are none.
pub fn run_grid(
    base: &ReplicaConfig,
    axes: &[Axis],
) -> Result<Vec<(ReplicaConfig, String)>, SimError> {
    let mut points: Vec<(ReplicaConfig, Point)> = vec![(*base, Vec::new())];
    for axis in axes.iter().filter(|a| is_run_key(&a.key)) {
        let mut next = Vec::new();
        for (cfg, point) in &points {
            for v in &axis.values {
                let mut cfg = *cfg;
                let bad = || {
                    SimError::Config(format!(
                        "--sweep {}: {v} is not a {}",
                        axis.key,
                        if axis.key == "replicas" {
                            "replica count"
                        } else {
                            "delay in milliseconds or `off`"
                        }
                    ))
                };
                match (axis.key.as_str(), v) {
                    ("replicas", Value::Number(n)) => {
                        cfg.count = n.as_u64().ok_or_else(bad)? as usize;
                    }
                    ("sync_delay_ms", Value::Number(n)) => {
                        let ms = n.as_f64().ok_or_else(bad)?;
                        cfg.sync_delay =
                            Some(super::args::sync_delay(ms, "--sweep sync_delay_ms")?);
                    }
                    ("sync_delay_ms", Value::String(w)) if w == "off" => cfg.sync_delay = None,
                    _ => return Err(bad()),
                }
                cfg.validate()?;
                let mut point = point.clone();
                point.push((axis.key.clone(), v.clone()));
                next.push((cfg, point));
            }
        }
        points = next;
    }
    let mut out: Vec<(ReplicaConfig, String)> = Vec::new();
    for (cfg, point) in points {
        // One router has no peers: its sync delay changes nothing.
        let (cfg, point) = if cfg.count == 1 {
            let single = ReplicaConfig {
                sync_delay: base.sync_delay,
                ..cfg
            };
            let point = point.into_iter().filter(|(k, _)| k == "replicas").collect();
            (single, point)
        } else {
            (cfg, point)
        };
        if !out.iter().any(|(c, _)| *c == cfg) {
            out.push((cfg, describe(&point)));
        }
    }
    Ok(out)
}

/// `k=v k=v` for a point (empty for the baseline).
pub fn describe(point: &Point) -> String {
    point
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use radixgate_routing::{CacheAwareConfig, HotSpotRule, LowMatchTarget, PrefillAwareConfig};

    fn ca() -> PolicyConfig {
        PolicyConfig::CacheAware(CacheAwareConfig::default())
    }

    #[test]
    fn grids_apply_only_the_keys_a_policy_has() {
        let axes = vec![
            Axis::parse("cache_threshold=0.1,0.5").unwrap(),
            Axis::parse("hot_spot.margin=0,2").unwrap(),
            Axis::parse("virtual_nodes=64").unwrap(),
        ];
        assert_eq!(grid_for(&ca(), &axes).len(), 4);
        let pa = PolicyConfig::PrefillAware(PrefillAwareConfig::default());
        assert_eq!(grid_for(&pa, &axes).len(), 1);
        let rr: PolicyConfig = serde_json::from_str(r#"{"policy":"round_robin"}"#).unwrap();
        assert_eq!(grid_for(&rr, &axes), vec![Vec::new()]);
        let p = &grid_for(&ca(), &axes)[3];
        assert_eq!(describe(p), "cache_threshold=0.5 hot_spot.margin=2");
        let PolicyConfig::CacheAware(c) = apply(&ca(), p).unwrap() else {
            panic!()
        };
        assert_eq!(c.cache_threshold, 0.5);
        assert_eq!(
            c.hot_spot,
            HotSpotRule::PredictedTtft {
                margin: 2.0,
                slack_ms: 10.0,
                reuse_ms: 10.0,
                overflow_margin: 0.3,
                hot_share: 1.5,
                hot_margin: 0.25,
            }
        );
        // A rule change replaces the rule's fields: the seed rule's cap
        // with its own defaults, and the default rule's fields are gone.
        let seed = vec![
            (
                "hot_spot.rule".to_owned(),
                Value::String("relative_cap".into()),
            ),
            ("hot_spot.slack".to_owned(), serde_json::json!(4)),
        ];
        let PolicyConfig::CacheAware(c) = apply(&ca(), &seed).unwrap() else {
            panic!()
        };
        assert_eq!(
            c.hot_spot,
            HotSpotRule::RelativeCap {
                slack: 4,
                factor: 1.5
            }
        );
        assert_eq!(
            CacheAwareConfig {
                hot_spot: c.hot_spot,
                ..CacheAwareConfig::seed_rule()
            },
            CacheAwareConfig {
                hot_spot: HotSpotRule::RelativeCap {
                    slack: 4,
                    factor: 1.5
                },
                ..c
            }
        );
    }

    #[test]
    fn run_grids_cover_replicas_and_delays_once() {
        let axes = vec![
            Axis::parse("replicas=1,4").unwrap(),
            Axis::parse("sync_delay_ms=1,off").unwrap(),
            Axis::parse("cache_threshold=0.5").unwrap(),
        ];
        let base = ReplicaConfig::default();
        let grid = run_grid(&base, &axes).unwrap();
        let labels: Vec<&str> = grid.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(
            labels,
            [
                "replicas=1",
                "replicas=4 sync_delay_ms=1",
                "replicas=4 sync_delay_ms=off"
            ]
        );
        assert_eq!(grid[0].0, base);
        assert_eq!(grid[1].0.count, 4);
        assert_eq!(
            grid[1].0.sync_delay,
            Some(std::time::Duration::from_millis(1))
        );
        assert_eq!(grid[2].0.sync_delay, None);
        assert_eq!(
            run_grid(&base, &axes[2..]).unwrap(),
            vec![(base, String::new())]
        );
        for bad in [
            "replicas=0",
            "replicas=x",
            "sync_delay_ms=-1",
            "sync_delay_ms=never",
        ] {
            let axes = [Axis::parse(bad).unwrap()];
            assert!(run_grid(&base, &axes).is_err(), "{bad}");
        }
    }

    #[test]
    fn words_rules_and_bad_values() {
        let p = vec![
            ("hot_spot.rule".to_owned(), Value::String("off".into())),
            (
                "low_match".to_owned(),
                Value::String("smallest_tree".into()),
            ),
        ];
        let PolicyConfig::CacheAware(c) = apply(&ca(), &p).unwrap() else {
            panic!()
        };
        assert_eq!(c.hot_spot, HotSpotRule::Off);
        assert_eq!(c.low_match, LowMatchTarget::SmallestTree);
        let bad = vec![("cache_threshold".to_owned(), serde_json::json!(1.5))];
        assert!(
            apply(&ca(), &bad)
                .unwrap_err()
                .to_string()
                .contains("cache_threshold")
        );
        let typo = vec![("low_match".to_owned(), Value::String("smallest".into()))];
        assert!(apply(&ca(), &typo).is_err());
        assert!(Axis::parse("cache_threshold").is_err());
        assert!(Axis::parse("=1").is_err());
        assert!(Axis::parse("x=").is_err());
    }
}
