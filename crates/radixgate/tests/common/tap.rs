//! A tap in front of a worker: a loopback HTTP server that records the
//! headers and the path and query of every POST it is sent, and passes each request on to the
//! worker behind it and the worker's answer back, streamed, unchanged
//! (less hop-by-hop headers). It shows what a real worker was sent.

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use parking_lot::Mutex;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// A running tap.
pub struct Tap {
    /// Its URL, to give the router as the worker's.
    pub url: String,
    /// The headers of each POST, in arrival order.
    pub seen: Arc<Mutex<Vec<HeaderMap>>>,
    /// The path and query of each POST, in arrival order.
    pub targets: Arc<Mutex<Vec<String>>>,
    pub stop: CancellationToken,
}

impl Tap {
    /// The headers of the POSTs so far.
    pub fn posts(&self) -> Vec<HeaderMap> {
        self.seen.lock().clone()
    }

    /// The paths and queries of the POSTs so far.
    pub fn targets(&self) -> Vec<String> {
        self.targets.lock().clone()
    }

    /// The one value of `name` in the last POST's headers.
    pub fn last(&self, name: &str) -> Option<String> {
        self.seen
            .lock()
            .last()
            .and_then(|h| h.get(name))
            .map(|v| v.to_str().unwrap().to_owned())
    }
}

#[derive(Clone)]
struct Pass {
    upstream: String,
    client: reqwest::Client,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
    targets: Arc<Mutex<Vec<String>>>,
}

/// Starts a tap in front of the worker at `upstream`.
pub async fn tap(upstream: &str) -> Tap {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let targets = Arc::new(Mutex::new(Vec::new()));
    let pass = Pass {
        upstream: upstream.to_owned(),
        client: super::client(),
        seen: seen.clone(),
        targets: targets.clone(),
    };
    let app = Router::new().fallback(forward).with_state(pass);
    let (url, stop) = super::serve_app(app).await;
    Tap {
        url,
        seen,
        targets,
        stop,
    }
}

async fn forward(State(pass): State<Pass>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    if parts.method == Method::POST {
        pass.seen.lock().push(parts.headers.clone());
        pass.targets.lock().push(target.to_owned());
    }
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let mut headers = parts.headers;
    for hop in ["host", "content-length", "connection", "transfer-encoding"] {
        headers.remove(hop);
    }
    let url = format!("{}{target}", pass.upstream);
    let answer = pass
        .client
        .request(parts.method, url)
        .headers(headers)
        .body(body)
        .send()
        .await
        .unwrap();
    let mut out = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !matches!(
            name.as_str(),
            "content-length" | "connection" | "transfer-encoding"
        ) {
            out = out.header(name, value);
        }
    }
    out.body(Body::from_stream(answer.bytes_stream())).unwrap()
}
