//! The search: the current settings and every point of the grid, each run
//! over the whole recording, and the choice among them.
//!
//! "Equal hit rate" is the rule that keeps the search honest: a point
//! qualifies when its token hit rate is at least the current settings'
//! minus the tolerance (in percentage points, `--hit-tolerance`); among
//! those the lowest mean TTFT wins. A point that only buys TTFT by giving up
//! cache hits (and so GPU work) never qualifies. Runs are independent and
//! deterministic, so they are spread over threads and the result does not
//! depend on how many.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use radixgate_routing::PolicyConfig;
use serde::Serialize;
use serde_json::Value;

use crate::SimError;
use crate::load::Summary;
use crate::simulate::sweep::{self, Axis, Point};
use crate::simulate::{Contender, RunStats, SimConfig, cluster};

/// One run's settings and figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The swept settings, `key=value` joined by spaces.
    pub label: String,
    /// The swept settings, in axis order.
    #[serde(skip)]
    pub point: Point,
    /// Token hit rate over the whole replay.
    pub hit_rate: f64,
    /// Mean time to first token, simulated ms.
    pub ttft_mean_ms: f64,
    /// 99th percentile of it.
    pub ttft_p99_ms: f64,
    /// Requests completed.
    pub completed: u64,
}

impl Outcome {
    /// The figures of `stats` for the settings of `point`.
    pub fn of(point: Point, stats: &RunStats) -> Self {
        let ttft = Summary::of(stats.ttft_ms.clone());
        Self {
            label: sweep::describe(&point),
            point,
            hit_rate: if stats.prompt_tokens > 0 {
                stats.cached_tokens as f64 / stats.prompt_tokens as f64
            } else {
                0.0
            },
            ttft_mean_ms: ttft.map_or(f64::NAN, |t| t.mean),
            ttft_p99_ms: ttft.map_or(f64::NAN, |t| t.p99),
            completed: stats.completed,
        }
    }
}

/// Every point of the grid of `axes` over `current`, with its settings
/// applied (each checked by the policy's own validation). Every axis must
/// name a setting `current` has.
pub fn grid(current: &PolicyConfig, axes: &[Axis]) -> Result<Vec<(Point, PolicyConfig)>, SimError> {
    for axis in axes {
        if sweep::is_run_key(&axis.key) || !sweep::has_key(current, &axis.key) {
            return Err(SimError::Config(format!(
                "{} is not a setting of the {} policy (tune sweeps the current policy's \
                 settings; the three it sweeps by default are cache_aware's)",
                axis.key,
                current.name()
            )));
        }
    }
    sweep::grid_for(current, axes)
        .into_iter()
        .map(|point| {
            let cfg = sweep::apply(current, &point)?;
            Ok((point, cfg))
        })
        .collect()
}

/// Runs every contender under `cfg` on up to `threads` threads; results in
/// the contenders' order.
pub fn run_all(
    cfg: &SimConfig,
    contenders: &[Contender],
    threads: usize,
) -> Result<Vec<RunStats>, SimError> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<RunStats, SimError>>>> =
        Mutex::new(contenders.iter().map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, contenders.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(who) = contenders.get(i) else {
                        break;
                    };
                    let out = cluster::run(cfg, who);
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(out);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(SimError::Config("a run did not finish".into()))))
        .collect()
}

/// The index of the outcome with the least mean TTFT among those whose hit
/// rate is at least `current`'s minus `tolerance` (a fraction), if it is
/// quicker than `current`. Settings that route alike tie exactly; ties go
/// to the higher hit rate, then the lower p99, then the fewest settings
/// changed from `current`'s, then the earlier point.
pub fn choose(current: &Outcome, rows: &[Outcome], tolerance: f64) -> Option<usize> {
    let floor = current.hit_rate - tolerance;
    let changed = |r: &Outcome| {
        r.point
            .iter()
            .filter(|(k, v)| !current.point.iter().any(|(ck, cv)| ck == k && same(cv, v)))
            .count()
    };
    rows.iter()
        .enumerate()
        .filter(|(_, r)| r.hit_rate >= floor && r.ttft_mean_ms.is_finite())
        .min_by(|(i, a), (j, b)| {
            a.ttft_mean_ms
                .total_cmp(&b.ttft_mean_ms)
                .then(b.hit_rate.total_cmp(&a.hit_rate))
                .then(a.ttft_p99_ms.total_cmp(&b.ttft_p99_ms))
                .then(changed(a).cmp(&changed(b)))
                .then(i.cmp(j))
        })
        .filter(|(_, r)| r.ttft_mean_ms < current.ttft_mean_ms)
        .map(|(i, _)| i)
}

/// Whether two setting values are equal (numbers by value: `2` and `2.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The settings of `point` as lines for the config file's `routing:`
/// section (nested keys one level down), under `policy: NAME`.
pub fn yaml_lines(policy: &str, point: &Point) -> String {
    let mut out = format!("routing:\n  policy: {policy}\n");
    let mut nested: Vec<(&str, Vec<(&str, &Value)>)> = Vec::new();
    for (key, value) in point {
        match key.split_once('.') {
            None => out.push_str(&format!("  {key}: {}\n", scalar(value))),
            Some((outer, inner)) => match nested.iter_mut().find(|(o, _)| *o == outer) {
                Some((_, fields)) => fields.push((inner, value)),
                None => nested.push((outer, vec![(inner, value)])),
            },
        }
    }
    for (outer, fields) in nested {
        out.push_str(&format!("  {outer}:\n"));
        for (inner, value) in fields {
            out.push_str(&format!("    {inner}: {}\n", scalar(value)));
        }
    }
    out
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use radixgate_routing::CacheAwareConfig;
    use serde_json::json;

    fn outcome(label: &str, hit_rate: f64, ttft: f64) -> Outcome {
        Outcome {
            label: label.into(),
            point: Vec::new(),
            hit_rate,
            ttft_mean_ms: ttft,
            ttft_p99_ms: ttft,
            completed: 1,
        }
    }

    #[test]
    fn the_quickest_at_equal_hit_rate_wins() {
        let current = outcome("now", 0.60, 100.0);
        let rows = [
            outcome("fast but cold", 0.50, 10.0),
            outcome("slower", 0.61, 90.0),
            outcome("best", 0.595, 40.0),
            outcome("slower, hotter", 0.70, 45.0),
            outcome("broken", 0.9, f64::NAN),
        ];
        assert_eq!(choose(&current, &rows, 0.01), Some(2));
        // Without tolerance, 0.595 < 0.60 does not qualify.
        assert_eq!(choose(&current, &rows, 0.0), Some(3));
        // Nothing quicker than the current settings: keep them.
        assert_eq!(choose(&outcome("now", 0.6, 30.0), &rows, 0.01), None);
    }

    #[test]
    fn exact_ties_keep_what_need_not_change() {
        let at = |ct: f64, abs: u64, rel: f64, ttft: f64| Outcome {
            point: vec![
                ("cache_threshold".into(), json!(ct)),
                ("balance_abs_threshold".into(), json!(abs)),
                ("balance_rel_threshold".into(), json!(rel)),
            ],
            ..outcome("", 0.9, ttft)
        };
        let current = Outcome {
            hit_rate: 0.5,
            ..at(0.95, 0, 1.5, 40.0)
        };
        let rows = [
            at(0.1, 16, 1.2, 15.0),
            at(0.1, 16, 1.5, 15.0),
            at(0.3, 64, 1.5, 15.0),
            at(0.1, 4, 1.5, 20.0),
        ];
        // Rows 0 to 2 route alike; row 1 changes two settings, row 0 three.
        assert_eq!(choose(&current, &rows, 0.01), Some(1));
        // The higher hit rate goes first among equal TTFTs.
        let mut better = rows.clone();
        better[2].hit_rate = 0.95;
        assert_eq!(choose(&current, &better, 0.01), Some(2));
    }

    #[test]
    fn grids_apply_to_the_current_settings_and_print_as_yaml() {
        let current = PolicyConfig::CacheAware(CacheAwareConfig {
            cache_threshold: 0.9,
            ..CacheAwareConfig::default()
        });
        let axes = [
            Axis::parse("cache_threshold=0.1,0.5").unwrap(),
            Axis::parse("balance_abs_threshold=4,64").unwrap(),
        ];
        let g = grid(&current, &axes).unwrap();
        assert_eq!(g.len(), 4);
        let PolicyConfig::CacheAware(c) = &g[1].1 else {
            panic!()
        };
        assert_eq!((c.cache_threshold, c.balance_abs_threshold), (0.1, 64));
        let bad = [Axis::parse("virtual_nodes=8").unwrap()];
        assert!(grid(&current, &bad).is_err());
        let rr = PolicyConfig::named("round_robin").unwrap();
        assert!(grid(&rr, &axes).is_err(), "round_robin has no thresholds");
        let point = vec![
            ("cache_threshold".to_owned(), json!(0.5)),
            ("hot_spot.rule".to_owned(), json!("relative_cap")),
            ("hot_spot.slack".to_owned(), json!(4)),
        ];
        assert_eq!(
            yaml_lines("cache_aware", &point),
            "routing:\n  policy: cache_aware\n  cache_threshold: 0.5\n  hot_spot:\n    \
             rule: relative_cap\n    slack: 4\n"
        );
    }
}
