//! The engine task: drives one worker's [`Engine`] in real time.
//!
//! Role: the only owner of the engine. Request handlers send commands
//! (submit, cancel, flush) over an unbounded channel; the task runs a step,
//! sleeps for the step's simulated duration (commands arriving meanwhile
//! join the next step, as requests arriving during a GPU forward pass do),
//! then delivers the step's results to each request's own channel and
//! publishes a load snapshot.
//!
//! The `slowdown` fault knob is read at the start of every step and applied
//! as the engine's speed (`configured speed / slowdown`), so steps started
//! after it changes take that many times longer, and the engine's busy-time
//! counter shows the slowed time.
//!
//! KV events: with a publisher configured, the engine logs its cache's
//! changes and this task hands them over as one batch per step (and one
//! after a flush), when the step's results become visible, through the
//! publisher's non-blocking sink.
//!
//! Invariants: each live request has exactly one subscriber entry, removed
//! when it finishes or is cancelled; a request whose handler has gone away
//! (client disconnect) is cancelled in the engine, so its pages are freed.
//!
//! Concurrency: the snapshot is a `parking_lot::Mutex` written once per step
//! by this task and read by `/get_load` and `/metrics`: tiny critical
//! sections, never held across `.await`.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::faults::SlowdownCell;
use super::kv_events::EventSink;
use crate::engine::{Engine, EngineCounters, EngineRequest, Finished, LoadSnapshot, ReqId};
use crate::error::SimError;

/// The largest lag behind the simulated clock that back-to-back steps make
/// up for by starting early.
const MAX_CATCH_UP: std::time::Duration = std::time::Duration::from_millis(20);

/// A command to the engine task.
pub(crate) enum Cmd {
    /// Queue a request; results go to `events`. `stream` asks for one event
    /// per produced token, otherwise only the final one is sent.
    Submit {
        req: EngineRequest,
        stream: bool,
        /// The prompt's KV came from a prefill worker
        /// ([`Engine::submit_transferred`]).
        transferred: bool,
        events: mpsc::UnboundedSender<Event>,
    },
    /// The client went away.
    Cancel(ReqId),
    /// Evict all unpinned cache; answers the number of blocks evicted.
    Flush(oneshot::Sender<usize>),
}

/// What a request hears from the engine.
#[derive(Debug)]
pub(crate) enum Event {
    /// Admitted to the batch with this many cached prompt tokens
    /// (streaming requests only).
    Admitted(usize),
    /// `n` output tokens exist so far (streaming requests only).
    Tokens(usize),
    /// The request is complete.
    Done(Finished),
    /// The engine refused it (e.g. larger than the whole cache).
    Rejected(SimError),
}

/// The latest engine view, for reports.
#[derive(Debug, Clone, Default)]
pub(crate) struct EngineStats {
    pub(crate) load: LoadSnapshot,
    pub(crate) counters: EngineCounters,
}

/// A handle to the engine task.
#[derive(Clone)]
pub(crate) struct EngineHandle {
    tx: mpsc::UnboundedSender<Cmd>,
    stats: Arc<Mutex<EngineStats>>,
}

impl EngineHandle {
    /// Starts the task for `engine`, slowed by `slowdown`; it stops when
    /// `shutdown` fires or all handles are dropped.
    /// With `events`, the engine's cache changes are published through it.
    pub(crate) fn spawn(
        mut engine: Engine,
        slowdown: SlowdownCell,
        events: Option<EventSink>,
        shutdown: CancellationToken,
    ) -> Self {
        engine.record_cache_events(events.is_some());
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(Mutex::new(EngineStats {
            load: engine.load(),
            counters: engine.counters().clone(),
        }));
        tokio::spawn(drive(engine, rx, stats.clone(), slowdown, events, shutdown));
        Self { tx, stats }
    }

    /// Sends a command; fails only when the task has stopped.
    pub(crate) fn send(&self, cmd: Cmd) -> Result<(), SimError> {
        self.tx.send(cmd).map_err(|_| SimError::EngineGone)
    }

    /// The latest snapshot.
    pub(crate) fn stats(&self) -> EngineStats {
        self.stats.lock().clone()
    }
}

struct Subscriber {
    stream: bool,
    events: mpsc::UnboundedSender<Event>,
}

/// The speed the engine was configured with and the slowdown applied to it.
struct Speed {
    configured: f64,
    slowdown: f64,
}

impl Speed {
    /// Applies the knob's current value if it changed since the last step.
    fn follow(&mut self, engine: &mut Engine, cell: &SlowdownCell) {
        let slowdown = cell.get();
        if slowdown == self.slowdown {
            return;
        }
        match engine.set_speed(self.configured / slowdown) {
            Ok(()) => self.slowdown = slowdown,
            // Only a configured speed near zero can get here; keep stepping
            // at the last good speed.
            Err(e) => tracing::warn!(slowdown, error = %e, "slowdown not applied"),
        }
    }
}

async fn drive(
    mut engine: Engine,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    stats: Arc<Mutex<EngineStats>>,
    slowdown: SlowdownCell,
    mut events: Option<EventSink>,
    shutdown: CancellationToken,
) {
    // Hands the cache's logged changes to the publisher as one batch.
    let mut emit = |engine: &mut Engine| {
        if let Some(sink) = events.as_mut() {
            sink.send(engine.take_cache_events());
        }
    };
    let start = Instant::now();
    let mut speed = Speed {
        configured: engine.config().timing.speed,
        slowdown: 1.0,
    };
    let mut subs: HashMap<ReqId, Subscriber> = HashMap::new();
    // When the last step ended on the simulated clock. Back-to-back steps
    // are scheduled from it, not from when the timer actually fired, so
    // timer rounding (tokio's is 1 ms) does not add up over a busy period.
    let mut last_end: Option<Instant> = None;
    loop {
        // Idle: wait for work instead of spinning.
        if engine.is_idle() {
            let cmd = tokio::select! {
                cmd = rx.recv() => cmd,
                () = shutdown.cancelled() => None,
            };
            let Some(cmd) = cmd else { return };
            apply(&mut engine, &mut subs, cmd, start);
            last_end = None;
        }
        while let Ok(cmd) = rx.try_recv() {
            apply(&mut engine, &mut subs, cmd, start);
        }
        // A flush's evictions are a batch of their own, before the step's.
        emit(&mut engine);
        let now = Instant::now();
        let begin = match last_end {
            // Catch up only small lags; after a stall, restart from now.
            Some(t) if now.duration_since(t) < MAX_CATCH_UP => t,
            _ => now,
        };
        speed.follow(&mut engine, &slowdown);
        let out = engine.step(begin.duration_since(start));
        if out.is_idle() {
            emit(&mut engine);
            publish(&engine, &stats);
            if !engine.is_idle() {
                // Work exists but none can run (cannot happen with a valid
                // engine; never spin): wait for the next command.
                let cmd = tokio::select! {
                    cmd = rx.recv() => cmd,
                    () = shutdown.cancelled() => None,
                };
                let Some(cmd) = cmd else { return };
                apply(&mut engine, &mut subs, cmd, start);
            }
            last_end = None;
            continue;
        }
        let end = begin + out.duration;
        last_end = Some(end);
        tokio::select! {
            () = tokio::time::sleep_until(end) => {}
            () = shutdown.cancelled() => return,
        }
        // Publish before delivering, so a client that has seen this step's
        // tokens also sees its load (and a subscriber its cache events).
        emit(&mut engine);
        publish(&engine, &stats);
        let mut gone = Vec::new();
        for (id, cached) in out.admitted {
            if let Some(s) = subs.get(&id)
                && s.stream
                && s.events.send(Event::Admitted(cached)).is_err()
            {
                gone.push(id);
            }
        }
        for (id, n) in out.progressed {
            if let Some(s) = subs.get(&id)
                && s.stream
                && s.events.send(Event::Tokens(n)).is_err()
            {
                gone.push(id);
            }
        }
        for f in out.finished {
            if let Some(s) = subs.remove(&f.id) {
                let _ = s.events.send(Event::Done(f));
            }
        }
        for id in gone {
            if subs.remove(&id).is_some() {
                engine.cancel(id);
            }
        }
        publish(&engine, &stats);
    }
}

fn apply(engine: &mut Engine, subs: &mut HashMap<ReqId, Subscriber>, cmd: Cmd, start: Instant) {
    match cmd {
        Cmd::Submit {
            req,
            stream,
            transferred,
            events,
        } => {
            let id = req.id;
            let submitted = if transferred {
                engine.submit_transferred(req, start.elapsed())
            } else {
                engine.submit(req, start.elapsed())
            };
            match submitted {
                Ok(()) => {
                    subs.insert(id, Subscriber { stream, events });
                }
                Err(e) => {
                    let _ = events.send(Event::Rejected(e));
                }
            }
        }
        Cmd::Cancel(id) => {
            if subs.remove(&id).is_some() {
                engine.cancel(id);
            }
        }
        Cmd::Flush(reply) => {
            let _ = reply.send(engine.flush_cache());
        }
    }
}

fn publish(engine: &Engine, stats: &Mutex<EngineStats>) {
    let snapshot = EngineStats {
        load: engine.load(),
        counters: engine.counters().clone(),
    };
    *stats.lock() = snapshot;
}
