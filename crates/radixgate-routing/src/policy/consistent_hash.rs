//! consistent_hash: sticky sessions on a routing key, with bounded load.
//!
//! Every worker owns `virtual_nodes` points on a 64-bit hash ring, placed by
//! hashing its URL, so a worker keeps its points across a remove and re-add
//! and a pool change moves only the keys of the worker that came or went
//! (about 1/N of them). A key goes to the first available worker of the pool
//! clockwise from the key's hash (passing an unavailable owner, or one a
//! retry excluded, is an overflow, as the decision says), unless that worker already has at least
//! `ceil(load_factor * (total_in_flight + 1) / available)` requests in
//! flight, in which case the walk continues to the next worker under that
//! bound ("consistent hashing with bounded loads"). With `load_factor >= 1`
//! some worker is always under the bound, so the walk ends.
//!
//! The ring is an immutable sorted vector behind an `ArcSwap`: the request
//! path reads it without locks; the registry (one writer) replaces it on
//! add/remove. Requests without a key go to the least-loaded worker.

use super::{Branch, Candidate, Decision, Loads, Policy};
use crate::mix::hash_bytes;
use crate::{RequestView, RoutingError, Worker, WorkerId};
use arc_swap::ArcSwap;
use smallvec::SmallVec;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The consistent-hash policy.
#[derive(Debug)]
pub struct ConsistentHash {
    virtual_nodes: usize,
    load_factor: f64,
    /// `(point, owner)`, sorted by point.
    ring: ArcSwap<Vec<(u64, WorkerId)>>,
    turn: AtomicUsize,
}

impl ConsistentHash {
    /// A ring with `virtual_nodes` points per worker and the given load bound
    /// factor (validated by the config: `virtual_nodes >= 1`,
    /// `load_factor >= 1`).
    pub fn new(virtual_nodes: usize, load_factor: f64) -> Self {
        Self {
            virtual_nodes: virtual_nodes.max(1),
            load_factor: load_factor.max(1.0),
            ring: ArcSwap::from_pointee(Vec::new()),
            turn: AtomicUsize::new(0),
        }
    }

    fn points(&self, worker: &Worker) -> impl Iterator<Item = (u64, WorkerId)> + '_ {
        let url = worker.url().to_owned();
        let id = worker.id();
        (0..self.virtual_nodes).map(move |v| (hash_bytes(format!("{url}#{v}").as_bytes()), id))
    }
}

impl Policy for ConsistentHash {
    fn name(&self) -> &'static str {
        "consistent_hash"
    }

    fn stagger(&self, start: usize) {
        self.turn.store(start, Ordering::Relaxed);
    }

    fn select(
        &self,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError> {
        let loads = Loads::read(req, workers)?;
        let least = |branch| {
            let idx = loads.least_loaded(self.turn.fetch_add(1, Ordering::Relaxed));
            let w = &workers[idx];
            Ok(Decision::new(w, loads.explain(self.name(), branch, w, idx)))
        };
        let Some(key) = req.routing_key else {
            return least(Branch::NoRoutingKey);
        };
        // Available workers of this pool by id, for lookups during the walk.
        let mut by_id: Vec<(WorkerId, Candidate)> = loads
            .candidates
            .iter()
            .map(|&c| (workers[c.idx].id(), c))
            .collect();
        by_id.sort_unstable_by_key(|&(id, _)| id);
        let n = by_id.len() as f64;
        let capacity = (self.load_factor * (loads.sum as f64 + 1.0) / n).ceil() as usize;

        // This pool's unavailable workers: still the owners of their keys,
        // which the walk passes on (an overflow, as over the bound).
        // Another pool's workers on the ring own none of this pool's keys.
        let unavailable: SmallVec<[WorkerId; 4]> = if by_id.len() < workers.len() {
            (workers.iter().enumerate())
                .filter(|&(idx, _)| loads.load_of(idx).is_none())
                .map(|(_, w)| w.id())
                .collect()
        } else {
            SmallVec::new()
        };

        let ring = self.ring.load();
        let start = ring.partition_point(|p| p.0 < hash_bytes(key.as_bytes()));
        let mut first_owner = true;
        for step in 0..ring.len() {
            let (_, id) = ring[(start + step) % ring.len()];
            let Ok(k) = by_id.binary_search_by_key(&id, |&(id, _)| id) else {
                // A retry's excluded workers are this pool's too, left out
                // of `workers`.
                if unavailable.contains(&id) || req.excluded.contains(&id) {
                    first_owner = false;
                }
                continue;
            };
            let Candidate { idx, load } = by_id[k].1;
            if load < capacity {
                let branch = if first_owner {
                    Branch::HashRing
                } else {
                    Branch::HashRingOverflow
                };
                let w = &workers[idx];
                return Ok(Decision::new(w, loads.explain(self.name(), branch, w, idx)));
            }
            first_owner = false;
        }
        // No available worker of this pool is on the ring (the policy was not
        // told about it): still answer, by shortest queue.
        least(Branch::HashRingOverflow)
    }

    fn on_worker_added(&self, worker: &Arc<Worker>) {
        let points: Vec<(u64, WorkerId)> = self.points(worker).collect();
        self.ring.rcu(|ring| {
            let mut next = Vec::with_capacity(ring.len() + points.len());
            next.extend(ring.iter().filter(|p| p.1 != worker.id()));
            next.extend(points.iter().copied());
            next.sort_unstable();
            next
        });
    }

    fn on_worker_removed(&self, worker: &Worker) {
        self.ring.rcu(|ring| {
            ring.iter()
                .filter(|p| p.1 != worker.id())
                .copied()
                .collect::<Vec<_>>()
        });
    }
}
