//! How to reach a worker: the one [`WorkerSpec`] and the one rule for its
//! URL, [`WorkerUrl`].
//!
//! Every way a worker enters the router — the config file, `--worker-urls`,
//! the admin API, the offline simulator, tests — describes it with this
//! spec, so there is one shape to deserialize and one place that decides
//! which URLs are acceptable and how two spellings of one URL compare. The
//! gateway checks a URL with [`WorkerUrl::parse`] when it is configured or
//! posted; the [`Registry`](crate::Registry) checks it again on admission,
//! and lookups by URL use [`WorkerUrl::canonical`].
//!
//! The syntax check leans on the `http` crate's URI grammar (types only: no
//! I/O enters this crate through it), so a URL accepted here is one the
//! gateway's HTTP client can be given. A stricter rule later (say, exactly
//! `scheme://host:port`) is a change to [`WorkerUrl::parse`] alone.

use crate::RoutingError;
use serde::{Deserialize, Serialize};
use std::borrow::Borrow;
use std::fmt;

/// How to reach a worker and what it serves; the input to
/// [`Registry::add`](crate::Registry::add).
///
/// In a config file (or a `POST /workers` body) an entry is either a bare
/// URL string or `{url, api_key?, models?}`; unknown keys are errors.
/// Health on admission is not part of that schema.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "form::WorkerSpec")]
pub struct WorkerSpec {
    /// Base URL as given, e.g. `http://10.0.0.5:30000`; a trailing `/` is
    /// dropped when the worker is built.
    pub url: String,
    /// Models served. Empty means "whatever is asked": the worker joins the
    /// wildcard pool used when no worker names the requested model. (The
    /// gateway asks the worker when the operator lists none.)
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Bearer key the gateway sends to this worker, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Health on admission. The gateway admits workers once its probes
    /// pass; the simulator admits them healthy.
    #[serde(skip)]
    pub healthy: bool,
}

impl WorkerSpec {
    /// A healthy worker at `url` serving any model, without an API key.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            models: Vec::new(),
            api_key: None,
            healthy: true,
        }
    }

    /// Sets the models served.
    pub fn with_models<I, S>(mut self, models: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.models = models.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the API key sent to the worker.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets the health on admission.
    pub fn with_health(mut self, healthy: bool) -> Self {
        self.healthy = healthy;
        self
    }
}

/// The two spellings a worker entry may take in a file or request body. The
/// enum is called `WorkerSpec` because serde names it in a mismatch ("did
/// not match any variant of untagged enum WorkerSpec"), as the entry is
/// called in the docs.
mod form {
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(untagged)]
    pub(super) enum WorkerSpec {
        /// Just the base URL.
        Url(String),
        /// The URL with its settings.
        Full(Full),
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Full {
        pub(super) url: String,
        #[serde(default)]
        pub(super) api_key: Option<String>,
        #[serde(default)]
        pub(super) models: Vec<String>,
    }
}

impl From<form::WorkerSpec> for WorkerSpec {
    fn from(form: form::WorkerSpec) -> Self {
        match form {
            form::WorkerSpec::Url(url) => Self::new(url),
            form::WorkerSpec::Full(form::Full {
                url,
                api_key,
                models,
            }) => Self {
                api_key,
                ..Self::new(url).with_models(models)
            },
        }
    }
}

/// A worker's base URL that passed the one URL rule, in canonical form
/// (no trailing `/`), so two spellings of one worker compare equal.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerUrl(String);

impl WorkerUrl {
    /// Checks `text` as a worker's base URL and returns its canonical form.
    ///
    /// Accepted: `http://` or `https://`, a host (a name, an IPv4 address or
    /// a bracketed IPv6 address), an optional port that fits in 16 bits,
    /// then anything the URI grammar allows; no whitespace anywhere. A
    /// rejection is [`RoutingError::InvalidWorker`] carrying `text` as given
    /// and the reason.
    pub fn parse(text: &str) -> Result<Self, RoutingError> {
        check(text).map_err(|reason| RoutingError::InvalidWorker {
            url: text.to_owned(),
            reason,
        })?;
        Ok(Self(Self::canonical(text).to_owned()))
    }

    /// The canonical spelling of `text`, without checking it: trailing `/`s
    /// dropped. For looking a worker up by a URL a caller typed, where an
    /// unparsable URL should simply match nothing.
    pub fn canonical(text: &str) -> &str {
        text.trim_end_matches('/')
    }

    /// The canonical URL.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Equality, order and hash are those of the canonical string, so a map
/// keyed by `WorkerUrl` can be looked up with a `&str` in canonical form.
impl Borrow<str> for WorkerUrl {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for WorkerUrl {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<WorkerUrl> for String {
    fn from(url: WorkerUrl) -> Self {
        url.0
    }
}

/// The URL rule; `Err` is the reason, phrased to follow "invalid worker
/// `<url>`: ".
fn check(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or("the URL must start with http:// or https://")?;
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed
                .split_once(']')
                .ok_or("the URL has an unclosed `[`")?;
            if !(after.is_empty() || after.starts_with(':')) {
                return Err("the URL has text after its IPv6 address".into());
            }
            (host, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err("the URL has no host".into());
    }
    if let Some(port) = port
        && port.parse::<u16>().is_err()
    {
        return Err(format!("the URL has a bad port `{port}`"));
    }
    if url.chars().any(char::is_whitespace) {
        return Err("the URL contains whitespace".into());
    }
    url.parse::<http::Uri>()
        .map_err(|e| format!("the URL is not valid: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_urls_come_out_canonical() {
        for (given, canonical) in [
            ("http://a", "http://a"),
            ("http://a:80/", "http://a:80"),
            ("https://a.b/c", "https://a.b/c"),
            ("http://[::1]:8000//", "http://[::1]:8000"),
            ("http://[::1]", "http://[::1]"),
            ("http://sim-0", "http://sim-0"),
        ] {
            let url = WorkerUrl::parse(given).unwrap_or_else(|e| panic!("{given}: {e}"));
            assert_eq!(url.as_str(), canonical);
            assert_eq!(WorkerUrl::canonical(given), canonical);
        }
    }

    #[test]
    fn rejected_urls_say_why() {
        for (bad, why) in [
            ("a:80", "must start with http:// or https://"),
            ("ftp://a", "must start with http:// or https://"),
            (" http://a", "must start with http:// or https://"),
            ("http://", "no host"),
            ("http://:80", "no host"),
            ("http://a:99999", "bad port `99999`"),
            ("http://[::1", "unclosed `[`"),
            ("http://[::1]x", "text after its IPv6 address"),
            ("http://a b", "whitespace"),
            ("http://a/b c", "whitespace"),
            ("http://a/\u{1}", "not valid"),
        ] {
            match WorkerUrl::parse(bad) {
                Err(RoutingError::InvalidWorker { url, reason }) => {
                    assert_eq!(url, bad);
                    assert!(reason.contains(why), "{bad}: {reason}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn entries_are_a_url_or_a_table() {
        let specs: Vec<WorkerSpec> = serde_json::from_str(
            r#"["http://a:1", {"url": "http://b:2", "api_key": "k", "models": ["m"]}]"#,
        )
        .unwrap();
        assert_eq!(specs[0], WorkerSpec::new("http://a:1"));
        assert_eq!(
            specs[1],
            WorkerSpec::new("http://b:2")
                .with_models(["m"])
                .with_api_key("k")
        );
        let err = serde_json::from_str::<WorkerSpec>(r#"{"url": "http://a", "modles": ["m"]}"#)
            .unwrap_err();
        assert!(
            err.to_string().contains("untagged enum WorkerSpec"),
            "{err}"
        );
        assert!(
            serde_json::from_str::<WorkerSpec>(r#"{"url": "http://a", "healthy": true}"#).is_err()
        );
    }
}
