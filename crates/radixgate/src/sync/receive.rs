//! The insert receiver: other replicas' decisions into this router's
//! trees, and the load reports that come with them to [`Shared`] (the
//! load lane, [`super::lane`], reads the reports sent on their own).
//!
//! Whatever arrives is decoded ([`wire::decode_header`], then the body); a
//! malformed message, one of another format version or another cluster,
//! and this process's own messages are counted by reason and skipped. An
//! entry naming a worker this router does not know (yet), or a model its
//! worker does not list here (yet), is held a while and retried
//! ([`Held`]); one still refused then is counted by why and given up.

use super::dict::{ENTRY_COST, Incoming, RENEW_AT_MOST, Unresolved};
use super::lane::Shared;
use super::publish::Delivery;
use super::wire::{self, Body, Header};
use super::{Identity, SyncMetrics, now_ms};
use crate::config::{StreamStorage, SyncConfig};
use async_nats::Client;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt as _;
use radixgate_routing::{Learned, Observation, PeerLoad, Router};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Sending processes whose texts are kept at once; beyond it the one heard
/// from least recently is forgotten.
const MAX_SENDERS: usize = 64;

/// A sender silent for longer than this is forgotten, its texts with it:
/// its references reach back at most [`RENEW_AT_MOST`] (its next texts go
/// whole), so its texts are of no more use here. Each sender's may take
/// twice its window (16 MiB by default); kept until [`MAX_SENDERS`] had
/// come, the processes that rolling restarts replaced held a gigabyte.
const SENDER_SILENCE: Duration = RENEW_AT_MOST.saturating_mul(2);

/// Decodes and screens a payload: `None` (counted) unless it is a peer's
/// message of this cluster and of the kind `want` its subject carries.
/// The header is screened before the body is
/// decoded: this replica's own insert batches come back through the stream
/// (JetStream delivers them whatever `no_echo` says), and are dropped
/// without decoding, and allocating, their entries; `echo`, if given,
/// hears their numbers (what the stream stored, for the publisher).
pub(super) fn screen(
    payload: &[u8],
    me: &Identity,
    metrics: &SyncMetrics,
    echo: Option<&Delivery>,
    want: wire::Kind,
) -> Option<(Header, Body)> {
    metrics.received(payload.len());
    let ignored = |err: wire::WireError| {
        tracing::debug!(error = %err, "replica sync: message ignored");
        metrics.ignored(err.reason());
        None
    };
    let (h, body) = match wire::decode_header(payload) {
        Err(err) => return ignored(err),
        Ok(decoded) => decoded,
    };
    if h.cluster != me.cluster {
        metrics.ignored("foreign_cluster");
        return None;
    }
    if h.instance == me.instance {
        metrics.ignored("own");
        if let Some(echo) = echo {
            echo.seen_back(h.seq);
        }
        return None;
    }
    // No build sends a kind on the other's subject: not decoded (an
    // insert batch would be decoded on the load lane's thread).
    if body.kind() != want {
        metrics.ignored("malformed");
        return None;
    }
    match body.decode() {
        Err(err) => ignored(err),
        Ok(body) => Some((h, body)),
    }
}

/// Teaches this replica's fit for the worker at `url` and pool `model` a
/// first token a peer saw there (from a batch or a load report); one it
/// cannot learn from is counted by why ([`not_applied`]). Not held, as an
/// entry is: the next one of that worker's first tokens teaches as much.
pub(super) fn learn_first_token(
    router: &Router,
    metrics: &SyncMetrics,
    model: &str,
    url: &str,
    observed: wire::Observed,
) {
    match not_applied(router.observe(model, url, Observation::from(observed))) {
        None => metrics.observed(),
        Some(why) => metrics.ignored(why),
    }
}

/// The `ignored` reason of a peer's entry or first token this router did
/// not take; `None` if it took it. `no_trees`: this replica's policy keeps
/// no prefix trees nor cost model (round_robin, least_load, ...) where its
/// peers' does: a config that differs, or a policy change half rolled out.
fn not_applied(learned: Learned) -> Option<&'static str> {
    match learned {
        Learned::Inserted => None,
        Learned::UnknownWorker => Some("unknown_worker"),
        Learned::UnknownModel => Some("unknown_model"),
        Learned::NoTrees => Some("no_trees"),
    }
}

pub(super) fn peer_loads(loads: Vec<wire::WorkerLoad>) -> Vec<PeerLoad> {
    loads
        .into_iter()
        .map(|l| PeerLoad {
            url: l.url,
            in_flight: l.in_flight,
            pending_prefill: l.pending_prefill,
        })
        .collect()
}

/// Applies insert batches, keeping each sender's texts for references.
struct Applier {
    me: Identity,
    router: Router,
    metrics: Arc<SyncMetrics>,
    /// Where the load reports that come with live batches go.
    lane: Arc<Shared>,
    /// A report that comes with a batch sent longer ago than this (the
    /// sender's clock then, this replica's now) is not taken:
    /// `load_expiry_ms` and [`CLOCK_SKEW`].
    report_age_ms: u64,
    /// Where own batches seen back are told.
    delivery: Arc<Delivery>,
    senders: HashMap<u64, (Incoming, Instant, Seen)>,
    held: Held,
}

/// How far the replicas' wall clocks may be apart for a load report that
/// comes with a batch to be judged by its send time: taken unless sent
/// longer ago than the reports' expiry and this.
pub(super) const CLOCK_SKEW: Duration = Duration::from_secs(1);

/// The oldest a load report that comes with a batch may be to be taken.
fn report_age_ms(config: &SyncConfig) -> u64 {
    config
        .load_expiry_ms
        .saturating_add(CLOCK_SKEW.as_millis() as u64)
}

/// The most gaps remembered per sender; beyond it the oldest is given up.
const MAX_GAPS: usize = 64;

/// Which of a sender's entries were applied: all below `next` but the
/// gaps (entries that never came: a batch lost with a connection, sent
/// again after its sender reconnected, or a feed that joined late), so
/// that an entry delivered twice (a consumer resumed, a batch sent again
/// that had been stored) is applied once, and one that comes late still
/// is.
///
/// The entries before the first one heard are a gap too: a feed that
/// synced live over core NATS while the stream could not be set up reads
/// the stream from its start once it can, and the sender's history comes
/// after its later entries (ids the stream no longer holds just never
/// come).
#[derive(Debug, Default)]
struct Seen {
    /// The entry after the highest applied; `None` before the first.
    next: Option<u64>,
    /// Ranges `[from, to)` below `next` not applied, oldest first.
    gaps: VecDeque<(u64, u64)>,
}

impl Seen {
    /// Whether entry `id` was not applied yet (nothing recorded).
    fn is_new(&self, id: u64) -> bool {
        match self.next {
            None => true,
            Some(next) if id >= next => true,
            Some(_) => self.gap_of(id).is_some(),
        }
    }

    /// The gap that holds `id`, if any.
    fn gap_of(&self, id: u64) -> Option<usize> {
        self.gaps
            .iter()
            .position(|&(from, to)| from <= id && id < to)
    }

    /// Records entry `id` as applied; whether it was new: true once per id.
    fn first_time(&mut self, id: u64) -> bool {
        let Some(next) = self.next else {
            if id > 0 {
                self.gaps.push_back((0, id));
            }
            self.next = Some(id.saturating_add(1));
            return true;
        };
        if id >= next {
            if id > next {
                self.gaps.push_back((next, id));
                if self.gaps.len() > MAX_GAPS {
                    self.gaps.pop_front();
                }
            }
            self.next = Some(id.saturating_add(1));
            return true;
        }
        let Some(i) = self.gap_of(id) else {
            return false;
        };
        let (from, to) = self.gaps[i];
        match (id == from, id + 1 == to) {
            (true, true) => {
                self.gaps.remove(i);
            }
            (true, false) => self.gaps[i].0 = id + 1,
            (false, true) => self.gaps[i].1 = id,
            (false, false) => {
                self.gaps[i].1 = id;
                self.gaps.insert(i + 1, (id + 1, to));
                // One sender filling a wide gap piece by piece would
                // otherwise add a gap each time, each found by a longer
                // scan.
                if self.gaps.len() > MAX_GAPS {
                    self.gaps.pop_front();
                }
            }
        }
        true
    }
}

/// Entries for a worker this replica does not know yet, retried until it
/// does or `hold` has passed. A starting replica replays the stream before
/// its first health checks admit its workers, and a peer may discover a
/// new pod a moment before this replica does: without holding, both would
/// lose what the cluster learned about those workers.
///
/// So are entries for a model that their worker does not list here yet,
/// for `model_hold`: a LoRA adapter loaded into a worker at run time is
/// found by each replica at its own next read of the worker's models
/// (`health.models_refresh_secs`, on a timer of its own), and a peer that
/// found it first routes to it meanwhile. Dropped, the prefixes the
/// cluster sent to the adapter until then were lost here for good.
struct Held {
    entries: VecDeque<HeldEntry>,
    bytes: usize,
    hold: Duration,
    model_hold: Duration,
}

struct HeldEntry {
    since: Instant,
    /// Why it is held, the `ignored` reason it is counted under if given
    /// up: `unknown_worker` or `unknown_model`.
    why: &'static str,
    model: Arc<str>,
    url: Arc<str>,
    text: Arc<String>,
}

impl HeldEntry {
    /// What it counts against `HELD_BYTES`: its strings' bytes and
    /// what holding an entry costs besides ([`ENTRY_COST`]). Counted in
    /// bytes of text alone, entries of a character or two held ten times
    /// the bound (a test binary's memory grew 136 MB for 600,000 of them,
    /// counted 12 MB), each retried every [`HELD_RETRY`].
    fn size(&self) -> usize {
        self.model.len() + self.url.len() + self.text.len() + ENTRY_COST
    }
}

impl Held {
    /// Keeps an entry for a worker not known yet; over the byte budget the
    /// oldest are given up.
    fn push(&mut self, entry: HeldEntry, metrics: &SyncMetrics) {
        let size = entry.size();
        if size > HELD_BYTES {
            metrics.ignored(entry.why);
            return;
        }
        while self.bytes + size > HELD_BYTES {
            let Some(old) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= old.size();
            metrics.ignored(old.why);
        }
        self.bytes += size;
        self.entries.push_back(entry);
    }
}

/// The most text held for unknown workers; the oldest goes first.
const HELD_BYTES: usize = 16 << 20;

/// How often held entries are retried (the timer runs only while some are
/// held).
const HELD_RETRY: Duration = Duration::from_millis(250);

/// The largest reference window a sender may claim (the configuration's
/// bound): a forged batch cannot make this replica keep more.
const MAX_WINDOW: u64 = crate::config::MAX_REFERENCE_WINDOW_BYTES as u64;

impl Applier {
    /// The feed reads the stream (`true`) or core NATS: for the gauge,
    /// and for the publisher, whose own batches come back only from the
    /// stream.
    fn on_stream(&self, on: bool) {
        self.metrics.stream(on);
        self.delivery.on_stream(on);
    }

    /// Applies one payload; `live` says whether to record its lag.
    fn apply(&mut self, payload: &[u8], live: bool) {
        let Some((h, Body::Inserts(mut batch))) = screen(
            payload,
            &self.me,
            &self.metrics,
            Some(&self.delivery),
            wire::Kind::Inserts,
        ) else {
            return;
        };
        // A replayed report is about load long gone, and so is one that
        // comes live but was sent before the reports' expiry: a batch that
        // the feed catches up on after a reconnect, or that its sender
        // sent again after its own. Its age is by the sender's clock where
        // its lane's reports told how far that is from this one's
        // (`clocks`): judged by this replica's clock, a peer's clock
        // behind by more than the expiry had every such report dropped.
        if let Some((seq, loads)) = batch.load.take()
            && live
        {
            let age = self.lane.clocks.age_ms(h.instance, h.sent_ms, now_ms());
            if age > self.report_age_ms as i64 {
                tracing::debug!(
                    peer = %h.replica,
                    age_ms = age,
                    "replica sync: a batch's load report is older than the expiry; not taken"
                );
                self.metrics.ignored("expired");
            } else if self.lane.report(h.instance, seq, peer_loads(loads)) {
                self.metrics.ignored("unknown_worker");
            }
        }
        // The processes gone (or idle) for longer than their references
        // reach: [`SENDER_SILENCE`].
        let now = Instant::now();
        self.senders
            .retain(|_, (_, heard, _)| now.saturating_duration_since(*heard) <= SENDER_SILENCE);
        if self.senders.len() >= MAX_SENDERS && !self.senders.contains_key(&h.instance) {
            let oldest = self
                .senders
                .iter()
                .min_by_key(|(_, (_, at, _))| *at)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.senders.remove(&k);
            }
        }
        // Twice the *sender's* window: its references reach that far back,
        // whatever this replica's own setting is.
        let keep = 2 * batch.window.min(MAX_WINDOW) as usize;
        let (texts, heard, seen) = self
            .senders
            .entry(h.instance)
            .or_insert_with(|| (Incoming::new(keep), Instant::now(), Seen::default()));
        texts.set_keep(keep);
        *heard = Instant::now();
        for (i, entry) in batch.entries.into_iter().enumerate() {
            let id = batch.first_entry.saturating_add(i as u64);
            if !seen.is_new(id) {
                // Delivered again: applied already.
                continue;
            }
            let resolved = texts.resolve(id, entry.base, &entry.suffix);
            // An entry whose base has not come yet stays new: its base may
            // come late (a batch made as its sender reconnected goes out
            // before the kept ones it refers to, and again after them).
            if !matches!(resolved, Err(Unresolved::MissingBase)) {
                seen.first_time(id);
            }
            let text = match resolved {
                Ok(text) => text,
                Err(Unresolved::MissingBase) => {
                    self.metrics.ignored("missing_base");
                    continue;
                }
                Err(Unresolved::Malformed) => {
                    self.metrics.ignored("malformed");
                    continue;
                }
            };
            // A first token teaches the fits only as it happens: replayed
            // history is about the workers as they were.
            if live && let Some(o) = entry.observed {
                learn_first_token(&self.router, &self.metrics, &entry.model, &entry.url, o);
            }
            if text.is_empty() {
                // A first token alone: its decision came earlier.
                continue;
            }
            match self.router.learn(&entry.model, &entry.url, &text) {
                Learned::Inserted => self.metrics.learned(),
                refused @ (Learned::UnknownWorker | Learned::UnknownModel) => self.held.push(
                    HeldEntry {
                        since: Instant::now(),
                        why: not_applied(refused).unwrap_or("unknown_worker"),
                        model: entry.model,
                        url: entry.url,
                        text,
                    },
                    &self.metrics,
                ),
                refused => {
                    if let Some(why) = not_applied(refused) {
                        self.metrics.ignored(why);
                    }
                }
            }
        }
        if live {
            let lag_ms = now_ms().saturating_sub(h.sent_ms);
            self.metrics.lag(lag_ms as f64 / 1000.0);
        }
    }

    /// Applies the held entries whose workers are known now and list
    /// their models, in the order they came; gives up those held longer
    /// than `hold` (`model_hold` for a model not listed).
    fn retry_held(&mut self) {
        if self.held.entries.is_empty() {
            return;
        }
        let now = Instant::now();
        let (hold, model_hold) = (self.held.hold, self.held.model_hold);
        let mut kept = VecDeque::with_capacity(self.held.entries.len());
        let mut bytes = 0;
        for mut e in self.held.entries.drain(..) {
            let learned = self.router.learn(&e.model, &e.url, &e.text);
            let limit = match learned {
                Learned::UnknownWorker => hold,
                Learned::UnknownModel => model_hold,
                _ => Duration::ZERO,
            };
            match learned {
                Learned::Inserted => self.metrics.learned(),
                refused if now.duration_since(e.since) < limit => {
                    e.why = not_applied(refused).unwrap_or(e.why);
                    bytes += e.size();
                    kept.push_back(e);
                }
                refused => {
                    if let Some(why) = not_applied(refused) {
                        self.metrics.ignored(why);
                    }
                }
            }
        }
        self.held.entries = kept;
        self.held.bytes = bytes;
    }
}

/// Where inserts come from.
enum Source {
    /// The JetStream stream, replayed from its oldest message or resumed
    /// after a place in it.
    Stream {
        messages: Box<consumer::pull::Ordered>,
        /// Its last sequence when the consumer was made; 0 if the consumer
        /// had nothing to deliver then.
        last: u64,
        stream: Box<stream::Stream>,
        /// Where the consumer starts after: sequence 0 (from the oldest
        /// message) of a stream new to this feed.
        from: Place,
    },
    /// Core NATS: live only, while the stream is refused or cannot be set
    /// up (and asked for again now and then).
    Core(async_nats::Subscriber, NoStream),
}

/// Whether the server refused to set up the stream, rather than failed
/// to answer: no JetStream on it, or none enabled for the account the
/// replica signs in to (a server with several accounts enables it for each
/// on its own), or a stream that cannot be made as asked (another stream
/// takes its subject, the account's limits, ...). Live sync then goes over
/// core NATS meanwhile; the stream is tried again now and then.
fn refused(err: &jetstream::context::CreateStreamError) -> bool {
    use jetstream::context::CreateStreamErrorKind as Kind;
    matches!(err.kind(), Kind::JetStreamUnavailable | Kind::JetStream(_))
}

/// How often, at most, a replica that syncs over core NATS because the
/// server refused the stream asks for it again: after 1 s, then twice as
/// long each time, up to this.
const STREAM_RETRY: Duration = Duration::from_secs(30);

/// How long the insert feed waits for an answer from the JetStream API.
const API_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the insert feed asks the stream how far it is: a consumer
/// that stopped delivering (its stream's node gone from a NATS cluster,
/// say, while this replica's own connection is fine) does not always say
/// so, and the feed must not wait on it for ever.
const STREAM_CHECK: Duration = Duration::from_secs(5);

/// How often the insert feed looks whether NATS is back, while it is not
/// (besides at each connection made).
const AWAY_POLL: Duration = Duration::from_millis(100);

/// Whether the client is connected to a NATS server now.
fn connected(client: &Client) -> bool {
    client.connection_state() == async_nats::connection::State::Connected
}

/// A place in the stream: the last sequence applied, in the stream made
/// at `created`.
#[derive(Clone, Copy, Debug, Default)]
struct Place {
    seq: u64,
    created: Option<async_nats::datetime::DateTime>,
}

/// Why there is no stream consumer.
enum NoStream {
    /// The server refused the stream ([`refused`]).
    Refused(String),
    /// No answer, or a failure on the way: retried soon.
    Failed(String),
}

/// Sets up the stream and a consumer starting after `after`, or else
/// subscribes on core NATS, so that live sync never waits for the stream:
/// the server refused it, or gave no answer (a timeout; or the user may not
/// use the JetStream API, which the server reports apart, as an error
/// event, and answers with silence). A WARN says which, unless `warned`
/// says one was given already. Errors only if it cannot even subscribe
/// (retried by the caller).
async fn source(
    client: &Client,
    me: &Identity,
    config: &SyncConfig,
    after: Place,
    warned: &mut bool,
) -> Result<Source, String> {
    let why = match stream_source(client, me, config, after).await {
        Ok(made) => return Ok(made),
        Err(why) => why,
    };
    if !std::mem::replace(warned, true) {
        match &why {
            NoStream::Refused(err) => tracing::warn!(
                error = %err,
                "replica sync: the NATS server refused the stream (no JetStream on it or for this account, or the stream cannot be made as asked); live sync over core NATS, no warm start or catching up; asking again, at most every 30 s"
            ),
            NoStream::Failed(err) => tracing::warn!(
                error = %err,
                "replica sync: the stream could not be set up (NATS slow, or this user may not use the JetStream API: see the server's errors); live sync over core NATS meanwhile; retrying"
            ),
        }
    }
    let sub = client
        .subscribe(me.subject("inserts"))
        .await
        .map_err(|e| format!("cannot subscribe: {e}"))?;
    Ok(Source::Core(sub, why))
}

/// Gives a stream found with other limits than this replica's
/// `history_secs` and `history_bytes` (made by an earlier config, or
/// another build) this replica's, and its subject if it lacks it: a
/// changed setting takes effect at the next connect, not only on a new
/// stream. Replicas run with different settings set it in turn, each at
/// its connect; the log says so. A stream found that refuses new
/// messages once full (`discard: new`, made by another tool's config)
/// drops its oldest instead, as the replicas make it: batches are
/// published with no answer asked for, so past its limit every one would
/// be refused unseen and live sync would stop. A refusal leaves the stream
/// as it is.
async fn keep_limits(js: &jetstream::Context, found: &stream::Config, want: &stream::Config) {
    // The server cannot change where a stream is kept: only a stream
    // deleted and made again would move.
    if found.storage != want.storage {
        tracing::warn!(
            stream = %found.name,
            found = ?found.storage,
            configured = ?want.storage,
            "replica sync: the stream is kept otherwise than sync.stream_storage says (made by another config); using it as it is, delete it on the NATS server to have it made anew"
        );
    }
    let subject = &want.subjects[0];
    if found.max_age == want.max_age
        && found.max_bytes == want.max_bytes
        && found.discard == want.discard
        && found.subjects.contains(subject)
    {
        return;
    }
    if found.discard != want.discard {
        tracing::warn!(
            stream = %found.name,
            found = ?found.discard,
            "replica sync: the stream refuses new batches once full (made by another config); setting it to drop its oldest, as replicas make it"
        );
    }
    let mut update = found.clone();
    update.max_age = want.max_age;
    update.max_bytes = want.max_bytes;
    update.discard = want.discard;
    // The server gave the stream a duplicate window when it was made (two
    // minutes, or its max age if shorter) and refuses a max age under it:
    // `history_secs` cut from 600 to 60 left the stream at 600, with a
    // WARN at each start. The replicas publish without message ids, so
    // the window plays no part for them.
    if !update.max_age.is_zero() && update.duplicate_window > update.max_age {
        update.duplicate_window = update.max_age;
    }
    if !update.subjects.contains(subject) {
        update.subjects.push(subject.clone());
    }
    match js.update_stream(&update).await {
        Ok(_) => tracing::info!(
            was_max_age_secs = found.max_age.as_secs(),
            was_max_bytes = found.max_bytes,
            max_age_secs = want.max_age.as_secs(),
            max_bytes = want.max_bytes,
            "replica sync: the stream's limits set to this replica's history_secs and history_bytes"
        ),
        Err(err) => tracing::warn!(
            error = %err,
            "replica sync: cannot set the stream's limits to this replica's; using it as it is"
        ),
    }
}

/// The stream and a consumer starting after `after`.
async fn stream_source(
    client: &Client,
    me: &Identity,
    config: &SyncConfig,
    after: Place,
) -> Result<Source, NoStream> {
    // Answers come within a second or two; one that takes longer means
    // the server (or its JetStream) is not there to answer.
    let js = jetstream::ContextBuilder::new()
        .timeout(API_TIMEOUT)
        .build(client.clone());
    let subject = me.subject("inserts");
    let want = stream::Config {
        name: me.stream(),
        subjects: vec![subject.clone()],
        max_age: Duration::from_secs(config.history_secs),
        max_bytes: i64::try_from(config.history_bytes).unwrap_or(i64::MAX),
        discard: stream::DiscardPolicy::Old,
        storage: match config.stream_storage {
            StreamStorage::File => stream::StorageType::File,
            StreamStorage::Memory => stream::StorageType::Memory,
        },
        ..Default::default()
    };
    let created = js.get_or_create_stream(&want).await;
    let mut stream = match created {
        Ok(stream) => stream,
        Err(err) if refused(&err) => return Err(NoStream::Refused(err.to_string())),
        Err(err) => return Err(NoStream::Failed(format!("cannot set up the stream: {err}"))),
    };
    let failed = |what: &str, e: &dyn std::fmt::Display| NoStream::Failed(format!("{what}: {e}"));
    let info = stream
        .info()
        .await
        .map_err(|e| failed("cannot read the stream's state", &e))?;
    let (last, created) = (info.state.last_sequence, info.created);
    keep_limits(&js, &info.config, &want).await;
    // From the oldest message; after a reconnect, from the one after the
    // last applied, unless the stream is not the one it was: a server
    // that lost its store made it again and counts from 1, and may be
    // past the old place by now.
    let made_again = after.created.is_some_and(|was| was != created);
    if made_again {
        tracing::info!(
            "replica sync: the stream was made again since the last batch applied (the NATS server lost its store?); replaying it whole"
        );
    }
    let seq = if made_again || last < after.seq {
        0
    } else {
        after.seq
    };
    let from = Place {
        seq,
        created: Some(created),
    };
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: subject,
            deliver_policy: match from.seq {
                0 => consumer::DeliverPolicy::All,
                seq => consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: seq + 1,
                },
            },
            ..Default::default()
        })
        .await
        .map_err(|e| failed("cannot create the consumer", &e))?;
    // A stream whose batches all aged out (a cluster idle for longer than
    // `history_secs`) still counts its last sequence, and no batch up to
    // it will come: with nothing for this feed to deliver, there is no
    // history to wait for.
    let last = if consumer.cached_info().num_pending == 0 {
        0
    } else {
        last
    };
    let messages = consumer
        .messages()
        .await
        .map_err(|e| failed("cannot read the stream", &e))?;
    Ok(Source::Stream {
        messages: Box::new(messages),
        last,
        stream: Box::new(stream),
        from,
    })
}

/// What the insert feed hands on besides the trees.
pub(super) struct Handoff {
    /// Where the load reports that come with live batches go.
    pub(super) lane: Arc<Shared>,
    /// Set once the warm start is over.
    pub(super) ready: Arc<AtomicBool>,
    /// The count of the client's connections: a new one means the stream
    /// consumer may have lost messages with the old one.
    pub(super) reconnected: tokio::sync::watch::Receiver<u64>,
    /// Where own batches seen back from the stream are told.
    pub(super) delivery: Arc<Delivery>,
    /// How long after a peer this replica may list a model its worker
    /// loaded at run time (its next read of the worker's models): how long
    /// the entries for one it does not list yet are held.
    pub(super) models_lag: Duration,
}

/// Insert batches: replay then live from the stream, or live from core
/// NATS. Marks `ready` once the replay reached the stream's end as it was
/// at the start, or the warm-up wait ran out.
pub(super) async fn inserts(
    client: Client,
    me: Identity,
    config: SyncConfig,
    router: Router,
    metrics: Arc<SyncMetrics>,
    out: Handoff,
    stop: CancellationToken,
) {
    let Handoff {
        lane,
        ready,
        mut reconnected,
        delivery,
        models_lag,
    } = out;
    let warmup = Duration::from_secs(config.warmup_timeout_secs);
    let started = Instant::now();
    {
        let ready = ready.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(warmup) => {
                    if !ready.swap(true, Ordering::AcqRel) {
                        tracing::warn!(
                            waited_secs = warmup.as_secs(),
                            "replica sync: warm start did not finish in time; ready with what was learned so far"
                        );
                    }
                }
            }
        });
    }
    let mut applier = Applier {
        me: me.clone(),
        router,
        metrics,
        lane,
        report_age_ms: report_age_ms(&config),
        delivery,
        senders: HashMap::new(),
        held: Held {
            entries: VecDeque::new(),
            bytes: 0,
            // As long as a starting replica waits for its warm start: its
            // workers are admitted well within it.
            hold: warmup.max(Duration::from_secs(1)),
            model_hold: warmup.max(models_lag).max(Duration::from_secs(1)),
        },
    };
    let mut retry = tokio::time::interval(HELD_RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut backoff = Duration::from_millis(100);
    // The last stream sequence applied: a new consumer starts after it.
    let mut last_seen = Place::default();
    // A WARN said that the insert feed went over core NATS.
    let mut warned = false;
    // A stream consumer made while syncing over core NATS, to go on with.
    let mut made = None;
    loop {
        if made.is_none() && !connected(&client) {
            // NATS is away (down at start, or gone since; the connection's
            // own logs say so): a JetStream request now would only run
            // into its limit, and the WARN would blame the stream or this
            // user's permissions. No feed meanwhile; the publisher still
            // takes its own batches to come back from the stream.
            applier.metrics.stream(false);
            tokio::select! {
                _ = stop.cancelled() => return,
                // At once when it connects: what the peers send then is
                // live, not history.
                Ok(()) = reconnected.changed() => {}
                _ = tokio::time::sleep(AWAY_POLL) => {}
            }
            continue;
        }
        let src = match made.take() {
            Some(made) => Ok(made),
            None => tokio::select! {
                _ = stop.cancelled() => return,
                src = source(&client, &me, &config, last_seen, &mut warned) => src,
            },
        };
        let src = match src {
            Ok(src) => src,
            Err(err) => {
                tracing::warn!(error = %err, "replica sync: inserts not received yet; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        // The connection the consumer was made on, and any before it.
        reconnected.borrow_and_update();
        match src {
            Source::Core(mut sub, why) => {
                applier.on_stream(false);
                // A refused stream will not come by waiting: ready now. One
                // that could not be set up may come, and with it the warm
                // start: ready once it is replayed, or the wait runs out.
                let refused_now = matches!(why, NoStream::Refused(_));
                if refused_now {
                    ready.store(true, Ordering::Release);
                }
                let (mut wait, most) = if refused_now {
                    (Duration::from_secs(1), STREAM_RETRY)
                } else {
                    (Duration::from_millis(250), Duration::from_secs(2))
                };
                let again = tokio::time::sleep(wait);
                tokio::pin!(again);
                // Asking for the stream, beside the live feed: an answer
                // may take the client's whole request timeout.
                let mut asking: Option<futures::future::BoxFuture<'_, _>> = None;
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = retry.tick(), if !applier.held.entries.is_empty() => applier.retry_held(),
                        m = sub.next() => match m {
                            Some(m) => applier.apply(&m.payload, true),
                            None => break,
                        },
                        () = &mut again, if asking.is_none() => {
                            asking = Some(Box::pin(stream_source(&client, &me, &config, last_seen)));
                        }
                        // Once the server makes it, the stream from where
                        // this replica was (from its start if it never
                        // read one): nothing is missed between the two
                        // feeds, and what came over both is applied once
                        // (`Seen`).
                        answer = async { asking.as_mut().expect("asking").await }, if asking.is_some() => {
                            asking = None;
                            match answer {
                                Ok(stream) => {
                                    tracing::info!("replica sync: the stream is set up now; warm start and catching up are back");
                                    made = Some(stream);
                                    break;
                                }
                                Err(NoStream::Refused(_)) => {
                                    ready.store(true, Ordering::Release);
                                    wait = (wait * 2).clamp(Duration::from_secs(1), STREAM_RETRY);
                                }
                                Err(NoStream::Failed(err)) => {
                                    tracing::debug!(error = %err, "replica sync: the stream could not be set up yet");
                                    wait = (wait * 2).min(most);
                                }
                            }
                            again.as_mut().reset(tokio::time::Instant::now() + wait);
                        }
                    }
                }
            }
            Source::Stream {
                mut messages,
                last,
                stream,
                from,
            } => {
                applier.on_stream(true);
                warned = false;
                last_seen = from;
                if last == 0 && !ready.swap(true, Ordering::AcqRel) {
                    tracing::info!("replica sync: no history to replay; ready");
                }
                // History, up to the sequence last when the consumer was
                // made: the stream read from its start (a warm start, or a
                // stream new to this feed or made again), or a warm start
                // resumed after a reconnect. It stays history when the
                // warm-up wait made the replica ready meanwhile, or before
                // NATS was reached: its first tokens do not teach, its
                // loads do not count, and it sets no lag.
                let mut replaying = last > 0 && (from.seq == 0 || !ready.load(Ordering::Acquire));
                let inserts = me.subject("inserts");
                // The last sequence on that subject at the previous look, and
                // where this feed was then.
                let mut looked: Option<(u64, u64)> = None;
                let mut check = tokio::time::interval_at(
                    tokio::time::Instant::now() + STREAM_CHECK,
                    STREAM_CHECK,
                );
                check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    let m = tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = retry.tick(), if !applier.held.entries.is_empty() => {
                            applier.retry_held();
                            continue;
                        }
                        m = messages.next() => m,
                        // The stream no longer answers, or has had batches
                        // past this feed's place for two looks in a row
                        // while the feed stood still: a new consumer (or,
                        // if none can be made, core NATS meanwhile).
                        _ = check.tick() => {
                            if !connected(&client) {
                                // Not the stream's fault: the reconnect
                                // sets the feed up again.
                                applier.metrics.stream(false);
                                looked = None;
                                continue;
                            }
                            // The last batch on this feed's subject (the
                            // stream may carry others, which the consumer
                            // does not deliver).
                            let last = tokio::time::timeout(
                                API_TIMEOUT,
                                stream.get_last_raw_message_by_subject(&inserts),
                            )
                            .await;
                            let now = match last {
                                Ok(Ok(m)) => (m.sequence, last_seen.seq),
                                Ok(Err(e)) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => {
                                    (0, last_seen.seq)
                                }
                                _ => {
                                    tracing::warn!(
                                        resume_after = last_seen.seq,
                                        "replica sync: the stream does not answer; setting the insert feed up again"
                                    );
                                    break;
                                }
                            };
                            let stalled = looked.is_some_and(|(was_last, was_seen)| {
                                was_last > was_seen && now.1 == was_seen
                            }) && now.0 > now.1;
                            if stalled {
                                tracing::warn!(
                                    resume_after = last_seen.seq,
                                    stream_last = now.0,
                                    "replica sync: the stream consumer stopped delivering; setting the insert feed up again"
                                );
                                break;
                            }
                            looked = Some(now);
                            continue;
                        }
                        // What the server sent down a connection that died
                        // (a partition, a cut cable) is lost, and the
                        // consumer would only notice at a gap in what
                        // comes next, or at its missed heartbeats tens of
                        // seconds on: a new one resumes after the last
                        // message applied at once.
                        Ok(()) = reconnected.changed() => {
                            tracing::info!(
                                resume_after = last_seen.seq,
                                "replica sync: reconnected to NATS; resuming the insert feed after the last batch applied"
                            );
                            break;
                        }
                    };
                    let m = match m {
                        Some(Ok(m)) => m,
                        Some(Err(err)) => {
                            // A restarted server forgot the consumer; the
                            // ordered consumer does not always recover, so
                            // a new one resumes after the last message.
                            tracing::warn!(error = %err, "replica sync: stream read failed; resuming with a new consumer");
                            tokio::select! {
                                _ = stop.cancelled() => return,
                                _ = tokio::time::sleep(backoff) => {}
                            }
                            break;
                        }
                        None => break,
                    };
                    let (seq, pending) = m
                        .info()
                        .map(|i| (i.stream_sequence, i.pending))
                        .unwrap_or((u64::MAX, 0));
                    last_seen.seq = last_seen.seq.max(seq);
                    applier.apply(&m.payload, !replaying);
                    if replaying && (seq >= last || pending == 0) {
                        replaying = false;
                        let took_ms = started.elapsed().as_millis() as u64;
                        if !ready.swap(true, Ordering::AcqRel) {
                            tracing::info!(
                                replayed_to = seq,
                                took_ms,
                                "replica sync: warm start done; ready"
                            );
                        } else {
                            tracing::info!(
                                replayed_to = seq,
                                took_ms,
                                "replica sync: history replayed"
                            );
                        }
                    }
                }
            }
        }
        tracing::info!(
            resume_after = last_seen.seq,
            "replica sync: insert feed ended; setting it up again"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_new_once_and_a_late_one_fills_its_gap() {
        let mut seen = Seen::default();
        // A feed that starts in the middle of a sender's history.
        assert!(seen.first_time(10));
        assert!(seen.first_time(11));
        assert!(!seen.first_time(11), "delivered again");
        // Before the first heard: new, once (a replay from the stream's
        // start, after live entries over core NATS).
        assert!(seen.first_time(3));
        assert!(!seen.first_time(3));
        // 12-14 were lost, 15 came first.
        assert!(seen.first_time(15));
        assert!(seen.first_time(13));
        assert!(!seen.first_time(13));
        assert!(seen.first_time(12));
        assert!(seen.first_time(14));
        assert!(!seen.first_time(12) && !seen.first_time(14) && !seen.first_time(15));
        assert_eq!(seen.gaps, [(0, 3), (4, 10)], "what the feed never had");
        assert!(seen.first_time(16));
    }

    #[test]
    fn gaps_are_bounded() {
        let mut seen = Seen::default();
        for i in 0..=(2 * MAX_GAPS as u64) {
            assert!(seen.first_time(2 * i));
        }
        assert_eq!(seen.gaps.len(), MAX_GAPS);
        // The oldest gaps were given up, the newest are kept.
        assert!(!seen.first_time(1));
        assert!(seen.first_time(4 * MAX_GAPS as u64 - 1));
    }
    /// Entries that fill one gap piece by piece split it each time: the
    /// cap holds there too, the oldest pieces given up.
    #[test]
    fn split_gaps_are_bounded() {
        let mut seen = Seen::default();
        let far = 1 << 40;
        assert!(seen.first_time(0));
        assert!(seen.first_time(far));
        for i in 1..=(2 * MAX_GAPS as u64) {
            assert!(seen.first_time(2 * i));
            assert!(seen.gaps.len() <= MAX_GAPS, "{} gaps", seen.gaps.len());
        }
        assert_eq!(seen.gaps.len(), MAX_GAPS);
        assert!(!seen.first_time(1), "the oldest piece was given up");
        assert!(seen.first_time(far - 1));
        assert!(seen.first_time(4 * MAX_GAPS as u64 + 1));
    }

    /// A sender first heard live (over core NATS, while the stream could
    /// not be set up), then replayed from the stream's start once it is:
    /// its entries before the first one heard are new, each once.
    #[test]
    fn entries_before_the_first_heard_are_new_once() {
        let mut seen = Seen::default();
        assert!(seen.first_time(1000));
        for id in 0..1000 {
            assert!(seen.first_time(id), "entry {id} of the replay");
        }
        assert!((0..=1000).all(|id| !seen.first_time(id)));
        assert!(seen.gaps.is_empty(), "{:?}", seen.gaps);
        assert!(seen.first_time(1001));
    }

    const WORKER: &str = "http://127.0.0.1:9";

    /// An applier for a router of one worker (the wildcard pool, a policy
    /// with trees), the worker and the metrics' registry.
    fn applier(
        config: &SyncConfig,
    ) -> (
        Applier,
        Arc<radixgate_routing::Worker>,
        crate::metrics::Metrics,
    ) {
        use radixgate_routing::{PolicyConfig, Registry, WorkerSpec};
        let mut registry = Registry::new(PolicyConfig::default().build().unwrap());
        let worker = registry.add(WorkerSpec::new(WORKER)).unwrap();
        let router = registry.router();
        let metrics = crate::metrics::Metrics::new();
        let applier = Applier {
            me: Identity {
                cluster: "prod".into(),
                replica: "r-1".into(),
                instance: 1,
            },
            lane: Shared::new(config, router.clone()),
            report_age_ms: report_age_ms(config),
            router,
            metrics: Arc::new(SyncMetrics::new(&metrics)),
            delivery: Arc::default(),
            senders: HashMap::new(),
            held: Held {
                entries: VecDeque::new(),
                bytes: 0,
                hold: Duration::from_secs(1),
                model_hold: Duration::from_secs(1),
            },
        };
        (applier, worker, metrics)
    }

    /// The value of the series `name` (with its labels) in `metrics`.
    fn series(metrics: &crate::metrics::Metrics, name: &str) -> f64 {
        let text = metrics.render();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .map_or(0.0, |v| v.parse().unwrap())
    }

    /// Peer 2's insert batch numbered `seq`, sent at `sent_ms`: entries
    /// from `first_entry` on, each `(base, suffix)` for the worker.
    fn peer_batch(
        seq: u64,
        sent_ms: u64,
        first_entry: u64,
        entries: &[(Option<(u64, u64)>, &str)],
        load: Option<(u64, u32)>,
    ) -> Vec<u8> {
        let peer = Identity {
            cluster: "prod".into(),
            replica: "r-2".into(),
            instance: 2,
        };
        let mut h = peer.header(seq);
        h.sent_ms = sent_ms;
        let entries = entries
            .iter()
            .map(|&(base, suffix)| wire::WireEntry {
                model: radixgate_routing::WILDCARD_MODEL.into(),
                url: WORKER.into(),
                base,
                suffix: suffix.as_bytes().to_vec(),
                observed: None,
            })
            .collect();
        let load = load.map(|(seq, in_flight)| {
            let worker = wire::WorkerLoad {
                url: WORKER.into(),
                in_flight,
                pending_prefill: 0,
            };
            (seq, vec![worker])
        });
        wire::encode_inserts(
            &h,
            &wire::Inserts {
                window: 1 << 20,
                first_entry,
                entries,
                load,
            },
        )
    }

    /// A sender's batch k+1 that refers into batch k, delivered before it
    /// (a batch made in the moment its sender reconnected goes out before
    /// the kept ones are sent again, which are followed by it again): its
    /// entry is rebuilt and applied when it comes again, once.
    #[test]
    fn an_entry_whose_base_comes_after_it_is_applied_when_it_comes_again() {
        let (mut applier, _worker, metrics) = applier(&SyncConfig::default());
        let base = "system: answer with care. ".repeat(20);
        let k = peer_batch(1, now_ms(), 0, &[(None, &base)], None);
        let later = (Some((1, base.len() as u64)), "user: what is new?");
        let k1 = peer_batch(2, now_ms(), 1, &[later], None);
        let learned = || series(&metrics, "radixgate_sync_entries_learned_total");
        applier.apply(&k1, true);
        assert_eq!(learned(), 0.0);
        assert_eq!(
            series(
                &metrics,
                "radixgate_sync_ignored_total{reason=\"missing_base\"}"
            ),
            1.0
        );
        applier.apply(&k, true);
        assert_eq!(learned(), 1.0);
        applier.apply(&k1, true);
        assert_eq!(learned(), 2.0, "entry 1 rebuilt once its base came");
        applier.apply(&k1, true);
        applier.apply(&k, true);
        assert_eq!(learned(), 2.0, "each applied once");
    }

    /// Entries without text (how a first token alone is sent) or with a
    /// character or two, forged by another publisher on the subject by
    /// the hundred thousand: each is held for later references, and what
    /// a sender's texts may take is counted in their bytes, so entries of
    /// none were held without bound (a 1 MiB message of 4-byte entries
    /// held about 16 MB, for good).
    #[test]
    fn entries_without_text_are_held_within_the_senders_window() {
        let (mut applier, _worker, _metrics) = applier(&SyncConfig::default());
        let entries: Vec<_> = (0..10_000)
            .map(|i| (None, if i % 2 == 0 { "" } else { "x" }))
            .collect();
        for b in 0..20 {
            let batch = peer_batch(b + 1, now_ms(), b * 10_000, &entries, None);
            applier.apply(&batch, true);
        }
        let (texts, _, _) = &applier.senders[&2];
        // The sender's window is 1 MiB: at most 2 MiB held, entries' own
        // cost counted.
        let keep = 2usize << 20;
        assert!(
            texts.held() * ENTRY_COST <= keep,
            "{} entries held",
            texts.held()
        );
    }

    /// Entries of a character or two naming a worker this replica does not
    /// know, forged by the hundred thousand: held for a while in case the
    /// worker comes, within what holding each costs, not within their
    /// bytes alone (which held ten times the bound, each retried every
    /// 250 ms).
    #[test]
    fn entries_held_for_an_unknown_worker_are_held_within_the_bound() {
        let (mut applier, _worker, _metrics) = applier(&SyncConfig::default());
        let peer = Identity {
            cluster: "prod".into(),
            replica: "r-2".into(),
            instance: 2,
        };
        let per_batch = 200_000u64;
        for b in 0..3 {
            let entries = (0..per_batch)
                .map(|_| wire::WireEntry {
                    model: radixgate_routing::WILDCARD_MODEL.into(),
                    url: "http://127.0.0.1:1".into(),
                    base: None,
                    suffix: b"x".to_vec(),
                    observed: None,
                })
                .collect();
            let batch = wire::Inserts {
                window: 0,
                first_entry: b * per_batch,
                entries,
                load: None,
            };
            applier.apply(&wire::encode_inserts(&peer.header(b + 1), &batch), true);
        }
        let held = applier.held.entries.len();
        assert!(held > 0);
        assert!(held * ENTRY_COST <= HELD_BYTES, "{held} entries held");
    }

    /// A sender silent for longer than any reference of its reaches back
    /// (a replica replaced in a rolling restart: its new process is a new
    /// sender) is forgotten with its texts at the next batch from anyone:
    /// each kept up to twice its window (16 MiB by default) until 64
    /// senders had come, so a replica held a gigabyte of texts no one
    /// would refer to again after a few rolling restarts of the cluster.
    #[test]
    fn a_sender_gone_silent_is_forgotten_with_its_texts() {
        let (mut applier, _worker, _metrics) = applier(&SyncConfig::default());
        let text = "a prompt the old process routed. ".repeat(100);
        applier.apply(&peer_batch(1, now_ms(), 0, &[(None, &text)], None), true);
        let silent = SENDER_SILENCE + Duration::from_secs(1);
        let (_, heard, _) = applier.senders.get_mut(&2).unwrap();
        *heard = Instant::now().checked_sub(silent).unwrap();
        let other = Identity {
            cluster: "prod".into(),
            replica: "r-3".into(),
            instance: 3,
        };
        let empty = wire::Inserts {
            window: 1 << 20,
            first_entry: 0,
            entries: Vec::new(),
            load: None,
        };
        applier.apply(&wire::encode_inserts(&other.header(1), &empty), true);
        assert!(applier.senders.contains_key(&3));
        assert!(
            !applier.senders.contains_key(&2),
            "a sender silent for {silent:?} is kept"
        );
    }

    /// A load report in a batch sent longer ago than the reports' expiry
    /// (replayed from the stream as the feed caught up, or a batch sent
    /// again after its sender reconnected) is load long gone: not taken.
    #[test]
    fn a_load_report_in_a_batch_sent_before_the_expiry_is_not_taken() {
        let config = SyncConfig::default();
        let (mut applier, worker, metrics) = applier(&config);
        let old = now_ms() - 60_000;
        applier.apply(&peer_batch(1, old, 0, &[], Some((1, 5))), true);
        assert_eq!(worker.peer_load(), 0, "a minute-old report counted");
        let text = metrics.render();
        assert!(
            text.contains("radixgate_sync_ignored_total{reason=\"expired\"} 1"),
            "{text}"
        );
        // One sent just now counts, and so does one from a clock a little
        // ahead or behind.
        applier.apply(&peer_batch(2, now_ms(), 0, &[], Some((2, 3))), true);
        assert_eq!(worker.peer_load(), 3);
        let behind = now_ms() - config.load_expiry_ms;
        applier.apply(&peer_batch(3, behind, 0, &[], Some((3, 4))), true);
        assert_eq!(worker.peer_load(), 4);
        let ahead = now_ms() + 5_000;
        applier.apply(&peer_batch(4, ahead, 0, &[], Some((4, 6))), true);
        assert_eq!(worker.peer_load(), 6);
    }

    /// A load report on the inserts subject, or a batch on the load one,
    /// is counted and skipped, its body not decoded.
    #[test]
    fn a_message_of_the_other_kind_is_counted_and_skipped() {
        let registry = crate::metrics::Metrics::new();
        let metrics = SyncMetrics::new(&registry);
        let me = Identity {
            cluster: "prod".into(),
            replica: "r-1".into(),
            instance: 1,
        };
        let peer = Identity {
            instance: 2,
            ..me.clone()
        };
        let load = wire::encode_load(&peer.header(7), &[], &[]);
        let batch = wire::encode_inserts(
            &peer.header(8),
            &wire::Inserts {
                window: 0,
                first_entry: 0,
                entries: Vec::new(),
                load: None,
            },
        );
        assert!(screen(&load, &me, &metrics, None, wire::Kind::Inserts).is_none());
        assert!(screen(&batch, &me, &metrics, None, wire::Kind::Load).is_none());
        assert!(screen(&batch, &me, &metrics, None, wire::Kind::Inserts).is_some());
        assert!(screen(&load, &me, &metrics, None, wire::Kind::Load).is_some());
        let text = registry.render();
        assert!(
            text.contains("radixgate_sync_ignored_total{reason=\"malformed\"} 2"),
            "{text}"
        );
    }
}
