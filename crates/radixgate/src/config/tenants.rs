//! The `tenants:` section: named API keys with limits and a priority, listed
//! inline or in a separate YAML or JSON file (`--api-key-file`).
//!
//! Keys are secrets: a spec's `Debug` hides them, errors name the entry and
//! never the key, and `key_env` lets the file hold only the name of an
//! environment variable. [`TenantsConfig::resolve`] reads the file and the
//! variables and checks every entry; it runs in [`super::Config::validate`],
//! so a bad key file stops start-up (or a reload) with the entry named.

use super::{ConfigError, invalid};
use crate::admission::Priority;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

/// Named API keys. With none here and no `server.api_key`, the client API is
/// open; with any, every client request must present one of them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantsConfig {
    /// A YAML or JSON file holding a list of tenants, in the form of `keys`.
    pub api_key_file: Option<PathBuf>,
    /// Tenants listed here.
    pub keys: Vec<TenantSpec>,
}

/// One tenant: a name (the metrics label), its key, its limits.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// Shown in metrics and logs instead of the key; unique.
    pub name: String,
    /// The key itself (`Authorization: Bearer <key>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The name of an environment variable holding the key (instead of `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
    /// Requests admitted per minute, in a bucket that holds a minute's worth;
    /// none = no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    /// Tokens (prompt + completion, as the worker reports them) per minute;
    /// none = no limit. Charged when each response ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u32>,
    /// Place in the admission queue: `high`, `normal` (default) or `low`.
    #[serde(default)]
    pub priority: Priority,
}

impl std::fmt::Debug for TenantSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantSpec")
            .field("name", &self.name)
            .field("key", &self.key.as_ref().map(|_| "<hidden>"))
            .field("key_env", &self.key_env)
            .field("requests_per_minute", &self.requests_per_minute)
            .field("tokens_per_minute", &self.tokens_per_minute)
            .field("priority", &self.priority)
            .finish()
    }
}

/// The tenant `server.api_key` stands for: unnamed in the config, so named
/// here, with no limits.
pub const API_KEY_TENANT: &str = "default";

/// A checked tenant, its key read.
#[derive(Clone, PartialEq, Eq)]
pub struct ResolvedTenant {
    /// Unique name.
    pub name: String,
    /// The key, non-empty and unique.
    pub key: String,
    /// Requests per minute, if limited.
    pub requests_per_minute: Option<NonZeroU32>,
    /// Tokens per minute, if limited.
    pub tokens_per_minute: Option<NonZeroU32>,
    /// Queue priority.
    pub priority: Priority,
}

impl std::fmt::Debug for ResolvedTenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedTenant")
            .field("name", &self.name)
            .field("requests_per_minute", &self.requests_per_minute)
            .field("tokens_per_minute", &self.tokens_per_minute)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

/// Why a key with a character past ASCII is refused: a header holding one
/// is not read as text, so no request could present it (each was a 401).
pub(crate) const NOT_ASCII: &str =
    "the key has characters past ASCII, which no request can present in a header";

/// Longest tenant name: it is a metrics label and a log field.
const MAX_NAME: usize = 64;

impl TenantsConfig {
    /// Every tenant, checked: `server.api_key`'s (if any) first, then the
    /// inline `keys`, then the file's. Reads the file and the `key_env`
    /// variables; errors name the entry (`entry 2 (`team-a`)`), never a key.
    pub fn resolve(&self, api_key: Option<&str>) -> Result<Vec<ResolvedTenant>, ConfigError> {
        let mut out: Vec<ResolvedTenant> = Vec::new();
        if let Some(key) = api_key.filter(|k| !k.is_empty()) {
            out.push(ResolvedTenant {
                name: API_KEY_TENANT.into(),
                key: key.to_owned(),
                requests_per_minute: None,
                tokens_per_minute: None,
                priority: Priority::Normal,
            });
        }
        add_all(&mut out, &self.keys, "tenants.keys", "")?;
        if let Some(path) = &self.api_key_file {
            let specs = read_file(path)?;
            let place = format!("`{}` ", path.display());
            add_all(&mut out, &specs, "tenants.api_key_file", &place)?;
        }
        Ok(out)
    }
}

/// Reads a keys file: a YAML (or JSON, which is YAML) list of tenants.
/// A file that holds no document (nothing, blanks, comments) is refused,
/// not read as no tenants: it is what a reload reads while the file is
/// rewritten in place, and no tenants (without `server.api_key`) would
/// open the client API to anyone.
fn read_file(path: &Path) -> Result<Vec<TenantSpec>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadKeysFile {
        path: path.into(),
        source,
    })?;
    let parse_error = |source| ConfigError::KeysFile {
        path: path.into(),
        source,
    };
    let document: serde_norway::Value = serde_norway::from_str(&text).map_err(parse_error)?;
    if document.is_null() {
        return Err(ConfigError::EmptyKeysFile { path: path.into() });
    }
    if let Some(found) = super::unexpanded(&document, &mut String::new()) {
        return Err(parse_error(serde::de::Error::custom(found)));
    }
    serde_norway::from_str(&text).map_err(parse_error)
}

fn add_all(
    out: &mut Vec<ResolvedTenant>,
    specs: &[TenantSpec],
    key: &'static str,
    place: &str,
) -> Result<(), ConfigError> {
    for (i, spec) in specs.iter().enumerate() {
        let fail =
            |reason: String| invalid(key, format!("{place}entry {i} (`{}`): {reason}", spec.name));
        let tenant = resolve_one(spec).map_err(fail)?;
        if let Some(other) = out.iter().find(|t| t.name == tenant.name) {
            return Err(fail(format!(
                "the name is already used by `{}`",
                other.name
            )));
        }
        if let Some(other) = out.iter().find(|t| t.key == tenant.key) {
            return Err(fail(format!("has the same key as `{}`", other.name)));
        }
        out.push(tenant);
    }
    Ok(())
}

fn resolve_one(spec: &TenantSpec) -> Result<ResolvedTenant, String> {
    let name = &spec.name;
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("the name must have 1 to {MAX_NAME} characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err("the name may hold only ASCII letters, digits, `-`, `_` and `.`".into());
    }
    let key = match (&spec.key, &spec.key_env) {
        (Some(key), None) => key.clone(),
        (None, Some(var)) => {
            std::env::var(var).map_err(|_| format!("key_env `{var}` is not set (or not UTF-8)"))?
        }
        (Some(_), Some(_)) => return Err("set `key` or `key_env`, not both".into()),
        (None, None) => return Err("needs a `key` or a `key_env`".into()),
    };
    if key.is_empty() {
        return Err("the key is empty".into());
    }
    if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the key has whitespace or control characters".into());
    }
    if !key.is_ascii() {
        return Err(NOT_ASCII.into());
    }
    let limit = |value: Option<u32>, field: &str| match value {
        None => Ok(None),
        Some(n) => NonZeroU32::new(n).map(Some).ok_or(format!(
            "{field} must be at least 1 (leave it out for no limit)"
        )),
    };
    Ok(ResolvedTenant {
        name: name.clone(),
        key,
        requests_per_minute: limit(spec.requests_per_minute, "requests_per_minute")?,
        tokens_per_minute: limit(spec.tokens_per_minute, "tokens_per_minute")?,
        priority: spec.priority,
    })
}
