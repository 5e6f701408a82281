//! The accept loop of one worker: HTTP/1.1 and h2c on one port, with the
//! connection-level fault knobs (refuse, slow start).
//!
//! While the knobs say "refuse", the listening socket is closed (clients get
//! connection refused) and open connections are dropped; when they clear,
//! the same address is bound again. Every accepted socket gets TCP_NODELAY
//! (streamed responses otherwise stall on Nagle + delayed ACK).
//!
//! Concurrency: one task per worker accepts; one task per connection
//! serves it until it ends, the worker shuts down, or a refuse knob drops
//! all connections (each generation of connections shares a child token).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tower::ServiceExt;

use super::WorkerState;
use super::faults::Accepting;

/// The response header naming the worker.
pub const WORKER_HEADER: &str = "x-radixgate-sim-worker";

/// Serves `router` on `listener` (bound to `addr`) until shutdown.
pub(crate) async fn serve(
    listener: TcpListener,
    addr: SocketAddr,
    router: axum::Router,
    state: Arc<WorkerState>,
) {
    let shutdown = state.shutdown.clone();
    let header_value =
        HeaderValue::from_str(&state.name).unwrap_or_else(|_| HeaderValue::from_static("worker"));
    let mut changes = state.faults.subscribe();
    let mut listener = Some(listener);
    let mut conns = shutdown.child_token();
    loop {
        match state.faults.accepting() {
            Accepting::Yes => {}
            refusing => {
                if listener.take().is_some() {
                    tracing::info!(worker = %state.name, "refusing connections (fault knob)");
                }
                conns.cancel();
                conns = shutdown.child_token();
                let until = match refusing {
                    Accepting::NoUntil(t) => tokio::time::Instant::from_std(t),
                    _ => tokio::time::Instant::now() + Duration::from_secs(86_400 * 365),
                };
                tokio::select! {
                    _ = changes.changed() => {}
                    () = tokio::time::sleep_until(until) => {}
                    () = shutdown.cancelled() => return,
                }
                continue;
            }
        }
        let l = match &listener {
            Some(l) => l,
            None => match TcpListener::bind(addr).await {
                Ok(l) => listener.insert(l),
                Err(e) => {
                    tracing::warn!(worker = %state.name, %addr, error = %e, "rebind failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                        () = shutdown.cancelled() => return,
                    }
                    continue;
                }
            },
        };
        let accepted = tokio::select! {
            r = l.accept() => r,
            _ = changes.changed() => continue,
            () = shutdown.cancelled() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Usually a transient resource error (e.g. out of file
                // descriptors): back off briefly instead of spinning.
                tracing::warn!(worker = %state.name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let header_value = header_value.clone();
        let token = conns.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let router = router.clone();
                let header_value = header_value.clone();
                async move {
                    let mut resp = router.oneshot(req).await?;
                    resp.headers_mut()
                        .insert(HeaderName::from_static(WORKER_HEADER), header_value);
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                () = token.cancelled() => {}
            }
        });
    }
}
