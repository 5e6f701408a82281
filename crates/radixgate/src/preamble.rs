//! Finding a stream's first token behind its preamble.
//!
//! A chat, completions or `/generate` stream's first event is its first
//! token: servers send it once the prompt is prefilled. The Responses API
//! and the Anthropic Messages API open with events that say nothing of the
//! prefill — `response.created` and `response.in_progress`, which vLLM and
//! OpenAI send before prefilling, and `message_start` and `ping`, which
//! Anthropic sends at once. Timing the first token (the TTFT histogram, and
//! the wait the cost model learns from) by the first byte of such a stream
//! would time nothing, so for those APIs a [`Preamble`] reads the stream's
//! events until one that is not a preamble event begins.
//!
//! An event's type is its `event:` field, or else the `type` field of its
//! data. The scan reads line by line (lines end with `\n`, `\r\n` or a
//! lone `\r`, as SSE allows), across frames, and keeps at most
//! [`LINE_LIMIT`] bytes of a line; a data line it cannot read (longer than
//! that, or not JSON) counts as more preamble, because taking a late event
//! for the first token costs at most one event's delay, while taking the
//! preamble for it would time the prefill as instant. Once the first token
//! is found the scan is dropped: the rest of the stream is not looked at.
//!
//! Any API's stream may also open with SSE comments (`: keep-alive`), which
//! some servers send while a prompt waits for its prefill: a stream whose
//! first bytes are a comment is scanned too ([`Preamble::behind_comments`]),
//! with every event, of any type, its first token.
//!
//! An error event (`event: error`, data of type `error`, or an untyped
//! object with an `error`) in the first token's place is no first token:
//! a worker that refuses a stream under a 200 (SGLang streams a refused
//! request as `data: {"error": ...}`) sends it at once, before any
//! prefill. It still ends the scan, and [`Preamble::found_error`] says
//! so; [`opens_with_error`] tells the same of a stream's first bytes.

use crate::inspect::Api;
use serde::Deserialize;

/// Event types that come before the prompt is prefilled.
const PREAMBLE_EVENTS: [&str; 5] = [
    "response.created",
    "response.in_progress",
    "response.queued",
    "message_start",
    "ping",
];

/// The most bytes of one line kept for reading its event type.
pub const LINE_LIMIT: usize = 64 * 1024;

/// The scan of a stream's opening events; see the module doc.
#[derive(Debug, Default)]
pub struct Preamble {
    /// The current line, up to [`LINE_LIMIT`] bytes.
    line: Vec<u8>,
    /// Whether the current line was longer than the limit.
    overflow: bool,
    /// The current event was named by an `event:` line (as preamble: a
    /// named token event ends the scan at once).
    named: bool,
    /// The last line ended with a `\r` at the end of a frame: a `\n`
    /// first in the next is the same line end.
    cr: bool,
    /// Only comments are preamble: the first event is the first token.
    comments_only: bool,
    /// The event that ended the scan is an error event.
    error: bool,
}

impl Preamble {
    /// A scan for `api`'s streams, or `None` where the first event is the
    /// first token.
    pub fn for_api(api: Api) -> Option<Self> {
        matches!(api, Api::Responses | Api::Messages).then(Self::default)
    }

    /// The scan for a stream whose first event is its first token, but
    /// whose first bytes are a comment ([`opens_with_comment`]).
    pub fn behind_comments() -> Self {
        Self {
            comments_only: true,
            ..Self::default()
        }
    }

    /// Reads the stream's next bytes; true once an event that is not
    /// preamble has begun in them (the first token).
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        let mut rest = bytes;
        if std::mem::take(&mut self.cr) {
            rest = rest.strip_prefix(b"\n").unwrap_or(rest);
        }
        // SSE's line ends: `\n`, `\r\n` or a lone `\r`.
        while let Some(end) = memchr::memchr2(b'\n', b'\r', rest) {
            self.keep(&rest[..end]);
            let cr = rest[end] == b'\r';
            rest = &rest[end + 1..];
            if cr {
                match rest.strip_prefix(b"\n") {
                    Some(after) => rest = after,
                    None => self.cr = rest.is_empty(),
                }
            }
            if self.line_ends() {
                return true;
            }
        }
        self.keep(rest);
        false
    }

    /// Whether the event that ended the scan (the first that is not
    /// preamble) is an error event rather than a token.
    pub fn found_error(&self) -> bool {
        self.error
    }

    fn keep(&mut self, piece: &[u8]) {
        let room = LINE_LIMIT - self.line.len();
        if piece.len() > room {
            self.overflow = true;
        }
        self.line.extend_from_slice(&piece[..piece.len().min(room)]);
    }

    /// Reads the line just completed; true if it begins a token event.
    fn line_ends(&mut self) -> bool {
        let mut line = std::mem::take(&mut self.line);
        let overflow = std::mem::take(&mut self.overflow);
        let token = if line.is_empty() {
            // The event ended.
            self.named = false;
            false
        } else if let Some(name) = field(&line, b"event") {
            self.named = true;
            let name = String::from_utf8_lossy(name);
            self.error = is_error(&name);
            self.comments_only || !is_preamble(&name)
        } else if let Some(data) = field(&line, b"data") {
            let token = !self.named && (self.comments_only || (!overflow && data_is_token(data)));
            self.error = token && !overflow && data_is_error(data);
            token
        } else {
            // A comment (`:`), an `id:` or `retry:` line.
            false
        };
        // Reuse the buffer for the next line.
        line.clear();
        self.line = line;
        token
    }
}

/// Whether a stream's first bytes `first` are an SSE comment (a line that
/// begins with `:`), after any blank lines.
pub fn opens_with_comment(first: &[u8]) -> bool {
    first.iter().find(|&&b| b != b'\n' && b != b'\r') == Some(&b':')
}

fn is_preamble(kind: &str) -> bool {
    PREAMBLE_EVENTS.contains(&kind.trim())
}

fn is_error(kind: &str) -> bool {
    kind.trim() == "error"
}

/// Whether a stream's first bytes `first` open with an error event (see
/// the module doc) after any blank lines: its first event is no token.
/// Read from these bytes alone; an event they do not hold whole enough to
/// tell is taken for a token.
pub fn opens_with_error(first: &[u8]) -> bool {
    // Every streamed answer's first bytes come here: a token's (no
    // `error` in them, as a rule) are passed over without a line copied
    // or a JSON parsed.
    if memchr::memmem::find(first, b"error").is_none() {
        return false;
    }
    let mut scan = Preamble::behind_comments();
    scan.feed(first) && scan.found_error()
}

/// The error event a stream opens with, as [`opening_error`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpeningError {
    /// The HTTP status its data gives (`error.code`, or `code`, as a
    /// number or a string of digits; an Anthropic error's `error.type`),
    /// if any.
    pub code: Option<u16>,
    /// Its `error.message` (or `message`), if any.
    pub message: Option<String>,
}

impl OpeningError {
    /// The status the error stands for: its code when that is an error
    /// status, else 500 (an error that names none is the server's, as
    /// OpenAI's own `server_error` events are).
    pub fn status(&self) -> http::StatusCode {
        self.code
            .and_then(|c| http::StatusCode::from_u16(c).ok())
            .filter(|s| s.is_client_error() || s.is_server_error())
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// The error event `first` (a stream's first bytes) opens with, if it
/// opens with one ([`opens_with_error`]): its code and message, read from
/// its first data line where `first` holds it whole. vLLM and SGLang put a
/// refusal of the request there as `{"error": {..., "code": 400}}` and an
/// engine's failure as code 500.
pub fn opening_error(first: &[u8]) -> Option<OpeningError> {
    if !opens_with_error(first) {
        return None;
    }
    #[derive(Deserialize, Default)]
    struct Fields {
        #[serde(default)]
        code: Option<serde_json::Value>,
        #[serde(default)]
        message: Option<String>,
        #[serde(rename = "type", default)]
        kind: Option<String>,
    }
    #[derive(Deserialize)]
    struct Data {
        #[serde(default)]
        error: Option<serde_json::Value>,
        #[serde(flatten)]
        top: Fields,
    }
    let data = first
        .split(|&b| b == b'\n' || b == b'\r')
        .find_map(|line| field(line, b"data"));
    let Some(Ok(data)) = data.map(serde_json::from_slice::<Data>) else {
        return Some(OpeningError {
            code: None,
            message: None,
        });
    };
    let inner: Fields = match data.error {
        Some(serde_json::Value::Object(map)) => {
            serde_json::from_value(serde_json::Value::Object(map)).unwrap_or_default()
        }
        Some(serde_json::Value::String(message)) => Fields {
            message: Some(message),
            ..Fields::default()
        },
        _ => Fields::default(),
    };
    let number = |v: &serde_json::Value| match v {
        serde_json::Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    let code = (inner.code.as_ref().and_then(number))
        .or_else(|| data.top.code.as_ref().and_then(number))
        .or_else(|| inner.kind.as_deref().and_then(anthropic_status));
    Some(OpeningError {
        code,
        message: inner.message.or(data.top.message),
    })
}

/// The error event a successful stream (`sse`, a 2xx `status`) opens
/// with, read from its first bytes `first` ([`opening_error`]); `None` for
/// any other answer. The co-located loop and a disaggregated pair's decode
/// both ask it.
pub fn stream_opening_error(
    sse: bool,
    status: http::StatusCode,
    first: Option<&[u8]>,
) -> Option<OpeningError> {
    (sse && status.is_success())
        .then(|| first.and_then(opening_error))
        .flatten()
}

/// The status an Anthropic error type stands for.
fn anthropic_status(kind: &str) -> Option<u16> {
    Some(match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "api_error" => 500,
        "overloaded_error" => 529,
        _ => return None,
    })
}

/// Whether an event's data is an error: of type `error`, or an object
/// with no type and a non-null `error`.
fn data_is_error(data: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", default, borrow)]
        kind: Option<std::borrow::Cow<'a, str>>,
        #[serde(default)]
        error: Option<serde::de::IgnoredAny>,
    }
    // A token's data (no `error` in it, as a rule) is not parsed.
    if memchr::memmem::find(data, b"error").is_none() {
        return false;
    }
    match serde_json::from_slice::<Typed<'_>>(data) {
        Ok(Typed {
            kind: Some(kind), ..
        }) => is_error(&kind),
        Ok(Typed { kind: None, error }) => error.is_some(),
        Err(_) => false,
    }
}

/// The value of an SSE field line `name: value` (one optional space).
fn field<'l>(line: &'l [u8], name: &[u8]) -> Option<&'l [u8]> {
    let value = line.strip_prefix(name)?.strip_prefix(b":")?;
    Some(value.strip_prefix(b" ").unwrap_or(value))
}

/// Whether an unnamed event's data names a type that is not preamble. Data
/// that is not a JSON object counts as preamble (see the module doc); an
/// object without a type (an error) is not.
fn data_is_token(data: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Typed {
        #[serde(rename = "type", default)]
        kind: Option<String>,
    }
    match serde_json::from_slice::<Typed>(data) {
        Ok(Typed { kind: Some(kind) }) => !is_preamble(&kind),
        Ok(Typed { kind: None }) => true,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `stream` in pieces of `size` bytes; the index of the piece in
    /// which the first token was found.
    fn found_in(stream: &str, size: usize) -> Option<usize> {
        let mut scan = Preamble::default();
        stream
            .as_bytes()
            .chunks(size)
            .position(|piece| scan.feed(piece))
    }

    /// Where the first token event starts, by the same rule read whole.
    fn token_at(stream: &str, size: usize) -> Option<usize> {
        found_in(stream, size).map(|i| i * size)
    }

    const RESPONSES: &str = "event: response.created\n\
        data: {\"response\":{\"output\":[],\"tools\":[{\"type\":\"function\"}]},\"type\":\"response.created\"}\n\n\
        event: response.in_progress\n\
        data: {\"type\":\"response.in_progress\"}\n\n\
        event: response.output_item.added\n\
        data: {\"type\":\"response.output_item.added\"}\n\n";

    #[test]
    fn an_opening_error_gives_its_code_and_message() {
        let read = |s: &str| opening_error(s.as_bytes());
        let vllm = "data: {\"error\":{\"object\":\"error\",\"message\":\"too long\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}}\n\n";
        let e = read(vllm).unwrap();
        assert_eq!(
            (e.code, e.message.as_deref()),
            (Some(400), Some("too long"))
        );
        assert_eq!(e.status(), 400);
        let e =
            read(": ping\n\ndata: {\"error\":{\"message\":\"engine died\",\"code\":\"500\"}}\n\n")
                .unwrap();
        assert_eq!((e.code, e.status().as_u16()), (Some(500), 500));
        // No code: the server's error.
        let e = read(
            "data: {\"error\":{\"message\":\"x\",\"type\":\"server_error\",\"code\":null}}\n\n",
        )
        .unwrap();
        assert_eq!((e.code, e.status().as_u16()), (None, 500));
        let e = read("data: {\"error\":\"plain words\"}\n\n").unwrap();
        assert_eq!(e.message.as_deref(), Some("plain words"));
        // A code that is no error status stands for a server error too.
        assert_eq!(
            read("data: {\"error\":{\"code\":200}}\n\n")
                .unwrap()
                .status(),
            500
        );
        let anthropic = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        assert_eq!(read(anthropic).unwrap().code, Some(529));
        // An event whose data these bytes do not hold: no code.
        assert_eq!(read("event: error\n").unwrap().code, None);
        assert_eq!(read("data: {\"choices\":[]}\n\n"), None);
    }

    #[test]
    fn named_events_after_the_preamble() {
        let start = RESPONSES.find("event: response.output_item").unwrap();
        let end = start + "event: response.output_item.added\n".len();
        for size in [1, 2, 7, 64, RESPONSES.len()] {
            let at = token_at(RESPONSES, size).expect("found");
            assert!(at < end && at + size > start, "size {size}: {at}");
        }
        assert_eq!(found_in(&RESPONSES[..start], 5), None);
    }

    #[test]
    fn behind_comments_any_event_is_the_first_token() {
        let feed = |stream: &str, size: usize| {
            let mut scan = Preamble::behind_comments();
            stream
                .as_bytes()
                .chunks(size)
                .position(|piece| scan.feed(piece))
        };
        for size in [1, 3, 64] {
            assert_eq!(feed(": keep-alive\n\n:\r\n\r\n", size), None);
            assert!(feed(": keep-alive\n\ndata: [not json\n\n", size).is_some());
            assert!(feed(": x\n\nevent: ping\n", size).is_some());
        }
        assert!(opens_with_comment(b"\r\n: x\n\n"));
        assert!(!opens_with_comment(b"data: {}\n\n"));
        assert!(!opens_with_comment(b"\n\n"));
    }

    #[test]
    fn unnamed_events_are_read_by_their_type() {
        let stream = "data: {\"type\":\"message_start\",\"message\":{\"content\":[{\"type\":\"text\"}]}}\r\n\r\n\
            : keep-alive\n\n\
            data: {\"type\":\"ping\"}\n\n\
            data: {\"type\":\"content_block_start\"}\n\n";
        let start = stream
            .find("data: {\"type\":\"content_block_start")
            .unwrap();
        assert_eq!(found_in(&stream[..start], 3), None);
        assert!(found_in(stream, 3).is_some());
        // Data that cannot be read is more preamble; an object without a
        // type is not.
        assert_eq!(found_in("data: [not json\n\n", 4), None);
        assert!(found_in("data: {\"error\":{\"message\":\"x\"}}\n\n", 4).is_some());
        // A named preamble event's data is not read again.
        assert_eq!(
            found_in("event: ping\ndata: {\"type\":\"other\"}\n\n", 4),
            None
        );
    }

    /// SSE's three line ends, `\n`, `\r\n` and a lone `\r`, cut
    /// anywhere: a `\r\n` split over two frames is one line end, not a
    /// blank line that would end a named event early.
    #[test]
    fn every_line_end_is_read() {
        let named = "event: ping\ndata: {\"type\":\"other\"}\n\n";
        for eol in ["\n", "\r\n", "\r"] {
            let preamble = RESPONSES[..RESPONSES.find("event: response.output_item").unwrap()]
                .replace('\n', eol);
            let stream = RESPONSES.replace('\n', eol);
            let named = named.replace('\n', eol);
            for size in [1, 2, 3, 7, stream.len()] {
                assert_eq!(found_in(&preamble, size), None, "{eol:?} size {size}");
                assert_eq!(found_in(&named, size), None, "{eol:?} size {size}");
                assert!(found_in(&stream, size).is_some(), "{eol:?} size {size}");
            }
        }
    }

    #[test]
    fn long_lines_are_cut_not_kept() {
        let big = format!(
            "data: {{\"instructions\":\"{}\",\"type\":\"response.output_text.delta\"}}\n\n",
            "x".repeat(2 * LINE_LIMIT)
        );
        let mut scan = Preamble::default();
        for piece in big.as_bytes().chunks(1000) {
            assert!(!scan.feed(piece), "unreadable: more preamble");
            assert!(scan.line.len() <= LINE_LIMIT);
        }
        assert!(scan.feed(b"event: response.output_text.delta\n"));
    }

    /// An error event where the first token belongs ends the scan and
    /// says so; an error inside a preamble event's data, or a null one,
    /// is no error event.
    #[test]
    fn an_error_event_is_no_first_token() {
        let ends_in_error = |stream: &str, size: usize| {
            let mut scan = Preamble::default();
            let found = stream.as_bytes().chunks(size).any(|p| scan.feed(p));
            found.then(|| scan.found_error())
        };
        let start = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n";
        for size in [1, 5, 4096] {
            for (stream, error) in [
                (format!("{start}event: error\ndata: {{}}\n\n"), true),
                (format!("{start}data: {{\"type\":\"error\"}}\n\n"), true),
                (
                    format!("{start}data: {{\"error\":{{\"message\":\"x\"}}}}\n\n"),
                    true,
                ),
                (
                    format!("{start}data: {{\"error\":null,\"x\":1}}\n\n"),
                    false,
                ),
                (format!("{start}event: content_block_start\n"), false),
                (RESPONSES.to_owned(), false),
            ] {
                assert_eq!(
                    ends_in_error(&stream, size),
                    Some(error),
                    "{stream:?} {size}"
                );
            }
        }
        assert!(opens_with_error(b"data: {\"error\":{\"code\":400}}\n\n"));
        assert!(opens_with_error(b"\r\n: ping\r\n\r\nevent: error\r\n"));
        assert!(!opens_with_error(b"data: {\"choices\":[]}\n\n"));
        assert!(!opens_with_error(b"data: {\"error\":{\"code\""));
        assert!(!opens_with_error(b"event: message_start\ndata: {}\n\n"));
        assert!(!opens_with_error(b"data: [DONE]\n\n"));
    }

    #[test]
    fn only_two_apis_have_a_preamble() {
        assert!(Preamble::for_api(Api::Responses).is_some());
        assert!(Preamble::for_api(Api::Messages).is_some());
        for api in [
            Api::ChatCompletions,
            Api::Completions,
            Api::Generate,
            Api::Embeddings,
        ] {
            assert!(Preamble::for_api(api).is_none(), "{api:?}");
        }
    }
}
