//! The engines' ZMQ KV-event wire format: frames, payloads, replay.
//!
//! Facts from vLLM's and SGLang's `ZmqEventPublisher` (both
//! `kv_events.py`, public sources):
//!
//! - The PUB socket sends `[topic, sequence, payload]`: the topic as UTF-8
//!   (empty by default), the sequence as 8 bytes big-endian counting from 0
//!   per publisher lifetime, then the msgpack payload ([`payload`]).
//! - A newer vLLM, when its optional snapshot endpoint is enabled, appends
//!   a 16-byte publisher identity to the sequence frame (24 bytes); a
//!   change of identity is a publisher restart. We read both lengths.
//! - The optional replay socket is a ROUTER. A client sends the first
//!   sequence it wants as 8 bytes big-endian (from a REQ socket, or a
//!   DEALER sending an empty delimiter frame first). The ROUTER answers
//!   with one message `[sequence, payload]` per buffered batch from that
//!   sequence on, then `[-1 as 8 bytes big-endian signed, empty]` as the
//!   end marker. A DEALER sees each reply after an empty delimiter frame;
//!   REQ strips it. There is no topic frame in replies.
//!
//! Everything here is pure: no sockets, no clocks.

mod payload;

pub use payload::{MAX_PAYLOAD_VALUES, count_values, decode_payload};

use crate::error::WireError;
use crate::event::EventBatch;

/// The sequence value that ends a replay (`-1` as a signed 64-bit
/// big-endian integer).
pub const REPLAY_END: u64 = u64::MAX;

/// The frames of one published message, not yet decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    /// The topic frame.
    pub topic: &'a [u8],
    /// The sequence number.
    pub seq: u64,
    /// The publisher identity sent after the sequence, when it sends one.
    pub stream_id: Option<[u8; 16]>,
    /// The msgpack payload.
    pub payload: &'a [u8],
}

impl Message<'_> {
    /// Decodes the payload.
    pub fn decode(&self) -> Result<EventBatch, WireError> {
        decode_payload(self.payload)
    }
}

/// Splits a published message `[topic, sequence, payload]`.
pub fn split_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<Message<'_>, WireError> {
    let [topic, seq, payload] = frames else {
        return Err(WireError::FrameCount(frames.len()));
    };
    let (seq, stream_id) = sequence(seq.as_ref())?;
    Ok(Message {
        topic: topic.as_ref(),
        seq,
        stream_id,
        payload: payload.as_ref(),
    })
}

/// Splits and decodes a published message: its sequence and its batch.
pub fn decode_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<(u64, EventBatch), WireError> {
    let message = split_message(frames)?;
    Ok((message.seq, message.decode()?))
}

fn sequence(frame: &[u8]) -> Result<(u64, Option<[u8; 16]>), WireError> {
    match frame.len() {
        8 | 24 => {
            let mut seq = [0u8; 8];
            seq.copy_from_slice(&frame[..8]);
            let stream_id = frame[8..].try_into().ok();
            Ok((u64::from_be_bytes(seq), stream_id))
        }
        n => Err(WireError::SequenceLength(n)),
    }
}

/// The body of a replay request for every buffered batch from `start_seq`
/// on. A DEALER sends an empty frame before it; a REQ socket adds that
/// itself.
pub fn replay_request(start_seq: u64) -> [u8; 8] {
    start_seq.to_be_bytes()
}

/// Whether a sequence frame is the replay end marker.
pub fn is_replay_end(seq_frame: &[u8]) -> bool {
    matches!(seq_frame.len(), 8 | 24) && seq_frame[..8] == REPLAY_END.to_be_bytes()
}

/// One message read from the replay socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayReply<'a> {
    /// A buffered batch.
    Batch {
        /// Its sequence number.
        seq: u64,
        /// Its msgpack payload.
        payload: &'a [u8],
    },
    /// The end of this replay.
    End,
}

/// Splits a replay reply: `[sequence, payload]`, after an empty delimiter
/// frame when read from a DEALER.
pub fn split_replay_reply<F: AsRef<[u8]>>(frames: &[F]) -> Result<ReplayReply<'_>, WireError> {
    let frames = match frames {
        [delimiter, rest @ ..] if delimiter.as_ref().is_empty() && rest.len() == 2 => rest,
        _ => frames,
    };
    let [seq, payload] = frames else {
        return Err(WireError::ReplayFrameCount(frames.len()));
    };
    let seq = seq.as_ref();
    if is_replay_end(seq) {
        return Ok(ReplayReply::End);
    }
    let (seq, _) = sequence(seq)?;
    Ok(ReplayReply::Batch {
        seq,
        payload: payload.as_ref(),
    })
}
