//! An immutable snapshot of the worker set, with workers grouped by model.
//!
//! A [`WorkerSet`] never changes once built; the
//! [`Registry`](crate::Registry) builds a new one for every change and swaps
//! it in atomically, so a request sees one consistent set from start to end
//! without taking a lock. Live per-worker state (load, health atomics) is
//! shared with later snapshots through the `Arc<Worker>`s.
//!
//! Pools: every model named by some worker gets a pool of the workers naming
//! it plus the wildcard workers (those that name no model). Requests for a
//! model nobody names go to the wildcard pool, keyed [`WILDCARD_MODEL`], so a
//! client cannot create per-model state by inventing model names.
//!
//! Roles: the pools are built per [`WorkerRole`], so in a prefill/decode
//! disaggregated pool a request resolves its prefill and its decode pool
//! apart ([`WorkerSet::resolve_in`]); [`WorkerSet::resolve`] is the regular
//! workers' pool.

use crate::{RoutingError, Worker, WorkerId, WorkerRole, WorkerUrl};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Pool key of workers that serve any model.
pub const WILDCARD_MODEL: &str = "*";

/// The workers serving one model.
#[derive(Clone, Debug)]
pub struct Pool<'a> {
    /// The key to route with ([`RequestView::model`](crate::RequestView::model)).
    pub model: &'a str,
    /// Every worker of the pool, healthy or not, in id order; policies pick
    /// among the available ones.
    pub workers: &'a [Arc<Worker>],
}

/// One immutable version of the worker set.
#[derive(Debug, Default)]
pub struct WorkerSet {
    generation: u64,
    workers: Vec<Arc<Worker>>,
    /// The pools of each role, indexed by [`WorkerRole::index`].
    roles: [RolePools; 3],
}

/// The pools of the workers of one role.
#[derive(Debug, Default)]
struct RolePools {
    /// Whether the role has any worker.
    any: bool,
    pools: BTreeMap<String, Vec<Arc<Worker>>>,
    wildcard: Vec<Arc<Worker>>,
}

impl RolePools {
    fn build<'a>(workers: impl Iterator<Item = &'a Arc<Worker>>) -> Self {
        let workers: Vec<&Arc<Worker>> = workers.collect();
        let wildcard: Vec<Arc<Worker>> = workers
            .iter()
            .filter(|w| w.models().is_empty())
            .map(|w| Arc::clone(w))
            .collect();
        let mut pools: BTreeMap<String, Vec<Arc<Worker>>> = BTreeMap::new();
        for w in &workers {
            for m in w.models().iter() {
                pools.entry(m.clone()).or_default().push(Arc::clone(w));
            }
        }
        for pool in pools.values_mut() {
            pool.extend(wildcard.iter().cloned());
            pool.sort_by_key(|w| w.id());
            pool.dedup_by_key(|w| w.id());
        }
        Self {
            any: !workers.is_empty(),
            pools,
            wildcard,
        }
    }
}

impl WorkerSet {
    pub(crate) fn build(generation: u64, mut workers: Vec<Arc<Worker>>) -> Self {
        workers.sort_by_key(|w| w.id());
        let roles = WorkerRole::ALL
            .map(|role| RolePools::build(workers.iter().filter(|w| w.role() == role)));
        Self {
            generation,
            workers,
            roles,
        }
    }

    /// Increases by one with every published change.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// All workers, in id order.
    pub fn workers(&self) -> &[Arc<Worker>] {
        &self.workers
    }

    /// The worker with this id.
    pub fn get(&self, id: WorkerId) -> Option<&Arc<Worker>> {
        self.workers
            .binary_search_by_key(&id, |w| w.id())
            .ok()
            .map(|i| &self.workers[i])
    }

    /// The worker with this URL, compared in canonical form
    /// ([`WorkerUrl::canonical`]: a trailing `/` and case are ignored).
    pub fn by_url(&self, url: &str) -> Option<&Arc<Worker>> {
        let url = WorkerUrl::canonical(url);
        self.workers.iter().find(|w| w.url() == url.as_ref())
    }

    /// Models named by at least one worker of any role, sorted (for
    /// `/v1/models`).
    pub fn models(&self) -> impl Iterator<Item = &str> {
        let all: std::collections::BTreeSet<&str> = self
            .roles
            .iter()
            .flat_map(|r| r.pools.keys().map(String::as_str))
            .collect();
        all.into_iter()
    }

    /// Whether `key` is a pool key of `role`'s workers: a model one of
    /// them names, or [`WILDCARD_MODEL`] while one of them names none.
    pub fn has_pool(&self, role: WorkerRole, key: &str) -> bool {
        let pools = &self.roles[role.index()];
        match key {
            WILDCARD_MODEL => !pools.wildcard.is_empty(),
            model => pools.pools.contains_key(model),
        }
    }

    /// The pool of regular workers a request for `model` goes to (see
    /// [`resolve_in`](Self::resolve_in)).
    pub fn resolve(&self, model: Option<&str>) -> Result<Pool<'_>, RoutingError> {
        self.resolve_in(WorkerRole::Regular, model)
    }

    /// The pool of `role`'s workers a request for `model` goes to.
    ///
    /// - a named model → the workers naming it, plus the wildcard workers;
    /// - a model nobody names → the wildcard pool, or
    ///   [`RoutingError::UnknownModel`] if there are no wildcard workers;
    /// - no model → the only named model's pool, or the wildcard pool if no
    ///   worker names a model; several models → [`RoutingError::ModelRequired`].
    ///
    /// Health is not considered here: a pool whose workers are all down still
    /// resolves, and the policy answers [`RoutingError::NoHealthyWorker`].
    /// A role without workers answers [`RoutingError::NoWorkers`].
    pub fn resolve_in(
        &self,
        role: WorkerRole,
        model: Option<&str>,
    ) -> Result<Pool<'_>, RoutingError> {
        let pools = &self.roles[role.index()];
        if !pools.any {
            return Err(RoutingError::NoWorkers);
        }
        match model {
            Some(m) => {
                if let Some((key, workers)) = pools.pools.get_key_value(m) {
                    Ok(Pool {
                        model: key,
                        workers,
                    })
                } else if !pools.wildcard.is_empty() {
                    Ok(Self::wildcard_pool(pools))
                } else {
                    Err(RoutingError::UnknownModel {
                        model: m.to_owned(),
                    })
                }
            }
            None => match pools.pools.len() {
                0 => Ok(Self::wildcard_pool(pools)),
                1 => {
                    let (key, workers) = pools.pools.iter().next().expect("one pool");
                    Ok(Pool {
                        model: key,
                        workers,
                    })
                }
                _ => Err(RoutingError::ModelRequired {
                    available: pools.pools.keys().cloned().collect(),
                }),
            },
        }
    }

    fn wildcard_pool(pools: &RolePools) -> Pool<'_> {
        Pool {
            model: WILDCARD_MODEL,
            workers: &pools.wildcard,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WorkerSpec;

    fn set(specs: Vec<WorkerSpec>) -> WorkerSet {
        let workers = specs
            .into_iter()
            .enumerate()
            .map(|(i, s)| Arc::new(Worker::new(WorkerId(i as u32), s)))
            .collect();
        WorkerSet::build(1, workers)
    }

    fn ids(pool: &Pool<'_>) -> Vec<u32> {
        pool.workers.iter().map(|w| w.id().0).collect()
    }

    #[test]
    fn named_models_get_their_workers_plus_wildcards() {
        let s = set(vec![
            WorkerSpec::new("http://a:1").with_models(["llama"]),
            WorkerSpec::new("http://b:1").with_models(["qwen", "llama"]),
            WorkerSpec::new("http://c:1"),
        ]);
        assert_eq!(ids(&s.resolve(Some("llama")).unwrap()), vec![0, 1, 2]);
        assert_eq!(ids(&s.resolve(Some("qwen")).unwrap()), vec![1, 2]);
        let other = s.resolve(Some("made-up")).unwrap();
        assert_eq!(other.model, WILDCARD_MODEL);
        assert_eq!(ids(&other), vec![2]);
        assert!(matches!(
            s.resolve(None),
            Err(RoutingError::ModelRequired { .. })
        ));
        assert_eq!(s.models().collect::<Vec<_>>(), vec!["llama", "qwen"]);
    }

    #[test]
    fn unknown_model_without_wildcards_is_an_error() {
        let s = set(vec![WorkerSpec::new("http://a:1").with_models(["llama"])]);
        assert_eq!(
            s.resolve(Some("qwen")).unwrap_err(),
            RoutingError::UnknownModel {
                model: "qwen".into()
            }
        );
        assert_eq!(s.resolve(None).unwrap().model, "llama");
        assert_eq!(
            WorkerSet::default().resolve(None).unwrap_err(),
            RoutingError::NoWorkers
        );
    }

    #[test]
    fn roles_resolve_apart() {
        let s = set(vec![
            WorkerSpec::new("http://p1:1")
                .with_models(["llama"])
                .with_role(WorkerRole::Prefill),
            WorkerSpec::new("http://d1:1")
                .with_models(["llama"])
                .with_role(WorkerRole::Decode),
            WorkerSpec::new("http://d2:1").with_role(WorkerRole::Decode),
            WorkerSpec::new("http://p2:1")
                .with_models(["qwen"])
                .with_role(WorkerRole::Prefill),
        ]);
        let prefill = s.resolve_in(WorkerRole::Prefill, Some("llama")).unwrap();
        assert_eq!(ids(&prefill), vec![0]);
        let decode = s.resolve_in(WorkerRole::Decode, Some("llama")).unwrap();
        assert_eq!(ids(&decode), vec![1, 2]);
        // A model only the prefill pool names: decode's wildcard worker.
        let decode = s.resolve_in(WorkerRole::Decode, Some("qwen")).unwrap();
        assert_eq!((decode.model, ids(&decode)), (WILDCARD_MODEL, vec![2]));
        // No regular workers at all.
        assert_eq!(
            s.resolve(Some("llama")).unwrap_err(),
            RoutingError::NoWorkers
        );
        assert_eq!(s.models().collect::<Vec<_>>(), vec!["llama", "qwen"]);
    }
}
