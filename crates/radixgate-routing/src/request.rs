//! What a policy sees of a request: a borrowed view, built by the gateway
//! (or the simulator) from the parsed body without copying the text.

use crate::{ExactMatches, WorkerId};

/// The parts of a request routing needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestView<'a> {
    /// The pool key the request was resolved to (see
    /// [`WorkerSet::resolve`](crate::WorkerSet::resolve)): the model name, or
    /// [`WILDCARD_MODEL`](crate::WILDCARD_MODEL) for workers serving any model.
    /// Per-model state (trees) is keyed by it, so it must come from the
    /// worker set, never straight from the client.
    pub model: &'a str,
    /// The routing text: the prompt, or chat messages rendered with roles and
    /// turn boundaries so that turn N+1 extends turn N.
    pub text: &'a str,
    /// A sticky-session key (`x-session-id` header, or the body's `user`).
    pub routing_key: Option<&'a str>,
    /// Exact matches from engines' KV events, for the workers whose event
    /// stream is live (`exact.rs`); `None` without events.
    pub exact: Option<ExactMatches<'a>>,
    /// The workers of the pool a retry already tried, left out of the
    /// workers the policy is given: a policy that owes a request to one
    /// of them (consistent_hash's key owner) says it went elsewhere.
    pub excluded: &'a [WorkerId],
}

impl<'a> RequestView<'a> {
    /// A request for `model` with routing text `text` and no routing key.
    pub fn new(model: &'a str, text: &'a str) -> Self {
        Self {
            model,
            text,
            routing_key: None,
            exact: None,
            excluded: &[],
        }
    }

    /// Sets the routing key.
    pub fn with_routing_key(mut self, key: Option<&'a str>) -> Self {
        self.routing_key = key;
        self
    }

    /// Sets the workers a retry excluded.
    pub fn with_excluded(mut self, excluded: &'a [WorkerId]) -> Self {
        self.excluded = excluded;
        self
    }

    /// Sets the exact matches.
    pub fn with_exact(mut self, exact: Option<ExactMatches<'a>>) -> Self {
        self.exact = exact;
        self
    }
}
