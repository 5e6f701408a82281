//! Finding a Responses answer's id as its bytes pass, without holding them.
//!
//! A whole answer is one response object: its id is the top-level `"id"`.
//! A stream's events carry the response object under `"response"` (the
//! first, `response.created`, already has its id): the id is the `"id"`
//! of the object under a top-level `"response"` key of an event. The scan
//! is a small JSON state machine fed one piece at a time, wherever the
//! pieces are cut, that keeps only the state of the two outer levels and
//! the id's bytes: no piece is copied, and it stops at the id or after
//! [`SCAN_LIMIT`] bytes. SSE field names and the `[DONE]` marker between
//! events are outside any object and pass unread.

/// The most bytes scanned for an id: the id opens every response object,
/// and a stream's first event carries it; an answer that has shown none
/// by then is not looked at further.
pub(crate) const SCAN_LIMIT: usize = 1 << 20;

/// The longest id kept; a longer value is no engine's id.
const MAX_ID: usize = 256;

/// The keys the scan tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Id,
    Response,
    Other,
}

/// What the scan expects next at one of the two outer levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Key,
    Colon,
    Value,
    /// After a value: a `,` or the container's end.
    Next,
}

/// What the string being read is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reading {
    Key,
    Id,
    Skip,
}

/// The scan of one answer (see the module doc).
#[derive(Debug)]
pub(crate) struct IdScan {
    /// A stream's events (`response.id`) rather than a whole object (`id`).
    stream: bool,
    depth: u32,
    /// Whether the container at depth 1 and 2 is an object.
    object: [bool; 3],
    /// The last key read at depth 1 and 2.
    key: [Key; 3],
    expect: [Expect; 3],
    /// The object at depth 2 is the value of a depth-1 `"response"`.
    in_response: bool,
    in_string: bool,
    escaped: bool,
    reading: Reading,
    buf: Vec<u8>,
    /// The buffered string had an escape (no engine's id has one).
    unusual: bool,
    seen: usize,
    found: Option<String>,
    done: bool,
}

impl IdScan {
    /// A scan for a whole answer, or for a stream's events (`stream`).
    pub(crate) fn new(stream: bool) -> Self {
        Self {
            stream,
            depth: 0,
            object: [false; 3],
            key: [Key::Other; 3],
            expect: [Expect::Next; 3],
            in_response: false,
            in_string: false,
            escaped: false,
            reading: Reading::Skip,
            buf: Vec::new(),
            unusual: false,
            seen: 0,
            found: None,
            done: false,
        }
    }

    /// The id, once found.
    pub(crate) fn take(&mut self) -> Option<String> {
        self.found.take()
    }

    /// Feeds the next piece of the body; says whether the scan has ended.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> bool {
        if self.done {
            return true;
        }
        let room = SCAN_LIMIT - self.seen;
        let piece = &bytes[..bytes.len().min(room)];
        for &b in piece {
            self.byte(b);
            if self.done {
                return true;
            }
        }
        self.seen += piece.len();
        if self.seen >= SCAN_LIMIT {
            self.done = true;
        }
        self.done
    }

    /// The level whose keys the scan follows, if the current one is.
    fn level(&self) -> Option<usize> {
        (1..=2).contains(&self.depth).then_some(self.depth as usize)
    }

    fn byte(&mut self, b: u8) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
                self.unusual = true;
            } else if b == b'"' {
                self.in_string = false;
                self.string_end();
                return;
            }
            if self.reading != Reading::Skip && self.buf.len() <= MAX_ID {
                self.buf.push(b);
            }
            return;
        }
        match b {
            b'"' if self.depth > 0 => self.string_start(),
            b'{' | b'[' => self.open(b == b'{'),
            b'}' | b']' => self.close(),
            b':' => {
                if let Some(l) = self.level()
                    && self.expect[l] == Expect::Colon
                {
                    self.expect[l] = Expect::Value;
                }
            }
            b',' => {
                if let Some(l) = self.level() {
                    self.expect[l] = match self.object[l] {
                        true => Expect::Key,
                        false => Expect::Value,
                    };
                }
            }
            _ => {}
        }
    }

    fn string_start(&mut self) {
        self.in_string = true;
        self.unusual = false;
        self.buf.clear();
        self.reading = match self.level() {
            Some(l) if self.object[l] && self.expect[l] == Expect::Key => Reading::Key,
            Some(l) if self.expect[l] == Expect::Value && self.wants_id(l) => Reading::Id,
            _ => Reading::Skip,
        };
    }

    /// Whether the value at level `l` is the id looked for.
    fn wants_id(&self, l: usize) -> bool {
        self.key[l] == Key::Id
            && match self.stream {
                false => l == 1,
                true => l == 2 && self.in_response,
            }
    }

    fn string_end(&mut self) {
        let Some(l) = self.level() else {
            return;
        };
        match self.reading {
            Reading::Key => {
                self.key[l] = match &self.buf[..] {
                    b"id" if !self.unusual => Key::Id,
                    b"response" if !self.unusual => Key::Response,
                    _ => Key::Other,
                };
                self.expect[l] = Expect::Colon;
            }
            Reading::Id => {
                if !self.unusual && !self.buf.is_empty() && self.buf.len() <= MAX_ID {
                    self.found = String::from_utf8(std::mem::take(&mut self.buf)).ok();
                    self.done = self.found.is_some();
                }
                self.expect[l] = Expect::Next;
            }
            Reading::Skip => self.expect[l] = Expect::Next,
        }
        self.reading = Reading::Skip;
    }

    fn open(&mut self, object: bool) {
        if self.depth == 1 {
            self.in_response = self.key[1] == Key::Response && self.expect[1] == Expect::Value;
        }
        self.depth = self.depth.saturating_add(1);
        if let Some(l) = self.level() {
            self.object[l] = object;
            self.key[l] = Key::Other;
            self.expect[l] = match object {
                true => Expect::Key,
                false => Expect::Value,
            };
        }
    }

    fn close(&mut self) {
        self.depth = self.depth.saturating_sub(1);
        if let Some(l) = self.level() {
            self.expect[l] = Expect::Next;
        }
        // A whole answer's object ended without an id at its top.
        if self.depth == 0 && !self.stream {
            self.done = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id of `body` fed in pieces of `cut` bytes.
    fn scan(body: &[u8], stream: bool, cut: usize) -> Option<String> {
        let mut scan = IdScan::new(stream);
        for piece in body.chunks(cut) {
            if scan.feed(piece) {
                break;
            }
        }
        scan.take()
    }

    #[test]
    fn a_whole_answers_top_level_id_wherever_it_is_cut() {
        let body = br#"{"object":"response","output":[{"id":"msg_1","content":[{"id":"x"}]}],"meta":{"id":"no"},"id":"resp_42","usage":{}}"#;
        for cut in [1, 2, 3, 7, 1000] {
            assert_eq!(scan(body, false, cut).as_deref(), Some("resp_42"), "{cut}");
        }
        let first = br#" {"id" : "resp_1", "object": "response"}"#;
        assert_eq!(scan(first, false, 5).as_deref(), Some("resp_1"));
        // A string value that reads like a key, or holds quotes and braces.
        let tricky = br#"{"note":"\"id\":\"fake\" {","x":["id","y"],"id":"resp_2"}"#;
        assert_eq!(scan(tricky, false, 3).as_deref(), Some("resp_2"));
        for none in [
            &br#"{"object":"response","output":[]}"#[..],
            br#"{"id":5}"#,
            br#"{"id":"a\"b"}"#,
            br#"[{"id":"resp_3"}]"#,
            b"",
        ] {
            assert_eq!(
                scan(none, false, 4),
                None,
                "{}",
                String::from_utf8_lossy(none)
            );
        }
    }

    #[test]
    fn a_streams_response_id_from_its_events() {
        let stream = b"event: response.created\n\
            data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"object\":\"response\",\"output\":[{\"id\":\"no\"}],\"id\":\"resp_s\"}}\n\n\
            data: [DONE]\n\n";
        for cut in [1, 4, 9, 4096] {
            assert_eq!(scan(stream, true, cut).as_deref(), Some("resp_s"), "{cut}");
        }
        // Items' ids are not the response's; a later event still has it.
        let later = b"data: {\"type\":\"response.output_item.added\",\"item\":{\"id\":\"msg_1\"}}\n\n\
            data: {\"id\":\"top\",\"type\":\"response.in_progress\",\"response\":{\"id\":\"resp_t\"}}\n\n";
        assert_eq!(scan(later, true, 3).as_deref(), Some("resp_t"));
        // A whole answer's shape is not a stream's.
        assert_eq!(scan(br#"{"id":"resp_w"}"#, true, 3), None);
    }

    #[test]
    fn the_scan_gives_up_after_its_limit() {
        let filler = vec![b' '; SCAN_LIMIT];
        let mut scan = IdScan::new(false);
        assert!(!scan.feed(b"{"));
        assert!(scan.feed(&filler));
        assert!(scan.feed(br#""id":"late"}"#));
        assert_eq!(scan.take(), None);
    }
}
