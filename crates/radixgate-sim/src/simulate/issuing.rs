//! The clients of a simulated run: when each asks the workload for its next
//! request, and when issuing stops.
//!
//! Shared by the co-located run ([`cluster`](super::cluster)) and the
//! prefill/decode run ([`pd_cluster`](super::pd_cluster)), so both see the
//! same requests at the same times for a seed. A closed loop has one issuer
//! per client, busy until its request completes; an open loop (Poisson or a
//! trace's timestamps) has one issuer that schedules the next arrival right
//! after each dispatch. Every change goes through the event queue, in the
//! same order whoever drives it, so runs stay deterministic.

use std::time::Duration;

use super::SimConfig;
use super::events::{Kind, Queue};
use crate::load::Arrivals;
use crate::workload::rng::{SplitMix64, key};
use crate::workload::{Poll, RequestSpec, Workload};

/// The load tool's arrival-stream key, so `simulate --rate R` and `load
/// --rate R` draw the same arrival times for a seed.
const ARRIVALS: u64 = 61;

#[derive(Clone, Copy, PartialEq, Eq)]
enum IssuerState {
    Scheduled,
    Busy,
    Awaiting,
    Retired,
}

/// A request the workload handed out, to dispatch now.
pub(super) struct Issued {
    /// The request.
    pub(super) spec: RequestSpec,
    /// The closed-loop client waiting on it (`None` in an open loop).
    pub(super) client: Option<usize>,
}

/// The issuers of one run and the arrival process's state.
pub(super) struct Issuers {
    states: Vec<IssuerState>,
    rng: SplitMix64,
    next_arrival: Duration,
    issued: u64,
    arrivals: Arrivals,
    max_requests: Option<u64>,
    duration: Option<Duration>,
}

impl Issuers {
    /// The issuers `cfg`'s arrival process needs.
    pub(super) fn new(cfg: &SimConfig) -> Self {
        let n = match cfg.arrivals {
            Arrivals::Closed { concurrency } => concurrency,
            Arrivals::Poisson { .. } | Arrivals::Timestamps => 1,
        };
        Self {
            states: vec![IssuerState::Scheduled; n],
            rng: SplitMix64::new(key(cfg.seed, &[ARRIVALS])),
            next_arrival: Duration::ZERO,
            issued: 0,
            arrivals: cfg.arrivals,
            max_requests: cfg.max_requests,
            duration: cfg.duration,
        }
    }

    /// Schedules every issuer's first turn (the first Poisson arrival is
    /// drawn here).
    pub(super) fn start(&mut self, queue: &mut Queue) {
        if let Arrivals::Poisson { rate } = self.arrivals {
            self.next_arrival = Duration::from_secs_f64(self.rng.exp(1.0 / rate));
        }
        for i in 0..self.states.len() {
            queue.push(self.next_arrival, Kind::Issue(i));
        }
    }

    fn stopped(&self, now: Duration) -> bool {
        self.max_requests.is_some_and(|m| self.issued >= m)
            || self.duration.is_some_and(|d| now >= d)
    }

    /// Issuer `i`'s turn at `now`: the request to dispatch, if the workload
    /// has one; otherwise the issuer is rescheduled, waits for a reply
    /// (when `in_flight` requests may bring one), or retires. After
    /// dispatching the request, call [`Self::dispatched`].
    pub(super) fn turn(
        &mut self,
        i: usize,
        now: Duration,
        workload: &mut dyn Workload,
        queue: &mut Queue,
        in_flight: bool,
    ) -> Option<Issued> {
        if self.stopped(now) {
            self.states[i] = IssuerState::Retired;
            return None;
        }
        // Busy while deciding; every arm below leaves it in its next state.
        self.states[i] = IssuerState::Busy;
        match workload.next(now) {
            Poll::Ready(spec) => {
                self.issued += 1;
                let closed = matches!(self.arrivals, Arrivals::Closed { .. });
                return Some(Issued {
                    spec,
                    client: closed.then_some(i),
                });
            }
            Poll::NotBefore(t) => {
                let at = if t > now {
                    t
                } else {
                    now + Duration::from_micros(1)
                };
                self.schedule(i, at, queue);
            }
            Poll::AwaitReply if in_flight => self.states[i] = IssuerState::Awaiting,
            // Nothing in flight can ever answer: the workload is stuck.
            Poll::AwaitReply | Poll::Done => self.states[i] = IssuerState::Retired,
        }
        None
    }

    /// Issuer `i`'s request was dispatched: an open loop schedules its next
    /// arrival; a closed-loop client stays busy until its request ends (or
    /// was already rescheduled, if the engine refused it).
    pub(super) fn dispatched(&mut self, i: usize, now: Duration, queue: &mut Queue) {
        match self.arrivals {
            Arrivals::Closed { .. } => {}
            Arrivals::Poisson { rate } => {
                self.next_arrival += Duration::from_secs_f64(self.rng.exp(1.0 / rate));
                self.schedule(i, self.next_arrival.max(now), queue);
            }
            Arrivals::Timestamps => self.schedule(i, now, queue),
        }
    }

    /// Issuer `i` takes its next turn at `at`.
    pub(super) fn schedule(&mut self, i: usize, at: Duration, queue: &mut Queue) {
        self.states[i] = IssuerState::Scheduled;
        queue.push(at, Kind::Issue(i));
    }

    /// After an outcome: the request's own client and every client waiting
    /// on a reply try again now.
    pub(super) fn wake(&mut self, client: Option<usize>, now: Duration, queue: &mut Queue) {
        if let Some(i) = client
            && self.states[i] == IssuerState::Busy
        {
            self.schedule(i, now, queue);
        }
        for i in 0..self.states.len() {
            if self.states[i] == IssuerState::Awaiting {
                self.schedule(i, now, queue);
            }
        }
    }
}
