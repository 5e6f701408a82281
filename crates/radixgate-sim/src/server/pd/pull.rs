//! The decode side: pull a prompt's KV from the prefill worker that holds
//! it, then wait the time moving it takes.
//!
//! The pull is a real HTTP exchange (`GET http://{host}:{port}/kv/{key}`
//! over hyper's pooled client), bounded by `transfer_timeout_ms`: a KV that
//! never arrives, a prefill that failed or died, or one that does not know
//! the room, each become a [`SimError::KvTransfer`] naming the room. Then
//! the transfer itself: `tokens × kv_bytes_per_token / transfer_bandwidth`
//! of simulated time (slept), after which the caller submits the request
//! to its engine as transferred.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::error::{SimError, TransferFailure};
use crate::server::WorkerState;

/// Where a decode request's KV is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Source {
    /// The prefill worker's host (its bootstrap host or `remote_host`).
    pub(crate) host: String,
    /// Its pull port (bootstrap port, or `remote_port`).
    pub(crate) port: u16,
    /// The room (SGLang) or `remote_request_id` (vLLM).
    pub(crate) key: String,
}

impl Source {
    fn url(&self) -> String {
        let host = if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("http://{host}:{}/kv/{}", self.port, self.key)
    }
}

/// The pooled client decode workers pull with.
#[derive(Clone)]
pub(crate) struct PullClient(Client<HttpConnector, Empty<Bytes>>);

impl PullClient {
    pub(crate) fn new() -> Self {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        Self(
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(conn),
        )
    }
}

fn failed(src: &Source, reason: String, failure: TransferFailure) -> SimError {
    SimError::KvTransfer {
        room: src.key.clone(),
        reason,
        failure,
    }
}

/// One pull: the prompt tokens the prefill worker reports for the room.
async fn fetch(client: &PullClient, src: &Source) -> Result<usize, SimError> {
    let at = format!("{}:{}", src.host, src.port);
    let uri: hyper::Uri = src.url().parse().map_err(|e| {
        failed(
            src,
            format!("cannot pull from {at}: {e}"),
            TransferFailure::Unreachable,
        )
    })?;
    let resp = client.0.get(uri).await.map_err(|e| {
        failed(
            src,
            format!("cannot reach the prefill worker's bootstrap server at {at}: {e}"),
            TransferFailure::Unreachable,
        )
    })?;
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(|e| {
        failed(
            src,
            format!("the prefill worker at {at} dropped the transfer: {e}"),
            TransferFailure::Unreachable,
        )
    })?;
    let v: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap_or_default();
    if !status.is_success() {
        let said = v["error"]["message"].as_str().map_or_else(
            || format!("HTTP {status}"),
            |m| format!("HTTP {status}: {m}"),
        );
        return Err(failed(
            src,
            format!("the prefill worker at {at} answered {said}"),
            TransferFailure::Unreachable,
        ));
    }
    v["tokens"].as_u64().map(|t| t as usize).ok_or_else(|| {
        failed(
            src,
            format!("the prefill worker at {at} answered no token count"),
            TransferFailure::Unreachable,
        )
    })
}

/// A request waiting for its KV, in `/metrics`: dropped before
/// [`Waiting::done`] (its client went away, so its future was dropped),
/// it counts as cancelled.
struct Waiting<'a> {
    s: &'a WorkerState,
    armed: bool,
}

impl<'a> Waiting<'a> {
    fn new(s: &'a WorkerState) -> Self {
        s.metrics
            .kv_transfers_waiting
            .fetch_add(1, Ordering::Relaxed);
        Self { s, armed: true }
    }

    fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let m = &self.s.metrics;
        m.kv_transfers_waiting.fetch_sub(1, Ordering::Relaxed);
        if self.armed {
            m.count(&m.cancelled_outside_engine, 1);
        }
    }
}

/// Pulls `src`'s KV (bounded by the transfer timeout) and waits its
/// transfer time (none with `--instant`). Counts the outcome in
/// `/metrics`, and a cancel when the future is dropped before it ends.
pub(crate) async fn transfer(s: &WorkerState, src: &Source) -> Result<(), SimError> {
    let waiting = Waiting::new(s);
    let r = pull_and_move(s, src).await;
    waiting.done();
    r
}

async fn pull_and_move(s: &WorkerState, src: &Source) -> Result<(), SimError> {
    let pd = &s.config.pd;
    let timeout = Duration::from_millis(pd.transfer_timeout_ms);
    let m = &s.metrics;
    let tokens = match tokio::time::timeout(timeout, fetch(&s.pull, src)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            m.count(&m.kv_transfer_errors, 1);
            return Err(e);
        }
        Err(_) => {
            m.count(&m.kv_transfer_errors, 1);
            return Err(failed(
                src,
                format!(
                    "the KV did not arrive from {}:{} within the transfer timeout of {} ms",
                    src.host, src.port, pd.transfer_timeout_ms
                ),
                TransferFailure::TimedOut,
            ));
        }
    };
    let took = if s.config.instant {
        Duration::ZERO
    } else {
        pd.transfer_time(tokens)
    };
    tokio::time::sleep(took).await;
    m.count(&m.kv_transfers, 1);
    m.count(&m.kv_transfer_tokens, tokens as u64);
    m.kv_transfer_micros
        .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    Ok(())
}
