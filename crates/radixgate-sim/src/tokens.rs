//! Prefix-stable tokenization, chat rendering and deterministic replies.
//!
//! The simulated worker needs token counts and token identities that behave
//! like a real tokenizer where routing cares: the tokens of a text prefix are
//! a prefix of the text's tokens. The rule: a token is a run of
//! `chars_per_token` consecutive Unicode scalar values (the last run may be
//! shorter) and its id is a fixed 64-bit hash of that run. Only a trailing
//! partial run can differ between a prefix and the full text.
//!
//! Chat requests are rendered to one text the way a chat template would
//! (role markers and turn boundaries), so turn N+1's text extends turn N's
//! prompt plus its reply. Replies are pseudo-text seeded from the prompt, with
//! exactly the requested number of tokens. Everything here is pure.
//!
//! [`TokenSource`] is the seam for a real tokenizer: the worker turns
//! prompts into the token ids its engine, cache and KV events see only
//! through it, so a tokenizer built from a `tokenizer.json` can stand in
//! for the simulated one (replies stay simulated text).

use crate::error::SimError;

/// Default number of characters per token (about what BPE tokenizers give
/// on English text).
pub const DEFAULT_CHARS_PER_TOKEN: usize = 4;

/// Where a worker's prompt token ids come from.
pub trait TokenSource: Send + Sync + std::fmt::Debug {
    /// The token ids of `text`.
    fn tokenize(&self, text: &str) -> Vec<u64>;

    /// The number of tokens of `text`.
    fn count(&self, text: &str) -> usize {
        self.tokenize(text).len()
    }

    /// The engine's token ids for a prompt given as ids (SGLang
    /// `input_ids`): the ids as given, as a real engine takes them (so KV
    /// events carry the client's ids).
    fn prompt_ids(&self, ids: &[u64]) -> Vec<u64> {
        ids.to_vec()
    }
}

impl TokenSource for Tokenizer {
    fn tokenize(&self, text: &str) -> Vec<u64> {
        Tokenizer::tokenize(self, text)
    }

    fn count(&self, text: &str) -> usize {
        Tokenizer::count(self, text)
    }
}

/// A model's own tokenizer (`radixgate worker --tokenizer`): the worker's
/// prompt text encoded with it, as an engine encodes the text its chat
/// template rendered (no special tokens added again), so a router with the
/// same tokenizer and a template that renders as [`render_chat`] does
/// computes the same ids.
#[derive(Debug)]
pub struct ModelTokens(pub radixgate_tokenize::Tokenizer);

impl TokenSource for ModelTokens {
    fn tokenize(&self, text: &str) -> Vec<u64> {
        match self.0.encode(text, false) {
            Ok(ids) => ids.into_iter().map(u64::from).collect(),
            Err(err) => {
                // Not expected for text the worker rendered itself; the
                // request is then served as if empty of prompt tokens.
                tracing::warn!(error = %err, "worker: the tokenizer failed on a prompt");
                Vec::new()
            }
        }
    }
}

/// The fixed text tokenizer: `chars_per_token` characters per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokenizer {
    chars_per_token: usize,
}

impl Default for Tokenizer {
    fn default() -> Self {
        Self {
            chars_per_token: DEFAULT_CHARS_PER_TOKEN,
        }
    }
}

impl Tokenizer {
    /// A tokenizer with `chars_per_token` characters per token (1..=64).
    pub fn new(chars_per_token: usize) -> Result<Self, SimError> {
        if !(1..=64).contains(&chars_per_token) {
            return Err(SimError::Config(format!(
                "chars_per_token must be in 1..=64, got {chars_per_token}"
            )));
        }
        Ok(Self { chars_per_token })
    }

    /// Characters per token.
    pub fn chars_per_token(&self) -> usize {
        self.chars_per_token
    }

    /// The token ids of `text`.
    pub fn tokenize(&self, text: &str) -> Vec<u64> {
        let mut out = Vec::with_capacity(text.len() / self.chars_per_token + 1);
        let mut hash = FNV_OFFSET;
        let mut in_chunk = 0;
        for ch in text.chars() {
            let mut buf = [0u8; 4];
            for b in ch.encode_utf8(&mut buf).bytes() {
                hash = (hash ^ u64::from(b)).wrapping_mul(FNV_PRIME);
            }
            in_chunk += 1;
            if in_chunk == self.chars_per_token {
                out.push(finish(hash));
                hash = FNV_OFFSET;
                in_chunk = 0;
            }
        }
        if in_chunk > 0 {
            out.push(finish(hash));
        }
        out
    }

    /// The number of tokens of `text` without materialising them.
    pub fn count(&self, text: &str) -> usize {
        text.chars().count().div_ceil(self.chars_per_token)
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A final avalanche so that ids spread over all 64 bits (splitmix64's).
fn finish(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A stable 64-bit hash of a text (the seed of its reply).
pub fn text_hash(text: &str) -> u64 {
    let mut hash = FNV_OFFSET;
    for b in text.bytes() {
        hash = (hash ^ u64::from(b)).wrapping_mul(FNV_PRIME);
    }
    finish(hash)
}

/// One chat message after parsing: a role and its text content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The message's text (multi-part content already joined).
    pub content: String,
}

/// Renders a conversation the way a ChatML-style template would: each
/// message is `<|im_start|>{role}\n{content}<|im_end|>\n`, then the
/// generation prompt `<|im_start|>assistant\n`. So the rendering of a
/// conversation extended by the reply and a new user turn starts with the
/// previous rendering followed by the reply.
pub fn render_chat(messages: &[ChatMessage]) -> String {
    let mut out = String::with_capacity(
        messages
            .iter()
            .map(|m| m.content.len() + m.role.len() + 24)
            .sum::<usize>()
            + 24,
    );
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

/// A deterministic reply of exactly `tokens` tokens (`tokens *
/// chars_per_token` ASCII characters: lower-case pseudo-words and spaces),
/// seeded by `seed`.
pub fn reply_text(seed: u64, tokens: usize, tokenizer: &Tokenizer) -> String {
    let len = tokens * tokenizer.chars_per_token();
    let mut out = String::with_capacity(len);
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut word_left = 0u64;
    while out.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let r = finish(state);
        if word_left == 0 {
            if !out.is_empty() {
                out.push(' ');
                word_left = 2 + r % 7;
                continue;
            }
            word_left = 2 + r % 7;
        }
        out.push(char::from(b'a' + (r >> 8) as u8 % 26));
        word_left -= 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn chunks_of_four_chars_and_partial_tail() {
        let t = Tokenizer::default();
        assert_eq!(t.tokenize("").len(), 0);
        assert_eq!(t.tokenize("abcd").len(), 1);
        assert_eq!(t.tokenize("abcde").len(), 2);
        assert_eq!(t.count("abcde"), 2);
        // Unicode scalar values, not bytes.
        assert_eq!(t.tokenize("ééééé").len(), 2);
        assert_eq!(t.tokenize("abcd")[0], t.tokenize("abcdxyz")[0]);
        assert_ne!(t.tokenize("abcd")[0], t.tokenize("abce")[0]);
    }

    #[test]
    fn rejects_zero_chars_per_token() {
        assert!(Tokenizer::new(0).is_err());
        assert!(Tokenizer::new(65).is_err());
    }

    #[test]
    fn chat_turns_extend_previous_prompt_and_reply() {
        let t = Tokenizer::default();
        let turn1 = vec![ChatMessage {
            role: "user".into(),
            content: "hello there".into(),
        }];
        let p1 = render_chat(&turn1);
        let reply = reply_text(text_hash(&p1), 10, &t);
        assert_eq!(t.count(&reply), 10);
        let mut turn2 = turn1.clone();
        turn2.push(ChatMessage {
            role: "assistant".into(),
            content: reply.clone(),
        });
        turn2.push(ChatMessage {
            role: "user".into(),
            content: "and more".into(),
        });
        let p2 = render_chat(&turn2);
        assert!(p2.starts_with(&format!("{p1}{reply}")));
    }

    proptest! {
        #[test]
        fn tokens_are_prefix_stable(text in "\\PC{0,200}", cut in 0usize..200, cpt in 1usize..8) {
            let t = Tokenizer::new(cpt).unwrap();
            let chars: Vec<char> = text.chars().collect();
            let cut = cut.min(chars.len());
            let prefix: String = chars[..cut].iter().collect();
            let full = t.tokenize(&text);
            let pre = t.tokenize(&prefix);
            // Every complete token of the prefix is a token of the full text.
            let complete = cut / cpt;
            prop_assert_eq!(&pre[..complete], &full[..complete]);
            prop_assert_eq!(pre.len(), t.count(&prefix));
        }

        #[test]
        fn replies_have_exact_token_counts(seed: u64, n in 0usize..300, cpt in 1usize..8) {
            let t = Tokenizer::new(cpt).unwrap();
            let r = reply_text(seed, n, &t);
            prop_assert_eq!(t.count(&r), n);
            prop_assert_eq!(r.len(), n * cpt);
            prop_assert_eq!(r, reply_text(seed, n, &t));
        }
    }

    #[test]
    fn ids_pass_through_and_the_trait_agrees_with_the_tokenizer() {
        let t = Tokenizer::new(3).unwrap();
        let src: &dyn TokenSource = &t;
        assert_eq!(src.prompt_ids(&[7, 1, 7]), vec![7, 1, 7]);
        assert_eq!(src.tokenize("hello world"), t.tokenize("hello world"));
        assert_eq!(src.count("hello world"), 4);
    }
}
