//! The tenants' metric families: each tenant's answered requests by status,
//! the tokens its workers reported, and its refusals by limit. Their names
//! and help texts live here; they are recorded where a tenant is known —
//! the client API's middleware (`auth.rs`, answers), [`super::admit`]
//! (refusals) and [`super::Metered`] (tokens, when a body ends). The
//! machinery is [`crate::metrics`].
//!
//! Labels: tenant names come from the config, never from a client (a
//! request whose key matches no tenant is refused before it is counted), so
//! the tenant label is bounded by the configured set; statuses are HTTP
//! codes and limits are `&'static str`. The families live in the gateway's
//! shared state rather than in [`super::Tenants`], which a reload replaces.

use crate::metrics::{
    Describe, Family, LabelKey, LabelRef, Metrics, SaturatingCounter, status_label,
};
use ::metrics::{Counter, Label};

pub(crate) const REQUESTS: Describe = Describe::new(
    "radixgate_tenant_requests_total",
    "Client requests, by tenant and HTTP status.",
);
pub(crate) const TOKENS: Describe = Describe::new(
    "radixgate_tenant_tokens_total",
    "Tokens charged to a tenant: what workers reported, or the gateway's estimate where an answer reported none.",
);
pub(crate) const RATE_LIMITED: Describe = Describe::new(
    "radixgate_tenant_rate_limited_total",
    "Requests refused by a tenant's limit, by tenant and limit (requests, tokens).",
);

/// The tenant metric families, built once per gateway.
#[derive(Debug)]
pub(crate) struct TenantMetrics {
    /// ("", status, tenant)
    requests: Family<LabelKey, Counter>,
    /// Saturating: a worker may report any count.
    tokens: Family<Box<str>, SaturatingCounter>,
    /// (limit, 0, tenant)
    rate_limited: Family<LabelKey, Counter>,
}

impl TenantMetrics {
    pub(crate) fn new(metrics: &Metrics) -> Self {
        Self {
            requests: metrics.counters(&REQUESTS),
            tokens: metrics.saturating_counters(&TOKENS),
            rate_limited: metrics.counters(&RATE_LIMITED),
        }
    }

    /// A tenant's request answered with `status`.
    pub(crate) fn request(&self, tenant: &str, status: u16) {
        let key = LabelRef {
            fixed: "",
            code: status,
            text: tenant,
        };
        self.requests.with(
            &key,
            || key.to_owned_key(),
            || {
                vec![
                    tenant_label(tenant),
                    Label::new("status", status_label(status)),
                ]
            },
            |c| c.increment(1),
        );
    }

    /// Tokens a worker reported using for a tenant's request.
    pub(crate) fn tokens(&self, tenant: &str, tokens: u64) {
        self.tokens.with(
            tenant,
            || tenant.into(),
            || vec![tenant_label(tenant)],
            |c| c.add(tokens),
        );
    }

    /// A tenant's request refused by its `limit` (`requests` or `tokens`).
    pub(crate) fn rate_limited(&self, tenant: &str, limit: &'static str) {
        let key = LabelRef {
            fixed: limit,
            code: 0,
            text: tenant,
        };
        self.rate_limited.with(
            &key,
            || key.to_owned_key(),
            || {
                vec![
                    tenant_label(tenant),
                    Label::from_static_parts("limit", limit),
                ]
            },
            |c| c.increment(1),
        );
    }
}

fn tenant_label(tenant: &str) -> Label {
    Label::new("tenant", tenant.to_owned())
}
