//! What happened to one request: timings, usage, the serving worker, or the
//! kind of failure.

use std::fmt;
use std::time::Duration;

use super::body::Usage;

/// Why a request failed, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// The TCP connection could not be made (refused, unreachable).
    Connect,
    /// No complete response within the per-request timeout.
    Timeout,
    /// A non-2xx status.
    Status(u16),
    /// The connection failed after it was made but before a response head.
    Transport,
    /// The body or stream ended early: a stream without `[DONE]`, or a body
    /// cut off by the peer.
    StreamCut,
    /// The stream carried an `error` object.
    StreamError,
    /// A body that is not the JSON expected.
    BadBody,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Connect => f.write_str("connect"),
            ErrorKind::Timeout => f.write_str("timeout"),
            ErrorKind::Status(s) => write!(f, "http_{s}"),
            ErrorKind::Transport => f.write_str("transport"),
            ErrorKind::StreamCut => f.write_str("stream_cut"),
            ErrorKind::StreamError => f.write_str("stream_error"),
            ErrorKind::BadBody => f.write_str("bad_body"),
        }
    }
}

/// The result of one request.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Index of the `--url` it was sent to.
    pub target: usize,
    /// The worker that served it (header, else body field), if named.
    pub worker: Option<String>,
    /// Time to the first non-empty content or reasoning chunk (streams
    /// only).
    pub ttft: Option<Duration>,
    /// Time to the end of the response.
    pub e2e: Duration,
    /// Reported token counts, if any.
    pub usage: Option<Usage>,
    /// The reply text (for multi-turn sessions).
    pub reply: String,
    /// The failure, if it failed.
    pub error: Option<ErrorKind>,
}
