//! One simulated run: a workload, N engines and one routing contender, in
//! simulated time.
//!
//! Each request: the workload hands it out (at the arrival process's time),
//! the contender picks a worker — a real `radixgate-routing` policy through
//! a real [`Registry`]/[`Router`], whose [`LoadGuard`] is held until the
//! request completes (and its prefill share released at the first token),
//! or the oracle — and the chosen [`Engine`] queues it. Engines step as the
//! `radixgate worker` does: a step starts when work arrives at an idle
//! engine or when the previous step's results land, and its results land
//! `duration` later (a [`Kind::StepDone`] event). Finished requests report
//! their reply to the workload, which may continue the session.
//!
//! Each engine starts at its speed from [`PoolSpeeds`](super::PoolSpeeds);
//! a scheduled speed change is a [`Kind::SpeedChange`] event that sets the
//! engine's speed for the steps it starts from then on.
//!
//! With several router replicas ([`replicas`](super::replicas)), each
//! request goes to one replica's policy, and each replica's decisions and
//! load changes reach the others through [`Kind::Sync`] events.
//!
//! Workers' reported load (`running`, `waiting`, KV use) is refreshed from
//! the engines every `load_poll` of simulated time, as a gateway polling
//! `/get_load` would see it; no built-in policy reads it today. The
//! policy's tree eviction runs every `eviction_interval_secs`, as the
//! gateway's background task does.
//!
//! Single-threaded and deterministic: the only inputs are the config and
//! seed; ties are ordered by [`events`](super::events).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use radixgate_routing::{
    CacheFeedback, CacheReport, Corrected, ExactMatches, LoadGuard, Observation, ReportedLoad,
    WILDCARD_MODEL, Worker, WorkerId, WorkerSpec,
};

use super::events::{Kind, Queue};
use super::issuing::{Issued, Issuers};
use super::replicas::Replicas;
use super::text::{prompt_and_final, routing_text, worker_reply, worker_text};
use super::timeline::Dispatched;
use super::{Contender, SimConfig, oracle, oracle_ttft};
use crate::SimError;
use crate::engine::{Engine, EngineRequest, Finished, ReqId};
use crate::tokens::Tokenizer;
use crate::workload::{RequestSpec, SessionId, Workload};

/// What one run measured (raw; [`report`](super::report) summarises).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunStats {
    /// Requests completed.
    pub completed: u64,
    /// Requests the engine refused (larger than a worker's KV capacity).
    pub failed: u64,
    /// Prompt tokens of completed requests.
    pub prompt_tokens: u64,
    /// Of those, served from the chosen worker's cache.
    pub cached_tokens: u64,
    /// Output tokens of completed requests.
    pub completion_tokens: u64,
    /// Time to first token per completed request, ms, in completion order.
    pub ttft_ms: Vec<f64>,
    /// End-to-end latency per completed request, ms, in completion order.
    pub e2e_ms: Vec<f64>,
    /// Inter-token latency: every gap between two consecutive output
    /// tokens of one request, ms, in the order the later token came.
    pub itl_ms: Vec<f64>,
    /// Completed requests per worker.
    pub per_worker: Vec<u64>,
    /// Tokens each worker's engine computed: uncached prompt tokens plus
    /// generated tokens (its work, whatever the request count).
    pub work_tokens: Vec<u64>,
    /// Every request a worker was given, in completion (or refusal) order:
    /// when, which worker, and its TTFT (for the timeline).
    pub dispatches: Vec<Dispatched>,
    /// Simulated time of the last completion.
    pub end: Duration,
    /// Answers whose reported cached tokens trimmed the policy's tree.
    pub trims: u64,
    /// Events processed.
    pub events: u64,
    /// Every completed request, in completion order: its place in the
    /// workload, its worker and its tokens (for per-worker figures over any
    /// subset, as `radixgate tune`'s prediction check needs).
    pub served: Vec<Served>,
}

/// One completed request of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// The workload's number for it ([`RequestSpec::seq`]; a trace's line,
    /// in time order).
    pub seq: u64,
    /// The worker (index in the pool) that served it.
    pub worker: usize,
    /// Its prompt tokens.
    pub prompt_tokens: u64,
    /// Of those, found in the worker's cache.
    pub cached_tokens: u64,
}

enum Chooser {
    Policy {
        replicas: Replicas,
        model: String,
        next_evict: Option<Duration>,
    },
    Oracle {
        turn: usize,
    },
    OracleTtft {
        turn: usize,
    },
    Pinned {
        workers: Arc<[usize]>,
    },
}

struct Live {
    session: SessionId,
    seq: u64,
    issuer: Option<usize>,
    guard: LoadGuard,
    /// The decision's tree insert with the routing text, to check against
    /// the cached tokens the engine reports (as the gateway does with each
    /// answer's usage).
    feedback: Option<(CacheFeedback, String)>,
    /// The router replica that routed it.
    replica: usize,
    worker: usize,
    start: Duration,
    first: Option<Duration>,
    /// When its latest output token came.
    last_token: Option<Duration>,
    reply: String,
}

/// A choice: the load guard, the replica that decided, and the tree
/// feedback of a policy's decision.
type Chosen = (LoadGuard, usize, Option<(CacheFeedback, String)>);

struct Cluster<'a> {
    cfg: &'a SimConfig,
    tokenizer: Tokenizer,
    workload: Box<dyn Workload>,
    engines: Vec<Engine>,
    pending: Vec<Option<crate::engine::StepOutcome>>,
    /// When each engine's step under way ends (meaningful while `pending`).
    step_end: Vec<Duration>,
    workers: Vec<Arc<Worker>>,
    chooser: Chooser,
    queue: Queue,
    now: Duration,
    issuers: Issuers,
    next_id: ReqId,
    live: HashMap<ReqId, Live>,
    stats: RunStats,
}

/// Runs `who` against the configured workload and pool.
pub fn run(cfg: &SimConfig, who: &Contender) -> Result<RunStats, SimError> {
    cfg.validate()?;
    let tokenizer = Tokenizer::new(cfg.worker.chars_per_token)?;
    let workload = cfg.workload.build(cfg.seed, cfg.shape)?;
    let engines = (0..cfg.workers)
        .map(|i| {
            let mut engine = cfg.worker.engine.clone();
            engine.timing.speed = cfg.speeds.initial_speed(i, engine.timing.speed);
            Engine::new(engine)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let model = cfg.worker.model.clone();
    // What each worker reports on admission (`/get_server_info`).
    let capacity = engines.first().map(|e| e.config().capacity_tokens() as u64);
    let spec = |i: usize| {
        WorkerSpec::new(format!("http://sim-{i}"))
            .with_models([model.clone()])
            .with_kv_capacity_tokens(capacity)
    };
    let (chooser, workers) = match who {
        Contender::Policy(pc) => {
            let specs: Vec<WorkerSpec> = (0..cfg.workers).map(spec).collect();
            let replicas = Replicas::build(&cfg.replicas, pc, &specs)?;
            let next_evict = replicas.router(0).policy().eviction_interval();
            let workers = replicas.first_workers();
            let chooser = Chooser::Policy {
                replicas,
                model: model.clone(),
                next_evict,
            };
            (chooser, workers)
        }
        Contender::Oracle | Contender::OracleTtft | Contender::Pinned(_) => {
            let workers = (0..cfg.workers)
                .map(|i| Arc::new(Worker::new(radixgate_routing::WorkerId(i as u32), spec(i))))
                .collect();
            let chooser = match who {
                Contender::Pinned(pins) => {
                    if let Some(&bad) = pins.iter().find(|&&w| w >= cfg.workers) {
                        return Err(SimError::Config(format!(
                            "a request is pinned to worker {bad}, but the pool has {} workers",
                            cfg.workers
                        )));
                    }
                    Chooser::Pinned {
                        workers: pins.clone(),
                    }
                }
                Contender::Oracle => Chooser::Oracle { turn: 0 },
                _ => Chooser::OracleTtft { turn: 0 },
            };
            (chooser, workers)
        }
    };
    let mut c = Cluster {
        cfg,
        tokenizer,
        workload,
        engines,
        pending: vec![None; cfg.workers],
        step_end: vec![Duration::ZERO; cfg.workers],
        workers,
        chooser,
        queue: Queue::default(),
        now: Duration::ZERO,
        issuers: Issuers::new(cfg),
        next_id: 0,
        live: HashMap::new(),
        stats: RunStats {
            per_worker: vec![0; cfg.workers],
            ..RunStats::default()
        },
    };
    c.start();
    c.run_loop()?;
    c.stats.work_tokens = c
        .engines
        .iter()
        .map(|e| {
            let k = e.counters();
            k.prompt_tokens - k.cached_tokens + k.generated_tokens
        })
        .collect();
    Ok(c.stats)
}

impl Cluster<'_> {
    fn start(&mut self) {
        self.issuers.start(&mut self.queue);
        if let Some(every) = self.cfg.load_poll {
            self.queue.push(every, Kind::Poll);
        }
        for (i, change) in self.cfg.speeds.changes.iter().enumerate() {
            self.queue.push(change.at, Kind::SpeedChange(i));
        }
        if let Chooser::Policy {
            next_evict: Some(every),
            ..
        } = &self.chooser
        {
            self.queue.push(*every, Kind::Evict);
        }
    }

    fn run_loop(&mut self) -> Result<(), SimError> {
        while let Some(ev) = self.queue.pop() {
            self.now = ev.at;
            self.stats.events += 1;
            match ev.kind {
                Kind::SpeedChange(i) => {
                    let c = self.cfg.speeds.changes[i];
                    self.engines[c.worker].set_speed(c.speed)?;
                }
                Kind::StepDone(w) => self.step_done(w),
                // Only prefill/decode runs move KV between workers.
                Kind::KvArrived(_) => {}
                Kind::Issue(i) => self.issue(i)?,
                Kind::Poll => {
                    self.publish_loads();
                    if let Some(every) = self.cfg.load_poll
                        && self.active()
                    {
                        self.queue.push(self.now + every, Kind::Poll);
                    }
                }
                Kind::Sync => {
                    if let Chooser::Policy { replicas, .. } = &mut self.chooser {
                        replicas.deliver(self.now);
                    }
                }
                Kind::Evict => {
                    if let Chooser::Policy {
                        replicas,
                        next_evict: Some(every),
                        ..
                    } = &self.chooser
                    {
                        for policy in replicas.policies() {
                            policy.evict_now();
                        }
                        let every = *every;
                        if self.active() {
                            self.queue.push(self.now + every, Kind::Evict);
                        }
                    }
                }
            }
        }
        debug_assert!(self.live.is_empty(), "every request completes");
        Ok(())
    }

    /// Whether anything but upkeep remains.
    fn active(&self) -> bool {
        self.queue.work() > 0 || !self.live.is_empty()
    }

    fn publish_loads(&self) {
        let reports: Vec<ReportedLoad> = self
            .engines
            .iter()
            .map(|e| {
                let l = e.load();
                ReportedLoad {
                    running: l.running as u32,
                    waiting: l.waiting as u32,
                    kv_usage: l.kv_used_tokens as f32 / l.kv_capacity_tokens.max(1) as f32,
                }
            })
            .collect();
        let set = |workers: &[Arc<Worker>]| {
            for (w, r) in workers.iter().zip(&reports) {
                w.set_reported_load(*r);
            }
        };
        match &self.chooser {
            Chooser::Policy { replicas, .. } => replicas.all_workers().for_each(set),
            Chooser::Oracle { .. } | Chooser::OracleTtft { .. } | Chooser::Pinned { .. } => {
                set(&self.workers);
            }
        }
    }

    /// Replica `replica`'s cost model learned `seen` on `worker`: the
    /// other replicas' fits learn it too, after the sync delay.
    fn first_token_seen(&mut self, replica: usize, worker: &Worker, seen: Observation) {
        if let Chooser::Policy {
            replicas, model, ..
        } = &mut self.chooser
        {
            let pool = if worker.models().is_empty() {
                WILDCARD_MODEL
            } else {
                model.as_str()
            };
            replicas.publish_observation(
                &mut self.queue,
                self.now,
                replica,
                pool,
                worker.url(),
                seen,
            );
        }
    }

    /// Replica `replica`'s own load may have changed: tell the others
    /// (after the sync delay; nothing without sync or peers).
    fn load_changed(&mut self, replica: usize) {
        if let Chooser::Policy { replicas, .. } = &mut self.chooser {
            replicas.publish_load(&mut self.queue, self.now, replica);
        }
    }

    fn issue(&mut self, i: usize) -> Result<(), SimError> {
        let in_flight = !self.live.is_empty();
        let turn = self
            .issuers
            .turn(i, self.now, &mut *self.workload, &mut self.queue, in_flight);
        if let Some(Issued { spec, client }) = turn {
            self.dispatch(spec, client)?;
            self.issuers.dispatched(i, self.now, &mut self.queue);
        }
        Ok(())
    }

    /// The worker's load guard, the replica that decided, and the
    /// decision's tree insert to check against the engine's cached tokens.
    fn choose(&mut self, spec: &RequestSpec, tokens: &[u64]) -> Result<Chosen, SimError> {
        match &mut self.chooser {
            Chooser::Policy {
                replicas, model, ..
            } => {
                let text = routing_text(&spec.prompt, self.cfg.api);
                let r = replicas.pick(spec);
                // With exact events, every worker's stream is live and says
                // what its cache holds of the prompt now (ids are alike on
                // every replica).
                let mut live: Vec<(WorkerId, usize)> = if self.cfg.exact_events {
                    self.workers
                        .iter()
                        .zip(&self.engines)
                        .map(|(w, e)| (w.id(), e.cache().cached_prefix_tokens(tokens)))
                        .collect::<Vec<_>>()
                } else {
                    Vec::new()
                };
                live.sort_unstable();
                let exact = self.cfg.exact_events.then_some(ExactMatches {
                    input_tokens: tokens.len(),
                    live: &live,
                });
                let mut routed = replicas.router(r).select_exact(
                    Some(model.as_str()),
                    &text,
                    None,
                    &[],
                    exact,
                )?;
                replicas.publish_decision(
                    &mut self.queue,
                    self.now,
                    r,
                    routed.model.as_deref(),
                    &routed.decision,
                    &text,
                );
                let feedback = routed.decision.take_cache_feedback().map(|f| (f, text));
                Ok((routed.decision.into_guard(), r, feedback))
            }
            Chooser::Oracle { turn } => {
                let in_flight: Vec<usize> = self.workers.iter().map(|w| w.load()).collect();
                let i = oracle::choose(&self.engines, &in_flight, tokens, *turn);
                *turn += 1;
                Ok((LoadGuard::acquire(self.workers[i].clone()), 0, None))
            }
            Chooser::OracleTtft { turn } => {
                let in_flight: Vec<usize> = self.workers.iter().map(|w| w.load()).collect();
                let busy_for: Vec<Duration> = self
                    .pending
                    .iter()
                    .zip(&self.step_end)
                    .map(|(p, &end)| match p {
                        Some(_) => end.saturating_sub(self.now),
                        None => Duration::ZERO,
                    })
                    .collect();
                let i = oracle_ttft::choose(&self.engines, &busy_for, &in_flight, tokens, *turn);
                *turn += 1;
                Ok((LoadGuard::acquire(self.workers[i].clone()), 0, None))
            }
            Chooser::Pinned { workers } => {
                let i = usize::try_from(spec.seq)
                    .ok()
                    .and_then(|seq| workers.get(seq).copied())
                    .ok_or_else(|| {
                        SimError::Config(format!(
                            "request {} has no pinned worker ({} pins)",
                            spec.seq,
                            workers.len()
                        ))
                    })?;
                Ok((LoadGuard::acquire(self.workers[i].clone()), 0, None))
            }
        }
    }

    fn dispatch(&mut self, spec: RequestSpec, issuer: Option<usize>) -> Result<(), SimError> {
        let text = worker_text(&spec.prompt, self.cfg.api);
        let max_tokens = spec.max_tokens as usize;
        let reply = worker_reply(&text, max_tokens, &self.tokenizer);
        let (prompt, final_tokens) = prompt_and_final(&self.tokenizer, &text, &reply);
        let (guard, replica, feedback) = self.choose(&spec, &prompt)?;
        // Every replica numbers the pool alike, so replica 0's records
        // find the index.
        let worker = self
            .workers
            .iter()
            .position(|w| w.id() == guard.worker().id())
            .expect("the policy chose one of our workers");
        self.load_changed(replica);
        let id = self.next_id;
        self.next_id += 1;
        let req = EngineRequest {
            id,
            prompt,
            final_tokens,
            max_new_tokens: max_tokens,
        };
        if self.engines[worker].submit(req, self.now).is_err() {
            // Too large for a worker (the HTTP worker answers 400).
            drop(guard);
            self.load_changed(replica);
            self.stats.failed += 1;
            self.stats.dispatches.push(Dispatched {
                at: self.now,
                worker,
                ttft_ms: None,
            });
            self.workload.on_failure(spec.session, self.now);
            if let Some(i) = issuer {
                self.issuers.schedule(i, self.now, &mut self.queue);
            }
            self.issuers.wake(None, self.now, &mut self.queue);
            return Ok(());
        }
        self.live.insert(
            id,
            Live {
                session: spec.session,
                seq: spec.seq,
                issuer,
                guard,
                feedback,
                replica,
                worker,
                start: self.now,
                first: None,
                last_token: None,
                reply,
            },
        );
        if self.pending[worker].is_none() {
            self.start_step(worker);
        }
        Ok(())
    }

    fn start_step(&mut self, w: usize) {
        let out = self.engines[w].step(self.now);
        if out.is_idle() {
            self.pending[w] = None;
        } else {
            self.step_end[w] = self.now + out.duration;
            self.queue.push(self.step_end[w], Kind::StepDone(w));
            self.pending[w] = Some(out);
        }
    }

    fn step_done(&mut self, w: usize) {
        let out = self.pending[w].take().expect("a step was running");
        for id in &out.first_token {
            if let Some(live) = self.live.get_mut(id) {
                live.first = Some(self.now);
                // The cost model learns from simulated first tokens as the
                // gateway's learns from real ones, and so do the other
                // replicas' (replica sync carries the first token).
                let seen = live
                    .guard
                    .first_token(self.now.saturating_sub(live.start))
                    .map(|seen| (live.guard.worker().clone(), seen));
                let replica = live.replica;
                self.load_changed(replica);
                if let Some((worker, seen)) = seen {
                    self.first_token_seen(replica, &worker, seen);
                }
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
        for f in out.finished {
            self.complete(f);
        }
        self.start_step(w);
    }

    fn complete(&mut self, f: Finished) {
        let Some(live) = self.live.remove(&f.id) else {
            return;
        };
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let s = &mut self.stats;
        s.completed += 1;
        s.prompt_tokens += f.prompt_tokens as u64;
        s.cached_tokens += f.cached_tokens as u64;
        s.completion_tokens += f.completion_tokens as u64;
        let ttft_ms = ms(live.first.unwrap_or(self.now).saturating_sub(live.start));
        s.ttft_ms.push(ttft_ms);
        s.dispatches.push(Dispatched {
            at: live.start,
            worker: live.worker,
            ttft_ms: Some(ttft_ms),
        });
        s.e2e_ms.push(ms(self.now.saturating_sub(live.start)));
        s.per_worker[live.worker] += 1;
        s.served.push(Served {
            seq: live.seq,
            worker: live.worker,
            prompt_tokens: f.prompt_tokens as u64,
            cached_tokens: f.cached_tokens as u64,
        });
        s.end = self.now;
        if let Some((feedback, text)) = live.feedback {
            let report = CacheReport {
                prompt_tokens: f.prompt_tokens as u64,
                cached_tokens: f.cached_tokens as u64,
            };
            if let Corrected::Trimmed { .. } = feedback.apply(&text, report) {
                s.trims += 1;
            }
        }
        drop(live.guard);
        self.load_changed(live.replica);
        self.workload.on_reply(live.session, &live.reply, self.now);
        self.issuers.wake(live.issuer, self.now, &mut self.queue);
    }
}
