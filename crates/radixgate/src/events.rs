//! Exact prefix matches from the workers' KV-cache events.
//!
//! With `kv_events.enabled`, the gateway subscribes to every worker's event
//! publisher (one per data-parallel rank; `radixgate_kv::subscribe`) and
//! keeps one exact index of the blocks each rank holds
//! (`radixgate_kv::KvIndex`, keyed by our own chained block keys over
//! token ids, so the engines' hash algorithms and seeds never matter).
//!
//! - **Following the pool.** A supervisor compares the router's worker set
//!   with the subscriptions twice a second: a new worker gets one
//!   subscription per rank, a removed one has its subscriptions stopped and
//!   its blocks dropped [`REBIND_GRACE`] later. Discovery and the admin
//!   API need nothing else. A stream belongs to the worker's URL, not to
//!   its id: a worker listed again under a new id at the same URL within
//!   that grace (relisted when its models changed, as vLLM's do when it
//!   loads a LoRA adapter at run time, or removed and added back) takes
//!   over the streams and blocks left there. Subscribing afresh joined an
//!   engine's stream long after its start, never exact again without a
//!   replay of that start.
//!   Workers whose publishers resolve to one endpoint (engines sharing a
//!   host at the default port) are not matched exactly while they share
//!   it: its events are one engine's at most, and were taken as each
//!   one's.
//! - **Live or stale.** A worker's matches count only while every one of its
//!   ranks' streams is live: the subscriber says so once every batch since
//!   a known-empty cache was applied. A gap no replay filled, a lost
//!   connection, an undecodable message or a rank over its block limit
//!   makes the worker stale; its requests are then matched in the policy's
//!   approximate tree, as for a worker that publishes nothing. A publisher
//!   restart drops the rank's blocks (its cache is empty again). A rank
//!   whose blocks a limit refused stays stale until its engine clears its
//!   cache or restarts, whatever its stream does.
//! - **A request** is tokenized once, before the retry loop: the body's own
//!   token ids (`/generate` `input_ids`, a completions prompt of ids), or
//!   the configured tokenizer with the chat template. Its blocks are keyed
//!   and matched for every block size the engines reported; a worker's
//!   match is the best of its ranks (the engine's data-parallel balancer,
//!   not the router, picks the rank). What each live worker holds reaches
//!   the policy as [`ExactMatches`]; a request that cannot be tokenized,
//!   or one in a cache namespace of its own (`shares_blocks`), is routed
//!   on the tree alone, counted by reason.
//!
//! Cost: a read lock on the index per request (writers hold it per batch);
//! the tokenizer dominates (`crates/radixgate-tokenize`, measured there).

use crate::config::{EngineRules, KvEventsConfig};
use crate::metrics::{Describe, LabelledCounters, Metrics, OneCounter, OneGauge};
use parking_lot::{Mutex, RwLock};
use radixgate_kv::subscribe::{self, StaleReason, SubscriberConfig, Update};
use radixgate_kv::{IndexLimits, KvEvent, KvIndex};
use radixgate_routing::{ExactMatches, Router, WorkerId};
use radixgate_tokenize::{
    Endpoint as TokenEndpoint, Engine, Tokenizer, body_token_ids, flat_token_ids,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How often the supervisor compares the pool with its subscriptions.
const SUPERVISE_PERIOD: Duration = Duration::from_millis(500);

/// How long a stream whose worker left the pool is kept for a worker
/// listed again at its URL (`supervise`): a relisted worker is removed and
/// added in two steps, and an operator's remove and add are two calls.
const REBIND_GRACE: Duration = Duration::from_secs(10);

/// Updates a subscriber may queue before it waits for the index.
const UPDATE_QUEUE: usize = 1024;

/// How long a rank's stream may go without becoming live before the log
/// says so, once: a WARN when it sent events (it will not be exact before
/// its engine clears its cache or restarts), an INFO when it sent none (an
/// idle engine sends none). Nothing else told an operator why a worker was
/// never matched exactly (`lose` speaks only of a live stream going stale).
const NOT_LIVE_WARNING: Duration = Duration::from_secs(30);

/// Answers in a row that deny a worker's exact matches before it is taken
/// off them ([`KvEvents::answered`]).
const CONTRADICTIONS: u32 = 8;

/// The smallest promise an answer is held to: shorter matches (a system
/// prompt's few blocks) are too easily evicted between a decision and its
/// prefill to say anything.
const MIN_PROMISE_CHARS: usize = 1024;

/// Ranks are keyed in the low 8 bits of an index key.
const RANK_BITS: u32 = 8;

const BATCHES: Describe = Describe::new(
    "radixgate_kv_events_batches_total",
    "KV-event batches applied to the exact index.",
);
const STORED: Describe = Describe::new(
    "radixgate_kv_events_blocks_stored_total",
    "Blocks the workers' engines reported stored.",
);
const REMOVED: Describe = Describe::new(
    "radixgate_kv_events_blocks_removed_total",
    "Blocks the workers' engines reported removed.",
);
const SKIPPED: Describe = Describe::new(
    "radixgate_kv_events_blocks_skipped_total",
    "Stored blocks the exact index could not take, by reason: unknown_parent (their parent block is not held for that worker, at that block size) or bad_shape (their token count is not the block size times their hashes).",
);
const STALE: Describe = Describe::new(
    "radixgate_kv_events_stale_total",
    "Event streams that stopped being exact, by reason (disconnected, gap, decode, restarted, over_capacity, oversized, no_local_socket, contradicted).",
);
const LIVE: Describe = Describe::new(
    "radixgate_kv_events_live_workers",
    "Workers whose every rank's event stream is live (their requests are matched exactly).",
);
const WORKERS: Describe = Describe::new("radixgate_kv_events_workers", "Workers subscribed to.");
const BLOCKS: Describe = Describe::new(
    "radixgate_kv_events_index_blocks",
    "Blocks in the exact index, over all workers.",
);
const REQUESTS: Describe = Describe::new(
    "radixgate_kv_events_requests_total",
    "Routed requests by how they were matched (exact, no_live_worker, namespaced, no_tokens, other_model, tokenize_error, tokenizer_busy).",
);

/// The families.
struct EventMetrics {
    batches: OneCounter,
    stored: OneCounter,
    removed: OneCounter,
    skipped: LabelledCounters,
    stale: LabelledCounters,
    live: OneGauge,
    workers: OneGauge,
    blocks: OneGauge,
    requests: LabelledCounters,
}

impl EventMetrics {
    fn new(metrics: &Metrics) -> Self {
        let m = Self {
            batches: metrics.counter(&BATCHES),
            stored: metrics.counter(&STORED),
            removed: metrics.counter(&REMOVED),
            skipped: metrics.labelled_counters(&SKIPPED, "reason"),
            stale: metrics.labelled_counters(&STALE, "reason"),
            live: metrics.gauge(&LIVE),
            workers: metrics.gauge(&WORKERS),
            blocks: metrics.gauge(&BLOCKS),
            requests: metrics.labelled_counters(&REQUESTS, "match"),
        };
        m.live.set(0.0);
        m.workers.set(0.0);
        m.blocks.set(0.0);
        m
    }
}

/// One subscribed worker's streams, keyed in `KvEvents::workers` (and in
/// the index) by the id its URL's worker had when they were opened.
struct Subscribed {
    /// The worker they are now, by id: `None` once it left the pool.
    worker: Option<WorkerId>,
    /// When the worker left the pool; its streams stop [`REBIND_GRACE`]
    /// later unless a worker at its URL takes them over.
    left: Option<tokio::time::Instant>,
    /// Whether each rank's stream is live.
    live: Vec<bool>,
    /// The worker's answers contradicted its events
    /// ([`KvEvents::answered`]): not matched exactly until its engine
    /// clears its cache or restarts.
    contradicted: bool,
    /// Answers in a row that denied its exact matches
    /// ([`KvEvents::answered`]); it goes with the worker.
    denied: u32,
    /// Stops its subscriptions.
    stop: CancellationToken,
    /// The worker's URL, for the log.
    url: String,
    /// Its ranks' publisher endpoints.
    publishers: Vec<String>,
    /// Another worker's publisher is at one of `publishers`
    /// ([`KvEvents::mark_shared`]): not matched exactly.
    shared: bool,
}

/// The exact index and the streams feeding it.
pub(crate) struct KvEvents {
    config: KvEventsConfig,
    tokenizer: Option<Arc<Tokenizer>>,
    /// How much of a prompt is tokenized and matched: the routing text's
    /// cap (`max_routing_text_chars`).
    max_prompt_chars: usize,
    index: RwLock<KvIndex>,
    /// The subscriptions, by the worker id they were opened for (their
    /// index keys'); see [`Subscribed`].
    workers: Mutex<HashMap<WorkerId, Subscribed>>,
    /// The live workers, ascending by id, each with its subscription's
    /// key: what requests read.
    live: RwLock<Vec<(WorkerId, WorkerId)>>,
    /// Requests tokenized at once: one per CPU. A render and its encoding
    /// are CPU work on the blocking pool (up to 512 threads), and a chat
    /// template may make up to its fuel's 256 MB of strings per render.
    tokenizing: Arc<tokio::sync::Semaphore>,
    metrics: EventMetrics,
    /// The model of the first request the tokenizer read, and whether a
    /// request for another was told of (`reads_model`).
    first_model: std::sync::OnceLock<String>,
    warned_models: std::sync::atomic::AtomicBool,
}

/// How long a request waits for a turn to tokenize (`KvEvents::turn`)
/// before it is routed on the tree alone: about one 32k-token chat
/// prompt's tokenizing (docs/kv-events.md, "Measured"), so a burst waits
/// out the turns ahead of it, while a tokenizer that stays behind costs
/// each request no more than this.
pub(crate) const TURN_WAIT: Duration = Duration::from_millis(50);

/// A request's exact matches, owned (the policy borrows them).
pub(crate) struct Matched {
    input_tokens: usize,
    live: Vec<(WorkerId, usize)>,
}

impl Matched {
    /// The view a policy takes.
    pub(crate) fn view(&self) -> ExactMatches<'_> {
        ExactMatches {
            input_tokens: self.input_tokens,
            live: &self.live,
        }
    }
}

impl KvEvents {
    /// Loads the tokenizer and starts the supervisor; its tasks stop with
    /// `stop`.
    pub(crate) fn spawn(
        config: &KvEventsConfig,
        max_prompt_chars: usize,
        router: Router,
        metrics: &Metrics,
        stop: CancellationToken,
    ) -> Result<Arc<Self>, crate::server::StartError> {
        let tokenizer = match &config.tokenizer {
            Some(path) => {
                let engine = match config.engine {
                    EngineRules::Vllm => Engine::Vllm,
                    EngineRules::Sglang => Engine::Sglang,
                };
                let t = Tokenizer::load(path)
                    .map_err(|source| crate::server::StartError::Tokenizer {
                        path: path.clone(),
                        source,
                    })?
                    .with_engine(engine);
                if !t.has_chat_template() {
                    tracing::warn!(
                        tokenizer = %path.display(),
                        "kv_events: the tokenizer has no chat template; chat requests are routed on the approximate tree"
                    );
                } else if let Err(err) = t.render_chat(&serde_json::json!({
                    "messages": [{"role": "user", "content": "Hello"}],
                })) {
                    // Said at start, not at every request's DEBUG line.
                    tracing::warn!(
                        tokenizer = %path.display(),
                        error = %err,
                        "kv_events: the chat template fails on a one-message conversation; chat requests it fails on are routed on the approximate tree"
                    );
                }
                Some(Arc::new(t))
            }
            None => {
                tracing::warn!(
                    "kv_events: no tokenizer (--tokenizer); only requests carrying token ids (/generate input_ids, completions with a token-id prompt) are matched against KV events, every other one is routed on the approximate tree"
                );
                None
            }
        };
        let events = Arc::new(Self {
            config: config.clone(),
            tokenizer,
            max_prompt_chars,
            index: RwLock::new(KvIndex::with_limits(IndexLimits {
                max_blocks_per_worker: config.max_blocks_per_worker,
                max_blocks_total: config.max_blocks_total,
            })),
            workers: Mutex::new(HashMap::new()),
            live: RwLock::new(Vec::new()),
            tokenizing: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, usize::from),
            )),
            metrics: EventMetrics::new(metrics),
            first_model: std::sync::OnceLock::new(),
            warned_models: std::sync::atomic::AtomicBool::new(false),
        });
        tokio::spawn(supervise(events.clone(), router, stop));
        Ok(events)
    }

    /// Whether a request is worth matching at all: false (counted) while
    /// no worker's stream is live, so the request path skips tokenizing
    /// and the trip to the blocking pool.
    pub(crate) fn any_live(&self) -> bool {
        let any = !self.live.read().is_empty();
        if !any {
            self.metrics.requests.increment("no_live_worker");
        }
        any
    }

    /// Whether a request's blocks are the ones the events name: false
    /// (counted) for a request in a cache namespace of its own (SGLang's
    /// `lora_path` or `extra_key`, vLLM's `cache_salt`). The engine keys
    /// its cache by them, while the events' token ids (and the index's
    /// keys) are the same in every namespace, so such a request would be
    /// matched on blocks it cannot use; it is routed on the tree, where
    /// its text is apart.
    pub(crate) fn shares_blocks(&self, namespaced: bool) -> bool {
        if namespaced {
            self.metrics.requests.increment("namespaced");
        }
        !namespaced
    }

    /// A turn to tokenize a request (see `tokenizing`), waited for at most
    /// [`TURN_WAIT`]; `None` (counted `tokenizer_busy`) when every turn
    /// stayed taken, and the tree decides alone. The tokenizer keeps up
    /// with one CPU's worth of prompts each (about 20 a second at 32k
    /// tokens); beyond that, an unbounded wait would queue every request
    /// behind the others' tokenizing and make the router the bottleneck.
    pub(crate) async fn turn(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let turn = tokio::time::timeout(TURN_WAIT, self.tokenizing.clone().acquire_owned());
        match turn.await {
            Ok(Ok(turn)) => Some(turn),
            _ => {
                self.metrics.requests.increment("tokenizer_busy");
                None
            }
        }
    }

    /// What each live worker holds of the prompt of a request for `model`
    /// to `path` with body `bytes` (no worker at all when none is live any
    /// more: the tree decides); `None` (counted) when the request cannot
    /// be tokenized, and the tree decides alone.
    pub(crate) fn matched(&self, path: &str, bytes: &[u8], model: Option<&str>) -> Option<Matched> {
        let tokens = match self.tokens(path, bytes, model) {
            Ok(Ok(tokens)) => tokens,
            Ok(Err(why)) => {
                self.metrics.requests.increment(why);
                return None;
            }
            Err(err) => {
                tracing::debug!(error = %err, "kv_events: request not tokenized; routed on the tree");
                self.metrics.requests.increment("tokenize_error");
                return None;
            }
        };
        let found = self.index.read().match_tokens(&tokens, None);
        let live = self.live.read().clone();
        let mut out: Vec<(WorkerId, usize)> = live.iter().map(|&(id, _)| (id, 0)).collect();
        // Each live subscription's place in `out`, by subscription.
        let mut place: Vec<(WorkerId, usize)> = live
            .iter()
            .enumerate()
            .map(|(k, &(_, sub))| (sub, k))
            .collect();
        place.sort_unstable();
        for (key, matched) in found {
            let sub = WorkerId(key >> RANK_BITS);
            if let Ok(p) = place.binary_search_by_key(&sub, |&(s, _)| s) {
                let k = place[p].1;
                out[k].1 = out[k].1.max(matched);
            }
        }
        self.metrics.requests.increment("exact");
        Some(Matched {
            input_tokens: tokens.len(),
            live: out,
        })
    }

    /// The prompt's tokens, of its first `max_prompt_chars` characters
    /// only (see [`Tokenizer::prompt_prefix_tokens`]): the tree keeps no
    /// more of a prompt either. `Ok(Err(label))` where there are none to
    /// take: the request carries no ids and there is no tokenizer
    /// (`no_tokens`) or none for its model (`other_model`).
    fn tokens(
        &self,
        path: &str,
        bytes: &[u8],
        model: Option<&str>,
    ) -> Result<Result<Vec<u32>, &'static str>, String> {
        let Some(endpoint) = TokenEndpoint::from_path(path) else {
            return Ok(Err("no_tokens"));
        };
        // Passed over as the request's inspection passed over it.
        let bytes = crate::inspect::without_bom(bytes);
        // A flat list of ids is read from the bytes: as values it would
        // take about ten times the body (`flat_token_ids`).
        if let Some(mut ids) = flat_token_ids(endpoint, bytes) {
            ids.truncate(self.max_prompt_chars);
            return Ok(Ok(ids));
        }
        let body: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if let Some(mut ids) = body_token_ids(endpoint, &body).map_err(|e| e.to_string())? {
            ids.truncate(self.max_prompt_chars);
            return Ok(Ok(ids));
        }
        let Some(tokenizer) = &self.tokenizer else {
            return Ok(Err("no_tokens"));
        };
        if !self.reads_model(model) {
            return Ok(Err("other_model"));
        }
        tokenizer
            .prompt_prefix_tokens(endpoint, &body, self.max_prompt_chars)
            .map(Ok)
            .map_err(|e| e.to_string())
    }

    /// Whether the tokenizer reads requests for `model`
    /// (`kv_events.tokenizer_models`). With no list, it reads every
    /// model's, and the first time requests for two models are tokenized a
    /// WARN says that the list may be wanted.
    fn reads_model(&self, model: Option<&str>) -> bool {
        let listed = &self.config.tokenizer_models;
        if !listed.is_empty() {
            return model.is_some_and(|m| listed.iter().any(|l| l == m));
        }
        // A request that names no model says nothing of which it is.
        let Some(model) = model else {
            return true;
        };
        let first = self.first_model.get_or_init(|| model.to_owned());
        if first != model && !self.warned_models.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                first = %first,
                model,
                "kv_events: requests for two models are tokenized with one tokenizer; if it is not both models', list its models in kv_events.tokenizer_models (--kv-events-tokenizer-models), or the other model's workers match nothing exactly"
            );
        }
        true
    }

    /// Binds the subscriptions to the pool's workers, `current` by id
    /// with their URLs: one whose worker left is taken over by a worker
    /// now at its URL that has none (listed again under a new id), and
    /// stopped once it has had none for [`REBIND_GRACE`]. Returns whether
    /// any subscription changed worker, and the stopped ones' keys.
    fn follow_pool(
        &self,
        current: &HashMap<WorkerId, String>,
        now: tokio::time::Instant,
    ) -> (bool, Vec<WorkerId>) {
        let mut workers = self.workers.lock();
        let mut bound: std::collections::HashSet<WorkerId> = workers
            .values()
            .filter_map(|s| s.worker)
            .filter(|w| current.contains_key(w))
            .collect();
        let mut changed = false;
        for s in workers.values_mut() {
            if s.worker.is_some_and(|w| current.contains_key(&w)) {
                continue;
            }
            let heir = current
                .iter()
                .find(|&(id, url)| *url == s.url && !bound.contains(id))
                .map(|(&id, _)| id);
            match heir {
                Some(id) => {
                    tracing::info!(worker = %s.url, was = ?s.worker.map(|w| w.0), id = id.0, "kv_events: the worker at this URL was listed again under a new id; it keeps its event streams and blocks");
                    s.worker = Some(id);
                    s.left = None;
                    bound.insert(id);
                    changed = true;
                }
                None if s.worker.is_some() => {
                    // Its count of denying answers goes with it.
                    s.worker = None;
                    s.denied = 0;
                    s.left = Some(now);
                    changed = true;
                }
                None => {}
            }
        }
        let gone: Vec<WorkerId> = workers
            .iter()
            .filter(|(_, s)| {
                s.left
                    .is_some_and(|at| now.duration_since(at) >= REBIND_GRACE)
            })
            .map(|(&sub, _)| sub)
            .collect();
        for sub in &gone {
            if let Some(s) = workers.remove(sub) {
                s.stop.cancel();
            }
        }
        (changed, gone)
    }

    /// Republishes the live list after a stream changed standing.
    fn refresh_live(&self) {
        let workers = self.workers.lock();
        let mut live: Vec<(WorkerId, WorkerId)> = workers
            .iter()
            .filter(|(_, s)| !s.contradicted && !s.shared && s.live.iter().all(|&l| l))
            .filter_map(|(&sub, s)| Some((s.worker?, sub)))
            .collect();
        live.sort_unstable();
        self.metrics.live.set(live.len() as f64);
        let subscribed = workers.values().filter(|s| s.worker.is_some()).count();
        self.metrics.workers.set(subscribed as f64);
        *self.live.write() = live;
    }

    /// A worker answered a request whose exact match promised
    /// `matched_chars` characters of its routing text held there, and
    /// reported `cached_tokens` found cached. An engine whose events stopped
    /// while its cache went on changing (a hung publishing thread), or a
    /// stream that is another engine's (a wrong port), gives exact matches
    /// that its answers deny, request after request, and nothing on the
    /// wire says so. After [`CONTRADICTIONS`] answers in a row that found
    /// far less than promised (fewer tokens than a sixteenth of the
    /// promised characters, at least [`MIN_PROMISE_CHARS`] of them), the
    /// worker is matched on the tree until its engine clears its cache or
    /// restarts. Any answer that agrees starts the count again, so an
    /// eviction racing a decision does not count for long.
    ///
    /// Not with data parallelism (`data_parallel_size` over 1): a worker's
    /// match is its best rank's, while its engine answers from the rank it
    /// picks, whose cache need not hold the prompt at all; such answers
    /// deny nothing, and would take every such worker off its matches.
    pub(crate) fn answered(&self, id: WorkerId, matched_chars: usize, cached_tokens: u64) {
        if matched_chars < MIN_PROMISE_CHARS || self.config.data_parallel_size > 1 {
            return;
        }
        let denied = cached_tokens.saturating_mul(16) < matched_chars as u64;
        let url = {
            let mut workers = self.workers.lock();
            let Some(s) = workers.values_mut().find(|s| s.worker == Some(id)) else {
                return;
            };
            if !denied {
                s.denied = 0;
                return;
            }
            s.denied += 1;
            if s.denied < CONTRADICTIONS {
                return;
            }
            s.denied = 0;
            if std::mem::replace(&mut s.contradicted, true) {
                return;
            }
            s.url.clone()
        };
        self.metrics.stale.increment("contradicted");
        tracing::warn!(worker = %url, answers = CONTRADICTIONS, "kv_events: the worker's answers found far less cached than its events say it holds (its engine stopped publishing, or the stream is another engine's: check kv_events.port and endpoints); matched on the tree until its engine clears its cache or restarts");
        self.refresh_live();
    }

    /// Marks the workers that share a publisher endpoint with another, and
    /// says so once each time one starts to; true when any mark changed.
    /// A publisher is one engine's: its events were each such worker's
    /// exact index, so a worker was matched on another engine's cache.
    fn mark_shared(&self) -> bool {
        let mut workers = self.workers.lock();
        let mut owners: HashMap<&str, Vec<WorkerId>> = HashMap::new();
        for (&id, s) in workers.iter().filter(|(_, s)| s.worker.is_some()) {
            for endpoint in &s.publishers {
                owners.entry(endpoint).or_default().push(id);
            }
        }
        // Each worker's first endpoint shared, and a worker sharing it.
        let found: Vec<(WorkerId, Option<(String, WorkerId)>)> = workers
            .iter()
            .filter(|(_, s)| s.worker.is_some())
            .map(|(&id, s)| {
                let other = s.publishers.iter().find_map(|e| {
                    let with = owners.get(e.as_str())?.iter().find(|&&o| o != id)?;
                    Some((e.clone(), *with))
                });
                (id, other)
            })
            .collect();
        drop(owners);
        let mut changed = false;
        for (id, other) in found {
            let with = other
                .as_ref()
                .and_then(|(_, w)| workers.get(w))
                .map(|s| s.url.clone());
            let Some(s) = workers.get_mut(&id) else {
                continue;
            };
            if s.shared == other.is_some() {
                continue;
            }
            changed = true;
            s.shared = other.is_some();
            if let (Some((endpoint, _)), Some(with)) = (other, with) {
                tracing::warn!(worker = %s.url, other = %with, %endpoint, "kv_events: two workers' publishers resolve to one endpoint (engines on one host need their own entries in kv_events.endpoints); neither is matched exactly while they share it");
            }
        }
        changed
    }

    /// The worker's cache was emptied (a cleared cache or a restart): its
    /// index is whole again, whatever its answers said before.
    fn emptied(&self, id: WorkerId) {
        let was = self.workers.lock().get_mut(&id).is_some_and(|s| {
            s.denied = 0;
            std::mem::replace(&mut s.contradicted, false)
        });
        if was {
            self.refresh_live();
        }
    }

    fn set_live(&self, id: WorkerId, rank: usize, live: bool) {
        if let Some(s) = self.workers.lock().get_mut(&id)
            && let Some(slot) = s.live.get_mut(rank)
        {
            *slot = live;
        }
        self.refresh_live();
    }
}

/// The index key of a worker's rank.
fn key(id: WorkerId, rank: usize) -> Option<u32> {
    (id.0 < 1 << (32 - RANK_BITS)).then_some((id.0 << RANK_BITS) | rank as u32)
}

/// Keeps one subscription per rank of every worker in the pool.
async fn supervise(events: Arc<KvEvents>, router: Router, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SUPERVISE_PERIOD);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let set = router.snapshot();
        let current: HashMap<WorkerId, String> = set
            .workers()
            .iter()
            .map(|w| (w.id(), w.url().to_owned()))
            .collect();
        let now = tokio::time::Instant::now();
        let (rebound, gone) = events.follow_pool(&current, now);
        if rebound {
            events.refresh_live();
        }
        for sub in gone {
            let mut index = events.index.write();
            for rank in 0..events.config.data_parallel_size as usize {
                if let Some(k) = key(sub, rank) {
                    index.remove_worker(k);
                }
            }
            events.metrics.blocks.set(index.blocks() as f64);
            drop(index);
            events.refresh_live();
        }
        for (id, url) in current {
            if events.workers.lock().values().any(|s| s.worker == Some(id)) {
                continue;
            }
            let Some(host) = reqwest::Url::parse(&url)
                .ok()
                .and_then(|u| u.host_str().map(|h| h.trim_matches(['[', ']']).to_owned()))
            else {
                continue;
            };
            let endpoints = events.config.endpoints_for(&url, &host);
            let worker_stop = stop.child_token();
            events.workers.lock().insert(
                id,
                Subscribed {
                    worker: Some(id),
                    left: None,
                    live: vec![false; endpoints.len()],
                    contradicted: false,
                    denied: 0,
                    url: url.clone(),
                    stop: worker_stop.clone(),
                    publishers: endpoints.iter().map(|(e, _)| e.clone()).collect(),
                    shared: false,
                },
            );
            for (rank, (endpoint, replay)) in endpoints.into_iter().enumerate() {
                let Some(k) = key(id, rank) else {
                    tracing::warn!(worker = %url, "kv_events: worker id out of range; not subscribed");
                    continue;
                };
                tracing::info!(worker = %url, rank, endpoint = %endpoint, replay = ?replay, "kv_events: subscribing");
                if rank == 0 && replay.is_none() && events.config.replay_port.is_some() {
                    tracing::warn!(
                        worker = %url,
                        endpoint = %endpoint,
                        "kv_events: this worker's publisher is off the default port, so \
                         replay_port is not taken for its replay socket (it may be another \
                         engine's); list its own in kv_events.replay_endpoints, or a gap in \
                         its stream makes it stale"
                    );
                }
                let mut cfg = SubscriberConfig::new(endpoint, events.config.topic.clone());
                cfg.replay_endpoint = replay;
                cfg.max_message_bytes = events.config.max_message_bytes;
                tokio::spawn(follow(
                    events.clone(),
                    id,
                    rank,
                    k,
                    url.clone(),
                    cfg,
                    worker_stop.clone(),
                ));
            }
            events.refresh_live();
        }
        if events.mark_shared() {
            events.refresh_live();
        }
    }
    for (_, s) in events.workers.lock().drain() {
        s.stop.cancel();
    }
}

/// One rank's stream into the index.
async fn follow(
    events: Arc<KvEvents>,
    id: WorkerId,
    rank: usize,
    key: u32,
    url: String,
    cfg: SubscriberConfig,
    stop: CancellationToken,
) {
    let (tx, mut rx) = mpsc::channel(UPDATE_QUEUE);
    let endpoint = cfg.endpoint.clone();
    let subscriber = tokio::spawn(subscribe::run(cfg, tx));
    // The rank counts as live while its stream is (the subscriber's word)
    // and the index holds every block the stream reported: once a limit
    // refused some, only a cleared cache or a restart (both empty the
    // rank's blocks) makes the index whole again. The subscriber knows
    // nothing of the limits, so it neither says `Live` again after one
    // (its stream never stopped being exact) nor holds `Live` back for a
    // batch it delivered that was refused.
    let mut streaming = false;
    let mut refused = false;
    let mut live = false;
    let not_live = tokio::time::sleep(NOT_LIVE_WARNING);
    tokio::pin!(not_live);
    let mut warned = false;
    let mut warned_skips = false;
    let mut heard = false;
    loop {
        let update = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            update = rx.recv() => update,
            () = &mut not_live, if !warned => {
                warned = true;
                if !live && !heard {
                    tracing::info!(worker = %url, rank, %endpoint, "kv_events: no event heard in 30 s (an idle engine sends none; so does a wrong port or an engine started without its publisher); matched on the approximate tree until its stream is exact");
                } else if !live {
                    tracing::warn!(worker = %url, rank, %endpoint, "kv_events: events heard, but the stream is not exact (joined a publisher already running, with no replay of its start, or a limit refused blocks); matched on the approximate tree until its engine clears its cache or restarts");
                }
                continue;
            }
        };
        let Some(update) = update else { break };
        match update {
            Update::Batch { batch, .. } => {
                heard = true;
                let (stats, index_full) = {
                    let mut index = events.index.write();
                    let stats = index.apply(key, &batch.events);
                    events.metrics.blocks.set(index.blocks() as f64);
                    (stats, index.is_full())
                };
                events.metrics.batches.add(1);
                events.metrics.stored.add(stats.stored);
                events.metrics.removed.add(stats.removed);
                for (reason, n) in [
                    ("unknown_parent", stats.unknown_parent),
                    ("bad_shape", stats.bad_shape),
                ] {
                    if n > 0 {
                        events.metrics.skipped.add(reason, n);
                    }
                }
                if !warned_skips && stats.unknown_parent + stats.bad_shape > 0 {
                    // Once per rank: a publisher whose every store is
                    // skipped (its block size or hashes not what the
                    // router reads) looks live yet matches nothing.
                    warned_skips = true;
                    tracing::warn!(
                        worker = %url,
                        rank,
                        unknown_parent = stats.unknown_parent,
                        bad_shape = stats.bad_shape,
                        "kv_events: stored blocks skipped: their parent block is not held, or their token count is not the block size times their hashes (an engine whose block size or hashing differs from its events'); counted in radixgate_kv_events_blocks_skipped_total"
                    );
                }
                if stats.over_capacity > 0 {
                    if live {
                        // A rank past its limit lies about its cache
                        // (engines evict long before), or its cache is
                        // larger than the limit: its matches no longer
                        // count.
                        if index_full {
                            tracing::warn!(worker = %url, rank, "kv_events: the exact index is full (kv_events.max_blocks_total); this worker's blocks were refused, and it is matched on the tree until its cache is cleared");
                        } else {
                            tracing::warn!(worker = %url, rank, "kv_events: worker over its block limit (kv_events.max_blocks_per_worker); matched on the tree until its cache is cleared");
                        }
                        events.metrics.stale.increment("over_capacity");
                    }
                    refused = true;
                } else if batch.events.iter().any(|e| matches!(e, KvEvent::Cleared)) {
                    refused = false;
                    events.emptied(id);
                }
            }
            Update::Live => streaming = true,
            Update::Stale(reason) => {
                let label = match &reason {
                    StaleReason::Disconnected => "disconnected",
                    StaleReason::Gap { .. } => "gap",
                    StaleReason::Decode(_) => "decode",
                    StaleReason::Oversized { .. } => "oversized",
                    StaleReason::NoLocalSocket => "no_local_socket",
                };
                events.metrics.stale.increment(label);
                if let StaleReason::Oversized { declared, limit } = reason {
                    // Said at every try, live or not: such a publisher
                    // never becomes live, and nothing else would say why.
                    tracing::warn!(worker = %url, rank, declared_bytes = declared, limit_bytes = limit, "kv_events: publisher sent a frame or message over kv_events.max_message_bytes; disconnected, routing this worker on the approximate tree");
                } else if let StaleReason::NoLocalSocket = reason {
                    tracing::warn!(worker = %url, rank, "kv_events: no directory takes the size guard's local socket ($XDG_RUNTIME_DIR, $TMPDIR or /tmp, /dev/shm); not subscribed, routing this worker on the approximate tree");
                } else if live {
                    tracing::warn!(worker = %url, rank, reason = ?reason, "kv_events: stream stale; routing this worker on the approximate tree");
                }
                streaming = false;
            }
            Update::Restarted => {
                events.metrics.stale.increment("restarted");
                tracing::info!(worker = %url, rank, "kv_events: publisher restarted; its blocks dropped");
                let mut index = events.index.write();
                index.remove_worker(key);
                events.metrics.blocks.set(index.blocks() as f64);
                drop(index);
                refused = false;
                events.emptied(id);
            }
        }
        if live != (streaming && !refused) {
            live = !live;
            if live {
                tracing::info!(worker = %url, rank, "kv_events: stream live; routing on exact matches");
            }
            events.set_live(id, rank, live);
        }
    }
    subscriber.abort();
    if stop.is_cancelled() {
        // The worker left the pool. The supervisor drops its blocks as it
        // stops this task, but a batch this task had already taken could
        // still be applied after that, on another thread, and its blocks
        // would stay for good (a worker id never comes back), counted
        // against `max_blocks_total`. Dropped again here, after the last
        // apply.
        let mut index = events.index.write();
        index.remove_worker(key);
        events.metrics.blocks.set(index.blocks() as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use radixgate_routing::{PolicyConfig, Registry, WorkerSpec};

    /// KV events on for `registry`'s workers, until `stop`.
    fn spawned(registry: &Registry, stop: &CancellationToken) -> Arc<KvEvents> {
        let config = KvEventsConfig {
            enabled: true,
            ..KvEventsConfig::default()
        };
        let router = registry.router();
        KvEvents::spawn(&config, 1 << 16, router, &Metrics::new(), stop.clone()).unwrap()
    }

    /// A removed worker's count of contradicting answers goes with it: a
    /// worker id never comes back, so a count left behind would stay for
    /// good, one per worker that left mid-count.
    #[tokio::test]
    async fn a_removed_workers_contradictions_are_forgotten() {
        let mut registry = Registry::new(PolicyConfig::default().build().unwrap());
        let worker = registry.add(WorkerSpec::new("http://127.0.0.1:9")).unwrap();
        let stop = CancellationToken::new();
        let events = spawned(&registry, &stop);
        // Subscribed, as a worker whose answers are held to its events is.
        while !events.workers.lock().contains_key(&worker.id()) {
            tokio::time::sleep(SUPERVISE_PERIOD / 5).await;
        }
        events.answered(worker.id(), 4 * MIN_PROMISE_CHARS, 0);
        let denied = |events: &KvEvents| {
            events
                .workers
                .lock()
                .values()
                .map(|s| s.denied)
                .filter(|&d| d > 0)
                .count()
        };
        assert_eq!(denied(&events), 1);
        registry.remove(worker.id()).unwrap();
        let forgotten = async {
            while denied(&events) != 0 {
                tokio::time::sleep(SUPERVISE_PERIOD / 5).await;
            }
        };
        let waited = tokio::time::timeout(SUPERVISE_PERIOD * 6, forgotten).await;
        stop.cancel();
        assert!(waited.is_ok(), "the removed worker's count is still held");
    }

    /// A body after a UTF-8 byte order mark (passed over by the router's
    /// reading of a request, as by the engines') is tokenized as any other.
    /// Before, it was counted `tokenize_error` and routed on the tree.
    #[tokio::test]
    async fn a_body_after_a_byte_order_mark_is_tokenized() {
        let registry = Registry::new(PolicyConfig::default().build().unwrap());
        let stop = CancellationToken::new();
        let events = spawned(&registry, &stop);
        let flat = "\u{feff} {\"input_ids\":[1,2,3]}";
        let read = events.tokens("/generate", flat.as_bytes(), None);
        assert_eq!(read, Ok(Ok(vec![1, 2, 3])));
        // Read as values: text, and no tokenizer here to read it with.
        let text = "\u{feff}{\"prompt\":\"hi\"}";
        let read = events.tokens("/v1/completions", text.as_bytes(), None);
        assert_eq!(read, Ok(Err("no_tokens")));
        stop.cancel();
    }

    /// A request waits for a turn to tokenize at most `TURN_WAIT`, then is
    /// routed on the tree (counted); before, it waited for as long as the
    /// requests ahead of it took, however many there were.
    #[tokio::test(start_paused = true)]
    async fn a_request_waits_for_a_turn_to_tokenize_only_so_long() {
        let registry = Registry::new(PolicyConfig::default().build().unwrap());
        let config = KvEventsConfig {
            enabled: true,
            ..KvEventsConfig::default()
        };
        let metrics = Metrics::new();
        let stop = CancellationToken::new();
        let events =
            KvEvents::spawn(&config, 1 << 16, registry.router(), &metrics, stop.clone()).unwrap();
        let mut taken = Vec::new();
        while let Ok(turn) = events.tokenizing.clone().try_acquire_owned() {
            taken.push(turn);
        }
        let started = tokio::time::Instant::now();
        let turn = tokio::time::timeout(TURN_WAIT * 10, events.turn()).await;
        assert!(turn.expect("still waiting for a turn").is_none());
        assert_eq!(started.elapsed(), TURN_WAIT);
        let busy = "radixgate_kv_events_requests_total{match=\"tokenizer_busy\"} 1";
        assert!(metrics.render().contains(busy), "{}", metrics.render());
        // A turn given back within the wait is taken.
        let back = taken.pop().unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(TURN_WAIT / 2).await;
            drop(back);
        });
        let started = tokio::time::Instant::now();
        assert!(events.turn().await.is_some());
        assert_eq!(started.elapsed(), TURN_WAIT / 2);
        stop.cancel();
    }
}
