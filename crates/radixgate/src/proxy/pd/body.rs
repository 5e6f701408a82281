//! The bodies of a disaggregated request, edited by key: SGLang's
//! bootstrap fields, vLLM's two steps. The client's body is read as its
//! top-level fields with their values as written ([`RawValue`]), so every
//! value passes on byte for byte; only the object's key order and the
//! white space between keys may change. A body that is not a JSON object
//! is the client's error.

use crate::config::PdProtocol;
use crate::error::GatewayError;
use crate::inspect::Api;
use bytes::Bytes;
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// A request body's top-level fields, their values as the client wrote
/// them.
type Fields = BTreeMap<String, Box<RawValue>>;

/// The top-level fields of `bytes`, after a byte order mark that the
/// request's inspection passed over (the body sent on is written anew,
/// without it).
fn fields(bytes: &[u8]) -> Result<Fields, GatewayError> {
    let bytes = crate::inspect::without_bom(bytes);
    serde_json::from_slice(bytes).map_err(|e| GatewayError::BadRequest(e.into()))
}

fn to_bytes(fields: &Fields) -> Result<Bytes, GatewayError> {
    serde_json::to_vec(fields)
        .map(Bytes::from)
        .map_err(|e| GatewayError::BadRequest(e.into()))
}

fn raw(json: String) -> Box<RawValue> {
    RawValue::from_string(json).expect("the gateway writes valid JSON")
}

/// The most prompts a disaggregated batch may carry. Each gets its own
/// bootstrap host, port and room in the body sent to both workers, about
/// 40 bytes a prompt, where the client may have written 3 (`"",`): without
/// a limit, one body of 32 MiB made the router build and send two of over
/// 400 MB. Far above the batches engines are sent in practice.
pub(super) const MAX_BATCH_PROMPTS: usize = 65_536;

/// A JSON array's length, and whether its first item is a string or a list
/// (a batch of prompts, rather than one prompt of token ids), read without
/// keeping its items.
struct Items {
    len: usize,
    nested: bool,
}

impl<'de> serde::Deserialize<'de> for Items {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Count;
        impl<'de> serde::de::Visitor<'de> for Count {
            type Value = Items;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Items, A::Error> {
                let Some(first) = seq.next_element::<&'de RawValue>()? else {
                    return Ok(Items {
                        len: 0,
                        nested: false,
                    });
                };
                let nested = matches!(
                    first.get().trim_start().as_bytes().first(),
                    Some(b'[' | b'"')
                );
                let mut len = 1;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    len += 1;
                }
                Ok(Items { len, nested })
            }
        }
        deserializer.deserialize_seq(Count)
    }
}

/// How many prompts a request carries: `Some(n)` for a batch (SGLang
/// `/generate` with a list of texts or of token-id lists, `/v1/completions`
/// with a list of prompts), `None` for one.
fn batch_size(api: Api, fields: &Fields) -> Option<usize> {
    let list = |key: &str| serde_json::from_str::<Items>(fields.get(key)?.get()).ok();
    match api {
        Api::Generate => {
            if let Some(texts) = list("text") {
                return Some(texts.len);
            }
            list("input_ids")
                .filter(|ids| ids.nested)
                .map(|ids| ids.len)
        }
        Api::Completions => list("prompt").filter(|p| p.nested).map(|p| p.len),
        _ => None,
    }
}

/// Refuses a batch the pair cannot serve under `protocol`, before any
/// worker is chosen: the client's error, counted on no side. Under
/// SGLang, one of more than [`MAX_BATCH_PROMPTS`]. Under vLLM, a `/v1/completions`
/// batch: vLLM answers its prefill step with one `kv_transfer_params` (its
/// first prompt's) and applies the one it is sent to every prompt, so
/// decode would read the first prompt's KV for all of them.
pub(super) fn check_batch(
    api: Api,
    protocol: PdProtocol,
    bytes: &[u8],
) -> Result<(), GatewayError> {
    if !matches!(api, Api::Generate | Api::Completions) {
        return Ok(());
    }
    let Some(n) = batch_size(api, &fields(bytes)?) else {
        return Ok(());
    };
    let why = match protocol {
        PdProtocol::Sglang if n > MAX_BATCH_PROMPTS => format!(
            "a batch of {n} prompts is over the {MAX_BATCH_PROMPTS} this gateway sends to a \
             prefill and decode pair in one request; split it"
        ),
        PdProtocol::Vllm if n > 1 => format!(
            "a batch of {n} prompts: a vLLM prefill/decode pool takes one prompt per \
             request (vLLM's prefill answers a batch with one prompt's \
             kv_transfer_params, which decode would read for every prompt); send each \
             prompt as a request of its own"
        ),
        _ => return Ok(()),
    };
    Err(GatewayError::InvalidRequest(why))
}

/// `[item, item, …]`, `n` items made by `item`.
fn array(n: usize, mut item: impl FnMut(&mut String)) -> String {
    let mut out = String::with_capacity(2 + n * 8);
    out.push('[');
    for i in 0..n {
        if i > 0 {
            out.push(',');
        }
        item(&mut out);
    }
    out.push(']');
    out
}

/// The SGLang body: the client's plus `bootstrap_host`, `bootstrap_port`
/// and a fresh `bootstrap_room` (arrays for a batch, which
/// [`check_batch`] has held to [`MAX_BATCH_PROMPTS`] prompts).
pub(super) fn with_bootstrap(
    api: Api,
    bytes: &[u8],
    host: &str,
    port: Option<u16>,
) -> Result<Bytes, GatewayError> {
    let mut fields = fields(bytes)?;
    let host = serde_json::to_string(host).expect("a string");
    let port = port.map_or_else(|| "null".to_owned(), |p| p.to_string());
    let room = || (rand::random::<u64>() >> 1).to_string();
    let (host, port, room) = match batch_size(api, &fields) {
        None => (host, port, room()),
        Some(n) => (
            array(n, |out| out.push_str(&host)),
            array(n, |out| out.push_str(&port)),
            array(n, |out| {
                use std::fmt::Write as _;
                let _ = write!(out, "{}", rand::random::<u64>() >> 1);
            }),
        ),
    };
    fields.insert("bootstrap_host".into(), raw(host));
    fields.insert("bootstrap_port".into(), raw(port));
    fields.insert("bootstrap_room".into(), raw(room));
    to_bytes(&fields)
}

/// vLLM's step one: one whole token (no minimum), no echo or
/// log-probabilities, and a request for remote decode.
pub(super) fn prefill_body(bytes: &[u8]) -> Result<Bytes, GatewayError> {
    let mut fields = fields(bytes)?;
    fields.insert("stream".into(), raw("false".into()));
    fields.insert("max_tokens".into(), raw("1".into()));
    if fields.contains_key("max_completion_tokens") {
        fields.insert("max_completion_tokens".into(), raw("1".into()));
    }
    fields.remove("stream_options");
    // More than one token at least would be refused with 400 against the
    // one asked for (vLLM checks `min_tokens <= max_tokens`); decode gets
    // the client's own.
    fields.remove("min_tokens");
    // Step one's answer is read for its transfer parameters alone (up to
    // 1 MiB); these would make it as long as the prompt, or longer.
    for echoed in ["echo", "logprobs", "top_logprobs", "prompt_logprobs"] {
        fields.remove(echoed);
    }
    fields.insert(
        "kv_transfer_params".into(),
        raw(r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#.into()),
    );
    to_bytes(&fields)
}

/// The `kv_transfer_params` object of a vLLM prefill answer.
pub(super) fn transfer_params(body: &[u8]) -> Option<Box<RawValue>> {
    let fields: Fields = serde_json::from_slice(body).ok()?;
    let params = fields.get("kv_transfer_params")?;
    params
        .get()
        .trim_start()
        .starts_with('{')
        .then(|| params.clone())
}

/// vLLM's step two: the client's body with prefill's transfer parameters.
pub(super) fn with_transfer_params(bytes: &[u8], params: &RawValue) -> Result<Bytes, GatewayError> {
    let mut fields = fields(bytes)?;
    fields.insert("kv_transfer_params".into(), params.to_owned());
    to_bytes(&fields)
}

/// The prefill skip's body for decode alone: the client's, as sent, but
/// without a `kv_transfer_params` of its own (the router's protocol: one
/// a client writes would have decode pull the KV it names).
pub(super) fn without_transfer_params(bytes: &Bytes) -> Result<Bytes, GatewayError> {
    let mut fields = fields(bytes)?;
    if fields.remove("kv_transfer_params").is_none() {
        return Ok(bytes.clone());
    }
    to_bytes(&fields)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn parse(b: &Bytes) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn bootstrap_fields_are_added_and_everything_else_kept() {
        let body = br#"{"text":"hi","sampling_params":{"temperature":0.70,"max_new_tokens":8},"unknown_field":[1,2.50]}"#;
        let out = with_bootstrap(Api::Generate, body, "10.0.0.5", Some(8998)).unwrap();
        let v = parse(&out);
        assert_eq!(v["bootstrap_host"], "10.0.0.5");
        assert_eq!(v["bootstrap_port"], 8998);
        let room = v["bootstrap_room"].as_u64().unwrap();
        assert!(room < 1 << 63);
        // Values pass byte for byte (2.50 and 0.70 keep their spelling).
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.contains(r#""unknown_field":[1,2.50]"#), "{text}");
        assert!(text.contains(r#""temperature":0.70"#), "{text}");
        let again = with_bootstrap(Api::Generate, body, "10.0.0.5", None).unwrap();
        let again = parse(&again);
        assert_eq!(again["bootstrap_port"], Value::Null);
        assert_ne!(again["bootstrap_room"], v["bootstrap_room"], "a fresh room");
    }

    /// A body after a UTF-8 byte order mark, which the router's reading of
    /// a request passes over as the engines' JSON reader does, is edited
    /// as any other. Before, every edit refused it 400 `invalid_json`, so
    /// a prefill/decode pool refused what a plain pool served.
    #[test]
    fn a_body_after_a_byte_order_mark_is_edited_as_any_other() {
        let body = "\u{feff}{\"text\":[\"a\",\"b\"],\"kv_transfer_params\":{}}";
        let out = with_bootstrap(Api::Generate, body.as_bytes(), "h", Some(1)).unwrap();
        let v = parse(&out);
        assert_eq!(v["text"], json!(["a", "b"]));
        assert_eq!(v["bootstrap_host"], json!(["h", "h"]));
        assert!(check_batch(Api::Generate, PdProtocol::Sglang, body.as_bytes()).is_ok());
        let refused = check_batch(Api::Generate, PdProtocol::Vllm, body.as_bytes());
        assert!(matches!(refused, Err(GatewayError::InvalidRequest(_))));
        let step_one = prefill_body(body.as_bytes()).unwrap();
        assert_eq!(parse(&step_one)["max_tokens"], 1);
        let plain = without_transfer_params(&Bytes::from(body)).unwrap();
        assert!(parse(&plain).get("kv_transfer_params").is_none());
    }

    #[test]
    fn a_batch_gets_arrays() {
        let out =
            with_bootstrap(Api::Generate, br#"{"text":["a","b","c"]}"#, "h", Some(1)).unwrap();
        let v = parse(&out);
        assert_eq!(v["bootstrap_host"], json!(["h", "h", "h"]));
        assert_eq!(v["bootstrap_port"], json!([1, 1, 1]));
        let rooms = v["bootstrap_room"].as_array().unwrap();
        assert_eq!(rooms.len(), 3);
        assert_ne!(rooms[0], rooms[1]);
        let ids =
            with_bootstrap(Api::Generate, br#"{"input_ids":[[1,2],[3]]}"#, "h", None).unwrap();
        assert_eq!(parse(&ids)["bootstrap_room"].as_array().unwrap().len(), 2);
        // One prompt of token ids is not a batch.
        let one = with_bootstrap(Api::Generate, br#"{"input_ids":[1,2,3]}"#, "h", None).unwrap();
        assert!(parse(&one)["bootstrap_room"].is_u64());
        let prompts =
            with_bootstrap(Api::Completions, br#"{"prompt":["x","y"]}"#, "h", None).unwrap();
        assert_eq!(parse(&prompts)["bootstrap_host"], json!(["h", "h"]));
        let chat = with_bootstrap(
            Api::ChatCompletions,
            br#"{"messages":[{"role":"user","content":"x"}]}"#,
            "h",
            None,
        )
        .unwrap();
        assert!(parse(&chat)["bootstrap_room"].is_u64());
    }

    #[test]
    fn a_batch_over_the_limit_is_refused_and_one_at_it_is_not() {
        let batch = |n: usize| format!(r#"{{"text":[{}]}}"#, vec![r#""""#; n].join(","));
        let sglang = |body: &str| check_batch(Api::Generate, PdProtocol::Sglang, body.as_bytes());
        let at = batch(MAX_BATCH_PROMPTS);
        assert!(sglang(&at).is_ok());
        let sent = with_bootstrap(Api::Generate, at.as_bytes(), "h", Some(1)).unwrap();
        let rooms = &parse(&sent)["bootstrap_room"];
        assert_eq!(rooms.as_array().unwrap().len(), MAX_BATCH_PROMPTS);
        match sglang(&batch(MAX_BATCH_PROMPTS + 1)) {
            Err(GatewayError::InvalidRequest(why)) => {
                assert!(why.contains("65537 prompts"), "{why}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let ids = format!(
            r#"{{"input_ids":[{}]}}"#,
            vec!["[1]"; MAX_BATCH_PROMPTS + 1].join(",")
        );
        assert!(sglang(&ids).is_err());
        // One long prompt of ids is one prompt, whatever its length.
        let one = format!(
            r#"{{"input_ids":[{}]}}"#,
            vec!["7"; MAX_BATCH_PROMPTS + 1].join(",")
        );
        assert!(sglang(&one).is_ok());
        let sent = with_bootstrap(Api::Generate, one.as_bytes(), "h", None).unwrap();
        assert!(parse(&sent)["bootstrap_room"].is_u64());
        // vLLM: one prompt per request, in a list or not.
        let vllm = |body: &str| check_batch(Api::Completions, PdProtocol::Vllm, body.as_bytes());
        assert!(vllm(r#"{"prompt":["x"]}"#).is_ok());
        assert!(vllm(r#"{"prompt":[1,2,3]}"#).is_ok());
        assert!(vllm(r#"{"prompt":["x","y"]}"#).is_err());
        assert!(vllm(r#"{"prompt":[[1],[2]]}"#).is_err());
    }

    #[test]
    fn the_vllm_steps_rewrite_only_their_fields() {
        let body = br#"{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"max_completion_tokens":64,"min_tokens":8,"extra":{"k":1},"echo":true,"logprobs":5,"top_logprobs":3,"prompt_logprobs":1}"#;
        let one = parse(&prefill_body(body).unwrap());
        // What would make step one's answer as long as the prompt: the
        // prompt echoed, its log-probabilities.
        for echoed in ["echo", "logprobs", "top_logprobs", "prompt_logprobs"] {
            assert!(one.get(echoed).is_none(), "{echoed} kept: {one}");
        }
        assert_eq!(one["stream"], false);
        assert_eq!(one["max_tokens"], 1);
        assert_eq!(one["max_completion_tokens"], 1);
        assert!(one.get("stream_options").is_none());
        assert!(one.get("min_tokens").is_none(), "over max_tokens: {one}");
        assert_eq!(one["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(one["kv_transfer_params"]["do_remote_prefill"], false);
        assert_eq!(one["extra"], json!({"k": 1}));
        let answer = br#"{"id":"x","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[1,2],"remote_host":"127.0.0.1","remote_port":5600}}"#;
        let params = transfer_params(answer).unwrap();
        let two = parse(&with_transfer_params(body, &params).unwrap());
        assert_eq!(two["kv_transfer_params"]["remote_block_ids"], json!([1, 2]));
        assert_eq!(two["stream"], true, "the client's own flags");
        assert_eq!(two["max_tokens"], 64);
        assert_eq!(two["min_tokens"], 8);
        assert_eq!(two["stream_options"], json!({"include_usage": true}));
        assert_eq!(
            (two["echo"].clone(), two["logprobs"].clone()),
            (json!(true), json!(5))
        );
        assert!(transfer_params(br#"{"choices":[]}"#).is_none());
        assert!(transfer_params(br#"{"kv_transfer_params":null}"#).is_none());
        assert!(transfer_params(b"not json").is_none());
    }

    #[test]
    fn decode_alone_gets_the_clients_bytes_without_its_transfer_params() {
        let plain = Bytes::from_static(br#"{"prompt": "hi",  "x": 2.50}"#);
        assert_eq!(without_transfer_params(&plain).unwrap(), plain, "as sent");
        // Spelled with an escape, or twice: gone all the same.
        let forged = Bytes::from_static(
            br#"{"prompt":"hi","kv_transfer_params":{"remote_host":"h"},"kv\u005ftransfer_params":{"remote_block_ids":[1]},"x":2.50}"#,
        );
        let out = without_transfer_params(&forged).unwrap();
        let text = std::str::from_utf8(&out).unwrap();
        assert!(!text.contains("transfer"), "{text}");
        assert!(text.contains(r#""x":2.50"#), "{text}");
    }

    #[test]
    fn a_body_that_is_not_an_object_is_the_clients_error() {
        assert!(matches!(
            with_bootstrap(Api::Generate, b"[1]", "h", None),
            Err(GatewayError::BadRequest(_))
        ));
    }
}
