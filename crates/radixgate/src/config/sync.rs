//! The `sync:` section: sharing routing state between router replicas over
//! NATS (see `docs/sync.md`).
//!
//! Sync is on when `urls` names at least one server. Secrets (token,
//! password) may be given inline, read from a file (`*_file`), or through
//! the flags' environment variables; an nkey seed or a `.creds` file is
//! always read from a file. [`SyncConfig::validate`] reads every file once
//! at start-up, so an unreadable one is a start-up error naming its key,
//! not a failure at the first reconnect.

use super::{ConfigError, invalid};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The largest `reference_window_bytes`: each peer keeps twice this per
/// sender.
pub const MAX_REFERENCE_WINDOW_BYTES: usize = 256 << 20;

/// Replica sync over NATS.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyncConfig {
    /// NATS servers, `nats://host:port` or `tls://host:port`; several for a
    /// NATS cluster (`--sync-url`). Empty: sync off.
    pub urls: Vec<String>,
    /// Scopes the subjects and the stream: replicas sync with those of the
    /// same cluster name only (`--sync-cluster`).
    pub cluster: String,
    /// Tags what this replica publishes, for logs (`--sync-replica-id`);
    /// none: a random one at each start.
    pub replica_id: Option<String>,
    /// Routed texts waiting to be published; beyond it new ones are
    /// dropped (and counted) rather than slowing the request path.
    pub queue_capacity: usize,
    /// At most one insert batch (which carries the load report too) per
    /// this many milliseconds: a decision after a quiet spell goes at
    /// once, those within `batch_ms` of the last batch go together then.
    pub batch_ms: u64,
    /// The load lane's tick, milliseconds: while this replica has requests
    /// in flight it reports its load on every multiple of it, and it reads
    /// the peers' reports then. A request's start and its first token go
    /// with its insert batches at once; a fall at its end reaches the
    /// peers within one to two ticks.
    pub load_period_ms: u64,
    /// Accepted and unused: builds before the load lane (2026-12-03)
    /// coalesced load reports by it. Kept so their configs still load
    /// during a rolling upgrade; a WARN at start says to remove it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_coalesce_ms: Option<u64>,
    /// Milliseconds after which a silent replica's load report no longer
    /// counts; 3 periods by design.
    pub load_expiry_ms: u64,
    /// Bytes of recently published texts that later texts may refer to
    /// (a prefix sent again goes as a reference); 0: always the whole text.
    pub reference_window_bytes: usize,
    /// Seconds of published decisions the JetStream stream keeps for
    /// replicas that start later.
    pub history_secs: u64,
    /// Bytes the stream keeps at most (oldest dropped first).
    pub history_bytes: u64,
    /// Where the NATS server keeps the stream: `file` (survives a NATS
    /// restart) or `memory` (lost with it, for less of the server's CPU).
    /// Takes effect when the stream is made; a stream found with the
    /// other kind is used as it is, with a WARN.
    pub stream_storage: StreamStorage,
    /// Seconds a starting replica waits to replay the history before it
    /// reports ready anyway (with a WARN).
    pub warmup_timeout_secs: u64,
    /// TLS to the NATS servers.
    #[serde(deserialize_with = "super::null_is_default")]
    pub tls: SyncTlsConfig,
    /// Credentials: at most one kind.
    #[serde(deserialize_with = "super::null_is_default")]
    pub auth: SyncAuthConfig,
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            cluster: "radixgate".to_owned(),
            replica_id: None,
            queue_capacity: 4096,
            batch_ms: 10,
            load_period_ms: 100,
            load_coalesce_ms: None,
            load_expiry_ms: 300,
            reference_window_bytes: 8 << 20,
            history_secs: 600,
            history_bytes: 256 << 20,
            stream_storage: StreamStorage::File,
            warmup_timeout_secs: 10,
            tls: SyncTlsConfig::default(),
            auth: SyncAuthConfig::default(),
        }
    }
}

/// Where the NATS server keeps the sync stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum StreamStorage {
    /// On the server's disk: the history outlives a NATS restart.
    #[default]
    File,
    /// In the server's memory: lost when NATS restarts; measured at about
    /// a third less nats-server CPU per request on long prompts
    /// (docs/sync.md, "Warm start").
    Memory,
}

/// TLS settings for the NATS connection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyncTlsConfig {
    /// Refuse a server that does not offer TLS (`--sync-tls-required`;
    /// a `tls://` URL requires it too).
    pub required: bool,
    /// PEM file of CA certificates to trust, besides the system's
    /// (`--sync-tls-ca`).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (`--sync-tls-cert`); needs
    /// `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate (`--sync-tls-key`).
    pub key_file: Option<PathBuf>,
}

/// NATS credentials. Each secret inline or from a file, never both.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyncAuthConfig {
    /// A token (`--sync-token`, `RADIXGATE_SYNC_TOKEN`).
    pub token: Option<String>,
    /// A file holding the token (`--sync-token-file`).
    pub token_file: Option<PathBuf>,
    /// A user name, with `password` or `password_file` (`--sync-user`).
    pub user: Option<String>,
    /// The user's password (`--sync-password`, `RADIXGATE_SYNC_PASSWORD`).
    pub password: Option<String>,
    /// A file holding the password (`--sync-password-file`).
    pub password_file: Option<PathBuf>,
    /// A file holding an nkey seed (`--sync-nkey-seed-file`).
    pub nkey_seed_file: Option<PathBuf>,
    /// A NATS `.creds` file: JWT and nkey seed (`--sync-creds-file`).
    pub creds_file: Option<PathBuf>,
}

impl std::fmt::Debug for SyncAuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets stay out of debug output (it reaches logs).
        let set = |o: bool| if o { "<set>" } else { "-" };
        f.debug_struct("SyncAuthConfig")
            .field("token", &set(self.token.is_some()))
            .field("token_file", &self.token_file)
            .field("user", &self.user)
            .field("password", &set(self.password.is_some()))
            .field("password_file", &self.password_file)
            .field("nkey_seed_file", &self.nkey_seed_file)
            .field("creds_file", &self.creds_file)
            .finish()
    }
}

/// Credentials as read at start-up.
#[derive(Clone, PartialEq, Eq)]
pub enum SyncAuth {
    /// None.
    None,
    /// A token.
    Token(String),
    /// User and password.
    UserPassword(String, String),
    /// An nkey seed.
    NkeySeed(String),
    /// The text of a `.creds` file.
    Creds(String),
}

impl std::fmt::Debug for SyncAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

impl SyncAuth {
    /// The kind of credentials, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Token(_) => "token",
            Self::UserPassword(..) => "user/password",
            Self::NkeySeed(_) => "nkey",
            Self::Creds(_) => "creds file",
        }
    }
}

fn read_secret(key: &'static str, path: &Path) -> Result<String, ConfigError> {
    Ok(read_secret_file(key, path)?.trim().to_owned())
}

/// The text of a secret's file as written; an error if it is blank.
fn read_secret_file(key: &'static str, path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))?;
    if text.trim().is_empty() {
        return Err(invalid(key, format!("{} is empty", path.display())));
    }
    Ok(text)
}

/// The nkey seed in `path`, checked to be a user's (`SU...`): any other
/// is refused by the server at every connect, for ever.
fn user_seed(path: &Path) -> Result<String, ConfigError> {
    const KEY: &str = "sync.auth.nkey_seed_file";
    let seed = read_secret(KEY, path)?;
    let pair = nkeys::KeyPair::from_seed(&seed).map_err(|e| {
        invalid(
            KEY,
            format!("{} does not hold an nkey seed: {e}", path.display()),
        )
    })?;
    if pair.key_pair_type() != nkeys::KeyPairType::User {
        return Err(invalid(
            KEY,
            format!(
                "{} holds the seed of {:?} key; a NATS user signs in with a user seed (SU...)",
                path.display(),
                pair.key_pair_type()
            ),
        ));
    }
    Ok(seed)
}

fn inline_or_file(
    key: &'static str,
    inline: &Option<String>,
    file: &Option<PathBuf>,
) -> Result<Option<String>, ConfigError> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(invalid(key, "is given both inline and as a file; give one")),
        (Some(s), None) if s.is_empty() => Err(invalid(key, "is empty")),
        (Some(s), None) => Ok(Some(s.clone())),
        (None, Some(path)) => read_secret(key, path).map(Some),
        (None, None) => Ok(None),
    }
}

impl SyncAuthConfig {
    /// Reads the files and checks that at most one kind is given.
    pub fn resolve(&self) -> Result<SyncAuth, ConfigError> {
        let token = inline_or_file("sync.auth.token", &self.token, &self.token_file)?;
        let password = inline_or_file("sync.auth.password", &self.password, &self.password_file)?;
        let user = match (&self.user, password) {
            (Some(u), Some(p)) if !u.is_empty() => Some((u.clone(), p)),
            (Some(_), Some(_)) => return Err(invalid("sync.auth.user", "is empty")),
            (Some(_), None) => {
                return Err(invalid(
                    "sync.auth.user",
                    "needs a password (password or password_file)",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid("sync.auth.password", "is given without a user"));
            }
            (None, None) => None,
        };
        let nkey = match &self.nkey_seed_file {
            Some(p) => Some(user_seed(p)?),
            None => None,
        };
        let creds = match &self.creds_file {
            Some(p) => {
                // As it is: the client's parser wants the line end after
                // the seed's closing line, which a trim would take when
                // nothing follows it.
                let text = read_secret_file("sync.auth.creds_file", p)?;
                // Read as the client will read it: a JWT and a seed.
                async_nats::ConnectOptions::new()
                    .credentials(&text)
                    .map_err(|e| {
                        invalid(
                            "sync.auth.creds_file",
                            format!("{} is not a NATS .creds file: {e}", p.display()),
                        )
                    })?;
                Some(text)
            }
            None => None,
        };
        let given: Vec<&str> = [
            token.as_ref().map(|_| "token"),
            user.as_ref().map(|_| "user/password"),
            nkey.as_ref().map(|_| "nkey_seed_file"),
            creds.as_ref().map(|_| "creds_file"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if given.len() > 1 {
            return Err(invalid(
                "sync.auth",
                format!(
                    "gives {}; give one kind of credentials",
                    given.join(" and ")
                ),
            ));
        }
        Ok(if let Some(t) = token {
            SyncAuth::Token(t)
        } else if let Some((u, p)) = user {
            SyncAuth::UserPassword(u, p)
        } else if let Some(n) = nkey {
            SyncAuth::NkeySeed(n)
        } else if let Some(c) = creds {
            SyncAuth::Creds(c)
        } else {
            SyncAuth::None
        })
    }
}

impl SyncConfig {
    /// Whether sync is on (`urls` names a server).
    pub fn enabled(&self) -> bool {
        !self.urls.is_empty()
    }

    /// Checks every setting and reads the credential and TLS files.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for url in &self.urls {
            check_url(url)?;
        }
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !name_ok(&self.cluster) {
            return Err(invalid(
                "sync.cluster",
                format!(
                    "`{}` must be 1 to 64 letters, digits, `-` or `_` (it names NATS subjects)",
                    self.cluster
                ),
            ));
        }
        if let Some(id) = &self.replica_id
            && !name_ok(id)
        {
            return Err(invalid(
                "sync.replica_id",
                format!("`{id}` must be 1 to 64 letters, digits, `-` or `_`"),
            ));
        }
        let positive = |key: &'static str, v: u64, max: u64| {
            if v == 0 || v > max {
                Err(invalid(key, format!("must be 1..={max}, got {v}")))
            } else {
                Ok(())
            }
        };
        positive("sync.queue_capacity", self.queue_capacity as u64, 1 << 20)?;
        positive("sync.batch_ms", self.batch_ms, 1000)?;
        positive("sync.load_period_ms", self.load_period_ms, 10_000)?;
        positive("sync.load_expiry_ms", self.load_expiry_ms, 60_000)?;
        if self.load_expiry_ms < self.load_period_ms {
            return Err(invalid(
                "sync.load_expiry_ms",
                format!(
                    "({}) must be at least load_period_ms ({}), or every report expires before the next",
                    self.load_expiry_ms, self.load_period_ms
                ),
            ));
        }
        if self.reference_window_bytes > MAX_REFERENCE_WINDOW_BYTES {
            return Err(invalid(
                "sync.reference_window_bytes",
                "must be at most 256 MiB (each peer keeps twice this)",
            ));
        }
        positive("sync.history_secs", self.history_secs, 7 * 24 * 3600)?;
        positive("sync.history_bytes", self.history_bytes, 1 << 40)?;
        if self.warmup_timeout_secs > 3600 {
            return Err(invalid("sync.warmup_timeout_secs", "must be at most 3600"));
        }
        let tls = &self.tls;
        for (key, path) in [
            ("sync.tls.ca_file", &tls.ca_file),
            ("sync.tls.cert_file", &tls.cert_file),
            ("sync.tls.key_file", &tls.key_file),
        ] {
            if let Some(p) = path {
                std::fs::metadata(p)
                    .and_then(|_| std::fs::File::open(p))
                    .map_err(|e| invalid(key, format!("cannot read {}: {e}", p.display())))?;
            }
        }
        match (&tls.cert_file, &tls.key_file) {
            (Some(_), None) => return Err(invalid("sync.tls.cert_file", "needs key_file")),
            (None, Some(_)) => return Err(invalid("sync.tls.key_file", "needs cert_file")),
            _ => {}
        }
        // Read as the NATS client will read them at connect time, so a
        // wrong file (a key given as the CA, a DER file) is named here, at
        // start-up or reload, rather than in a reconnect loop's log.
        for (key, path) in [
            ("sync.tls.ca_file", &tls.ca_file),
            ("sync.tls.cert_file", &tls.cert_file),
        ] {
            if let Some(p) = path {
                pem_certificates(key, p)?;
            }
        }
        if let Some(p) = &tls.key_file {
            PrivateKeyDer::from_pem_file(p).map_err(|e| {
                invalid(
                    "sync.tls.key_file",
                    format!("{} holds no PEM private key ({e})", p.display()),
                )
            })?;
        }
        self.auth.resolve()?;
        Ok(())
    }
}

/// Checks that `path` (the setting `key`) holds at least one PEM
/// certificate, and that each it holds is well-formed PEM.
fn pem_certificates(key: &'static str, path: &Path) -> Result<(), ConfigError> {
    let unreadable = |e: rustls::pki_types::pem::Error| {
        invalid(
            key,
            format!("{} is not PEM certificates ({e})", path.display()),
        )
    };
    let mut found = 0usize;
    for certificate in CertificateDer::pem_file_iter(path).map_err(unreadable)? {
        certificate.map_err(unreadable)?;
        found += 1;
    }
    if found == 0 {
        return Err(invalid(
            key,
            format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(())
}

/// A server URL async-nats can dial: `nats://` or `tls://`, a host, a port.
fn check_url(url: &str) -> Result<(), ConfigError> {
    let bad = |why: &str| invalid("sync.urls", format!("`{url}`: {why}"));
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad("expected nats://HOST:PORT or tls://HOST:PORT"));
    };
    if scheme != "nats" && scheme != "tls" {
        return Err(bad("the scheme must be nats or tls"));
    }
    let authority = rest.trim_end_matches('/');
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if authority.contains('@') {
        return Err(bad(
            "put credentials in sync.auth (or the --sync-* flags), not in the URL",
        ));
    }
    let Some((host, port)) = hostport.rsplit_once(':') else {
        return Err(bad("needs a port (NATS listens on 4222)"));
    };
    if host.is_empty() || host.contains('/') {
        return Err(bad("needs a host"));
    }
    port.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| bad("the port must be 1..=65535"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> SyncConfig {
        SyncConfig {
            urls: vec!["nats://127.0.0.1:4222".into()],
            ..SyncConfig::default()
        }
    }

    fn err(c: &SyncConfig) -> String {
        c.validate().unwrap_err().to_string()
    }

    #[test]
    fn urls_are_checked() {
        on().validate().unwrap();
        for (url, says) in [
            ("127.0.0.1:4222", "expected nats://"),
            ("http://a:4222", "scheme"),
            ("nats://a", "needs a port"),
            ("nats://a:0", "port"),
            ("nats://u:p@a:4222", "not in the URL"),
            ("nats://:4222", "needs a host"),
        ] {
            let c = SyncConfig {
                urls: vec![url.into()],
                ..SyncConfig::default()
            };
            let e = err(&c);
            assert!(e.contains("sync.urls") && e.contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn a_setting_of_builds_before_the_load_lane_still_loads() {
        let c = crate::config::Config::from_yaml(
            "sync:\n  urls: [nats://127.0.0.1:4222]\n  load_coalesce_ms: 25\n",
        )
        .unwrap();
        assert_eq!(c.sync.load_coalesce_ms, Some(25));
        assert!(c.sync.validate().is_ok());
        let c = crate::config::Config::from_yaml("sync:\n  load_coalsce_ms: 25\n");
        assert!(c.is_err(), "a misspelt key is still refused");
    }

    #[test]
    fn names_and_numbers_are_checked() {
        let mut c = on();
        c.cluster = "a.b".into();
        assert!(err(&c).contains("sync.cluster"));
        let mut c = on();
        c.replica_id = Some(String::new());
        assert!(err(&c).contains("sync.replica_id"));
        let mut c = on();
        c.load_expiry_ms = 50;
        assert!(err(&c).contains("at least load_period_ms"));
        let mut c = on();
        c.batch_ms = 0;
        assert!(err(&c).contains("sync.batch_ms"));
    }

    #[test]
    fn tls_files_must_hold_what_they_are_for() {
        let dir = std::env::temp_dir().join(format!("rg-sync-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("cert.pem");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let key = dir.join("key.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let der = dir.join("cert.der");
        std::fs::write(&der, [0x30, 0x82, 0x01, 0x0a]).unwrap();
        let mut c = on();
        c.tls.ca_file = Some(cert.clone());
        c.tls.cert_file = Some(cert.clone());
        c.tls.key_file = Some(key.clone());
        c.validate().unwrap();
        for (field, wrong) in [
            ("ca_file", &key),
            ("ca_file", &der),
            ("cert_file", &key),
            ("key_file", &cert),
        ] {
            let mut c = c.clone();
            let slot = match field {
                "ca_file" => &mut c.tls.ca_file,
                "cert_file" => &mut c.tls.cert_file,
                _ => &mut c.tls.key_file,
            };
            *slot = Some(wrong.clone());
            let e = err(&c);
            assert!(
                e.contains(&format!("sync.tls.{field}")),
                "{field} {wrong:?}: {e}"
            );
            assert!(e.contains(&wrong.display().to_string()), "{e}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn credentials_are_one_kind_and_their_files_readable() {
        let dir = std::env::temp_dir().join(format!("rg-sync-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let mut c = on();
        c.auth.token_file = Some(token.clone());
        assert_eq!(c.auth.resolve().unwrap(), SyncAuth::Token("s3cret".into()));
        c.auth.user = Some("u".into());
        c.auth.password = Some("p".into());
        assert!(err(&c).contains("token and user/password"), "{}", err(&c));
        let mut c = on();
        c.auth.token = Some("a".into());
        c.auth.token_file = Some(token);
        assert!(err(&c).contains("both inline and as a file"));
        let mut c = on();
        c.auth.user = Some("u".into());
        assert!(err(&c).contains("needs a password"));
        let mut c = on();
        c.auth.creds_file = Some(dir.join("missing.creds"));
        let e = err(&c);
        assert!(
            e.contains("sync.auth.creds_file") && e.contains("cannot read"),
            "{e}"
        );
        // An nkey seed and a .creds file are read as the client reads them.
        let seed = dir.join("seed");
        // A user seed with a character in its key changed: its checksum
        // fails.
        let mut corrupt = nkeys::KeyPair::new_user().seed().unwrap();
        let other = if &corrupt[10..11] == "A" { "B" } else { "A" };
        corrupt.replace_range(10..11, other);
        for (text, says) in [
            (&*corrupt, "does not hold"),
            ("not a seed\n", "does not hold"),
            (
                &*nkeys::KeyPair::new_account().seed().unwrap(),
                "a NATS user signs in with a user seed",
            ),
        ] {
            std::fs::write(&seed, text).unwrap();
            let mut c = on();
            c.auth.nkey_seed_file = Some(seed.clone());
            let e = err(&c);
            assert!(
                e.contains("sync.auth.nkey_seed_file") && e.contains(says),
                "{e}"
            );
        }
        let user = nkeys::KeyPair::new_user();
        std::fs::write(&seed, format!("{}\n", user.seed().unwrap())).unwrap();
        let mut c = on();
        c.auth.nkey_seed_file = Some(seed.clone());
        assert_eq!(
            c.auth.resolve().unwrap(),
            SyncAuth::NkeySeed(user.seed().unwrap())
        );
        let creds = dir.join("bad.creds");
        std::fs::write(&creds, "-----BEGIN NATS USER JWT-----\nnot a jwt\n").unwrap();
        let mut c = on();
        c.auth.creds_file = Some(creds);
        let e = err(&c);
        assert!(e.contains("is not a NATS .creds file"), "{e}");
        let mut c = on();
        c.tls.cert_file = Some(dir.join("missing.pem"));
        assert!(err(&c).contains("sync.tls.cert_file"));
        let debug = format!(
            "{:?}",
            SyncAuthConfig {
                password: Some("hunter2".into()),
                ..Default::default()
            }
        );
        assert!(!debug.contains("hunter2"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
