//! Replay of Mooncake-style JSONL traces.
//!
//! Each line is `{"timestamp": ms, "input_length": tokens, "output_length":
//! tokens, "hash_ids": [block ids]}`: the prompt is a sequence of
//! `block_tokens`-token blocks (512 in Mooncake), the last one partial so
//! that the prompt has exactly `input_length` tokens. Each block id renders
//! to a fixed text of `block_tokens * chars_per_token` characters (seeded
//! from the id), a partial block to a prefix of it, and the prompt to their
//! concatenation — so two requests that share their first k block ids share
//! exactly that much text, and the trace's prefix structure is kept.
//!
//! Requests arrive at `(timestamp - first timestamp) / speedup`. With
//! `spread_bursts`, the records that share a timestamp arrive evenly over
//! the time to the next distinct one (the last burst over the gap before
//! it) instead of all at once: some traces round their times to a coarse
//! grid (Mooncake's conversation trace to about 3 s, 10 requests an
//! instant on average, up to 28), and a burst at one instant is a load no
//! front end sees. Records
//! are validated when loaded: a bad line is a precise error naming the line.
//! A line's `output_length` is at most what the simulated worker generates
//! ([`MAX_OUTPUT_TOKENS`]), and the trace spans at most a week
//! ([`MAX_SPAN_MS`]): the simulator steps through its time.
//! Lines may come in any order of time (a recording of `radixgate serve
//! --record-trace` is written as requests end, not as they arrive): they are
//! replayed sorted by timestamp, lines of equal time in file order.
//!
//! Fields other than the four above are ignored, except four that a
//! recording adds and that are kept: `model`, `worker` (who served it),
//! the reported `cached_tokens`, and `status`. A line whose `status` is not
//! a 2xx is not replayed: its worker refused or failed it.
//!
//! A recording of a router that serves several models holds several
//! pools, each model on its own workers; replayed as one, one model's
//! requests would be routed to another's workers and every figure would
//! be of a pool that never existed. So a trace whose lines name more than
//! one model is refused unless [`TraceConfig::model`] picks one, and then
//! only that model's lines are replayed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::rng::key;
use super::text::append_filler;
use super::{Poll, Prompt, RequestSpec, SessionId, TextShape, Workload};
use crate::SimError;
use crate::server::MAX_OUTPUT_TOKENS;

const BLOCK: u64 = 41;

/// Least and most `speedup`: a second of trace replays in at most 1000 s,
/// and arrivals stay `Duration`s.
pub const SPEEDUP_RANGE: (f64, f64) = (1e-3, 1e6);

/// The largest `block_tokens`: each block renders to that many tokens of
/// text, a partial one included (512 in Mooncake).
pub const MAX_BLOCK_TOKENS: u64 = 1 << 20;

/// The longest time from a trace's first timestamp to its last, ms: a week.
pub const MAX_SPAN_MS: u64 = 7 * 86_400_000;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// Arrival, milliseconds from the start of the trace.
    pub timestamp: u64,
    /// Prompt length, tokens.
    pub input_length: u64,
    /// Tokens generated.
    pub output_length: u64,
    /// The prompt's blocks, by id.
    pub hash_ids: Vec<u64>,
    /// A recording's: the model the request was routed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A recording's: the URL of the worker that served the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// A recording's: the prompt tokens the worker reported cached (`None`
    /// when it did not report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// A recording's: the HTTP status of the worker's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

impl TraceRecord {
    /// Whether the request is replayed: no status (a plain trace), or a 2xx.
    pub fn replayed(&self) -> bool {
        self.status.is_none_or(|s| (200..300).contains(&s))
    }
}

/// Settings of [`TraceReplay`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceConfig {
    /// The JSONL file.
    pub path: PathBuf,
    /// Time compression: 2.0 replays twice as fast.
    #[serde(default = "one")]
    pub speedup: f64,
    /// Replay at most this many records (0 = all).
    #[serde(default)]
    pub limit: u64,
    /// Tokens per hash block (Mooncake: 512).
    #[serde(default = "block_tokens")]
    pub block_tokens: u64,
    /// Cap on tokens generated per request (0 = as the trace says).
    #[serde(default)]
    pub max_output_tokens: u32,
    /// Records sharing a timestamp arrive evenly over the time to the next
    /// distinct one, not all at once (module doc).
    #[serde(default)]
    pub spread_bursts: bool,
    /// Replay only the lines of this model (a recording of a router that
    /// serves several; module doc). `None`: every line, which must then
    /// name one model at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

fn one() -> f64 {
    1.0
}

fn block_tokens() -> u64 {
    512
}

impl TraceConfig {
    /// Settings for `path` with the defaults.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            speedup: 1.0,
            limit: 0,
            block_tokens: 512,
            max_output_tokens: 0,
            spread_bursts: false,
            model: None,
        }
    }

    /// Checks ranges (not the file: that is read by [`TraceReplay::new`]).
    pub fn validate(&self) -> Result<(), SimError> {
        let (least, most) = SPEEDUP_RANGE;
        if !(least..=most).contains(&self.speedup) {
            return Err(SimError::Config(format!(
                "speedup must be in {least}..={most}, got {}",
                self.speedup
            )));
        }
        if !(1..=MAX_BLOCK_TOKENS).contains(&self.block_tokens) {
            return Err(SimError::Config(format!(
                "block_tokens must be in 1..={MAX_BLOCK_TOKENS}, got {}",
                self.block_tokens
            )));
        }
        Ok(())
    }
}

/// Reads and validates a trace file. Records come back sorted by
/// timestamp (stable: equal times keep their file order).
pub fn load_trace(path: &Path, block_tokens: u64) -> Result<Vec<TraceRecord>, SimError> {
    let bytes = std::fs::read(path).map_err(|source| SimError::TraceIo {
        path: path.to_owned(),
        source,
    })?;
    parse_trace(&trace_text(bytes, path)?, path, block_tokens)
}

/// A trace file's bytes as text, or an error that says what the file is
/// instead: compressed (traces are often shipped gzipped), or not UTF-8 at
/// a line it names.
fn trace_text(bytes: Vec<u8>, path: &Path) -> Result<String, SimError> {
    let refuse = |line: usize, reason: String| SimError::TraceFormat {
        path: path.to_owned(),
        line,
        reason,
    };
    let compressed = [
        (&[0x1f, 0x8b][..], "gzip", "gunzip -k"),
        (&[0x28, 0xb5, 0x2f, 0xfd][..], "zstd", "zstd -d"),
        (&[0x42, 0x5a, 0x68][..], "bzip2", "bunzip2 -k"),
        (&[0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00][..], "xz", "unxz -k"),
    ];
    if let Some((_, kind, tool)) = compressed.iter().find(|(m, ..)| bytes.starts_with(m)) {
        return Err(refuse(
            0,
            format!("the file is {kind}-compressed; decompress it first ({tool} FILE)"),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
        refuse(line, format!("not UTF-8 text (byte {at} of the file)"))
    })
}

/// Reads a trace file as [`load_trace`] does, keeping the lines of `model`
/// only; without `model`, refuses a trace whose lines name several models
/// (each its own pool: module doc).
pub fn load_model_trace(
    path: &Path,
    block_tokens: u64,
    model: Option<&str>,
) -> Result<Vec<TraceRecord>, SimError> {
    let records = load_trace(path, block_tokens)?;
    let mut models: std::collections::BTreeMap<&str, usize> = Default::default();
    for m in records.iter().filter_map(|r| r.model.as_deref()) {
        *models.entry(m).or_default() += 1;
    }
    let list = || {
        models
            .iter()
            .map(|(m, n)| format!("{m} ({n} lines)"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match model {
        Some(want) => {
            if !models.contains_key(want) {
                return Err(SimError::Config(format!(
                    "trace file {}: no line of model {want:?} (its models: {})",
                    path.display(),
                    if models.is_empty() {
                        "none named".into()
                    } else {
                        list()
                    }
                )));
            }
            Ok(records
                .into_iter()
                .filter(|r| r.model.as_deref() == Some(want))
                .collect())
        }
        None if models.len() > 1 => Err(SimError::Config(format!(
            "trace file {}: its lines name {} models, {}: each is served by its own \
             workers, and one replay would route them as one pool; replay one model at a \
             time (tune --model NAME, simulate and load --trace-model NAME)",
            path.display(),
            models.len(),
            list()
        ))),
        None => Ok(records),
    }
}

pub(super) fn parse_trace(
    text: &str,
    path: &Path,
    block_tokens: u64,
) -> Result<Vec<TraceRecord>, SimError> {
    let bad = |line: usize, reason: String| SimError::TraceFormat {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut out = Vec::new();
    // The earliest and latest timestamps so far.
    let mut span: Option<(u64, u64)> = None;
    // The last line when no newline ends it: a recording being written as
    // it is read, or one a killed router left (the recorder mends it at
    // its next start).
    let unterminated = (!text.ends_with('\n')).then(|| text.lines().count());
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let rec: TraceRecord = match serde_json::from_str(line) {
            Ok(rec) => rec,
            Err(_) if unterminated == Some(n) && !out.is_empty() => {
                eprintln!(
                    "note: trace file {}: line {n} is cut short (no newline ends it, as \
                     when it is still being written); it is left out",
                    path.display()
                );
                break;
            }
            Err(e) => return Err(bad(n, e.to_string())),
        };
        let blocks = rec.hash_ids.len() as u64;
        if blocks == 0 {
            return Err(bad(n, "hash_ids is empty".into()));
        }
        if rec.input_length <= (blocks - 1) * block_tokens
            || rec.input_length > blocks * block_tokens
        {
            return Err(bad(
                n,
                format!(
                    "input_length {} does not fit {blocks} blocks of {block_tokens} tokens",
                    rec.input_length
                ),
            ));
        }
        if rec.output_length > MAX_OUTPUT_TOKENS as u64 {
            return Err(bad(
                n,
                format!(
                    "output_length {} is more than a worker generates ({MAX_OUTPUT_TOKENS} tokens)",
                    rec.output_length
                ),
            ));
        }
        let t = rec.timestamp;
        let (first, last) = span.map_or((t, t), |(a, b)| (a.min(t), b.max(t)));
        if last - first > MAX_SPAN_MS {
            return Err(bad(
                n,
                format!(
                    "timestamp {t} makes the trace span more than 7 days ({MAX_SPAN_MS} ms): \
                     its times run from {first} to {last}"
                ),
            ));
        }
        span = Some((first, last));
        out.push(rec);
    }
    if out.is_empty() {
        return Err(bad(0, "the trace holds no records".into()));
    }
    out.sort_by_key(|r| r.timestamp);
    Ok(out)
}

/// Replays a trace.
#[derive(Debug, Clone)]
pub struct TraceReplay {
    cfg: TraceConfig,
    seed: u64,
    shape: TextShape,
    records: Arc<Vec<TraceRecord>>,
    /// Each record's arrival, from the first record's (before `speedup`).
    offsets_ms: Arc<Vec<f64>>,
    pos: usize,
}

impl TraceReplay {
    /// Loads the trace named by `cfg` (validates `cfg` and every line).
    pub fn new(cfg: TraceConfig, seed: u64, shape: TextShape) -> Result<Self, SimError> {
        cfg.validate()?;
        let records = load_model_trace(&cfg.path, cfg.block_tokens, cfg.model.as_deref())?;
        let replay = Self::from_records(cfg, seed, shape, Arc::new(records));
        // A recording of failed requests only (within `limit`): a run
        // would send nothing and print a table of nothing as if it had
        // measured.
        let within = &replay.records[..replay.len()];
        if !within.iter().any(TraceRecord::replayed) {
            return Err(SimError::Config(format!(
                "trace file {}: none of its {} records is replayed (each has a status that is \
                 not 2xx): nothing to send",
                replay.cfg.path.display(),
                within.len()
            )));
        }
        Ok(replay)
    }

    /// Replays records already loaded (validated by the caller).
    pub fn from_records(
        cfg: TraceConfig,
        seed: u64,
        shape: TextShape,
        records: Arc<Vec<TraceRecord>>,
    ) -> Self {
        let offsets_ms = Arc::new(offsets_ms(&records, cfg.spread_bursts));
        Self {
            cfg,
            seed,
            shape,
            records,
            offsets_ms,
            pos: 0,
        }
    }

    /// The records to replay (after `limit`).
    pub fn len(&self) -> usize {
        match self.cfg.limit {
            0 => self.records.len(),
            l => self.records.len().min(l as usize),
        }
    }

    /// Whether there is nothing to replay.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The prompt text of `rec`: its blocks rendered and concatenated, the
    /// last one cut to `input_length`.
    pub fn render(&self, rec: &TraceRecord) -> String {
        let block_chars = self.shape.chars(self.cfg.block_tokens);
        let total = self.shape.chars(rec.input_length);
        let mut out = String::with_capacity(total);
        for &id in &rec.hash_ids {
            let want = block_chars.min(total - out.len());
            append_filler(&mut out, key(self.seed, &[BLOCK, id]), want);
        }
        out
    }

    fn arrival(&self, pos: usize) -> Duration {
        Duration::from_secs_f64(self.offsets_ms[pos] / 1000.0 / self.cfg.speedup)
    }
}

/// Each record's arrival in milliseconds from the first record's, for
/// records sorted by timestamp: the timestamps themselves, or with
/// `spread` each burst of equal timestamps evenly over the gap to the next
/// distinct one (the last burst over the gap before it; a trace of one
/// instant stays at one instant).
fn offsets_ms(records: &[TraceRecord], spread: bool) -> Vec<f64> {
    let Some(first) = records.first().map(|r| r.timestamp) else {
        return Vec::new();
    };
    let mut out: Vec<f64> = records
        .iter()
        .map(|r| (r.timestamp - first) as f64)
        .collect();
    if !spread {
        return out;
    }
    let mut start = 0;
    let mut last_gap = 0u64;
    while start < records.len() {
        let t = records[start].timestamp;
        let end = start + records[start..].partition_point(|r| r.timestamp == t);
        let gap = match records.get(end) {
            Some(next) => next.timestamp - t,
            None => last_gap,
        };
        let k = (end - start) as f64;
        for (i, o) in out[start..end].iter_mut().enumerate() {
            *o += gap as f64 * i as f64 / k;
        }
        last_gap = gap;
        start = end;
    }
    out
}

impl Workload for TraceReplay {
    fn next(&mut self, now: Duration) -> Poll {
        while self.pos < self.len() && !self.records[self.pos].replayed() {
            self.pos += 1;
        }
        if self.pos >= self.len() {
            return Poll::Done;
        }
        let rec = &self.records[self.pos];
        let at = self.arrival(self.pos);
        if at > now {
            return Poll::NotBefore(at);
        }
        let mut max_tokens = u32::try_from(rec.output_length.max(1)).unwrap_or(u32::MAX);
        if self.cfg.max_output_tokens > 0 {
            max_tokens = max_tokens.min(self.cfg.max_output_tokens);
        }
        let spec = RequestSpec {
            seq: self.pos as u64,
            session: self.pos as u64,
            group: rec.hash_ids[0],
            arrival: Some(at),
            prompt: Prompt::Text(self.render(rec)),
            max_tokens,
            wants_reply: false,
        };
        self.pos += 1;
        Poll::Ready(spec)
    }

    fn on_reply(&mut self, _session: SessionId, _reply: &str, _now: Duration) {}

    fn on_failure(&mut self, _session: SessionId, _now: Duration) {}

    fn timestamped(&self) -> bool {
        true
    }
}
