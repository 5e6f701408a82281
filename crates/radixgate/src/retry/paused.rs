//! Workers that asked for a pause: a worker that answers 429 or 503 with
//! `Retry-After` says when it takes requests again (an engine shedding a
//! burst, an OpenAI-compatible server over its quota, a proxy in front of
//! a pool that is draining). Neither counts on its breaker (a 429 never
//! does, see `proxy::attempt::busy`), so without this the worker was
//! chosen again by the next request, and each of them paid a refused
//! attempt and a back-off before its retry.
//!
//! Until the time it named, at most `retry.max_retry_after_secs`, the
//! worker is left out of the choice while another worker can take the
//! request; when none can, it is chosen as before (a pause never makes a
//! model unavailable). Nothing is looked up while no worker is paused.

use axum::http::{HeaderValue, StatusCode};
use radixgate_routing::WorkerId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// The most workers held at once; the pause that ends first goes when
/// another would not fit (a pool of more workers than this each pausing
/// at once is still served: a worker left out of the set is only chosen
/// again sooner).
const MAX_PAUSED: usize = 4096;

/// The workers pausing now, each with the instant its pause ends.
#[derive(Debug, Default)]
pub(crate) struct Paused {
    held: parking_lot::Mutex<Vec<(WorkerId, Instant)>>,
    any: AtomicBool,
}

impl Paused {
    /// Takes a worker's answer `status` with its `Retry-After` header:
    /// a 429 or 503 that names a wait pauses the worker for it, at most
    /// `max`. Returns the pause when it begins one (the worker was not
    /// pausing); a worker paused already keeps the later end.
    pub(crate) fn answered(
        &self,
        worker: WorkerId,
        status: StatusCode,
        retry_after: Option<&HeaderValue>,
        max: Duration,
        now: Instant,
    ) -> Option<Duration> {
        if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
            return None;
        }
        let wait = wait(retry_after?, SystemTime::now())?.min(max);
        if wait.is_zero() {
            return None;
        }
        let until = now + wait;
        let mut held = self.held.lock();
        held.retain(|&(_, end)| end > now);
        match held.iter_mut().find(|(id, _)| *id == worker) {
            Some((_, end)) => {
                *end = (*end).max(until);
                return None;
            }
            None => {
                if held.len() >= MAX_PAUSED
                    && let Some(first) = (0..held.len()).min_by_key(|&i| held[i].1)
                {
                    held.swap_remove(first);
                }
                held.push((worker, until));
            }
        }
        self.any.store(true, Ordering::Release);
        Some(wait)
    }

    /// `tried` and the workers pausing at `now` not in it: the workers a
    /// choice should leave out while another can take the request. `None`
    /// when no worker pauses beyond `tried`, so the caller's choice is
    /// the one it would make anyway.
    pub(crate) fn avoid(&self, tried: &[WorkerId], now: Instant) -> Option<Vec<WorkerId>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let mut held = self.held.lock();
        held.retain(|&(_, end)| end > now);
        self.any.store(!held.is_empty(), Ordering::Release);
        let mut avoid: Option<Vec<WorkerId>> = None;
        for &(id, _) in held.iter() {
            if !tried.contains(&id) {
                avoid.get_or_insert_with(|| tried.to_vec()).push(id);
            }
        }
        avoid
    }
}

/// The wait a `Retry-After` value names, read at `now`: whole seconds, or
/// an HTTP date (RFC 9110), a date past being no wait. Anything else names
/// none.
fn wait(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let date = httpdate::parse_http_date(text).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_secs(60);

    fn id(n: u32) -> WorkerId {
        WorkerId(n)
    }

    fn header(value: &'static str) -> HeaderValue {
        HeaderValue::from_static(value)
    }

    #[test]
    fn seconds_and_http_dates_are_read_and_anything_else_is_not() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(wait(&header("30"), now), Some(Duration::from_secs(30)));
        assert_eq!(wait(&header(" 7 "), now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        let later = HeaderValue::from_str(&later).unwrap();
        assert_eq!(wait(&later, now), Some(Duration::from_secs(90)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        let past = HeaderValue::from_str(&past).unwrap();
        assert_eq!(wait(&past, now), Some(Duration::ZERO));
        for bad in ["-1", "1.5", "soon", ""] {
            assert_eq!(wait(&header(bad), now), None, "{bad:?}");
        }
    }

    #[test]
    fn only_a_429_or_503_that_names_a_wait_pauses_its_worker_at_most_the_cap() {
        let paused = Paused::default();
        let now = Instant::now();
        let answered = |status, value: Option<&'static str>| {
            paused.answered(id(1), status, value.map(header).as_ref(), MAX, now)
        };
        assert_eq!(answered(StatusCode::TOO_MANY_REQUESTS, None), None);
        assert_eq!(answered(StatusCode::BAD_GATEWAY, Some("5")), None);
        assert_eq!(answered(StatusCode::TOO_MANY_REQUESTS, Some("0")), None);
        assert_eq!(paused.avoid(&[], now), None, "nothing paused so far");
        assert_eq!(
            answered(StatusCode::SERVICE_UNAVAILABLE, Some("3600")),
            Some(MAX)
        );
        assert_eq!(paused.avoid(&[], now), Some(vec![id(1)]));
        assert_eq!(paused.avoid(&[], now + MAX), None, "its pause is over");
    }

    #[test]
    fn the_avoided_are_the_tried_and_the_paused_once_each() {
        let paused = Paused::default();
        let now = Instant::now();
        let pause = |n, secs: &'static str| {
            paused.answered(
                id(n),
                StatusCode::TOO_MANY_REQUESTS,
                Some(&header(secs)),
                MAX,
                now,
            )
        };
        pause(2, "10");
        assert_eq!(pause(3, "20"), Some(Duration::from_secs(20)));
        // A shorter wait does not end a longer pause early, nor is it a
        // pause of its own.
        assert_eq!(pause(3, "1"), None);
        assert_eq!(paused.avoid(&[id(2)], now), Some(vec![id(2), id(3)]));
        assert_eq!(paused.avoid(&[id(2), id(3)], now), None);
        let later = now + Duration::from_secs(15);
        assert_eq!(paused.avoid(&[id(1)], later), Some(vec![id(1), id(3)]));
        assert_eq!(paused.avoid(&[], now + Duration::from_secs(20)), None);
    }
}
