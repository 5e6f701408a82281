//! Token usage read from the tail of a response, without touching it.
//!
//! Tenants' token limits are charged with what a worker reports it used: the
//! OpenAI `usage` object (`total_tokens`, else `prompt_tokens +
//! completion_tokens`), or SGLang's `meta_info` for `/generate`. A whole JSON
//! body carries it near its end; a stream carries it in its last data event
//! when the client asked with `stream_options.include_usage`.
//!
//! [`UsageTail`] keeps only the last [`TAIL_BYTES`] bytes a body passed
//! through, so memory is bounded whatever the body's size, and the frames
//! themselves go to the client unchanged; the scan runs once, at the end.
//! A body whose usage does not fit in the tail, or that has none, reports
//! `None` (nothing is charged).

/// How much of a body's end is kept for the scan. A usage object is about
/// 200 bytes; SSE streams end with the usage event and `data: [DONE]`; whole
/// bodies put at most a few short fields after `usage`.
pub const TAIL_BYTES: usize = 8 * 1024;

/// The last [`TAIL_BYTES`] bytes of a body, in a ring: a small frame costs
/// its own length to keep, however full the tail is.
#[derive(Debug, Default)]
pub struct UsageTail {
    tail: std::collections::VecDeque<u8>,
}

impl UsageTail {
    /// An empty tail.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the next piece of the body, keeping only the end.
    pub fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= TAIL_BYTES {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - TAIL_BYTES..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(TAIL_BYTES);
        if overflow > 0 {
            self.tail.drain(..overflow);
        }
        self.tail.extend(bytes);
    }

    /// The tokens the body reports it used, if its tail says.
    pub fn tokens(&mut self) -> Option<u64> {
        tokens_in(self.tail.make_contiguous())
    }
}

/// The last usage report in `text`: the last `"usage"` object with counts,
/// else the last `"meta_info"` with prompt and completion counts.
pub fn tokens_in(text: &[u8]) -> Option<u64> {
    last_object_after(text, b"\"usage\"").or_else(|| last_object_after(text, b"\"meta_info\""))
}

/// Scans occurrences of `key` from the end for one followed by `:` and a
/// JSON object holding token counts.
fn last_object_after(text: &[u8], key: &[u8]) -> Option<u64> {
    let mut end = text.len();
    while let Some(at) = rfind(&text[..end], key) {
        if let Some(tokens) = object_at(&text[at + key.len()..]).and_then(counted) {
            return Some(tokens);
        }
        end = at;
    }
    None
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// The JSON object right after `: ` at the start of `rest`, if complete.
fn object_at(rest: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    if rest.first() != Some(&b'{') {
        return None;
    }
    let len = object_len(rest)?;
    serde_json::from_slice(&rest[..len]).ok()
}

/// Length of the balanced `{...}` at the start of `text`, strings skipped.
fn object_len(text: &[u8]) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, &b) in text.iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// `total_tokens`, else `prompt_tokens + completion_tokens`.
fn counted(object: serde_json::Map<String, serde_json::Value>) -> Option<u64> {
    let field = |name: &str| object.get(name).and_then(serde_json::Value::as_u64);
    field("total_tokens").or_else(|| {
        let (prompt, completion) = (field("prompt_tokens"), field("completion_tokens"));
        (prompt.is_some() || completion.is_some())
            .then(|| prompt.unwrap_or(0).saturating_add(completion.unwrap_or(0)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_bodies_and_streams() {
        let whole = br#"{"id":"x","choices":[{"text":"}\"{"}],"usage":{"prompt_tokens":7,"completion_tokens":4,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":3}},"system_fingerprint":null}"#;
        assert_eq!(tokens_in(whole), Some(11));
        let stream = b"data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n\
            data: {\"choices\":[],\"usage\": {\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n\
            data: [DONE]\n\n";
        assert_eq!(tokens_in(stream), Some(7));
        let generate = br#"{"text":"hi","meta_info":{"prompt_tokens":9,"completion_tokens":1,"cached_tokens":0}}"#;
        assert_eq!(tokens_in(generate), Some(10));
        for none in [
            &b""[..],
            b"data: {\"usage\":null}\n\ndata: [DONE]\n\n",
            b"{\"usage\":{\"total_tokens\":3",
            b"{\"usage\":{}}",
            b"\"usage\"",
            b"}}}\"usage\":{{{",
        ] {
            assert_eq!(tokens_in(none), None, "{}", String::from_utf8_lossy(none));
        }
    }

    #[test]
    fn the_tail_keeps_only_the_end() {
        let mut tail = UsageTail::new();
        tail.push(&vec![b' '; 3 * TAIL_BYTES]);
        tail.push(b"{\"usage\":{\"total_tokens\":");
        for _ in 0..TAIL_BYTES / 2 {
            tail.push(b" ");
        }
        tail.push(b"42}}");
        assert_eq!(tail.tokens(), Some(42));
        assert_eq!(tail.tail.len(), TAIL_BYTES);
        tail.push(&vec![b'x'; TAIL_BYTES]);
        assert_eq!(tail.tokens(), None, "usage pushed out of the tail");
    }
}
