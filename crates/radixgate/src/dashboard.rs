//! The live status page: `GET /dashboard` (HTML, script and style built
//! into the binary; no outside fetch), fed once a second by
//! `GET /dashboard/data` (JSON, documented for scripts in
//! docs/dashboard.md). Both sit on the admin plane behind its gate, which
//! here also takes the admin key as an HTTP Basic password so a browser
//! can ask for it ([`crate::admin`]).
//!
//! Cost when nobody watches: one relaxed atomic load per answered request
//! ([`Dashboard::seen`]), and a task parked on a `Notify`. The first read
//! of the data endpoint wakes the sampler (`sampler.rs`), which from then
//! on reads, once a step, the counters and histograms the gateway keeps
//! anyway (its own Prometheus text, `prom.rs`), the worker set's atomics
//! and the control task's worker list, and turns the differences between
//! readings into rates and interval percentiles (`history.rs`). While it
//! runs, the request path also hands each answered request's decision to
//! a small ring (`recent.rs`). [`IDLE_AFTER`] after the last read the
//! sampler forgets everything and parks again.
//!
//! Concurrency: the watched flag and the time of the last read are
//! atomics (sequentially consistent, so a read racing the sampler's
//! decision to park always wakes it; the request path's check is relaxed:
//! a request that misses the first second of watching is not listed); the
//! ring is `recent.rs`'s short lock; the latest answer is a
//! `tokio::sync::watch` of bytes the sampler replaces and handlers clone.

use crate::error::GatewayError;
use crate::state::AppState;
use crate::stream::StreamEnd;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use radixgate_routing::Decision;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{Notify, watch};

mod history;
mod prom;
mod recent;
mod sampler;

pub(crate) use recent::Answered;
pub(crate) use sampler::run;

/// How long the sampler keeps running after the last read of the data
/// endpoint: longer than a minute, since Chrome lets the timers of a tab
/// hidden for five minutes run once a minute, and a tab in the background
/// would otherwise lose its history between two reads.
pub(crate) const IDLE_AFTER: Duration = Duration::from_secs(90);
/// How long a read that woke the sampler waits for its first reading
/// (it takes one at once; only a gateway shutting down misses this).
const FIRST_READING: Duration = Duration::from_secs(10);

const PAGE: &str = include_str!("dashboard/page/index.html");
const SCRIPT: &str = include_str!("dashboard/page/app.js");
const STYLE: &str = include_str!("dashboard/page/style.css");

/// The page's own policy: its script, style and data from this router
/// only, nothing inline, never framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// The dashboard's state, one per gateway (in [`crate::state::Shared`]).
#[derive(Debug)]
pub(crate) struct Dashboard {
    /// Whether the sampler runs; the request path reads it.
    watching: AtomicBool,
    /// When the data endpoint was last read, milliseconds since `epoch`.
    last_read_ms: AtomicU64,
    epoch: Instant,
    /// Wakes the parked sampler.
    wake: Notify,
    /// Answered requests, while watched.
    recent: recent::Recent,
    /// The data endpoint's latest answer; `None` while parked.
    latest: watch::Sender<Option<Bytes>>,
}

impl Default for Dashboard {
    fn default() -> Self {
        Self {
            watching: AtomicBool::new(false),
            last_read_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            wake: Notify::new(),
            recent: recent::Recent::default(),
            latest: watch::Sender::new(None),
        }
    }
}

/// What a watched request keeps until its body ends
/// ([`Dashboard::answered`]).
#[derive(Debug)]
pub(crate) struct Seen {
    worker: String,
    decision: String,
    branch: &'static str,
    /// The decision's (matched, input) characters, for cache policies.
    matched: Option<(usize, usize)>,
    route: &'static str,
    model: Option<String>,
    status: u16,
    ttft: Option<Duration>,
}

impl Seen {
    /// The first token went out, `elapsed` after the request arrived.
    pub(crate) fn first_token(&mut self, elapsed: Duration) {
        self.ttft.get_or_insert(elapsed);
    }
}

impl Dashboard {
    /// The request path's hook, when a worker's answer is handed to the
    /// client: `None` at the cost of one relaxed load while nobody
    /// watches, else what [`answered`](Self::answered) will list.
    /// `rendered` is the `x-radixgate-decision` header's text.
    #[inline]
    pub(crate) fn seen(
        &self,
        decision: &Decision,
        rendered: &str,
        route: &'static str,
        model: Option<&str>,
        status: u16,
    ) -> Option<Seen> {
        if !self.watching.load(Ordering::Relaxed) {
            return None;
        }
        let e = decision.explanation();
        Some(Seen {
            worker: decision.worker().url().to_owned(),
            decision: rendered.to_owned(),
            branch: e.branch.as_str(),
            matched: e.matched_chars.map(|m| (m, e.input_chars)),
            route,
            model: model.map(str::to_owned),
            status,
            ttft: None,
        })
    }

    /// A watched request's body ended, `elapsed` after it arrived.
    pub(crate) fn answered(&self, seen: Seen, end: StreamEnd, elapsed: Duration) {
        if !self.watching.load(Ordering::Relaxed) {
            return;
        }
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let answered = Answered {
            at_ms: unix_ms(),
            route: seen.route,
            model: seen.model,
            status: seen.status,
            worker: seen.worker,
            decision: seen.decision,
            branch: seen.branch,
            ttft_ms: seen.ttft.map(ms),
            latency_ms: ms(elapsed),
            end: match end {
                StreamEnd::Complete => "complete",
                StreamEnd::UpstreamError => "upstream_error",
                StreamEnd::ClientGone => "client_gone",
                StreamEnd::Shutdown => "shutdown",
                StreamEnd::TimedOut => "timed_out",
            },
        };
        self.recent.push(answered, seen.matched);
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The data endpoint was read: keeps the sampler running, waking it
    /// if parked.
    fn read(&self) {
        self.last_read_ms.store(self.now_ms(), Ordering::SeqCst);
        if !self.watching.swap(true, Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// The sampler's question each step: has nobody read for
    /// [`IDLE_AFTER`]? If so the request path stops recording, unless a
    /// read came in meanwhile (then it keeps going).
    fn idle(&self) -> bool {
        let fresh = |d: &Self| {
            d.now_ms()
                .saturating_sub(d.last_read_ms.load(Ordering::SeqCst))
                < IDLE_AFTER.as_millis() as u64
        };
        if fresh(self) {
            return false;
        }
        self.watching.store(false, Ordering::SeqCst);
        // A read between the check and the store set the flag before it
        // was cleared, so it did not wake the sampler: look again.
        if fresh(self) {
            self.watching.store(true, Ordering::SeqCst);
            return false;
        }
        true
    }
}

/// Milliseconds since the Unix epoch (0 for a clock before it).
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The dashboard's routes; the admin plane puts its gate in front.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/dashboard", get(page))
        .route("/dashboard/app.js", get(script))
        .route("/dashboard/style.css", get(style))
        .route("/dashboard/data", get(data))
}

/// A static asset with its type and the page's protections.
fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // A new binary's page is fetched again, not taken from a cache.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

async fn page() -> Response {
    asset(PAGE, "text/html; charset=utf-8")
}

async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

/// `GET /dashboard/data`: the sampler's latest answer; the first read
/// after an idle spell wakes it and waits for its first reading.
async fn data(State(state): State<Arc<AppState>>) -> Response {
    let dashboard = &state.shared.dashboard;
    let mut latest = dashboard.latest.subscribe();
    dashboard.read();
    let ready = tokio::time::timeout(FIRST_READING, latest.wait_for(Option::is_some)).await;
    let body = match ready {
        Ok(Ok(body)) => body.clone(),
        _ => None,
    };
    let Some(body) = body else {
        return GatewayError::ShuttingDown.into_response();
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_wakes_the_sampler_once_and_idleness_parks_it() {
        let d = Dashboard::default();
        assert!(!d.watching.load(Ordering::SeqCst));
        d.read();
        assert!(d.watching.load(Ordering::SeqCst));
        assert!(!d.idle(), "just read");
        assert!(d.watching.load(Ordering::SeqCst));
        // A gateway whose last read (at 0) was long ago.
        let long_ago = Dashboard {
            epoch: Instant::now() - IDLE_AFTER - Duration::from_secs(1),
            ..Dashboard::default()
        };
        long_ago.watching.store(true, Ordering::SeqCst);
        assert!(long_ago.idle());
        assert!(!long_ago.watching.load(Ordering::SeqCst));
        // A later read sets the flag again (and leaves a wake-up).
        long_ago.read();
        assert!(long_ago.watching.load(Ordering::SeqCst));
        assert!(!long_ago.idle());
    }
}
