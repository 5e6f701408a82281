//! A stored response's tokens are charged to a tenant once. Its usage
//! shows in its create's answer and again in every answer that carries
//! the response (`GET /v1/responses/{id}`, its cancel): charged each time,
//! a tenant that polls a response would pay for it again at every poll.
//! Charged on its create only, a `background` response, answered before
//! its work is done (without usage: the gateway's estimate is charged),
//! would never pay for the work its later reads report.
//!
//! So each id kept with its maker ([`super::Makers`]) keeps the tokens
//! charged for it so far: the most any answer about it was charged at
//! (its create's usage or estimate, a read's usage). An answer that
//! reports `n` is charged what `n` is past that, and raises it to `n`;
//! the check and the raise are one step under the map's lock, so two
//! answers ending at once cannot both charge the same tokens.
//!
//! An id not kept here (`responses.max_ids` 0, forgotten by age or
//! count) is charged in full, as any answer is. An id made through
//! another replica, or before a restart, is learned by the read that
//! finds its worker, so it is charged in full once per replica: this map
//! is each replica's own (sync does not share it). Charging such a read
//! nothing instead would let a background response go unpaid past its
//! estimate whenever its reads reach a replica that did not make it; so a
//! response is charged more than once (once per replica) rather than
//! less. A deleted response's id is forgotten with what it was charged.

use super::{Affinity, Makers};
use crate::proxy::Endpoint;
use radixgate_routing::Api;
use std::sync::{Arc, OnceLock};

/// Which stored response a tenant's answer is about: in the response's
/// extensions, from the request path to [`crate::tenants::Metered`],
/// which charges its tokens through [`Makers::charge`].
#[derive(Clone, Debug)]
pub(crate) enum StoredAnswer {
    /// A request by its id (`/v1/responses/{id}` and below).
    ById(Box<str>),
    /// A create of a stored response: its id, set when its answer shows
    /// it (where the id is learned, before the body's end is charged).
    Made(Arc<OnceLock<Box<str>>>),
}

impl StoredAnswer {
    /// What a tenant's request to `endpoint` with `affinity` is about: a
    /// stored response named by its id, or one it makes (a Responses
    /// create, unless `unstored`); `None` for any other.
    pub(crate) fn of(endpoint: Endpoint, affinity: &Affinity, unstored: bool) -> Option<Self> {
        match (endpoint, affinity) {
            (_, Affinity::ById { id, .. }) => Some(StoredAnswer::ById(id.as_str().into())),
            (Endpoint::Routed(Api::Responses), _) if !unstored => {
                Some(StoredAnswer::Made(Arc::default()))
            }
            _ => None,
        }
    }

    /// A create's place for its id, which the watch that learns the id
    /// fills.
    pub(crate) fn made(&self) -> Option<Arc<OnceLock<Box<str>>>> {
        match self {
            StoredAnswer::Made(made) => Some(made.clone()),
            StoredAnswer::ById(_) => None,
        }
    }

    /// The response's id, once known.
    pub(crate) fn id(&self) -> Option<&str> {
        match self {
            StoredAnswer::ById(id) => Some(id),
            StoredAnswer::Made(made) => made.get().map(|id| &**id),
        }
    }
}

impl Makers {
    /// What an answer about the stored response `id` owes of the `tokens`
    /// it is charged (reported or estimated): those past what its earlier
    /// answers were charged, which then count as charged too. All of them
    /// for an id not kept here.
    pub(crate) fn charge(&self, id: &str, tokens: u64) -> u64 {
        let mut kept = self.kept.lock();
        let Some(entry) = kept.by_id.get_mut(id) else {
            return tokens;
        };
        let owed = tokens.saturating_sub(entry.charged);
        entry.charged = entry.charged.max(tokens);
        owed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ResponsesConfig;
    use crate::metrics::Metrics;

    fn makers(max_ids: usize) -> Makers {
        let config = ResponsesConfig {
            max_ids,
            max_age_secs: 60,
        };
        Makers::new(&config, &Metrics::with_histograms(&[]))
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_id_is_charged_the_most_any_answer_reported_once() {
        let m = makers(10);
        m.learn("a", "http://w1", None);
        // Its create's estimate, then reads reporting less, more, the same.
        assert_eq!(m.charge("a", 40), 40);
        assert_eq!(m.charge("a", 30), 0);
        assert_eq!(m.charge("a", 100), 60);
        assert_eq!(m.charge("a", 100), 0);
        // Learned again (found at another worker): still charged.
        m.learn("a", "http://w2", None);
        assert_eq!(m.charge("a", 100), 0);
        // Not kept: charged in full, every time.
        assert_eq!(m.charge("b", 100), 100);
        assert_eq!(m.charge("b", 100), 100);
        // Deleted: forgotten with its charge.
        let delete = crate::responses::Affinity::ById {
            id: "a".into(),
            maker: m.maker("a"),
        };
        m.answered(&delete, &axum::http::Method::DELETE, "http://w2", None);
        assert_eq!(m.charge("a", 100), 100);
        // The map off: nothing kept.
        let off = makers(0);
        off.learn("a", "http://w1", None);
        assert_eq!(off.charge("a", 100), 100);
        assert_eq!(off.charge("a", 100), 100);
    }

    #[test]
    fn answers_ending_at_once_charge_the_difference_once() {
        let m = makers(10);
        m.learn("a", "http://w1", None);
        assert_eq!(m.charge("a", 10), 10);
        let owed: u64 = std::thread::scope(|s| {
            let readers: Vec<_> = (0..8).map(|_| s.spawn(|| m.charge("a", 50))).collect();
            readers.into_iter().map(|r| r.join().unwrap()).sum()
        });
        assert_eq!(owed, 40);
    }

    #[test]
    fn a_create_names_its_id_once_its_answer_shows_it() {
        let made = StoredAnswer::Made(Arc::default());
        assert_eq!(made.id(), None);
        if let StoredAnswer::Made(slot) = &made {
            let _ = slot.set("resp_1".into());
        }
        assert_eq!(made.id(), Some("resp_1"));
        assert_eq!(StoredAnswer::ById("resp_2".into()).id(), Some("resp_2"));
    }
}
