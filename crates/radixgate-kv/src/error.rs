//! The crate's one error type.
//!
//! Every variant describes bad input from an engine (its publisher or its
//! replay socket): nothing here is the client's fault or ours, and retrying
//! the same bytes cannot help. The caller's remedy is the same for all of
//! them: drop the message, count it, and treat that worker's index as stale
//! until a replay or a resync repairs it.

/// A KV-event message that could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A published message is `[topic, sequence, payload]`.
    #[error("expected 3 frames [topic, sequence, payload], got {0}")]
    FrameCount(usize),
    /// A replay reply is `[sequence, payload]`, optionally after an empty
    /// delimiter frame.
    #[error("expected a replay reply [sequence, payload], got {0} frames")]
    ReplayFrameCount(usize),
    /// The sequence frame is 8 bytes (or 24 with a publisher stream id).
    #[error("sequence frame is {0} bytes, expected 8 (or 24 with a stream id)")]
    SequenceLength(usize),
    /// The payload is not one complete msgpack value.
    #[error("payload is not valid msgpack: {0}")]
    Msgpack(#[from] rmpv::decode::Error),
    /// Bytes were left after the payload's msgpack value.
    #[error("{0} bytes left after the payload's msgpack value")]
    TrailingBytes(usize),
    /// The payload holds more msgpack values than the decoder takes
    /// ([`crate::wire::MAX_PAYLOAD_VALUES`]).
    #[error("payload holds more than {limit} msgpack values")]
    TooManyValues {
        /// The limit.
        limit: usize,
    },
    /// The msgpack value does not have the shape of an event batch.
    #[error("{at}: expected {expected}")]
    Shape {
        /// Where in the payload (a field or event name).
        at: &'static str,
        /// What was expected there.
        expected: &'static str,
    },
}

impl WireError {
    pub(crate) fn shape(at: &'static str, expected: &'static str) -> Self {
        Self::Shape { at, expected }
    }
}
