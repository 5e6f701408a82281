//! Why a worker was chosen: cheap to build (plain `Copy` data, no
//! allocation), printed once per request into the `x-radixgate-decision`
//! header and debug logs, and counted by branch in metrics.

use crate::WorkerId;
use std::fmt;

/// Which rule of a policy made the choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Branch {
    /// cache_aware: the pool was imbalanced; shortest queue.
    Imbalanced,
    /// cache_aware: match rate above the threshold; the deepest holder.
    CacheHit,
    /// cache_aware: the deepest holders were unavailable; the best match
    /// among the available workers was still above the threshold.
    CacheHitFallback,
    /// cache_aware: a hit, but the holder was over the hot-spot cap (or,
    /// under the `predicted_ttft` rule, its predicted TTFT was above the
    /// bound); the least-loaded (quickest) worker took it, and now holds
    /// the prefix too.
    HotSpotSpill,
    /// cache_aware: match rate at or below the threshold; least loaded.
    LowMatchMinLoad,
    /// cache_aware: match rate at or below the threshold; smallest tree.
    LowMatchSmallestTree,
    /// cache_aware with exact matches: no worker holds the text now; the
    /// one the tree last sent it to takes it again, as quick as the best
    /// (the prefix is computed again where its requests keep going, rather
    /// than on whichever worker is idlest).
    LowMatchAffinity,
    /// round_robin: next in turn.
    RoundRobin,
    /// random: uniform choice.
    Random,
    /// power_of_two: the less loaded of two random workers.
    PowerOfTwo,
    /// least_load: shortest queue.
    LeastLoad,
    /// consistent_hash: the key's owner on the ring.
    HashRing,
    /// consistent_hash: the key's owner was over the load bound (or
    /// unavailable, or tried already by a retry); the next worker
    /// clockwise took it.
    HashRingOverflow,
    /// consistent_hash: the request had no routing key; shortest queue.
    NoRoutingKey,
    /// Any policy: a Responses API request naming a
    /// `previous_response_id` went to the worker that made that response,
    /// which alone holds it.
    PreviousResponse,
    /// Any policy: a request about a stored response (fetch, delete,
    /// cancel, list its input) went to the worker that made it.
    StoredResponse,
    /// Any policy: a request about a stored response whose maker the
    /// gateway does not know asked the least-loaded worker not yet asked.
    ResponseLookup,
}

impl Branch {
    /// A stable snake_case label (metrics, headers).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Imbalanced => "imbalanced",
            Self::CacheHit => "cache_hit",
            Self::CacheHitFallback => "cache_hit_fallback",
            Self::HotSpotSpill => "hot_spot_spill",
            Self::LowMatchMinLoad => "low_match_min_load",
            Self::LowMatchSmallestTree => "low_match_smallest_tree",
            Self::LowMatchAffinity => "low_match_affinity",
            Self::RoundRobin => "round_robin",
            Self::Random => "random",
            Self::PowerOfTwo => "power_of_two",
            Self::LeastLoad => "least_load",
            Self::HashRing => "hash_ring",
            Self::HashRingOverflow => "hash_ring_overflow",
            Self::NoRoutingKey => "no_routing_key",
            Self::PreviousResponse => "previous_response",
            Self::StoredResponse => "stored_response",
            Self::ResponseLookup => "response_lookup",
        }
    }
}

impl fmt::Display for Branch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The facts behind one decision. Loads are as seen before this request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Explanation {
    /// Policy name.
    pub policy: &'static str,
    /// The rule that decided.
    pub branch: Branch,
    /// The chosen worker.
    pub worker: WorkerId,
    /// Characters of the request text matched for the chosen rule (cache
    /// policies only).
    pub matched_chars: Option<usize>,
    /// Characters in the request text (cache policies only; else 0).
    pub input_chars: usize,
    /// In-flight load of the chosen worker.
    pub load: usize,
    /// Smallest in-flight load among available workers.
    pub min_load: usize,
    /// Largest in-flight load among available workers.
    pub max_load: usize,
    /// Available workers considered.
    pub available: usize,
    /// Predicted time to first token on the chosen worker, milliseconds
    /// (policies with the cost model only).
    pub ttft_ms: Option<f32>,
    /// The least predicted time to first token among the other available
    /// workers, milliseconds (`None` without the cost model or an
    /// alternative).
    pub alt_ttft_ms: Option<f32>,
    /// The chosen worker's match came from its engine's KV events, not
    /// from the tree.
    pub exact: bool,
}

impl Explanation {
    /// `matched_chars / input_chars` (0 for empty text); `None` when the
    /// policy does not match prefixes.
    pub fn match_rate(&self) -> Option<f64> {
        self.matched_chars.map(|m| {
            if self.input_chars == 0 {
                0.0
            } else {
                m as f64 / self.input_chars as f64
            }
        })
    }
}

impl Explanation {
    /// The explanation as one line, naming the chosen worker `worker`
    /// (its [`Worker::name`](crate::Worker::name)): see [`Rendered`].
    pub fn render<'a>(&'a self, worker: &'a str) -> Rendered<'a> {
        Rendered {
            explanation: self,
            worker,
        }
    }
}

/// One line of ASCII with no commas or quotes, safe as an HTTP header value:
/// `cache_aware branch=cache_hit worker=10.0.0.5:30000 match=0.873 load=2 min=1 max=4 available=4 ttft=12.5ms alt=9.0ms`.
/// A [`Decision`](crate::Decision) displays as this line.
#[derive(Clone, Copy, Debug)]
pub struct Rendered<'a> {
    explanation: &'a Explanation,
    worker: &'a str,
}

impl fmt::Display for Rendered<'_> {
    // This line is rendered for every request: pieces and integers are
    // written straight, not through `write!` (whose argument machinery and
    // integer padding were most of its ~3,400 instructions), and the rates
    // in integer arithmetic (float formatting is slower still).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.explanation;
        f.write_str(e.policy)?;
        f.write_str(" branch=")?;
        f.write_str(e.branch.as_str())?;
        f.write_str(" worker=")?;
        f.write_str(self.worker)?;
        if let Some(matched) = e.matched_chars {
            // The rate to three decimals.
            let permille = match e.input_chars {
                0 => 0,
                total => (matched.min(total) * 1000 + total / 2) / total,
            };
            f.write_str(" match=")?;
            decimal(f, permille as u64, 3)?;
            if e.exact {
                f.write_str(" index=exact")?;
            }
        }
        for (name, value) in [
            (" load=", e.load),
            (" min=", e.min_load),
            (" max=", e.max_load),
            (" available=", e.available),
        ] {
            f.write_str(name)?;
            decimal(f, value as u64, 0)?;
        }
        if let Some(ms) = e.ttft_ms {
            f.write_str(" ttft=")?;
            tenths(f, ms)?;
            if let Some(alt) = e.alt_ttft_ms {
                f.write_str(" alt=")?;
                tenths(f, alt)?;
            }
        }
        Ok(())
    }
}

/// `12.5ms`: milliseconds to one decimal.
fn tenths(f: &mut fmt::Formatter<'_>, ms: f32) -> fmt::Result {
    let t = if ms.is_finite() {
        (ms.max(0.0) * 10.0).round().min(u64::MAX as f32) as u64
    } else {
        0
    };
    decimal(f, t, 1)?;
    f.write_str("ms")
}

/// `value` over 10^`places`, with that many decimals (`decimal(f, 873, 3)`
/// writes `0.873`), digit by digit into a buffer.
fn decimal(f: &mut fmt::Formatter<'_>, mut value: u64, places: usize) -> fmt::Result {
    let mut buf = [0u8; 24];
    let mut at = buf.len();
    let mut written = 0;
    while written <= places || value > 0 {
        if written == places && places > 0 {
            at -= 1;
            buf[at] = b'.';
        }
        at -= 1;
        buf[at] = b'0' + (value % 10) as u8;
        value /= 10;
        written += 1;
    }
    f.write_str(std::str::from_utf8(&buf[at..]).map_err(|_| fmt::Error)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line as `write!` would give it (the rendering before it was
    /// written digit by digit).
    fn by_format(e: &Explanation, worker: &str) -> String {
        let mut s = format!("{} branch={} worker={worker}", e.policy, e.branch);
        if let Some(matched) = e.matched_chars {
            let permille = match e.input_chars {
                0 => 0,
                total => (matched.min(total) * 1000 + total / 2) / total,
            };
            s += &format!(" match={}.{:03}", permille / 1000, permille % 1000);
            if e.exact {
                s += " index=exact";
            }
        }
        s += &format!(
            " load={} min={} max={} available={}",
            e.load, e.min_load, e.max_load, e.available
        );
        let tenths = |ms: f32| {
            let t = if ms.is_finite() {
                (ms.max(0.0) * 10.0).round().min(u64::MAX as f32) as u64
            } else {
                0
            };
            format!("{}.{}ms", t / 10, t % 10)
        };
        if let Some(ms) = e.ttft_ms {
            s += &format!(" ttft={}", tenths(ms));
            if let Some(alt) = e.alt_ttft_ms {
                s += &format!(" alt={}", tenths(alt));
            }
        }
        s
    }

    #[test]
    fn the_line_is_what_format_would_write() {
        let counts = [
            0,
            1,
            9,
            10,
            99,
            100,
            999,
            1000,
            4096,
            123_456,
            usize::MAX / 1001,
        ];
        let times = [
            0.0,
            0.04,
            0.05,
            0.96,
            1.0,
            9.95,
            12.44,
            99.99,
            1234.5,
            -3.0,
            f32::NAN,
            f32::INFINITY,
            1e30,
        ];
        let mut lines = 0;
        for (i, &matched) in counts.iter().enumerate() {
            for &input in &counts {
                let e = Explanation {
                    policy: "cache_aware",
                    branch: Branch::CacheHit,
                    worker: crate::WorkerId(7),
                    load: matched,
                    min_load: input,
                    max_load: counts[(i + 3) % counts.len()],
                    available: i,
                    matched_chars: (i % 4 != 0).then_some(matched),
                    input_chars: input,
                    ttft_ms: (i % 3 != 0).then_some(times[i % times.len()]),
                    alt_ttft_ms: Some(times[(i + input) % times.len()]),
                    exact: i % 2 == 0,
                };
                let line = e.render("10.0.0.5:30000").to_string();
                assert_eq!(line, by_format(&e, "10.0.0.5:30000"));
                lines += 1;
            }
        }
        for &ms in &times {
            let e = Explanation {
                policy: "least_load",
                branch: Branch::LeastLoad,
                worker: crate::WorkerId(7),
                load: 1,
                min_load: 0,
                max_load: 2,
                available: 3,
                matched_chars: None,
                input_chars: 0,
                ttft_ms: Some(ms),
                alt_ttft_ms: None,
                exact: false,
            };
            assert_eq!(e.render("w").to_string(), by_format(&e, "w"));
        }
        assert_eq!(lines, counts.len() * counts.len());
    }
}
