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
//! The rule is deliberately narrow: `http://` or `https://`, a host (a DNS
//! name, an IPv4 address or a bracketed IPv6 address) and an optional port,
//! nothing else. A worker URL names a server, not a resource on it, so
//! userinfo (`user:pass@`), a path, a query or a fragment are refused: a
//! URL that carries them is a mistake at best and, posted to the admin API,
//! a way to aim the router's requests somewhere unexpected. The parser is
//! hand-written for exactly that grammar, so this crate stays free of HTTP
//! types and nothing looser slips through a general URI parser.

use crate::RoutingError;
use serde::{Deserialize, Serialize};
use std::borrow::{Borrow, Cow};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Range;

/// How to reach a worker and what it serves; the input to
/// [`Registry::add`](crate::Registry::add).
///
/// In a config file (or a `POST /workers` body) an entry is either a bare
/// URL string or `{url, api_key?, api_key_env?, models?, role?,
/// bootstrap_port?, kv_capacity_tokens?}`; unknown keys are errors.
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
    /// The environment variable that holds the key instead (a config file
    /// then names only the variable, which a Kubernetes Secret can fill);
    /// the gateway reads it into `api_key` when it loads the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Health on admission. The gateway admits workers once its probes
    /// pass; the simulator admits them healthy.
    #[serde(skip)]
    pub healthy: bool,
    /// The name decisions, logs and `/workers` use, when the source knows
    /// a better one than the URL's `host:port` (discovery: the pod's name).
    /// Not part of the file or admin schema.
    #[serde(skip)]
    pub name: Option<String>,
    /// What the worker does in a prefill/decode disaggregated pool
    /// ([`WorkerRole`]); regular workers do both.
    #[serde(skip_serializing_if = "WorkerRole::is_regular")]
    pub role: WorkerRole,
    /// A prefill worker's bootstrap port (SGLang's
    /// `--disaggregation-bootstrap-port`), sent to decode workers as
    /// `bootstrap_port`; `None` sends JSON null.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
    /// Tokens the worker's KV cache holds (SGLang's
    /// `max_total_num_tokens`). The gateway asks the worker when the
    /// operator gives none; prefix policies keep the worker's share of
    /// their tree within it (`routing.correction.capacity_bound`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_capacity_tokens: Option<u64>,
    /// The longest context, in tokens, the worker serves (vLLM's and
    /// SGLang's `max_model_len`), as its `/v1/models` says when the
    /// gateway asks it for its models. Not part of the file or admin
    /// schema.
    #[serde(skip)]
    pub max_model_len: Option<u64>,
    /// What the worker's `/v1/models` says of each model besides its
    /// name (a LoRA adapter's base model and path), for the models it
    /// says it of. Not part of the file or admin schema.
    #[serde(skip)]
    pub origins: BTreeMap<String, ModelOrigin>,
}

/// What an engine's `/v1/models` entry says of a model besides its id.
///
/// vLLM (with `--enable-lora`) and SGLang list each LoRA adapter loaded
/// as a model of its own, with `parent`, the id of the base model it
/// adapts, and `root`, where it was loaded from; a base model's entry
/// has no `parent`, and its `root` is the model's own path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelOrigin {
    /// The base model an adapter adapts; `None` for a base model.
    pub parent: Option<String>,
    /// The path or name the model was loaded from, where the worker says.
    pub root: Option<String>,
}

impl ModelOrigin {
    /// Whether this is a LoRA adapter's entry: it names a parent.
    pub fn is_adapter(&self) -> bool {
        self.parent.is_some()
    }
}

/// A worker's part in serving a request.
///
/// In a disaggregated pool a **prefill** worker computes the prompt's KV
/// cache and a **decode** worker generates from it once the cache has
/// moved; each request goes to one of each. A **regular** worker does
/// both (a co-located pool, and every pool outside PD mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerRole {
    /// Prefill and decode on one worker.
    #[default]
    Regular,
    /// Computes prompts; its KV moves to a decode worker.
    Prefill,
    /// Generates from KV a prefill worker computed.
    Decode,
}

impl WorkerRole {
    /// All roles, in index order ([`Self::index`]).
    pub const ALL: [WorkerRole; 3] = [Self::Regular, Self::Prefill, Self::Decode];

    /// A stable label (metrics, `/workers`, config).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Regular => "regular",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }

    /// Position in [`Self::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether this is the co-located role (the default).
    pub fn is_regular(&self) -> bool {
        *self == Self::Regular
    }
}

impl fmt::Display for WorkerRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl WorkerSpec {
    /// A healthy worker at `url` serving any model, without an API key.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            models: Vec::new(),
            api_key: None,
            api_key_env: None,
            healthy: true,
            name: None,
            role: WorkerRole::Regular,
            bootstrap_port: None,
            kv_capacity_tokens: None,
            max_model_len: None,
            origins: BTreeMap::new(),
        }
    }

    /// Sets the worker's role in a disaggregated pool.
    pub fn with_role(mut self, role: WorkerRole) -> Self {
        self.role = role;
        self
    }

    /// Sets a prefill worker's bootstrap port.
    pub fn with_bootstrap_port(mut self, port: Option<u16>) -> Self {
        self.bootstrap_port = port;
        self
    }

    /// Sets the tokens the worker's KV cache holds.
    pub fn with_kv_capacity_tokens(mut self, tokens: Option<u64>) -> Self {
        self.kv_capacity_tokens = tokens;
        self
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

    /// Sets what the worker says of its models besides their names (see
    /// [`ModelOrigin`]); an entry for a model it does not serve is kept
    /// out of the worker.
    pub fn with_origins(mut self, origins: BTreeMap<String, ModelOrigin>) -> Self {
        self.origins = origins;
        self
    }

    /// Sets the API key sent to the worker.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets the name decisions and logs use instead of `host:port`.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the health on admission.
    pub fn with_health(mut self, healthy: bool) -> Self {
        self.healthy = healthy;
        self
    }

    /// Whether every listed model can be asked for by name; the reason,
    /// naming `models`, where one cannot (empty, or the wildcard pool's
    /// `*`). The [`Registry`](crate::Registry) refuses such a worker on
    /// admission, so a source checks it when the worker is given, where
    /// the refusal reaches whoever gave it.
    pub fn check_models(&self) -> Result<(), String> {
        check_models(&self.models)
    }
}

/// [`WorkerSpec::check_models`] for a list of models given elsewhere (a
/// discovery pool's): an empty name is told of first, wherever it stands.
pub fn check_models(models: &[String]) -> Result<(), String> {
    let empty = models.iter().find(|m| m.is_empty());
    match empty.into_iter().chain(models).find_map(|m| unnameable(m)) {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// Why `model` cannot be asked for by name, naming `models`: it is empty,
/// or it is the wildcard pool's `*`; `None` if it can. The one rule for
/// every source of a worker's models (a file, the admin API, a discovery
/// pool, a pod, the worker itself), which the registry holds them to.
pub fn unnameable(model: &str) -> Option<String> {
    if model.is_empty() {
        return Some("a name in `models` is empty".to_owned());
    }
    (model == crate::WILDCARD_MODEL).then(|| {
        format!(
            "`{}` in `models` is not a model name: it names the pool of workers \
             that serve any model (list no models for that)",
            crate::WILDCARD_MODEL
        )
    })
}

/// The two spellings a worker entry may take in a file or request body.
/// Told apart by the entry's own type (a string, or a map) rather than by
/// trying each in turn, so a map's error names its field and fault
/// (`unknown field `modles``) instead of "did not match any variant".
mod form {
    use serde::Deserialize;
    use serde::de::{self, Deserializer, MapAccess, Visitor};
    use std::fmt;

    pub(super) enum WorkerSpec {
        /// Just the base URL.
        Url(String),
        /// The URL with its settings.
        Full(Full),
    }

    impl<'de> Deserialize<'de> for WorkerSpec {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct Entry;

            impl<'de> Visitor<'de> for Entry {
                type Value = WorkerSpec;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a worker URL, or a map with its `url` and settings")
                }

                fn visit_str<E: de::Error>(self, url: &str) -> Result<WorkerSpec, E> {
                    Ok(WorkerSpec::Url(url.to_owned()))
                }

                fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<WorkerSpec, M::Error> {
                    Full::deserialize(de::value::MapAccessDeserializer::new(map))
                        .map(WorkerSpec::Full)
                }
            }

            deserializer.deserialize_any(Entry)
        }
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Full {
        pub(super) url: String,
        #[serde(default)]
        pub(super) api_key: Option<String>,
        #[serde(default)]
        pub(super) api_key_env: Option<String>,
        #[serde(default)]
        pub(super) models: Vec<String>,
        #[serde(default)]
        pub(super) role: super::WorkerRole,
        #[serde(default)]
        pub(super) bootstrap_port: Option<u16>,
        #[serde(default)]
        pub(super) kv_capacity_tokens: Option<u64>,
    }
}

impl From<form::WorkerSpec> for WorkerSpec {
    fn from(form: form::WorkerSpec) -> Self {
        match form {
            form::WorkerSpec::Url(url) => Self::new(url),
            form::WorkerSpec::Full(form::Full {
                url,
                api_key,
                api_key_env,
                models,
                role,
                bootstrap_port,
                kv_capacity_tokens,
            }) => Self {
                api_key,
                api_key_env,
                ..Self::new(url)
                    .with_models(models)
                    .with_role(role)
                    .with_bootstrap_port(bootstrap_port)
                    .with_kv_capacity_tokens(kv_capacity_tokens)
            },
        }
    }
}

/// A worker's base URL that passed the one URL rule, in canonical form
/// (no trailing `/`, lower-case), so two spellings of one worker compare
/// equal.
///
/// Equality, order and hash are those of the canonical string alone.
#[derive(Clone, Debug)]
pub struct WorkerUrl {
    text: String,
    /// Where the host sits in `text`, without IPv6 brackets.
    host: Range<usize>,
    port: Option<u16>,
    ip: Option<IpAddr>,
}

impl WorkerUrl {
    /// Checks `text` as a worker's base URL and returns its canonical form.
    ///
    /// Accepted, exactly: `http://` or `https://`; a host, which is a DNS
    /// name (labels of ASCII letters, digits, `-` and `_`, 1-63 characters
    /// each, not starting or ending with `-`), a dotted-quad IPv4 address or
    /// a bracketed IPv6 address without a zone; an optional `:port` of
    /// 1-65535 (none means the scheme's default); an optional final `/`.
    /// Refused: anything else, notably userinfo, a path, a query, a
    /// fragment and whitespace. A rejection is
    /// [`RoutingError::InvalidWorker`] carrying `text` as given and the
    /// reason.
    pub fn parse(text: &str) -> Result<Self, RoutingError> {
        let parts = parse_parts(text).map_err(|reason| RoutingError::InvalidWorker {
            url: text.to_owned(),
            reason,
        })?;
        let canonical = Self::canonical(text).into_owned();
        // Respelled, the host may have moved or changed (an IPv4-mapped
        // address is IPv4); read again, it parses (the same URL).
        let Parts { host, port, ip } = match parse_parts(&canonical) {
            Ok(respelled) => respelled,
            Err(_) => parts,
        };
        debug_assert!(host.end <= canonical.len());
        Ok(Self {
            text: canonical,
            host,
            port,
            ip,
        })
    }

    /// The canonical spelling of `text`, without checking it: trailing `/`s
    /// dropped, and lower-cased, since a URL of the accepted shape is a
    /// scheme, a host and a port, none of which has a case (`http://LOCALHOST:1`
    /// is `http://localhost:1`); an IPv6 address in its one spelling (RFC
    /// 5952: `[::1]`, not `[0:0:0:0:0:0:0:1]`), an IPv4-mapped one as the
    /// IPv4 address it is (`http://[::ffff:10.0.0.1]` is `http://10.0.0.1`),
    /// the port without leading zeros, and none at all where it is the
    /// scheme's default (`http://w:80` is `http://w`, `https://w:443` is
    /// `https://w`). So one worker has one URL, which
    /// replicas and the admin API look it up by. For looking a worker up by
    /// a URL a caller typed, where an unparsable URL should simply match
    /// nothing.
    pub fn canonical(text: &str) -> Cow<'_, str> {
        let text = text.trim_end_matches('/');
        let lowered = if text.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(text.to_ascii_lowercase())
        } else {
            Cow::Borrowed(text)
        };
        match respelled(&lowered) {
            Some(respelled) => Cow::Owned(respelled),
            None => lowered,
        }
    }

    /// The canonical URL.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The worker's short name: the URL without its scheme, i.e. `host:port`
    /// (see [`Self::name_of`]).
    pub fn name(&self) -> &str {
        Self::name_of(&self.text)
    }

    /// The short name of the worker at `url`, which decisions, logs and
    /// `/workers` use: `url` without its scheme and trailing `/`
    /// (`10.0.0.5:30000`), since a worker URL has nothing after its port.
    pub fn name_of(url: &str) -> &str {
        let url = url.trim_end_matches('/');
        url.find("://").map_or(url, |i| &url[i + 3..])
    }

    /// The host, lower-cased, without the brackets of an IPv6 address.
    pub fn host(&self) -> &str {
        &self.text[self.host.clone()]
    }

    /// The port, when the URL names one.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The address, when the host is an IP literal rather than a name.
    pub fn ip(&self) -> Option<IpAddr> {
        self.ip
    }
}

impl PartialEq for WorkerUrl {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for WorkerUrl {}

impl PartialOrd for WorkerUrl {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for WorkerUrl {
    fn cmp(&self, other: &Self) -> Ordering {
        self.text.cmp(&other.text)
    }
}

impl Hash for WorkerUrl {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

impl fmt::Display for WorkerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Equality, order and hash are those of the canonical string, so a map
/// keyed by `WorkerUrl` can be looked up with a `&str` in canonical form.
impl Borrow<str> for WorkerUrl {
    fn borrow(&self) -> &str {
        &self.text
    }
}

impl AsRef<str> for WorkerUrl {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl From<WorkerUrl> for String {
    fn from(url: WorkerUrl) -> Self {
        url.text
    }
}

/// `url` (lower-cased, no trailing `/`) with its IPv6 host and its port
/// spelled as [`WorkerUrl::canonical`] says, where either is spelled
/// otherwise; `None` where nothing changes or the authority cannot be read.
fn respelled(url: &str) -> Option<String> {
    let (scheme, authority) = url.split_once("://")?;
    // The scheme's default port is the server's port unwritten.
    let default = if scheme == "https" { "443" } else { "80" };
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let (address, after) = bracketed.split_once(']')?;
            let port = match after {
                "" => None,
                after => Some(after.strip_prefix(':')?),
            };
            let ip: Ipv6Addr = address.parse().ok()?;
            let host = match ip.to_ipv4_mapped() {
                Some(v4) => v4.to_string(),
                None => format!("[{ip}]"),
            };
            (host, port)
        }
        // A name or an IPv4 address is spelled one way once lower-cased:
        // only a port with a leading zero, or the default one, changes (a
        // lookup by a URL already canonical allocates nothing).
        None => match authority.split_once(':') {
            Some((host, port)) if port.starts_with('0') || port == default => {
                (host.to_owned(), Some(port))
            }
            _ => return None,
        },
    };
    let port = match port {
        Some(port) if port.len() > 1 && port.starts_with('0') => {
            let digits = port.trim_start_matches('0');
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some(digits)
        }
        port => port,
    };
    let port = port.filter(|&port| port != default);
    let respelled = match port {
        Some(port) => format!("{scheme}://{host}:{port}"),
        None => format!("{scheme}://{host}"),
    };
    (respelled != url).then_some(respelled)
}

/// What [`parse_parts`] finds in an accepted URL.
struct Parts {
    host: Range<usize>,
    port: Option<u16>,
    ip: Option<IpAddr>,
}

/// What every refusal adds, so the reader knows the accepted shape.
const SHAPE: &str = "a worker URL is scheme://host[:port] only";

/// The URL rule; `Err` is the reason, phrased to follow "invalid worker
/// `<url>`: ".
fn parse_parts(url: &str) -> Result<Parts, String> {
    // A scheme has no case (RFC 3986, 3.1): `HTTP://` is `http://`.
    let starts = |scheme: &str| {
        url.get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
    };
    let scheme_len = if starts("http://") {
        "http://".len()
    } else if starts("https://") {
        "https://".len()
    } else {
        return Err("the URL must start with http:// or https://".into());
    };
    if url.chars().any(char::is_whitespace) {
        return Err("the URL contains whitespace".into());
    }
    let rest = &url[scheme_len..];
    // The authority ends at the first `/`, `?` or `#` (RFC 3986, 3.2).
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.contains('@') {
        return Err(format!(
            "the URL must not contain user information (`user:pass@`); {SHAPE}"
        ));
    }
    if tail.contains('?') {
        return Err(format!("the URL must not have a query (`?...`); {SHAPE}"));
    }
    if tail.contains('#') {
        return Err(format!(
            "the URL must not have a fragment (`#...`); {SHAPE}"
        ));
    }
    if !(tail.is_empty() || tail == "/") {
        return Err(format!("the URL must not have a path (`{tail}`); {SHAPE}"));
    }

    let (host, port, ip) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed
                .split_once(']')
                .ok_or("the URL has an unclosed `[`")?;
            let port = match after {
                "" => None,
                after => Some(
                    after
                        .strip_prefix(':')
                        .ok_or("the URL has text after its IPv6 address")?,
                ),
            };
            let ip: Ipv6Addr = host.parse().map_err(|_| {
                format!("the URL's host `[{host}]` is not an IPv6 address (zones are not allowed)")
            })?;
            (host, port, Some(IpAddr::V6(ip)))
        }
        None => {
            let (host, port) = match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            };
            if host.is_empty() {
                return Err("the URL has no host".into());
            }
            (host, port, check_name(host)?.map(IpAddr::V4))
        }
    };
    let port = port.map(check_port).transpose()?;
    // `host` borrows from `url`, so its offset is a pointer difference.
    let start = host.as_ptr() as usize - url.as_ptr() as usize;
    Ok(Parts {
        host: start..start + host.len(),
        port,
        ip,
    })
}

/// A DNS name or a dotted-quad IPv4 address; the address if it is one.
fn check_name(host: &str) -> Result<Option<Ipv4Addr>, String> {
    let not_a_host = || {
        format!(
            "the URL's host `{}` is not a DNS name, an IPv4 address or a bracketed IPv6 address",
            host.escape_debug()
        )
    };
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(not_a_host());
    }
    // As in browsers' URL parsing: a name whose last label is numeric is an
    // IPv4 address, and must be a whole, valid one.
    let last = host.rsplit('.').next().unwrap_or_default();
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return host
            .parse::<Ipv4Addr>()
            .map(Some)
            .map_err(|_| format!("the URL's host `{host}` is not a valid IPv4 address"));
    }
    if host.len() > 253 {
        return Err("the URL's host is longer than 253 characters".into());
    }
    for label in host.split('.') {
        if label.is_empty() {
            return Err(format!("the URL's host `{host}` has an empty label"));
        }
        if label.len() > 63 || label.starts_with('-') || label.ends_with('-') {
            return Err(not_a_host());
        }
    }
    Ok(None)
}

fn check_port(port: &str) -> Result<u16, String> {
    let bad = || format!("the URL has a bad port `{port}` (1-65535)");
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match port.parse::<u32>() {
        Ok(n @ 1..=65535) => u16::try_from(n).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_urls_come_out_canonical() {
        for (given, canonical) in [
            ("http://a", "http://a"),
            // The scheme's default port is left unwritten.
            ("http://a:80/", "http://a"),
            ("https://a:443", "https://a"),
            ("HTTP://A:80", "http://a"),
            ("https://[::1]:443/", "https://[::1]"),
            ("http://[::ffff:10.0.0.1]:80", "http://10.0.0.1"),
            ("http://a:443", "http://a:443"),
            ("https://a:80", "https://a:80"),
            ("https://a.b", "https://a.b"),
            ("http://[::1]:8000/", "http://[::1]:8000"),
            ("http://[::1]", "http://[::1]"),
            ("http://sim-0", "http://sim-0"),
            ("http://Sim-0.NS:1/", "http://sim-0.ns:1"),
            // An address has one spelling (RFC 5952; IPv4-mapped as IPv4),
            // and a port no leading zeros.
            ("http://[::FFFF:a00:1]", "http://10.0.0.1"),
            ("http://[::ffff:127.0.0.1]:8000/", "http://127.0.0.1:8000"),
            ("http://[0:0:0:0:0:0:0:1]:8000", "http://[::1]:8000"),
            ("https://[2001:DB8:0:0:1::1]", "https://[2001:db8::1:0:0:1]"),
            ("http://a:0080", "http://a"),
            ("http://a:08080", "http://a:8080"),
            ("http://10.0.0.1:00443/", "http://10.0.0.1:443"),
            ("HTTPS://Host:8443", "https://host:8443"),
            ("Http://[::1]:8000/", "http://[::1]:8000"),
        ] {
            let url = WorkerUrl::parse(given).unwrap_or_else(|e| panic!("{given}: {e}"));
            assert_eq!(url.as_str(), canonical);
            assert_eq!(WorkerUrl::canonical(given), canonical);
            let again = WorkerUrl::parse(canonical).unwrap();
            assert_eq!(again, url, "{given}");
            assert_eq!((again.host(), again.port()), (url.host(), url.port()));
            assert_eq!(again.ip(), url.ip().map(|ip| ip.to_canonical()), "{given}");
        }
        // Not respelled: what does not parse is left as it is.
        assert_eq!(WorkerUrl::canonical("http://[::1"), "http://[::1");
        assert_eq!(WorkerUrl::canonical("http://[zz]:08"), "http://[zz]:08");
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
            ("http://a/\u{1}", "path"),
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
    fn only_scheme_host_and_port_are_accepted() {
        for (bad, why) in [
            ("http://user:pass@a:80", "user information"),
            ("http://user@a", "user information"),
            ("http://a:80/v1", "path"),
            ("http://a/b", "path"),
            ("http://a:80//", "path"),
            ("http://a:80?x=1", "query"),
            ("http://a/?x=1", "query"),
            ("http://a#frag", "fragment"),
            ("http://a:", "bad port"),
            ("http://a:0", "bad port"),
            ("http://a:+80", "bad port"),
            ("http://a:65536", "bad port"),
            ("http://a..b", "empty label"),
            ("http://-a", "host"),
            ("http://a%20b", "host"),
            ("http://999.1.1.1", "IPv4"),
            ("http://1.2.3", "IPv4"),
            ("http://[::1%25eth0]", "IPv6"),
            ("http://[zz::1]", "IPv6"),
            ("http://[]", "IPv6"),
            ("http:// a", "whitespace"),
            ("http://a\t", "whitespace"),
            ("http://a\u{0}", "host"),
        ] {
            match WorkerUrl::parse(bad) {
                Err(RoutingError::InvalidWorker { reason, .. }) => {
                    assert!(reason.contains(why), "{bad:?}: {reason}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn hosts_and_ports_are_read_back() {
        for (given, host, port) in [
            ("http://a", "a", None),
            (
                "https://w-1.ns.svc.cluster.local:8443/",
                "w-1.ns.svc.cluster.local",
                Some(8443),
            ),
            ("http://10.0.0.5:30000", "10.0.0.5", Some(30000)),
            ("http://[::1]:8000", "::1", Some(8000)),
            ("http://[fe80::1]", "fe80::1", None),
            ("http://Sim_0:1", "sim_0", Some(1)),
        ] {
            let url = WorkerUrl::parse(given).unwrap_or_else(|e| panic!("{given}: {e}"));
            assert_eq!(url.host(), host, "{given}");
            assert_eq!(url.port(), port, "{given}");
        }
        let ip = WorkerUrl::parse("http://[::ffff:10.0.0.1]:1").unwrap();
        assert_eq!(ip.ip(), Some("10.0.0.1".parse().unwrap()));
        assert_eq!((ip.host(), ip.port()), ("10.0.0.1", Some(1)));
        assert_eq!(WorkerUrl::parse("http://a.b:1").unwrap().ip(), None);
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
        assert!(err.to_string().contains("unknown field `modles`"), "{err}");
        let err = serde_json::from_str::<WorkerSpec>("5").unwrap_err();
        assert!(err.to_string().contains("a worker URL, or a map"), "{err}");
        assert!(
            serde_json::from_str::<WorkerSpec>(r#"{"url": "http://a", "healthy": true}"#).is_err()
        );
    }
}
