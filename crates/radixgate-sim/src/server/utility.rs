//! The worker's non-generating model endpoints: `/tokenize`, `/detokenize`
//! (vLLM), `/v1/rerank` (also `/rerank`, `/v2/rerank`) and `/v1/score`
//! (also `/score`), in vLLM's shapes, and Anthropic's
//! `/v1/messages/count_tokens`.
//!
//! None of them decodes, so like embeddings they are answered at once
//! (after the fault knobs) without the engine. Tokenizing uses the
//! worker's tokenizer, on a prompt or on chat messages rendered with its
//! template — the ids a generation request would be cached under. The
//! simulated tokenizer hashes runs of characters, so ids cannot be turned
//! back into text: `/detokenize` answers one placeholder `<|id|>` per id,
//! which keeps the count and the order. Relevance is the share of the
//! query's words that a document contains, so it is deterministic and
//! rises with overlap.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::request::{Api, Prompt, bad, parse};
use super::{WorkerState, error_response, read_body};
use crate::error::SimError;

/// Runs `answer` on the body as every utility endpoint does: counted,
/// bounded, after the fault knobs.
async fn handle(
    s: Arc<WorkerState>,
    body: Body,
    answer: fn(&WorkerState, &[u8]) -> Result<Value, SimError>,
) -> Response {
    s.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let result = async {
        let bytes: Bytes = read_body(body, s.config.max_body_bytes).await?;
        let value = answer(&s, &bytes)?;
        s.request_faults().await?;
        Ok::<_, SimError>(value)
    }
    .await;
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            s.metrics.count_error(&e);
            error_response(&e)
        }
    }
}

/// `POST /tokenize`: `prompt` text, or chat `messages`.
pub(crate) async fn tokenize(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    handle(s, body, |s, bytes| {
        let probe: Value = serde_json::from_slice(bytes).map_err(bad)?;
        let api = if probe.get("messages").is_some() {
            Api::Chat
        } else if probe.get("prompt").is_some() {
            Api::Completions
        } else {
            return Err(SimError::bad_request(
                "one of prompt or messages is required",
                Some("prompt"),
            ));
        };
        let Some(Prompt::Text(text)) = parse(api, bytes, 0)?.items.pop().map(|r| r.prompt) else {
            unreachable!("chat and completions prompts are text")
        };
        let tokens = s.tokens.tokenize(&text);
        Ok(json!({
            "count": tokens.len(),
            "max_model_len": s.config.engine.kv_capacity_tokens,
            "tokens": tokens,
            "token_strs": null,
        }))
    })
    .await
}

/// `POST /v1/messages/count_tokens`: a Messages body's prompt tokens.
pub(crate) async fn count_tokens(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    handle(s, body, |s, bytes| {
        let Prompt::Text(text) = super::conversation::messages(bytes, false)?.prompt else {
            unreachable!("a conversation is text")
        };
        Ok(json!({"input_tokens": s.tokens.count(&text)}))
    })
    .await
}

/// `POST /detokenize`: `tokens`, a list of ids.
pub(crate) async fn detokenize(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    #[derive(Deserialize)]
    struct DetokenizeBody {
        tokens: Vec<u64>,
    }
    handle(s, body, |_, bytes| {
        let b: DetokenizeBody = serde_json::from_slice(bytes).map_err(bad)?;
        let prompt: String = b.tokens.iter().map(|id| format!("<|{id}|>")).collect();
        Ok(json!({"prompt": prompt}))
    })
    .await
}

/// A document to rerank: a string or `{"text": ...}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Document {
    Text(String),
    Object { text: String },
}

impl Document {
    fn text(&self) -> &str {
        match self {
            Document::Text(t) | Document::Object { text: t } => t,
        }
    }
}

fn words(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// The share of `query`'s words found in `doc`, in `[0, 1]`.
fn relevance(query: &str, doc: &str) -> f64 {
    let q = words(query);
    if q.is_empty() {
        return 0.0;
    }
    let d = words(doc);
    q.iter().filter(|w| d.contains(*w)).count() as f64 / q.len() as f64
}

/// `POST /v1/rerank`: the documents by relevance to the query, best first.
pub(crate) async fn rerank(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    #[derive(Deserialize)]
    struct RerankBody {
        query: String,
        documents: Vec<Document>,
        #[serde(default)]
        top_n: Option<usize>,
    }
    handle(s, body, |s, bytes| {
        let b: RerankBody = serde_json::from_slice(bytes).map_err(bad)?;
        let mut scored: Vec<(usize, f64)> = b
            .documents
            .iter()
            .enumerate()
            .map(|(i, d)| (i, relevance(&b.query, d.text())))
            .collect();
        // Best first; equal scores keep their input order.
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.truncate(b.top_n.unwrap_or(scored.len()));
        let tokens: usize = b
            .documents
            .iter()
            .map(|d| s.tokens.count(&b.query) + s.tokens.count(d.text()))
            .sum();
        let results: Vec<Value> = scored
            .iter()
            .map(|&(index, score)| {
                json!({
                    "index": index,
                    "document": {"text": b.documents[index].text()},
                    "relevance_score": score,
                })
            })
            .collect();
        Ok(json!({
            "id": format!("rerank-{}", s.name),
            "model": &*s.model,
            "usage": {"total_tokens": tokens},
            "results": results,
        }))
    })
    .await
}

/// One side of a score request: a text or a list of texts.
#[derive(Deserialize)]
#[serde(untagged)]
enum Texts {
    One(String),
    Many(Vec<String>),
}

impl Texts {
    fn as_slice(&self) -> &[String] {
        match self {
            Texts::One(t) => std::slice::from_ref(t),
            Texts::Many(ts) => ts,
        }
    }
}

/// `POST /v1/score`: a score per (`text_1`, `text_2`) pair — one text
/// against each of a list, or two lists of one length pairwise.
pub(crate) async fn score(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    #[derive(Deserialize)]
    struct ScoreBody {
        text_1: Texts,
        text_2: Texts,
    }
    handle(s, body, |s, bytes| {
        let b: ScoreBody = serde_json::from_slice(bytes).map_err(bad)?;
        let (left, right) = (b.text_1.as_slice(), b.text_2.as_slice());
        let pairs: Vec<(&String, &String)> = match (left, right) {
            ([one], many) => many.iter().map(|r| (one, r)).collect(),
            (l, r) if l.len() == r.len() => l.iter().zip(r).collect(),
            _ => {
                return Err(SimError::bad_request(
                    "text_1 must be one text or as many texts as text_2",
                    Some("text_1"),
                ));
            }
        };
        let tokens: usize = pairs
            .iter()
            .map(|(l, r)| s.tokens.count(l) + s.tokens.count(r))
            .sum();
        let data: Vec<Value> = pairs
            .iter()
            .enumerate()
            .map(|(index, (l, r))| {
                json!({"index": index, "object": "score", "score": relevance(l, r)})
            })
            .collect();
        Ok(json!({
            "id": format!("score-{}", s.name),
            "object": "list",
            "model": &*s.model,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relevance_rises_with_overlap() {
        assert_eq!(relevance("red fox", "the red fox jumps"), 1.0);
        assert_eq!(relevance("red fox", "a red hen"), 0.5);
        assert_eq!(relevance("red fox", "nothing here"), 0.0);
        assert_eq!(relevance("", "anything"), 0.0);
        assert_eq!(relevance("Red, FOX!", "red fox"), 1.0);
    }
}
