//! Whether every serving thread still runs its tasks, for `/liveness`.
//!
//! A serving thread is a single-threaded runtime of its own
//! (`crate::server`): one that blocks (a bug, a call that never returns)
//! stops every connection it holds while the others, and the main runtime
//! that serves the metrics port, go on answering. So `/liveness` asks them
//! all: each probe sends each serving thread a ping, a task spawned on its
//! runtime that clears the ping when it runs, and a thread that has left
//! one unanswered for [`STALL`] is reported (the probe answers 503, and the
//! orchestrator restarts the router). Nothing runs between probes: an idle
//! router is not woken for this, and a probe never waits for an answer
//! (the verdict comes from pings sent by earlier probes).
//!
//! A thread that has ended (shutdown) is no longer asked.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a serving thread may leave a ping unanswered before it is
/// reported: far above any task's turn on a busy runtime, and within the
/// three probes of ten seconds an orchestrator's default gives.
pub(crate) const STALL: Duration = Duration::from_secs(10);

/// The serving threads' runtimes and their unanswered pings.
#[derive(Debug)]
pub(crate) struct Pulse {
    threads: Mutex<Vec<Option<Thread>>>,
    stall: Duration,
}

#[derive(Debug)]
struct Thread {
    runtime: tokio::runtime::Handle,
    /// When the ping now unanswered was sent.
    ping: Arc<Mutex<Option<Instant>>>,
}

/// A serving thread that has left a ping unanswered for the stall time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Stalled {
    /// The thread's index (`radixgate-serve-N`).
    pub(crate) thread: usize,
    /// How long its ping has waited.
    pub(crate) for_secs: f64,
}

impl Pulse {
    /// No thread yet; `stall` is [`STALL`] but in tests.
    pub(crate) fn new(stall: Duration) -> Self {
        Self {
            threads: Mutex::new(Vec::new()),
            stall,
        }
    }

    /// Serving thread `index` runs on `runtime`.
    pub(crate) fn started(&self, index: usize, runtime: tokio::runtime::Handle) {
        let mut threads = self.threads.lock();
        if threads.len() <= index {
            threads.resize_with(index + 1, || None);
        }
        threads[index] = Some(Thread {
            runtime,
            ping: Arc::default(),
        });
    }

    /// Serving thread `index` has ended.
    pub(crate) fn ended(&self, index: usize) {
        if let Some(slot) = self.threads.lock().get_mut(index) {
            *slot = None;
        }
    }

    /// The threads that left a ping unanswered for the stall time; every
    /// other thread without a ping out is sent one.
    pub(crate) fn stalled(&self) -> Vec<Stalled> {
        let now = Instant::now();
        let threads = self.threads.lock();
        let mut stalled = Vec::new();
        for (index, thread) in threads.iter().enumerate() {
            let Some(thread) = thread else {
                continue;
            };
            let mut ping = thread.ping.lock();
            match *ping {
                Some(sent) => {
                    let waited = now.saturating_duration_since(sent);
                    if waited >= self.stall {
                        stalled.push(Stalled {
                            thread: index,
                            for_secs: waited.as_secs_f64(),
                        });
                    }
                }
                None => {
                    *ping = Some(now);
                    let answer = thread.ping.clone();
                    // Dropped unrun if the runtime is shutting down; the
                    // thread is then forgotten when it ends.
                    drop(thread.runtime.spawn(async move {
                        *answer.lock() = None;
                    }));
                }
            }
        }
        stalled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A serving thread's stand-in: a single-threaded runtime on a thread
    /// of its own, whose next task blocks it while `blocked` is set.
    fn serving_thread() -> (tokio::runtime::Handle, std::thread::JoinHandle<()>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        std::mem::forget(stop_tx);
        let thread = std::thread::spawn(move || {
            runtime.block_on(async {
                let _ = tokio::time::timeout(Duration::from_secs(5), stop_rx).await;
            });
        });
        (handle, thread)
    }

    #[test]
    fn a_thread_that_runs_its_tasks_answers_and_a_blocked_one_is_reported() {
        // Margins of 200 ms and more between what a thread has had time to
        // do and what is asked of it: test threads share a busy machine.
        let pulse = Pulse::new(Duration::from_millis(500));
        let (quick, _a) = serving_thread();
        let (blocked, _b) = serving_thread();
        pulse.started(0, quick);
        pulse.started(1, blocked.clone());
        let start = Instant::now();
        let at = |ms: u64| {
            let until = start + Duration::from_millis(ms);
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
        };
        // Thread 1 blocks for 2.5 s.
        blocked.spawn(async { std::thread::sleep(Duration::from_millis(2_500)) });
        at(50);
        assert!(pulse.stalled().is_empty(), "pings sent, none late yet");
        at(800);
        let stalled = pulse.stalled();
        assert_eq!(stalled.len(), 1, "{stalled:?}");
        assert_eq!(stalled[0].thread, 1);
        assert!(stalled[0].for_secs >= 0.5);
        // Unblocked, it answers; the next probe's pings too.
        at(2_800);
        assert!(pulse.stalled().is_empty());
        at(3_500);
        assert!(pulse.stalled().is_empty());
    }

    #[test]
    fn an_ended_thread_is_not_asked() {
        let pulse = Pulse::new(Duration::from_millis(50));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        pulse.started(3, runtime.handle().clone());
        drop(runtime);
        assert!(pulse.stalled().is_empty());
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(pulse.stalled().len(), 1, "a runtime gone without ended()");
        pulse.ended(3);
        assert!(pulse.stalled().is_empty());
    }
}
