//! The arrival processes: Poisson open loop, closed loop, trace timestamps.
//!
//! One [`Shared`] state is reached by every request task:
//! - the workload, behind a `std::sync::Mutex` held for one `next` /
//!   `on_reply` call and never across an `.await` (the calls are short and
//!   synchronous, so an async mutex would only add cost);
//! - a `Notify` woken after every outcome, for tasks waiting on
//!   [`Poll::AwaitReply`];
//! - a `watch` flag that stops issuing (duration reached, Ctrl-C);
//! - an atomic count of issued requests, for `--requests`.
//!
//! Outcomes go over a channel to one collector task that owns the
//! statistics and the progress line. Requests in flight when issuing stops
//! are waited for (each is bounded by the per-request timeout).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::assign::{Assign, Assigner};
use super::client::Client;
use super::outcome::Outcome;
use super::progress::{Progress, Snapshot};
use super::report::{LoadReport, ReportHeader, Stats};
use super::target::Target;
use crate::workload::rng::{SplitMix64, key};
use crate::workload::{Poll, RequestSpec, Workload};

const ARRIVALS: u64 = 61;

/// How requests are started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Open loop: Poisson arrivals at this many requests per second.
    Poisson {
        /// Requests per second.
        rate: f64,
    },
    /// Closed loop: this many clients, each sending its next request when
    /// its previous one finishes.
    Closed {
        /// Clients.
        concurrency: usize,
    },
    /// At the workload's own arrival times (trace replay).
    Timestamps,
}

impl Arrivals {
    /// In words, for the report.
    pub fn describe(&self) -> String {
        match self {
            Arrivals::Poisson { rate } => format!("poisson {rate} req/s"),
            Arrivals::Closed { concurrency } => format!("closed loop x{concurrency}"),
            Arrivals::Timestamps => "trace timestamps".into(),
        }
    }
}

/// When and how to run.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// The arrival process.
    pub arrivals: Arrivals,
    /// Stop issuing after this many requests.
    pub max_requests: Option<u64>,
    /// Stop issuing after this long.
    pub duration: Option<Duration>,
    /// Seed of the arrival process.
    pub seed: u64,
    /// Draw a progress line (if stderr is a terminal).
    pub progress: bool,
    /// Stop issuing on Ctrl-C (the CLI; not in tests).
    pub ctrl_c: bool,
    /// How requests are spread over the targets.
    pub assign: Assign,
}

struct Shared {
    workload: Mutex<Box<dyn Workload>>,
    notify: Notify,
    stop: watch::Receiver<bool>,
    issued: AtomicU64,
    max_requests: Option<u64>,
    start: Instant,
    client: Client,
    targets: Vec<Target>,
    assigner: Assigner,
    outcomes: mpsc::UnboundedSender<Outcome>,
}

impl Shared {
    fn reserve(&self) -> bool {
        if *self.stop.borrow() {
            return false;
        }
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        self.max_requests.is_none_or(|max| n < max)
    }

    fn poll(&self) -> Poll {
        let mut w = self.workload.lock().unwrap_or_else(|e| e.into_inner());
        w.next(self.start.elapsed())
    }

    /// The next request, waiting as the workload says; `None` when it is
    /// exhausted or issuing stopped.
    async fn obtain(&self) -> Option<RequestSpec> {
        let mut stop = self.stop.clone();
        loop {
            if *stop.borrow() {
                return None;
            }
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.poll() {
                Poll::Ready(spec) => return Some(spec),
                Poll::Done => return None,
                Poll::NotBefore(t) => tokio::select! {
                    _ = tokio::time::sleep_until(self.start + t) => {}
                    _ = stop.wait_for(|s| *s) => return None,
                },
                Poll::AwaitReply => tokio::select! {
                    _ = &mut notified => {}
                    // A safety net only: every outcome notifies.
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stop.wait_for(|s| *s) => return None,
                },
            }
        }
    }

    async fn execute(&self, spec: RequestSpec) {
        let index = self.assigner.pick(&spec);
        let mut out = self.client.send(index, &self.targets[index], &spec).await;
        {
            let mut w = self.workload.lock().unwrap_or_else(|e| e.into_inner());
            let now = self.start.elapsed();
            if out.error.is_some() {
                w.on_failure(spec.session, now);
            } else {
                w.on_reply(spec.session, &out.reply, now);
            }
        }
        self.notify.notify_waiters();
        out.reply = String::new();
        let _ = self.outcomes.send(out);
    }
}

async fn sleep_or_stop(until: Instant, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep_until(until) => true,
        _ = stop.wait_for(|s| *s) => false,
    }
}

/// Runs `workload` against `targets` and reports.
pub async fn drive(
    workload: Box<dyn Workload>,
    client: Client,
    targets: Vec<Target>,
    plan: RunPlan,
    header: ReportHeader,
) -> LoadReport {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (out_tx, mut out_rx) = mpsc::unbounded_channel();
    let start = Instant::now();
    let shared = Arc::new(Shared {
        workload: Mutex::new(workload),
        notify: Notify::new(),
        stop: stop_rx.clone(),
        issued: AtomicU64::new(0),
        max_requests: plan.max_requests,
        start,
        client,
        assigner: Assigner::new(plan.assign, targets.len()),
        targets,
        outcomes: out_tx,
    });
    let stop_tx = Arc::new(stop_tx);
    let mut timers = JoinSet::new();
    if let Some(d) = plan.duration {
        let tx = stop_tx.clone();
        timers.spawn(async move {
            tokio::time::sleep(d).await;
            let _ = tx.send(true);
        });
    }
    if plan.ctrl_c {
        let tx = stop_tx.clone();
        timers.spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                let _ = tx.send(true);
            }
        });
    }

    let expected = plan.max_requests;
    let duration = plan.duration;
    let mut progress = Progress::new(plan.progress);
    let collector = tokio::spawn(async move {
        let mut stats = Stats::default();
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                o = out_rx.recv() => match o {
                    Some(o) => stats.record(&o),
                    None => break,
                },
                _ = tick.tick() => {
                    let el = start.elapsed();
                    let frac = match (expected, duration) {
                        (Some(n), _) if n > 0 => stats.finished() as f64 / n as f64,
                        (_, Some(d)) => el.as_secs_f64() / d.as_secs_f64().max(1e-9),
                        _ => 0.0,
                    };
                    progress.draw(&Snapshot {
                        fraction: frac,
                        done: stats.finished(),
                        failed: stats.failed(),
                        hit_rate: stats.hit_rate(),
                        elapsed: el,
                    });
                }
            }
        }
        progress.finish();
        stats
    });

    let mut tasks = JoinSet::new();
    match plan.arrivals {
        Arrivals::Closed { concurrency } => {
            for _ in 0..concurrency.max(1) {
                let s = shared.clone();
                tasks.spawn(async move {
                    while s.reserve() {
                        let Some(spec) = s.obtain().await else { break };
                        s.execute(spec).await;
                    }
                });
            }
        }
        Arrivals::Poisson { .. } | Arrivals::Timestamps => {
            let mut rng = SplitMix64::new(key(plan.seed, &[ARRIVALS]));
            let mut stop = stop_rx.clone();
            let mut next_at = Duration::ZERO;
            loop {
                if let Arrivals::Poisson { rate } = plan.arrivals {
                    next_at += Duration::from_secs_f64(rng.exp(1.0 / rate));
                    if !sleep_or_stop(start + next_at, &mut stop).await {
                        break;
                    }
                }
                if !shared.reserve() {
                    break;
                }
                let Some(spec) = shared.obtain().await else {
                    break;
                };
                let s = shared.clone();
                tasks.spawn(async move { s.execute(spec).await });
                while tasks.try_join_next().is_some() {}
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    timers.abort_all();
    drop(shared);
    let stats = collector.await.unwrap_or_default();
    stats.report(header, elapsed)
}
