//! How far each peer's wall clock seems from this replica's, read off its
//! load lane's reports, so that the load report riding on one of its
//! insert batches is judged by the sender's own clock.
//!
//! Why: a batch says when it was sent by its sender's clock (`sent_ms`),
//! and a report on a batch sent longer ago than the reports' expiry (a
//! batch caught up on after a reconnect, or sent again after its
//! sender's) is load gone by now. Compared with this replica's clock
//! alone, a peer whose clock is more than that behind had every such
//! report dropped, unseen by any metric or log. A load lane report is
//! never replayed nor sent again: it is read at most a period (and the
//! transit) after it went, so `now - sent_ms` there is the two clocks'
//! difference, give or take a period. That difference, taken off a
//! batch's age, leaves its age by the sender's clock: a report expires as
//! it did with the clocks in step, and a batch of minutes ago is still
//! minutes old.
//!
//! Concurrency: a `std` mutex, written by the lane's thread once per peer
//! report it reads and read by the insert feed once per batch that
//! carries a report; neither holds it across anything but a map lookup.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often one peer's skew is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// A peer not heard on the lane for this long is forgotten: it may have
/// been replaced by a process with a clock of its own.
const FORGET_AFTER: Duration = Duration::from_secs(120);

/// The most peers remembered (a forged sender may claim any number of
/// processes); past it those not heard for longest go.
const MAX_PEERS: usize = 256;

#[derive(Debug)]
struct PeerClock {
    /// This replica's clock minus the peer's, in ms, at the last report.
    offset_ms: i64,
    heard: Instant,
    warned: Option<Instant>,
}

/// Each peer process's apparent clock offset.
#[derive(Debug)]
pub(super) struct PeerClocks {
    peers: Mutex<HashMap<u64, PeerClock>>,
    /// An offset over this is logged: the skew the expiry tolerates and a
    /// period of the lane (how late a report may be read).
    warn_over_ms: u64,
}

impl PeerClocks {
    pub(super) fn new(warn_over_ms: u64) -> Self {
        Self {
            peers: Mutex::new(HashMap::new()),
            warn_over_ms,
        }
    }

    /// A report of process `instance` (replica `replica`), sent at
    /// `sent_ms` by its clock, read now (`now_ms` by this one's).
    pub(super) fn heard(&self, replica: &str, instance: u64, sent_ms: u64, now_ms: u64) {
        let offset_ms = clamped(i128::from(now_ms) - i128::from(sent_ms));
        let now = Instant::now();
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if peers.len() >= MAX_PEERS && !peers.contains_key(&instance) {
            peers.retain(|_, p| now.saturating_duration_since(p.heard) <= FORGET_AFTER);
            if peers.len() >= MAX_PEERS {
                peers.clear();
            }
        }
        let peer = peers.entry(instance).or_insert(PeerClock {
            offset_ms,
            heard: now,
            warned: None,
        });
        peer.offset_ms = offset_ms;
        peer.heard = now;
        if offset_ms.unsigned_abs() > self.warn_over_ms
            && peer
                .warned
                .is_none_or(|at| now.saturating_duration_since(at) >= WARN_EVERY)
        {
            peer.warned = Some(now);
            let way = if offset_ms > 0 { "behind" } else { "ahead of" };
            let by = offset_ms.unsigned_abs();
            tracing::warn!(
                peer = replica,
                instance,
                skew_ms = offset_ms,
                "replica sync: peer's wall clock seems {by} ms {way} this replica's (from its \
                 load reports); its batches' load reports are judged by its own clock, but \
                 check NTP on both: radixgate_sync_lag_seconds reads the skew too"
            );
        }
    }

    /// How long ago, by its sender's clock as far as it is known, a
    /// message of `instance` sent at `sent_ms` went (negative: a clock
    /// ahead, not known to be).
    pub(super) fn age_ms(&self, instance: u64, sent_ms: u64, now_ms: u64) -> i64 {
        let offset = self
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&instance)
            .map_or(0, |p| p.offset_ms);
        clamped(i128::from(now_ms) - i128::from(sent_ms) - i128::from(offset))
    }
}

/// `ms` within an `i64`. A message may say it was sent at any time up to
/// `u64::MAX` ms (a broken or forged sender): differences of such times
/// overflowed, and panicked the thread that took them (debug builds; the
/// load lane's, or the insert feed's task); in release builds they
/// wrapped, a time far ahead read as one long past.
fn clamped(ms: i128) -> i64 {
    i64::try_from(ms).unwrap_or(if ms < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batchs_age_is_by_its_senders_clock_once_the_lane_heard_it() {
        let clocks = PeerClocks::new(1_100);
        let now = 1_000_000_000;
        // Not heard on the lane yet: this replica's clock.
        assert_eq!(clocks.age_ms(7, now - 10_000, now), 10_000);
        // Its clock is 10 s behind (its report read 50 ms late): a batch
        // it sent just now is about 0 ms old,
        // one of a minute ago by its clock still a minute old.
        clocks.heard("peer", 7, now - 10_050, now);
        assert_eq!(clocks.age_ms(7, now - 10_000, now), -50);
        assert_eq!(clocks.age_ms(7, now - 70_000, now), 59_950);
        // A clock ahead.
        clocks.heard("peer", 8, now + 5_000, now);
        assert_eq!(clocks.age_ms(8, now + 5_000, now), 0);
        // Other processes are not affected.
        assert_eq!(clocks.age_ms(9, now, now), 0);
    }

    #[test]
    fn times_no_clock_reads_are_taken_without_overflowing() {
        let clocks = PeerClocks::new(1_100);
        let now = 1_000_000_000;
        // Ahead of this clock by more than an i64 of ms: as far ahead as
        // can be said, not long past.
        clocks.heard("forged", 7, u64::MAX, now);
        assert_eq!(clocks.age_ms(7, 0, now), i64::MAX);
        clocks.heard("forged", 8, 1 << 63, now);
        assert_eq!(clocks.age_ms(8, 1 << 63, now), 0);
        clocks.heard("forged", 9, i64::MAX as u64, now);
        assert_eq!(clocks.age_ms(9, 0, now + 10), i64::MAX);
        // Not heard on the lane: this replica's clock.
        assert_eq!(clocks.age_ms(10, u64::MAX, now), i64::MIN);
        assert_eq!(clocks.age_ms(10, 0, now), now as i64);
    }

    #[test]
    fn peers_are_remembered_within_the_bound() {
        let clocks = PeerClocks::new(1_100);
        for i in 0..(3 * MAX_PEERS as u64) {
            clocks.heard("forged", i, 0, 1_000);
        }
        assert!(clocks.peers.lock().unwrap().len() <= MAX_PEERS);
    }
}
