//! The per-worker timeline of a run (`--timeline-secs S`): for each window
//! of S simulated seconds and each worker, the requests the contender
//! dispatched to it in that window and the mean time to first token of
//! those of them that completed.
//!
//! Requests are placed by the time they were dispatched (not completed), so
//! a window shows what the contender decided then and what those decisions
//! cost — e.g. how long after a worker slows down its share of the traffic
//! settles. Requests a worker refused (too large for it) count as dispatched
//! and have no TTFT.

use std::time::Duration;

use serde::Serialize;

use crate::SimError;

/// The most windows a timeline may have (a bound on the report's size).
pub const MAX_WINDOWS: usize = 100_000;

/// One request as the timeline sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dispatched {
    /// When it was sent to a worker (simulated time since the start).
    pub at: Duration,
    /// The worker (index in the pool).
    pub worker: usize,
    /// Its time to first token, ms; `None` if the worker refused it.
    pub ttft_ms: Option<f64>,
}

/// One worker in one window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WorkerWindow {
    /// Requests dispatched to the worker in the window.
    pub dispatched: u64,
    /// Mean TTFT of those that completed, ms (`None`: none did).
    pub ttft_mean_ms: Option<f64>,
}

/// One window of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineWindow {
    /// Start of the window, simulated seconds.
    pub start_secs: f64,
    /// Per worker, in pool order.
    pub workers: Vec<WorkerWindow>,
}

/// The timeline of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    /// Window length, simulated seconds.
    pub window_secs: f64,
    /// From time 0 up to the window of the last dispatch, empty ones
    /// included.
    pub windows: Vec<TimelineWindow>,
}

impl Timeline {
    /// Buckets `samples` of a pool of `workers` into windows of `window`.
    pub fn of(samples: &[Dispatched], workers: usize, window: Duration) -> Result<Self, SimError> {
        if window.is_zero() {
            return Err(SimError::Config("--timeline-secs must be > 0".into()));
        }
        let index = |at: Duration| (at.as_nanos() / window.as_nanos()) as usize;
        let last = samples.iter().map(|s| index(s.at)).max();
        let count = last.map_or(0, |l| l.saturating_add(1));
        if count > MAX_WINDOWS {
            return Err(SimError::Config(format!(
                "--timeline-secs {}: the run needs {count} windows, more than {MAX_WINDOWS}; use longer windows",
                window.as_secs_f64()
            )));
        }
        #[derive(Clone, Copy, Default)]
        struct Sum {
            dispatched: u64,
            completed: u64,
            ttft_ms: f64,
        }
        let mut sums = vec![vec![Sum::default(); workers]; count];
        for s in samples {
            let Some(cell) = sums[index(s.at)].get_mut(s.worker) else {
                continue;
            };
            cell.dispatched += 1;
            if let Some(t) = s.ttft_ms {
                cell.completed += 1;
                cell.ttft_ms += t;
            }
        }
        let windows = sums
            .into_iter()
            .enumerate()
            .map(|(k, row)| TimelineWindow {
                start_secs: (window * k as u32).as_secs_f64(),
                workers: row
                    .into_iter()
                    .map(|c| WorkerWindow {
                        dispatched: c.dispatched,
                        ttft_mean_ms: (c.completed > 0).then(|| c.ttft_ms / c.completed as f64),
                    })
                    .collect(),
            })
            .collect();
        Ok(Self {
            window_secs: window.as_secs_f64(),
            windows,
        })
    }

    /// The timeline as text lines under a heading `name`: one line per
    /// window, `dispatched/mean TTFT ms` per worker.
    pub fn render(&self, name: &str, out: &mut String) {
        use std::fmt::Write as _;
        let workers = self.windows.first().map_or(0, |w| w.workers.len());
        let _ = write!(out, "{name}\n  {:>15}", "window (s)");
        for i in 0..workers {
            let _ = write!(out, " {:>11}", format!("w{i}"));
        }
        out.push('\n');
        for w in &self.windows {
            let span = format!("{:.1}-{:.1}", w.start_secs, w.start_secs + self.window_secs);
            let _ = write!(out, "  {span:>15}");
            for c in &w.workers {
                let ttft = c
                    .ttft_mean_ms
                    .map_or_else(|| "-".to_owned(), |t| format!("{t:.0}"));
                let _ = write!(out, " {:>11}", format!("{}/{ttft}", c.dispatched));
            }
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: f64, worker: usize, ttft_ms: Option<f64>) -> Dispatched {
        Dispatched {
            at: Duration::from_secs_f64(secs),
            worker,
            ttft_ms,
        }
    }

    #[test]
    fn buckets_by_dispatch_time_and_worker() {
        let samples = [
            at(0.1, 0, Some(10.0)),
            at(0.9, 0, Some(30.0)),
            at(0.5, 1, None),
            // Window 1 is empty; window 2 starts exactly at 2 s.
            at(2.0, 1, Some(7.0)),
            at(2.5, 1, Some(9.0)),
        ];
        let t = Timeline::of(&samples, 2, Duration::from_secs(1)).unwrap();
        assert_eq!(t.window_secs, 1.0);
        let cells: Vec<Vec<(u64, Option<f64>)>> = t
            .windows
            .iter()
            .map(|w| {
                w.workers
                    .iter()
                    .map(|c| (c.dispatched, c.ttft_mean_ms))
                    .collect()
            })
            .collect();
        assert_eq!(
            cells,
            vec![
                vec![(2, Some(20.0)), (1, None)],
                vec![(0, None), (0, None)],
                vec![(0, None), (2, Some(8.0))],
            ]
        );
        assert_eq!(t.windows[2].start_secs, 2.0);
        let mut text = String::new();
        t.render("round_robin", &mut text);
        assert!(text.starts_with("round_robin\n"), "{text}");
        assert!(text.contains("2/20") && text.contains("1/-") && text.contains("2/8"));
        assert_eq!(text.lines().count(), 5, "{text}");
    }

    #[test]
    fn empty_runs_and_bad_windows() {
        let t = Timeline::of(&[], 3, Duration::from_secs(5)).unwrap();
        assert!(t.windows.is_empty());
        assert!(Timeline::of(&[], 3, Duration::ZERO).is_err());
        let far = [at(1000.0, 0, Some(1.0))];
        let e = Timeline::of(&far, 1, Duration::from_millis(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 100000"), "{e}");
    }
}
