//! Token usage read from the tail of a response, without touching it.
//!
//! Tenants' token limits are charged with what a worker reports it used: the
//! OpenAI `usage` object (`total_tokens`, or `prompt_tokens +
//! completion_tokens` where that is more: a total below its own parts is
//! not believed in the tenant's favour), the Responses API's
//! (`total_tokens` or `input_tokens + output_tokens`, the same way; a
//! stream carries it in its final
//! `response.completed` or `response.incomplete` event), the Anthropic
//! Messages API's (`input_tokens` plus the prompt-cache reads and writes it
//! leaves out, `cache_read_input_tokens` and `cache_creation_input_tokens`,
//! plus `output_tokens`), or SGLang's `meta_info` for `/generate`. A whole
//! JSON body carries it near its end; an OpenAI stream carries it in its
//! last data event when the client asked with
//! `stream_options.include_usage`. An Anthropic stream splits it: the prompt
//! in `message_start`'s usage, at the start, and the final output count
//! alone in `message_delta`'s, at the end; the two are added.
//!
//! [`UsageTail`] keeps only the first [`HEAD_BYTES`] and the last
//! [`TAIL_BYTES`] bytes a body passed through (the head for that stream's
//! first event, however long the stream), and, in a whole JSON answer,
//! [`KEY_BYTES`] from the last usage object's key on, wherever it was:
//! vLLM puts `prompt_logprobs` and the prompt's token ids after `usage`,
//! tens of KiB for a long prompt. So memory is bounded whatever the
//! body's size, and the frames themselves go to the client unchanged; the
//! scan runs once, at the end. A body whose usage is in none of these, or
//! that has none, reports `None` (nothing is charged). An SGLang
//! `/generate` batch reports one `meta_info` per item, more than the tail
//! holds: [`ItemReports`] sums them as the body passes.

//! The same tail gives the prompt's cached-token count for the routing
//! correction ([`cached_in`]): `usage.prompt_tokens_details.cached_tokens`
//! (vLLM, SGLang, OpenAI), the Responses API's
//! `usage.input_tokens_details.cached_tokens`, the Messages API's
//! `cache_read_input_tokens`, or SGLang's `meta_info.cached_tokens`.
//!
//! And, for a trace recording (`record.rs`), the prompt and completion
//! counts apart ([`counts_in`]), with the cached count, in one scan
//! ([`UsageTail::usage`]).

mod items;
mod object;
mod output;

use std::sync::LazyLock;

pub use items::{GenerateAnswer, ItemReports};
use memchr::memmem::Finder;
use object::{Count, Fields};
pub use output::Output;

/// How much of a body's end is kept for the scan. A usage object is about
/// 200 bytes; SSE streams end with the usage event and `data: [DONE]`; whole
/// bodies put at most a few short fields after `usage`.
pub const TAIL_BYTES: usize = 8 * 1024;

/// How much of a body's start is kept too: an Anthropic stream's first
/// event, `message_start` with the prompt's usage, is a few hundred bytes.
pub const HEAD_BYTES: usize = 2 * 1024;

/// How much is kept from the last usage object's key on, wherever in the
/// body it came: a usage object with every detail an API adds is well
/// under 1 KiB.
pub const KEY_BYTES: usize = 2 * 1024;

/// The first [`HEAD_BYTES`] and the last [`TAIL_BYTES`] bytes of a body,
/// the tail in a ring: a small frame costs its own length to keep, however
/// full the tail is; and [`KEY_BYTES`] from the last usage object's key.
#[derive(Debug, Default)]
pub struct UsageTail {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    /// From the last `"usage"` or `"meta_info"` key followed by an object
    /// on, up to [`KEY_BYTES`].
    key: Vec<u8>,
    /// Where `key` starts in the body.
    key_at: u64,
    /// Whether the body is one JSON value (its first byte but white space
    /// is `{` or `[`), whose usage may come anywhere: only such a body's
    /// keys are looked for as it passes. An event stream's usage events
    /// are at its start or end, which the head and tail keep.
    whole: Option<bool>,
    /// Bytes passed through in all.
    seen: u64,
}

impl UsageTail {
    /// An empty tail.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the next piece of the body, keeping only its start and end.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.whole.is_none() {
            self.whole = bytes
                .trim_ascii_start()
                .first()
                .map(|&first| matches!(first, b'{' | b'['));
        }
        if self.whole == Some(true) {
            self.keep_key(bytes);
        }
        self.seen += bytes.len() as u64;
        if self.head.len() < HEAD_BYTES {
            let room = HEAD_BYTES - self.head.len();
            self.head.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
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

    /// Keeps the last usage key in `bytes` with what follows it, or what
    /// follows the key kept so far, up to [`KEY_BYTES`] (called before
    /// `bytes` is counted in `seen` or kept in the tail).
    fn keep_key(&mut self, bytes: &[u8]) {
        if !self.key.is_empty() && self.key.len() < KEY_BYTES {
            let room = KEY_BYTES - self.key.len();
            self.key.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
        if let Some(at) = last_key(bytes) {
            self.key.clear();
            self.key
                .extend_from_slice(&bytes[at..bytes.len().min(at + KEY_BYTES)]);
            self.key_at = self.seen + at as u64;
            return;
        }
        // A key split between this piece and the last: its start is in the
        // tail's end.
        const SPAN: usize = b"\"meta_info\"".len() - 1;
        let before = self.tail.len().min(SPAN);
        if before == 0 || bytes.is_empty() {
            return;
        }
        let after = bytes.len().min(SPAN);
        let mut joint = [0u8; 2 * SPAN];
        for (to, from) in joint
            .iter_mut()
            .zip(self.tail.range(self.tail.len() - before..))
        {
            *to = *from;
        }
        joint[before..before + after].copy_from_slice(&bytes[..after]);
        let joint = &joint[..before + after];
        if let Some(at) = last_key(joint).filter(|&at| at < before) {
            self.key.clear();
            self.key.extend_from_slice(&joint[at..before]);
            self.key
                .extend_from_slice(&bytes[..bytes.len().min(KEY_BYTES - self.key.len())]);
            self.key_at = self.seen - (before - at) as u64;
        }
    }

    /// What is kept of the body, as one text: its head, the last usage key
    /// with what followed it, and its tail, each in body order without
    /// what an earlier one holds, joined where they meet and with a NUL
    /// (which no JSON holds, so no object read runs across the cut) where
    /// bytes between them were not kept.
    fn text(&mut self) -> std::borrow::Cow<'_, [u8]> {
        let tail = self.tail.make_contiguous();
        let tail_at = self.seen - tail.len() as u64;
        if tail_at == 0 {
            return std::borrow::Cow::Borrowed(tail);
        }
        let mut text = Vec::with_capacity(self.head.len() + self.key.len() + tail.len() + 2);
        // The end of what `text` holds, as an offset in the body.
        let mut end = 0u64;
        for (at, piece) in [(0, &self.head[..]), (self.key_at, &self.key[..])] {
            let from = end.max(at);
            let to = (at + piece.len() as u64).min(tail_at);
            if from >= to {
                continue;
            }
            if from > end {
                text.push(0);
            }
            text.extend_from_slice(&piece[(from - at) as usize..(to - at) as usize]);
            end = to;
        }
        if tail_at > end {
            text.push(0);
        }
        text.extend_from_slice(tail);
        text.into()
    }

    /// The tokens the body reports it used, if what is kept of it says.
    pub fn tokens(&mut self) -> Option<u64> {
        tokens_in(&self.text())
    }

    /// The prompt's cached-token report, if what is kept has one.
    pub fn cached(&mut self) -> CachedReport {
        cached_in(&self.text())
    }

    /// The prompt and completion counts and the cached-token report.
    pub fn usage(&mut self) -> Usage {
        let text = self.text();
        Usage {
            counts: counts_in(&text),
            cached: cached_in(&text),
        }
    }
}

/// Everything a body's tail reports about its request's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Prompt and completion tokens.
    pub counts: Counts,
    /// The prompt's cached tokens.
    pub cached: CachedReport,
}

/// Prompt and completion tokens as reported, each when present.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `prompt_tokens` (or the API's equivalent, see [`Report`]).
    pub prompt: Option<u64>,
    /// `completion_tokens` or `output_tokens`.
    pub completion: Option<u64>,
}

/// The prompt and completion counts of the last usage reports in `text`:
/// each from the latest `"usage"` object that has it (an Anthropic stream
/// reports its prompt at the start and its output at the end), else from
/// the latest `"meta_info"`.
pub fn counts_in(text: &[u8]) -> Counts {
    let mut out = Counts::default();
    for key in [Key::Usage, Key::MetaInfo] {
        for report in objects_after(text, key).filter_map(|o| Report::read(&o)) {
            out.prompt = out.prompt.or(report.prompt);
            out.completion = out.completion.or(report.output);
            if out.prompt.is_some() && out.completion.is_some() {
                return out;
            }
        }
        if out.prompt.is_some() || out.completion.is_some() {
            return out;
        }
    }
    out
}

/// What a body's tail says about the prompt's cached tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachedReport {
    /// No cached-token count (the worker does not report one, or the body
    /// has no usage).
    Absent,
    /// A count, with the prompt's size.
    Report {
        /// Prompt tokens (for the Messages API: input plus cache reads and
        /// writes).
        prompt_tokens: u64,
        /// Of those, found cached.
        cached_tokens: u64,
    },
    /// A count that is not one: negative, fractional, not a number, or
    /// without a prompt count to compare it with.
    Invalid,
}

/// The last cached-token report in `text`: the last `"usage"` object that
/// carries a cached count, else the last `"meta_info"` that does.
pub fn cached_in(text: &[u8]) -> CachedReport {
    for object in objects_after(text, Key::Usage) {
        let cached = object
            .prompt_details_cached
            .or(object.input_details_cached)
            .or(object.cache_read_input_tokens);
        if let Some(cached) = cached {
            let prompt = Report::read(&object).and_then(|r| r.prompt);
            return judge(prompt, cached);
        }
    }
    for object in objects_after(text, Key::MetaInfo) {
        if let Some(cached) = object.cached_tokens {
            let prompt = Report::read(&object).and_then(|r| r.prompt);
            return judge(prompt, cached);
        }
    }
    CachedReport::Absent
}

fn judge(prompt: Option<u64>, cached: Count) -> CachedReport {
    match (prompt, cached.as_u64()) {
        (Some(prompt_tokens), Some(cached_tokens)) => CachedReport::Report {
            prompt_tokens,
            cached_tokens,
        },
        _ => CachedReport::Invalid,
    }
}

/// The last usage report in `text`: the last `"usage"` object with counts
/// (joined with an earlier one's prompt count if it has only an output
/// count), else the last `"meta_info"` with prompt and completion counts.
pub fn tokens_in(text: &[u8]) -> Option<u64> {
    let mut later_output = None;
    for report in objects_after(text, Key::Usage).filter_map(|o| Report::read(&o)) {
        match (later_output, report) {
            (None, report) if let Some(tokens) = report.tokens() => return Some(tokens),
            (None, Report { output, .. }) => later_output = output,
            (
                Some(output),
                Report {
                    prompt: Some(prompt),
                    ..
                },
            ) => {
                return Some(prompt.saturating_add(output));
            }
            (Some(_), _) => {}
        }
    }
    later_output.or_else(|| {
        objects_after(text, Key::MetaInfo)
            .filter_map(|o| Report::read(&o))
            .find_map(|r| r.tokens())
    })
}

/// The keys whose objects carry usage.
#[derive(Clone, Copy)]
enum Key {
    /// `"usage"`: OpenAI, the Responses and Messages APIs.
    Usage,
    /// `"meta_info"`: SGLang's `/generate`.
    MetaInfo,
}

impl Key {
    /// The quoted key's searcher, built once.
    fn finder(self) -> &'static Finder<'static> {
        static USAGE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"usage\""));
        static META_INFO: LazyLock<Finder<'static>> =
            LazyLock::new(|| Finder::new(b"\"meta_info\""));
        match self {
            Key::Usage => &USAGE,
            Key::MetaInfo => &META_INFO,
        }
    }
}

/// Where the last usage key in `bytes` starts that an object follows (or
/// may follow, where `bytes` ends before saying).
fn last_key(bytes: &[u8]) -> Option<usize> {
    let mut last = None;
    for key in [Key::Usage, Key::MetaInfo] {
        let finder = key.finder();
        for at in finder.find_iter(bytes) {
            let rest = &bytes[at + finder.needle().len()..];
            // Where `bytes` ends before the colon or the value, it may.
            let opens = rest.trim_ascii_start().is_empty()
                || value_after_colon(rest).is_some_and(|v| v.first().is_none_or(|&b| b == b'{'));
            if opens && last.is_none_or(|last| at > last) {
                last = Some(at);
            }
        }
    }
    last
}

/// The usage objects that follow `key` and `:` in `text`, last first.
fn objects_after(text: &[u8], key: Key) -> impl Iterator<Item = Fields> + '_ {
    // Found front to back (the forward search is vectorised, the reverse
    // one is not: a streamed answer's 8 KiB tail is scanned several times),
    // tried back to front.
    let finder = key.finder();
    let hits: Vec<usize> = finder.find_iter(text).collect();
    hits.into_iter()
        .rev()
        .filter_map(move |at| object_at(&text[at + finder.needle().len()..]))
}

/// What follows the `:` (and white space) at the start of `rest`, the
/// value of the key before it.
fn value_after_colon(rest: &[u8]) -> Option<&[u8]> {
    Some(
        rest.trim_ascii_start()
            .strip_prefix(b":")?
            .trim_ascii_start(),
    )
}

/// The JSON object right after `: ` at the start of `rest`, if complete
/// and well-formed (what follows it is not read).
fn object_at(rest: &[u8]) -> Option<Fields> {
    let rest = value_after_colon(rest)?;
    if rest.first() != Some(&b'{') {
        return None;
    }
    object::read(rest)
}

/// The counts one usage object reports; at least one is there.
#[derive(Clone, Copy, Debug)]
struct Report {
    /// `total_tokens`.
    total: Option<u64>,
    /// `prompt_tokens`, or `input_tokens` plus the prompt-cache counts.
    prompt: Option<u64>,
    /// `completion_tokens` or `output_tokens`.
    output: Option<u64>,
}

impl Report {
    fn read(object: &Fields) -> Option<Self> {
        let count = |field: Option<Count>| field?.as_u64();
        let prompt = count(object.prompt_tokens).or_else(|| {
            count(object.input_tokens).map(|input| {
                input
                    .saturating_add(count(object.cache_read_input_tokens).unwrap_or(0))
                    .saturating_add(count(object.cache_creation_input_tokens).unwrap_or(0))
            })
        });
        let report = Self {
            total: count(object.total_tokens),
            prompt,
            output: count(object.completion_tokens).or_else(|| count(object.output_tokens)),
        };
        (report.total.is_some() || report.prompt.is_some() || report.output.is_some())
            .then_some(report)
    }

    /// The tokens this report alone says were used: its total or its
    /// prompt and output added, whichever is more (a worker whose total
    /// leaves out what it reports beside it, `0` say, would otherwise be
    /// charged nothing); `None` without a total or a prompt count.
    fn tokens(&self) -> Option<u64> {
        let parts = self
            .prompt
            .map(|prompt| prompt.saturating_add(self.output.unwrap_or(0)));
        match (self.total, parts) {
            (Some(total), Some(parts)) => Some(total.max(parts)),
            (total, parts) => total.or(parts),
        }
    }
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
        // A total below its own parts is not believed; one above them is.
        let short = br#"{"usage":{"prompt_tokens":7,"completion_tokens":4,"total_tokens":0}}"#;
        assert_eq!(tokens_in(short), Some(11));
        let long = br#"{"usage":{"prompt_tokens":7,"completion_tokens":4,"total_tokens":20}}"#;
        assert_eq!(tokens_in(long), Some(20));
        let meta = br#"{"meta_info":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":3}}"#;
        assert_eq!(tokens_in(meta), Some(10));
        // The Responses API: the final event's response object.
        let responses = b"event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"usage\"}\n\n\
            event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[],\
            \"usage\":{\"input_tokens\":12,\"input_tokens_details\":{\"cached_tokens\":8},\"output_tokens\":3}}}\n\n";
        assert_eq!(tokens_in(responses), Some(15));
        // Anthropic: a whole message leaves cached reads out of input.
        let message = br#"{"type":"message","usage":{"input_tokens":2,"cache_read_input_tokens":6,"cache_creation_input_tokens":1,"output_tokens":3}}"#;
        assert_eq!(tokens_in(message), Some(12));
        // Its stream: the prompt at the start, the output alone at the end.
        let stream = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4,\"cache_read_input_tokens\":16,\"output_tokens\":1}}}\n\n\
            event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n\
            event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(tokens_in(stream), Some(29));
        // Its start out of the tail: the output is what is left to charge.
        let start = stream.iter().position(|&b| b == b'\n').unwrap() + 100;
        assert_eq!(tokens_in(&stream[start..]), Some(9));
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

    /// An Anthropic stream longer than the tail: its prompt count, in the
    /// first event, is charged with the output count of its last.
    #[test]
    fn a_long_streams_first_event_is_kept_for_its_prompt_count() {
        let start = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4000,\"cache_read_input_tokens\":16,\"output_tokens\":1}}}\n\n";
        let delta = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"some words\"}}\n\n";
        let end = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":900}}\n\n\
            event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        for deltas in [0, 50, 60, 70, 100, 1000] {
            let mut tail = UsageTail::new();
            tail.push(start);
            for _ in 0..deltas {
                tail.push(delta);
            }
            tail.push(end);
            assert_eq!(tail.tokens(), Some(4916), "{deltas} deltas");
            assert_eq!(tail.usage().counts.prompt, Some(4016), "{deltas} deltas");
        }
        // A body in one piece, longer than the tail.
        let mut whole = start.to_vec();
        for _ in 0..1000 {
            whole.extend_from_slice(delta);
        }
        whole.extend_from_slice(end);
        let mut tail = UsageTail::new();
        tail.push(&whole);
        assert_eq!(tail.tokens(), Some(4916));
        // An OpenAI stream's end still decides alone.
        let mut tail = UsageTail::new();
        tail.push(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"total_tokens\":2}}\n\n");
        for _ in 0..1000 {
            tail.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n");
        }
        tail.push(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n");
        assert_eq!(tail.tokens(), Some(7));
    }

    #[test]
    fn cached_tokens_in_every_shape() {
        let report = |p, c| CachedReport::Report {
            prompt_tokens: p,
            cached_tokens: c,
        };
        let whole = br#"{"choices":[{"text":"\"usage\": {"}],"usage":{"prompt_tokens":7,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":3}}}"#;
        assert_eq!(cached_in(whole), report(7, 3));
        let stream = b"data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n\
            data: {\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n\
            data: [DONE]\n\n";
        assert_eq!(cached_in(stream), report(50, 32));
        let responses = br#"event: response.completed
data: {"type":"response.completed","response":{"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":8},"output_tokens":1}}}"#;
        assert_eq!(cached_in(responses), report(9, 8));
        let messages = br#"{"usage":{"input_tokens":2,"cache_read_input_tokens":16,"cache_creation_input_tokens":0,"output_tokens":3}}"#;
        assert_eq!(cached_in(messages), report(18, 16));
        let generate = br#"{"text":"x","meta_info":{"prompt_tokens":40,"completion_tokens":1,"cached_tokens":16}}"#;
        assert_eq!(cached_in(generate), report(40, 16));
        // No count, or a null one: nothing to learn.
        let plain =
            br#"{"usage":{"prompt_tokens":7,"completion_tokens":4,"prompt_tokens_details":null}}"#;
        assert_eq!(cached_in(plain), CachedReport::Absent);
        assert_eq!(cached_in(b"{\"choices\":[]}"), CachedReport::Absent);
        // Fields no API reports are skipped, however nested; details that
        // are not an object hold no count.
        let extra = br#"{"usage":{"prompt_tokens":7,"x":{"y":["}{",{"usage":1}]},"prompt_tokens_details":5,"cache_read_input_tokens":2}}"#;
        assert_eq!(cached_in(extra), report(7, 2));
        let beside = br#"{"usage":{"prompt_tokens":7,"prompt_tokens_details":{"audio_tokens":1,"cached_tokens":null},"input_tokens_details":[{"cached_tokens":1}],"cache_read_input_tokens":4}}"#;
        assert_eq!(cached_in(beside), report(7, 4));
        // A field given twice counts as given last, as a JSON map keeps it.
        let twice = br#"{"usage":{"prompt_tokens":7,"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":3}}}"#;
        assert_eq!(cached_in(twice), report(9, 3));
        // Garbage is not a count.
        for bad in [
            &br#"{"usage":{"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":-1}}}"#[..],
            br#"{"usage":{"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":"3"}}}"#,
            br#"{"usage":{"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":2.5}}}"#,
            br#"{"usage":{"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":2}}}"#,
            br#"{"meta_info":{"prompt_tokens":7,"cached_tokens":[1]}}"#,
        ] {
            assert_eq!(
                cached_in(bad),
                CachedReport::Invalid,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn prompt_and_completion_counts_apart() {
        let counts = |p, c| Counts {
            prompt: p,
            completion: c,
        };
        let whole = br#"{"choices":[{"text":"\"usage\": {"}],"usage":{"prompt_tokens":7,"completion_tokens":4,"total_tokens":11}}"#;
        assert_eq!(counts_in(whole), counts(Some(7), Some(4)));
        // vLLM's continuous usage stats: the last chunk's counts.
        let stream = b"data: {\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":1}}\n\n\
            data: {\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
        assert_eq!(counts_in(stream), counts(Some(50), Some(2)));
        // Anthropic: the prompt at the start, the output at the end.
        let messages = b"data: {\"message\":{\"usage\":{\"input_tokens\":4,\"cache_read_input_tokens\":16,\"output_tokens\":1}}}\n\n\
            data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n";
        assert_eq!(counts_in(messages), counts(Some(20), Some(9)));
        let responses = br#"{"response":{"usage":{"input_tokens":12,"output_tokens":3}}}"#;
        assert_eq!(counts_in(responses), counts(Some(12), Some(3)));
        let generate = br#"{"text":"x","meta_info":{"prompt_tokens":40,"completion_tokens":1,"cached_tokens":16}}"#;
        assert_eq!(counts_in(generate), counts(Some(40), Some(1)));
        for none in [&b""[..], b"data: {\"usage\":null}\n\n", b"{\"usage\":{}}"] {
            assert_eq!(counts_in(none), Counts::default());
        }
        let mut tail = UsageTail::new();
        tail.push(generate);
        assert_eq!(
            tail.usage(),
            Usage {
                counts: counts(Some(40), Some(1)),
                cached: CachedReport::Report {
                    prompt_tokens: 40,
                    cached_tokens: 16
                },
            }
        );
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
        assert_eq!(tail.tokens(), None, "a usage object longer than KEY_BYTES");
        tail.push(b"\"usage\": {\"total_tokens\":43}");
        tail.push(&vec![b'x'; TAIL_BYTES]);
        assert_eq!(tail.tokens(), Some(43), "the usage key kept");
        tail.push(b"\"usage\":null,\"usage\" :\"no\"");
        tail.push(&vec![b'x'; TAIL_BYTES]);
        assert_eq!(tail.tokens(), Some(43), "keys without an object skipped");
    }

    /// vLLM's whole answer: `prompt_logprobs` and `prompt_token_ids` after
    /// `usage`, far more than the tail; in any pieces, the key split
    /// between two or not.
    #[test]
    fn a_usage_key_far_from_either_end_is_kept() {
        let mut body = br#"{"choices":[{"message":{"content":""#.to_vec();
        body.extend(std::iter::repeat_n(b'a', 3 * HEAD_BYTES));
        body.extend_from_slice(br#""}}],"usage":{"prompt_tokens":900,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":512}},"prompt_token_ids":["#);
        body.extend(std::iter::repeat_n(b"12345,".as_slice(), 2 * TAIL_BYTES).flatten());
        body.extend_from_slice(b"0]}");
        for size in [1, 3, 7, 64, 1000, 5000, body.len()] {
            let mut tail = UsageTail::new();
            for piece in body.chunks(size) {
                tail.push(piece);
            }
            assert_eq!(tail.tokens(), Some(905), "pieces of {size}");
            assert_eq!(
                tail.cached(),
                CachedReport::Report {
                    prompt_tokens: 900,
                    cached_tokens: 512
                },
                "pieces of {size}"
            );
        }
        // An event stream's usage events are at its ends: its keys are
        // not looked for as it passes (what that would cost every chunk
        // of every stream).
        let mut tail = UsageTail::new();
        tail.push(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n");
        assert!(tail.key.is_empty());
        // Partly in the tail: joined where the two meet.
        let end = body.len() - TAIL_BYTES - 20;
        let mut tail = UsageTail::new();
        tail.push(&body[..end]);
        tail.push(b"\"usage\":{\"prompt_tokens\":7,");
        tail.push(&vec![b' '; TAIL_BYTES - 20]);
        tail.push(b"\"completion_tokens\":1}");
        assert_eq!(tail.tokens(), Some(8));
    }
}
