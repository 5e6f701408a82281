//! The dashboard's reading of the gateway's own Prometheus text: the few
//! families it charts, summed over the labels it does not show, and
//! percentiles from the difference of two readings of a histogram.
//!
//! The recorder keeps histograms as cumulative bucket counts and offers no
//! other way to read them than its text rendering, so the sampler renders
//! it once a step while someone watches, and this module reads it back: no
//! second copy of any figure is kept on the request path.

use std::collections::{BTreeMap, HashMap};

/// `radixgate_requests_total{route,status,model}`.
const REQUESTS: &str = "radixgate_requests_total";
/// `radixgate_routing_decisions_total{branch}`.
const DECISIONS: &str = "radixgate_routing_decisions_total";
/// `radixgate_upstream_errors_total{worker,kind}`.
const UPSTREAM_ERRORS: &str = "radixgate_upstream_errors_total";
/// The TTFT histogram's bucket series.
const TTFT: &str = "radixgate_time_to_first_token_seconds_bucket";
/// The whole-request latency histogram's bucket series.
const LATENCY: &str = "radixgate_request_duration_seconds_bucket";

/// What one reading of the metrics text holds for the dashboard; every
/// count is cumulative since the gateway started.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Scrape {
    /// Requests answered, any status.
    pub(crate) answers: u64,
    /// Of those, answered with a 5xx status.
    pub(crate) error_answers: u64,
    /// Routing decisions by branch.
    pub(crate) decisions: BTreeMap<String, u64>,
    /// Failed attempts by worker URL, all kinds.
    pub(crate) upstream_errors: HashMap<String, u64>,
    /// Time to first token of streamed answers, all routes and models.
    pub(crate) ttft: Buckets,
    /// Arrival to end of body, all routes.
    pub(crate) latency: Buckets,
}

/// One histogram's cumulative bucket counts (every label set summed), by
/// upper bound in seconds, in increasing order, `+Inf` last.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Buckets(Vec<(f64, u64)>);

impl Scrape {
    /// Reads the Prometheus text exposition `text`; lines it does not
    /// need or cannot read are skipped.
    pub(crate) fn read(text: &str) -> Self {
        let mut scrape = Self::default();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let Some(series) = Series::parse(line) else {
                continue;
            };
            let count = series.value.max(0.0) as u64;
            match series.name {
                REQUESTS => {
                    scrape.answers += count;
                    if series.label("status").is_some_and(|s| s.starts_with('5')) {
                        scrape.error_answers += count;
                    }
                }
                DECISIONS => {
                    if let Some(branch) = series.label("branch") {
                        *scrape.decisions.entry(branch.to_owned()).or_default() += count;
                    }
                }
                UPSTREAM_ERRORS => {
                    // `moved`: an attempt moved off a worker ejected as
                    // slow, which failed nothing (`proxy::attempt`).
                    if series.label("kind") == Some("moved") {
                        continue;
                    }
                    if let Some(worker) = series.label("worker") {
                        *scrape.upstream_errors.entry(worker.to_owned()).or_default() += count;
                    }
                }
                TTFT => scrape.ttft.add(&series, count),
                LATENCY => scrape.latency.add(&series, count),
                _ => {}
            }
        }
        scrape
    }
}

impl Buckets {
    /// Builds counts from `(upper bound, cumulative count)` pairs.
    #[cfg(test)]
    pub(crate) fn from_pairs(pairs: &[(f64, u64)]) -> Self {
        let mut b = Self::default();
        for &(le, count) in pairs {
            b.add_at(le, count);
        }
        b
    }

    fn add(&mut self, series: &Series<'_>, count: u64) {
        let Some(le) = series.label("le").and_then(parse_bound) else {
            return;
        };
        self.add_at(le, count);
    }

    fn add_at(&mut self, le: f64, count: u64) {
        match self.0.iter_mut().find(|(bound, _)| *bound == le) {
            Some((_, c)) => *c += count,
            None => {
                self.0.push((le, count));
                self.0.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
        }
    }

    /// The observations made since `earlier` (a reading of the same
    /// histogram), bucket by bucket.
    pub(crate) fn since(&self, earlier: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|&(le, count)| {
                    let before = earlier
                        .0
                        .iter()
                        .find(|(b, _)| *b == le)
                        .map_or(0, |&(_, c)| c);
                    (le, count.saturating_sub(before))
                })
                .collect(),
        )
    }

    /// Observations counted (the `+Inf` bucket's count).
    pub(crate) fn total(&self) -> u64 {
        self.0.last().map_or(0, |&(_, c)| c)
    }

    /// The `q`-quantile (0..=1) in seconds, interpolated linearly inside
    /// its bucket as Prometheus' `histogram_quantile` does: the lowest
    /// bucket starts at 0, and a rank in the `+Inf` bucket answers the
    /// highest finite bound. `None` without observations.
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let (mut lower, mut below) = (0.0, 0u64);
        for &(upper, count) in &self.0 {
            if count as f64 >= rank && count > below {
                if upper.is_infinite() {
                    return Some(lower);
                }
                let share = (rank - below as f64) / (count - below) as f64;
                return Some(lower + (upper - lower) * share.clamp(0.0, 1.0));
            }
            lower = if upper.is_finite() { upper } else { lower };
            below = count;
        }
        Some(lower)
    }
}

/// An upper bound as rendered (`0.25`, `+Inf`).
fn parse_bound(le: &str) -> Option<f64> {
    match le {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        other => other.parse().ok().filter(|v: &f64| v.is_finite()),
    }
}

/// One sample line: `name{label="value",...} value`.
#[derive(Debug)]
struct Series<'a> {
    name: &'a str,
    /// Label names and values, unescaped.
    labels: Vec<(&'a str, String)>,
    value: f64,
}

impl<'a> Series<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let name_end = line.find(['{', ' '])?;
        let name = &line[..name_end];
        let mut labels = Vec::new();
        let mut rest = &line[name_end..];
        if let Some(inner) = rest.strip_prefix('{') {
            let (parsed, after) = parse_labels(inner)?;
            labels = parsed;
            rest = after;
        }
        // A timestamp may follow the value.
        let value = rest.split_whitespace().next()?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().ok()?,
        };
        Some(Self {
            name,
            labels,
            value,
        })
    }

    fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Labels up to the closing `}`, and the text after it. Values are quoted
/// with `\\`, `\"` and `\n` escapes.
fn parse_labels(mut s: &str) -> Option<(Vec<(&str, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let name = s[..eq].trim();
        let mut chars = s[eq + 1..].strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((name, value));
        s = &s[eq + 1..][1 + end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP radixgate_requests_total Requests answered.
# TYPE radixgate_requests_total counter
radixgate_requests_total{route="/v1/chat/completions",status="200",model="m"} 40
radixgate_requests_total{route="/v1/completions",status="200",model="m"} 5
radixgate_requests_total{route="/v1/chat/completions",status="503",model="unknown"} 3
radixgate_requests_total{route="/v1/chat/completions",status="429",model="m"} 2
radixgate_routing_decisions_total{branch="cache_hit"} 30
radixgate_routing_decisions_total{branch="imbalanced"} 7
radixgate_upstream_errors_total{worker="http://127.0.0.1:1",kind="connect"} 2
radixgate_upstream_errors_total{kind="status",worker="http://127.0.0.1:1"} 1
radixgate_upstream_errors_total{worker="http://a\"b\\c",kind="timeout"} 4
radixgate_upstream_errors_total{worker="http://a\"b\\c",kind="moved"} 6
radixgate_time_to_first_token_seconds_bucket{route="/v1/chat/completions",model="m",le="0.1"} 3
radixgate_time_to_first_token_seconds_bucket{route="/v1/chat/completions",model="m",le="1"} 8
radixgate_time_to_first_token_seconds_bucket{route="/v1/chat/completions",model="m",le="+Inf"} 10
radixgate_time_to_first_token_seconds_bucket{route="/v1/completions",model="m",le="0.1"} 1
radixgate_time_to_first_token_seconds_bucket{route="/v1/completions",model="m",le="1"} 1
radixgate_time_to_first_token_seconds_bucket{route="/v1/completions",model="m",le="+Inf"} 2
radixgate_time_to_first_token_seconds_sum{route="/v1/completions",model="m"} 9.5
radixgate_request_duration_seconds_bucket{route="/v1/chat/completions",le="0.5"} 45
radixgate_request_duration_seconds_bucket{route="/v1/chat/completions",le="+Inf"} 50
radixgate_worker_in_flight_requests{worker="http://127.0.0.1:1"} 3
"#;

    #[test]
    fn reads_the_families_it_charts_summed_over_other_labels() {
        let s = Scrape::read(TEXT);
        assert_eq!(s.answers, 50);
        assert_eq!(s.error_answers, 3);
        assert_eq!(s.decisions["cache_hit"], 30);
        assert_eq!(s.decisions["imbalanced"], 7);
        assert_eq!(s.upstream_errors["http://127.0.0.1:1"], 3);
        assert_eq!(s.upstream_errors["http://a\"b\\c"], 4);
        assert_eq!(
            s.ttft,
            Buckets::from_pairs(&[(0.1, 4), (1.0, 9), (f64::INFINITY, 12)])
        );
        assert_eq!(s.latency.total(), 50);
    }

    #[test]
    fn skips_what_it_cannot_read() {
        let s = Scrape::read(
            "radixgate_requests_total{status=\"200\" 5\n\
             radixgate_requests_total{status=\"200\"} x\n\
             radixgate_time_to_first_token_seconds_bucket{le=\"huge\"} 3\n\
             radixgate_requests_total 7\n",
        );
        assert_eq!(s.answers, 7);
        assert_eq!(s.ttft.total(), 0);
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        // 10 observations: 4 in (0, 0.1], 4 in (0.1, 1], 2 in (1, 10].
        let b = Buckets::from_pairs(&[(0.1, 4), (1.0, 8), (10.0, 10), (f64::INFINITY, 10)]);
        let q = |q| b.quantile(q).unwrap();
        // p50: rank 5, the first of 4 in (0.1, 1]: 0.1 + 0.9 * 1/4.
        assert!((q(0.5) - 0.325).abs() < 1e-9, "{}", q(0.5));
        // p90: rank 9, half-way through (1, 10].
        assert!((q(0.9) - 5.5).abs() < 1e-9, "{}", q(0.9));
        // p20: rank 2, half-way through (0, 0.1].
        assert!((q(0.2) - 0.05).abs() < 1e-9, "{}", q(0.2));
        assert_eq!(q(1.0), 10.0);
        assert_eq!(Buckets::default().quantile(0.5), None);
        // A rank in the +Inf bucket answers the highest finite bound.
        let over = Buckets::from_pairs(&[(0.1, 1), (1.0, 1), (f64::INFINITY, 10)]);
        assert_eq!(over.quantile(0.99), Some(1.0));
    }

    #[test]
    fn a_difference_holds_only_the_interval() {
        let earlier = Buckets::from_pairs(&[(0.1, 100), (1.0, 100), (f64::INFINITY, 100)]);
        // 100 fast answers before, then 10 slow ones (in (0.1, 1]).
        let now = Buckets::from_pairs(&[(0.1, 100), (1.0, 110), (f64::INFINITY, 110)]);
        let interval = now.since(&earlier);
        assert_eq!(interval.total(), 10);
        // Over everything p50 is fast; over the interval it is slow.
        assert!(now.quantile(0.5).unwrap() <= 0.1);
        let p50 = interval.quantile(0.5).unwrap();
        assert!((p50 - 0.55).abs() < 1e-9, "{p50}");
        // Against a reading taken before the first observation: all of it.
        assert_eq!(now.since(&Buckets::default()), now);
        // Nothing new: no percentile.
        assert_eq!(earlier.since(&earlier).quantile(0.5), None);
    }
}
