//! What a route does with its requests: what it reads of the body, how it
//! chooses a worker, and what it is counted as.
//!
//! - an inference API ([`Endpoint::Routed`]) is routed by its text's
//!   prefix (the policy);
//! - a known endpoint whose body says nothing about any worker's cache
//!   (reranking, scoring, tokenizing: [`Endpoint::ByLoad`]) goes to the
//!   least-loaded worker of its model;
//! - any other `POST /v1/...` ([`Endpoint::Unrouted`]) is forwarded as it
//!   came, path and query, to the least-loaded worker of the body's model,
//!   and counted as unrouted, so an operator sees which APIs clients use
//!   that the gateway does not know. Its path must be plain (no `.` or `..`
//!   segment, no empty segment, nothing percent-encoded or backslashed),
//!   so that it names on the worker the path it names here, and engine
//!   administration under `/v1` (loading and unloading LoRA adapters) is
//!   not passed on: those answer 404 as before;
//! - a request about a stored Responses API response by its id
//!   ([`Endpoint::StoredResponse`]: fetch, delete, cancel, list its input)
//!   goes to the worker that made it (`crate::responses`).

use crate::error::GatewayError;
use crate::inspect::{
    Api, InspectError, Inspected, form_boundary, inspect, inspect_form, inspect_model,
};
use crate::preamble::Preamble;
use crate::stream::ErrorEvents;
use crate::tenants::Estimate;
use axum::http::Uri;

/// How a route's requests are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// An inference API, routed by its routing text.
    Routed(Api),
    /// A known endpoint (its path) routed by load alone.
    ByLoad(&'static str),
    /// A `/v1` path the gateway has no route for.
    Unrouted,
    /// A stored Responses API response, by the id in its path.
    StoredResponse,
}

/// The route label of the requests about a stored response (metrics).
pub(crate) const STORED_RESPONSE_ROUTE: &str = "/v1/responses/{id}";

/// The route label of unrouted requests (metrics).
pub(crate) const UNROUTED_ROUTE: &str = "/v1/*";

/// `/v1` paths of engine administration, never passed on.
const ADMIN_PATHS: [&str; 2] = ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"];

/// `/v1` paths that count a prompt's tokens (Anthropic's and OpenAI's):
/// their answers generate none.
const COUNTING_PATHS: [&str; 2] = ["/v1/messages/count_tokens", "/v1/responses/input_tokens"];

/// Paths of pooling models (SGLang's under `/v1`, vLLM's outside it):
/// their answers are vectors or scores, not text, and are charged their
/// prompt, not their bytes.
const POOLING_PATHS: [&str; 4] = ["/v1/classify", "/v1/pooling", "/classify", "/pooling"];

/// The API families an unrouted request is counted under (the first path
/// segment after `/v1/`); any other is `other`, so clients cannot create
/// series.
const FAMILIES: [&str; 19] = [
    "assistants",
    "audio",
    "batches",
    "chat",
    "classify",
    "containers",
    "conversations",
    "embeddings",
    "evals",
    "files",
    "fine_tuning",
    "images",
    "messages",
    "moderations",
    "pooling",
    "realtime",
    "responses",
    "uploads",
    "vector_stores",
];

impl Endpoint {
    /// The route label (metrics), which is also the worker path of a
    /// routed endpoint: the route's path, or [`UNROUTED_ROUTE`].
    pub(crate) fn label(self) -> &'static str {
        match self {
            Endpoint::Routed(api) => api.path(),
            Endpoint::ByLoad(path) => path,
            Endpoint::Unrouted => UNROUTED_ROUTE,
            Endpoint::StoredResponse => STORED_RESPONSE_ROUTE,
        }
    }

    /// Whether the worker is chosen by load alone, not by the policy.
    pub(crate) fn by_load(self) -> bool {
        !matches!(self, Endpoint::Routed(_))
    }

    /// What a tenant with a token limit is charged an estimate of for the
    /// answer to `body`, sent to the worker path `path`, if it reports no
    /// usage: the prompt and the generated output of an inference API's,
    /// or of an unrouted one's taking JSON (an upload is not prompt text)
    /// unless it only counts a prompt's tokens; the prompt alone of an
    /// embeddings or a pooling answer, whose output is vectors or scores,
    /// not tokens.
    pub(crate) fn estimate(self, path: &str, body: &[u8]) -> Estimate {
        match self {
            Endpoint::Routed(Api::Embeddings) => Estimate::Prompt,
            Endpoint::Routed(_) => Estimate::PromptAndOutput,
            Endpoint::ByLoad(path) if POOLING_PATHS.contains(&path) => Estimate::Prompt,
            Endpoint::ByLoad(_) | Endpoint::StoredResponse => Estimate::Nothing,
            Endpoint::Unrouted => {
                let path = path.split_once('?').map_or(path, |(path, _)| path);
                if !body.trim_ascii_start().starts_with(b"{") || COUNTING_PATHS.contains(&path) {
                    Estimate::Nothing
                } else if POOLING_PATHS.contains(&path) {
                    Estimate::Prompt
                } else {
                    Estimate::PromptAndOutput
                }
            }
        }
    }

    /// What routing reads of `body`, sent with `content_type`. An unrouted
    /// request's body may be anything: one that opens as a JSON object
    /// must be JSON and is read for its model; an upload
    /// (`multipart/form-data`, an audio transcription's) is read for its
    /// form's `model` field; any other names none.
    pub(crate) fn inspect(
        self,
        content_type: Option<&[u8]>,
        body: &[u8],
    ) -> Result<Inspected, InspectError> {
        match self {
            Endpoint::Routed(api) => inspect(api, body),
            Endpoint::ByLoad(_) => inspect_model(body),
            // Its path names it; a body (a cancel's) says nothing routing
            // reads.
            Endpoint::StoredResponse => Ok(Inspected::default()),
            Endpoint::Unrouted if body.trim_ascii_start().starts_with(b"{") => inspect_model(body),
            Endpoint::Unrouted => Ok(content_type
                .and_then(form_boundary)
                .map(|boundary| inspect_form(boundary, body))
                .unwrap_or_default()),
        }
    }

    /// The error event a broken stream of this endpoint ends with. A
    /// stored response read back as a stream (`GET /v1/responses/{id}?
    /// stream=true`, vLLM's for a background response) is the Responses
    /// API's stream, as its create's is.
    pub(crate) fn error_events(self) -> ErrorEvents {
        match self {
            Endpoint::Routed(Api::Messages) => ErrorEvents::Messages,
            Endpoint::Routed(Api::Responses) | Endpoint::StoredResponse => ErrorEvents::Responses,
            Endpoint::Routed(_) | Endpoint::ByLoad(_) | Endpoint::Unrouted => ErrorEvents::OpenAi,
        }
    }

    /// Whether an answer's time to its first byte says how quick its worker
    /// is, for outlier detection: for a successful stream (its first event
    /// follows the prefill), yes; for a whole successful answer only where
    /// nothing is generated (embeddings, reranking, scoring, tokenizing).
    /// A generated whole answer's first byte waits for its whole decode,
    /// which the request's length decides, not the worker: cache-aware
    /// routing keeps a client's long generations on one worker, which
    /// would then read as many times slower than its peers. (An unrouted
    /// API may generate, so its whole answers are not judged.) An error
    /// answer, never: a refusal served nothing, and a worker that sheds
    /// every request at once (429) or fails it at once would read as the
    /// quickest of its pool and make its working peers outliers. Failures
    /// are the breaker's to count; a hang is sampled at its timeout. A
    /// stream whose first event is not its first token (`opens_with_token`
    /// false: a Responses or Messages preamble, comments) sent that byte
    /// before its prefill: the response's watch samples its first token
    /// instead.
    pub(crate) fn times_its_worker(
        self,
        status: axum::http::StatusCode,
        stream: bool,
        opens_with_token: bool,
    ) -> bool {
        status.is_success() && self.first_byte_is_prompt(stream) && (!stream || opens_with_token)
    }

    /// Whether a successful answer's first byte is due soon after the
    /// prefill, whatever the request's length: a stream's first event, or
    /// a whole answer of an API that generates nothing. So a worker that
    /// sends no first byte within the first-byte timeout hangs; a whole
    /// generated answer that times out is only long (see
    /// [`times_its_worker`](Self::times_its_worker)).
    pub(crate) fn first_byte_is_prompt(self, stream: bool) -> bool {
        if stream {
            return true;
        }
        match self {
            Endpoint::Routed(api) => api == Api::Embeddings,
            Endpoint::ByLoad(_) | Endpoint::StoredResponse => true,
            Endpoint::Unrouted => false,
        }
    }

    /// The scan for the first token of this endpoint's stream whose first
    /// body frame is `first`, where that frame does not begin it: the
    /// API's preamble, or comments that open the stream.
    pub(crate) fn preamble(self, first: Option<&[u8]>) -> Option<Preamble> {
        let by_api = match self {
            Endpoint::Routed(api) => Preamble::for_api(api),
            Endpoint::ByLoad(_) | Endpoint::Unrouted | Endpoint::StoredResponse => None,
        };
        by_api.or_else(|| {
            first
                .is_some_and(crate::preamble::opens_with_comment)
                .then(Preamble::behind_comments)
        })
    }
}

/// The path (and query) an unrouted request is forwarded to, and the API
/// family it is counted under; `NotFound` for a path that is not plain or
/// that administers the engine.
pub(crate) fn unrouted_target(
    method: &str,
    uri: &Uri,
) -> Result<(String, &'static str), GatewayError> {
    let path = uri.path();
    let not_found = || GatewayError::NotFound {
        method: method.to_owned(),
        path: path.to_owned(),
    };
    let rest = path.strip_prefix("/v1/").ok_or_else(not_found)?;
    let plain = rest.split('/').all(|segment| {
        !segment.is_empty() && segment != "." && segment != ".." && !segment.contains(['%', '\\'])
    });
    if !plain || ADMIN_PATHS.contains(&path) {
        return Err(not_found());
    }
    let first = rest.split('/').next().unwrap_or_default();
    let family = FAMILIES
        .iter()
        .find(|f| **f == first)
        .copied()
        .unwrap_or("other");
    let target = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    Ok((target, family))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(uri: &str) -> Result<(String, &'static str), u16> {
        let uri: Uri = uri.parse().unwrap();
        unrouted_target("POST", &uri).map_err(|e| e.status().as_u16())
    }

    #[test]
    fn counting_a_prompts_tokens_generates_none() {
        let json = br#" {"model":"m"}"#;
        let messages = Endpoint::Routed(Api::Messages).estimate("/v1/messages", json);
        assert_eq!(messages, Estimate::PromptAndOutput);
        let embeddings = Endpoint::Routed(Api::Embeddings).estimate("/v1/embeddings", json);
        assert_eq!(embeddings, Estimate::Prompt);
        let classify = Endpoint::Unrouted.estimate("/v1/classify", json);
        assert_eq!(classify, Estimate::Prompt);
        let pooling = Endpoint::Unrouted.estimate("/v1/pooling?x=1", json);
        assert_eq!(pooling, Estimate::Prompt);
        let unknown = Endpoint::Unrouted.estimate("/v1/something", json);
        assert_eq!(unknown, Estimate::PromptAndOutput);
        let upload = Endpoint::Unrouted.estimate("/v1/audio/transcriptions", b"--boundary");
        assert_eq!(upload, Estimate::Nothing);
        let tokenize = Endpoint::ByLoad("/tokenize").estimate("/tokenize", json);
        assert_eq!(tokenize, Estimate::Nothing);
        for path in ["/classify", "/pooling"] {
            let vllm = Endpoint::ByLoad(path).estimate(&format!("{path}?x=1"), json);
            assert_eq!(vllm, Estimate::Prompt, "{path}");
        }
        for path in [
            "/v1/messages/count_tokens",
            "/v1/messages/count_tokens?beta=true",
            "/v1/responses/input_tokens",
        ] {
            let counted = Endpoint::Unrouted.estimate(path, json);
            assert_eq!(counted, Estimate::Nothing, "{path}");
        }
    }

    #[test]
    fn plain_paths_pass_with_their_query() {
        assert_eq!(
            target("/v1/audio/transcriptions"),
            Ok(("/v1/audio/transcriptions".into(), "audio"))
        );
        assert_eq!(
            target("/v1/classify?x=1&y=%20"),
            Ok(("/v1/classify?x=1&y=%20".into(), "classify"))
        );
        assert_eq!(target("/v1/whatever"), Ok(("/v1/whatever".into(), "other")));
        assert_eq!(
            target("/v1/messages/count_tokens"),
            Ok(("/v1/messages/count_tokens".into(), "messages"))
        );
    }

    #[test]
    fn paths_that_could_name_something_else_are_refused() {
        for uri in [
            "/v1/../admin/faults",
            "/v1/./x",
            "/v1/a//b",
            "/v1/a/",
            "/v1/%2e%2e/x",
            "/v1/a%2Fb",
            "/v1/a\\b",
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
            "/v2/x",
        ] {
            let Ok(parsed) = uri.parse::<Uri>() else {
                continue;
            };
            assert_eq!(
                unrouted_target("POST", &parsed).map_err(|e| e.status().as_u16()),
                Err(404),
                "{uri}"
            );
        }
    }

    #[test]
    fn unrouted_bodies_are_read_only_when_json() {
        let e = Endpoint::Unrouted;
        assert_eq!(e.inspect(None, b"--boundary\r\n").unwrap().model, None);
        assert_eq!(e.inspect(None, b"").unwrap().model, None);
        assert_eq!(
            e.inspect(None, br#" {"model":"m"}"#)
                .unwrap()
                .model
                .as_deref(),
            Some("m")
        );
        assert!(e.inspect(None, b"{not json").is_err());
        assert!(Endpoint::ByLoad("/tokenize").inspect(None, b"x").is_err());
        // An upload's form names its model.
        let form = b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--";
        let multipart = Some(&b"multipart/form-data; boundary=b"[..]);
        assert_eq!(
            e.inspect(multipart, form).unwrap().model.as_deref(),
            Some("m")
        );
        assert_eq!(e.inspect(Some(b"text/plain"), form).unwrap().model, None);
        assert!(e.by_load() && Endpoint::ByLoad("/v1/score").by_load());
        assert!(!Endpoint::Routed(Api::Responses).by_load());
        assert_eq!(e.label(), "/v1/*");
        assert!(Endpoint::Routed(Api::Messages).preamble(None).is_some());
        assert!(Endpoint::ByLoad("/v1/rerank").preamble(None).is_none());
        let chat = Endpoint::Routed(Api::ChatCompletions);
        assert!(chat.preamble(Some(b"data: {}\n\n")).is_none());
        assert!(chat.preamble(Some(b"\r\n: keep-alive\n\n")).is_some());
    }
}
