//! The load lane: load reports on their own, sent and read by a thread of
//! their own over a NATS connection of their own, once per
//! `load_period_ms` while anything is in flight here or held from a peer.
//!
//! Why a thread: at the rates where replicas are idle between requests, a
//! message that reaches a sleeping process costs a thread wake-up (80-110
//! µs of CPU on the machine of docs/sync.md), and the refresh the protocol
//! promises (every busy replica, every 100 ms, read by every peer) was most
//! of sync's messages. This thread does not wait on its socket while it
//! ticks: it sleeps until the next multiple of the period, then reads
//! everything the peers sent meanwhile, sends its own report and sleeps
//! again, one wake-up for all of it. Only while nothing is held, in
//! flight or waiting to go does it wait on the socket (for the first
//! report of a peer that got busy), on its own load's change signal, or
//! for a poke (a peer's report that came with a batch, a first token).
//!
//! What goes here and what does not: every insert batch carries the
//! loads as they are when it goes out, so the peers hear of a request's
//! start with its decision, at once, through the insert feed. This lane
//! carries the refresh, a load that fell at a request's end or at its
//! first token with no decision going out since, and the first tokens
//! that no decision's batch took along (each was a batch of its own,
//! read by every peer): a peer hears of those within one to two periods,
//! and until then counts the request as still in flight, or still
//! prefilling, there.

use super::clocks::PeerClocks;
use super::wire::{self, Body, FirstToken, WorkerLoad};
use super::{Identity, SyncMetrics, now_ms};
use crate::config::{SyncAuth, SyncConfig};
use async_nats::Subscriber;
use futures::{FutureExt as _, StreamExt as _};
use radixgate_routing::{PeerLoad, PeerLoads, Router, Worker};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The prefill, in characters, whose end the lane reports at once rather
/// than at its next tick: about 2k tokens, tens of milliseconds of a GPU's
/// prefill, which a peer that still counts it queued would route around.
/// Shorter prefills (a chat turn past a cached prefix) wait for the tick,
/// and so cost no extra wake-up.
pub(super) const EARLY_PREFILL_CHARS: u64 = 8 * 1024;

/// What the lane shares with the publisher and the insert receiver.
#[derive(Debug)]
pub(super) struct Shared {
    /// The peers' reports, from this lane and from their insert batches.
    peers: Mutex<PeerLoads>,
    /// The number of this replica's last load report, on its own or with
    /// a batch: one sequence, so a receiver keeps the newer of the two.
    load_seq: AtomicU64,
    /// The lane waits on its socket, not on its clock.
    idle: AtomicBool,
    /// The lane's thread has ended (stopping, or it could not start):
    /// nothing would expire a peer's report any more, so none is taken.
    closed: AtomicBool,
    /// Wakes an idle lane: a peer's report came with a batch, and has to
    /// expire in time, or a first token waits to go.
    poke: Notify,
    /// A first token came while the lane ticks: its request's prefill is
    /// done, and the peers should hear so before the next tick (see
    /// [`Shared::first_token`]).
    early: AtomicBool,
    /// The lane's thread, unparked for an early tick.
    thread: std::sync::OnceLock<std::thread::Thread>,
    /// First tokens this replica's cost model learned from, for the
    /// peers' fits: the next decision's batch takes them along, or else
    /// the lane's next report. At most `limit`.
    first_tokens: Mutex<Vec<FirstToken>>,
    limit: usize,
    /// Where the peers' loads are written.
    router: Router,
    /// How far each peer's clock seems from this one's, from its reports
    /// here: the insert feed judges its batches' reports by it.
    pub(super) clocks: PeerClocks,
}

impl Shared {
    pub(super) fn new(config: &SyncConfig, router: Router) -> Arc<Self> {
        Arc::new(Self {
            peers: Mutex::new(PeerLoads::new(Duration::from_millis(config.load_expiry_ms))),
            load_seq: AtomicU64::new(0),
            idle: AtomicBool::new(true),
            closed: AtomicBool::new(false),
            poke: Notify::new(),
            early: AtomicBool::new(false),
            thread: std::sync::OnceLock::new(),
            first_tokens: Mutex::new(Vec::new()),
            limit: config.queue_capacity,
            router,
            clocks: PeerClocks::new(
                config
                    .load_period_ms
                    .saturating_add(super::receive::CLOCK_SKEW.as_millis() as u64),
            ),
        })
    }

    /// Keeps a first token for the next message out; false (it is
    /// dropped) when `queue_capacity` are waiting already.
    ///
    /// A first token also means that its request's prefill is done: the
    /// request no longer counts as pending prefill on its worker here, and
    /// until the peers hear so they count it as still queued there. So the
    /// lane ticks early, at once, rather than at its next multiple of the
    /// period (at most once a period: see [`run`]), when that prefill was
    /// long enough to matter to the peers' predictions
    /// ([`EARLY_PREFILL_CHARS`]); each peer reads the report at its own
    /// next tick.
    pub(super) fn first_token(&self, first: FirstToken) -> bool {
        let early = first.observed.uncached_chars >= EARLY_PREFILL_CHARS;
        let mut firsts = self.first_tokens.lock().unwrap_or_else(|e| e.into_inner());
        if firsts.len() >= self.limit {
            return false;
        }
        firsts.push(first);
        drop(firsts);
        if early {
            self.early.store(true, Ordering::Release);
            if let Some(thread) = self.thread.get() {
                thread.unpark();
            }
        }
        // Its request is still in flight, so the lane ticks already; a
        // lane that went idle all the same must not keep it for ever.
        self.wake_if_idle();
        true
    }

    /// The first tokens waiting, for the message going out now.
    pub(super) fn take_first_tokens(&self) -> Vec<FirstToken> {
        std::mem::take(&mut *self.first_tokens.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn first_tokens_waiting(&self) -> bool {
        !self
            .first_tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// This replica's own non-zero loads, by worker URL, in worker order.
    pub(super) fn own_loads(&self) -> Vec<WorkerLoad> {
        own_loads(&self.router)
    }

    /// The number the next load report goes out with.
    pub(super) fn next_load_seq(&self) -> u64 {
        self.load_seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A peer's report, from wherever it came; applied to the workers at
    /// once. Only its loads on this router's workers are kept, one per
    /// worker (see [`known_loads`]); whether it named any other (counted
    /// `ignored{reason="unknown_worker"}` by the caller).
    pub(super) fn report(&self, instance: u64, seq: u64, loads: Vec<PeerLoad>) -> bool {
        let snapshot = self.router.snapshot();
        let (loads, unknown) = known_loads(loads, snapshot.workers());
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::Acquire) {
            return unknown;
        }
        if peers.report(instance, seq, Instant::now(), loads) {
            peers.apply(snapshot.workers());
        }
        drop(peers);
        self.wake_if_idle();
        unknown
    }

    /// Starts an idle lane ticking: a report is held that must expire in
    /// time, or a first token waits to go.
    fn wake_if_idle(&self) {
        if self.idle.load(Ordering::Acquire) {
            self.poke.notify_one();
        }
    }

    /// Drops expired reports and writes what is left into the workers;
    /// whether any is still held.
    fn expire(&self) -> bool {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.expire(Instant::now());
        peers.apply(self.router.snapshot().workers());
        peers.replicas() > 0
    }

    /// The lane has ended: the peers' loads no longer count, now or later
    /// (a report that comes with a batch would stay for ever).
    fn close(&self) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        self.closed.store(true, Ordering::Release);
        *peers = PeerLoads::new(Duration::ZERO);
        peers.apply(self.router.snapshot().workers());
    }
}

/// A peer's loads on `workers`, each worker's summed into one (a report
/// lists each once), and whether it named any other. A report held keeps
/// what it says until it expires, and every report taken adds up all
/// those held: one that named thousands of workers no replica has (a
/// forged or broken sender, up to a whole message of them) was kept
/// whole, and a run of them from many instances held hundreds of MiB and
/// kept the load lane summing them for minutes, the peers' real reports
/// waiting behind. A worker this router discovers later counts from the
/// peer's next report.
fn known_loads(loads: Vec<PeerLoad>, workers: &[Arc<Worker>]) -> (Vec<PeerLoad>, bool) {
    // A report names a few workers of a pool of a few: a scan per load
    // costs less than hashing every worker's URL (3,200 instructions a
    // report more than before this check, on 4 workers, when it hashed);
    // a long report over a large pool is looked up through an index.
    let index: Option<HashMap<&str, usize, foldhash::fast::RandomState>> =
        (loads.len() * workers.len() > SCANNED).then(|| {
            workers
                .iter()
                .enumerate()
                .map(|(i, w)| (w.url(), i))
                .collect()
        });
    let find = |url: &str| match &index {
        Some(index) => index.get(url).copied(),
        None => workers.iter().position(|w| w.url() == url),
    };
    let mut sums: Vec<Option<PeerLoad>> = vec![None; workers.len()];
    let mut unknown = false;
    for load in loads {
        let url = radixgate_routing::WorkerUrl::canonical(&load.url);
        let Some(i) = find(url.as_ref()) else {
            unknown = true;
            continue;
        };
        let sum = sums[i].get_or_insert_with(|| PeerLoad {
            url: workers[i].url().to_owned(),
            in_flight: 0,
            pending_prefill: 0,
        });
        sum.in_flight = sum.in_flight.saturating_add(load.in_flight);
        sum.pending_prefill = sum.pending_prefill.saturating_add(load.pending_prefill);
    }
    (sums.into_iter().flatten().collect(), unknown)
}

/// Loads times workers up to which [`known_loads`] scans rather than
/// indexes.
const SCANNED: usize = 256;

/// This replica's own non-zero loads, by worker URL, in worker order.
fn own_loads(router: &Router) -> Vec<WorkerLoad> {
    router
        .snapshot()
        .workers()
        .iter()
        .filter(|w| loaded(w))
        .map(|w| WorkerLoad {
            url: w.url().to_owned(),
            in_flight: u32::try_from(w.load()).unwrap_or(u32::MAX),
            pending_prefill: w.pending_prefill() as u64,
        })
        .collect()
}

/// Whether a worker has load of this replica's own to report.
fn loaded(w: &Worker) -> bool {
    w.load() > 0 || w.pending_prefill() > 0
}

/// The lane's thread and what stops it.
pub(super) struct Lane {
    thread: std::thread::JoinHandle<()>,
}

impl Lane {
    /// Waits for the thread, which `stop` ends within a period.
    pub(super) async fn join(self) {
        self.thread.thread().unpark();
        let _ = tokio::task::spawn_blocking(move || self.thread.join()).await;
    }
}

/// Starts the lane's thread; it connects on its own (retrying while NATS
/// is down) and runs until `stop`.
pub(super) fn spawn(
    config: SyncConfig,
    auth: SyncAuth,
    me: Identity,
    shared: Arc<Shared>,
    metrics: Arc<SyncMetrics>,
    stop: CancellationToken,
) -> std::io::Result<Lane> {
    let thread = std::thread::Builder::new()
        .name("radixgate-sync-load".to_owned())
        .spawn(move || {
            let _ = shared.thread.set(std::thread::current());
            let _closing = ClosedAtExit(&shared);
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(err) => {
                    tracing::error!(error = %err, "replica sync: cannot start the load lane; peers' loads are not counted");
                    return;
                }
            };
            run(&rt, &config, auth, &me, &shared, &metrics, &stop);
        })?;
    Ok(Lane { thread })
}

/// Closes the lane's [`Shared`] however its thread ends, a panic's
/// unwinding included: the peers' loads held would otherwise count for
/// ever, none left to expire them.
struct ClosedAtExit<'a>(&'a Shared);

impl Drop for ClosedAtExit<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

fn run(
    rt: &tokio::runtime::Runtime,
    config: &SyncConfig,
    auth: SyncAuth,
    me: &Identity,
    shared: &Shared,
    metrics: &Arc<SyncMetrics>,
    stop: &CancellationToken,
) {
    let subject = me.subject("load");
    let setup = rt.block_on(async {
        let client = super::connect::connect(
            config,
            auth,
            me,
            metrics.clone(),
            super::connect::Link::LoadLane,
            None,
        )
            .await
            .map_err(|e| e.to_string())?;
        loop {
            match client.subscribe(subject.clone()).await {
                Ok(sub) => return Ok((client, sub)),
                Err(err) => {
                    tracing::warn!(error = %err, "replica sync: cannot subscribe to load reports; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return Err("stopped".to_owned()),
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    });
    let (client, sub) = match setup {
        Ok(set) => set,
        Err(err) => {
            if !stop.is_cancelled() {
                tracing::error!(error = %err, "replica sync: no load lane; peers' loads are not counted");
            }
            return;
        }
    };
    let mut lane = Ticks {
        client,
        sub,
        subject,
        me,
        shared,
        metrics,
        last: Vec::new(),
    };
    let period = Duration::from_millis(config.load_period_ms);
    // Signalled at every change of this replica's own load: what starts an
    // idle lane when this replica gets busy. (While it ticks, a signal
    // left over only makes the next idle wait look once more.)
    let changes = shared.router.load_changes();
    // Whether the tick since the last one on the grid was an early one.
    let mut early_taken = false;
    while !stop.is_cancelled() {
        if lane.busy() {
            shared.idle.store(false, Ordering::Release);
            // This tick reports every first token so far.
            shared.early.store(false, Ordering::Release);
            rt.block_on(lane.tick());
            // Asleep, not waiting on the socket: what the peers send
            // meanwhile waits there for the next tick. A long prefill's
            // first token wakes it for one early tick a period; the grid's
            // tick still follows.
            let due = on_grid(Instant::now(), period);
            let mut early = false;
            while !stop.is_cancelled() {
                let now = Instant::now();
                if now >= due {
                    break;
                }
                if !early_taken && shared.early.swap(false, Ordering::AcqRel) {
                    early = true;
                    break;
                }
                std::thread::park_timeout(due - now);
            }
            early_taken = early;
        } else {
            shared.idle.store(true, Ordering::Release);
            // Something may have changed between the last look and the
            // flag: look once more before waiting.
            if lane.busy() {
                continue;
            }
            let message = rt.block_on(async {
                tokio::select! {
                    _ = stop.cancelled() => None,
                    _ = shared.poke.notified() => None,
                    _ = changes.notified() => None,
                    m = lane.sub.next() => m,
                }
            });
            if let Some(m) = message {
                lane.take(&m.payload);
            }
        }
    }
    // Sends what is buffered before the connection closes.
    rt.block_on(async {
        let _ = tokio::time::timeout(Duration::from_millis(500), lane.client.flush()).await;
    });
}

struct Ticks<'a> {
    client: async_nats::Client,
    sub: Subscriber,
    subject: String,
    me: &'a Identity,
    shared: &'a Shared,
    metrics: &'a SyncMetrics,
    /// The loads this lane last reported.
    last: Vec<WorkerLoad>,
}

impl Ticks<'_> {
    /// Whether to keep ticking: this replica has something in flight (or
    /// has not yet said that it no longer has) or first tokens to send, or
    /// holds a peer's report that has to expire in time.
    fn busy(&self) -> bool {
        !self.last.is_empty()
            || self
                .shared
                .router
                .snapshot()
                .workers()
                .iter()
                .any(|w| loaded(w))
            || self.shared.first_tokens_waiting()
            || self.shared.expire()
    }

    /// One tick: what the peers sent since the last, then this replica's
    /// report.
    async fn tick(&mut self) {
        self.drain().await;
        self.shared.expire();
        let loads = own_loads(&self.shared.router);
        let firsts = self.shared.take_first_tokens();
        // Every tick while non-zero; once more when it falls to zero.
        if !loads.is_empty() || !self.last.is_empty() || !firsts.is_empty() {
            self.send(&loads, &firsts).await;
        }
        self.last = loads;
        // Lets the connection write it out before the thread sleeps.
        self.drain().await;
    }

    async fn send(&self, loads: &[WorkerLoad], firsts: &[FirstToken]) {
        let header = self.me.header(self.shared.next_load_seq());
        let payload = wire::encode_load(&header, loads, firsts);
        let items = 1 + firsts.len() as u64;
        let handed =
            super::hand_over(&self.client, &self.subject, payload.into(), self.metrics).await;
        if let Some(reason) = handed.dropped_as() {
            self.metrics.dropped(reason, items);
        }
    }

    /// Runs the connection until it has nothing more to read or write,
    /// without waiting: each round lets the runtime poll its socket once
    /// (a yield is woken only after that), then takes what arrived. Two
    /// rounds in a row with nothing new end it.
    async fn drain(&mut self) {
        let mut quiet = 0;
        while quiet < 2 {
            tokio::task::yield_now().await;
            let mut got = false;
            while let Some(Some(m)) = self.sub.next().now_or_never() {
                self.take(&m.payload);
                got = true;
            }
            quiet = if got { 0 } else { quiet + 1 };
        }
    }

    fn take(&self, payload: &[u8]) {
        let Some((h, Body::Load(loads, firsts))) =
            super::receive::screen(payload, self.me, self.metrics, None, wire::Kind::Load)
        else {
            return;
        };
        // Never replayed nor sent again, read within a period: how far
        // its sender's clock is from this one's.
        self.shared
            .clocks
            .heard(&h.replica, h.instance, h.sent_ms, now_ms());
        if self
            .shared
            .report(h.instance, h.seq, super::receive::peer_loads(loads))
        {
            self.metrics.ignored("unknown_worker");
        }
        for f in firsts {
            super::receive::learn_first_token(
                &self.shared.router,
                self.metrics,
                &f.model,
                &f.url,
                f.observed,
            );
        }
    }
}

/// How long after a wall-clock time `wall` (since the Unix epoch) the next
/// multiple of `step` since the epoch comes, strictly after it.
fn to_next_multiple(wall: Duration, step: Duration) -> Duration {
    let step_ns = step.as_nanos().max(1);
    let into = wall.as_nanos() % step_ns;
    Duration::from_nanos((step_ns - into) as u64)
}

/// Two reads of the wall clock and the monotonic one disagree by this much
/// at most, as far as [`on_grid`] is concerned.
const CLOCK_SLACK: Duration = Duration::from_micros(50);

/// The first instant after `after` (by more than [`CLOCK_SLACK`], so that
/// an instant on the grid is not given back as its own successor) that
/// falls on a multiple of `step` of the wall clock. Periodic reports go out
/// on this grid, the same for every replica (to the accuracy of their
/// clocks), so the reports of all busy peers reach a replica together and
/// are in when each reads its socket.
fn on_grid(after: Instant, step: Duration) -> Instant {
    let after = after + CLOCK_SLACK;
    let now = Instant::now();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let wall_after = if after >= now {
        wall + (after - now)
    } else {
        wall.saturating_sub(now - after)
    };
    after + to_next_multiple(wall_after, step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use radixgate_routing::{PolicyConfig, Registry, WorkerSpec};

    #[test]
    fn a_closed_lane_takes_no_more_reports() {
        let mut registry = Registry::new(PolicyConfig::default().build().unwrap());
        let worker = registry.add(WorkerSpec::new("http://127.0.0.1:9")).unwrap();
        let shared = Shared::new(&SyncConfig::default(), registry.router());
        let load = |in_flight| {
            vec![PeerLoad {
                url: "http://127.0.0.1:9".to_owned(),
                in_flight,
                pending_prefill: 0,
            }]
        };
        shared.report(7, 1, load(3));
        assert_eq!(worker.peer_load(), 3);
        // With no lane left to expire it, a report would count for ever.
        shared.close();
        assert_eq!(worker.peer_load(), 0);
        shared.report(7, 2, load(5));
        assert_eq!(worker.peer_load(), 0);
    }

    /// A lane's thread that ends by a panic closes it too.
    #[test]
    fn a_lane_whose_thread_panics_is_closed() {
        let mut registry = Registry::new(PolicyConfig::default().build().unwrap());
        let worker = registry.add(WorkerSpec::new("http://127.0.0.1:9")).unwrap();
        let shared = Shared::new(&SyncConfig::default(), registry.router());
        let load = vec![PeerLoad {
            url: "http://127.0.0.1:9".to_owned(),
            in_flight: 3,
            pending_prefill: 0,
        }];
        shared.report(7, 1, load);
        assert_eq!(worker.peer_load(), 3);
        let lane = shared.clone();
        let ended = std::thread::spawn(move || {
            let _closing = ClosedAtExit(&lane);
            panic!("a defect in the lane");
        })
        .join();
        assert!(ended.is_err());
        assert_eq!(worker.peer_load(), 0);
    }

    #[test]
    fn the_grid_is_the_next_multiple_strictly_after() {
        let step = Duration::from_millis(100);
        let ms = Duration::from_millis;
        assert_eq!(to_next_multiple(ms(1_000_030), step), ms(70));
        assert_eq!(to_next_multiple(ms(1_000_099), step), ms(1));
        // On a multiple: the next one, a whole step on.
        assert_eq!(to_next_multiple(ms(1_000_000), step), step);
        assert_eq!(
            to_next_multiple(Duration::from_nanos(1), step),
            ms(100) - Duration::from_nanos(1)
        );
        // A zero step never divides by zero.
        assert_eq!(
            to_next_multiple(ms(5), Duration::ZERO),
            Duration::from_nanos(1)
        );
    }

    #[test]
    fn grid_instants_are_at_most_a_step_ahead_and_a_step_apart() {
        let step = Duration::from_millis(100);
        let start = Instant::now();
        let first = on_grid(start, step);
        assert!(first > start && first - start <= step);
        let second = on_grid(first, step);
        // Not the same instant again: the next multiple, a step on, give or
        // take the clocks' reads.
        let gap = second - first;
        assert!(
            gap > step - CLOCK_SLACK && gap <= step + CLOCK_SLACK,
            "{gap:?}"
        );
        let past = on_grid(start - Duration::from_millis(250), step);
        assert!(past <= start - Duration::from_millis(150) + CLOCK_SLACK);
    }
}
