//! The `record_trace:` section: recording every routed request as one line
//! of a replayable trace (`record.rs`, `docs/record-and-tune.md`).

use super::{ConfigError, invalid};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Most rotated files a recording keeps.
pub const MAX_RECORD_KEEP: u32 = 1000;

/// Trace recording.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecordTraceConfig {
    /// Record from start-up to this file (`--record-trace FILE`), appending
    /// if it exists; none: no recording until one is started through the
    /// admin API (`POST /record_trace`).
    pub path: Option<PathBuf>,
    /// Rotate the file before it would grow past this many bytes (`FILE`
    /// becomes `FILE.1`, `FILE.1` becomes `FILE.2`, …); 0 = never. Default
    /// 256 MiB: about 300,000 requests of 8k-token prompts.
    pub max_bytes: u64,
    /// Rotated files kept (`FILE.1` … `FILE.<keep>`); 0 = a full file is
    /// deleted when it rotates. Default 5.
    pub keep: u32,
    /// The directory recordings started through the admin API are written
    /// in: a path posted there is taken relative to it, and one outside it
    /// is refused, so the admin API can create and rotate files only here.
    /// Default `.`, the router's working directory.
    pub admin_dir: PathBuf,
}

impl Default for RecordTraceConfig {
    fn default() -> Self {
        Self {
            path: None,
            max_bytes: 256 << 20,
            keep: 5,
            admin_dir: PathBuf::from("."),
        }
    }
}

impl RecordTraceConfig {
    /// Checks the section; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(path) = &self.path
            && (path.as_os_str().is_empty() || path.file_name().is_none())
        {
            return Err(invalid(
                "record_trace.path",
                format!("must name a file, got {path:?}"),
            ));
        }
        if self.keep > MAX_RECORD_KEEP {
            return Err(invalid(
                "record_trace.keep",
                format!("must be between 0 and {MAX_RECORD_KEEP}, got {}", self.keep),
            ));
        }
        if self.admin_dir.as_os_str().is_empty() {
            return Err(invalid(
                "record_trace.admin_dir",
                "must not be empty (`.` is the working directory)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_their_key() {
        let ok = RecordTraceConfig {
            path: Some("t.jsonl".into()),
            ..RecordTraceConfig::default()
        };
        assert!(ok.validate().is_ok());
        for (bad, key) in [
            (
                RecordTraceConfig {
                    path: Some("".into()),
                    ..ok.clone()
                },
                "record_trace.path",
            ),
            (
                RecordTraceConfig {
                    path: Some("/".into()),
                    ..ok.clone()
                },
                "record_trace.path",
            ),
            (
                RecordTraceConfig {
                    keep: MAX_RECORD_KEEP + 1,
                    ..ok.clone()
                },
                "record_trace.keep",
            ),
            (
                RecordTraceConfig {
                    admin_dir: "".into(),
                    ..ok.clone()
                },
                "record_trace.admin_dir",
            ),
        ] {
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
    }
}
