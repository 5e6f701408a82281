//! The periodic eviction task: a thin timer around [`Policy::evict_now`].
//!
//! The eviction work itself is synchronous and lives in the policy, so the
//! offline simulator calls `evict_now` at simulated times and tests call it
//! directly. This task is the gateway's wrapper: tokio's interval (so tests
//! drive it with `tokio::time::pause`), stopped by a `CancellationToken`.

use crate::Policy;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// Spawns the background eviction task for `policy`, or returns `None` if the
/// policy has no eviction interval (not cache-aware, or the interval is 0).
/// The task ends when `cancel` is cancelled; await the handle to join it.
/// Must be called inside a tokio runtime.
pub fn spawn_eviction(
    policy: Arc<dyn Policy>,
    cancel: CancellationToken,
) -> Option<JoinHandle<()>> {
    let period = policy.eviction_interval()?;
    Some(tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = ticks.tick() => {
                    // A pass takes each tree's write lock and walks its LRU
                    // logs: CPU work that must not stall a runtime thread.
                    let pass = policy.clone();
                    match tokio::task::spawn_blocking(move || pass.evict_now()).await {
                        Ok(evicted) => {
                            tracing::debug!(policy = policy.name(), evicted, "tree eviction pass");
                        }
                        Err(e) => tracing::error!(policy = policy.name(), error = %e, "tree eviction pass failed"),
                    }
                }
            }
        }
    }))
}
