//! What the health checkers last saw of each known worker, shared with the
//! request path so that a 503 can say *why* no worker is available, not
//! just that none is.
//!
//! The control task adds and forgets entries (it is the one that knows
//! which workers exist); each worker's health checker writes its own entry
//! after every probe. Requests only read it on the way to a 503, or ask a
//! checker to read its worker's models again ([`Board::reread_models`]),
//! so a plain mutex is enough.

use radixgate_routing::{WorkerSet, WorkerUrl};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::Notify;

/// The latest health sighting of every known worker.
#[derive(Clone, Debug, Default)]
pub(crate) struct Board {
    entries: Arc<Mutex<BTreeMap<WorkerUrl, Sighting>>>,
}

/// What one worker's health checker last saw.
#[derive(Clone, Debug, Default)]
struct Sighting {
    /// In the registry (its first probes passed).
    admitted: bool,
    /// Why its last probe failed; `None` after a passing one.
    problem: Option<String>,
    /// Wakes the checker to read the worker's models again.
    reread: Arc<Notify>,
}

/// At most this many workers are named in one message.
const NAMED: usize = 3;

impl Board {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<WorkerUrl, Sighting>) -> T) -> T {
        // A panic elsewhere while holding the lock leaves plain data behind;
        // the board stays usable.
        f(&mut self.entries.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A worker became known: pending until its probes pass. Its health
    /// checker waits on what this returns for [`Self::reread_models`].
    pub(crate) fn known(&self, url: &WorkerUrl) -> Arc<Notify> {
        let sighting = Sighting::default();
        let reread = sighting.reread.clone();
        self.with(|e| e.insert(url.clone(), sighting));
        reread
    }

    /// Asks the health checker of `url` to read its worker's models again
    /// soon (the worker answered that it does not serve a model it is
    /// listed with); nothing waits for it.
    pub(crate) fn reread_models(&self, url: &str) {
        self.with(|e| e.get(url).map(|s| s.reread.notify_one()));
    }

    /// A worker was removed.
    pub(crate) fn forget(&self, url: &str) {
        self.with(|e| e.remove(url));
    }

    /// A worker was admitted into the registry.
    pub(crate) fn admitted(&self, url: &WorkerUrl) {
        self.with(|e| {
            if let Some(s) = e.get_mut(url) {
                s.admitted = true;
            }
        });
    }

    /// A probe of `url` passed (`None`) or failed for `problem`.
    pub(crate) fn probed(&self, url: &WorkerUrl, problem: Option<&str>) {
        self.with(|e| {
            if let Some(s) = e.get_mut(url)
                && s.problem.as_deref() != problem
            {
                s.problem = problem.map(str::to_owned);
            }
        });
    }

    /// Whether every known worker is admitted or has failed a probe: none
    /// is still waiting for its first probes to pass.
    pub(crate) fn settled(&self) -> bool {
        self.with(|e| e.values().all(|s| s.admitted || s.problem.is_some()))
    }

    /// Whether no worker is known at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.with(|e| e.is_empty())
    }

    /// Workers known and not admitted yet (their first probes have not
    /// passed).
    pub(crate) fn pending(&self) -> usize {
        self.with(|e| e.values().filter(|s| !s.admitted).count())
    }

    /// Why the last probe of `url` failed, while it fails.
    pub(crate) fn problem(&self, url: &WorkerUrl) -> Option<String> {
        self.with(|e| e.get(url).and_then(|s| s.problem.clone()))
    }

    /// Why no worker for `model` (any model when `None`) can take a
    /// request, as the tail of a 503's message: an empty pool, workers
    /// still pending, unhealthy ones, and ones out of rotation for their
    /// circuit breaker or as outliers, naming a few with their last probe
    /// failure.
    pub(crate) fn explain(&self, admitted: &WorkerSet, model: Option<&str>) -> String {
        let sightings = self.with(|e| e.clone());
        if sightings.is_empty() {
            return "the pool is empty; add workers with `--worker-urls`, `workers:` in the \
                    config file, or the admin API's `POST /workers`"
                .to_owned();
        }
        let mut pending = Vec::new();
        let mut unhealthy = Vec::new();
        let mut out_of_rotation = Vec::new();
        for (url, sighting) in &sightings {
            let named = match &sighting.problem {
                Some(problem) => format!("{url} ({problem})"),
                None => url.to_string(),
            };
            if !sighting.admitted {
                pending.push(named);
                continue;
            }
            let Some(worker) = admitted.workers().iter().find(|w| w.url() == url.as_str()) else {
                continue;
            };
            if model.is_some_and(|m| !worker.serves(m)) {
                continue;
            }
            if !worker.is_healthy() {
                unhealthy.push(named);
            } else if !worker.is_available() {
                out_of_rotation.push(worker.url().to_owned());
            }
        }
        let mut parts = Vec::new();
        if !pending.is_empty() {
            parts.push(listed(&pending, "pending (never answered a health check)"));
        }
        if !unhealthy.is_empty() {
            parts.push(listed(&unhealthy, "unhealthy"));
        }
        if !out_of_rotation.is_empty() {
            parts.push(listed(
                &out_of_rotation,
                "out of rotation (circuit breaker open or ejected as an outlier)",
            ));
        }
        if parts.is_empty() {
            // Every known worker is admitted and well: the request raced a
            // change, or none serves the model.
            return "no known worker serves it".to_owned();
        }
        parts.join("; ")
    }
}

/// `2 workers unhealthy: a (why), b (why)`, naming at most [`NAMED`].
fn listed(names: &[String], state: &str) -> String {
    let noun = if names.len() == 1 {
        "worker"
    } else {
        "workers"
    };
    let mut line = format!("{} {noun} {state}: ", names.len());
    line.push_str(&names[..names.len().min(NAMED)].join(", "));
    if names.len() > NAMED {
        let _ = write!(line, " and {} more", names.len() - NAMED);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use radixgate_routing::policy::RoundRobin;
    use radixgate_routing::{Registry, WorkerSpec};

    fn registry() -> Registry {
        Registry::new(Arc::new(RoundRobin::new()))
    }

    fn url(text: &str) -> WorkerUrl {
        WorkerUrl::parse(text).unwrap()
    }

    #[test]
    fn an_empty_pool_says_how_to_add_workers() {
        let registry = registry();
        let why = Board::default().explain(&registry.snapshot(), None);
        assert!(why.starts_with("the pool is empty"), "{why}");
        assert!(why.contains("--worker-urls") && why.contains("POST /workers"));
    }

    #[test]
    fn pending_and_unhealthy_workers_are_named_with_their_last_problem() {
        let mut registry = registry();
        let board = Board::default();
        let (a, b) = (url("http://127.0.0.1:1"), url("http://127.0.0.1:2"));
        board.known(&a);
        board.known(&b);
        board.probed(&a, Some("connection refused"));
        let why = board.explain(&registry.snapshot(), None);
        assert_eq!(
            why,
            "2 workers pending (never answered a health check): \
             http://127.0.0.1:1 (connection refused), http://127.0.0.1:2"
        );

        let id = registry.add(WorkerSpec::new(b.as_str())).unwrap().id();
        board.admitted(&b);
        registry.set_health(id, false).unwrap();
        board.probed(&b, Some("health check answered 503"));
        let why = board.explain(&registry.snapshot(), None);
        assert_eq!(
            why,
            "1 worker pending (never answered a health check): \
             http://127.0.0.1:1 (connection refused); \
             1 worker unhealthy: http://127.0.0.1:2 (health check answered 503)"
        );

        board.probed(&a, None);
        board.forget(a.as_str());
        assert_eq!(
            board.explain(&registry.snapshot(), None),
            "1 worker unhealthy: http://127.0.0.1:2 (health check answered 503)"
        );
    }

    #[test]
    fn a_long_list_is_cut_after_three_names() {
        let board = Board::default();
        for port in 1..=5 {
            board.known(&url(&format!("http://127.0.0.1:{port}")));
        }
        let why = board.explain(&registry().snapshot(), None);
        assert!(why.starts_with("5 workers pending"), "{why}");
        assert!(why.ends_with("http://127.0.0.1:3 and 2 more"), "{why}");
    }

    #[test]
    fn workers_of_other_models_are_not_blamed() {
        let mut registry = registry();
        let board = Board::default();
        let (a, b) = (url("http://127.0.0.1:1"), url("http://127.0.0.1:2"));
        for (u, model) in [(&a, "llama"), (&b, "qwen")] {
            board.known(u);
            let id = registry
                .add(WorkerSpec::new(u.as_str()).with_models([model]))
                .unwrap()
                .id();
            board.admitted(u);
            registry.set_health(id, false).unwrap();
        }
        let why = board.explain(&registry.snapshot(), Some("llama"));
        assert_eq!(why, "1 worker unhealthy: http://127.0.0.1:1");
    }
}
