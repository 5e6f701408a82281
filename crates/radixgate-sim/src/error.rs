//! The crate's one error type.
//!
//! Every fallible public function of `radixgate-sim` returns [`SimError`].
//! Variants say where the fault lies: a bad setting or input file supplied by
//! the operator (fix the command line), or the environment (sockets, runtime).
//! Request-level failures seen by the load tool are *not* errors of the tool:
//! they are counted in its report by kind (see `load::outcome`).

use std::path::PathBuf;

/// Errors of the simulator crate.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A setting is out of range or inconsistent with another (operator's
    /// fault; the message names the setting).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A trace file could not be read.
    #[error("cannot read trace file {path}")]
    TraceIo {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A trace line is not the expected JSON.
    #[error("trace file {path} line {line}: {reason}")]
    TraceFormat {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A target URL cannot be used.
    #[error("bad --url {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The runtime or an output stream failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}
