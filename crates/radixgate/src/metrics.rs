//! Prometheus machinery shared by every component that records metrics:
//! the per-gateway recorder, metric families and their handle caches, and
//! the one text rendering of `/metrics`.
//!
//! Components own their metrics (the linkerd way): each declares its
//! metrics' names and help texts as [`Describe`] constants next to the code
//! that records them, and builds its family handles from the gateway's
//! [`Metrics`] when it is built — the request path in `proxy/metrics.rs`,
//! admission in `admission.rs`, breakers in `breaker/set.rs`, the worker
//! gauges in `upkeep.rs`, tenants in `tenants/metrics.rs`, outlier
//! detection in `outlier.rs`. This module knows none of them, so adding a
//! metric never touches it.
//!
//! Every [`Metrics`] owns its own recorder (from
//! `metrics-exporter-prometheus`) and its families record through it
//! directly; the process-global recorder is never installed, so several
//! gateways in one process (as in tests) keep separate numbers.
//!
//! Label cardinality is bounded by the callers: labels are `&'static str`
//! chosen by the code, HTTP codes, served models, or the URLs of
//! configured workers. Series of a removed worker go: its owner sets its
//! gauges to 0 when it is removed and [`Metrics::forget_worker`] drops its
//! cached handles (again at each touch, for series a request still running
//! on it records after that, until a worker is back at that URL; the last
//! 65,536 URLs are remembered), and the exporter forgets counters and gauges
//! nobody used for [`SERIES_IDLE`] (under pod churn the series would
//! otherwise grow with every pod address ever seen). Live series are kept by
//! [`Metrics::run_upkeep`], which marks every cached handle used (without
//! changing its value) every eighth of that time; a cached handle is never
//! left pointing at a series the exporter forgot.
//!
//! Histograms: the recorder fixes bucket bounds when it is built, so the
//! owner of a histogram declares it ([`HistogramSpec`]) to
//! [`Metrics::with_histograms`]; [`Metrics::histograms`] refuses an
//! undeclared one rather than silently export a summary. The recorder keeps
//! raw samples until they are folded into the buckets, which
//! [`Metrics::render`] and [`Metrics::run_upkeep`] do. Call `run_upkeep`
//! every few seconds (the gateway's housekeeping tick) so memory stays
//! bounded when nobody scrapes.
//!
//! Concurrency: each family's handles are cached per label combination
//! (`metrics/series.rs`), so recording an existing series takes one read
//! lock (a `parking_lot::RwLock`, short, never across `.await`) and an
//! atomic update; only the first use of a combination registers it with the
//! recorder. Rendering takes the recorder's internal locks briefly.

use ::metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit,
};
use hashbrown::Equivalent;
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use metrics_util::MetricKindMask;
use parking_lot::Mutex;
use radixgate_routing::WorkerId;
use series::{Cache, Series};
pub(crate) use series::{LabelKey, LabelRef};
pub use series::{SeriesKey, Touch};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long the exporter keeps a counter or gauge nobody used: a removed
/// worker's series stay this long (its gauges at 0), then go.
pub const SERIES_IDLE: Duration = Duration::from_secs(15 * 60);

mod series;

/// What a metric is: its name, unit and help text, declared by the
/// component that records it.
#[derive(Debug)]
pub struct Describe {
    /// The exported name.
    pub name: &'static str,
    /// The unit, if any (not appended to the name).
    pub unit: Option<Unit>,
    /// The `# HELP` text.
    pub help: &'static str,
}

impl Describe {
    /// A metric without a unit.
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            unit: None,
            help,
        }
    }

    /// A metric measured in seconds.
    pub const fn seconds(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            unit: Some(Unit::Seconds),
            help,
        }
    }
}

/// A histogram and its bucket upper bounds.
#[derive(Debug)]
pub struct HistogramSpec {
    /// Name, unit and help text.
    pub describe: Describe,
    /// Increasing upper bounds of the buckets (`+Inf` is added).
    pub buckets: &'static [f64],
}

/// Where recorded series come from; the exporter ignores it, but the
/// `Recorder` API asks for one.
static METADATA: Metadata<'static> = Metadata::new("radixgate", Level::INFO, Some(module_path!()));

/// One gateway's metrics: build families from it, serve [`render`](Self::render).
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    /// Names of the histograms given buckets at construction.
    histograms: Box<[&'static str]>,
    /// Every family's cache, to touch and to forget workers in.
    caches: Mutex<Vec<Weak<dyn Cache>>>,
    /// How long the exporter keeps an unused counter or gauge.
    idle: Duration,
    /// When the caches were last touched.
    touched: Mutex<Instant>,
    /// Removed workers' URLs: series recorded for them after they were
    /// forgotten (a request that was still running, say) are forgotten
    /// again at each touch, until the URL is in the pool again.
    retired: Mutex<Retired>,
}

/// The most removed workers' URLs kept (the oldest go first): a day of a
/// pod every couple of seconds.
const MAX_RETIRED: usize = 65_536;

/// Removed workers' URLs, oldest first.
#[derive(Debug, Default)]
struct Retired {
    urls: std::collections::HashSet<Box<str>>,
    order: std::collections::VecDeque<Box<str>>,
}

impl Retired {
    fn insert(&mut self, url: &str) {
        if self.urls.insert(url.into()) {
            self.order.push_back(url.into());
        }
        while self.urls.len() > MAX_RETIRED {
            match self.order.pop_front() {
                Some(oldest) => {
                    self.urls.remove(&oldest);
                }
                None => break,
            }
        }
    }

    fn remove(&mut self, url: &str) {
        if self.urls.remove(url) {
            self.order.retain(|u| &**u != url);
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("histograms", &self.histograms)
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// A fresh, independent set of metrics with no histograms.
    pub fn new() -> Self {
        Self::with_histograms(&[])
    }

    /// A fresh, independent set of metrics whose histograms are `specs`.
    ///
    /// # Panics
    /// If a spec has no buckets (they are constants: a programming error).
    pub fn with_histograms(specs: &[&'static HistogramSpec]) -> Self {
        Self::with_idle(specs, SERIES_IDLE)
    }

    /// [`with_histograms`](Self::with_histograms), with unused counters and
    /// gauges forgotten after `idle` instead of [`SERIES_IDLE`].
    pub(crate) fn with_idle(specs: &[&'static HistogramSpec], idle: Duration) -> Self {
        let mut builder = PrometheusBuilder::new()
            .idle_timeout(MetricKindMask::COUNTER | MetricKindMask::GAUGE, Some(idle));
        for spec in specs {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(spec.describe.name.into()), spec.buckets)
                .expect("bucket lists are non-empty constants");
        }
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        Self {
            recorder: Arc::new(recorder),
            handle,
            histograms: specs.iter().map(|s| s.describe.name).collect(),
            caches: Mutex::new(Vec::new()),
            idle,
            touched: Mutex::new(Instant::now()),
            retired: Mutex::new(Retired::default()),
        }
    }

    fn family<K: FamilyKey, H>(&self, name: &'static str) -> Family<K, H>
    where
        H: Touch + Send + Sync + 'static,
    {
        let series = Arc::new(Series::new());
        let weak: Weak<dyn Cache> = Arc::downgrade(&series) as Weak<dyn Cache>;
        self.caches.lock().push(weak);
        Family {
            recorder: self.recorder.clone(),
            name,
            series,
        }
    }

    /// Forgets the cached series labelled with a removed worker's URL:
    /// the exporter drops them once unused for the idle time (their owners
    /// have set the gauges to 0). Series recorded for it later are
    /// forgotten again at each touch, until it is added back
    /// ([`revive_worker`](Self::revive_worker)). Returns how many were
    /// forgotten now.
    pub fn forget_worker(&self, url: &str) -> usize {
        self.retired.lock().insert(url);
        let one: std::collections::HashSet<Box<str>> = [url.into()].into();
        self.live_caches().iter().map(|c| c.forget(&one)).sum()
    }

    /// A worker at `url` is in the pool (again): its series are kept.
    pub fn revive_worker(&self, url: &str) {
        self.retired.lock().remove(url);
    }

    /// The caches of the families still alive (dropping the others).
    fn live_caches(&self) -> Vec<Arc<dyn Cache>> {
        let mut caches = self.caches.lock();
        let live: Vec<Arc<dyn Cache>> = caches.iter().filter_map(Weak::upgrade).collect();
        caches.retain(|c| c.strong_count() > 0);
        live
    }

    /// A counter family, described by `describe`.
    pub fn counters<K: FamilyKey>(&self, describe: &'static Describe) -> Family<K, Counter> {
        self.recorder
            .describe_counter(key_name(describe), describe.unit, help(describe));
        self.family(describe.name)
    }

    /// A family of [`SaturatingCounter`]s, described by `describe`.
    pub fn saturating_counters<K: FamilyKey>(
        &self,
        describe: &'static Describe,
    ) -> Family<K, SaturatingCounter> {
        self.recorder
            .describe_counter(key_name(describe), describe.unit, help(describe));
        self.family(describe.name)
    }

    /// A gauge family, described by `describe`.
    pub fn gauges<K: FamilyKey>(&self, describe: &'static Describe) -> Family<K, Gauge> {
        self.recorder
            .describe_gauge(key_name(describe), describe.unit, help(describe));
        self.family(describe.name)
    }

    /// A histogram family with the buckets of `spec`.
    ///
    /// # Panics
    /// If `spec` was not given to [`with_histograms`](Self::with_histograms):
    /// its samples would be exported as a summary, not in its buckets.
    pub fn histograms<K: FamilyKey>(&self, spec: &'static HistogramSpec) -> Family<K, Histogram> {
        let describe = &spec.describe;
        assert!(
            self.histograms.contains(&describe.name),
            "histogram {} was not declared to Metrics::with_histograms",
            describe.name
        );
        self.recorder
            .describe_histogram(key_name(describe), describe.unit, help(describe));
        self.family(describe.name)
    }

    /// A counter labelled by one value the code chooses, under `label`.
    pub fn labelled_counters(
        &self,
        describe: &'static Describe,
        label: &'static str,
    ) -> LabelledCounters {
        LabelledCounters {
            family: self.counters(describe),
            label,
        }
    }

    /// One series per worker, labelled `worker`.
    pub fn per_worker_gauges(&self, describe: &'static Describe) -> PerWorker<Gauge> {
        PerWorker(self.gauges(describe))
    }

    /// One counter per worker, labelled `worker`.
    pub fn per_worker_counters(&self, describe: &'static Describe) -> PerWorker<Counter> {
        PerWorker(self.counters(describe))
    }

    /// One counter per worker, labelled `worker`, following a total the
    /// worker keeps ([`WorkerTotal`]).
    pub fn per_worker_totals(&self, describe: &'static Describe) -> PerWorker<WorkerTotal> {
        self.recorder
            .describe_counter(key_name(describe), describe.unit, help(describe));
        PerWorker(self.family(describe.name))
    }

    /// A counter without labels, exported (at 0) from the start.
    pub fn counter(&self, describe: &'static Describe) -> OneCounter {
        let c = OneCounter(self.counters(describe));
        c.add(0);
        c
    }

    /// A gauge without labels, exported from its first [`set`](OneGauge::set).
    pub fn gauge(&self, describe: &'static Describe) -> OneGauge {
        OneGauge(self.gauges(describe))
    }

    /// Folds recorded histogram samples into their buckets, and every
    /// eighth of the idle time marks every cached series used; call it
    /// every few seconds so memory stays bounded between scrapes and no
    /// live series is forgotten.
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
        {
            let mut touched = self.touched.lock();
            if touched.elapsed() < self.idle / 8 {
                return;
            }
            *touched = Instant::now();
        }
        let retired = self.retired.lock().urls.clone();
        for cache in self.live_caches() {
            cache.forget(&retired);
            cache.touch();
        }
    }

    /// Everything, in the Prometheus text exposition format (with `# HELP`
    /// and `# TYPE` lines), for `GET /metrics`.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn key_name(describe: &'static Describe) -> KeyName {
    KeyName::from_const_str(describe.name)
}

fn help(describe: &'static Describe) -> SharedString {
    SharedString::const_str(describe.help)
}

/// What label values of a family are: hashed, compared, and read for a
/// worker's URL ([`SeriesKey`]).
pub trait FamilyKey: Hash + Eq + SeriesKey + Send + Sync + 'static {}

impl<K: Hash + Eq + SeriesKey + Send + Sync + 'static> FamilyKey for K {}

/// A handle kind the recorder registers by key.
pub trait Register: Sized {
    /// The handle of `key`, registered on first use.
    fn register(recorder: &PrometheusRecorder, key: &Key) -> Self;
}

impl Register for Counter {
    fn register(recorder: &PrometheusRecorder, key: &Key) -> Self {
        recorder.register_counter(key, &METADATA)
    }
}

impl Register for Gauge {
    fn register(recorder: &PrometheusRecorder, key: &Key) -> Self {
        recorder.register_gauge(key, &METADATA)
    }
}

impl Register for Histogram {
    fn register(recorder: &PrometheusRecorder, key: &Key) -> Self {
        recorder.register_histogram(key, &METADATA)
    }
}

/// The series of one metric, with their handles cached by label values `K`.
#[derive(Debug)]
pub struct Family<K, H> {
    recorder: Arc<PrometheusRecorder>,
    name: &'static str,
    series: Arc<Series<K, H>>,
}

impl<K: Hash + Eq, H: Register> Family<K, H> {
    /// Runs `f` on the handle of the series `key`; the first time, registers
    /// it with the labels `labels()` (in that order) and stores it under
    /// `owned()`.
    pub fn with<Q, R>(
        &self,
        key: &Q,
        owned: impl FnOnce() -> K,
        labels: impl FnOnce() -> Vec<Label>,
        f: impl FnOnce(&H) -> R,
    ) -> R
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.series.with(
            key,
            owned,
            || H::register(&self.recorder, &Key::from_parts(self.name, labels())),
            f,
        )
    }
}

/// Counters labelled by one value the code chooses (a reason, a branch).
#[derive(Debug)]
pub struct LabelledCounters {
    family: Family<&'static str, Counter>,
    label: &'static str,
}

impl LabelledCounters {
    /// Adds one to the series labelled `value`.
    pub fn increment(&self, value: &'static str) {
        self.add(value, 1);
    }

    /// Adds `n` to the series labelled `value`.
    pub fn add(&self, value: &'static str, n: u64) {
        self.family.with(
            &value,
            || value,
            || vec![Label::from_static_parts(self.label, value)],
            |c| c.increment(n),
        );
    }
}

/// One series per worker, labelled `worker` with the worker's URL.
#[derive(Debug)]
pub struct PerWorker<H>(Family<Box<str>, H>);

impl<H: Register> PerWorker<H> {
    /// Runs `f` on the worker's handle.
    pub fn with<R>(&self, worker: &str, f: impl FnOnce(&H) -> R) -> R {
        self.0
            .with(worker, || worker.into(), || vec![worker_label(worker)], f)
    }
}

impl PerWorker<Gauge> {
    /// Sets the worker's gauge.
    pub fn set(&self, worker: &str, value: f64) {
        self.with(worker, |g| g.set(value));
    }
}

/// A counter of amounts that come from outside (a worker's token counts),
/// which may add up past `u64::MAX`: it stays there. The recorder's own
/// counter adds wrapping, so the sum is kept here, added saturating, and
/// the counter set to it.
#[derive(Debug)]
pub struct SaturatingCounter {
    sum: AtomicU64,
    counter: Counter,
}

impl SaturatingCounter {
    /// Adds `n`, up to `u64::MAX`.
    pub fn add(&self, n: u64) {
        let before = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |sum| {
                Some(sum.saturating_add(n))
            })
            .unwrap_or(u64::MAX);
        // `absolute` keeps the larger value, so concurrent adds that set it
        // out of order leave the latest sum.
        self.counter.absolute(before.saturating_add(n));
    }
}

impl Register for SaturatingCounter {
    fn register(recorder: &PrometheusRecorder, key: &Key) -> Self {
        Self {
            sum: AtomicU64::new(0),
            counter: Counter::register(recorder, key),
        }
    }
}

impl Touch for SaturatingCounter {
    fn touch(&self) {
        self.counter.touch();
    }
}

/// A per-worker counter that follows a running total the worker keeps
/// itself (its breaker's state changes, its cached-token reports), each
/// total published again on every upkeep tick ([`Self::follow`]).
///
/// The series is the URL's, the total the worker's: a worker removed and
/// added back at its URL (a restarted pod, DELETE then POST /workers) is a
/// new worker whose totals start at 0, while its URL's series lives on for
/// [`SERIES_IDLE`]. Setting the counter to the total would not do: the
/// exporter keeps the larger value (`absolute`), so the new worker's counts
/// would not show until they passed the old one's. Each publish adds
/// instead what the total grew since the same worker's last one.
///
/// The lock (a `parking_lot::Mutex`) is held for a comparison and a store.
#[derive(Debug)]
pub struct WorkerTotal {
    counter: Counter,
    /// The worker last published, and its total then.
    last: Mutex<Option<(WorkerId, u64)>>,
}

impl WorkerTotal {
    /// Publishes `worker`'s running total, which never goes down for one
    /// worker: the counter gains what it grew since that worker's last
    /// publish, or all of it for a worker not published here before.
    pub fn follow(&self, worker: WorkerId, total: u64) {
        let before = {
            let mut last = self.last.lock();
            let before = match *last {
                Some((id, seen)) if id == worker => seen,
                _ => 0,
            };
            *last = Some((worker, total));
            before
        };
        self.counter.increment(total.saturating_sub(before));
    }
}

impl Register for WorkerTotal {
    fn register(recorder: &PrometheusRecorder, key: &Key) -> Self {
        Self {
            counter: Counter::register(recorder, key),
            last: Mutex::new(None),
        }
    }
}

impl Touch for WorkerTotal {
    fn touch(&self) {
        self.counter.touch();
    }
}

/// A counter without labels ([`Metrics::counter`]).
#[derive(Debug)]
pub struct OneCounter(Family<(), Counter>);

impl OneCounter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.with(&(), || (), Vec::new, |c| c.increment(n));
    }
}

/// A gauge without labels. It is registered (and so exported) on its first
/// [`set`](Self::set), not when it is built.
#[derive(Debug)]
pub struct OneGauge(Family<(), Gauge>);

impl OneGauge {
    /// Sets the gauge.
    pub fn set(&self, value: f64) {
        self.0.with(&(), || (), Vec::new, |g| g.set(value));
    }
}

/// The `worker` label, shared by every per-worker series.
pub fn worker_label(worker: &str) -> Label {
    Label::new("worker", worker.to_owned())
}

/// An HTTP status as a `status` label value, without allocating for the
/// common codes.
pub fn status_label(status: u16) -> SharedString {
    let common = match status {
        200 => "200",
        204 => "204",
        400 => "400",
        401 => "401",
        404 => "404",
        408 => "408",
        413 => "413",
        429 => "429",
        499 => "499",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        other => return SharedString::from(other.to_string()),
    };
    SharedString::const_str(common)
}

#[cfg(test)]
mod tests;
