//! The prefill side: KV held per room (SGLang) or transfer id (vLLM), and
//! the pull endpoint `GET /kv/{room}` decode workers long-poll.
//!
//! A room is registered when its prefill request is accepted (pending),
//! marked ready with its token count when the prefill finishes, or failed
//! when the request fails or its client goes away. A pull waits until the
//! room is ready or failed, at most the hold timeout, then answers
//! `{"room", "tokens", "bytes", "worker"}` (the KV has moved: a second
//! pull gets a 404 at once), a 500 naming the failure, or a 404 for a room
//! that never became ready (unknown, dropped by the `drop_transfers`
//! fault, expired).
//! Ready KV that nobody pulls is released after the hold timeout; a room
//! the drop fault left pending likewise.
//!
//! The KV itself stays in the engine as any finished request's cache does
//! (unpinned): the hold is of the room, not of pages.
//!
//! Concurrency: the rooms sit behind one `parking_lot` mutex (critical
//! sections are map operations, never across an `.await`); every change
//! bumps a `watch` counter, which waiting pulls subscribe to before they
//! look, so none misses the change it waits for.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Role;
use crate::error::{SimError, TransferFailure};
use crate::server::{WorkerState, error_response};

#[derive(Debug)]
enum Held {
    /// The prefill is computing.
    Pending,
    /// The prefill finished but its KV is never marked ready (fault).
    Dropped(Instant),
    /// Ready to pull: the prompt's tokens.
    Ready(usize, Instant),
    /// Pulled: the KV has moved (a second pull is answered at once).
    Taken(Instant),
    /// The prefill failed.
    Failed(String, Instant),
}

#[derive(Default)]
struct Inner {
    rooms: HashMap<String, Held>,
}

/// The rooms of one prefill worker.
pub(crate) struct Rooms {
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
    hold: Duration,
}

impl Rooms {
    /// No rooms; ready KV is held for `hold`.
    pub(crate) fn new(hold: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            changed: watch::channel(0).0,
            hold,
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Forgets rooms whose hold has run out.
    fn sweep(&self, inner: &mut Inner, now: Instant) {
        let hold = self.hold;
        inner.rooms.retain(|_, s| match s {
            Held::Pending => true,
            Held::Dropped(t) | Held::Ready(_, t) | Held::Taken(t) | Held::Failed(_, t) => {
                now.duration_since(*t) < hold
            }
        });
    }

    fn set(&self, key: &str, state: Held) {
        {
            let mut inner = self.inner.lock();
            if let Some(s) = inner.rooms.get_mut(key) {
                *s = state;
            }
        }
        self.bump();
    }

    /// Registers `key` as computing; a room already in use is the client's
    /// error.
    pub(crate) fn begin(state: &Arc<WorkerState>, key: String) -> Result<RoomGuard, SimError> {
        let rooms = &state.rooms;
        {
            let mut inner = rooms.inner.lock();
            rooms.sweep(&mut inner, Instant::now());
            if inner.rooms.contains_key(&key) {
                return Err(SimError::bad_request(
                    format!("bootstrap room {key} is already in use on this prefill worker"),
                    Some("bootstrap_room"),
                ));
            }
            inner.rooms.insert(key.clone(), Held::Pending);
        }
        rooms.bump();
        Ok(RoomGuard {
            state: state.clone(),
            key,
            settled: false,
        })
    }

    /// Waits for `key` to be ready (or failed), at most the hold timeout,
    /// and takes its token count.
    async fn take(&self, key: &str) -> Result<usize, SimError> {
        let deadline = Instant::now() + self.hold;
        let mut changes = self.changed.subscribe();
        loop {
            {
                let mut inner = self.inner.lock();
                self.sweep(&mut inner, Instant::now());
                let now = Instant::now();
                match inner.rooms.get(key) {
                    Some(Held::Ready(tokens, _)) => {
                        let tokens = *tokens;
                        inner.rooms.insert(key.to_owned(), Held::Taken(now));
                        return Ok(tokens);
                    }
                    Some(Held::Taken(_)) => {
                        return Err(SimError::KvTransfer {
                            room: key.to_owned(),
                            reason: "its KV was already pulled".into(),
                            failure: TransferFailure::NotFound,
                        });
                    }
                    Some(Held::Failed(why, _)) => {
                        let reason = format!("the prefill failed: {why}");
                        inner.rooms.remove(key);
                        return Err(SimError::KvTransfer {
                            room: key.to_owned(),
                            reason,
                            failure: TransferFailure::PrefillFailed,
                        });
                    }
                    Some(Held::Pending | Held::Dropped(_)) | None => {}
                }
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { break },
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        Err(SimError::KvTransfer {
            room: key.to_owned(),
            reason: format!(
                "no KV ready for it on this prefill worker within {} ms (unknown room, \
                 never marked ready, or released)",
                self.hold.as_millis()
            ),
            failure: TransferFailure::NotFound,
        })
    }
}

/// A room being computed: settle it with [`RoomGuard::ready`] or
/// [`RoomGuard::fail`]; dropped unsettled (the request was cancelled or
/// failed), it fails.
pub(crate) struct RoomGuard {
    state: Arc<WorkerState>,
    key: String,
    settled: bool,
}

impl RoomGuard {
    /// The room's key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The prefill finished with `tokens` prompt tokens: ready to pull,
    /// unless the `drop_transfers` fault draws this one.
    pub(crate) fn ready(mut self, tokens: usize) {
        self.settled = true;
        let now = Instant::now();
        let s = &self.state;
        if s.faults.draw_drop_transfer() {
            s.metrics.count(&s.metrics.kv_transfers_dropped, 1);
            s.rooms.set(&self.key, Held::Dropped(now));
        } else {
            s.rooms.set(&self.key, Held::Ready(tokens, now));
        }
    }

    /// The prefill failed.
    pub(crate) fn fail(mut self, why: &str) {
        self.settled = true;
        self.state
            .rooms
            .set(&self.key, Held::Failed(why.to_owned(), Instant::now()));
    }
}

impl Drop for RoomGuard {
    fn drop(&mut self) {
        if !self.settled {
            self.state.rooms.set(
                &self.key,
                Held::Failed("the prefill request was cancelled".into(), Instant::now()),
            );
        }
    }
}

/// `GET /kv/{room}`: the pull endpoint (prefill workers only).
pub(crate) async fn kv_handler(
    State(s): State<Arc<WorkerState>>,
    Path(key): Path<String>,
) -> Response {
    if s.config.pd.role != Role::Prefill {
        return error_response(&SimError::KvTransfer {
            room: key,
            reason: "this worker is not a prefill worker (--role prefill)".into(),
            failure: TransferFailure::NotFound,
        });
    }
    match s.rooms.take(&key).await {
        Ok(tokens) => {
            s.metrics.count(&s.metrics.kv_pulls_served, 1);
            Json(json!({
                "room": key,
                "tokens": tokens,
                "bytes": tokens as u64 * s.config.pd.kv_bytes_per_token,
                "worker": &*s.name,
            }))
            .into_response()
        }
        Err(e) => error_response(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rooms_with(key: &str) -> Rooms {
        let r = Rooms::new(Duration::from_secs(60));
        r.inner.lock().rooms.insert(key.into(), Held::Pending);
        r
    }

    fn not_found(e: SimError) -> bool {
        matches!(
            e,
            SimError::KvTransfer {
                failure: TransferFailure::NotFound,
                ..
            }
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_pull_waits_for_its_room_and_takes_it_once() {
        let rooms = Arc::new(rooms_with("7"));
        let t0 = Instant::now();
        let pull = tokio::spawn({
            let rooms = rooms.clone();
            async move { rooms.take("7").await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        rooms.set("7", Held::Ready(120, Instant::now()));
        assert_eq!(pull.await.unwrap().unwrap(), 120);
        assert_eq!(Instant::now() - t0, Duration::from_secs(5));
        // Pulled already: answered at once, not after the hold timeout.
        assert!(not_found(rooms.take("7").await.unwrap_err()));
        assert_eq!(Instant::now() - t0, Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_dropped_and_unpulled_rooms_are_404_after_the_hold() {
        let rooms = rooms_with("1");
        let t0 = Instant::now();
        assert!(not_found(rooms.take("unknown").await.unwrap_err()));
        assert_eq!(
            Instant::now() - t0,
            Duration::from_secs(60),
            "waited the hold"
        );
        rooms.set("1", Held::Dropped(Instant::now()));
        assert!(not_found(rooms.take("1").await.unwrap_err()));
        // Ready but never pulled within the hold: released.
        rooms
            .inner
            .lock()
            .rooms
            .insert("2".into(), Held::Ready(5, Instant::now()));
        tokio::time::sleep(Duration::from_secs(61)).await;
        let t1 = Instant::now();
        assert!(not_found(rooms.take("2").await.unwrap_err()));
        assert_eq!(Instant::now() - t1, Duration::from_secs(60));
        rooms
            .inner
            .lock()
            .rooms
            .insert("3".into(), Held::Failed("boom".into(), Instant::now()));
        let e = rooms.take("3").await.unwrap_err();
        assert!(e.to_string().contains("the prefill failed: boom"), "{e}");
    }
}
