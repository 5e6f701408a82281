//! What `radixgate tune` prints: the recording, the prediction check, the
//! best settings at equal hit rate with the expected gain, and the lines to
//! paste; or the same as JSON.

use std::fmt::Write as _;

use serde::Serialize;

use super::predict::Prediction;
use super::search::Outcome;

/// How many of the qualifying runs the table lists.
const TABLE_ROWS: usize = 10;

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct TuneReport {
    /// The recording's file.
    pub trace: String,
    /// The model whose lines were tuned on (`--model`).
    pub model: Option<String>,
    /// Its records (after `--requests`).
    pub requests: usize,
    /// Of those, replayed (2xx or no status).
    pub replayed: usize,
    /// Seconds from its first request to its last.
    pub span_secs: f64,
    /// Workers simulated.
    pub workers: usize,
    /// The policy swept.
    pub policy: String,
    /// The rule for "equal hit rate", in words.
    pub equal_hit_rate: String,
    /// Its tolerance, in percentage points of hit rate.
    pub hit_tolerance_points: f64,
    /// The prediction check, when the recording allows one.
    pub prediction: Option<Prediction>,
    /// Why there is none, otherwise.
    pub no_prediction: Option<String>,
    /// The current settings' run (`label`: their values of the swept keys).
    pub current: Outcome,
    /// Every point of the grid, in grid order.
    pub runs: Vec<Outcome>,
    /// The best point at equal hit rate, if it beats the current settings.
    pub best: Option<Outcome>,
    /// `best`'s mean TTFT against the current settings', in percent
    /// (negative: quicker).
    pub ttft_change_pct: Option<f64>,
    /// `best`'s hit rate minus the current settings', in points.
    pub hit_rate_change_points: Option<f64>,
    /// The config lines to paste (`best`'s swept settings).
    pub config: Option<String>,
}

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |v| format!("{:.1}", v * 100.0))
}

impl TuneReport {
    /// The text report.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let model = self
            .model
            .as_ref()
            .map_or_else(String::new, |m| format!(", model {m}"));
        let _ = writeln!(
            s,
            "recording {}{model}: {} requests ({} replayed) over {:.1} s; simulated on {} workers",
            self.trace, self.requests, self.replayed, self.span_secs, self.workers
        );
        s.push('\n');
        match (&self.prediction, &self.no_prediction) {
            (Some(p), _) => self.prediction_text(&mut s, p),
            (None, Some(why)) => {
                let _ = writeln!(s, "prediction check: none ({why})");
            }
            (None, None) => {}
        }
        s.push('\n');
        let _ = writeln!(
            s,
            "{} settings tried on {}, and the current ones; {}",
            self.runs.len(),
            self.policy,
            self.equal_hit_rate
        );
        let floor = self.current.hit_rate;
        let mut rows: Vec<&Outcome> = self.runs.iter().collect();
        rows.sort_by(|a, b| a.ttft_mean_ms.total_cmp(&b.ttft_mean_ms));
        let current_label = format!("current: {}", self.current.label);
        let width = rows
            .iter()
            .take(TABLE_ROWS)
            .map(|o| o.label.len())
            .chain([current_label.len(), 25])
            .max()
            .unwrap_or(25);
        let _ = writeln!(
            s,
            "{:<width$} {:>6} {:>10} {:>10}",
            "settings (quickest first)", "hit%", "ttft_mean", "ttft_p99"
        );
        let row = |s: &mut String, label: &str, o: &Outcome, mark: &str| {
            let _ = writeln!(
                s,
                "{:<width$} {:>6.1} {:>10.1} {:>10.1}{mark}",
                label,
                o.hit_rate * 100.0,
                o.ttft_mean_ms,
                o.ttft_p99_ms
            );
        };
        for o in rows.iter().take(TABLE_ROWS) {
            let mark = if self.best.as_ref().is_some_and(|b| b.label == o.label) {
                "  <- best at equal hit rate"
            } else if o.hit_rate < floor - self.tolerance() {
                "  (hit rate too low)"
            } else {
                ""
            };
            row(&mut s, &o.label, o, mark);
        }
        if rows.len() > TABLE_ROWS {
            let _ = writeln!(s, "… {} more (--json lists all)", rows.len() - TABLE_ROWS);
        }
        row(&mut s, &current_label, &self.current, "");
        s.push('\n');
        match (&self.best, &self.config) {
            (Some(best), Some(config)) => {
                let _ = writeln!(s, "best at equal hit rate: {}", best.label);
                let _ = writeln!(
                    s,
                    "expected gain against the current settings: mean TTFT {:+.1}% ({:.1} -> {:.1} \
                     ms), p99 {:.1} -> {:.1} ms, hit rate {:+.1} points ({:.1}% -> {:.1}%)",
                    self.ttft_change_pct.unwrap_or(0.0),
                    self.current.ttft_mean_ms,
                    best.ttft_mean_ms,
                    self.current.ttft_p99_ms,
                    best.ttft_p99_ms,
                    self.hit_rate_change_points.unwrap_or(0.0),
                    self.current.hit_rate * 100.0,
                    best.hit_rate * 100.0,
                );
                let _ = writeln!(
                    s,
                    "\nset these in the config file (other keys unchanged):\n\n{config}"
                );
            }
            _ => {
                let _ = writeln!(
                    s,
                    "the current settings ({}) are the quickest at equal hit rate on this \
                     recording: nothing to change",
                    self.current.label
                );
            }
        }
        s
    }

    fn tolerance(&self) -> f64 {
        self.hit_tolerance_points / 100.0
    }

    fn prediction_text(&self, s: &mut String, p: &Prediction) {
        let _ = writeln!(
            s,
            "prediction check: the recording replayed as it was routed, simulated hit rate \
             against what each worker reported (requests with a cached-token count)"
        );
        let _ = writeln!(
            s,
            "{:<40} {:>9} {:>9} {:>10} {:>10} {:>7}",
            "worker", "requests", "reported", "recorded%", "simulated%", "diff"
        );
        for w in &p.workers {
            let _ = writeln!(
                s,
                "{:<40} {:>9} {:>9} {:>10} {:>10} {:>7}",
                w.worker,
                w.requests,
                w.reported,
                pct(w.recorded_hit_rate),
                pct(w.simulated_hit_rate),
                w.difference()
                    .map_or_else(|| "-".into(), |d| format!("{:+.1}", d * 100.0)),
            );
        }
        let _ = writeln!(
            s,
            "{:<40} {:>9} {:>9} {:>10} {:>10}",
            "all",
            p.workers.iter().map(|w| w.requests).sum::<u64>(),
            p.workers.iter().map(|w| w.reported).sum::<u64>(),
            pct(p.recorded_hit_rate),
            pct(p.simulated_hit_rate),
        );
        let _ = writeln!(
            s,
            "routed by the current settings in simulation instead: hit rate {}% (recorded {}%)",
            pct(p.policy_hit_rate),
            pct(p.recorded_hit_rate)
        );
    }
}
