//! An incremental parser for server-sent events, just enough for LLM
//! streams: events are separated by a blank line; the `data:` lines of an
//! event are joined by newlines; other fields and comments are ignored.
//! Bytes arrive in arbitrary pieces, so a partial event is kept until its
//! end arrives.

/// Accumulates bytes and yields complete events' data.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// Feeds bytes; returns the data of every event completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some((end, sep)) = find_boundary(&self.buf) {
            let event: Vec<u8> = self.buf.drain(..end + sep).take(end).collect();
            let text = String::from_utf8_lossy(&event);
            let mut data: Option<String> = None;
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix("data:") {
                    let rest = rest.strip_prefix(' ').unwrap_or(rest);
                    match &mut data {
                        Some(d) => {
                            d.push('\n');
                            d.push_str(rest);
                        }
                        None => data = Some(rest.to_owned()),
                    }
                }
            }
            if let Some(d) = data {
                out.push(d);
            }
        }
        out
    }

    /// Whether unparsed bytes (an incomplete event) remain.
    pub fn has_partial(&self) -> bool {
        self.buf.iter().any(|b| !b.is_ascii_whitespace())
    }
}

/// The index and length of the first blank-line boundary.
fn find_boundary(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' && buf[i + 1] == b'\n' {
            return Some((i, 2));
        }
        if buf[i..].starts_with(b"\r\n\r\n") {
            return Some((i, 4));
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_pieces() {
        let mut p = SseParser::default();
        assert!(p.feed(b"data: {\"a\"").is_empty());
        assert!(p.has_partial());
        assert_eq!(p.feed(b":1}\n\ndata: [DO"), vec!["{\"a\":1}"]);
        assert_eq!(p.feed(b"NE]\n\n"), vec!["[DONE]"]);
        assert!(!p.has_partial());
    }

    proptest::proptest! {
        /// However the bytes are split, the same events come out.
        #[test]
        fn splitting_does_not_matter(
            events in proptest::collection::vec("[a-z{}\":, ]{0,20}", 1..8),
            cuts in proptest::collection::vec(0usize..400, 0..10),
        ) {
            let mut stream = String::new();
            for e in &events {
                stream.push_str(&format!("data: {e}\n\n"));
            }
            let bytes = stream.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut p = SseParser::default();
            let mut got = Vec::new();
            let mut from = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                got.extend(p.feed(&bytes[from..c]));
                from = c;
            }
            proptest::prop_assert_eq!(got, events);
        }
    }

    #[test]
    fn crlf_comments_and_multiline_data() {
        let mut p = SseParser::default();
        let got = p.feed(b": keepalive\r\n\r\nevent: x\r\ndata:a\r\ndata: b\r\n\r\ndata: c\n\n");
        assert_eq!(got, vec!["a\nb", "c"]);
    }
}
