//! Recording production traffic as a trace that `radixgate simulate` and
//! `radixgate tune` replay offline (`record_trace:`, `serve --record-trace
//! FILE`, and at runtime `GET`/`POST`/`DELETE /record_trace` on the admin
//! plane).
//!
//! Each request a worker answered on an inference API becomes one JSON
//! line in the Mooncake trace shape, with no prompt text in it
//! ([`line`]: lengths, chained salted block hashes, the worker, the
//! decision's branch, the reported cached tokens, the status).
//!
//! The request path's part is one call at the end of each request
//! ([`Recorder::record`], from `proxy/respond.rs`'s `RequestWatch`), which hands the
//! routing text and the answer's usage to a bounded queue and returns: it
//! never waits, never hashes, never touches the file. A full queue (more
//! than [`QUEUE_LINES`] requests, or [`QUEUE_BYTES`] of routing text,
//! waiting for the writer) drops the request from the recording and counts
//! it (`radixgate_record_trace_dropped_total`). While no recording runs the
//! request path reads one atomic pointer and keeps nothing. The writer
//! ([`writer`]) hashes, writes, flushes and rotates on a thread of its own.
//!
//! A recording is switched at runtime through the admin plane (behind its
//! gate, [`admin`]); a path given there is resolved inside
//! `record_trace.admin_dir` (an admin can then write only there, and never
//! rename files elsewhere by rotating them). Starting a recording while one
//! runs replaces it; stopping it returns once everything queued is on disk.
//!
//! Concurrency: the current recording is an `ArcSwapOption` (the request
//! path loads it lock-free); start and stop are serialised by a
//! `parking_lot::Mutex` held only while swapping, on a blocking thread
//! (joining the old writer), never across an `.await`.

pub mod admin;
pub mod line;
mod writer;

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use radixgate_routing::Router;
use serde::Serialize;

use crate::config::RecordTraceConfig;
use crate::metrics::{Describe, Metrics, OneCounter, OneGauge};
use crate::usage::Usage;
use line::{Finished, Output, Salt};
use writer::{Counters, Writer};

/// Requests that may wait for the writer.
pub const QUEUE_LINES: usize = 8192;
/// Bytes of routing text that may wait for the writer (the queue's memory
/// bound, whatever the prompts' sizes).
pub const QUEUE_BYTES: usize = 64 << 20;

/// Why a recording could not start.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file could not be opened for appending.
    #[error("cannot open the trace recording {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The writer thread could not be started.
    #[error("cannot start the trace recording's writer thread: {0}")]
    Thread(#[source] std::io::Error),
    /// A path given to the admin API is not inside `record_trace.admin_dir`.
    #[error("record_trace path {}: {reason}", path.display())]
    Path {
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl RecordError {
    /// Whether the path given was at fault (not the gateway).
    pub fn client_caused(&self) -> bool {
        matches!(self, Self::Open { .. } | Self::Path { .. })
    }
}

/// What one recording writes where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Settings {
    /// The file.
    pub path: PathBuf,
    /// Rotate before the file would exceed this many bytes (0: never).
    pub max_bytes: u64,
    /// Rotated files kept (`FILE.1` … `FILE.keep`).
    pub keep: u32,
}

const LINES: Describe = Describe::new(
    "radixgate_record_trace_lines_total",
    "Lines written to the trace recording (record_trace), one per request.",
);
const DROPPED: Describe = Describe::new(
    "radixgate_record_trace_dropped_total",
    "Requests left out of the trace recording because its writer's queue was full.",
);
const WRITE_ERRORS: Describe = Describe::new(
    "radixgate_record_trace_write_errors_total",
    "Lines of the trace recording lost to write errors (and failed rotations).",
);
const ROTATIONS: Describe = Describe::new(
    "radixgate_record_trace_rotations_total",
    "Rotations of the trace recording's file by size.",
);
const ACTIVE: Describe = Describe::new(
    "radixgate_record_trace_active",
    "1 while a trace recording runs, else 0.",
);

/// The recording's metric families.
#[derive(Debug)]
pub(crate) struct RecordMetrics {
    lines: OneCounter,
    dropped: OneCounter,
    write_errors: OneCounter,
    rotations: OneCounter,
    active: OneGauge,
}

impl RecordMetrics {
    fn new(metrics: &Metrics) -> Self {
        Self {
            lines: metrics.counter(&LINES),
            dropped: metrics.counter(&DROPPED),
            write_errors: metrics.counter(&WRITE_ERRORS),
            rotations: metrics.counter(&ROTATIONS),
            active: metrics.gauge(&ACTIVE),
        }
    }
}

/// A running recording, as the request path sees it.
struct Sink {
    tx: SyncSender<Finished>,
    queued_bytes: Arc<AtomicUsize>,
    settings: Settings,
    counters: Arc<Counters>,
}

/// The writer of the current recording, for stopping it.
struct Running {
    thread: std::thread::JoinHandle<()>,
}

/// A recording's state, as `GET /record_trace` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Status {
    /// Whether it is running.
    pub recording: bool,
    /// Where and how it writes (the last recording's, once stopped).
    #[serde(flatten)]
    pub settings: Option<Settings>,
    /// Lines written.
    pub lines: u64,
    /// Requests dropped (queue full).
    pub dropped: u64,
    /// Lines lost to write errors.
    pub write_errors: u64,
    /// Rotations.
    pub rotations: u64,
}

impl Status {
    fn of(recording: bool, settings: &Settings, counters: &Counters) -> Self {
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Self {
            recording,
            settings: Some(settings.clone()),
            lines: get(&counters.lines),
            dropped: get(&counters.dropped),
            write_errors: get(&counters.write_errors),
            rotations: get(&counters.rotations),
        }
    }

    fn off() -> Self {
        Self {
            recording: false,
            settings: None,
            lines: 0,
            dropped: 0,
            write_errors: 0,
            rotations: 0,
        }
    }
}

/// What the request path keeps for a request while a recording runs.
#[derive(Debug)]
pub(crate) struct Pending {
    branch: &'static str,
    output: Output,
}

impl Pending {
    /// Counts a frame of the answer (for estimates when it has no usage).
    pub(crate) fn data(&mut self, bytes: &[u8]) {
        self.output.frame(bytes);
    }
}

/// The end of a recorded request, as the request path knows it.
pub(crate) struct Ended<'a> {
    /// The routing text.
    pub(crate) text: String,
    /// The pool's model.
    pub(crate) model: Option<&'a str>,
    /// The worker's URL.
    pub(crate) worker: &'a str,
    /// The answer's status.
    pub(crate) status: u16,
    /// When the request arrived.
    pub(crate) started: Instant,
    /// What the answer's tail reported, if it was read.
    pub(crate) usage: Option<Usage>,
}

/// The gateway's recorder: the current recording, if any.
pub(crate) struct Recorder {
    sink: ArcSwapOption<Sink>,
    running: parking_lot::Mutex<Option<Running>>,
    salt: Salt,
    router: Router,
    metrics: Arc<RecordMetrics>,
    config: RecordTraceConfig,
}

impl Recorder {
    /// The recorder, recording to `config.path` if it is set.
    pub(crate) fn new(
        config: &RecordTraceConfig,
        router: Router,
        metrics: &Metrics,
    ) -> Result<Self, RecordError> {
        let recorder = Self {
            sink: ArcSwapOption::empty(),
            running: parking_lot::Mutex::new(None),
            salt: Salt::new(),
            router,
            metrics: Arc::new(RecordMetrics::new(metrics)),
            config: config.clone(),
        };
        recorder.metrics.active.set(0.0);
        if let Some(path) = &config.path {
            recorder.start(Settings {
                path: path.clone(),
                max_bytes: config.max_bytes,
                keep: config.keep,
            })?;
        }
        Ok(recorder)
    }

    /// What to keep for a request answered with `branch`, while a
    /// recording runs.
    pub(crate) fn pending(&self, branch: &'static str, sse: bool) -> Option<Pending> {
        self.sink.load().is_some().then(|| Pending {
            branch,
            output: Output {
                sse,
                ..Output::default()
            },
        })
    }

    /// Queues a finished request for the writer, or drops it (counted)
    /// when the queue is full. Never blocks.
    pub(crate) fn record(&self, pending: Pending, end: Ended<'_>) {
        let guard = self.sink.load();
        let Some(sink) = guard.as_ref() else {
            return;
        };
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_sub(end.started.elapsed());
        let finished = Finished {
            at_ms: u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX),
            text: end.text,
            model: end.model.map(str::to_owned),
            worker: end.worker.to_owned(),
            branch: pending.branch,
            status: end.status,
            usage: end.usage,
            output: pending.output,
        };
        let len = finished.text.len();
        let queued = sink.queued_bytes.fetch_add(len, Ordering::Relaxed) + len;
        let sent = queued <= QUEUE_BYTES
            && match sink.tx.try_send(finished) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            };
        if !sent {
            sink.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            sink.counters.dropped.fetch_add(1, Ordering::Relaxed);
            self.metrics.dropped.add(1);
        }
    }

    /// Starts recording with `settings`, replacing (and finishing) any
    /// recording running. Blocks while the old writer drains: call it on a
    /// blocking thread.
    pub(crate) fn start(&self, settings: Settings) -> Result<Status, RecordError> {
        let mut running = self.running.lock();
        // Opened first: a path that cannot be written leaves the running
        // recording alone.
        let (file, size) = writer::open(&settings.path).map_err(|source| RecordError::Open {
            path: settings.path.clone(),
            source,
        })?;
        // The old recording ends (everything queued written) before the new
        // one starts, so two writers never append to one file at once.
        self.finish_running(&mut running);
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE_LINES);
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let counters = Arc::new(Counters::default());
        let router = self.router.clone();
        let writer = Writer {
            settings: settings.clone(),
            file,
            size,
            grown: size,
            batch: Vec::new(),
            batch_lines: 0,
            salt: self.salt.clone(),
            rates: Box::new(move |model: &str| learned_rate(&router, model)),
            blocks: Default::default(),
            counters: counters.clone(),
            metrics: self.metrics.clone(),
            queued_bytes: queued_bytes.clone(),
            warned: false,
        };
        let thread = std::thread::Builder::new()
            .name("radixgate-record".into())
            .spawn(move || writer.run(rx))
            .map_err(RecordError::Thread)?;
        let status = Status::of(true, &settings, &counters);
        self.sink.store(Some(Arc::new(Sink {
            tx,
            queued_bytes,
            settings,
            counters,
        })));
        *running = Some(Running { thread });
        self.metrics.active.set(1.0);
        tracing::info!(path = %status_path(&status), "trace recording started");
        Ok(status)
    }

    /// Stops the recording, if one runs, once everything queued is written;
    /// its final figures. Blocks: call it on a blocking thread.
    pub(crate) fn stop(&self) -> Status {
        let mut running = self.running.lock();
        let status = self.finish_running(&mut running);
        if let Some(status) = &status {
            tracing::info!(
                path = %status_path(status),
                lines = status.lines,
                "trace recording stopped"
            );
        }
        status.unwrap_or_else(Status::off)
    }

    /// Ends the running recording, if any, and waits for its writer to
    /// write what was queued; its final figures.
    fn finish_running(&self, running: &mut Option<Running>) -> Option<Status> {
        let sink = self.sink.swap(None)?;
        self.metrics.active.set(0.0);
        let (settings, counters) = (sink.settings.clone(), sink.counters.clone());
        // The writer ends once the last sender is gone: this one, and any a
        // request holds for an instant while queueing.
        drop(sink);
        if let Some(old) = running.take() {
            let _ = old.thread.join();
        }
        Some(Status::of(false, &settings, &counters))
    }

    /// The current recording's figures.
    pub(crate) fn status(&self) -> Status {
        match self.sink.load().as_ref() {
            Some(sink) => Status::of(true, &sink.settings, &sink.counters),
            None => Status::off(),
        }
    }

    /// The settings of a recording asked for through the admin API: the
    /// path resolved inside `record_trace.admin_dir`, the sizes defaulting
    /// to the config's.
    pub(crate) fn admin_settings(
        &self,
        path: &Path,
        max_bytes: Option<u64>,
        keep: Option<u32>,
    ) -> Result<Settings, RecordError> {
        let path = inside(&self.config.admin_dir, path)?;
        a_trace_of_the_dir(&self.config.admin_dir, &path)?;
        let keep = keep.unwrap_or(self.config.keep);
        // A rotation renames `FILE.k` over `FILE.k+1`, whatever is there:
        // those names too must be new files or traces.
        for k in 1..=keep {
            a_trace_of_the_dir(&self.config.admin_dir, &writer::rotated(&path, k))?;
        }
        Ok(Settings {
            path,
            max_bytes: max_bytes.unwrap_or(self.config.max_bytes),
            keep,
        })
    }
}

fn status_path(status: &Status) -> String {
    status
        .settings
        .as_ref()
        .map(|s| s.path.display().to_string())
        .unwrap_or_default()
}

/// The learned characters per token of `model`'s tree, if any.
fn learned_rate(router: &Router, model: &str) -> Option<f64> {
    let policy = router.policy();
    let rates = policy.trees()?.chars_per_token();
    rates
        .iter()
        .find(|(m, _)| m == model)
        .or_else(|| rates.first().filter(|_| rates.len() == 1))
        .map(|(_, c)| *c)
}

/// `path` inside `dir`: a relative path without `..` is joined to it; an
/// absolute one must already lie inside it (compared by components).
fn inside(dir: &Path, path: &Path) -> Result<PathBuf, RecordError> {
    let bad = |reason: &str| RecordError::Path {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    if path.as_os_str().is_empty() || path.file_name().is_none() {
        return Err(bad("must name a file"));
    }
    if path
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
    {
        return Err(bad("must not contain `..`"));
    }
    if path.is_absolute() {
        if path.starts_with(dir) && dir.is_absolute() {
            return Ok(path.to_owned());
        }
        return Err(bad(&format!(
            "must lie inside record_trace.admin_dir ({}); give a path relative to it",
            dir.display()
        )));
    }
    Ok(dir.join(path))
}

/// Refuses an admin path (already [`inside`] `dir` by its components) that
/// leads out of `dir` through a symbolic link, or names a file other than
/// a trace: an existing file is appended to, and rotated away or removed
/// when it is full, so the admin API must not reach a file it did not
/// write, in `dir` or out of it.
fn a_trace_of_the_dir(dir: &Path, path: &Path) -> Result<(), RecordError> {
    let bad = |reason: String| RecordError::Path {
        path: path.to_owned(),
        reason,
    };
    let parent = path.parent().unwrap_or(Path::new("."));
    let (Ok(real_dir), Ok(real_parent)) = (dir.canonicalize(), parent.canonicalize()) else {
        // Opening it will say what is missing.
        return Ok(());
    };
    if !real_parent.starts_with(&real_dir) {
        return Err(bad(format!(
            "leads out of record_trace.admin_dir ({}) through a symbolic link",
            dir.display()
        )));
    }
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(()); // a new file
    };
    if meta.file_type().is_symlink() {
        return Err(bad("is a symbolic link; name the file itself".into()));
    }
    if !meta.is_file() {
        return Err(bad("is not a file".into()));
    }
    if meta.len() > 0 && !starts_as_a_trace(path) {
        return Err(bad(
            "is a file that is not a trace (its first line is not a trace line); \
             name a new file, or a trace recorded before"
                .into(),
        ));
    }
    Ok(())
}

/// Whether the file's first line is a JSON object with a trace line's
/// `timestamp` and `hash_ids`.
fn starts_as_a_trace(path: &Path) -> bool {
    use std::io::{BufRead, Read};
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let mut first = Vec::new();
    // A trace line has one id per 512 tokens of its prompt: a few hundred
    // KiB at the most a line takes (`line::MAX_INPUT_TOKENS`).
    let limit = 1 << 20;
    if std::io::BufReader::new(file.take(limit))
        .read_until(b'\n', &mut first)
        .is_err()
    {
        return false;
    }
    serde_json::from_slice::<serde_json::Value>(&first).is_ok_and(|line| {
        line.get("timestamp").is_some_and(serde_json::Value::is_u64)
            && line
                .get("hash_ids")
                .is_some_and(serde_json::Value::is_array)
    })
}

#[cfg(test)]
mod tests;
