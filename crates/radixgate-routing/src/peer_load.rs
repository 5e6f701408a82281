//! Other router replicas' load, as one more source of load the policies read.
//!
//! Each replica reports, for every worker it has requests on, its own
//! in-flight count and pending prefill characters. [`PeerLoads`] keeps the
//! latest report of each replica, drops a report once its replica has been
//! silent for the expiry time (it crashed, or lost its link), and writes the
//! sums into each worker ([`Worker::peer_load`]), where
//! [`Worker::routing_load`] adds them to the router's own count. Policies
//! never learn where the numbers came from.
//!
//! Workers are matched by canonical URL, since every replica numbers its
//! workers itself. A report naming a worker this router does not know
//! counts for nothing here (it may be one this router has not discovered
//! yet; the next report after it appears is applied).
//!
//! Concurrency: one owner (the gateway's sync task) holds a `PeerLoads`
//! by value and calls it; the only shared state it touches is the workers'
//! atomics. It reads no clock: callers pass `now`, so tests drive time.

use crate::{Worker, WorkerUrl};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One worker's load in a replica's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLoad {
    /// The worker's URL (compared in canonical form).
    pub url: String,
    /// Requests the replica has in flight there.
    pub in_flight: u32,
    /// Prefill characters the replica predicts are still pending there.
    pub pending_prefill: u64,
}

#[derive(Debug)]
struct Report {
    seq: u64,
    at: Instant,
    loads: Vec<PeerLoad>,
    /// Expired: it no longer counts (its loads are gone), and is kept for
    /// [`REMEMBERED`] more only so that an older report of the same
    /// replica, late, is still refused.
    expired: bool,
}

/// How long an expired report's number is remembered: a report that rides
/// on an insert batch is taken up to about a second and a half after it
/// was sent, so one overtaken by a newer report may arrive after that
/// newer one has expired; without its number it would count again, stale.
const REMEMBERED: Duration = Duration::from_secs(5);

/// The most expired reports' numbers remembered (a forger's made-up
/// replica ids each leave one); past it they are all forgotten.
const MAX_REMEMBERED: usize = 1024;

/// The latest unexpired load report of each other replica.
#[derive(Debug)]
pub struct PeerLoads {
    expiry: Duration,
    reports: HashMap<u64, Report>,
}

impl PeerLoads {
    /// Reports older than `expiry` (counted from their arrival) no longer
    /// count.
    pub fn new(expiry: Duration) -> Self {
        Self {
            expiry,
            reports: HashMap::new(),
        }
    }

    /// Records replica `replica`'s report number `seq`, received at `now`;
    /// it replaces that replica's previous one. Returns false (and keeps
    /// the newer one) for a report older than the one held: messages may
    /// arrive out of order across a reconnect.
    pub fn report(&mut self, replica: u64, seq: u64, now: Instant, loads: Vec<PeerLoad>) -> bool {
        let loads = loads
            .into_iter()
            .map(|l| PeerLoad {
                url: WorkerUrl::canonical(&l.url).into_owned(),
                ..l
            })
            .collect();
        match self.reports.get_mut(&replica) {
            Some(held) if held.seq >= seq => false,
            Some(held) => {
                *held = Report {
                    seq,
                    at: now,
                    loads,
                    expired: false,
                };
                true
            }
            None => {
                self.reports.insert(
                    replica,
                    Report {
                        seq,
                        at: now,
                        loads,
                        expired: false,
                    },
                );
                true
            }
        }
    }

    /// Drops the reports of replicas silent for longer than the expiry
    /// (their numbers are remembered a while, see [`REMEMBERED`]); returns
    /// how many were dropped.
    pub fn expire(&mut self, now: Instant) -> usize {
        let expiry = self.expiry;
        let mut dropped = 0;
        let mut remembered = 0;
        self.reports.retain(|_, r| {
            let age = now.saturating_duration_since(r.at);
            if !r.expired && age > expiry {
                r.expired = true;
                r.loads = Vec::new();
                dropped += 1;
            }
            let keep = !r.expired || age <= expiry + REMEMBERED;
            remembered += usize::from(keep && r.expired);
            keep
        });
        if remembered > MAX_REMEMBERED {
            self.reports.retain(|_, r| !r.expired);
        }
        dropped
    }

    /// When the next held report expires (its arrival plus the expiry);
    /// `None` while none is held: a receiver needs no timer then.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.reports
            .values()
            .filter(|r| !r.expired)
            .map(|r| r.at + self.expiry)
            .min()
    }

    /// Replicas whose report still counts.
    pub fn replicas(&self) -> usize {
        self.reports.values().filter(|r| !r.expired).count()
    }

    /// Writes the sums of the held reports into `workers` (0 for a worker
    /// no report names).
    pub fn apply(&self, workers: &[Arc<Worker>]) {
        // foldhash, not SipHash: the URLs are this router's own workers'
        // (a report keeps no other), nothing a peer could choose to collide.
        let mut sums: HashMap<&str, (usize, usize), foldhash::fast::RandomState> =
            HashMap::default();
        for load in self.reports.values().flat_map(|r| &r.loads) {
            let sum = sums.entry(load.url.as_str()).or_default();
            sum.0 = sum.0.saturating_add(load.in_flight as usize);
            sum.1 = sum
                .1
                .saturating_add(usize::try_from(load.pending_prefill).unwrap_or(usize::MAX));
        }
        for w in workers {
            let (in_flight, prefill) = sums.get(w.url()).copied().unwrap_or_default();
            w.set_peer_load(in_flight, prefill);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LoadGuard, WorkerId, WorkerSpec};

    fn workers() -> Vec<Arc<Worker>> {
        ["http://a:1", "http://b:1"]
            .iter()
            .enumerate()
            .map(|(i, u)| Arc::new(Worker::new(WorkerId(i as u32), WorkerSpec::new(*u))))
            .collect()
    }

    fn load(url: &str, in_flight: u32, prefill: u64) -> PeerLoad {
        PeerLoad {
            url: url.into(),
            in_flight,
            pending_prefill: prefill,
        }
    }

    #[test]
    fn reports_add_up_per_worker_and_join_own_load() {
        let ws = workers();
        let mut peers = PeerLoads::new(Duration::from_millis(300));
        let t0 = Instant::now();
        assert!(peers.report(1, 1, t0, vec![load("http://a:1/", 3, 100)]));
        assert!(peers.report(
            2,
            7,
            t0,
            vec![load("http://a:1", 2, 5), load("http://x:9", 9, 9)]
        ));
        peers.apply(&ws);
        let _own = LoadGuard::acquire(ws[0].clone());
        assert_eq!(
            (ws[0].load(), ws[0].peer_load(), ws[0].routing_load()),
            (1, 5, 6)
        );
        assert_eq!(ws[0].routing_pending_prefill(), 105);
        assert_eq!(ws[1].routing_load(), 0, "nobody reported b");
    }

    #[test]
    fn a_newer_report_replaces_an_older_one_never_the_reverse() {
        let ws = workers();
        let mut peers = PeerLoads::new(Duration::from_millis(300));
        let t0 = Instant::now();
        assert!(peers.report(1, 5, t0, vec![load("http://a:1", 4, 0)]));
        assert!(!peers.report(1, 4, t0, vec![load("http://a:1", 40, 0)]));
        assert!(peers.report(1, 6, t0, vec![load("http://b:1", 1, 0)]));
        peers.apply(&ws);
        assert_eq!((ws[0].peer_load(), ws[1].peer_load()), (0, 1));
    }

    #[test]
    fn a_silent_replica_stops_counting() {
        let ws = workers();
        let expiry = Duration::from_millis(300);
        let mut peers = PeerLoads::new(expiry);
        let t0 = Instant::now();
        peers.report(1, 1, t0, vec![load("http://a:1", 4, 0)]);
        peers.report(2, 1, t0 + expiry, vec![load("http://a:1", 1, 0)]);
        assert_eq!(
            peers.expire(t0 + expiry),
            0,
            "not older than the expiry yet"
        );
        assert_eq!(peers.expire(t0 + expiry + Duration::from_millis(1)), 1);
        peers.apply(&ws);
        assert_eq!(ws[0].peer_load(), 1);
        assert_eq!(peers.replicas(), 1);
        peers.expire(t0 + expiry * 3);
        peers.apply(&ws);
        assert_eq!(ws[0].routing_load(), 0);
    }

    /// A report overtaken by a newer one that has since expired (it rode
    /// on a late insert batch) is still refused: it would count stale.
    #[test]
    fn an_older_report_after_the_newer_one_expired_is_still_refused() {
        let ws = workers();
        let expiry = Duration::from_millis(300);
        let mut peers = PeerLoads::new(expiry);
        let t0 = Instant::now();
        assert!(peers.report(42, 5, t0, vec![load("http://a:1", 1, 0)]));
        let later = t0 + expiry + Duration::from_millis(1);
        assert_eq!(peers.expire(later), 1);
        assert_eq!((peers.replicas(), peers.next_expiry()), (0, None));
        assert!(!peers.report(42, 4, later, vec![load("http://a:1", 7, 0)]));
        peers.apply(&ws);
        assert_eq!(ws[0].peer_load(), 0);
        // A newer one counts, and a replica silent past the memory is
        // forgotten whole.
        assert!(peers.report(42, 6, later, vec![load("http://a:1", 2, 0)]));
        peers.apply(&ws);
        assert_eq!(ws[0].peer_load(), 2);
        let gone = later + expiry + REMEMBERED + Duration::from_millis(2);
        assert_eq!(peers.expire(gone), 1);
        assert!(peers.reports.is_empty());
    }

    /// Made-up replica ids cannot grow what is remembered past its bound.
    #[test]
    fn expired_reports_remembered_are_bounded() {
        let expiry = Duration::from_millis(300);
        let mut peers = PeerLoads::new(expiry);
        let t0 = Instant::now();
        for id in 0..(MAX_REMEMBERED as u64 + 1) {
            peers.report(id, 1, t0, Vec::new());
        }
        peers.expire(t0 + expiry * 2);
        assert!(peers.reports.is_empty());
    }
}
