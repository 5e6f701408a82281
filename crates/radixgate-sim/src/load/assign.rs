//! Client-side assignment of requests to `--url`s.
//!
//! `by-group` and `by-session` give each new key the next target in turn
//! (first come, round-robin) and keep it there: with G groups over N
//! targets every target owns G/N groups (±1), and the most popular groups
//! (seen first under skew) are spread across targets. That is a perfect
//! partition: a group's prefix is only ever prefilled on one worker.
//! `client-hash` keeps a session on one target too, but picks it by a hash
//! of the session, with no memory: what a load balancer hashing its
//! clients does, uneven by chance.
//!
//! Concurrency: one `Mutex` around the key map, held for one lookup; a
//! plain mutex because the critical section is a hash-map probe and never
//! awaits.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::workload::RequestSpec;
use crate::workload::rng::key;

/// Seed of the client hash (fixed: the same session picks the same
/// target in every run).
const CLIENT_HASH: u64 = 0x636c_6965_6e74;

/// How requests are spread over several `--url`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Assign {
    /// Each request to the next target.
    RoundRobin,
    /// Every request of a session to one target.
    BySession,
    /// Every request of a prefix group to one target.
    ByGroup,
    /// Every request of a session to the target a hash of the session
    /// picks (stateless, like a load balancer hashing its clients).
    ClientHash,
}

impl Assign {
    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            Assign::RoundRobin => "round-robin",
            Assign::BySession => "by-session",
            Assign::ByGroup => "by-group",
            Assign::ClientHash => "client-hash",
        }
    }
}

/// Picks a target per request.
#[derive(Debug)]
pub struct Assigner {
    mode: Assign,
    targets: u64,
    counter: AtomicU64,
    owners: Mutex<HashMap<u64, u64>>,
}

impl Assigner {
    /// An assigner over `targets` (≥ 1) targets.
    pub fn new(mode: Assign, targets: usize) -> Self {
        Self {
            mode,
            targets: targets.max(1) as u64,
            counter: AtomicU64::new(0),
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// The target index for `spec`.
    pub fn pick(&self, spec: &RequestSpec) -> usize {
        let key = match self.mode {
            Assign::RoundRobin => {
                return (self.counter.fetch_add(1, Ordering::Relaxed) % self.targets) as usize;
            }
            Assign::BySession => spec.session,
            Assign::ByGroup => spec.group,
            Assign::ClientHash => {
                return (key(CLIENT_HASH, &[spec.session]) % self.targets) as usize;
            }
        };
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        let next = &self.counter;
        let t = *owners
            .entry(key)
            .or_insert_with(|| next.fetch_add(1, Ordering::Relaxed) % self.targets);
        t as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Prompt;

    fn spec(session: u64, group: u64) -> RequestSpec {
        RequestSpec {
            seq: 0,
            session,
            group,
            arrival: None,
            prompt: Prompt::Text(String::new()),
            max_tokens: 1,
            wants_reply: false,
        }
    }

    #[test]
    fn modes() {
        let rr = Assigner::new(Assign::RoundRobin, 3);
        let got: Vec<usize> = (0..6).map(|_| rr.pick(&spec(0, 0))).collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2]);
        let g = Assigner::new(Assign::ByGroup, 4);
        let first: Vec<usize> = (0..8).map(|k| g.pick(&spec(k, 100 + k))).collect();
        assert_eq!(first, [0, 1, 2, 3, 0, 1, 2, 3], "balanced partition");
        for k in 0..8 {
            assert_eq!(g.pick(&spec(99, 100 + k)), first[k as usize], "sticky");
        }
        let s = Assigner::new(Assign::BySession, 2);
        assert_eq!(s.pick(&spec(5, 1)), s.pick(&spec(5, 2)));
        // Client hash: sticky per session, independent of arrival order
        // and of other assigners, and every target gets some sessions.
        let h = Assigner::new(Assign::ClientHash, 3);
        let again = Assigner::new(Assign::ClientHash, 3);
        let picks: Vec<usize> = (0..60).map(|k| h.pick(&spec(k, 0))).collect();
        for k in (0..60).rev() {
            assert_eq!(again.pick(&spec(k, 7)), picks[k as usize], "session {k}");
        }
        for t in 0..3 {
            let n = picks.iter().filter(|&&p| p == t).count();
            assert!((5..=35).contains(&n), "target {t}: {n} of 60");
        }
    }
}
