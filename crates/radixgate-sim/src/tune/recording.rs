//! A recording as `tune` reads it: the trace's records in replay order
//! (the order [`TraceReplay`] numbers them), the workers it names, and
//! what those workers reported.
//!
//! [`TraceReplay`]: crate::workload::TraceReplay

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::SimError;
use crate::workload::{TraceRecord, load_model_trace};

/// A loaded recording (or any Mooncake-format trace).
#[derive(Debug, Clone)]
pub struct Recording {
    /// The file.
    pub path: PathBuf,
    /// Its records sorted by time, cut to the replay limit: record `i` is
    /// the request the replay numbers `i`.
    pub records: Vec<TraceRecord>,
    /// The distinct worker URLs of the replayed records, sorted: worker `i`
    /// of the simulated pool stands for `workers[i]`.
    pub workers: Vec<String>,
}

/// Sums over one worker's requests (or all of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests.
    pub requests: u64,
    /// Of those, with a cached-token count (reported, or simulated).
    pub reported: u64,
    /// Prompt tokens of the reported ones.
    pub prompt_tokens: u64,
    /// Cached tokens of the reported ones.
    pub cached_tokens: u64,
}

impl Tally {
    /// Cached over prompt tokens of the reported requests; `None` without
    /// any.
    pub fn hit_rate(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.cached_tokens as f64 / self.prompt_tokens as f64)
    }

    /// Counts a request (with its counts, when it has them).
    pub fn add(&mut self, counts: Option<(u64, u64)>) {
        self.requests += 1;
        if let Some((prompt, cached)) = counts {
            self.reported += 1;
            self.prompt_tokens += prompt;
            self.cached_tokens += cached.min(prompt);
        }
    }
}

impl Recording {
    /// Reads `path` (validated as the replay reads it), keeping the lines
    /// of `model` (required when the lines name several) and of those the
    /// first `limit` records by time (0: all).
    pub fn load(
        path: &Path,
        block_tokens: u64,
        model: Option<&str>,
        limit: u64,
    ) -> Result<Self, SimError> {
        let mut records = load_model_trace(path, block_tokens, model)?;
        if limit > 0 {
            records.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        }
        let mut workers: Vec<String> = records
            .iter()
            .filter(|r| r.replayed())
            .filter_map(|r| r.worker.clone())
            .collect();
        workers.sort();
        workers.dedup();
        Ok(Self {
            path: path.to_owned(),
            records,
            workers,
        })
    }

    /// Records that are replayed (no status, or a 2xx).
    pub fn replayed(&self) -> usize {
        self.records.iter().filter(|r| r.replayed()).count()
    }

    /// Seconds from the first record to the last.
    pub fn span_secs(&self) -> f64 {
        match (self.records.first(), self.records.last()) {
            (Some(a), Some(b)) => (b.timestamp - a.timestamp) as f64 / 1000.0,
            _ => 0.0,
        }
    }

    /// Each record's worker, as an index into [`Self::workers`], when every
    /// replayed record names one (records not replayed get 0: they are
    /// never dispatched); `None` for a trace without workers.
    pub fn pins(&self) -> Option<Vec<usize>> {
        let index: BTreeMap<&str, usize> = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| (w.as_str(), i))
            .collect();
        self.records
            .iter()
            .map(|r| match (&r.worker, r.replayed()) {
                (_, false) => Some(0),
                (Some(w), true) => index.get(w.as_str()).copied(),
                (None, true) => None,
            })
            .collect()
    }

    /// What the workers reported, per worker (in [`Self::workers`] order):
    /// replayed requests, and the prompt and cached tokens of those whose
    /// answer carried a cached-token count.
    pub fn reported(&self) -> Vec<Tally> {
        let mut out = vec![Tally::default(); self.workers.len()];
        for r in self.records.iter().filter(|r| r.replayed()) {
            let Some(i) = r
                .worker
                .as_deref()
                .and_then(|w| self.workers.iter().position(|x| x == w))
            else {
                continue;
            };
            out[i].add(r.cached_tokens.map(|c| (r.input_length, c)));
        }
        out
    }

    /// Whether record `seq` carries a reported cached-token count.
    pub fn has_report(&self, seq: u64) -> bool {
        usize::try_from(seq)
            .ok()
            .and_then(|i| self.records.get(i))
            .is_some_and(|r| r.cached_tokens.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_pins_and_reports_follow_the_time_order() {
        let dir = std::env::temp_dir().join(format!("radixgate-rec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.jsonl");
        std::fs::write(
            &path,
            r#"{"timestamp": 30, "input_length": 100, "output_length": 1, "hash_ids": [1], "worker": "http://b", "cached_tokens": 50, "status": 200}
{"timestamp": 10, "input_length": 200, "output_length": 1, "hash_ids": [1], "worker": "http://a", "cached_tokens": null, "status": 200}
{"timestamp": 20, "input_length": 300, "output_length": 1, "hash_ids": [1], "worker": "http://c", "status": 500}
{"timestamp": 40, "input_length": 400, "output_length": 1, "hash_ids": [1], "worker": "http://a", "cached_tokens": 100, "status": 200}
"#,
        )
        .unwrap();
        let rec = Recording::load(&path, 512, None, 0).unwrap();
        assert_eq!(rec.workers, ["http://a", "http://b"], "the 500 names none");
        assert_eq!(rec.replayed(), 3);
        assert_eq!(rec.span_secs(), 0.03);
        assert_eq!(rec.pins(), Some(vec![0, 0, 1, 0]));
        let reported = rec.reported();
        assert_eq!(reported[0].requests, 2);
        assert_eq!(reported[0].reported, 1);
        assert_eq!(reported[0].hit_rate(), Some(0.25));
        assert_eq!(reported[1].hit_rate(), Some(0.5));
        assert!(rec.has_report(2) && !rec.has_report(0) && !rec.has_report(9));
        let cut = Recording::load(&path, 512, None, 2).unwrap();
        assert_eq!(cut.records.len(), 2);
        assert_eq!(cut.workers, ["http://a"]);
        // A plain trace names no workers: nothing to pin.
        std::fs::write(
            &path,
            "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n",
        )
        .unwrap();
        assert_eq!(Recording::load(&path, 512, None, 0).unwrap().pins(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
