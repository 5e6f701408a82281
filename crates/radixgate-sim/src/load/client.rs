//! Sends one request and reads its response, classifying every failure.
//!
//! Plain HTTP/1.1 over hyper's pooled client: keep-alive connections are
//! reused across requests and `TCP_NODELAY` is set, since small SSE chunks
//! otherwise wait on Nagle's algorithm. There is no TLS: the tool drives
//! loopback servers and routers; `https://` URLs are refused at start-up.
//! Nothing here panics on a bad response: every malformed or cut response
//! becomes an [`ErrorKind`].

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use super::body::{Api, BodyOptions, Piece, Usage, read_piece, request_body};
use super::outcome::{ErrorKind, Outcome};
use super::sse::SseParser;
use super::target::Target;
use crate::workload::RequestSpec;

/// The response header naming the simulated worker.
pub const WORKER_HEADER: &str = "x-radixgate-sim-worker";

/// A pooled HTTP client.
#[derive(Debug, Clone)]
pub struct Client {
    inner: HyperClient<HttpConnector, Full<Bytes>>,
    opts: BodyOptions,
    timeout: Duration,
    authorization: Option<http::HeaderValue>,
}

struct Reply {
    worker: Option<String>,
    ttft: Option<Duration>,
    usage: Option<Usage>,
    text: String,
}

impl Client {
    /// A client writing bodies per `opts`, failing requests after `timeout`
    /// and sending `authorization` (`--api-key`'s header) with each.
    pub fn new(
        opts: BodyOptions,
        timeout: Duration,
        authorization: Option<http::HeaderValue>,
    ) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.set_connect_timeout(Some(timeout));
        let inner = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(1024)
            .build(conn);
        Self {
            inner,
            opts,
            timeout,
            authorization,
        }
    }

    /// Sends `spec` to `target` (the `index`-th `--url`) and waits for the
    /// whole response.
    pub async fn send(&self, index: usize, target: &Target, spec: &RequestSpec) -> Outcome {
        let start = Instant::now();
        let body = request_body(spec, &self.opts).to_string();
        let result = tokio::time::timeout(self.timeout, self.exchange(target, body, start)).await;
        let e2e = start.elapsed();
        let (reply, error, worker) = match result {
            Err(_) => (None, Some(ErrorKind::Timeout), None),
            Ok(Err((kind, worker))) => (None, Some(kind), worker),
            Ok(Ok(r)) => (Some(r), None, None),
        };
        match reply {
            Some(r) => Outcome {
                target: index,
                worker: r.worker,
                ttft: r.ttft,
                e2e,
                usage: r.usage,
                reply: r.text,
                error: None,
            },
            None => Outcome {
                target: index,
                worker,
                ttft: None,
                e2e,
                usage: None,
                reply: String::new(),
                error,
            },
        }
    }

    async fn exchange(
        &self,
        target: &Target,
        body: String,
        start: Instant,
    ) -> Result<Reply, (ErrorKind, Option<String>)> {
        let mut req = http::Request::post(target.uri(self.opts.api.path()))
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, text/event-stream");
        if let Some(value) = &self.authorization {
            req = req.header(http::header::AUTHORIZATION, value.clone());
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| (ErrorKind::Transport, None))?;
        let resp = self.inner.request(req).await.map_err(|e| {
            let kind = if e.is_connect() {
                ErrorKind::Connect
            } else {
                ErrorKind::Transport
            };
            (kind, None)
        })?;
        let header_worker = resp
            .headers()
            .get(WORKER_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let status = resp.status();
        // A server may answer a stream request with a whole JSON body (or an
        // error page): read what the content type says, not what we asked.
        let is_sse = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut body = resp.into_body();
        if !status.is_success() {
            // Drain (bounded by the caller's timeout) so the connection can
            // be reused; the content does not matter.
            while let Some(Ok(_)) = body.frame().await {}
            return Err((ErrorKind::Status(status.as_u16()), header_worker));
        }
        let fail = |k| (k, header_worker.clone());
        let mut reply = if is_sse {
            self.read_stream(&mut body, start).await.map_err(fail)?
        } else {
            let bytes = body
                .collect()
                .await
                .map_err(|_| fail(ErrorKind::StreamCut))?
                .to_bytes();
            let v: serde_json::Value =
                serde_json::from_slice(&bytes).map_err(|_| fail(ErrorKind::BadBody))?;
            let p = read_piece(self.opts.api, &v).map_err(|_| fail(ErrorKind::BadBody))?;
            if p.error.is_some() {
                return Err(fail(ErrorKind::BadBody));
            }
            let Some(text) = p.text else {
                return Err(fail(ErrorKind::BadBody));
            };
            Reply {
                worker: p.worker,
                ttft: None,
                usage: p.usage,
                text,
            }
        };
        if header_worker.is_some() {
            reply.worker = header_worker;
        }
        Ok(reply)
    }

    async fn read_stream(
        &self,
        body: &mut hyper::body::Incoming,
        start: Instant,
    ) -> Result<Reply, ErrorKind> {
        let mut parser = SseParser::default();
        let mut reply = Reply {
            worker: None,
            ttft: None,
            usage: None,
            text: String::new(),
        };
        loop {
            let Some(frame) = body.frame().await else {
                return Err(ErrorKind::StreamCut);
            };
            let frame = frame.map_err(|_| ErrorKind::StreamCut)?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            for event in parser.feed(data) {
                if event.trim() == "[DONE]" {
                    return Ok(reply);
                }
                let v: serde_json::Value =
                    serde_json::from_str(&event).map_err(|_| ErrorKind::BadBody)?;
                let piece = read_piece(self.opts.api, &v).map_err(|_| ErrorKind::BadBody)?;
                let done = piece.done;
                self.absorb(&mut reply, piece, start)?;
                if done {
                    return Ok(reply);
                }
            }
        }
    }

    fn absorb(&self, reply: &mut Reply, piece: Piece, start: Instant) -> Result<(), ErrorKind> {
        if piece.error.is_some() {
            return Err(ErrorKind::StreamError);
        }
        // A reasoning model's first output tokens are its thinking: they
        // end the time to first token as content would.
        let thought = piece.reasoning.as_deref().is_some_and(|r| !r.is_empty());
        if thought && reply.ttft.is_none() {
            reply.ttft = Some(start.elapsed());
        }
        if let Some(t) = piece.text.filter(|t| !t.is_empty()) {
            if reply.ttft.is_none() {
                reply.ttft = Some(start.elapsed());
            }
            // `/generate` streams carry the text so far; OpenAI streams carry
            // deltas.
            if self.opts.api == Api::Generate && t.starts_with(reply.text.as_str()) {
                reply.text = t;
            } else {
                reply.text.push_str(&t);
            }
        }
        if let Some(usage) = piece.usage {
            // Counts only grow over a stream, and a Messages stream splits
            // them over two events: keep the larger of each (a cached
            // count reported once beats none).
            reply.usage = Some(match reply.usage {
                Some(seen) => Usage {
                    prompt_tokens: seen.prompt_tokens.max(usage.prompt_tokens),
                    cached_tokens: seen.cached_tokens.max(usage.cached_tokens),
                    completion_tokens: seen.completion_tokens.max(usage.completion_tokens),
                },
                None => usage,
            });
        }
        if piece.worker.is_some() {
            reply.worker = piece.worker;
        }
        Ok(())
    }
}
