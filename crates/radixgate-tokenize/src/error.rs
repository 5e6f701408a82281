//! The crate's one error type.
//!
//! Every variant says where the fault lies ([`TokenizeError::is_client_error`]):
//! a request the engine would also reject (bad body, a template's
//! `raise_exception`) is the client's; a tokenizer or template that does not
//! load is the operator's. None of these are retryable: tokenizing is a pure
//! function of the body and the files.

use std::path::PathBuf;

/// Why a tokenizer could not be loaded or a request could not be tokenized.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizeError {
    /// A file could not be read (missing, unreadable).
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A directory was given that holds no `tokenizer.json`.
    #[error(
        "{} holds no tokenizer.json: pass a tokenizer.json file or a model directory that has one",
        dir.display()
    )]
    NoTokenizerJson {
        /// The directory.
        dir: PathBuf,
    },
    /// `tokenizer.json` did not parse as a tokenizer.
    #[error("{} is not a valid tokenizer.json: {source}", path.display())]
    BadTokenizer {
        /// The file.
        path: PathBuf,
        /// What the `tokenizers` crate said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `tokenizer_config.json` (or `chat_template.json`) is malformed.
    #[error("{}: {reason}", path.display())]
    BadConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The chat template does not compile.
    #[error("chat template from {} does not compile: {source:#}", origin.display())]
    TemplateSyntax {
        /// The file the template came from.
        origin: PathBuf,
        /// The template engine's error (with line).
        #[source]
        source: minijinja::Error,
    },
    /// A chat request came for a tokenizer that has no chat template.
    #[error(
        "no chat template: /v1/chat/completions cannot be tokenized; load a model directory \
         whose tokenizer_config.json has `chat_template` (or that has chat_template.jinja)"
    )]
    NoChatTemplate,
    /// The chat template failed while rendering this request (including its
    /// own `raise_exception`, e.g. "roles must alternate").
    #[error("chat template failed on this request: {0:#}")]
    TemplateRender(#[source] minijinja::Error),
    /// The body is not what the endpoint accepts.
    #[error("invalid request body: {0}")]
    InvalidBody(String),
    /// A valid request that this crate does not tokenize (batches, embeddings).
    #[error("not supported for token matching: {0}")]
    Unsupported(&'static str),
    /// The body carries text, and no tokenizer was given to turn it into ids.
    #[error("this request carries text, and no tokenizer is loaded to turn it into token ids")]
    NeedsTokenizer,
    /// The tokenizer failed on the text.
    #[error("tokenizer failed to encode the prompt: {0}")]
    Encode(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl TokenizeError {
    /// Whether the request itself is at fault (an engine would reject it
    /// too), as opposed to the tokenizer files or this crate.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            Self::TemplateRender(_) | Self::InvalidBody(_) | Self::Unsupported(_)
        )
    }
}

pub(crate) fn invalid(reason: impl Into<String>) -> TokenizeError {
    TokenizeError::InvalidBody(reason.into())
}
