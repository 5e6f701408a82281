//! A small real tokenizer made in process, for tests and benches across the
//! workspace: nothing is downloaded, ever.
//!
//! [`TestModel::write`] trains a byte-level BPE (GPT-2 style pre-tokenizer,
//! the `tokenizers` crate's own trainer) on a synthetic corpus of English
//! words, and writes a model directory like a Hugging Face checkpoint's:
//! `tokenizer.json` (with a `<|bos|>`-adding post-processor, like Llama's)
//! and `tokenizer_config.json` (a chat template, `bos_token` as a string and
//! `eos_token` as an AddedToken object). Training is deterministic, so a
//! router and a simulated worker given the same [`TestModel`] get the same
//! tokenizer; each distinct model is trained once per process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, TokenizerImpl};

use crate::TokenizeError;

/// The special tokens of the test tokenizer (ids 0.. in this order).
pub const SPECIAL_TOKENS: [&str; 7] = [
    "<|bos|>",
    "<|eos|>",
    "<|end|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
];

/// The test chat template: a `<|bos|>`, then each message as
/// `<|role|>\ncontent<|end|>\n`, tools (if any) as a system turn of JSON
/// first, and `<|assistant|>\n` as the generation prompt. Unknown roles are
/// refused with `raise_exception`, as real templates do.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}\
{% if tools %}<|system|>\nTools: {{ tools | tojson }}<|end|>\n{% endif %}\
{% for message in messages %}\
{% if message.role not in ['system', 'user', 'assistant', 'tool'] %}\
{{ raise_exception('unknown role: ' ~ message.role) }}\
{% endif %}\
<|{{ message.role }}|>\n{{ message.content }}<|end|>\n\
{% endfor %}\
{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

/// ChatML, rendered exactly as the simulated worker renders chat messages
/// (`radixgate_sim::tokens::render_chat`): a router with this template and
/// a simulated worker with the same tokenizer compute the same prompt ids,
/// as a real router and engine sharing a model directory do.
pub const CHATML_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Which tokenizer to make.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TestModel {
    /// Vocabulary size the BPE trainer aims for (specials included).
    pub vocab_size: usize,
    /// Words of synthetic corpus to train on.
    pub corpus_words: usize,
    /// `chat_template` in `tokenizer_config.json`; `None` writes a config
    /// without one.
    pub chat_template: Option<String>,
}

impl Default for TestModel {
    fn default() -> Self {
        Self {
            vocab_size: 1_000,
            corpus_words: 20_000,
            chat_template: Some(CHAT_TEMPLATE.to_owned()),
        }
    }
}

impl TestModel {
    /// Write `tokenizer.json` and `tokenizer_config.json` into `dir`
    /// (created if missing).
    pub fn write(&self, dir: &Path) -> Result<(), TokenizeError> {
        std::fs::create_dir_all(dir).map_err(|source| io(dir, source))?;
        let json = trained_json(self.vocab_size, self.corpus_words)?;
        let file = dir.join("tokenizer.json");
        std::fs::write(&file, json.as_bytes()).map_err(|source| io(&file, source))?;
        let mut config = serde_json::json!({
            "bos_token": "<|bos|>",
            "eos_token": {"content": "<|eos|>", "lstrip": false, "normalized": false,
                          "rstrip": false, "single_word": false, "special": true},
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast",
        });
        if let Some(t) = &self.chat_template {
            config["chat_template"] = serde_json::Value::String(t.clone());
        }
        let file = dir.join("tokenizer_config.json");
        let text = serde_json::to_string_pretty(&config).expect("a JSON value serializes");
        std::fs::write(&file, text).map_err(|source| io(&file, source))?;
        Ok(())
    }

    /// [`write`](Self::write) into a fresh temporary directory that is
    /// removed when the returned guard drops.
    pub fn write_temp(&self) -> Result<TempDir, TokenizeError> {
        let dir = TempDir::new()?;
        self.write(dir.path())?;
        Ok(dir)
    }
}

/// A directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Create a new empty directory with a unique name.
    pub fn new() -> Result<Self, TokenizeError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "radixgate-tokenize-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).map_err(|source| io(&path, source))?;
        Ok(Self(path))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn io(path: &Path, source: std::io::Error) -> TokenizeError {
    TokenizeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Deterministic pseudo-English text: `words` words drawn from a fixed list
/// with a seeded generator, with punctuation and line breaks.
pub fn sample_text(words: usize, seed: u64) -> String {
    const WORDS: &[&str] = &[
        "the",
        "of",
        "and",
        "to",
        "in",
        "a",
        "is",
        "that",
        "for",
        "it",
        "as",
        "was",
        "with",
        "be",
        "by",
        "on",
        "not",
        "he",
        "this",
        "are",
        "or",
        "his",
        "from",
        "at",
        "which",
        "but",
        "have",
        "an",
        "had",
        "they",
        "you",
        "were",
        "their",
        "one",
        "all",
        "we",
        "can",
        "her",
        "has",
        "there",
        "been",
        "if",
        "more",
        "when",
        "will",
        "would",
        "who",
        "so",
        "no",
        "cache",
        "router",
        "request",
        "token",
        "prefix",
        "worker",
        "model",
        "server",
        "latency",
        "memory",
        "queue",
        "batch",
        "prompt",
        "engine",
        "event",
        "block",
        "tree",
        "match",
        "hit",
        "rate",
        "time",
        "first",
        "load",
        "balance",
        "inference",
        "attention",
        "layer",
        "weight",
        "value",
        "key",
        "page",
        "evict",
        "store",
        "remove",
        "hash",
        "chain",
        "parent",
        "sequence",
        "number",
        "stream",
        "replay",
        "socket",
        "publisher",
        "subscriber",
        "topic",
        "message",
        "frame",
        "payload",
        "timestamp",
        "rank",
        "medium",
        "gpu",
        "cpu",
        "disk",
        "network",
        "question",
        "answer",
        "system",
        "user",
        "assistant",
        "tool",
        "function",
        "call",
        "weather",
        "city",
        "today",
        "tomorrow",
        "yesterday",
        "because",
        "however",
        "therefore",
        "although",
        "perhaps",
        "important",
        "different",
        "following",
        "example",
        "information",
        "available",
        "possible",
        "international",
        "development",
        "understanding",
        "responsibility",
        "characteristics",
        "implementation",
    ];
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut out = String::with_capacity(words * 7);
    let mut sentence_start = true;
    for i in 0..words {
        let r = next();
        let word = WORDS[(r % WORDS.len() as u64) as usize];
        if i > 0 {
            out.push(if r % 97 == 0 { '\n' } else { ' ' });
        }
        if sentence_start {
            let mut chars = word.chars();
            if let Some(c) = chars.next() {
                out.extend(c.to_uppercase());
                out.push_str(chars.as_str());
            }
        } else {
            out.push_str(word);
        }
        sentence_start = false;
        match (r >> 32) % 23 {
            0 | 1 => {
                out.push('.');
                sentence_start = true;
            }
            2 => out.push(','),
            3 => out.push_str(&format!(" {}", (r >> 40) % 1000)),
            _ => {}
        }
    }
    out
}

type Cache = Mutex<HashMap<(usize, usize), Arc<OnceLock<Result<String, String>>>>>;

/// The trained tokenizer as `tokenizer.json` text, trained once per
/// (vocabulary, corpus) in this process.
fn trained_json(vocab_size: usize, corpus_words: usize) -> Result<String, TokenizeError> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cell = {
        let mut cache = CACHE
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Arc::clone(cache.entry((vocab_size, corpus_words)).or_default())
    };
    cell.get_or_init(|| train(vocab_size, corpus_words).map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| TokenizeError::Encode(e.into()))
}

fn train(vocab_size: usize, corpus_words: usize) -> tokenizers::Result<String> {
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(
            SPECIAL_TOKENS
                .iter()
                .map(|t| AddedToken::from(*t, true))
                .collect(),
        )
        .build();
    let mut tokenizer: TokenizerImpl<
        BPE,
        NormalizerWrapper,
        ByteLevel,
        TemplateProcessing,
        ByteLevel,
    > = TokenizerImpl::new(BPE::default());
    tokenizer
        .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
        .with_decoder(Some(ByteLevel::default()));
    // The corpus breaks lines about every 100 words; each line is one
    // training sequence.
    let corpus = sample_text(corpus_words, 7);
    let lines: Vec<&str> = corpus.split('\n').collect();
    tokenizer.train(&mut trainer, lines.into_iter())?;
    let bos = tokenizer
        .token_to_id("<|bos|>")
        .ok_or("the trainer lost <|bos|>")?;
    let post = TemplateProcessing::builder()
        .try_single("<|bos|> $A")
        .map_err(|e| e.to_string())?
        .try_pair("<|bos|> $A $B:1")
        .map_err(|e| e.to_string())?
        .special_tokens(vec![("<|bos|>", bos)])
        .build()?;
    tokenizer.with_post_processor(Some(post));
    let tokenizer: tokenizers::Tokenizer = tokenizer.into();
    tokenizer.to_string(false)
}
