//! The usage of a metered tenant's OpenAI stream, whether its client asked
//! for it or not.
//!
//! A chat or text completion stream reports its tokens only in a last event
//! the client asks for (`stream_options.include_usage`). A tenant with a
//! token limit could otherwise stream without it and never be charged. So
//! for such a tenant the gateway asks in the client's stead
//! ([`ask_for_usage`]): the body sent to the worker gets `include_usage:
//! true` (the one edit; every other byte as the client wrote it), and the
//! usage event the client did not ask for is taken out of the answer on its
//! way back ([`UsageEventFilter`]), after the tail that is charged from has
//! seen it. A client that asked gets its stream unchanged.

use crate::body::BodyBudget;
use crate::error::GatewayError;
use crate::inspect::StreamOptions;
use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;
use std::ops::Range;

/// What `stream_options: null` becomes.
const ASKED: &str = r#"{"include_usage":true}"#;

/// A body to send, edited to ask for usage where it needed that, and
/// whether the usage event is then taken out of the answer.
pub(crate) struct Asked {
    /// The body to send.
    pub(crate) body: Bytes,
    /// The client did not ask for the usage event: take it out.
    pub(crate) strip: bool,
}

/// The body with `stream_options.include_usage: true`, or as it is when it
/// needs no edit (the client's last `include_usage` reads as true to a
/// Python worker: `true`, `1`, `"yes"`...) or cannot have one (a
/// `stream_options` that is neither an object nor `null`: the worker
/// refuses it anyway). Only that value changes: `null` options become
/// `{"include_usage":true}`, each `include_usage` that does not read as
/// true (`false`, `0`, `"no"`, `null`...) becomes `true`, an options object
/// without it gets it first, and a body without options gets them first;
/// every other byte is passed as written. The usage event is the client's
/// to see only where its options object left `include_usage` to the server
/// (vLLM's default is to send it). The new body's bytes are taken from
/// `budget` like the one read, in its place: `body` (the request path's
/// only copy) is dropped first. Both are in memory while the edit is made,
/// as with any edit, but the budget need not hold both, or a body over
/// half the budget could never be sent.
pub(crate) fn ask_for_usage(
    body: Bytes,
    options: &StreamOptions,
    budget: &BodyBudget,
) -> Result<Asked, GatewayError> {
    let unedited = |body| Ok(Asked { body, strip: false });
    // An object's first key goes right after its brace, with a comma when
    // others follow.
    let first_key = |open: usize, field: &'static str, and_comma: &'static str| {
        let empty = body[open + 1..].trim_ascii_start().first() == Some(&b'}');
        (open + 1..open + 1, if empty { field } else { and_comma })
    };
    let (edits, strip): (Vec<(Range<usize>, &str)>, bool) = match options {
        StreamOptions::NotApplicable | StreamOptions::Other => return unedited(body),
        StreamOptions::Object { asked: true, .. } => return unedited(body),
        StreamOptions::Absent => {
            // The body was read as an object: its brace is there, after
            // white space.
            let Some(open) = body.iter().position(|&b| b == b'{') else {
                return unedited(body);
            };
            (vec![first_key(open, FIELD, FIELD_AND_COMMA)], true)
        }
        StreamOptions::Null { at } => (vec![(at.clone(), ASKED)], true),
        StreamOptions::Object {
            unset: true, at, ..
        } => {
            let edit = first_key(at.start, INCLUDE, INCLUDE_AND_COMMA);
            (vec![edit], false)
        }
        StreamOptions::Object { declined, .. } => (
            declined.iter().map(|at| (at.clone(), "true")).collect(),
            true,
        ),
    };
    let mut edited = Vec::with_capacity(body.len() + FIELD_AND_COMMA.len());
    let mut from = 0;
    for (at, value) in edits {
        edited.extend_from_slice(&body[from..at.start]);
        edited.extend_from_slice(value.as_bytes());
        from = at.end;
    }
    edited.extend_from_slice(&body[from..]);
    drop(body);
    let body = crate::body::budgeted(edited, budget)?;
    Ok(Asked { body, strip })
}

/// The field added to a body without `stream_options`.
const FIELD: &str = r#""stream_options":{"include_usage":true}"#;
const FIELD_AND_COMMA: &str = r#""stream_options":{"include_usage":true},"#;
/// The key added to an options object without one.
const INCLUDE: &str = r#""include_usage":true"#;
const INCLUDE_AND_COMMA: &str = r#""include_usage":true,"#;

/// The longest event the filter holds back while it is read: far above a
/// usage event (a few hundred bytes). A longer one (an echoed prompt, say)
/// is passed on as it comes, to its end, and the events after it are read
/// as before.
const MAX_EVENT: usize = 64 * 1024;

/// Takes the usage event (`"choices": []` with a `usage` object) out of an
/// OpenAI event stream, frame by frame. Everything else passes in order;
/// an event's bytes are held until its blank line, so that a usage event
/// split over frames is taken out whole. Line ends are SSE's: `\n`, `\r\n`
/// or `\r`.
#[derive(Debug, Default)]
pub(crate) struct UsageEventFilter {
    /// The event being read, not yet passed on.
    event: Vec<u8>,
    /// The line being read is empty so far.
    line_empty: bool,
    /// The last byte was a `\r` that ended a line: a `\n` next is the same
    /// line end.
    cr: bool,
    /// That `\r` ended an empty line, so the event ends with it (and with
    /// the `\n` after it, if one comes).
    ending: bool,
    /// The event being read is over [`MAX_EVENT`]: its bytes pass as they
    /// come, none held.
    passing: bool,
}

impl UsageEventFilter {
    /// A filter at the start of a stream.
    pub(crate) fn new() -> Self {
        Self {
            line_empty: true,
            ..Self::default()
        }
    }

    /// The bytes of `frame` that can go on now, the usage event left out.
    pub(crate) fn push(&mut self, frame: &Bytes) -> Bytes {
        let mut out = Vec::with_capacity(frame.len() + self.event.len());
        for &b in frame.iter() {
            if self.cr {
                self.cr = false;
                if b == b'\n' {
                    self.keep(b, &mut out);
                    if self.ending {
                        self.end_event(&mut out);
                    }
                    continue;
                }
                if self.ending {
                    self.end_event(&mut out);
                }
            }
            self.keep(b, &mut out);
            match b {
                b'\r' => {
                    self.ending = self.line_empty;
                    self.cr = true;
                    self.line_empty = true;
                }
                b'\n' if self.line_empty => self.end_event(&mut out),
                b'\n' => self.line_empty = true,
                _ => self.line_empty = false,
            }
        }
        Bytes::from(out)
    }

    /// Holds `b` with its event, or passes it on once the event is too
    /// long to be the usage event.
    fn keep(&mut self, b: u8, out: &mut Vec<u8>) {
        if self.passing {
            out.push(b);
            return;
        }
        self.event.push(b);
        if self.event.len() > MAX_EVENT {
            out.append(&mut self.event);
            self.passing = true;
        }
    }

    /// What is left at the stream's end: an event that ended with a lone
    /// `\r` (unless it is the usage event), or one never ended, as it is.
    pub(crate) fn finish(&mut self) -> Bytes {
        let mut out = Vec::new();
        if self.cr && self.ending {
            self.end_event(&mut out);
        }
        out.append(&mut self.event);
        Bytes::from(out)
    }

    /// Whether bytes are held back.
    pub(crate) fn holds(&self) -> bool {
        !self.event.is_empty()
    }

    fn end_event(&mut self, out: &mut Vec<u8>) {
        if !self.passing && !is_usage_event(&self.event) {
            out.extend_from_slice(&self.event);
        }
        self.event.clear();
        self.passing = false;
        self.ending = false;
        self.line_empty = true;
    }
}

/// Whether `event` is the usage event: its data, one JSON object, has an
/// empty `choices` list and a `usage` that is not `null`.
fn is_usage_event(event: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Chunk {
        choices: Vec<IgnoredAny>,
        #[serde(default)]
        usage: Option<IgnoredAny>,
    }
    if memchr::memmem::find(event, b"\"usage\"").is_none() {
        return false;
    }
    let mut data = Vec::new();
    for line in event.split(|&b| b == b'\n' || b == b'\r') {
        if let Some(value) = line.strip_prefix(b"data:") {
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
        }
    }
    serde_json::from_slice::<Chunk>(&data)
        .is_ok_and(|chunk| chunk.choices.is_empty() && chunk.usage.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    const USAGE: &str = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}";

    /// The stream a chat worker sends when asked for usage, with line ends
    /// `eol`.
    fn stream(eol: &str) -> String {
        [
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}",
            "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":null}",
            USAGE,
            "data: [DONE]",
        ]
        .iter()
        .map(|e| format!("{e}{eol}{eol}"))
        .collect()
    }

    fn filtered(frames: &[&[u8]]) -> String {
        let mut filter = UsageEventFilter::new();
        let mut out = Vec::new();
        for frame in frames {
            out.extend_from_slice(&filter.push(&Bytes::copy_from_slice(frame)));
        }
        out.extend_from_slice(&filter.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_usage_event_is_taken_out_however_the_stream_is_cut() {
        for eol in ["\n", "\r\n", "\r"] {
            let whole = stream(eol);
            let want = whole.replace(&format!("{USAGE}{eol}{eol}"), "");
            assert_ne!(want, whole);
            assert_eq!(filtered(&[whole.as_bytes()]), want, "{eol:?} in one frame");
            // Every cut into two frames, and one byte a frame.
            for cut in 0..=whole.len() {
                let (a, b) = whole.as_bytes().split_at(cut);
                assert_eq!(filtered(&[a, b]), want, "{eol:?} cut at {cut}");
            }
            let bytes: Vec<&[u8]> = whole.as_bytes().chunks(1).collect();
            assert_eq!(filtered(&bytes), want, "{eol:?} a byte a frame");
        }
    }

    #[test]
    fn other_events_pass_unchanged() {
        // Usage in every chunk (vLLM's continuous usage), a usage of null,
        // comments, an event without data, a stream that ends mid-event.
        let stream = concat!(
            ": keep-alive\n\n",
            "data: {\"choices\":[{\"text\":\"x\"}],\"usage\":{\"total_tokens\":3}}\n\n",
            "data: {\"choices\":[],\"usage\":null}\n\n",
            "event: ping\n\n",
            "data: {\"choices\":[],\"usage\"",
        );
        assert_eq!(filtered(&[stream.as_bytes()]), stream);
    }

    #[test]
    fn an_overlong_event_passes_as_it_comes_and_the_usage_event_after_it_still_goes() {
        let long = format!("data: {{\"x\":\"{}\"}}\n\n", "y".repeat(3 * MAX_EVENT));
        let whole = format!("{long}{USAGE}\n\ndata: [DONE]\n\n");
        let mut filter = UsageEventFilter::new();
        let mut out = Vec::new();
        for frame in whole.as_bytes().chunks(MAX_EVENT / 2) {
            let passed = filter.push(&Bytes::copy_from_slice(frame));
            out.extend_from_slice(&passed);
            // Nothing past MAX_EVENT is held back.
            assert!(filter.event.len() <= MAX_EVENT);
        }
        out.extend_from_slice(&filter.finish());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{long}data: [DONE]\n\n")
        );
    }

    fn body(options: &StreamOptions, text: &str) -> (String, bool) {
        let budget = BodyBudget::new(1 << 20);
        let asked = ask_for_usage(Bytes::copy_from_slice(text.as_bytes()), options, &budget);
        let asked = asked.unwrap();
        (String::from_utf8(asked.body.to_vec()).unwrap(), asked.strip)
    }

    fn options(text: &str) -> StreamOptions {
        crate::inspect::inspect(crate::inspect::Api::ChatCompletions, text.as_bytes())
            .unwrap()
            .stream_options
    }

    #[test]
    fn the_body_asks_for_usage_with_every_other_byte_as_written() {
        // (sent, sent on, whether the usage event is taken out)
        let cases = [
            (
                r#" {"model":"m", "messages":[],"stream":true}"#,
                r#" {"stream_options":{"include_usage":true},"model":"m", "messages":[],"stream":true}"#,
                true,
            ),
            (
                r#"{"messages":[],"stream_options": null ,"stream":true}"#,
                r#"{"messages":[],"stream_options": {"include_usage":true} ,"stream":true}"#,
                true,
            ),
            // After a byte order mark, which Python's JSON reader skips.
            (
                "\u{feff}{\"messages\":[],\"stream\":true}",
                "\u{feff}{\"stream_options\":{\"include_usage\":true},\"messages\":[],\"stream\":true}",
                true,
            ),
            (
                "\u{feff}{\"messages\":[],\"stream_options\":{\"include_usage\":0}}",
                "\u{feff}{\"messages\":[],\"stream_options\":{\"include_usage\":true}}",
                true,
            ),
            (
                r#"{"messages":[],"stream_options":{"include_usage":false,"continuous_usage_stats":true}}"#,
                r#"{"messages":[],"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#,
                true,
            ),
            // Values Python workers read as false.
            (
                r#"{"messages":[],"stream_options":{"include_usage":0}}"#,
                r#"{"messages":[],"stream_options":{"include_usage":true}}"#,
                true,
            ),
            (
                r#"{"messages":[],"stream_options":{"include_usage":"no"}}"#,
                r#"{"messages":[],"stream_options":{"include_usage":true}}"#,
                true,
            ),
            // Values a JSON map of this gateway would not take, which
            // Python workers do: the edit reads none of them.
            (
                r#"{"messages":[],"stream_options":{"include_usage":null,"x":1e400,"s":"\ud800"}}"#,
                r#"{"messages":[],"stream_options":{"include_usage":true,"x":1e400,"s":"\ud800"}}"#,
                true,
            ),
            // Written twice: both (Python's readers keep the last).
            (
                r#"{"messages":[],"stream_options":{"include_usage":true, "include_usage" : false}}"#,
                r#"{"messages":[],"stream_options":{"include_usage":true, "include_usage" : true}}"#,
                true,
            ),
            // Left to the server's default: asked for, the event left in
            // (vLLM's default sends it).
            (
                r#"{"messages":[],"stream_options":{}}"#,
                r#"{"messages":[],"stream_options":{"include_usage":true}}"#,
                false,
            ),
            (
                r#"{"messages":[],"stream_options":{ "continuous_usage_stats":true}}"#,
                r#"{"messages":[],"stream_options":{"include_usage":true, "continuous_usage_stats":true}}"#,
                false,
            ),
            // Asked already (the last one reads as true), or a value no
            // worker takes: unchanged.
            (
                r#"{"messages":[],"stream_options":{"include_usage":false,"include_usage":true}}"#,
                r#"{"messages":[],"stream_options":{"include_usage":false,"include_usage":true}}"#,
                false,
            ),
            (
                r#"{"messages":[],"stream_options":{"include_usage":"True"}}"#,
                r#"{"messages":[],"stream_options":{"include_usage":"True"}}"#,
                false,
            ),
            (
                r#"{"messages":[],"stream_options":{"include_usage":1}}"#,
                r#"{"messages":[],"stream_options":{"include_usage":1}}"#,
                false,
            ),
            (
                r#"{"messages":[],"stream_options":"yes"}"#,
                r#"{"messages":[],"stream_options":"yes"}"#,
                false,
            ),
        ];
        for (sent, want, strip) in cases {
            let (edited, stripped) = body(&options(sent), sent);
            assert_eq!(edited, want);
            assert_eq!(stripped, strip, "{sent}");
            assert_eq!(
                options(&edited).usage_asked(),
                !sent.ends_with(r#""yes"}"#),
                "{edited}"
            );
        }
        // An escaped key is the same key: asked for in place, not twice.
        let escaped = r#"{"messages":[],"stream\u005foptions":{"include_usage":false}}"#;
        assert_eq!(
            body(&options(escaped), escaped).0,
            r#"{"messages":[],"stream\u005foptions":{"include_usage":true}}"#
        );
        // Twice is refused when inspected, so never edited.
        assert!(
            crate::inspect::inspect(
                crate::inspect::Api::ChatCompletions,
                br#"{"messages":[],"stream_options":null,"stream_options":{}}"#
            )
            .is_err()
        );
        // An empty object (text completions read no other field it needs).
        assert_eq!(
            body(&StreamOptions::Absent, "{ }").0,
            r#"{"stream_options":{"include_usage":true} }"#
        );
    }

    #[test]
    fn the_edited_body_is_paid_from_the_budget() {
        let budget = BodyBudget::new(96);
        let sent = r#"{"messages":[],"stream":true}"#;
        let edited = ask_for_usage(Bytes::from_static(sent.as_bytes()), &options(sent), &budget)
            .unwrap()
            .body;
        assert_eq!(budget.used(), edited.len());
        drop(edited);
        assert_eq!(budget.used(), 0);
        // The body read, paid from the same budget, makes room for its
        // edit: the two would not fit side by side.
        let read = crate::body::budgeted(sent.as_bytes().to_vec(), &budget).unwrap();
        let edited = ask_for_usage(read, &options(sent), &budget).unwrap().body;
        assert!(sent.len() + edited.len() > budget.limit());
        assert_eq!(budget.used(), edited.len());
        drop(edited);
        assert_eq!(budget.used(), 0);
        let long = format!(r#"{{"messages":[],"user":"{}"}}"#, "u".repeat(40));
        assert!(matches!(
            ask_for_usage(Bytes::from(long.clone()), &options(&long), &budget),
            Err(GatewayError::BodyBudgetExhausted { .. })
        ));
    }
}
