//! What an answer's body looked like as it passed, for estimating its output
//! tokens when it reports none: a trace line's length (`crate::record`), a
//! metered tenant's charge (`crate::tenants`).

/// Bytes of a whole JSON answer that are not its generated text (ids,
/// field names, usage): taken off before estimating its output tokens.
const ENVELOPE_BYTES: u64 = 256;

/// What a response body looked like as it passed, for estimates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// Whether it was an event stream.
    pub sse: bool,
    /// Bytes.
    pub bytes: u64,
    /// SSE `data:` fields seen (a stream's events).
    pub events: u64,
    /// Events with an empty `content` (a chat stream's opening role chunk,
    /// a closing chunk): no token.
    pub empty: u64,
    /// Whether its last event was `[DONE]` (not a token).
    pub done: bool,
}

impl Output {
    /// Counts one frame of the body.
    pub fn frame(&mut self, bytes: &[u8]) {
        self.bytes += bytes.len() as u64;
        if self.sse {
            self.events += count(bytes, b"data:");
            self.empty += count(bytes, br#""content":"""#) + count(bytes, br#""content": """#);
            if bytes.ends_with(b"[DONE]\n\n") || bytes.ends_with(b"[DONE]\r\n\r\n") {
                self.done = true;
            } else if !bytes.iter().all(u8::is_ascii_whitespace) {
                self.done = false;
            }
        }
    }

    /// Estimated output tokens, at `chars_per_token`: a stream's events
    /// that carry text (one token or more each), or a whole body's bytes
    /// beyond its envelope.
    pub fn tokens(&self, chars_per_token: f64) -> u64 {
        if self.sse {
            self.events
                .saturating_sub(u64::from(self.done))
                .saturating_sub(self.empty)
        } else {
            (self.bytes.saturating_sub(ENVELOPE_BYTES) as f64 / chars_per_token).ceil() as u64
        }
    }
}

/// Occurrences of `needle` in `haystack`.
fn count(haystack: &[u8], needle: &[u8]) -> u64 {
    memchr::memmem::find_iter(haystack, needle).count() as u64
}
