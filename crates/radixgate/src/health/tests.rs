//! The probe schedule, to the millisecond, under tokio's paused clock: a
//! scripted worker answers its probes only inside given windows, and the
//! real loop ([`run`]) decides when to probe and what to report. If the
//! schedule changes, these fail; the README's "admitted within about 2.5 s
//! of coming up" is the bound checked by
//! `a_worker_is_admitted_within_2_5_s_of_coming_up`.

use super::*;
use std::ops::Range;
use tokio::time::Instant;

/// What the checker told the control task, and when.
#[derive(Debug, PartialEq)]
enum Report {
    Admit,
    Healthy(bool),
    /// Its models read again.
    Refresh,
}

/// A worker that answers probes only while the milliseconds since the start
/// fall in one of `up`, recording each probe's and report's instant.
struct Scripted {
    start: Instant,
    up: Vec<Range<u64>>,
    probes: Vec<u64>,
    reports: Vec<(u64, Report)>,
    /// What failing probes say, in turn; the last one repeats.
    problems: Vec<&'static str>,
    complaints: Vec<(u64, String)>,
    /// When requests ask for its models to be read again.
    rereads: Vec<u64>,
}

impl Scripted {
    fn new(up: Vec<Range<u64>>) -> Self {
        Self {
            start: Instant::now(),
            up,
            probes: Vec::new(),
            reports: Vec::new(),
            problems: vec!["connection refused"],
            complaints: Vec::new(),
            rereads: Vec::new(),
        }
    }

    /// Down until `ms`, then up for good.
    fn up_from(ms: u64) -> Self {
        Self::new(std::iter::once(ms..u64::MAX).collect())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap()
    }

    fn admitted_at(&self) -> Option<u64> {
        self.reports
            .iter()
            .find(|(_, r)| *r == Report::Admit)
            .map(|(at, _)| *at)
    }
}

impl Watched for Scripted {
    async fn probe(&mut self) -> Result<(), String> {
        let now = self.now_ms();
        self.probes.push(now);
        if self.up.iter().any(|window| window.contains(&now)) {
            return Ok(());
        }
        let problem = if self.problems.len() > 1 {
            self.problems.remove(0)
        } else {
            self.problems[0]
        };
        Err(problem.to_owned())
    }

    fn complain(&mut self, complaint: &Complaint) {
        let now = self.now_ms();
        self.complaints.push((now, complaint.to_string()));
    }

    async fn admit(&mut self) -> Result<(), String> {
        let now = self.now_ms();
        self.reports.push((now, Report::Admit));
        Ok(())
    }

    async fn report(&mut self, healthy: bool) {
        let now = self.now_ms();
        self.reports.push((now, Report::Healthy(healthy)));
    }

    async fn refresh(&mut self) {
        let now = self.now_ms();
        self.reports.push((now, Report::Refresh));
    }

    async fn asked_to_reread(&self) {
        let now = self.now_ms();
        match self.rereads.iter().find(|&&at| at > now) {
            Some(&at) => {
                tokio::time::sleep_until(self.start + Duration::from_millis(at)).await;
            }
            None => std::future::pending().await,
        }
    }
}

/// Runs the default schedule against `worker` for `ms` of (paused) time.
async fn watch_for(worker: &mut Scripted, ms: u64) {
    let config = HealthConfig::default();
    let cancel = CancellationToken::new();
    let limit = Duration::from_millis(ms);
    let _ = tokio::time::timeout(limit, run(&config, &cancel, worker)).await;
}

/// The defaults every schedule below is written for: back-off 250 ms
/// doubling to 2 s, two passing probes to admit, three failing ones to
/// mark unhealthy, 10 s between probes of a healthy worker.
#[test]
fn the_schedules_are_for_these_defaults() {
    let c = HealthConfig::default();
    assert!(c.enabled);
    assert_eq!(
        (c.unhealthy_backoff_initial_ms, c.unhealthy_backoff_max_ms),
        (250, 2000)
    );
    assert_eq!((c.success_threshold, c.failure_threshold), (2, 3));
    assert_eq!(c.interval_secs, 10);
}

/// A healthy worker's models are read again at the first probe at least
/// `models_refresh_secs` (30 s) after they were last read (its admission,
/// its return), never while it is unhealthy.
#[tokio::test(start_paused = true)]
async fn a_healthy_workers_models_are_read_again_every_refresh_period() {
    // Up from the start, down from 45 s to 75 s, up again.
    let mut worker = Scripted::new(vec![0..45_000, 75_000..u64::MAX]);
    watch_for(&mut worker, 110_000).await;
    let at = |what: Report| -> Vec<u64> {
        let reports = worker.reports.iter();
        reports
            .filter(|(_, r)| *r == what)
            .map(|(at, _)| *at)
            .collect()
    };
    // Admitted at 250 ms (two probes); probed every 10 s from then; the
    // probes at 50.25, 60.25 and 70.25 s fail; back at 76.25 s.
    assert_eq!(at(Report::Admit), [250]);
    assert_eq!(at(Report::Healthy(false)), [70_250]);
    assert_eq!(at(Report::Healthy(true)), [76_250]);
    // At 30.25 s; none while it fails (due from 60.25 s), nor at its
    // return (read then); next 30 s after it.
    assert_eq!(at(Report::Refresh), [30_250, 106_250]);
    assert_eq!(HealthConfig::default().models_refresh_secs, 30);
}

/// A request that finds the worker not serving a model it is listed with
/// has its models read again at once, but a second within a second of the
/// last read waits for that second; the next read a request did not ask
/// for is `models_refresh_secs` after the last. Asked while unhealthy,
/// nothing is read (the worker's return reads them).
#[tokio::test(start_paused = true)]
async fn a_workers_models_are_read_again_when_a_request_asks() {
    let mut worker = Scripted::new(vec![0..20_000, 60_000..u64::MAX]);
    worker.rereads = vec![5_000, 5_300, 50_000];
    watch_for(&mut worker, 100_000).await;
    let refreshed: Vec<u64> = (worker.reports.iter())
        .filter(|(_, r)| *r == Report::Refresh)
        .map(|(at, _)| *at)
        .collect();
    // Admitted at 250 ms; the probes from 26 s fail, unhealthy at 46 s,
    // back at 62 s (read then); 30 s on.
    assert_eq!(refreshed[..2], [5_000, 6_000]);
    assert!(!refreshed.iter().any(|at| (20_000..62_000).contains(at)));
    let back = (worker.reports.iter())
        .find(|(_, r)| *r == Report::Healthy(true))
        .map(|(at, _)| *at)
        .unwrap();
    assert_eq!(refreshed[2..], [back + 30_000]);
    // Probed at each read asked for, else every 10 s.
    assert_eq!(worker.probes[..5], [0, 250, 5_000, 6_000, 16_000]);
}

/// With health checks off, a worker is admitted once and never probed;
/// a request that finds it not serving a model it is listed with still
/// has its models read again (not more often than `REREAD_AFTER`).
/// Before, its checker had returned at admission: nothing read the
/// models again, so every request for the model was sent to the worker
/// first and turned away, for as long as the router ran.
#[tokio::test(start_paused = true)]
async fn with_health_checks_off_a_workers_models_are_read_again_when_asked() {
    let mut worker = Scripted::up_from(0);
    worker.rereads = vec![5_000, 5_300, 50_000];
    let config = HealthConfig {
        enabled: false,
        ..HealthConfig::default()
    };
    let cancel = CancellationToken::new();
    let limit = Duration::from_millis(100_000);
    let _ = tokio::time::timeout(limit, run(&config, &cancel, &mut worker)).await;
    assert!(worker.probes.is_empty(), "{:?}", worker.probes);
    assert_eq!(worker.reports[0], (0, Report::Admit));
    let refreshed: Vec<u64> = (worker.reports.iter())
        .filter(|(_, r)| *r == Report::Refresh)
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(refreshed, [5_000, 6_000, 50_000]);
}

#[tokio::test(start_paused = true)]
async fn a_worker_down_at_start_is_probed_with_backoff_then_admitted() {
    let mut worker = Scripted::up_from(5_000);
    watch_for(&mut worker, 17_000).await;
    // Down: 250, 500, 1000, 2000, 2000 ms apart. Up at 5 s: the probe at
    // 5.75 s passes, one more 250 ms later confirms it, then every 10 s.
    assert_eq!(
        worker.probes,
        [0, 250, 750, 1_750, 3_750, 5_750, 6_000, 16_000]
    );
    assert_eq!(worker.reports, [(6_000, Report::Admit)]);
}

#[tokio::test(start_paused = true)]
async fn a_worker_is_admitted_within_2_5_s_of_coming_up() {
    // The longest wait is the full back-off (2 s) to the first passing probe,
    // plus (success_threshold - 1) confirmations 250 ms apart: 2.25 s.
    let bound = 2_250;
    let mut worst = 0;
    // A step coprime with the schedule's, so the worker comes up at every
    // phase of it, including just after a failed probe.
    for up_at in (0..12_000).step_by(7) {
        let mut worker = Scripted::up_from(up_at);
        watch_for(&mut worker, up_at + 2_600).await;
        let admitted = worker
            .admitted_at()
            .unwrap_or_else(|| panic!("up at {up_at} ms: never admitted"));
        assert!(admitted >= up_at, "admitted before it answered");
        let delay = admitted - up_at;
        assert!(
            delay <= bound,
            "up at {up_at} ms: admitted {delay} ms later"
        );
        worst = worst.max(delay);
    }
    assert!(worst > bound - 50, "the worst case was {worst} ms");
    assert!(worst <= 2_500, "the README promises about 2.5 s");
}

#[tokio::test(start_paused = true)]
async fn a_failing_worker_is_marked_unhealthy_then_back_within_the_backoff() {
    let mut worker = Scripted::new(vec![0..25_000, 60_000..u64::MAX]);
    watch_for(&mut worker, 75_000).await;
    assert_eq!(
        worker.probes,
        [
            0, 250, // two passes: admitted
            10_250, 20_250, // healthy: every 10 s
            30_250, 40_250, 50_250, // three failures: unhealthy
            50_500, 51_000, 52_000, 54_000, 56_000, 58_000, // back-off from 250 ms
            60_000, 60_250, // two passes: healthy again
            70_250,
        ]
    );
    assert_eq!(
        worker.reports,
        [
            (250, Report::Admit),
            (50_250, Report::Healthy(false)),
            (60_250, Report::Healthy(true)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_pending_worker_is_reported_at_once_then_once_a_minute() {
    let mut worker = Scripted::up_from(150_000);
    watch_for(&mut worker, 153_000).await;
    // Probes at 0, 250, 750, 1750, 3750 then every 2 s: the complaint at
    // the first failure, then at the first probe a minute after each.
    let retry = "(retrying every 2 s)";
    assert_eq!(
        worker.complaints,
        [
            (0, format!("not reachable: connection refused {retry}")),
            (
                61_750,
                format!("still not reachable after 34 probes: connection refused {retry}")
            ),
            (
                121_750,
                format!("still not reachable after 64 probes: connection refused {retry}")
            ),
        ]
    );
    assert_eq!(worker.admitted_at(), Some(152_000));
}

#[tokio::test(start_paused = true)]
async fn a_new_cause_is_reported_at_once() {
    let mut worker = Scripted::up_from(u64::MAX);
    worker.problems = vec![
        "connection refused",
        "connection refused",
        "health check /health answered 503 Service Unavailable",
    ];
    watch_for(&mut worker, 5_000).await;
    let said: Vec<_> = worker.complaints.iter().map(|(at, _)| *at).collect();
    assert_eq!(said, [0, 750], "{:?}", worker.complaints);
    assert!(worker.complaints[1].1.contains("answered 503"));
}

#[tokio::test(start_paused = true)]
async fn an_admitted_worker_is_reported_when_marked_unhealthy_and_not_before() {
    let mut worker = Scripted::new(vec![0..25_000, 60_000..u64::MAX]);
    watch_for(&mut worker, 75_000).await;
    // The failures at 30.25 s and 40.25 s leave it in rotation: no word.
    // The third takes it out; it is back at 60.25 s, under the minute.
    assert_eq!(
        worker.complaints,
        [(
            50_250,
            "is unhealthy, out of rotation after 3 failed health checks: \
             connection refused (retrying every 2 s)"
                .to_owned()
        )]
    );
}

#[test]
fn a_retry_interval_under_a_second_reads_in_milliseconds() {
    let complaint = Complaint {
        repeat: false,
        admitted: false,
        failures: 1,
        problem: "no answer within 5 s".to_owned(),
        retry: Duration::from_millis(500),
    };
    assert_eq!(
        complaint.to_string(),
        "not reachable: no answer within 5 s (retrying every 500 ms)"
    );
}

#[test]
fn vllm_reports_its_cache_as_blocks_of_a_size() {
    let page = "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
                # TYPE vllm:cache_config_info gauge\n\
                vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",num_gpu_blocks=\"27000\",swap_space_bytes=\"4294967296\"} 1.0\n";
    assert_eq!(super::vllm_cache_tokens(page), Some(432_000));
    for bad in [
        "",
        "vllm:num_requests_running{model_name=\"m\"} 0.0\n",
        "vllm:cache_config_info{block_size=\"16\"} 1.0\n",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1.0\n",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"0\"} 1.0\n",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"-3\"} 1.0\n",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"99999999999999999999\"} 1.0\n",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"5\" 1.0\n",
    ] {
        assert_eq!(super::vllm_cache_tokens(bad), None, "{bad}");
    }
}
