//! Tenants: who a client is (by API key), how much it may ask for, and where
//! it stands in the admission queue.
//!
//! [`Tenants`] is built from the validated config ([`Tenants::from_config`])
//! and is immutable; the gateway holds it in an `ArcSwap`, so a reload
//! builds a new set with [`Tenants::reloaded`] (which keeps the buckets of
//! tenants whose name and limits did not change, and the token debt of
//! those whose token limit did) and swaps it in while requests keep
//! reading the old one.
//!
//! Limits are `governor` GCRA buckets, one per tenant and limit (tenants are
//! a fixed set, so no keyed state needs pruning), each holding a minute's
//! worth:
//! - **requests per minute**: each inference request takes one cell before
//!   it is admitted; an empty bucket is a 429 with `Retry-After` = the
//!   seconds until a cell frees, as governor computes it;
//! - **tokens per minute**: a request's tokens are known only when its
//!   response ends (the worker's `usage`, read by [`crate::usage`]), so they
//!   are charged after the fact. What the bucket cannot cover at once is
//!   kept as an overdraft, and a new request is refused while any
//!   overdraft is left: the tenant waits until the bucket has refilled
//!   enough to pay it. Requests already running when the budget runs out
//!   finish; a burst of concurrent requests can therefore overrun a minute's
//!   budget once, and pays it back before the next one is admitted.
//!
//! Keys are compared in constant time against every tenant's key, so the
//! time taken says neither how much of a guess was right nor which tenant
//! matched. The gateway never logs a key: tenants are named in logs and
//! metrics by their configured name.
//!
//!   A tenant with a token limit is charged for its OpenAI streams too
//!   when its client does not ask for their usage (the gateway asks in its
//!   stead: `tenants/usage_event.rs`), and for an answer that reports no
//!   usage (a worker that does not, a client gone before the usage event)
//!   an estimate: the request body's bytes over the model's learned
//!   characters per token (an inline image's base64 as one part of
//!   `INLINE_MEDIA_TOKENS`), and the output's events or bytes
//!   ([`crate::usage::Output`]; not an embeddings answer's vectors). An
//!   answer cut short (its client gone, its worker failed) may have
//!   reported its prompt alone (an Anthropic
//!   stream's output count comes in its last events): it is charged at
//!   least its prompt and the output it was sent; a request sent to a
//!   worker that has no answer's head when its client leaves, or when the
//!   router gives up on it (a 504: its first byte or the request timeout),
//!   its prompt ([`PromptOwed`]).
//!
//! The tenant metric families are this component's ([`TenantMetrics`], in
//! `tenants/metrics.rs`).

mod metered;
pub(crate) mod metrics;
mod usage_event;

pub(crate) use metered::Metered;
pub(crate) use metrics::TenantMetrics;

use crate::admission::Priority;
use crate::auth::constant_time_eq;
use crate::config::{Config, ConfigError, ResolvedTenant};
use crate::error::GatewayError;
use crate::inspect::Inspected;
use crate::state::Shared;
use axum::extract::Request;
use axum::http::Extensions;
use bytes::Bytes;
use governor::clock::Clock as _;
use governor::{DefaultDirectRateLimiter, Quota};
use parking_lot::Mutex;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Which of a tenant's limits refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `requests_per_minute`.
    Requests,
    /// `tokens_per_minute`.
    Tokens,
}

impl Limit {
    /// The metrics label and the OpenAI error `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
        }
    }
}

/// The configured tenants; empty when the client API is open.
#[derive(Debug, Default)]
pub struct Tenants {
    tenants: Vec<Arc<Tenant>>,
}

/// One tenant and its buckets.
pub struct Tenant {
    name: Arc<str>,
    key: Box<str>,
    priority: Priority,
    requests: Option<Arc<RequestBucket>>,
    tokens: Option<Arc<TokenBucket>>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

/// The tenant a request was authenticated as, in its extensions.
#[derive(Clone, Debug)]
pub(crate) struct TenantRef(pub(crate) Arc<Tenant>);

impl Tenants {
    /// The tenants of a validated config (`server.api_key` and `tenants`).
    pub fn from_config(config: &Config) -> Result<Self, ConfigError> {
        Self::default().reloaded(config)
    }

    /// The tenants of `config`, keeping the buckets (and so what was spent)
    /// of every tenant whose name and limit are unchanged.
    pub fn reloaded(&self, config: &Config) -> Result<Self, ConfigError> {
        let resolved = config.tenants.resolve(config.server.api_key.as_deref())?;
        let tenants = resolved
            .into_iter()
            .map(|spec| Arc::new(self.build(spec)))
            .collect();
        Ok(Self { tenants })
    }

    /// Whether `other` has the same tenants as this: names, keys,
    /// priorities and limits (a key file's contents can change while the
    /// config file that names it does not).
    pub fn same_as(&self, other: &Self) -> bool {
        let limits = |t: &Tenant| {
            (
                t.requests.as_ref().map(|b| b.per_minute),
                t.tokens.as_ref().map(|b| b.per_minute),
            )
        };
        self.tenants.len() == other.tenants.len()
            && self.tenants.iter().zip(&other.tenants).all(|(a, b)| {
                a.name == b.name
                    && a.key == b.key
                    && a.priority == b.priority
                    && limits(a) == limits(b)
            })
    }

    fn build(&self, spec: ResolvedTenant) -> Tenant {
        let old = self.tenants.iter().find(|t| *t.name == *spec.name);
        let requests =
            spec.requests_per_minute
                .map(|rpm| match old.and_then(|t| t.requests.as_ref()) {
                    Some(bucket) if bucket.per_minute == rpm => bucket.clone(),
                    // A new limit: the requests of the last minute count
                    // against it.
                    Some(bucket) => Arc::new(bucket.succeeded_by(rpm)),
                    None => Arc::new(RequestBucket::new(rpm)),
                });
        let tokens = spec
            .tokens_per_minute
            .map(|tpm| match old.and_then(|t| t.tokens.as_ref()) {
                Some(bucket) if bucket.per_minute == tpm => bucket.clone(),
                // A new limit: what the tenant owes, and what its requests in
                // flight will owe (they charge the old bucket), is owed under it.
                Some(bucket) => Arc::new(bucket.succeeded_by(tpm)),
                None => Arc::new(TokenBucket::new(tpm)),
            });
        Tenant {
            name: spec.name.into(),
            key: spec.key.into(),
            priority: spec.priority,
            requests,
            tokens,
        }
    }

    /// Whether no key is required.
    pub fn is_open(&self) -> bool {
        self.tenants.is_empty()
    }

    /// The tenant whose key was presented. Every key is compared, in time
    /// that depends only on the lengths.
    pub fn find(&self, presented: &str) -> Option<&Arc<Tenant>> {
        let mut found = None;
        for tenant in &self.tenants {
            if constant_time_eq(presented.as_bytes(), tenant.key.as_bytes()) {
                found = Some(tenant);
            }
        }
        found
    }

    /// The tenants' names, in configured order (for a status page).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tenants.iter().map(|t| t.name())
    }
}

impl Tenant {
    /// The configured name (the metrics label).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The admission priority.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Takes one request from the request bucket, unless the tenant is over
    /// a limit: then the error says which, and how long to wait.
    pub fn admit(&self) -> Result<(), GatewayError> {
        // Tokens first: a request refused for its tokens takes no request
        // cell.
        if let Some(tokens) = &self.tokens
            && let Err(wait) = tokens.settle()
        {
            return Err(self.limited(Limit::Tokens, tokens.per_minute, wait));
        }
        if let Some(requests) = &self.requests
            && let Err(wait) = requests.take()
        {
            return Err(self.limited(Limit::Requests, requests.per_minute, wait));
        }
        Ok(())
    }

    fn limited(&self, limit: Limit, per_minute: NonZeroU32, wait: Duration) -> GatewayError {
        GatewayError::RateLimited {
            tenant: self.name.to_string(),
            limit,
            per_minute: per_minute.get(),
            retry_after: wait,
        }
    }

    /// Whether the tenant has a token limit (its answers are metered).
    pub fn meters_tokens(&self) -> bool {
        self.tokens.is_some()
    }

    /// Charges the tokens a response reported (after the fact; see the
    /// module doc).
    pub fn charge(&self, tokens: u64) {
        if let Some(bucket) = &self.tokens {
            bucket.charge(tokens);
        }
    }
}

/// Admits a request for its tenant (if the API has tenants): checks its
/// limits and returns its queue priority. A refusal is counted here.
pub(crate) fn admit(req: &Request, metrics: &TenantMetrics) -> Result<Priority, GatewayError> {
    let Some(TenantRef(tenant)) = req.extensions().get::<TenantRef>() else {
        return Ok(Priority::Normal);
    };
    tenant.admit().inspect_err(|err| {
        if let GatewayError::RateLimited { limit, .. } = err {
            metrics.rate_limited(tenant.name(), limit.as_str());
        }
    })?;
    Ok(tenant.priority())
}

/// How a metered tenant's answer is charged when it reports no usage, and
/// whether its usage event was asked for in the client's stead (and so is
/// taken out of its stream). In the response's extensions, from the
/// request path to [`Metered`].
#[derive(Clone, Debug)]
pub(crate) struct Metering {
    /// The prompt's estimated tokens.
    prompt_tokens: u64,
    /// The model's characters per token, for the output's estimate.
    chars_per_token: f64,
    /// Whether the output is estimated too (generated text, not vectors).
    output_estimated: bool,
    /// The client did not ask for the usage event.
    strip_usage_event: bool,
    /// Set when the gateway ends the answer early (its worker broke off,
    /// the request's timeout, shutdown): an event stream then ends with an
    /// error event, looking whole to [`Metered`], but it is cut short.
    cut: Arc<AtomicBool>,
}

impl Metering {
    /// Whether the usage event is taken out of the answer.
    pub(crate) fn strips_usage_event(&self) -> bool {
        self.strip_usage_event
    }

    /// The flag the response body sets when the gateway ends the answer
    /// early.
    pub(crate) fn cut_flag(&self) -> Arc<AtomicBool> {
        self.cut.clone()
    }

    /// Whether the gateway ended the answer early.
    fn was_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    /// The estimate of an answer's output, as it passed.
    fn output_tokens(&self, output: &crate::usage::Output) -> u64 {
        match self.output_estimated {
            true => output.tokens(self.chars_per_token),
            false => 0,
        }
    }
}

/// What a metered tenant owes for a request sent to a worker whose client
/// leaves, or which the router gives up waiting for (a 504), before the
/// answer's head: its prompt's estimate. The worker read the prompt (a
/// whole answer's head comes only when it is done), and an answer cut
/// short is charged at least that; charged nothing, a tenant could have
/// long prompts read without end by leaving each request before its
/// answer, or by asking for answers too long for the timeouts. Charged by
/// the request path ([`crate::proxy`]) when the request's future is
/// dropped unanswered or ends in a timeout.
#[derive(Debug)]
pub(crate) struct PromptOwed {
    tenant: Arc<Tenant>,
    tokens: u64,
}

impl PromptOwed {
    /// Charges the tenant and counts the tokens in its metrics.
    pub(crate) fn charge(&self, metrics: &TenantMetrics) {
        self.tenant.charge(self.tokens);
        metrics.tokens(self.tenant.name(), self.tokens);
    }
}

impl Metering {
    /// What the request's tenant (in `extensions`) owes if its client
    /// leaves before the answer's head.
    pub(crate) fn prompt_owed(&self, extensions: &Extensions) -> Option<PromptOwed> {
        let TenantRef(tenant) = extensions.get::<TenantRef>()?;
        Some(PromptOwed {
            tenant: tenant.clone(),
            tokens: self.prompt_tokens,
        })
    }
}

/// What an answer that reports no usage is charged an estimate of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Estimate {
    /// Nothing: it is charged only what it reports (a tokenizer's, a
    /// prompt's token count's, a reranker's or an upload's answer).
    Nothing,
    /// Its prompt: its output is not tokens (an embeddings answer's
    /// vectors, whose bytes would be charged as thousands of tokens).
    Prompt,
    /// Its prompt and its output (an answer of generated text).
    PromptAndOutput,
}

/// For a request of a tenant with a token limit whose answer is charged
/// an estimate if it reports no usage (`estimate`: an inference API's, an
/// unknown JSON API's), its [`Metering`] and the body to send: a stream's
/// asks for its usage ([`usage_event`]). Any other request's body is
/// returned as it is, and its answer charged only what it reports.
pub(crate) fn meter(
    shared: &Shared,
    extensions: &Extensions,
    estimate: Estimate,
    request: &Inspected,
    body: Bytes,
) -> Result<(Bytes, Option<Metering>), GatewayError> {
    match extensions.get::<TenantRef>() {
        Some(TenantRef(tenant)) if tenant.meters_tokens() && estimate != Estimate::Nothing => {}
        _ => return Ok((body, None)),
    }
    let chars_per_token = request
        .model
        .as_deref()
        .and_then(|m| shared.router.policy().trees()?.chars_per_token_of(m))
        .filter(|c| c.is_finite() && *c > 0.0)
        .unwrap_or(crate::record::line::DEFAULT_CHARS_PER_TOKEN);
    // The whole body, not the routing text: tools, schemas and other
    // fields the prompt template renders count too. (Its JSON syntax
    // counts more than it costs: an estimate stands in only for usage the
    // answer did not report.) Inline media count as parts, not bytes.
    let media = InlineMedia::of(&body);
    let text_bytes = body.len() - media.bytes;
    let prompt_tokens = ((text_bytes as f64 / chars_per_token).ceil() as u64)
        .saturating_add(media.parts.saturating_mul(INLINE_MEDIA_TOKENS));
    // The client's body goes: its edit takes its place in the budget.
    let asked = if request.stream {
        usage_event::ask_for_usage(body, &request.stream_options, &shared.bodies.budget)?
    } else {
        usage_event::Asked { body, strip: false }
    };
    let metering = Metering {
        prompt_tokens,
        chars_per_token,
        output_estimated: estimate == Estimate::PromptAndOutput,
        strip_usage_event: asked.strip,
        cut: Arc::default(),
    };
    Ok((asked.body, Some(metering)))
}

/// Tokens an inline media part (an image's or a clip's base64) is
/// estimated at, for an answer that reports no usage: the order of what
/// engines make of an image (hundreds to a couple of thousand tokens),
/// where its bytes over characters per token would charge a 1 MB image
/// 250,000.
const INLINE_MEDIA_TOKENS: u64 = 1024;

/// A run of base64 characters at least this long is inline media: text,
/// code and token ids break into far shorter runs at spaces and
/// punctuation.
const INLINE_MEDIA_MIN_BYTES: usize = 1024;

/// A request body's inline media: its runs of base64 characters
/// (`A-Za-z0-9+/=`, the URL-safe `-_`, and `\/`, an escaped `/`) of
/// [`INLINE_MEDIA_MIN_BYTES`] or more. Any other escape ends a run: text
/// a JSON encoder escaped (Chinese as `\uXXXX`, lines joined by `\n`)
/// would otherwise make runs as long as the text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct InlineMedia {
    /// Their bytes.
    bytes: usize,
    /// How many.
    parts: u64,
}

impl InlineMedia {
    fn of(body: &[u8]) -> Self {
        const BASE64: [bool; 256] = {
            let mut table = [false; 256];
            let mut b = 0;
            while b < 256 {
                let c = b as u8;
                table[b] =
                    c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b'-' | b'_');
                b += 1;
            }
            table
        };
        let mut media = Self::default();
        let mut run = 0usize;
        let end_run = |run: usize, media: &mut Self| {
            if run >= INLINE_MEDIA_MIN_BYTES {
                media.bytes += run;
                media.parts += 1;
            }
        };
        let mut bytes = body.iter().peekable();
        while let Some(&b) = bytes.next() {
            if BASE64[usize::from(b)] {
                run += 1;
            } else if b == b'\\' && bytes.next_if_eq(&&b'/').is_some() {
                run += 2;
            } else {
                end_run(run, &mut media);
                run = 0;
            }
        }
        end_run(run, &mut media);
        media
    }
}

/// `requests_per_minute`: one cell per request, a minute's worth at most
/// held (GCRA, as a single atomic): `full_at` is when the bucket would hold
/// a minute's worth again, each request moves it one interval on, and a
/// cell given back moves it one interval back, never before now. A request
/// the router did not serve is thus as if never taken: a tenant whose
/// requests an overload refused gets them back, and no more than a full
/// bucket. (Cells given back were once credits beside a limiter that
/// refilled on its own, so after an overload a tenant could send twice its
/// minute's worth at once.)
struct RequestBucket {
    per_minute: NonZeroU32,
    /// Nanoseconds a cell takes to come back: a minute over `per_minute`.
    interval: u64,
    /// Nanoseconds after `origin` at which the bucket is full again.
    full_at: AtomicU64,
    origin: std::time::Instant,
}

/// A minute, in nanoseconds: what a bucket holds at most.
const MINUTE_NS: u64 = 60_000_000_000;

impl RequestBucket {
    fn new(per_minute: NonZeroU32) -> Self {
        let origin = std::time::Instant::now();
        Self {
            per_minute,
            interval: MINUTE_NS / u64::from(per_minute.get()),
            full_at: AtomicU64::new(0),
            origin,
        }
    }

    /// A bucket of `per_minute` as full as this one is now: the requests
    /// taken in the last minute count against the new limit (a reload that
    /// changes it does not hand out a fresh minute).
    fn succeeded_by(&self, per_minute: NonZeroU32) -> Self {
        let next = Self {
            origin: self.origin,
            ..Self::new(per_minute)
        };
        let now = self.now();
        let taken = self
            .full_at
            .load(Ordering::Relaxed)
            .saturating_sub(now)
            .div_ceil(self.interval);
        let owed = taken.saturating_mul(next.interval).min(MINUTE_NS);
        next.full_at.store(now + owed, Ordering::Relaxed);
        next
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX / 2)
    }

    /// Takes a cell, or says how long until one frees.
    fn take(&self) -> Result<(), Duration> {
        let now = self.now();
        let mut full_at = self.full_at.load(Ordering::Relaxed);
        loop {
            let next = full_at.max(now) + self.interval;
            if next - now > MINUTE_NS {
                return Err(Duration::from_nanos(next - now - MINUTE_NS));
            }
            match self.full_at.compare_exchange_weak(
                full_at,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(seen) => full_at = seen,
            }
        }
    }

    /// Gives a taken cell back (nothing once the bucket is full again).
    fn give_back(&self) {
        let now = self.now();
        let _ = self
            .full_at
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |full_at| {
                (full_at > now).then(|| full_at.saturating_sub(self.interval).max(now))
            });
    }
}

/// Gives the request's cell back to its tenant's request limit when the
/// router refused it for its own overload (a full or timed-out admission
/// queue, the body budget spent): a tenant is not charged for requests it
/// was not served because the router was busy, which otherwise locked it
/// out for the rest of the minute without a request served. Any other
/// refusal (a bad body, an unknown model) keeps the cell, as it would at a
/// limit in front of the router.
pub(crate) fn refund(extensions: &Extensions, error: &GatewayError) {
    let overloaded = matches!(
        error,
        GatewayError::QueueFull { .. }
            | GatewayError::QueueTimeout { .. }
            | GatewayError::BodyBudgetExhausted { .. }
    );
    if overloaded && let Some(tenant) = extensions.get::<TenantRef>() {
        give_back(tenant);
    }
}

/// Gives a request's cell back to its tenant's request limit, for a
/// request the router did not serve because it was busy: one its client
/// gave up on, or its timeout ended, while it was queued (`proxy.rs`).
pub(crate) fn give_back(TenantRef(tenant): &TenantRef) {
    if let Some(requests) = &tenant.requests {
        requests.give_back();
    }
}

/// `tokens_per_minute`: charged after the fact, with an overdraft.
struct TokenBucket {
    per_minute: NonZeroU32,
    limiter: DefaultDirectRateLimiter,
    /// Tokens used but not yet taken from the bucket. A mutex, not an
    /// atomic: paying it is a check of the bucket and an update of the debt
    /// as one step, or two payers could pay the same debt twice. Held for
    /// that step only. Shared with the bucket a reload replaced this one
    /// by ([`Self::succeeded_by`]).
    overdraft: Arc<Mutex<u64>>,
    /// Replaced by a reload: charges go to the overdraft, left for the new
    /// bucket to pay.
    retired: AtomicBool,
}

impl TokenBucket {
    fn new(per_minute: NonZeroU32) -> Self {
        Self::owing(per_minute, Arc::default())
    }

    fn owing(per_minute: NonZeroU32, overdraft: Arc<Mutex<u64>>) -> Self {
        Self {
            per_minute,
            limiter: DefaultDirectRateLimiter::direct(Quota::per_minute(per_minute)),
            overdraft,
            retired: AtomicBool::new(false),
        }
    }

    /// A bucket of `per_minute` that owes what this one does and takes
    /// over its charges from now on.
    fn succeeded_by(&self, per_minute: NonZeroU32) -> Self {
        self.retired.store(true, Ordering::Relaxed);
        Self::owing(per_minute, self.overdraft.clone())
    }

    fn charge(&self, tokens: u64) {
        let mut overdraft = self.overdraft.lock();
        *overdraft = overdraft.saturating_add(tokens);
        drop(overdraft);
        // Pays what the bucket holds now; the rest waits for `settle` calls.
        if !self.retired.load(Ordering::Relaxed) {
            let _ = self.settle();
        }
    }

    /// Pays the overdraft from the bucket, a minute's worth at a time;
    /// `Err` is how long until the rest can be paid.
    fn settle(&self) -> Result<(), Duration> {
        let mut overdraft = self.overdraft.lock();
        let burst = u64::from(self.per_minute.get());
        while *overdraft > 0 {
            let chunk = (*overdraft).min(burst);
            let cells = NonZeroU32::new(chunk as u32).unwrap_or(NonZeroU32::MIN);
            match self.limiter.check_n(cells) {
                Ok(Ok(())) => *overdraft -= chunk,
                Ok(Err(not_until)) => {
                    let now = self.limiter.clock().now();
                    let per_token = Duration::from_secs(60) / self.per_minute.get();
                    let rest = u32::try_from(*overdraft - chunk).unwrap_or(u32::MAX);
                    return Err(not_until.wait_time_from(now) + per_token.saturating_mul(rest));
                }
                // `chunk` is at most the burst, so this cannot happen; wait
                // a minute rather than admit.
                Err(_) => return Err(Duration::from_secs(60)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
