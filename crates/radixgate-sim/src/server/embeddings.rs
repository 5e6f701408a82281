//! `POST /v1/embeddings`: an OpenAI-shaped answer with deterministic vectors.
//!
//! Embedding requests carry no prefix worth caching and no decode, so they
//! do not go through the engine: the worker answers at once (after the
//! fault knobs), with one unit vector per input derived from a hash of its
//! text, so the same input always gets the same vector, and `usage` counts
//! the input's tokens as the simulated tokenizer does.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{WorkerState, error_response, read_body};
use crate::error::SimError;
use crate::tokens::text_hash;

/// Dimensions of a simulated embedding.
const DIMENSIONS: usize = 16;

#[derive(Deserialize)]
struct EmbeddingBody {
    input: Value,
}

/// One input: text, or token ids.
enum Input {
    Text(String),
    Ids(Vec<u64>),
}

/// `POST /v1/embeddings`.
pub(crate) async fn embeddings(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    s.metrics.requests.fetch_add(1, Ordering::Relaxed);
    match serve(&s, body).await {
        Ok(r) => r,
        Err(e) => {
            s.metrics.count_error(&e);
            error_response(&e)
        }
    }
}

async fn serve(s: &Arc<WorkerState>, body: Body) -> Result<Response, SimError> {
    let bytes = read_body(body, s.config.max_body_bytes).await?;
    let req: EmbeddingBody = serde_json::from_slice(&bytes).map_err(|e| SimError::BadRequest {
        message: format!("invalid embeddings request: {e}"),
        param: None,
    })?;
    let inputs = inputs(req.input)?;
    s.request_faults().await?;
    let mut tokens = 0;
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, input)| {
            let (seed, n) = match input {
                Input::Text(t) => (text_hash(t), s.tokens.count(t)),
                Input::Ids(ids) => {
                    let text = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
                    (text_hash(&text), ids.len())
                }
            };
            tokens += n;
            json!({"object": "embedding", "index": index, "embedding": vector(seed)})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": &*s.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

/// The request's inputs: a string, strings, token ids, or lists of ids.
fn inputs(input: Value) -> Result<Vec<Input>, SimError> {
    let bad = || SimError::BadRequest {
        message: "`input` must be a string, an array of strings, an array of token ids \
                  or an array of arrays of token ids"
            .into(),
        param: Some("input".into()),
    };
    let ids = |items: &[Value]| -> Option<Vec<u64>> { items.iter().map(Value::as_u64).collect() };
    match input {
        Value::String(t) => Ok(vec![Input::Text(t)]),
        Value::Array(items) if items.is_empty() => Err(bad()),
        Value::Array(items) => {
            if let Some(ids) = ids(&items) {
                return Ok(vec![Input::Ids(ids)]);
            }
            items
                .into_iter()
                .map(|item| match item {
                    Value::String(t) => Ok(Input::Text(t)),
                    Value::Array(inner) => ids(&inner).map(Input::Ids).ok_or_else(bad),
                    _ => Err(bad()),
                })
                .collect()
        }
        _ => Err(bad()),
    }
}

/// A unit vector from `seed` (a splitmix64 stream mapped to [-1, 1]).
fn vector(mut seed: u64) -> Vec<f32> {
    let mut v: Vec<f32> = (0..DIMENSIONS)
        .map(|_| {
            seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
        })
        .collect();
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::MIN_POSITIVE);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_are_unit_length_and_deterministic() {
        let a = vector(text_hash("hello"));
        assert_eq!(a.len(), DIMENSIONS);
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert_eq!(a, vector(text_hash("hello")));
        assert_ne!(a, vector(text_hash("hellp")));
    }

    #[test]
    fn every_input_form_is_read_and_others_refused() {
        assert_eq!(inputs(json!("x")).unwrap().len(), 1);
        assert_eq!(inputs(json!(["a", "b", "c"])).unwrap().len(), 3);
        assert!(matches!(&inputs(json!([1, 2, 3])).unwrap()[..], [Input::Ids(v)] if v.len() == 3));
        assert_eq!(inputs(json!([[1, 2], [3]])).unwrap().len(), 2);
        for bad in [
            json!(3),
            json!([]),
            json!([{"a": 1}]),
            json!(["a", 1]),
            json!([[1, "x"]]),
        ] {
            assert!(inputs(bad.clone()).is_err(), "{bad}");
        }
    }
}
