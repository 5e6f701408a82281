//! The finished items' reports of an SGLang `/generate` answer, read as it
//! passes.
//!
//! A `/generate` batch (a list of prompts) is answered with one
//! `meta_info` per item: a list of results, or, streamed, the items'
//! events interleaved, each item's counts growing until its last event,
//! the one with a `finish_reason`. The tail ([`super::UsageTail`]) holds
//! the last few reports only, so the batch's tokens are the sum of every
//! report that finished an item, counted here frame by frame. A single
//! prompt's answer has one such report, the one the tail has.
//!
//! A report cut by a frame's end is kept until the next frame completes
//! it; memory stays bounded by [`MAX_REPORT`] whatever the body's size.

use serde::Deserialize;
use serde::de::IgnoredAny;

/// The longest report kept while its end has not come: a `meta_info` is a
/// few hundred bytes (more with logprobs, which are not waited for).
const MAX_REPORT: usize = 16 * 1024;

/// The key that opens a report.
const KEY: &[u8] = b"\"meta_info\"";

/// In a response's extensions: an answer to SGLang's `/generate`, whose
/// items' reports a tenant's charge reads ([`ItemReports`]). Only those:
/// every other answer would be scanned twice for nothing.
#[derive(Clone, Copy, Debug)]
pub struct GenerateAnswer;

/// The items an answer finished, and their tokens.
#[derive(Debug, Default)]
pub struct ItemReports {
    /// The end of the frames so far, from a report they cut short (or the
    /// first bytes of its key).
    carry: Vec<u8>,
    /// Prompt and completion tokens of the finished items.
    tokens: u64,
    /// How many items finished.
    finished: u64,
}

/// A `meta_info` object's fields that count.
#[derive(Deserialize)]
struct MetaInfo {
    #[serde(default)]
    finish_reason: Option<IgnoredAny>,
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

/// What follows a key.
enum Read {
    /// A report (finished or not), or no report at all.
    Done(Option<MetaInfo>),
    /// A report that runs past the bytes at hand.
    Cut,
}

impl ItemReports {
    /// Reports none.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the next piece of the body.
    pub fn push(&mut self, frame: &[u8]) {
        if self.carry.is_empty() {
            self.scan(frame);
        } else {
            let mut bytes = std::mem::take(&mut self.carry);
            bytes.extend_from_slice(frame);
            self.scan(&bytes);
        }
    }

    fn scan(&mut self, bytes: &[u8]) {
        let finder = super::Key::MetaInfo.finder();
        // A key cut by the end: its first bytes (a quote, most often none).
        let mut keep = (bytes.len().saturating_sub(KEY.len() - 1)..bytes.len())
            .find(|&at| KEY.starts_with(&bytes[at..]))
            .unwrap_or(bytes.len());
        for at in finder.find_iter(bytes) {
            match read(&bytes[at + KEY.len()..]) {
                Read::Done(Some(report)) => self.count(&report),
                Read::Done(None) => {}
                // Any later key is inside it: read again with the rest.
                Read::Cut => {
                    if bytes.len() - at <= MAX_REPORT {
                        keep = at;
                    }
                    break;
                }
            }
        }
        self.carry = bytes[keep..].to_vec();
    }

    fn count(&mut self, report: &MetaInfo) {
        if report.finish_reason.is_none() {
            return;
        }
        let tokens = report
            .prompt_tokens
            .unwrap_or(0)
            .saturating_add(report.completion_tokens.unwrap_or(0));
        self.tokens = self.tokens.saturating_add(tokens);
        self.finished += 1;
    }

    /// The tokens of every finished item, if any finished.
    pub fn tokens(&self) -> Option<u64> {
        (self.finished > 0).then_some(self.tokens)
    }
}

/// The report after a key: `:` and an object.
fn read(rest: &[u8]) -> Read {
    let rest = rest.trim_ascii_start();
    let Some((&colon, rest)) = rest.split_first() else {
        return Read::Cut;
    };
    if colon != b':' {
        return Read::Done(None);
    }
    let rest = rest.trim_ascii_start();
    match rest.first() {
        None => return Read::Cut,
        Some(b'{') => {}
        Some(_) => return Read::Done(None),
    }
    match serde_json::Deserializer::from_slice(rest)
        .into_iter::<MetaInfo>()
        .next()
    {
        Some(Ok(report)) => Read::Done(Some(report)),
        Some(Err(e)) if e.is_eof() => Read::Cut,
        Some(Err(_)) => Read::Done(None),
        None => Read::Cut,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reports(frames: &[&[u8]]) -> Option<u64> {
        let mut items = ItemReports::new();
        for frame in frames {
            items.push(frame);
        }
        items.tokens()
    }

    #[test]
    fn every_finished_item_counts_once_however_the_body_is_cut() {
        let item = |i: u64, done: bool, completion: u64| {
            let finish = if done { r#"{"type":"length"}"# } else { "null" };
            format!(
                r#"data: {{"text":"x","meta_info":{{"id":"r{i}","finish_reason":{finish},"prompt_tokens":10,"completion_tokens":{completion}}},"index":{i}}}"#
            ) + "\n\n"
        };
        // Two items interleaved, each counting up to its last event.
        let stream = [
            item(0, false, 1),
            item(1, false, 1),
            item(1, true, 2),
            item(0, false, 2),
            item(0, true, 3),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        let want = Some(10 + 2 + 10 + 3);
        assert_eq!(reports(&[stream.as_bytes()]), want);
        for cut in 0..=stream.len() {
            let (a, b) = stream.as_bytes().split_at(cut);
            assert_eq!(reports(&[a, b]), want, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = stream.as_bytes().chunks(1).collect();
        assert_eq!(reports(&bytes), want, "a byte a frame");
        // A whole list; one prompt's answer; none finished; none at all.
        let list = br#"[{"text":"a","meta_info":{"finish_reason":{"type":"stop"},"prompt_tokens":4,"completion_tokens":1}},{"text":"b","meta_info":{"finish_reason":{"type":"stop"},"prompt_tokens":5,"completion_tokens":2}}]"#;
        assert_eq!(reports(&[list]), Some(12));
        assert_eq!(reports(&[&list[..100], &list[100..]]), Some(12));
        let one = br#"{"text":"a","meta_info":{"finish_reason":{"type":"stop"},"prompt_tokens":4,"completion_tokens":1}}"#;
        assert_eq!(reports(&[one]), Some(5));
        assert_eq!(reports(&[item(0, false, 7).as_bytes()]), None);
        assert_eq!(reports(&[br#"{"usage":{"total_tokens":3}}"#]), None);
        // A malformed report is passed over; the next still counts.
        let bad = [
            r#"{"meta_info":{"finish_reason":"stop","prompt_tokens":"x"}}"#,
            r#"{"meta_info":{"finish_reason":"stop","prompt_tokens":2}}"#,
        ]
        .concat();
        assert_eq!(reports(&[bad.as_bytes()]), Some(2));
    }

    #[test]
    fn what_is_kept_stays_bounded() {
        let mut items = ItemReports::new();
        items.push(br#"{"meta_info":{"finish_reason":null,"logprobs":""#);
        for _ in 0..100 {
            items.push(&[b'x'; 4096]);
            assert!(items.carry.len() <= MAX_REPORT + 4096);
        }
        assert!(items.carry.is_empty());
        assert_eq!(items.tokens(), None);
    }
}
