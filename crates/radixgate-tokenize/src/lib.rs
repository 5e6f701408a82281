//! Turn an inference request body into the prompt token ids the engine will
//! compute, so the router can match requests against the engines' KV-cache
//! events (which carry token ids, not text).
//!
//! - [`Tokenizer::load`] reads a `tokenizer.json`, or a model directory with
//!   `tokenizer.json` and optionally `tokenizer_config.json` (chat template,
//!   special tokens) or `chat_template.jinja`.
//! - [`Tokenizer::prompt_tokens`] tokenizes `/v1/chat/completions`,
//!   `/v1/completions` and SGLang `/generate` bodies as vLLM or SGLang
//!   would ([`Engine`]).
//! - [`body_token_ids`] reads ids a body already carries (`/generate`
//!   `input_ids`, a completions prompt of ids) with no tokenizer at all.
//! - With the `testing` feature, [`testing`] trains a small tokenizer in
//!   process and writes a model directory for tests; nothing is downloaded.
//!
//! A [`Tokenizer`] is immutable after load and `Send + Sync`: share one
//! behind an `Arc` and call it from any thread; there are no locks.
//!
//! # Cost per request
//!
//! Measured 2026-12-01 with `cargo bench -p radixgate-tokenize --bench
//! tokenize` (bench profile: release, fat LTO) on the 2-core development
//! machine while other builds ran (load average about 6). Tokenizer: the
//! test tokenizer, byte-level BPE trained in process (asked for 8,000
//! tokens; the synthetic corpus yields 2,009), a 4-role chat template.
//! "CPU" is this thread's CPU time per request, median of 5 runs; "wall" is
//! criterion's median, inflated by the shared cores.
//!
//! | prompt | messages | `prompt_tokens` CPU | wall | of which template render (wall) |
//! |---|---|---|---|---|
//! | 1,007 tokens (5.5 KB) | 6 | 1.68 ms | 2.66 ms | 25 µs |
//! | 8,037 tokens (44 KB) | 36 | 8.26 ms | 18.4 ms | 106 µs |
//! | 31,975 tokens (177 KB) | 134 | 51.0 ms | 83.5 ms | 445 µs |
//!
//! Encoding dominates (the `encode` row of the bench is within noise of the
//! whole); rendering the template is under 1%. That is 3.3-5.4 MB of prompt
//! per CPU-second. The corpus repeats ~150 words, so the BPE word cache
//! always hits: a real model's tokenizer on varied text will not be faster.

mod chat;
mod config;
mod error;
mod post_process;
mod pyjson;
mod request;
mod template;
#[cfg(feature = "testing")]
pub mod testing;

use std::path::Path;

use radixgate_tree::cap_chars;
use serde_json::Value;

pub use error::TokenizeError;
pub use request::{Endpoint, Engine, body_token_ids, flat_token_ids};

use config::ChatConfig;
use request::Prompt;
use template::ChatTemplate;

/// A model's tokenizer and chat template.
#[derive(Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat: Option<ChatTemplate>,
    special_tokens: Vec<(&'static str, String)>,
    engine: Engine,
}

impl Tokenizer {
    /// Load from a `tokenizer.json` file, or from a model directory holding
    /// `tokenizer.json` and optionally `tokenizer_config.json` /
    /// `chat_template.jinja` / `chat_template.json`.
    ///
    /// A lone file has no chat template: chat requests then fail with
    /// [`TokenizeError::NoChatTemplate`]. A template that does not compile
    /// fails here, not on the first request.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TokenizeError> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|source| TokenizeError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let (tokenizer_json, config) = if meta.is_dir() {
            let file = path.join("tokenizer.json");
            if !file.is_file() {
                return Err(TokenizeError::NoTokenizerJson {
                    dir: path.to_path_buf(),
                });
            }
            (file, ChatConfig::load_dir(path)?)
        } else {
            (path.to_path_buf(), ChatConfig::default())
        };
        let bytes = std::fs::read(&tokenizer_json).map_err(|source| TokenizeError::Io {
            path: tokenizer_json.clone(),
            source,
        })?;
        let bad = |source| TokenizeError::BadTokenizer {
            path: tokenizer_json.clone(),
            source,
        };
        let mut inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(bad)?;
        // A file saved after `enable_truncation` / `enable_padding` keeps
        // them, but transformers turns both off on every encode that does
        // not ask for them, so the engines compute the whole prompt,
        // unpadded: so must we, or every match stops at the saved length.
        inner.with_truncation(None).map_err(bad)?;
        inner.with_padding(None);
        post_process::check(&inner).map_err(|reason| bad(reason.into()))?;
        let chat = match config.template {
            Some((source, origin)) => Some(ChatTemplate::compile(source, &origin)?),
            None => None,
        };
        Ok(Self {
            inner,
            chat,
            special_tokens: config.special_tokens,
            engine: Engine::default(),
        })
    }

    /// Follow `engine`'s rules where vLLM and SGLang differ (default vLLM).
    pub fn with_engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// The engine whose rules are followed.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Whether chat requests can be tokenized.
    pub fn has_chat_template(&self) -> bool {
        self.chat.is_some()
    }

    /// The vocabulary size, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The prompt token ids the engine computes for `body` sent to
    /// `endpoint`.
    pub fn prompt_tokens(
        &self,
        endpoint: Endpoint,
        body: &Value,
    ) -> Result<Vec<u32>, TokenizeError> {
        self.prompt_prefix_tokens(endpoint, body, usize::MAX)
    }

    /// [`prompt_tokens`](Self::prompt_tokens) of the prompt's first
    /// `max_chars` characters: the text, as sent or as the chat template
    /// renders it, is cut there before it is encoded (a prompt of token ids,
    /// to its first `max_chars` ids). A router that matches prefixes needs
    /// no more than the prefix it keeps, and encoding costs time and memory
    /// in proportion to the text: a 22 MB chat prompt took a router 9 s of
    /// CPU and 3.3 GB at its peak with the test tokenizer. The tokens of
    /// the cut text are the whole text's up to the last word or so before
    /// the cut.
    pub fn prompt_prefix_tokens(
        &self,
        endpoint: Endpoint,
        body: &Value,
        max_chars: usize,
    ) -> Result<Vec<u32>, TokenizeError> {
        match request::prompt_of(endpoint, body)? {
            Prompt::Ids(mut ids) => {
                ids.truncate(max_chars);
                Ok(ids)
            }
            Prompt::Text {
                text,
                add_special_tokens,
            } => self.encode(cap_chars(text, max_chars), add_special_tokens),
            Prompt::Chat(map) => {
                let (text, add_special_tokens) = self.render(map)?;
                self.encode(cap_chars(&text, max_chars), add_special_tokens)
            }
        }
    }

    /// The prompt text the chat template renders for a chat completion
    /// body (what [`prompt_tokens`](Self::prompt_tokens) then encodes).
    pub fn render_chat(&self, body: &Value) -> Result<String, TokenizeError> {
        let Value::Object(map) = body else {
            return Err(error::invalid("the body must be a JSON object"));
        };
        Ok(self.render(map)?.0)
    }

    /// The rendered prompt, and whether to encode it with special tokens.
    fn render(
        &self,
        body: &serde_json::Map<String, Value>,
    ) -> Result<(String, bool), TokenizeError> {
        let template = self.chat.as_ref().ok_or(TokenizeError::NoChatTemplate)?;
        let prepared = chat::prepare(
            body,
            self.engine,
            template.content_parts(self.engine),
            template.wrapped_tools(),
        )?;
        let context = chat::context_value(&self.special_tokens, prepared.context);
        let mut text = template.render(context)?;
        if let Some(final_message) = &prepared.continue_final {
            text = chat::cut_after_final(&text, final_message)?;
        }
        if let Some(suffix) = &prepared.append {
            text.push_str(suffix);
        }
        Ok((text, prepared.add_special_tokens))
    }

    /// Encode `text`, adding the tokenizer's special tokens (e.g. a BOS) when
    /// `add_special_tokens`. Special-token strings in the text (`<|im_start|>`)
    /// become their ids either way.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(TokenizeError::Encode)?;
        Ok(encoding.get_ids().to_vec())
    }
}

#[cfg(test)]
mod tests {
    /// The router shares one tokenizer across its request tasks.
    #[test]
    fn tokenizer_is_send_and_sync() {
        fn shared<T: Send + Sync + 'static>() {}
        shared::<super::Tokenizer>();
        shared::<super::TokenizeError>();
    }
}
