//! One recorded request as one JSON line: lengths, block hashes and what
//! routing did, and nothing of the prompt's text.
//!
//! The shape is the Mooncake trace's, which `radixgate load --trace` and
//! `radixgate simulate --trace` replay: `timestamp` (ms; here since the Unix
//! epoch, at the request's arrival), `input_length` and `output_length` in
//! tokens, `hash_ids` (one id per [`BLOCK_TOKENS`]-token block of the
//! prompt), then fields the replayer keeps or ignores: `model`, `worker`,
//! `branch`, `cached_tokens` (`null` when the answer did not report it),
//! `status`, and `lengths` (`usage` when both lengths came from the
//! answer's usage, else `estimated`).
//!
//! **Block ids.** The routing text is cut into blocks of a fixed number of
//! characters per model, `BLOCK_TOKENS` × the model's characters per token
//! (learned by the routing correction from the workers' answers when the
//! model is first recorded, else [`DEFAULT_CHARS_PER_TOKEN`]), and each
//! block's id is a keyed hash of the previous id and the block's bytes: a
//! chain, so an id stands for the whole prefix up to its block, and two
//! requests that share a prefix share exactly its whole blocks' ids. The
//! key ([`Salt`]) is drawn at random when the gateway starts and never
//! written anywhere, so nobody holding the file can test a guessed prompt
//! against it; ids agree within one gateway process (across rotations and
//! runtime restarts of the recording), not across processes. Ids are kept
//! below 2^53, so every JSON reader keeps them exact; the replayer takes any
//! integer id, so they need no renumbering (and no map from hashes to small
//! ids is kept). The number of ids is always `ceil(input_length /
//! BLOCK_TOKENS)`, as the replayer requires: a text with more blocks than
//! the reported length is cut, one with fewer is continued with ids chained
//! from its last (a prompt's token count can disagree with its routing
//! text's length, e.g. for templates the router does not see).
//!
//! **Estimates.** Without usage in the answer, or with a prompt count over
//! [`MAX_INPUT_TOKENS`] (a worker that lies), the prompt's length is its
//! characters over the model's current characters per token; the output's
//! is the count of SSE data events (less `[DONE]` and events with an empty
//! `content`, such as a chat stream's opening role chunk) for a stream, or
//! the body's bytes beyond a JSON envelope over characters per token.

use std::hash::{BuildHasher, Hasher};

use serde::Serialize;

pub use crate::usage::Output;
use crate::usage::{CachedReport, Usage};

/// Tokens per block: the Mooncake trace's block.
pub const BLOCK_TOKENS: u64 = 512;

/// The most prompt tokens a line takes from an answer's usage: above any
/// model's context today (10 million tokens at most), and 32,768 block ids.
/// A worker that reports more is not believed (its count would make the
/// line's ids, one per block, take memory without bound): the prompt's
/// length is estimated from its text instead.
pub const MAX_INPUT_TOKENS: u64 = 1 << 24;

/// Characters per token before the correction has learned a model's.
pub const DEFAULT_CHARS_PER_TOKEN: f64 = 4.0;

/// Ids are kept below 2^53 (exact in every JSON reader).
const ID_MASK: u64 = (1 << 53) - 1;

/// The recording's secret hash key, drawn at random per gateway process.
#[derive(Clone, Debug, Default)]
pub struct Salt(std::hash::RandomState);

impl Salt {
    /// A fresh random key.
    pub fn new() -> Self {
        Self::default()
    }

    fn next(&self, prev: u64, block: &[u8]) -> u64 {
        let mut h = self.0.build_hasher();
        h.write_u64(prev);
        h.write(block);
        h.finish()
    }
}

/// The chained block ids of `text` for a prompt of `input_length` tokens,
/// cut into blocks of `block_chars` characters (see the module doc).
pub fn hash_ids(salt: &Salt, text: &str, block_chars: usize, input_length: u64) -> Vec<u64> {
    let want = input_length.max(1).div_ceil(BLOCK_TOKENS) as usize;
    let block_chars = block_chars.max(1);
    let mut ids = Vec::with_capacity(want);
    let mut prev = 0u64;
    let mut start = 0;
    let mut chars = 0;
    for (at, _) in text.char_indices().chain([(text.len(), ' ')]) {
        if ids.len() == want {
            break;
        }
        if chars == block_chars || (at == text.len() && at > start) {
            prev = salt.next(prev, &text.as_bytes()[start..at]);
            ids.push(prev & ID_MASK);
            start = at;
            chars = 0;
        }
        chars += 1;
    }
    // More tokens than the text has blocks: continue the chain.
    while ids.len() < want {
        prev = salt.next(prev, &(ids.len() as u64).to_le_bytes());
        ids.push(prev & ID_MASK);
    }
    ids
}

/// What the request path hands over at a request's end.
#[derive(Debug)]
pub struct Finished {
    /// Arrival, ms since the Unix epoch.
    pub at_ms: u64,
    /// The routing text (hashed by the writer, never written).
    pub text: String,
    /// The pool's model.
    pub model: Option<String>,
    /// The worker's URL.
    pub worker: String,
    /// The decision's branch.
    pub branch: &'static str,
    /// The answer's HTTP status.
    pub status: u16,
    /// What its tail reported, if it was read.
    pub usage: Option<Usage>,
    /// The answer's body as it passed.
    pub output: Output,
}

/// The JSON line, in the field order of a Mooncake trace.
#[derive(Debug, Serialize, PartialEq)]
pub struct Line<'a> {
    /// Arrival, ms since the Unix epoch.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Generated tokens.
    pub output_length: u64,
    /// The prompt's chained block ids.
    pub hash_ids: Vec<u64>,
    /// The pool's model.
    pub model: Option<&'a str>,
    /// The worker that answered.
    pub worker: &'a str,
    /// The decision's branch.
    pub branch: &'a str,
    /// Reported cached prompt tokens.
    pub cached_tokens: Option<u64>,
    /// The answer's status.
    pub status: u16,
    /// `usage` or `estimated`.
    pub lengths: &'static str,
}

/// The line for `f`, given the model's block size in characters and its
/// current characters per token (for estimates).
pub fn line<'a>(
    salt: &Salt,
    f: &'a Finished,
    block_chars: usize,
    chars_per_token: f64,
) -> Line<'a> {
    let mut counts = f.usage.map(|u| u.counts).unwrap_or_default();
    counts.prompt = counts.prompt.filter(|&n| n <= MAX_INPUT_TOKENS);
    let cpt = if chars_per_token.is_finite() && chars_per_token > 0.0 {
        chars_per_token
    } else {
        DEFAULT_CHARS_PER_TOKEN
    };
    let estimated_input = || (f.text.chars().count() as f64 / cpt).ceil() as u64;
    let input_length = counts.prompt.unwrap_or_else(estimated_input).max(1);
    let output_length = counts.completion.unwrap_or_else(|| f.output.tokens(cpt));
    let cached_tokens = match f.usage.map(|u| u.cached) {
        Some(CachedReport::Report { cached_tokens, .. }) => Some(cached_tokens),
        _ => None,
    };
    Line {
        timestamp: f.at_ms,
        input_length,
        output_length,
        hash_ids: hash_ids(salt, &f.text, block_chars, input_length),
        model: f.model.as_deref(),
        worker: &f.worker,
        branch: f.branch,
        cached_tokens,
        status: f.status,
        lengths: if counts.prompt.is_some() && counts.completion.is_some() {
            "usage"
        } else {
            "estimated"
        },
    }
}

/// The block size in characters for `chars_per_token`.
pub fn block_chars(chars_per_token: Option<f64>) -> usize {
    let cpt = chars_per_token
        .filter(|c| c.is_finite() && *c > 0.0)
        .unwrap_or(DEFAULT_CHARS_PER_TOKEN);
    ((BLOCK_TOKENS as f64 * cpt).round() as usize).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::Counts;

    #[test]
    fn the_chain_shares_exactly_the_whole_blocks_of_a_common_prefix() {
        let salt = Salt::new();
        let a = "a".repeat(100) + &"b".repeat(100) + "tail one";
        let b = "a".repeat(100) + &"b".repeat(100) + "other tail, longer";
        let c = "a".repeat(100) + &"c".repeat(100);
        let ids = |t: &str| hash_ids(&salt, t, 100, 3 * BLOCK_TOKENS);
        let (ia, ib, ic) = (ids(&a), ids(&b), ids(&c));
        assert_eq!(ia.len(), 3);
        assert_eq!(ia[..2], ib[..2], "two whole blocks in common");
        assert_ne!(ia[2], ib[2]);
        assert_eq!(ia[0], ic[0]);
        assert_ne!(ia[1], ic[1]);
        // A chain: the same block after a different prefix is another id.
        let shifted = "c".repeat(100) + &"b".repeat(100);
        assert_ne!(ids(&shifted)[1], ia[1]);
        // Same text, same ids, every time; another salt, other ids.
        assert_eq!(ids(&a), ia);
        assert_ne!(hash_ids(&Salt::new(), &a, 100, 3 * BLOCK_TOKENS), ia);
        assert!(ia.iter().all(|&id| id <= ID_MASK));
    }

    #[test]
    fn the_number_of_ids_follows_the_token_count() {
        let salt = Salt::new();
        let text = "é".repeat(1000);
        for (tokens, want) in [(1, 1), (512, 1), (513, 2), (5000, 10)] {
            let ids = hash_ids(&salt, &text, 300, tokens);
            assert_eq!(ids.len(), want, "{tokens} tokens");
        }
        // Cut to the count, and continued past the text, both as a chain.
        let long = hash_ids(&salt, &text, 300, 5000);
        assert_eq!(hash_ids(&salt, &text, 300, 512)[0], long[0]);
        assert_eq!(hash_ids(&salt, &text, 300, 2048), long[..4]);
        assert_eq!(hash_ids(&salt, "", 300, 0).len(), 1);
        // Blocks are characters, not bytes: é is 2 bytes.
        let mixed = "é".repeat(300) + &"x".repeat(300);
        assert_eq!(
            hash_ids(&salt, &mixed, 300, 600)[0],
            hash_ids(&salt, &"é".repeat(300), 300, 600)[0]
        );
    }

    fn finished(usage: Option<Usage>, output: Output) -> Finished {
        Finished {
            at_ms: 1_700_000_000_123,
            text: "x".repeat(4000),
            model: Some("m".into()),
            worker: "http://w:1".into(),
            branch: "cache_hit",
            status: 200,
            usage,
            output,
        }
    }

    #[test]
    fn a_line_has_the_mooncake_shape_and_lengths_from_usage() {
        let salt = Salt::new();
        let usage = Usage {
            counts: Counts {
                prompt: Some(1100),
                completion: Some(7),
            },
            cached: CachedReport::Report {
                prompt_tokens: 1100,
                cached_tokens: 1024,
            },
        };
        let f = finished(Some(usage), Output::default());
        let text = serde_json::to_string(&line(&salt, &f, 2048, 4.0)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        // serde_json sorts keys without preserve_order; the text keeps the
        // struct's order, checked on the text itself.
        assert!(text.starts_with(
            r#"{"timestamp":1700000000123,"input_length":1100,"output_length":7,"hash_ids":["#
        ));
        assert_eq!(keys.len(), 10);
        assert_eq!(v["hash_ids"].as_array().unwrap().len(), 3);
        assert_eq!(v["cached_tokens"], 1024);
        assert_eq!(v["lengths"], "usage");
        assert_eq!(v["worker"], "http://w:1");
        assert_eq!(v["branch"], "cache_hit");
        assert_eq!(v["status"], 200);
        assert_eq!(v["model"], "m");
    }

    #[test]
    fn a_prompt_count_no_model_could_take_is_replaced_by_the_estimate() {
        let salt = Salt::new();
        for lie in [MAX_INPUT_TOKENS + 1, u64::MAX] {
            let usage = Usage {
                counts: Counts {
                    prompt: Some(lie),
                    completion: Some(7),
                },
                cached: CachedReport::Absent,
            };
            let f = finished(Some(usage), Output::default());
            let l = line(&salt, &f, 2048, 4.0);
            assert_eq!(l.input_length, 1000, "4000 chars at 4 per token, not {lie}");
            assert_eq!(l.hash_ids.len(), 2);
            assert_eq!(l.lengths, "estimated");
        }
        let usage = Usage {
            counts: Counts {
                prompt: Some(MAX_INPUT_TOKENS),
                completion: Some(7),
            },
            cached: CachedReport::Absent,
        };
        let f = finished(Some(usage), Output::default());
        let l = line(&salt, &f, 2048, 4.0);
        assert_eq!(l.input_length, MAX_INPUT_TOKENS);
        assert_eq!(l.hash_ids.len() as u64, MAX_INPUT_TOKENS / BLOCK_TOKENS);
    }

    #[test]
    fn without_usage_lengths_are_estimated_and_cached_tokens_null() {
        let salt = Salt::new();
        let mut stream = Output {
            sse: true,
            ..Output::default()
        };
        for frame in [
            &br#"data: {"delta":{"content":"","role":"assistant"}}"#[..],
            b"\n\n",
            b"data: {\"a\":1}\n\n",
            b"data: {\"a\":2}\n\ndata: {\"a\":3}\n\n",
            b"data: [DONE]\n\n",
        ] {
            stream.frame(frame);
        }
        assert_eq!((stream.events, stream.empty, stream.done), (5, 1, true));
        let f = finished(None, stream);
        let l = line(&salt, &f, 2048, 3.2);
        assert_eq!(l.input_length, 1250, "4000 chars at 3.2 per token");
        assert_eq!(
            l.output_length, 3,
            "five data events, less [DONE] and the role"
        );
        assert_eq!(l.hash_ids.len(), 3);
        assert_eq!(l.cached_tokens, None);
        assert_eq!(l.lengths, "estimated");
        let text = serde_json::to_string(&l).unwrap();
        assert!(text.contains(r#""cached_tokens":null"#), "{text}");
        let mut whole = Output::default();
        whole.frame(&[b'x'; 656]);
        let f = finished(None, whole);
        assert_eq!(line(&salt, &f, 2048, 4.0).output_length, 100);
        // An unreadable count is no count.
        let invalid = Usage {
            counts: Counts::default(),
            cached: CachedReport::Invalid,
        };
        assert_eq!(
            line(&salt, &finished(Some(invalid), whole), 2048, 4.0).cached_tokens,
            None
        );
        assert_eq!(block_chars(None), 2048);
        assert_eq!(block_chars(Some(3.5)), 1792);
        assert_eq!(block_chars(Some(f64::NAN)), 2048);
    }
}
