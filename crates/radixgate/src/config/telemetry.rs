//! The `tracing:` section: request ids and OpenTelemetry trace export
//! (see `docs/tracing.md`).
//!
//! Every request carries an id: the first valid one among the client's
//! `request_id_headers`, else a fresh one. With `otlp_endpoint` set, the
//! router's spans go to that OTLP/HTTP collector; without it nothing is
//! exported and no span beyond the request's own (which carries the id into
//! log lines) is made. The `log:` section's filter is checked here too.

use super::{ConfigError, LogConfig, invalid};
use serde::{Deserialize, Serialize};

/// Most headers `request_id_headers` may list (each is looked up on every
/// request).
pub const MAX_REQUEST_ID_HEADERS: usize = 16;

/// Request ids and trace export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// Client headers a request id is taken from, in order of preference
    /// (`--request-id-headers`); the first present with a valid value wins,
    /// else the router makes one. Whichever it is goes to the worker and
    /// back to the client as `x-request-id`. Empty: always a fresh id.
    pub request_id_headers: Vec<String>,
    /// OTLP/HTTP (protobuf) collector to export spans to, e.g.
    /// `http://127.0.0.1:4318` (`/v1/traces` is added to a URL without a
    /// path) (`--otlp-endpoint`). Unset: no export.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the exported spans (`--otlp-service-name`).
    pub service_name: String,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            request_id_headers: [
                "x-request-id",
                "x-correlation-id",
                "x-trace-id",
                "request-id",
            ]
            .map(String::from)
            .to_vec(),
            otlp_endpoint: None,
            service_name: "radixgate".into(),
        }
    }
}

impl LogConfig {
    /// `level` as a `tracing` filter: comma-separated directives, each a
    /// level or `TARGET=LEVEL`. SGLang's router takes Python's names for
    /// `--log-level`, so `warning` and `critical` read as `warn` and
    /// `error`. Anything else is refused: `tracing` would read a word that
    /// is no level as a target's name and silence every other log line.
    pub fn filter(&self) -> Result<String, ConfigError> {
        let bad = |why: String| invalid("log.level", format!("`{}`: {why}", self.level));
        let mut directives = Vec::new();
        for directive in self.level.split(',').map(str::trim) {
            if directive.is_empty() {
                continue;
            }
            let (target, level) = match directive.rsplit_once('=') {
                Some((target, level)) => (Some(target), level),
                None => (None, directive),
            };
            let Some(level) = level_name(level) else {
                return Err(bad(format!(
                    "`{level}` is not a level: give off, error, warn (or warning), info, \
                     debug or trace, or TARGET=LEVEL directives such as radixgate=debug,info"
                )));
            };
            let directive = target.map_or_else(|| level.clone(), |t| format!("{t}={level}"));
            directive
                .parse::<tracing_subscriber::filter::Directive>()
                .map_err(|err| bad(format!("`{directive}`: {err}")))?;
            directives.push(directive);
        }
        if directives.is_empty() {
            return Err(bad("must name a level, e.g. info".into()));
        }
        Ok(directives.join(","))
    }
}

/// A level as `tracing` spells it, or `None` for a word that is not one.
fn level_name(word: &str) -> Option<String> {
    let word = word.trim().to_ascii_lowercase();
    match word.as_str() {
        "warning" => Some("warn".into()),
        "critical" => Some("error".into()),
        _ => word
            .parse::<tracing_subscriber::filter::LevelFilter>()
            .is_ok()
            .then_some(word),
    }
}

impl TracingConfig {
    /// Checks the header names, the endpoint and the service name.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.request_id_headers.len() > MAX_REQUEST_ID_HEADERS {
            return Err(invalid(
                "tracing.request_id_headers",
                format!(
                    "lists {} headers; at most {MAX_REQUEST_ID_HEADERS}",
                    self.request_id_headers.len()
                ),
            ));
        }
        for name in &self.request_id_headers {
            if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(invalid(
                    "tracing.request_id_headers",
                    format!("`{name}` is not a valid HTTP header name"),
                ));
            }
        }
        if let Some(endpoint) = &self.otlp_endpoint {
            otlp_traces_url(endpoint).map_err(|reason| invalid("tracing.otlp_endpoint", reason))?;
        }
        if self.service_name.trim().is_empty() {
            return Err(invalid("tracing.service_name", "must not be empty"));
        }
        Ok(())
    }

    /// The header names, lower-cased (HTTP/2 and `HeaderMap` keys are).
    pub fn header_names(&self) -> Vec<axum::http::HeaderName> {
        self.request_id_headers
            .iter()
            .filter_map(|name| {
                axum::http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()).ok()
            })
            .collect()
    }
}

/// The URL spans are posted to: `endpoint` itself when it has a path,
/// else `endpoint/v1/traces` (OTLP/HTTP's path for traces), so both a
/// collector's base URL and a full traces URL work.
pub fn otlp_traces_url(endpoint: &str) -> Result<String, String> {
    // Checked first, so that no message below repeats them: the exporter
    // never sends credentials written in the URL, and the URL is logged.
    if endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .is_some_and(|authority| authority.contains('@'))
    {
        return Err(
            "the URL must not carry credentials (user:password@): the exporter \
                    does not send them, and the URL is logged"
                .into(),
        );
    }
    let uri: axum::http::Uri = endpoint
        .parse()
        .map_err(|err| format!("`{endpoint}` is not a URL: {err}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(format!(
                "`{endpoint}` must start with http:// or https:// (OTLP over HTTP)"
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{endpoint}` has no host"));
    }
    // `Uri` takes any digits as a port; the exporter could reach none.
    let authority = uri.authority().map_or("", |a| a.as_str());
    if let Some((_, port)) = authority.rsplit_once(':').filter(|(_, p)| !p.contains(']'))
        && port.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(format!("`{endpoint}` has a bad port `{port}` (1-65535)"));
    }
    if uri.query().is_some() {
        return Err(format!("`{endpoint}` must not have a query"));
    }
    Ok(match uri.path() {
        "" | "/" => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        _ => endpoint.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_gets_the_traces_path_only_without_one() {
        assert_eq!(
            otlp_traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            otlp_traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            otlp_traces_url("https://c.example/otlp/v1/traces").unwrap(),
            "https://c.example/otlp/v1/traces"
        );
        for bad in [
            "collector:4318",
            "grpc://c:4317",
            "http://",
            "",
            "http://c/?a=b",
        ] {
            assert!(otlp_traces_url(bad).is_err(), "{bad}");
        }
        // Credentials in the URL are never sent by the exporter, and the
        // URL is logged: refused, without repeating them.
        for with_secret in ["http://user:s3cret@c:4318", "https://s3cret@c/v1/traces"] {
            let err = otlp_traces_url(with_secret).unwrap_err();
            assert!(err.contains("credentials"), "{err}");
            assert!(!err.contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn validation_names_the_key() {
        let mut c = TracingConfig::default();
        c.validate().unwrap();
        c.request_id_headers.push("bad header".into());
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("tracing.request_id_headers"), "{err}");
        let c = TracingConfig {
            otlp_endpoint: Some("localhost:4318".into()),
            ..TracingConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("tracing.otlp_endpoint"), "{err}");
        let c = TracingConfig {
            service_name: " ".into(),
            ..TracingConfig::default()
        };
        assert!(c.validate().is_err());
        let c = TracingConfig {
            request_id_headers: vec!["x-a".into(); MAX_REQUEST_ID_HEADERS + 1],
            ..TracingConfig::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn header_names_are_lower_cased() {
        let c = TracingConfig {
            request_id_headers: vec!["X-Amzn-Trace-Id".into()],
            ..TracingConfig::default()
        };
        assert_eq!(c.header_names()[0].as_str(), "x-amzn-trace-id");
    }
}
