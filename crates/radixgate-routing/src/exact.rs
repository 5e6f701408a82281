//! Exact prefix matches: what the engines themselves say they hold.
//!
//! Engines that publish KV-cache events (SGLang, vLLM) let the gateway keep
//! an exact index of each worker's cached blocks. For one request the
//! gateway tokenizes the prompt, keys its blocks and asks that index how
//! many of the prompt's tokens each worker holds as a prefix; the answer
//! reaches a policy as [`ExactMatches`] in the [`RequestView`]. Only workers
//! whose event stream is live are in it (with 0 when they hold nothing of
//! the prompt): for every other worker the policy keeps using its own tree,
//! the approximate guess, so a dead or stale stream falls back per worker.
//!
//! The decision rule is unchanged: a worker's exact match, in tokens, is
//! turned into characters of the routing text in proportion (`matched /
//! input_tokens * input_chars`), and from there on it is treated like a
//! tree match (threshold, holders, cost model). The tree is still updated
//! on every decision, so a stream that dies leaves a fresh guess behind.
//!
//! [`RequestView`]: crate::RequestView

use crate::WorkerId;

/// Per-worker exact matches of one request's prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExactMatches<'a> {
    /// Tokens in the request's prompt.
    pub input_tokens: usize,
    /// Every worker with a live event stream, in ascending id order, with
    /// the prompt tokens it holds as a prefix (whole blocks).
    pub live: &'a [(WorkerId, usize)],
}

impl ExactMatches<'_> {
    /// Prompt tokens `worker` holds, if its stream is live.
    pub fn tokens(&self, worker: WorkerId) -> Option<usize> {
        self.live
            .binary_search_by_key(&worker, |&(id, _)| id)
            .ok()
            .map(|k| self.live[k].1.min(self.input_tokens))
    }

    /// The same match in characters of a routing text of `input_chars`
    /// characters, if the worker's stream is live.
    pub fn chars(&self, worker: WorkerId, input_chars: usize) -> Option<usize> {
        let tokens = self.tokens(worker)?;
        if self.input_tokens == 0 {
            return Some(0);
        }
        // u128: a 2^26-char text times a 2^20-token prompt overflows no u64,
        // but the product is cheap either way and never wraps.
        let chars = tokens as u128 * input_chars as u128 / self.input_tokens as u128;
        Some(chars as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_workers_answer_and_others_fall_back() {
        let live = [(WorkerId(1), 32), (WorkerId(4), 0), (WorkerId(7), 64)];
        let m = ExactMatches {
            input_tokens: 64,
            live: &live,
        };
        assert_eq!(m.tokens(WorkerId(1)), Some(32));
        assert_eq!(m.tokens(WorkerId(4)), Some(0));
        assert_eq!(m.tokens(WorkerId(2)), None);
        assert_eq!(m.chars(WorkerId(1), 256), Some(128));
        assert_eq!(m.chars(WorkerId(7), 256), Some(256));
        assert_eq!(m.chars(WorkerId(3), 256), None);
    }

    #[test]
    fn a_match_never_exceeds_the_prompt() {
        let live = [(WorkerId(1), 100)];
        let m = ExactMatches {
            input_tokens: 10,
            live: &live,
        };
        assert_eq!(m.tokens(WorkerId(1)), Some(10));
        assert_eq!(m.chars(WorkerId(1), 40), Some(40));
        let empty = ExactMatches {
            input_tokens: 0,
            live: &live,
        };
        assert_eq!(empty.chars(WorkerId(1), 40), Some(0));
    }
}
