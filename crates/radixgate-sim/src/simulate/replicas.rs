//! Several router replicas in one simulated run, and the sync between them.
//!
//! A replica is one policy instance with its own [`Registry`]/[`Router`]
//! and its own [`Worker`] records of the same pool (same URLs, same order),
//! so its trees and in-flight counts are what that replica sees. Requests
//! are spread over the replicas as `radixgate load` spreads them over
//! several `--url`s ([`Assigner`]): round-robin, or sticky by session,
//! group or a hash of the session (a load balancer hashing its clients).
//!
//! With a sync delay `D`, every change a replica makes is published as a
//! [`Message`] and applied by every other replica `D` of simulated time
//! later, through the event queue (one [`Kind::Sync`] event per message):
//! - a routing decision: the text the decision inserted
//!   ([`Decision::inserted_text`]), which the peers insert for the worker
//!   with that URL ([`Router::learn`], the live router's own path for a
//!   peer's decision);
//! - a first token its cost model learned from (the work the decision saw
//!   on the worker and the wait), which the peers' fits for the worker with
//!   that URL learn too ([`Router::observe`]; the live router sends it with
//!   the decision's insert);
//! - a change of the replica's own in-flight count or pending prefill on a
//!   worker (at the decision, the first token and the end): a report of
//!   its load on every worker, which each peer's [`PeerLoads`] keeps as
//!   that replica's latest and adds into the workers' peer load, as the
//!   live router does. A replica thus sees the others' load as of `D` ago.
//!
//! The model is the ideal sync: every change is sent at once, none is lost
//! or coalesced, all arrive after exactly `D`, and no replica goes silent
//! (reports never expire). Since `D` is the same for
//! every message, messages are due in the order they were sent, so the
//! pending ones sit in a FIFO and each `Sync` event applies the oldest.
//! Without sync (`None`), nothing is sent: each replica learns only from
//! its own decisions. One replica never sends anything, so a run with one
//! replica is the single-router run event for event.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use radixgate_routing::{
    Decision, Observation, PeerLoad, PeerLoads, Policy, PolicyConfig, Registry, Router,
    WILDCARD_MODEL, Worker, WorkerSpec,
};

use super::events::{Kind, Queue};
use crate::SimError;
use crate::load::Assign;
use crate::load::assign::Assigner;
use crate::workload::RequestSpec;

/// Most replicas a run may have.
pub const MAX_REPLICAS: usize = 256;

/// Longest sync delay accepted, simulated.
pub const MAX_SYNC_DELAY: Duration = Duration::from_secs(3600);

/// How many router replicas route a run, and how they share what they learn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplicaConfig {
    /// Router replicas (1: one router).
    pub count: usize,
    /// After how much simulated time a replica's decisions reach the
    /// others; `None`: never (no sync).
    pub sync_delay: Option<Duration>,
    /// How requests are spread over the replicas.
    pub spread: Assign,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        Self {
            count: 1,
            sync_delay: Some(Duration::from_millis(DEFAULT_SYNC_DELAY_MS)),
            spread: Assign::RoundRobin,
        }
    }
}

/// The sync delay when `--replicas` is given without `--sync-delay-ms`.
pub const DEFAULT_SYNC_DELAY_MS: u64 = 1;

impl ReplicaConfig {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), SimError> {
        if !(1..=MAX_REPLICAS).contains(&self.count) {
            return Err(SimError::Config(format!(
                "--replicas must be in 1..={MAX_REPLICAS}, got {}",
                self.count
            )));
        }
        if self.sync_delay.is_some_and(|d| d > MAX_SYNC_DELAY) {
            return Err(SimError::Config(format!(
                "--sync-delay-ms must be at most {} ms",
                MAX_SYNC_DELAY.as_millis()
            )));
        }
        Ok(())
    }

    /// `4 replicas (round-robin), sync after 10 ms`, or `None` for one
    /// router (so single-router reports read as before).
    pub fn describe(&self) -> Option<String> {
        (self.count > 1).then(|| {
            let sync = match self.sync_delay {
                Some(d) => format!("sync after {} ms", d.as_secs_f64() * 1000.0),
                None => "no sync".to_owned(),
            };
            format!("{} replicas ({}), {sync}", self.count, self.spread.name())
        })
    }
}

/// Where replica `r`'s tie-breaking rotation starts when there are
/// several with sync: as a live replica's with sync on, a number unrelated
/// to the others' (there a random one per process; here a fixed scramble
/// of `r`, so that runs repeat). Without sync a live router does not know
/// it has peers, and starts at 0 as one router does.
fn stagger_start(r: usize) -> usize {
    ((r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 16) as usize
}

/// What one replica tells the others.
#[derive(Debug)]
enum Message {
    /// It routed `text` for pool `model` to the worker at `url`.
    Insert {
        from: usize,
        model: String,
        url: String,
        text: String,
    },
    /// Its cost model learned from a first token on the worker at `url`.
    Observed {
        from: usize,
        model: String,
        url: String,
        seen: Observation,
    },
    /// Its report number `seq` of its own load on every worker.
    Load {
        from: usize,
        seq: u64,
        loads: Vec<PeerLoad>,
    },
}

/// One replica: a policy instance and its view of the pool.
struct Member {
    router: Router,
    /// Its records of the pool's workers, by index (the engines' order).
    workers: Vec<Arc<Worker>>,
    /// The other replicas' latest load reports.
    peers: PeerLoads,
    /// Load reports it has sent.
    sent: u64,
    /// Kept alive: the router's snapshots belong to it.
    _registry: Registry,
}

/// The replicas of one run and the messages in flight between them.
pub(super) struct Replicas {
    members: Vec<Member>,
    assigner: Assigner,
    /// `None` when nothing is sent: no sync, or one replica.
    delay: Option<Duration>,
    /// Simulated time zero as the `Instant` [`PeerLoads`] stamps reports
    /// with; only differences count, and reports never expire here.
    epoch: Instant,
    outbox: VecDeque<Message>,
}

impl Replicas {
    /// `cfg.count` replicas of policy `pc`, each over `specs`, in order.
    pub(super) fn build(
        cfg: &ReplicaConfig,
        pc: &PolicyConfig,
        specs: &[WorkerSpec],
    ) -> Result<Self, SimError> {
        cfg.validate()?;
        let members = (0..cfg.count)
            .map(|r| {
                let policy: Arc<dyn Policy> = pc.build()?;
                let mut registry = Registry::new(policy);
                if cfg.count > 1 && cfg.sync_delay.is_some() {
                    registry.stagger(stagger_start(r));
                }
                let workers = specs
                    .iter()
                    .map(|s| registry.add(s.clone()))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Member {
                    router: registry.router(),
                    workers,
                    peers: PeerLoads::new(Duration::MAX),
                    sent: 0,
                    _registry: registry,
                })
            })
            .collect::<Result<Vec<_>, SimError>>()?;
        let n = cfg.count;
        Ok(Self {
            members,
            assigner: Assigner::new(cfg.spread, n),
            delay: cfg.sync_delay.filter(|_| n > 1),
            epoch: Instant::now(),
            outbox: VecDeque::new(),
        })
    }

    /// The replica that receives `spec`.
    pub(super) fn pick(&self, spec: &RequestSpec) -> usize {
        self.assigner.pick(spec)
    }

    /// Replica `r`'s router.
    pub(super) fn router(&self, r: usize) -> &Router {
        &self.members[r].router
    }

    /// Replica 0's worker records (the index of a worker is the same in
    /// every replica).
    pub(super) fn first_workers(&self) -> Vec<Arc<Worker>> {
        self.members[0].workers.clone()
    }

    /// Every replica's record of every worker.
    pub(super) fn all_workers(&self) -> impl Iterator<Item = &[Arc<Worker>]> {
        self.members.iter().map(|m| m.workers.as_slice())
    }

    /// Every replica's policy (for eviction).
    pub(super) fn policies(&self) -> impl Iterator<Item = Arc<dyn Policy>> + '_ {
        self.members.iter().map(|m| m.router.policy())
    }

    /// Replica `from` made `decision` for `text` in pool `model` (`None`:
    /// the wildcard pool); the peers learn what it inserted.
    pub(super) fn publish_decision(
        &mut self,
        queue: &mut Queue,
        now: Duration,
        from: usize,
        model: Option<&str>,
        decision: &Decision,
        text: &str,
    ) {
        if self.delay.is_none() {
            return;
        }
        let Some(inserted) = decision.inserted_text(text) else {
            return;
        };
        let msg = Message::Insert {
            from,
            model: model.unwrap_or(WILDCARD_MODEL).to_owned(),
            url: decision.worker().url().to_owned(),
            text: inserted.to_owned(),
        };
        self.send(queue, now, msg);
    }

    /// Replica `from`'s cost model learned `seen` on the worker at `url`
    /// (pool `model`); the peers' fits learn it too.
    pub(super) fn publish_observation(
        &mut self,
        queue: &mut Queue,
        now: Duration,
        from: usize,
        model: &str,
        url: &str,
        seen: Observation,
    ) {
        if self.delay.is_none() {
            return;
        }
        let msg = Message::Observed {
            from,
            model: model.to_owned(),
            url: url.to_owned(),
            seen,
        };
        self.send(queue, now, msg);
    }

    /// Replica `from`'s own load may have changed: it reports its load on
    /// every worker.
    pub(super) fn publish_load(&mut self, queue: &mut Queue, now: Duration, from: usize) {
        if self.delay.is_none() {
            return;
        }
        let m = &mut self.members[from];
        m.sent += 1;
        let loads = m
            .workers
            .iter()
            .map(|w| PeerLoad {
                url: w.url().to_owned(),
                in_flight: w.load() as u32,
                pending_prefill: w.pending_prefill() as u64,
            })
            .collect();
        let msg = Message::Load {
            from,
            seq: m.sent,
            loads,
        };
        self.send(queue, now, msg);
    }

    fn send(&mut self, queue: &mut Queue, now: Duration, msg: Message) {
        if let Some(d) = self.delay {
            self.outbox.push_back(msg);
            queue.push(now + d, Kind::Sync);
        }
    }

    /// Every replica but `from`: the receivers of its messages.
    fn others(&self, from: usize) -> impl Iterator<Item = &Member> {
        self.members
            .iter()
            .enumerate()
            .filter(move |&(to, _)| to != from)
            .map(|(_, m)| m)
    }

    /// A [`Kind::Sync`] event at simulated time `now`: the oldest message
    /// reaches every other replica.
    pub(super) fn deliver(&mut self, now: Duration) {
        let Some(msg) = self.outbox.pop_front() else {
            return;
        };
        match msg {
            Message::Insert {
                from,
                model,
                url,
                text,
            } => {
                for m in self.others(from) {
                    m.router.learn(&model, &url, &text);
                }
            }
            Message::Observed {
                from,
                model,
                url,
                seen,
            } => {
                for m in self.others(from) {
                    m.router.observe(&model, &url, seen);
                }
            }
            Message::Load { from, seq, loads } => {
                let at = self.epoch + now;
                for (to, m) in self.members.iter_mut().enumerate() {
                    if to != from {
                        m.peers.report(from as u64, seq, at, loads.clone());
                        m.peers.apply(&m.workers);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Prompt;

    fn spec(session: u64) -> RequestSpec {
        RequestSpec {
            seq: 0,
            session,
            group: 0,
            arrival: None,
            prompt: Prompt::Text(String::new()),
            max_tokens: 1,
            wants_reply: false,
        }
    }

    fn set(count: usize, sync_delay: Option<Duration>) -> Replicas {
        let specs: Vec<WorkerSpec> = (0..2)
            .map(|i| WorkerSpec::new(format!("http://sim-{i}")).with_models(["m"]))
            .collect();
        let cfg = ReplicaConfig {
            count,
            sync_delay,
            spread: Assign::RoundRobin,
        };
        Replicas::build(&cfg, &PolicyConfig::default(), &specs).unwrap()
    }

    #[test]
    fn load_reaches_the_peers_after_the_delay_and_sums_over_them() {
        let mut r = set(3, Some(Duration::from_millis(5)));
        let mut q = Queue::default();
        let t0 = Duration::from_millis(10);
        let g0 = radixgate_routing::LoadGuard::with_prefill(r.members[0].workers[1].clone(), 40);
        let g2 = radixgate_routing::LoadGuard::acquire(r.members[2].workers[1].clone());
        r.publish_load(&mut q, t0, 0);
        r.publish_load(&mut q, t0, 2);
        assert_eq!(r.members[1].workers[1].peer_load(), 0, "not yet");
        let mut at = Vec::new();
        while let Some(ev) = q.pop() {
            assert_eq!(ev.kind, Kind::Sync);
            at.push(ev.at);
            r.deliver(ev.at);
        }
        assert_eq!(at, vec![t0 + Duration::from_millis(5); 2]);
        let ws: Vec<Arc<Worker>> = (0..3).map(|k| r.members[k].workers[1].clone()).collect();
        let w = |to: usize| &ws[to];
        assert_eq!((w(1).peer_load(), w(1).peer_pending_prefill()), (2, 40));
        assert_eq!((w(0).peer_load(), w(2).peer_load()), (1, 1), "not its own");
        assert_eq!(w(0).load(), 1, "own count untouched");
        drop(g0);
        r.publish_load(&mut q, t0, 0);
        while let Some(ev) = q.pop() {
            r.deliver(ev.at);
        }
        assert_eq!((w(1).peer_load(), w(1).peer_pending_prefill()), (1, 0));
        drop(g2);
    }

    #[test]
    fn a_first_token_teaches_the_peers_fits_after_the_delay() {
        let mut r = set(3, Some(Duration::from_millis(5)));
        let mut q = Queue::default();
        let seen = Observation {
            work: radixgate_routing::Work {
                queued_chars: 0,
                uncached_chars: 4096,
                in_flight: 1,
            },
            elapsed: Duration::from_millis(30),
        };
        r.publish_observation(&mut q, Duration::ZERO, 0, "m", "http://sim-1", seen);
        let learned = |r: &Replicas, k: usize| r.members[k].workers[1].ttft_observations(0);
        assert_eq!(learned(&r, 1), 0, "not yet");
        while let Some(ev) = q.pop() {
            assert_eq!(ev.at, Duration::from_millis(5));
            r.deliver(ev.at);
        }
        assert_eq!((learned(&r, 1), learned(&r, 2)), (1, 1));
        assert_eq!(learned(&r, 0), 0, "not its own: it learned it already");
        assert_eq!(
            r.members[1].workers[0].ttft_observations(0),
            0,
            "only that worker"
        );
    }

    #[test]
    fn nothing_is_sent_without_sync_or_peers() {
        for mut r in [set(3, None), set(1, Some(Duration::from_millis(1)))] {
            let mut q = Queue::default();
            r.publish_load(&mut q, Duration::ZERO, 0);
            let d = r.router(0).select(Some("m"), "x", None, &[]).unwrap();
            r.publish_decision(
                &mut q,
                Duration::ZERO,
                0,
                d.model.as_deref(),
                &d.decision,
                "x",
            );
            assert!(q.pop().is_none());
        }
    }

    #[test]
    fn round_robin_spreads_and_bounds_are_checked() {
        let r = set(3, None);
        let got: Vec<usize> = (0..6).map(|i| r.pick(&spec(i))).collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2]);
        let bad = |count, sync_delay| {
            ReplicaConfig {
                count,
                sync_delay,
                spread: Assign::RoundRobin,
            }
            .validate()
            .is_err()
        };
        assert!(bad(0, None));
        assert!(bad(MAX_REPLICAS + 1, None));
        assert!(bad(2, Some(MAX_SYNC_DELAY + Duration::from_millis(1))));
        assert!(!bad(2, Some(Duration::ZERO)));
    }
}
