//! The process's `tracing` subscriber: log lines, and with
//! `--otlp-endpoint` the OpenTelemetry layer and its OTLP/HTTP exporter.
//!
//! Two layers on one registry, each with its own filter (see the targets
//! in [`super`]): the log layer (text or JSON on stderr) takes the log
//! filter (`--log-level`, `RUST_LOG`) plus the `request` span at any level
//! and never an exported span; the OpenTelemetry layer takes only the
//! exported spans.
//!
//! Export never waits on the request path: a span that ends is handed to
//! the SDK's batch processor with a non-blocking send into a bounded queue
//! ([`QUEUE`] spans; when it is full the span is dropped, not waited for),
//! and batches are posted from the processor's own thread. The post itself
//! runs on the runtime handed to [`init`] (the binary's control runtime,
//! never a serving thread), through the router's own `reqwest` client
//! ([`Poster`]), with a [`POST_TIMEOUT`]; the processor's thread waits for
//! it, so a dead or slow collector costs that thread's time and dropped
//! spans, nothing else. The first failure is logged once (WARN), and the
//! first success after failures once (INFO). Every span is counted as
//! exported or dropped, and why ([`counts`]).

use super::OTEL_TARGET;
use super::request_log::LogFormat;
use crate::config::TracingConfig;
use bytes::Bytes;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter, filter_fn};
use tracing_subscriber::layer::Filter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

mod counts;
pub(crate) use counts::SpanMetrics;

/// Spans waiting for export at most; more are dropped (and counted).
pub const QUEUE: usize = 4096;
/// Spans per export request at most.
const BATCH: usize = 512;
/// Longest a batch waits before it is sent.
const BATCH_DELAY: Duration = Duration::from_secs(1);
/// Longest one export request may take (connect, send, answer).
pub const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a collector's answer read (an OTLP answer is a few bytes).
const ANSWER_LIMIT: usize = 64 * 1024;

/// How log lines are written.
#[derive(Clone, Copy, Debug)]
pub struct Logs<'a> {
    /// A `tracing` filter (`info`, `radixgate=debug,info`); `RUST_LOG`
    /// overrides it.
    pub level: &'a str,
    /// One JSON object per line instead of text.
    pub json: bool,
    /// Colours (only on a terminal).
    pub ansi: bool,
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The OTLP exporter could not be built.
    #[error("cannot set up OTLP export to `tracing.otlp_endpoint`: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// The endpoint is not a URL (validation catches it first).
    #[error("invalid `tracing.otlp_endpoint`: {0}")]
    Endpoint(String),
    /// The exporter's HTTP client could not be built.
    #[error("cannot build the OTLP HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    /// A subscriber was already installed in this process.
    #[error("a tracing subscriber is already installed: {0}")]
    Installed(#[from] tracing_subscriber::util::TryInitError),
}

/// The exporter, kept until shutdown flushes it.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports what is still queued (waiting at most 5 s, the SDK's), then
    /// stops the exporter. Call it from the runtime given to [`init`]: the
    /// last posts run there.
    pub async fn shutdown(self) {
        if let Some(provider) = self.provider {
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
    }
}

/// The log filter: `RUST_LOG` where set, else `level`. A bare level
/// (`info`, `warn`, ...), the usual case, is a [`LevelFilter`]: an
/// [`EnvFilter`] lets the same lines through but also follows every span
/// in and out (for directives that name spans), a few hundred instructions
/// a request for nothing. A bare level also leaves out the NATS client's
/// lines below WARN (see [`nats_chatter`]).
fn level_filter(level: &str) -> Box<dyn Filter<Registry> + Send + Sync> {
    match EnvFilter::try_from_default_env() {
        Ok(env) => Box::new(env),
        Err(_) => match level.parse::<LevelFilter>() {
            Ok(level) => Box::new(level.and(filter_fn(|m| !nats_chatter(m)))),
            Err(_) => Box::new(EnvFilter::new(level)),
        },
    }
}

/// The NATS client's own INFO lines (and below): one per connection event
/// (`event: ...`, `connected successfully`), which replica sync logs
/// itself, with the lane and what to do, and once a minute at most where
/// it recurs. A server error reported for each message refused (a
/// permission missing) was one such line per message. Its WARN and ERROR
/// lines stay; `RUST_LOG` (`info,async_nats=info`) brings the rest back.
fn nats_chatter(m: &tracing::Metadata<'_>) -> bool {
    *m.level() > tracing::Level::WARN && m.target().starts_with("async_nats")
}

/// Installs the process's subscriber: log lines as `logs` says, and with
/// `tracing.otlp_endpoint` set the OpenTelemetry layer exporting to it,
/// posting from `runtime`.
pub fn init(
    logs: Logs<'_>,
    tracing: Option<(&TracingConfig, tokio::runtime::Handle)>,
) -> Result<Telemetry, TraceError> {
    // The log filter, never an exported span.
    let log_filter = level_filter(logs.level).and(filter_fn(|m| m.target() != OTEL_TARGET));
    let log_layer = tracing_subscriber::fmt::layer()
        .with_ansi(logs.ansi)
        .with_writer(super::capped::Capped::stderr(logs.json));
    // Each line with the request it is about, if any (`request_log`).
    let log_layer = match logs.json {
        true => log_layer
            .json()
            .map_event_format(LogFormat::json)
            .with_filter(log_filter)
            .boxed(),
        false => log_layer
            .event_format(LogFormat::text(
                tracing_subscriber::fmt::format()
                    .without_time()
                    .with_level(false),
            ))
            .with_filter(log_filter)
            .boxed(),
    };
    let (otel_layer, provider) = match tracing {
        Some((config, runtime)) if config.otlp_endpoint.is_some() => {
            let provider = provider(config, runtime)?;
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("radixgate"))
                .with_location(false)
                .with_threads(false)
                .with_level(false)
                .with_target(false)
                .with_tracked_inactivity(false)
                .with_filter(filter_fn(|m| m.is_span() && m.target() == OTEL_TARGET))
                .boxed();
            (Some(layer), Some(provider))
        }
        _ => (None, None),
    };
    let exporting = otel_layer.is_some();
    let layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = [Some(log_layer), otel_layer]
        .into_iter()
        .flatten()
        .collect();
    tracing_subscriber::registry().with(layers).try_init()?;
    super::EXPORTING.store(exporting, Ordering::Relaxed);
    std::panic::set_hook(Box::new(log_panic));
    Ok(Telemetry { provider })
}

/// The panic hook: a panic is an ERROR log line like any other, in the
/// log's format and with the request it happened in (a JSON log's
/// collector would not parse the default hook's bare lines), with where it
/// happened and, when `RUST_BACKTRACE` asks for one, the backtrace. A
/// request's handler that panics is then answered 500
/// (`request_id::Answered`); a background task's panic ends that task.
fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let message = panic_message(info.payload());
    let location = info
        .location()
        .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
        .unwrap_or_default();
    let thread = std::thread::current();
    let thread = thread.name().unwrap_or("unnamed");
    let backtrace = std::backtrace::Backtrace::capture();
    match backtrace.status() {
        std::backtrace::BacktraceStatus::Captured => tracing::error!(
            thread,
            location,
            %backtrace,
            "panicked (a bug; please report it): {message}"
        ),
        _ => tracing::error!(
            thread,
            location,
            "panicked (a bug; please report it): {message}"
        ),
    }
}

/// A panic's message: its payload when that is text.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// The tracer provider: batch export over OTLP/HTTP (protobuf) to the
/// configured endpoint, sampling what the client's `traceparent` says
/// (everything when it sent none).
fn provider(
    config: &TracingConfig,
    runtime: tokio::runtime::Handle,
) -> Result<SdkTracerProvider, TraceError> {
    let endpoint = config.otlp_endpoint.as_deref().unwrap_or_default();
    let url = crate::config::otlp_traces_url(endpoint).map_err(TraceError::Endpoint)?;
    let poster = Poster {
        client: crate::upstream::client()?,
        runtime,
        url: url.clone(),
        failing: Arc::new(AtomicBool::new(false)),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(poster)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(POST_TIMEOUT)
        .build()?;
    let batches = BatchConfigBuilder::default()
        .with_max_queue_size(QUEUE)
        .with_max_export_batch_size(BATCH)
        .with_scheduled_delay(BATCH_DELAY)
        .build();
    let processor = BatchSpanProcessor::builder(counts::Counted(exporter))
        .with_batch_config(batches)
        .build();
    let processor = counts::Gate::new(processor, QUEUE);
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(config.service_name.clone())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
        .build())
}

/// Posts export batches with the router's `reqwest` client on a tokio
/// runtime, whichever thread asks (the batch processor's own thread has
/// none), and logs the first failure of a run of failures.
#[derive(Debug)]
struct Poster {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
    url: String,
    /// Set while posts fail: only the first failure is logged.
    failing: Arc<AtomicBool>,
}

impl Poster {
    /// Logs a change between working and failing, once each way.
    fn note(&self, failure: Option<String>) {
        match failure {
            Some(why) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        endpoint = %self.url,
                        error = %why,
                        "OTLP span export failed; spans are dropped until it works again \
                         (requests are not slowed); logged once"
                    );
                }
            }
            None => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %self.url, "OTLP span export works again");
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for Poster {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let mut request = reqwest::Request::try_from(request)?;
        *request.timeout_mut() = Some(POST_TIMEOUT);
        let client = self.client.clone();
        let posted = self.runtime.spawn(async move {
            let mut response = client.execute(request).await?;
            let mut body = bytes::BytesMut::new();
            while let Some(chunk) = response.chunk().await? {
                if body.len() + chunk.len() > ANSWER_LIMIT {
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok::<_, reqwest::Error>((response.status(), body.freeze()))
        });
        let answer = match posted.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(err)) => {
                self.note(Some(crate::error::chain(&err)));
                return Err(Box::new(err));
            }
            Err(err) => {
                self.note(Some(err.to_string()));
                return Err(Box::new(err));
            }
        };
        let (status, body) = answer;
        self.note((!status.is_success()).then(|| format!("the collector answered {status}")));
        let mut response = http::Response::new(body);
        *response.status_mut() = status;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panics_message_is_its_text_payload() {
        let message = |f: fn()| {
            let payload = std::panic::catch_unwind(f).unwrap_err();
            panic_message(payload.as_ref()).to_owned()
        };
        assert_eq!(message(|| panic!("static text")), "static text");
        assert_eq!(message(|| panic!("formatted {}", 7)), "formatted 7");
        assert_eq!(message(|| std::panic::panic_any(7_u32)), "(no message)");
    }
}
