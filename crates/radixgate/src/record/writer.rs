//! The recording's writer: one OS thread per recording that turns finished
//! requests into lines and appends them to the file, rotating it by size.
//!
//! It runs on its own thread because file writes block; nothing on the
//! request path ever waits for it (the queue in front of it is bounded and
//! a full queue drops, see `record.rs`). It gathers lines in a batch and
//! writes the batch whenever the queue runs empty (or the batch passes
//! [`BATCH`] bytes), so a line reaches the file soon after its request
//! ended without a system call per line under load. It ends when every
//! sender is gone (the recording was stopped or replaced, or the gateway
//! shut down), after writing what was queued.
//!
//! Rotation: before a line that would take the file past `max_bytes` (when
//! the file is not empty), `FILE.{keep-1}` … `FILE.1` move up one,
//! `FILE` becomes `FILE.1`, and a new `FILE` starts; with `keep` 0 the full
//! file is deleted instead. A recording appends to an existing `FILE`; a
//! torn last line there (a write cut short by a full disk or a killed
//! process) is cut first, so that the first new line is not glued onto it
//! and the file stays one that `simulate` and `tune` load (they refuse a
//! file with a bad line).
//!
//! The writer follows its path, as a log writer does: before each batch
//! it checks that the path still names the file in hand. A file deleted
//! or moved away (by hand, by logrotate, by a cleanup job) is replaced by
//! a new one at the path, with a WARN; without that, lines would go on
//! into the deleted file's space, out of sight and never rotated. A file
//! cut short in place (logrotate's `copytruncate`) is measured again, so
//! rotation counts from its new size.
//!
//! A batch whose write fails (a full disk) is lost whole: its lines are
//! counted as write errors, never as written, and whatever part of it
//! reached the file is cut off again, so the file still ends with a whole
//! line. The error is logged once per recording (then only counted); the
//! next batch tries again. A failed rotation counts as one write error,
//! and lines keep going to the file in hand.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;

use super::line::{self, Finished, Salt};
use super::{RecordMetrics, Settings};

/// The figures of one recording, read by `GET /record_trace`.
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// Lines written.
    pub(super) lines: AtomicU64,
    /// Requests dropped because the queue was full.
    pub(super) dropped: AtomicU64,
    /// Lines lost to write errors.
    pub(super) write_errors: AtomicU64,
    /// Rotations done.
    pub(super) rotations: AtomicU64,
}

/// Where a model's characters per token come from (the routing
/// correction's learned rates; `None` before the first answer).
pub(super) type Rates = Box<dyn Fn(&str) -> Option<f64> + Send>;

/// Everything the writer thread owns.
pub(super) struct Writer {
    pub(super) settings: Settings,
    pub(super) file: File,
    /// Bytes in the current file: whole lines.
    pub(super) size: u64,
    /// Bytes counted towards the next rotation.
    pub(super) grown: u64,
    /// Lines not yet written, and how many.
    pub(super) batch: Vec<u8>,
    pub(super) batch_lines: u64,
    pub(super) salt: Salt,
    pub(super) rates: Rates,
    /// Each model's block size in characters, fixed when the model is
    /// first recorded (so its block boundaries never move).
    pub(super) blocks: HashMap<String, usize>,
    pub(super) counters: Arc<Counters>,
    pub(super) metrics: Arc<RecordMetrics>,
    /// Routing-text bytes queued; released as each line is handled.
    pub(super) queued_bytes: Arc<AtomicUsize>,
    /// Whether a write error was already logged.
    pub(super) warned: bool,
}

/// Which file a handle or a path names (device and inode), where the
/// platform tells.
fn identity(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

/// How far from its end a file is searched for the start of a torn last
/// line: past the longest line a recording writes (32,768 block ids at
/// most, `line::MAX_INPUT_TOKENS`).
const TAIL_SEARCH: u64 = 1 << 20;

/// Bytes of lines gathered before they are written, however full the
/// queue.
const BATCH: usize = 64 * 1024;

/// Opens `path` for appending (creating it), with its current size.
pub(super) fn open(path: &Path) -> std::io::Result<(File, u64)> {
    // Readable too, for [`mend`].
    let file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)?;
    let size = file.metadata()?.len();
    Ok((file, size))
}

/// Makes `file` end with a whole line before lines are appended to it: a
/// torn last line (no newline after it) is cut off, or ended with a
/// newline when it is whole JSON that only lacks one. Answers the file's
/// size after, and the bytes cut.
fn mend(file: &File) -> std::io::Result<(u64, u64)> {
    let size = file.metadata()?.len();
    if size == 0 {
        return Ok((0, 0));
    }
    let from = size.saturating_sub(TAIL_SEARCH);
    let mut reader = file;
    reader.seek(SeekFrom::Start(from))?;
    let mut tail = Vec::new();
    reader.take(size - from).read_to_end(&mut tail)?;
    if tail.last() == Some(&b'\n') {
        return Ok((size, 0));
    }
    let start = tail.iter().rposition(|&b| b == b'\n').map(|i| i + 1);
    let torn = &tail[start.unwrap_or(0)..];
    // Kept and ended: a whole line that lacks only its newline (written by
    // hand), and a line longer than the search (which cannot be told).
    if serde_json::from_slice::<serde_json::Value>(torn).is_ok() || (start.is_none() && from > 0) {
        let mut writer = file;
        writer.write_all(b"\n")?;
        return Ok((size + 1, 0));
    }
    let keep = size - torn.len() as u64;
    file.set_len(keep)?;
    Ok((keep, torn.len() as u64))
}

impl Writer {
    /// Handles lines until every sender is gone.
    pub(super) fn run(mut self, rx: Receiver<Finished>) {
        // Here, not when the file is opened: the recording this one
        // replaced may have been writing to the same file until now.
        match mend(&self.file) {
            Ok((size, 0)) => (self.size, self.grown) = (size, size),
            Ok((size, cut)) => {
                (self.size, self.grown) = (size, size);
                tracing::warn!(
                    path = %self.settings.path.display(),
                    bytes = cut,
                    "the trace recording's file ended in a torn line (a write \
                     cut short); cut it off before appending"
                );
            }
            Err(err) => self.failed(&err, 1),
        }
        while let Ok(first) = rx.recv() {
            self.handle(first);
            while let Ok(next) = rx.try_recv() {
                self.handle(next);
            }
            self.write_batch();
        }
        self.write_batch();
    }

    fn handle(&mut self, f: Finished) {
        self.queued_bytes.fetch_sub(f.text.len(), Ordering::Relaxed);
        let model = f.model.as_deref().unwrap_or("");
        let rate = (self.rates)(model);
        let block_chars = *self
            .blocks
            .entry(model.to_owned())
            .or_insert_with(|| line::block_chars(rate));
        let line = line::line(
            &self.salt,
            &f,
            block_chars,
            rate.unwrap_or(line::DEFAULT_CHARS_PER_TOKEN),
        );
        let mut bytes = match serde_json::to_vec(&line) {
            Ok(b) => b,
            Err(err) => return self.failed(&std::io::Error::other(err), 1),
        };
        bytes.push(b'\n');
        let max = self.settings.max_bytes;
        let pending = self.batch.len() as u64;
        let over = |grown: u64, pending: u64| {
            max > 0 && grown + pending > 0 && grown + pending + bytes.len() as u64 > max
        };
        if over(self.grown, pending) {
            // The file may have been replaced or cut short since the last
            // batch: then it may not be full at all. The lines gathered
            // belong to the file in hand, and writing them follows it.
            match pending {
                0 => self.follow(),
                _ => self.write_batch(),
            }
        }
        if over(self.grown, self.batch.len() as u64)
            && let Err(err) = self.rotate()
        {
            // The line still goes to the file in hand; the next rotation is
            // tried after another `max_bytes`, not at once.
            self.failed(&err, 1);
            self.grown = 0;
        }
        self.batch.extend_from_slice(&bytes);
        self.batch_lines += 1;
        if self.batch.len() >= BATCH {
            self.write_batch();
        }
    }

    /// Writes the lines gathered: all counted as written, or all as lost
    /// with the file cut back to its last whole line.
    fn write_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        self.follow();
        let lines = std::mem::take(&mut self.batch_lines);
        match (&self.file).write_all(&self.batch) {
            Ok(()) => {
                let len = self.batch.len() as u64;
                self.size += len;
                self.grown += len;
                self.counters.lines.fetch_add(lines, Ordering::Relaxed);
                self.metrics.lines.add(lines);
            }
            Err(err) => {
                // A write cut short leaves part of a line, which the next
                // batch would be glued onto.
                let _ = self.file.set_len(self.size);
                self.failed(&err, lines);
            }
        }
        self.batch.clear();
    }

    /// Makes the file in hand the one the path names: a new file when the
    /// path names none or another (the file was deleted or moved away),
    /// and the sizes measured again when the file is shorter than written
    /// (it was cut short in place).
    fn follow(&mut self) {
        let path = &self.settings.path;
        let here = self.file.metadata().ok();
        let replaced = match std::fs::metadata(path) {
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            Ok(named) => {
                let held = here.as_ref().and_then(identity);
                held.is_some() && identity(&named) != held
            }
        };
        if replaced {
            match open(path).and_then(|(file, _)| {
                let size = mend(&file)?.0;
                Ok((file, size))
            }) {
                Ok((file, size)) => {
                    tracing::warn!(
                        path = %path.display(),
                        "the trace recording's file was deleted or moved away while \
                         recorded; recording goes on in a new file at its path"
                    );
                    self.file = file;
                    (self.size, self.grown) = (size, size);
                }
                // The lines go on to the file in hand; the next batch
                // tries again.
                Err(err) => self.failed(&err, 0),
            }
            return;
        }
        if let Some(len) = here.map(|m| m.len())
            && len < self.size
        {
            (self.size, self.grown) = (len, len);
        }
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let path = &self.settings.path;
        let keep = self.settings.keep;
        if keep == 0 {
            std::fs::remove_file(path)?;
        } else {
            for k in (1..keep).rev() {
                match std::fs::rename(rotated(path, k), rotated(path, k + 1)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            std::fs::rename(path, rotated(path, 1))?;
        }
        let (file, size) = open(path)?;
        self.file = file;
        (self.size, self.grown) = (size, size);
        self.counters.rotations.fetch_add(1, Ordering::Relaxed);
        self.metrics.rotations.add(1);
        Ok(())
    }

    /// Counts `lost` write errors, and logs the recording's first.
    fn failed(&mut self, err: &std::io::Error, lost: u64) {
        self.counters
            .write_errors
            .fetch_add(lost, Ordering::Relaxed);
        self.metrics.write_errors.add(lost);
        if !self.warned {
            self.warned = true;
            tracing::warn!(
                path = %self.settings.path.display(),
                error = %err,
                "cannot write the trace recording; lines are lost until writes succeed \
                 (counted in radixgate_record_trace_write_errors_total)"
            );
        }
    }
}

/// `FILE.k`.
pub(super) fn rotated(path: &Path, k: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{k}"));
    PathBuf::from(name)
}
