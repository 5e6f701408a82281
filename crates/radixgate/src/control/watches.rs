//! What each discovery watch last told of the Kubernetes API server,
//! shared with the answers that explain a pool with no worker to take a
//! request: a 503's message and `/readiness`.
//!
//! A router whose API server refuses it (no RBAC to list pods, the wrong
//! namespace) or answers nothing has no worker, and without this said
//! "the pool is empty; add workers with `--worker-urls` ...": the cause
//! was in a WARN line alone. Now it says which watch fails and why, and
//! one whose selector matches no serving pod says so.
//!
//! Each pool's watch writes its own entry; requests only read it on the
//! way to a 503, and probes on `/readiness`, so a plain mutex is enough.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Every discovery watch's last word, by selector.
#[derive(Clone, Debug, Default)]
pub(crate) struct Watches {
    entries: Arc<Mutex<BTreeMap<String, Watch>>>,
}

/// One watch as far as an operator cares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Watch {
    /// The namespace watched; `None`: all of them.
    pub(crate) namespace: Option<String>,
    /// The API server answers it (a list completed, a watch accepted).
    pub(crate) connected: bool,
    /// Why its last try failed, until one succeeds.
    pub(crate) problem: Option<String>,
}

impl Watch {
    /// `discovery of pods `app=sglang` in namespace llm`.
    fn named(&self, selector: &str) -> String {
        match &self.namespace {
            Some(ns) => format!("discovery of pods `{selector}` in namespace {ns}"),
            None => format!("discovery of pods `{selector}` in all namespaces"),
        }
    }
}

impl Watches {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<String, Watch>) -> T) -> T {
        // Plain data: a panic elsewhere while holding it leaves it usable.
        f(&mut self.entries.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A watch of `selector` starts: not connected yet.
    #[cfg(feature = "kubernetes")]
    pub(crate) fn started(&self, selector: &str, namespace: Option<&str>) {
        let watch = Watch {
            namespace: namespace.map(str::to_owned),
            ..Watch::default()
        };
        self.with(|e| e.insert(selector.to_owned(), watch));
    }

    /// The API server answers the watch of `selector`.
    #[cfg(feature = "kubernetes")]
    pub(crate) fn answers(&self, selector: &str) {
        self.with(|e| {
            if let Some(w) = e.get_mut(selector) {
                w.connected = true;
                w.problem = None;
            }
        });
    }

    /// The watch of `selector` failed for `problem`; it retries.
    #[cfg(feature = "kubernetes")]
    pub(crate) fn failed(&self, selector: &str, problem: String) {
        self.with(|e| {
            if let Some(w) = e.get_mut(selector) {
                w.connected = false;
                w.problem = Some(problem);
            }
        });
    }

    /// Every watch, by selector (none without discovery).
    pub(crate) fn all(&self) -> BTreeMap<String, Watch> {
        self.with(|e| e.clone())
    }

    /// Why discovery gave no worker, for a pool with none: each watch
    /// that fails and why, one not answered yet, or that the pods it
    /// watches include none serving. `None` without discovery.
    pub(crate) fn explain_empty(&self) -> Option<String> {
        self.explain(true)
    }

    /// The watches failing now and why, to add to what else explains a
    /// 503 (`None` while none fails).
    pub(crate) fn explain_failing(&self) -> Option<String> {
        self.explain(false)
    }

    /// Each failing watch and why, and with `every` the others too: where
    /// they stand. `None` where that names none.
    fn explain(&self, every: bool) -> Option<String> {
        let parts: Vec<String> = self
            .all()
            .iter()
            .filter_map(|(selector, w)| {
                let named = w.named(selector);
                match (&w.problem, w.connected) {
                    (Some(problem), _) => Some(format!("{named} fails: {problem}")),
                    _ if !every => None,
                    (None, false) => Some(format!("{named} has not listed them yet")),
                    (None, true) => Some(format!("{named} has found none serving")),
                }
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

#[cfg(all(test, feature = "kubernetes"))]
mod tests {
    use super::*;

    #[test]
    fn each_watch_says_where_it_stands() {
        let watches = Watches::default();
        assert_eq!(watches.explain_empty(), None);
        watches.started("app=a", Some("llm"));
        watches.started("app=b", None);
        let why = watches.explain_empty().unwrap();
        assert!(
            why.contains("discovery of pods `app=a` in namespace llm has not listed")
                && why.contains("`app=b` in all namespaces has not listed"),
            "{why}"
        );
        assert_eq!(watches.explain_failing(), None);
        watches.failed("app=a", "403 Forbidden".into());
        watches.answers("app=b");
        let why = watches.explain_empty().unwrap();
        assert!(
            why.contains("`app=a` in namespace llm fails: 403 Forbidden")
                && why.contains("`app=b` in all namespaces has found none serving"),
            "{why}"
        );
        assert!(!watches.explain_failing().unwrap().contains("app=b"));
        watches.answers("app=a");
        assert_eq!(watches.all()["app=a"].problem, None);
        assert!(watches.all()["app=a"].connected);
    }
}
