//! Response affinity: the Responses API's stored responses live in the
//! memory of the worker that made them (vLLM, SGLang), so every request
//! that names one must reach that worker.
//!
//! - **learning**: a successful `POST /v1/responses` answer's id (a whole
//!   answer's top-level `"id"`, a stream's `response.id`, found by
//!   [`scan::IdScan`] as the bytes pass) is kept here with the worker that
//!   made it ([`Makers`]);
//! - **follow-ups**: a `POST /v1/responses` naming a known
//!   `previous_response_id` goes to its maker while that worker is in the
//!   request's pool and available; while it is in the pool but out of
//!   rotation, the request gets 503 naming it ([`Unpinned`]); once it left
//!   the pool, the request is routed as any other (each counted:
//!   `radixgate_response_affinity_total`);
//! - **by id**: `GET`/`DELETE /v1/responses/{id}`,
//!   `POST /v1/responses/{id}/cancel` and
//!   `GET /v1/responses/{id}/input_items` go to the maker; an id not known
//!   here (made before a restart, through another replica, or forgotten)
//!   is asked of the available workers in turn, least loaded first, until
//!   one answers other than 404 (at most the pool's size of attempts, each
//!   with the usual timeouts); if every one answers 404, the client gets
//!   the gateway's own OpenAI-style 404;
//! - **unknown follow-ups**: a `previous_response_id` not known here is
//!   asked of the workers of the request's pool the same way (an engine
//!   checks the id before any prefill), the last one's answer passed on
//!   whatever it is;
//! - **learning by asking**: the worker found holding an unknown id is
//!   kept as its maker; a deleted response's id is forgotten;
//! - **charged once**: each id keeps the tokens a tenant was charged for
//!   its response so far, so reading it again charges only usage past
//!   them ([`charged`]);
//! - **the maker failing**: a request sent to its maker is not retried on
//!   another worker, which does not hold the response: the maker's failure
//!   (its 429 or 503 with `Retry-After`, a 5xx, a timeout) is the answer.
//!
//! The map is bounded by `responses.max_ids` entries, least recently used
//! out, and each entry is forgotten `responses.max_age_secs` after its
//! last use. One `parking_lot` mutex: every operation is a few map steps,
//! never held across an `.await`; only Responses requests take it.

pub(crate) mod charged;
pub(crate) mod scan;

use crate::config::ResponsesConfig;
use crate::error::GatewayError;
use crate::metrics::{Describe, LabelledCounters, Metrics};
use hashbrown::HashMap;
use parking_lot::Mutex;
use radixgate_routing::{Branch, Decision, Explanation, Router, Worker, WorkerId, WorkerRole};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

pub(crate) const AFFINITY: Describe = Describe::new(
    "radixgate_response_affinity_total",
    "Requests naming a stored Responses API response (previous_response_id, or its id in the path), by outcome: maker (sent to the worker that made it), maker_unavailable (that worker left the pool, routed without affinity; or is out of rotation, answered 503) or unknown (an id this gateway did not see made).",
);

/// The worker that made a response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Maker {
    /// Its URL.
    pub(crate) url: Arc<str>,
    /// The pool's model the response was made in (`None`: the wildcard
    /// pool), the metrics label of the requests about it.
    pub(crate) model: Option<Arc<str>>,
}

/// What a request asks of a stored response (see the module doc).
#[derive(Clone, Debug, Default)]
pub(crate) enum Affinity {
    /// Nothing.
    #[default]
    None,
    /// A follow-up naming the response `id` (`previous_response_id`).
    Previous {
        /// The previous response's id.
        id: String,
        /// Its maker, if known.
        maker: Option<Maker>,
    },
    /// A request about the response `id` (in its path); its maker, if
    /// known.
    ById {
        /// The response's id.
        id: String,
        /// Its maker, if known.
        maker: Option<Maker>,
    },
}

impl Affinity {
    /// The maker, if known.
    pub(crate) fn maker(&self) -> Option<&Maker> {
        match self {
            Affinity::None => None,
            Affinity::Previous { maker, .. } | Affinity::ById { maker, .. } => maker.as_ref(),
        }
    }
}

/// The ids of responses made through this gateway, with their makers.
#[derive(Debug)]
pub(crate) struct Makers {
    kept: Mutex<Kept>,
    max_ids: usize,
    max_age: Duration,
    outcomes: LabelledCounters,
}

#[derive(Debug, Default)]
struct Kept {
    by_id: HashMap<Box<str>, Entry>,
    /// Ids by their last use, oldest first.
    by_use: BTreeMap<u64, Box<str>>,
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    maker: Maker,
    stamp: u64,
    used: Instant,
    /// The tokens charged for the response so far ([`charged`]).
    charged: u64,
}

impl Kept {
    fn remove(&mut self, id: &str) -> Option<Entry> {
        let entry = self.by_id.remove(id)?;
        self.by_use.remove(&entry.stamp);
        Some(entry)
    }

    /// Forgets the least recently used ids beyond `max_ids`, and those
    /// unused for `max_age`.
    fn trim(&mut self, max_ids: usize, max_age: Duration, now: Instant) {
        while let Some(entry) = self.by_use.first_entry() {
            let id = entry.get();
            let old = self
                .by_id
                .get(&**id)
                .is_none_or(|e| now.saturating_duration_since(e.used) >= max_age);
            if self.by_id.len() <= max_ids && !old {
                break;
            }
            let id = entry.remove();
            self.by_id.remove(&id);
        }
    }
}

impl Makers {
    /// An empty map within `config`'s bounds, counting in `metrics`.
    pub(crate) fn new(config: &ResponsesConfig, metrics: &Metrics) -> Self {
        Self {
            kept: Mutex::new(Kept::default()),
            max_ids: config.max_ids,
            max_age: Duration::from_secs(config.max_age_secs),
            outcomes: metrics.labelled_counters(&AFFINITY, "outcome"),
        }
    }

    /// `worker` made the response `id`, in the pool of `model`.
    pub(crate) fn learn(&self, id: &str, worker: &str, model: Option<&str>) {
        if self.max_ids == 0 {
            return;
        }
        let now = Instant::now();
        let mut kept = self.kept.lock();
        kept.clock += 1;
        let stamp = kept.clock;
        let maker = Maker {
            url: worker.into(),
            model: model.map(Into::into),
        };
        // Learned again (found at another worker): the same response, as
        // charged as it was.
        let charged = kept.remove(id).map_or(0, |old| old.charged);
        kept.by_use.insert(stamp, id.into());
        kept.by_id.insert(
            id.into(),
            Entry {
                maker,
                stamp,
                used: now,
                charged,
            },
        );
        kept.trim(self.max_ids, self.max_age, now);
    }

    /// The maker of the response `id`, if known (its use renews it).
    pub(crate) fn maker(&self, id: &str) -> Option<Maker> {
        let now = Instant::now();
        let mut kept = self.kept.lock();
        kept.trim(self.max_ids, self.max_age, now);
        kept.clock += 1;
        let stamp = kept.clock;
        let entry = kept.by_id.get_mut(id)?;
        let old = std::mem::replace(&mut entry.stamp, stamp);
        entry.used = now;
        let maker = entry.maker.clone();
        kept.by_use.remove(&old);
        kept.by_use.insert(stamp, id.into());
        Some(maker)
    }

    /// A successful answer from `worker`, in the pool of `model`, to the
    /// request with `affinity` sent with `method`: a response found by a
    /// lookup is learned with the worker that holds it (the next request
    /// naming it goes there at once); a response deleted is forgotten.
    pub(crate) fn answered(
        &self,
        affinity: &Affinity,
        method: &axum::http::Method,
        worker: &str,
        model: Option<&str>,
    ) {
        let (id, maker) = match affinity {
            Affinity::None => return,
            Affinity::Previous { id, maker } | Affinity::ById { id, maker } => (id, maker),
        };
        let by_id = matches!(affinity, Affinity::ById { .. });
        if by_id && method == axum::http::Method::DELETE {
            self.kept.lock().remove(id);
        } else if maker.as_ref().is_none_or(|m| &*m.url != worker) {
            self.learn(id, worker, model);
        }
    }

    /// Ids kept now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.lock().by_id.len()
    }

    /// What a request to `endpoint` (its body read as `request`, its path
    /// `path`) asks of a stored response: nothing for every endpoint but
    /// the Responses API's and the requests by id, which pay one match
    /// here.
    pub(crate) fn affinity(
        &self,
        endpoint: crate::proxy::Endpoint,
        request: &crate::inspect::Inspected,
        path: &str,
    ) -> Affinity {
        use crate::proxy::Endpoint;
        match endpoint {
            Endpoint::Routed(radixgate_routing::Api::Responses) => {
                match request.previous_response_id.as_deref() {
                    // Off (`max_ids` 0): routed by text, as before.
                    Some(_) if self.max_ids == 0 => Affinity::None,
                    Some(id) => Affinity::Previous {
                        maker: self.maker(id),
                        id: id.to_owned(),
                    },
                    None => Affinity::None,
                }
            }
            Endpoint::StoredResponse => {
                let id = id_in_path(path).unwrap_or_default();
                Affinity::ById {
                    maker: self.maker(id),
                    id: id.to_owned(),
                }
            }
            _ => Affinity::None,
        }
    }

    /// Where the next attempt of a request with `affinity` (not
    /// [`Affinity::None`]) goes, `exclude` being the workers already
    /// tried: to its maker ([`to_maker`]); else, for a request by id, to
    /// the next worker to ask ([`lookup`]), or, when every one has been
    /// asked, nowhere (`Err` with the response's id); else routed as any
    /// other (`None`). The first call for a request (`counted` false, set
    /// here) counts how its affinity was decided.
    pub(crate) fn pin<'a>(
        &self,
        router: &Router,
        affinity: &'a Affinity,
        model: Option<&str>,
        exclude: &[WorkerId],
        counted: &mut bool,
    ) -> Result<Option<(Decision, Option<String>)>, Unpinned<'a>> {
        let pinned = to_maker(router, affinity, model, exclude);
        if !*counted {
            *counted = true;
            self.outcomes.increment(match (affinity.maker(), &pinned) {
                (None, _) => "unknown",
                (Some(_), Some(_)) => "maker",
                (Some(_), None) => "maker_unavailable",
            });
        }
        if pinned.is_none()
            && let Some(url) = held_up(router, affinity, exclude)
        {
            // In the pool, out of rotation: it alone holds the response,
            // and another worker could only refuse it as unknown.
            return Err(Unpinned::MakerUnavailable { url });
        }
        match (pinned, affinity) {
            (Some(pinned), _) => Ok(Some(pinned)),
            (None, Affinity::ById { id, .. }) => lookup(router, Asked::Any, exclude)
                .map(Some)
                .ok_or(Unpinned::NotFound(id)),
            // An id this gateway did not see made (a restart, another
            // replica): the workers of the request's pool are asked in
            // turn, as for a request by id, the last one's answer passed
            // on whatever it is (`asks_on`). Every one asked, it is routed
            // as any other (a failure before is the request's answer).
            (None, Affinity::Previous { maker: None, .. }) => {
                Ok(lookup(router, Asked::Pool(model), exclude))
            }
            (None, _) => Ok(None),
        }
    }
}

/// Why a request naming a stored response has no worker to go to.
#[derive(Debug)]
pub(crate) enum Unpinned<'a> {
    /// Its maker is not known and every worker was asked (the id).
    NotFound(&'a str),
    /// Its maker is in the pool but out of rotation (unhealthy, its
    /// breaker open or its probe out, ejected): 503 until it is back.
    MakerUnavailable {
        /// The maker's URL.
        url: String,
    },
}

/// The URL of the maker of the response `affinity` names where that
/// worker is in the pool but cannot take the request now: not available,
/// or left out of it already (`exclude`: its half-open breaker's probe
/// was out).
fn held_up(router: &Router, affinity: &Affinity, exclude: &[WorkerId]) -> Option<String> {
    let maker = affinity.maker()?;
    let set = router.snapshot();
    let worker = set.by_url(&maker.url)?;
    (!worker.is_available() || exclude.contains(&worker.id())).then(|| worker.url().to_owned())
}

/// The error for a request about a stored response whose maker is
/// unavailable (see [`Unpinned::MakerUnavailable`]).
pub(crate) fn maker_unavailable(url: &str) -> GatewayError {
    GatewayError::NoHealthyWorker {
        model: None,
        why: format!(
            "the worker that holds this stored response, {url}, is out of rotation \
             (unhealthy, its circuit breaker open, or ejected); no other worker \
             holds it; retry shortly"
        ),
    }
}

/// The error for a request about a stored response whose maker is not
/// known, once no worker is left to ask: the last failure, if an attempt
/// failed (the maker may be the worker that did); else 404 if `looked_up`
/// workers answered that they do not hold it; else no worker to ask.
pub(crate) fn not_found(
    shared: &crate::state::Shared,
    id: &str,
    looked_up: usize,
    last_failure: Option<GatewayError>,
    attempts: usize,
) -> GatewayError {
    match last_failure {
        Some(last) if attempts > 1 => GatewayError::RetriesExhausted {
            attempts: attempts as u32,
            last: Box::new(last),
        },
        Some(last) => last,
        None if looked_up > 0 => GatewayError::ResponseNotFound {
            id: id.to_owned(),
            asked: looked_up,
        },
        None => GatewayError::NoHealthyWorker {
            model: None,
            why: shared
                .control
                .why_unavailable(&shared.router.snapshot(), None),
        },
    }
}

/// The decision that sends a request with `affinity` to its maker, when
/// that worker is in the snapshot, available, not in `exclude`, and (for
/// a follow-up) in the pool of the request's `model`; `None` otherwise.
pub(crate) fn to_maker(
    router: &Router,
    affinity: &Affinity,
    model: Option<&str>,
    exclude: &[WorkerId],
) -> Option<(Decision, Option<String>)> {
    let (maker, branch) = match affinity {
        Affinity::Previous {
            maker: Some(maker), ..
        } => (maker, Branch::PreviousResponse),
        Affinity::ById {
            maker: Some(maker), ..
        } => (maker, Branch::StoredResponse),
        _ => return None,
    };
    let set = router.snapshot();
    let worker = set.by_url(&maker.url)?;
    if exclude.contains(&worker.id()) || !worker.is_available() {
        return None;
    }
    let pool = match affinity {
        Affinity::Previous { .. } => {
            let pool = set.resolve(model).ok()?;
            if !pool.workers.iter().any(|w| w.id() == worker.id()) {
                return None;
            }
            (pool.model != radixgate_routing::WILDCARD_MODEL).then(|| pool.model.to_owned())
        }
        _ => maker.model.as_deref().map(str::to_owned),
    };
    Some((decide(worker, branch, std::slice::from_ref(worker)), pool))
}

/// Whether `decision` sends a request to the maker of the stored response
/// it names ([`to_maker`]): no other worker holds that response, so a
/// failed attempt there is not retried on another, which could only refuse
/// the request as naming a response it does not know (an engine's 404,
/// which the client would take for a lost conversation).
pub(crate) fn only_holder(decision: &Decision) -> bool {
    matches!(
        decision.explanation().branch,
        Branch::PreviousResponse | Branch::StoredResponse
    )
}

/// The workers a stored response whose maker is not known is asked of.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Asked<'a> {
    /// Every regular worker (a request by id names no model).
    Any,
    /// The pool of the request's model (a follow-up).
    Pool(Option<&'a str>),
}

/// The available regular workers of `asked` not in `exclude`, and the
/// pool's model where `asked` names one (`None`: the wildcard pool, or
/// any).
fn candidates(
    set: &radixgate_routing::WorkerSet,
    asked: Asked<'_>,
    exclude: &[WorkerId],
) -> (Vec<Arc<Worker>>, Option<String>) {
    let askable = |w: &&Arc<Worker>| {
        w.role() == WorkerRole::Regular && w.is_available() && !exclude.contains(&w.id())
    };
    match asked {
        Asked::Any => (
            set.workers().iter().filter(askable).cloned().collect(),
            None,
        ),
        Asked::Pool(model) => match set.resolve(model) {
            Ok(pool) => (
                pool.workers.iter().filter(askable).cloned().collect(),
                (pool.model != radixgate_routing::WILDCARD_MODEL).then(|| pool.model.to_owned()),
            ),
            Err(_) => (Vec::new(), None),
        },
    }
}

/// The decision that asks the least-loaded worker of `asked` not in
/// `exclude` for a stored response whose maker is not known; `None` when
/// every one has been asked.
pub(crate) fn lookup(
    router: &Router,
    asked: Asked<'_>,
    exclude: &[WorkerId],
) -> Option<(Decision, Option<String>)> {
    let set = router.snapshot();
    let (candidates, pool) = candidates(&set, asked, exclude);
    let worker = candidates.iter().min_by_key(|w| w.load())?;
    let model = match asked {
        Asked::Any => worker.models().first().cloned(),
        Asked::Pool(_) => pool,
    };
    Some((decide(worker, Branch::ResponseLookup, &candidates), model))
}

/// Whether a 404 from `worker`, asked by a lookup ([`lookup`]) for the
/// request with `affinity`, is passed over to ask the next worker: for a
/// request by id, always (when none is left, the gateway answers its own
/// 404); for a follow-up, while another worker of its pool is left to ask,
/// so the last one's answer (the engine's own 404) reaches the client.
pub(crate) fn asks_on(
    router: &Router,
    affinity: &Affinity,
    model: Option<&str>,
    tried: &[WorkerId],
    worker: WorkerId,
) -> bool {
    match affinity {
        Affinity::ById { .. } => true,
        Affinity::Previous { .. } => {
            let set = router.snapshot();
            let (left, _) = candidates(&set, Asked::Pool(model), tried);
            left.iter().any(|w| w.id() != worker)
        }
        Affinity::None => false,
    }
}

fn decide(worker: &Arc<Worker>, branch: Branch, considered: &[Arc<Worker>]) -> Decision {
    let loads = considered.iter().map(|w| w.load());
    Decision::new(
        worker,
        Explanation {
            policy: "responses",
            branch,
            worker: worker.id(),
            matched_chars: None,
            input_chars: 0,
            load: worker.load(),
            min_load: loads.clone().min().unwrap_or(0),
            max_load: loads.max().unwrap_or(0),
            available: considered.len(),
            ttft_ms: None,
            alt_ttft_ms: None,
            exact: false,
        },
    )
}

/// The id in a by-id path (`/v1/responses/{id}` and below it).
pub(crate) fn id_in_path(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/responses/")?
        .split('/')
        .next()
        .filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn makers(max_ids: usize, max_age_secs: u64) -> Makers {
        let metrics = Metrics::with_histograms(&[]);
        Makers::new(
            &ResponsesConfig {
                max_ids,
                max_age_secs,
            },
            &metrics,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn the_least_recently_used_and_the_old_are_forgotten() {
        let m = makers(2, 60);
        m.learn("a", "http://w1", None);
        m.learn("b", "http://w2", Some("m"));
        // `a` used: `b` is the least recently used when `c` comes.
        assert_eq!(m.maker("a").unwrap().url.as_ref(), "http://w1");
        m.learn("c", "http://w3", None);
        assert_eq!(m.len(), 2);
        assert!(m.maker("b").is_none());
        assert_eq!(m.maker("c").unwrap().url.as_ref(), "http://w3");
        // Learned again: the new maker.
        m.learn("a", "http://w9", None);
        assert_eq!(m.maker("a").unwrap().url.as_ref(), "http://w9");
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(m.maker("a").is_some());
        tokio::time::advance(Duration::from_secs(45)).await;
        // `c` unused for 75 s, `a` for 45 s.
        assert!(m.maker("c").is_none());
        assert!(m.maker("a").is_some());
        assert_eq!(m.len(), 1);
        // Off: nothing kept.
        let off = makers(0, 60);
        off.learn("a", "http://w1", None);
        assert!(off.maker("a").is_none());
    }

    #[test]
    fn the_id_is_the_segment_after_responses() {
        assert_eq!(id_in_path("/v1/responses/resp_1"), Some("resp_1"));
        assert_eq!(id_in_path("/v1/responses/resp_1/cancel"), Some("resp_1"));
        assert_eq!(id_in_path("/v1/responses/"), None);
        assert_eq!(id_in_path("/v1/other/x"), None);
    }
}
