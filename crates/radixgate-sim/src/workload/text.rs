//! Deterministic filler text of exact lengths.
//!
//! The simulated worker counts one token per `chars_per_token` Unicode
//! characters (default 4), so a workload that asks for N tokens renders
//! `N * chars_per_token` characters. The text is pronounceable pseudo-words
//! built from syllables, ASCII only (so characters equal bytes), and is a pure
//! function of a key: equal keys give equal text, different keys give
//! different text (with overwhelming probability), and a shorter rendering of
//! a key is a prefix of a longer one — which keeps a partial trace block a
//! prefix of the full block.

use serde::{Deserialize, Serialize};

use super::rng::SplitMix64;

const ONSETS: &[&str] = &[
    "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br",
    "st", "tr", "ch", "sh", "pl", "gr", "th", "qu", "fl", "sk", "dr", "cl", "pr",
];
const NUCLEI: &[&str] = &["a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "y"];
const CODAS: &[&str] = &["", "", "", "n", "r", "s", "t", "l", "m", "x", "nd", "st"];

/// How text lengths relate to tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextShape {
    /// Characters per token (the simulated worker's rule: 4).
    pub chars_per_token: u32,
}

impl Default for TextShape {
    fn default() -> Self {
        Self { chars_per_token: 4 }
    }
}

impl TextShape {
    /// Characters that make `tokens` tokens.
    pub fn chars(&self, tokens: u64) -> usize {
        (tokens * u64::from(self.chars_per_token)) as usize
    }

    /// Filler text of exactly `tokens` tokens for `key`.
    pub fn tokens(&self, key: u64, tokens: u64) -> String {
        filler(key, self.chars(tokens))
    }
}

/// Exactly `len` characters of deterministic pseudo-words for `key`.
pub fn filler(key: u64, len: usize) -> String {
    let mut out = String::with_capacity(len + 16);
    append_filler(&mut out, key, len);
    out
}

/// Appends exactly `len` characters of the filler for `key` to `out`.
pub fn append_filler(out: &mut String, key: u64, len: usize) {
    let target = out.len() + len;
    let mut rng = SplitMix64::new(key);
    let mut words_in_sentence = 0u32;
    while out.len() < target {
        let syllables = 1 + rng.below(3);
        for _ in 0..syllables {
            let r = rng.next_u64();
            out.push_str(ONSETS[(r % ONSETS.len() as u64) as usize]);
            out.push_str(NUCLEI[((r >> 16) % NUCLEI.len() as u64) as usize]);
            out.push_str(CODAS[((r >> 32) % CODAS.len() as u64) as usize]);
        }
        words_in_sentence += 1;
        if words_in_sentence >= 6 && rng.below(4) == 0 {
            out.push_str(". ");
            words_in_sentence = 0;
        } else {
            out.push(' ');
        }
    }
    // Everything pushed is ASCII, so truncating at a byte index is safe.
    out.truncate(target);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn exact_length_ascii_and_prefix_stable() {
        for len in [0, 1, 7, 64, 2048, 5000] {
            let t = filler(42, len);
            assert_eq!(t.chars().count(), len);
            assert!(t.is_ascii());
        }
        let long = filler(9, 4000);
        let short = filler(9, 1234);
        assert!(long.starts_with(&short));
    }

    #[test]
    fn keys_give_distinct_texts() {
        let set: HashSet<String> = (0..5000u64).map(|k| filler(k, 64)).collect();
        assert_eq!(set.len(), 5000);
        assert_eq!(filler(5, 300), filler(5, 300));
    }

    #[test]
    fn token_lengths_follow_the_shape() {
        let shape = TextShape { chars_per_token: 3 };
        assert_eq!(shape.tokens(1, 10).len(), 30);
        assert_eq!(TextShape::default().tokens(1, 512).len(), 2048);
    }
}
