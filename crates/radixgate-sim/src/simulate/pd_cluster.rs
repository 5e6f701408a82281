//! One simulated prefill/decode (PD) run: a pool of prefill engines and a
//! pool of decode engines, each routed by its own real `radixgate-routing`
//! policy, in simulated time.
//!
//! Each request, as a PD router handles it (SGLang's bootstrap mode: both
//! workers are chosen, and their load taken, when the request arrives):
//! 1. the decode policy picks a decode worker and the prefill policy a
//!    prefill worker (each a [`Router`](radixgate_routing::Router) over its
//!    own pool, holding its [`LoadGuard`]);
//! 2. the prefill engine runs the prompt with one output token, as a PD
//!    prefill worker does; its prefix cache counts as on any worker, and
//!    its answer's cached tokens correct the prefill policy's tree;
//! 3. the prompt's KV then moves to the decode worker: `prompt tokens x
//!    KV bytes per token / bandwidth` of simulated time ([`Transfer`](super::pd::Transfer)).
//!    Each prefill worker sends one transfer at a time (one link), in the
//!    order its prefills finish, so a burst of prefills queues on the link;
//! 4. the decode engine admits it with the prompt's KV in place
//!    ([`Engine::submit_transferred`]): no prefill, its first step decodes
//!    the first token. TTFT is thus prefill queue + prefill + transfer
//!    (with any wait for the link) + decode queue + first decode step.
//!
//! With `--pd-skip-prefill-tokens N`, a request whose chosen decode worker
//! already holds all but at most N of its prompt tokens goes to decode
//! alone, which prefills the rest itself (the router's flag and rule). The
//! simulator reads the decode engine's true cache where the router
//! predicts it, so it is what an exact prediction would save.
//!
//! The prefill engine's copy of the KV is released (and kept as prefix
//! cache) when its prefill ends rather than when the transfer is done: the
//! prefill pool's memory is never the constraint here. Reported load
//! (`/get_load` polling) is not simulated: no built-in policy reads it.
//!
//! Requests come from the same [`Issuers`] as the co-located run, so both
//! see the same requests, at the same times in an open loop.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use radixgate_routing::{CacheFeedback, CacheReport, LoadGuard, PolicyConfig, Worker, WorkerSpec};

use super::SimConfig;
use super::events::{Kind, Queue};
use super::issuing::{Issued, Issuers};
use super::pd::PdArm;
use super::replicas::{ReplicaConfig, Replicas};
use super::text::{prompt_and_final, routing_text, worker_reply, worker_text};
use crate::SimError;
use crate::engine::{Engine, EngineRequest, Finished, ReqId};
use crate::tokens::Tokenizer;
use crate::workload::{RequestSpec, SessionId, Workload};

/// What one PD run measured (raw; the report summarises).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PdStats {
    /// Requests completed.
    pub completed: u64,
    /// Requests an engine refused (larger than a worker's KV capacity).
    pub failed: u64,
    /// Completed requests that went to decode alone (skip-prefill).
    pub skipped: u64,
    /// Prompt tokens of the prefills the prefill pool ran.
    pub prefill_prompt_tokens: u64,
    /// Of those, found in the prefill worker's cache.
    pub prefill_cached_tokens: u64,
    /// Prompt tokens computed (not found cached) by every engine, both
    /// pools.
    pub computed_prompt_tokens: u64,
    /// Output tokens of completed requests (the decode pool's).
    pub completion_tokens: u64,
    /// Time to first token per completed request, ms, in completion order.
    pub ttft_ms: Vec<f64>,
    /// End-to-end latency per completed request, ms.
    pub e2e_ms: Vec<f64>,
    /// Every gap between two consecutive output tokens of one request, ms.
    pub itl_ms: Vec<f64>,
    /// Per transferred request, from the end of its prefill to its KV
    /// landing on the decode worker (link wait + transfer), ms.
    pub transfer_ms: Vec<f64>,
    /// Prefills each prefill worker ran.
    pub per_prefill: Vec<u64>,
    /// Completed requests per decode worker.
    pub per_decode: Vec<u64>,
    /// The workload's numbers ([`RequestSpec::seq`]) of completed
    /// requests, in completion order.
    pub seqs: Vec<u64>,
    /// Simulated time of the last completion.
    pub end: Duration,
}

/// A policy over one pool: its router and its records of the workers.
struct Pool {
    replicas: Replicas,
    workers: Vec<Arc<Worker>>,
}

impl Pool {
    /// `n` workers of `role`, each reporting a KV cache of `capacity`
    /// tokens on admission, as a real one does (`/get_server_info`).
    fn new(
        pc: &PolicyConfig,
        role: &str,
        n: usize,
        model: &str,
        capacity: Option<u64>,
    ) -> Result<Self, SimError> {
        let specs: Vec<WorkerSpec> = (0..n)
            .map(|i| {
                WorkerSpec::new(format!("http://sim-{role}-{i}"))
                    .with_models([model.to_owned()])
                    .with_kv_capacity_tokens(capacity)
            })
            .collect();
        let replicas = Replicas::build(&ReplicaConfig::default(), pc, &specs)?;
        let workers = replicas.first_workers();
        Ok(Self { replicas, workers })
    }

    /// The chosen worker's index, its guard, and the tree feedback.
    fn choose(&self, model: &str, text: &str) -> Result<Chosen, SimError> {
        let mut routed =
            self.replicas
                .router(0)
                .select_exact(Some(model), text, None, &[], None)?;
        let feedback = routed
            .decision
            .take_cache_feedback()
            .map(|f| (f, text.to_owned()));
        let guard = routed.decision.into_guard();
        let i = self
            .workers
            .iter()
            .position(|w| w.id() == guard.worker().id())
            .expect("the policy chose one of this pool's workers");
        Ok(Chosen {
            worker: i,
            guard,
            feedback,
        })
    }

    fn eviction_interval(&self) -> Option<Duration> {
        self.replicas.router(0).policy().eviction_interval()
    }

    fn evict(&self) {
        for p in self.replicas.policies() {
            p.evict_now();
        }
    }
}

struct Chosen {
    worker: usize,
    guard: LoadGuard,
    feedback: Option<(CacheFeedback, String)>,
}

impl Chosen {
    /// The worker's answer reported these tokens: correct the tree.
    fn report(&mut self, f: &Finished) {
        if let Some((feedback, text)) = self.feedback.take() {
            let report = CacheReport {
                prompt_tokens: f.prompt_tokens as u64,
                cached_tokens: f.cached_tokens as u64,
            };
            feedback.apply(&text, report);
        }
    }
}

struct Live {
    session: SessionId,
    seq: u64,
    client: Option<usize>,
    /// The prefill side until its prefill ends (`None` once done, or when
    /// the request skipped prefill).
    prefill: Option<Chosen>,
    decode: Chosen,
    /// The decode side's request, held until the KV lands.
    held: Option<EngineRequest>,
    /// It went to decode alone.
    skipped: bool,
    start: Duration,
    first: Option<Duration>,
    last_token: Option<Duration>,
    reply: String,
}

struct PdCluster<'a> {
    cfg: &'a SimConfig,
    arm: &'a PdArm,
    tokenizer: Tokenizer,
    workload: Box<dyn Workload>,
    /// Prefill engines first, then decode engines.
    engines: Vec<Engine>,
    pending: Vec<Option<crate::engine::StepOutcome>>,
    /// When each prefill worker's link is free again.
    link_free: Vec<Duration>,
    prefill: Pool,
    decode: Pool,
    evict_every: Option<Duration>,
    queue: Queue,
    now: Duration,
    issuers: Issuers,
    next_id: ReqId,
    live: HashMap<ReqId, Live>,
    stats: PdStats,
}

/// Runs `arm` against the configured workload (`cfg.workers` is not used:
/// the arm sizes its pools).
pub fn run(cfg: &SimConfig, arm: &PdArm) -> Result<PdStats, SimError> {
    let pooled = SimConfig {
        workers: arm.prefill_workers + arm.decode_workers,
        ..cfg.clone()
    };
    pooled.validate()?;
    arm.validate()?;
    let n = pooled.workers;
    let engines = (0..n)
        .map(|_| Engine::new(cfg.worker.engine.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let model = cfg.worker.model.as_str();
    let capacity = engines.first().map(|e| e.config().capacity_tokens() as u64);
    let prefill = Pool::new(
        &arm.prefill_policy,
        "prefill",
        arm.prefill_workers,
        model,
        capacity,
    )?;
    let decode = Pool::new(
        &arm.decode_policy,
        "decode",
        arm.decode_workers,
        model,
        capacity,
    )?;
    let evict_every = match (prefill.eviction_interval(), decode.eviction_interval()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let mut c = PdCluster {
        cfg,
        arm,
        tokenizer: Tokenizer::new(cfg.worker.chars_per_token)?,
        workload: cfg.workload.build(cfg.seed, cfg.shape)?,
        engines,
        pending: vec![None; n],
        link_free: vec![Duration::ZERO; arm.prefill_workers],
        prefill,
        decode,
        evict_every,
        queue: Queue::default(),
        now: Duration::ZERO,
        issuers: Issuers::new(cfg),
        next_id: 0,
        live: HashMap::new(),
        stats: PdStats {
            per_prefill: vec![0; arm.prefill_workers],
            per_decode: vec![0; arm.decode_workers],
            ..PdStats::default()
        },
    };
    c.issuers.start(&mut c.queue);
    if let Some(every) = c.evict_every {
        c.queue.push(every, Kind::Evict);
    }
    c.run_loop()?;
    c.stats.computed_prompt_tokens = c
        .engines
        .iter()
        .map(|e| e.counters().prompt_tokens - e.counters().cached_tokens)
        .sum();
    Ok(c.stats)
}

impl PdCluster<'_> {
    fn run_loop(&mut self) -> Result<(), SimError> {
        while let Some(ev) = self.queue.pop() {
            self.now = ev.at;
            match ev.kind {
                Kind::StepDone(w) => self.step_done(w),
                Kind::KvArrived(id) => self.kv_arrived(id),
                Kind::Issue(i) => {
                    let in_flight = !self.live.is_empty();
                    let turn = self.issuers.turn(
                        i,
                        self.now,
                        &mut *self.workload,
                        &mut self.queue,
                        in_flight,
                    );
                    if let Some(Issued { spec, client }) = turn {
                        self.dispatch(spec, client)?;
                        self.issuers.dispatched(i, self.now, &mut self.queue);
                    }
                }
                Kind::Evict => {
                    self.prefill.evict();
                    self.decode.evict();
                    if let Some(every) = self.evict_every
                        && (self.queue.work() > 0 || !self.live.is_empty())
                    {
                        self.queue.push(self.now + every, Kind::Evict);
                    }
                }
                // Not scheduled in a PD run.
                Kind::Poll | Kind::Sync | Kind::SpeedChange(_) => {}
            }
        }
        debug_assert!(self.live.is_empty(), "every request completes");
        Ok(())
    }

    fn decode_engine(&self, d: usize) -> usize {
        self.arm.prefill_workers + d
    }

    fn dispatch(&mut self, spec: RequestSpec, client: Option<usize>) -> Result<(), SimError> {
        let text = worker_text(&spec.prompt, self.cfg.api);
        let max_tokens = spec.max_tokens as usize;
        let reply = worker_reply(&text, max_tokens, &self.tokenizer);
        let (prompt, final_tokens) = prompt_and_final(&self.tokenizer, &text, &reply);
        let routing = routing_text(&spec.prompt, self.cfg.api);
        let model = self.cfg.worker.model.clone();
        let decode = self.decode.choose(&model, &routing)?;
        let id = self.next_id;
        self.next_id += 1;
        let req = EngineRequest {
            id,
            prompt,
            final_tokens,
            max_new_tokens: max_tokens,
        };
        let de = self.decode_engine(decode.worker);
        let skip = self.arm.skip_prefill_below.is_some_and(|most| {
            let held = self.engines[de].cached_prefix_tokens(&req.prompt);
            req.prompt.len().saturating_sub(held) <= most
        });
        let (prefill, held, engine) = if skip {
            // Decode alone: it prefills what it lacks itself.
            let submitted = self.engines[de].submit(req, self.now);
            (None, None, submitted.map(|()| de))
        } else {
            let prefill = self.prefill.choose(&model, &routing)?;
            // A PD prefill worker answers with one token and caches the
            // prompt.
            let first = EngineRequest {
                id,
                prompt: req.prompt.clone(),
                final_tokens: Vec::new(),
                max_new_tokens: 1,
            };
            let p = prefill.worker;
            let submitted = self.engines[p].submit(first, self.now);
            (Some(prefill), Some(req), submitted.map(|()| p))
        };
        let engine = match engine {
            Ok(engine) => engine,
            Err(_) => {
                // Too large for a worker (the HTTP worker answers 400).
                drop((prefill, decode));
                self.fail(spec.session, client);
                return Ok(());
            }
        };
        self.live.insert(
            id,
            Live {
                session: spec.session,
                seq: spec.seq,
                client,
                prefill,
                decode,
                held,
                skipped: skip,
                start: self.now,
                first: None,
                last_token: None,
                reply,
            },
        );
        if self.pending[engine].is_none() {
            self.start_step(engine);
        }
        Ok(())
    }

    fn fail(&mut self, session: SessionId, client: Option<usize>) {
        self.stats.failed += 1;
        self.workload.on_failure(session, self.now);
        if let Some(i) = client {
            self.issuers.schedule(i, self.now, &mut self.queue);
        }
        self.issuers.wake(None, self.now, &mut self.queue);
    }

    fn start_step(&mut self, w: usize) {
        let out = self.engines[w].step(self.now);
        if out.is_idle() {
            self.pending[w] = None;
        } else {
            self.queue.push(self.now + out.duration, Kind::StepDone(w));
            self.pending[w] = Some(out);
        }
    }

    fn step_done(&mut self, w: usize) {
        let out = self.pending[w].take().expect("a step was running");
        if w < self.arm.prefill_workers {
            for f in out.finished {
                self.prefill_done(w, &f);
            }
        } else {
            self.decode_step_done(&out);
        }
        self.start_step(w);
    }

    /// Request `f` finished its prefill on prefill worker `p`: its KV
    /// starts for the decode worker once `p`'s link is free.
    fn prefill_done(&mut self, p: usize, f: &Finished) {
        let Some(live) = self.live.get_mut(&f.id) else {
            return;
        };
        let mut prefill = live.prefill.take().expect("a prefill was running");
        // Its answer (one token) ends the router's prefill request.
        prefill
            .guard
            .first_token(self.now.saturating_sub(live.start));
        prefill.report(f);
        drop(prefill);
        self.stats.per_prefill[p] += 1;
        self.stats.prefill_prompt_tokens += f.prompt_tokens as u64;
        self.stats.prefill_cached_tokens += f.cached_tokens as u64;
        let begin = self.link_free[p].max(self.now);
        let lands = begin + self.arm.transfer.time(f.prompt_tokens);
        self.link_free[p] = lands;
        self.stats
            .transfer_ms
            .push(lands.saturating_sub(self.now).as_secs_f64() * 1000.0);
        self.queue.push(lands, Kind::KvArrived(f.id));
    }

    fn kv_arrived(&mut self, id: ReqId) {
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        let req = live
            .held
            .take()
            .expect("the decode request waits for its KV");
        let de = self.arm.prefill_workers + live.decode.worker;
        if self.engines[de].submit_transferred(req, self.now).is_err() {
            // Fits a prefill worker but not a decode one (its output).
            let live = self.live.remove(&id).expect("looked up above");
            drop((live.prefill, live.decode));
            self.fail(live.session, live.client);
            return;
        }
        if self.pending[de].is_none() {
            self.start_step(de);
        }
    }

    fn decode_step_done(&mut self, out: &crate::engine::StepOutcome) {
        for id in &out.first_token {
            if let Some(live) = self.live.get_mut(id) {
                live.first = Some(self.now);
                live.decode
                    .guard
                    .first_token(self.now.saturating_sub(live.start));
            }
        }
        for &(id, _) in &out.progressed {
            if let Some(live) = self.live.get_mut(&id)
                && let Some(last) = live.last_token.replace(self.now)
            {
                let gap = self.now.saturating_sub(last).as_secs_f64() * 1000.0;
                self.stats.itl_ms.push(gap);
            }
        }
        for f in &out.finished {
            self.complete(f);
        }
    }

    fn complete(&mut self, f: &Finished) {
        let Some(mut live) = self.live.remove(&f.id) else {
            return;
        };
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        live.decode.report(f);
        let s = &mut self.stats;
        s.completed += 1;
        s.skipped += u64::from(live.skipped);
        s.completion_tokens += f.completion_tokens as u64;
        s.ttft_ms.push(ms(live
            .first
            .unwrap_or(self.now)
            .saturating_sub(live.start)));
        s.e2e_ms.push(ms(self.now.saturating_sub(live.start)));
        s.per_decode[live.decode.worker] += 1;
        s.seqs.push(live.seq);
        s.end = self.now;
        drop(live.decode);
        self.workload.on_reply(live.session, &live.reply, self.now);
        self.issuers.wake(live.client, self.now, &mut self.queue);
    }
}
