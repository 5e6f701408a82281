//! Range checks for every setting, run once on a complete [`Config`] (after
//! file, environment and flags are layered) and again on every reload.
//!
//! Every numeric key has a range, stated in its error message with the key
//! as spelled in the file. The bounds are what an operator of an LLM
//! cluster could mean, and small enough that no arithmetic on them can
//! overflow on the request path: a duration of at most a day added to any
//! `Instant`, a back-off of at most an hour times a multiplier of at most
//! 10. A value outside them is a typo or a unit mistake; refusing it at
//! start-up beats a panic per request.

use super::{Config, ConfigError, MAX_THREADS, invalid};
use axum::http::HeaderValue;
use radixgate_routing::{PolicyConfig, RoutingError, WorkerRole, WorkerSpec, WorkerUrl};
use std::fmt::Display;

/// Longest duration in seconds any `*_secs` setting may have: a day. No
/// LLM request, probe period or grace period sensibly lasts longer.
pub const MAX_SECS: u64 = 86_400;
/// Longest duration in milliseconds any `*_ms` back-off may have: an hour.
pub const MAX_MS: u64 = 3_600_000;
/// Largest request body limit: 1 GiB (a long-context prompt with images is
/// tens of MiB; a gigabyte is a mistake or an attack).
pub const MAX_PAYLOAD_SIZE: usize = 1 << 30;
/// Largest consecutive-event threshold (health, breaker).
pub const MAX_THRESHOLD: u32 = 10_000;
/// Most retries after the first attempt.
pub const MAX_RETRIES: u32 = 100;
/// Largest back-off growth per retry.
pub const MAX_BACKOFF_MULTIPLIER: f64 = 10.0;
/// Largest outlier latency factor: a worker this many times slower than
/// its peers' median is ejected.
pub const MAX_OUTLIER_FACTOR: f64 = 1_000.0;
/// Largest concurrency limit and admission queue.
pub const MAX_REQUESTS: usize = 1_000_000;
/// Most Responses API ids kept for response affinity (about 2 GB).
pub const MAX_RESPONSE_IDS: usize = 10_000_000;

/// `value` within `min..=max`, or an error naming `key` and the range.
fn within<T: PartialOrd + Display>(
    key: &'static str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ConfigError> {
    if value >= min && value <= max {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("must be between {min} and {max}, got {value}"),
        ))
    }
}

/// A finite float within `min..=max` (NaN and infinities fail).
fn finite_within(key: &'static str, value: f64, min: f64, max: f64) -> Result<(), ConfigError> {
    if value.is_finite() && (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("must be a finite number between {min} and {max}, got {value}"),
        ))
    }
}

impl Config {
    /// Reads each worker's `api_key_env` variable into its `api_key` (at
    /// start-up and at every reload); a variable that is not set or is
    /// empty, or a key given both ways, stops loading, the entry named.
    pub fn read_worker_keys(&mut self) -> Result<(), ConfigError> {
        for (i, worker) in self.workers.iter_mut().enumerate() {
            let Some(var) = worker.api_key_env.take() else {
                continue;
            };
            let bad =
                |why: String| invalid("workers", format!("entry {i} ({}): {why}", worker.url));
            if worker.api_key.is_some() {
                return Err(bad("set `api_key` or `api_key_env`, not both".into()));
            }
            let key = std::env::var(&var)
                .map_err(|_| bad(format!("api_key_env `{var}` is not set (or not UTF-8)")))?;
            if key.trim().is_empty() {
                return Err(bad(format!("api_key_env `{var}` is empty")));
            }
            worker.api_key = Some(key.trim().to_owned());
        }
        Ok(())
    }

    /// Checks every value's range; the error names the key and the range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.routing.validate().map_err(|e| match e {
            RoutingError::InvalidConfig { field, reason } => ConfigError::InvalidIn {
                section: "routing",
                field,
                reason,
            },
            other => other.into(),
        })?;
        self.validate_server()?;
        // Each worker once, by its canonical URL (case, a trailing `/` and
        // the scheme's default port aside): a second spelling was
        // refused only once the first was being probed, as "already
        // registered", naming no entry, and `http://w` beside `http://w:80`
        // was taken for two workers.
        let mut seen: std::collections::HashMap<WorkerUrl, usize> =
            std::collections::HashMap::new();
        for (i, worker) in self.workers.iter().enumerate() {
            let url = WorkerUrl::parse(&worker.url)
                .map_err(|err| invalid("workers", format!("entry {i}: {err}")))?;
            if let Some(first) = seen.insert(url.clone(), i) {
                return Err(invalid(
                    "workers",
                    format!(
                        "entries {first} ({}) and {i} ({}) are the same worker, {url}: list it once",
                        self.workers[first].url, worker.url
                    ),
                ));
            }
            if worker.api_key_env.is_some() {
                return Err(invalid(
                    "workers",
                    format!("entry {i}: `api_key_env` is read when the file is loaded"),
                ));
            }
            self.worker_fits(worker)
                .map_err(|why| invalid("workers", format!("entry {i} ({}): {why}", worker.url)))?;
        }
        // Each pool's own settings before whether the pools fit PD.
        self.discovery.validate()?;
        self.validate_pd()?;
        self.validate_health()?;
        self.validate_retry()?;
        self.validate_outlier_detection()?;
        self.validate_breaker_and_admission()?;
        // Reads the key file and `key_env` variables: a bad entry stops
        // start-up (or a reload) here, named.
        let tenants = self.tenants.resolve(self.server.api_key.as_deref())?;
        // A tenant's key is a client key, and no client key opens the
        // admin plane (`server.api_key` is checked with the server's keys).
        let admin = self.server.admin_api_key.as_deref();
        if let Some(tenant) = tenants.iter().find(|t| Some(t.key.as_str()) == admin) {
            return Err(invalid(
                "server.admin_api_key",
                format!(
                    "must differ from every client key, and tenant `{}` has it: the client key \
                     never opens the admin plane",
                    tenant.name
                ),
            ));
        }
        self.sync.validate()?;
        self.kv_events.validate()?;
        self.record_trace.validate()?;
        self.tracing.validate()?;
        self.log.filter()?;
        let metrics_host = self
            .metrics
            .prometheus_host
            .as_deref()
            .unwrap_or(&self.server.host);
        if self.metrics.prometheus_port == Some(self.server.port)
            && self.server.port != 0
            && metrics_host == self.server.host
        {
            return Err(invalid(
                "metrics.prometheus_port",
                "must differ from server.port on the same host (/metrics is served there \
                 already); on another address (metrics.prometheus_host) it may be the same",
            ));
        }
        Ok(())
    }

    /// Whether a worker's entry fits this config: its role fits the pool
    /// (a disaggregated pool has only prefill and decode workers, any
    /// other only regular ones), a bootstrap port belongs to a prefill
    /// worker, a KV cache size given is at least one token, and a key is
    /// one a header can carry. The admin API checks an added worker the
    /// same way.
    pub fn worker_fits(&self, worker: &WorkerSpec) -> Result<(), String> {
        match (self.pd.enabled, worker.role) {
            (true, WorkerRole::Regular) => {
                return Err(
                    "a disaggregated pool (pd.enabled, --pd-disaggregation) has only \
                     prefill and decode workers: give it `role: prefill` or `role: decode` \
                     (or list it with --prefill or --decode)"
                        .to_owned(),
                );
            }
            (false, role @ (WorkerRole::Prefill | WorkerRole::Decode)) => {
                return Err(format!(
                    "`role: {role}` needs a disaggregated pool (pd.enabled, --pd-disaggregation)"
                ));
            }
            _ => {}
        }
        // The registry refuses such a worker on admission: accepted here,
        // it stayed pending for good while its probes passed.
        worker.check_models()?;
        if worker.bootstrap_port.is_some() && worker.role != WorkerRole::Prefill {
            return Err("bootstrap_port is a prefill worker's setting".to_owned());
        }
        if worker.bootstrap_port == Some(0) {
            return Err("bootstrap_port must be between 1 and 65535".to_owned());
        }
        if worker.kv_capacity_tokens == Some(0) {
            // Read as "not known", and, being set, the worker was never
            // asked either: the bound was off without a word.
            return Err(
                "kv_capacity_tokens must be at least 1; leave it out to have the \
                        router ask the worker"
                    .to_owned(),
            );
        }
        if let Some(key) = &worker.api_key {
            // Sent as `Authorization: Bearer <key>` on every request and
            // probe: a key no header carries (a pasted key with its
            // newline) kept the worker pending for good, its probes failing
            // on "failed to parse header value". Not echoed: it is a secret.
            let carried = HeaderValue::from_str(&format!("Bearer {key}")).is_ok();
            if !carried || key.trim() != key || key.is_empty() {
                return Err(
                    "api_key must be non-empty, without control characters or surrounding \
                     whitespace (it is sent as `Authorization: Bearer <api_key>`)"
                        .to_owned(),
                );
            }
        }
        Ok(())
    }

    fn validate_pd(&self) -> Result<(), ConfigError> {
        self.pd.validate()?;
        let discovering = self.discovery.enabled;
        if discovering {
            self.pd_pools_fit()?;
        }
        if !self.pd.enabled {
            return Ok(());
        }
        let pools = if discovering {
            self.discovery.resolved_pools()
        } else {
            Vec::new()
        };
        for role in [WorkerRole::Prefill, WorkerRole::Decode] {
            let listed = self.workers.iter().any(|w| w.role == role);
            if !listed && !pools.iter().any(|p| p.role == role) {
                let discovered = if discovering {
                    format!(
                        ", or a discovery pool: --{role}-selector KEY=VALUE or `role: {role}` in discovery.pools"
                    )
                } else {
                    String::new()
                };
                return Err(invalid(
                    "workers",
                    format!(
                        "a disaggregated pool needs at least one {role} worker \
                         (--{role} URL, or `role: {role}` in workers:{discovered})"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether every discovery pool's role fits the pool, as
    /// [`Self::worker_fits`] holds each listed worker to it.
    fn pd_pools_fit(&self) -> Result<(), ConfigError> {
        let d = &self.discovery;
        if self.pd.enabled && !d.selector.is_empty() {
            return Err(invalid(
                "discovery.selector",
                format!(
                    "`{}` would discover regular workers, and a disaggregated pool \
                     (pd.enabled, --pd-disaggregation) has only prefill and decode workers: \
                     select them with --prefill-selector and --decode-selector, or with \
                     `role: prefill` and `role: decode` in discovery.pools",
                    super::discovery::selector_text(&d.selector)
                ),
            ));
        }
        for (i, pool) in d.pools.iter().enumerate() {
            let selector = super::discovery::selector_text(&pool.selector);
            match (self.pd.enabled, pool.role) {
                (true, WorkerRole::Regular) => {
                    return Err(invalid(
                        "discovery.pools",
                        format!(
                            "entry {i} ({selector}): a disaggregated pool (pd.enabled, \
                             --pd-disaggregation) has only prefill and decode workers: give it \
                             `role: prefill` or `role: decode` (or select it with \
                             --prefill-selector or --decode-selector)"
                        ),
                    ));
                }
                (false, role @ (WorkerRole::Prefill | WorkerRole::Decode)) => {
                    return Err(invalid(
                        "discovery.pools",
                        format!(
                            "entry {i} ({selector}): `role: {role}` needs a disaggregated pool \
                             (pd.enabled, --pd-disaggregation)"
                        ),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn validate_server(&self) -> Result<(), ConfigError> {
        let s = &self.server;
        if s.host.trim().is_empty() {
            return Err(invalid("server.host", "must not be empty"));
        }
        within("server.threads", s.threads, 0, MAX_THREADS)?;
        within(
            "server.max_payload_size",
            s.max_payload_size,
            1,
            MAX_PAYLOAD_SIZE,
        )?;
        within(
            "server.request_timeout_secs",
            s.request_timeout_secs,
            0,
            MAX_SECS,
        )?;
        within(
            "server.shutdown_grace_period_secs",
            s.shutdown_grace_period_secs,
            0,
            MAX_SECS,
        )?;
        within(
            "server.shutdown_delay_secs",
            s.shutdown_delay_secs,
            0,
            MAX_SECS,
        )?;
        within(
            "server.drain_timeout_secs",
            s.drain_timeout_secs,
            0,
            MAX_SECS,
        )?;
        s.validate_access()?;
        for origin in &s.cors_allowed_origins {
            crate::cors::check_origin(origin).map_err(|why| {
                invalid("server.cors_allowed_origins", format!("{origin:?}: {why}"))
            })?;
        }
        for (key, secs) in [
            ("server.body_read_timeout_secs", s.body_read_timeout_secs),
            (
                "server.header_read_timeout_secs",
                s.header_read_timeout_secs,
            ),
            ("server.idle_timeout_secs", s.idle_timeout_secs),
            (
                "server.client_write_timeout_secs",
                s.client_write_timeout_secs,
            ),
        ] {
            within(key, secs, 1, MAX_SECS)?;
        }
        if s.max_buffered_body_bytes < s.max_payload_size {
            return Err(invalid(
                "server.max_buffered_body_bytes",
                format!(
                    "{} is less than server.max_payload_size ({}): no body of the allowed size could ever be read",
                    s.max_buffered_body_bytes, s.max_payload_size
                ),
            ));
        }
        Ok(())
    }

    fn validate_health(&self) -> Result<(), ConfigError> {
        let h = &self.health;
        within("health.interval_secs", h.interval_secs, 1, MAX_SECS)?;
        within("health.timeout_secs", h.timeout_secs, 1, MAX_SECS)?;
        within(
            "health.models_refresh_secs",
            h.models_refresh_secs,
            0,
            MAX_SECS,
        )?;
        if !h.endpoint.starts_with('/') {
            return Err(invalid(
                "health.endpoint",
                format!("`{}` must start with `/`", h.endpoint),
            ));
        }
        within(
            "health.failure_threshold",
            h.failure_threshold,
            1,
            MAX_THRESHOLD,
        )?;
        within(
            "health.success_threshold",
            h.success_threshold,
            1,
            MAX_THRESHOLD,
        )?;
        within(
            "health.unhealthy_backoff_max_ms",
            h.unhealthy_backoff_max_ms,
            1,
            MAX_MS,
        )?;
        within(
            "health.unhealthy_backoff_initial_ms",
            h.unhealthy_backoff_initial_ms,
            1,
            h.unhealthy_backoff_max_ms,
        )
    }

    fn validate_retry(&self) -> Result<(), ConfigError> {
        let r = &self.retry;
        within("retry.max_retries", r.max_retries, 0, MAX_RETRIES)?;
        within("retry.max_backoff_ms", r.max_backoff_ms, 0, MAX_MS)?;
        within(
            "retry.initial_backoff_ms",
            r.initial_backoff_ms,
            0,
            r.max_backoff_ms,
        )?;
        finite_within(
            "retry.backoff_multiplier",
            r.backoff_multiplier,
            1.0,
            MAX_BACKOFF_MULTIPLIER,
        )?;
        finite_within("retry.jitter_factor", r.jitter_factor, 0.0, 1.0)?;
        // 0 means none for each.
        for (key, secs) in [
            ("retry.first_byte_timeout_secs", r.first_byte_timeout_secs),
            ("retry.non_stream_timeout_secs", r.non_stream_timeout_secs),
            ("retry.stall_timeout_secs", r.stall_timeout_secs),
            ("retry.max_retry_after_secs", r.max_retry_after_secs),
        ] {
            within(key, secs, 0, MAX_SECS)?;
        }
        // A percentage past the retries a request may make at all is no
        // budget, but say so rather than take a typo's 10 000.
        within("retry.budget_percent", r.budget_percent, 0, 1000)?;
        within(
            "retry.budget_min_per_sec",
            r.budget_min_per_sec,
            0,
            1_000_000,
        )?;
        Ok(())
    }

    fn validate_outlier_detection(&self) -> Result<(), ConfigError> {
        let o = &self.outlier_detection;
        within(
            "outlier_detection.interval_secs",
            o.interval_secs,
            1,
            MAX_SECS,
        )?;
        if !(o.latency_factor.is_finite() && o.latency_factor > 1.0) {
            return Err(invalid(
                "outlier_detection.latency_factor",
                format!("must be a finite number above 1, got {}", o.latency_factor),
            ));
        }
        finite_within(
            "outlier_detection.latency_factor",
            o.latency_factor,
            1.0,
            MAX_OUTLIER_FACTOR,
        )?;
        within("outlier_detection.min_gap_ms", o.min_gap_ms, 0, MAX_MS)?;
        within(
            "outlier_detection.min_samples",
            o.min_samples,
            1,
            MAX_THRESHOLD,
        )?;
        within(
            "outlier_detection.max_ejection_secs",
            o.max_ejection_secs,
            1,
            MAX_SECS,
        )?;
        within(
            "outlier_detection.base_ejection_secs",
            o.base_ejection_secs,
            1,
            o.max_ejection_secs,
        )?;
        within(
            "outlier_detection.max_ejection_percent",
            o.max_ejection_percent,
            0,
            100,
        )
    }

    fn validate_breaker_and_admission(&self) -> Result<(), ConfigError> {
        let b = &self.circuit_breaker;
        within(
            "circuit_breaker.failure_threshold",
            b.failure_threshold,
            1,
            MAX_THRESHOLD,
        )?;
        within(
            "circuit_breaker.success_threshold",
            b.success_threshold,
            1,
            MAX_THRESHOLD,
        )?;
        within(
            "circuit_breaker.timeout_duration_secs",
            b.timeout_duration_secs,
            1,
            MAX_SECS,
        )?;
        let a = &self.admission;
        if let Some(limit) = a.max_concurrent_requests {
            within("admission.max_concurrent_requests", limit, 1, MAX_REQUESTS).map_err(|_| {
                invalid(
                    "admission.max_concurrent_requests",
                    format!(
                        "must be between 1 and {MAX_REQUESTS} (leave it unset for no \
                             limit), got {limit}"
                    ),
                )
            })?;
        }
        within("admission.queue_size", a.queue_size, 0, MAX_REQUESTS)?;
        within(
            "admission.queue_timeout_secs",
            a.queue_timeout_secs,
            0,
            MAX_SECS,
        )?;
        let r = &self.responses;
        within("responses.max_ids", r.max_ids, 0, MAX_RESPONSE_IDS)?;
        within("responses.max_age_secs", r.max_age_secs, 1, MAX_SECS)
    }
}

/// The sections whose settings only act while a switch is on: the section,
/// its switch as written in the file, how the switch is set on the command
/// line, and whether it is on in `config`.
type Switched = (&'static str, &'static str, &'static str, bool);

impl Config {
    /// Settings given (set to other than their defaults) that do nothing
    /// because the feature they belong to is off, each as a sentence
    /// naming the setting and the switch it needs: `--pd-protocol vllm`
    /// without `--pd-disaggregation`, `--kv-events-port` without
    /// `--kv-events`, `--selector` without `--service-discovery`; and
    /// `--kv-events` under a policy that reads no KV events. Logged at
    /// start-up, so that an operator is not left to find out under load
    /// that the setting was never read.
    pub fn inert_settings(&self) -> Vec<String> {
        use serde_norway::{Value, to_value};
        fn fields<T: serde::Serialize>(now: &T, default: &T) -> Vec<String> {
            match (to_value(now), to_value(default)) {
                (Ok(Value::Mapping(now)), Ok(Value::Mapping(default))) => now
                    .iter()
                    .filter(|(key, value)| default.get(*key) != Some(*value))
                    .filter_map(|(key, _)| key.as_str().map(str::to_owned))
                    .collect(),
                _ => Vec::new(),
            }
        }
        let sections: [(Switched, Vec<String>); 7] = [
            (
                (
                    "pd",
                    "enabled",
                    "--pd-disaggregation turns it on",
                    self.pd.enabled,
                ),
                fields(&self.pd, &super::PdConfig::default()),
            ),
            (
                (
                    "kv_events",
                    "enabled",
                    "--kv-events turns it on",
                    self.kv_events.enabled,
                ),
                fields(&self.kv_events, &super::KvEventsConfig::default()),
            ),
            (
                (
                    "discovery",
                    "enabled",
                    "--service-discovery turns it on",
                    self.discovery.enabled,
                ),
                fields(&self.discovery, &super::DiscoveryConfig::default()),
            ),
            (
                (
                    "sync",
                    "urls",
                    "--sync-url turns it on",
                    !self.sync.urls.is_empty(),
                ),
                fields(&self.sync, &super::SyncConfig::default()),
            ),
            (
                (
                    "metrics",
                    "prometheus_port",
                    "--prometheus-port turns it on",
                    self.metrics.prometheus_port.is_some(),
                ),
                fields(&self.metrics, &super::MetricsConfig::default()),
            ),
            (
                (
                    "circuit_breaker",
                    "enabled",
                    "--disable-circuit-breaker turns it off",
                    self.circuit_breaker.enabled,
                ),
                fields(&self.circuit_breaker, &super::BreakerConfig::default()),
            ),
            (
                (
                    "outlier_detection",
                    "enabled",
                    "--disable-outlier-detection turns it off",
                    self.outlier_detection.enabled,
                ),
                fields(&self.outlier_detection, &super::OutlierConfig::default()),
            ),
        ];
        let mut inert = Vec::new();
        for ((section, switch, flag, on), changed) in sections {
            if on {
                continue;
            }
            for key in changed.iter().filter(|key| *key != switch) {
                inert.push(format!(
                    "`{section}.{key}` is set but does nothing without \
                     `{section}.{switch}` ({flag})"
                ));
            }
        }
        // Only the prefix policies take the exact matches (`routing:`,
        // the prefill pool's in a disaggregated one); under another, every
        // worker is still subscribed and every prompt still tokenized.
        let prefix_policy = matches!(
            self.routing,
            PolicyConfig::CacheAware(_) | PolicyConfig::PrefillAware(_)
        );
        if self.kv_events.enabled && !prefix_policy {
            inert.push(format!(
                "`kv_events.enabled` does nothing for routing with `routing.policy: {}`: \
                 only cache_aware or prefill_aware reads the workers' KV events, which are \
                 still subscribed to and every prompt tokenized for them; choose one of \
                 those (--policy) or leave kv_events off",
                self.routing.name()
            ));
        }
        inert
    }
}
