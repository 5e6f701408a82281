//! The sampler task: parked until the data endpoint is read, then one
//! reading a step (`history.rs` does the arithmetic) until nobody has read
//! for [`IDLE_AFTER`](super::IDLE_AFTER), when it drops its history and
//! parks again. It runs on the gateway's main runtime, not on a serving
//! thread, so a reading never delays a request.

use super::history::{History, Reading, STEP_SECS, WorkerReading};
use super::prom::Scrape;
use crate::state::Shared;
use hashbrown::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a reading waits for the control task's worker list.
const LIST_WAIT: Duration = Duration::from_secs(1);

/// Runs until `stop` is cancelled.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let dashboard = &shared.dashboard;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = dashboard.wake.notified() => {}
        }
        let mut history = History::default();
        let mut ticks = tokio::time::interval(Duration::from_secs(STEP_SECS));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            if dashboard.idle() {
                break;
            }
            let Some(reading) = read(&shared).await else {
                continue;
            };
            match history.push(reading) {
                Ok(body) => {
                    dashboard.latest.send_replace(Some(body.into()));
                }
                Err(err) => tracing::warn!(%err, "dashboard: cannot serialise a reading"),
            }
        }
        dashboard.latest.send_replace(None);
        dashboard.recent.clear();
        tracing::debug!("dashboard: nobody watches; sampler parked");
    }
}

/// One reading of the gateway; `None` when the control task did not
/// answer in time (the step is skipped).
async fn read(shared: &Shared) -> Option<Reading> {
    let list = tokio::time::timeout(LIST_WAIT, shared.control.list())
        .await
        .ok()?;
    let snapshot = shared.router.snapshot();
    let policy = shared.router.policy();
    let by_id: HashMap<String, &Arc<radixgate_routing::Worker>> = snapshot
        .workers()
        .iter()
        .map(|w| (w.id().to_string(), w))
        .collect();
    let mut workers: Vec<WorkerReading> = list
        .into_iter()
        .map(|status| {
            let admitted = status.id.as_ref().and_then(|id| by_id.get(id));
            let truth = admitted.map(|w| w.cache_truth().snapshot());
            WorkerReading {
                url: admitted.map_or(status.url, |w| w.url().to_owned()),
                name: status.name,
                role: status.role.as_str(),
                id: status.id,
                state: status.state,
                // A draining worker is out of the snapshot: the listing
                // has its state.
                breaker: admitted
                    .map(|w| w.breaker().as_str())
                    .or(status.breaker)
                    .unwrap_or("closed"),
                ejected: admitted
                    .map(|w| w.is_ejected())
                    .or(status.ejected)
                    .unwrap_or(false),
                in_flight: status.load,
                processed: status.processed,
                tree_chars: admitted.and_then(|w| shared.router.cached_chars(w)),
                prompt_tokens: truth.map_or(0, |t| t.prompt_tokens),
                reported_tokens: truth.map_or(0, |t| t.reported_tokens),
            }
        })
        .collect();
    workers.sort_by(|a, b| by_number(&a.name, &b.name).then_with(|| by_number(&a.url, &b.url)));
    let scrape = Scrape::read(&shared.metrics.render());
    let (recent, predicted) = shared.dashboard.recent.drain();
    Some(Reading {
        at_ms: super::unix_ms(),
        mono_ms: shared.dashboard.now_ms(),
        policy: policy.name(),
        decode_policy: shared
            .config
            .pd
            .enabled
            .then(|| shared.router.decode_policy().name()),
        uptime_secs: shared.started.elapsed().as_secs(),
        scrape,
        workers,
        predicted,
        recent,
    })
}

/// Orders names as people read them: runs of digits by their value, so
/// `w9` comes before `w10` and `host:9000` before `host:10000`, and the
/// rest as text.
fn by_number(a: &str, b: &str) -> std::cmp::Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return std::cmp::Ordering::Equal,
            (None, Some(_)) => return std::cmp::Ordering::Less,
            (Some(_), None) => return std::cmp::Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let run = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
                let (m, n) = (run(a), run(b));
                let (da, db) = (&a[..m], &b[..n]);
                // Leading zeros aside, a longer run is a larger number.
                let (ta, tb) = (trim_zeros(da), trim_zeros(db));
                let order = ta
                    .len()
                    .cmp(&tb.len())
                    .then_with(|| ta.cmp(tb))
                    .then_with(|| m.cmp(&n));
                if order.is_ne() {
                    return order;
                }
                (a, b) = (&a[m..], &b[n..]);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                (a, b) = (&a[1..], &b[1..]);
            }
        }
    }
}

/// A run of digits without its leading zeros.
fn trim_zeros(digits: &[u8]) -> &[u8] {
    let zeros = digits.iter().take_while(|&&c| c == b'0').count();
    &digits[zeros..]
}

#[cfg(test)]
mod tests {
    use super::by_number;

    #[test]
    fn names_with_numbers_sort_by_their_value() {
        let mut names = vec![
            "w10",
            "w9",
            "127.0.0.1:10000",
            "127.0.0.1:9000",
            "w09",
            "a",
            "w",
        ];
        names.sort_by(|a, b| by_number(a, b));
        assert_eq!(
            names,
            [
                "127.0.0.1:9000",
                "127.0.0.1:10000",
                "a",
                "w",
                "w9",
                "w09",
                "w10"
            ]
        );
    }
}
