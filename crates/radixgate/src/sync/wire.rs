//! The sync messages' bytes: encoding and a decoder that never panics.
//!
//! Every message is one NATS payload:
//!
//! ```text
//! "RG" version:u8 kind:u8 flags:u8
//! cluster:str replica:str instance:u64le seq:var sent_ms:var
//! body
//! ```
//!
//! `var` is an unsigned LEB128 integer, `str`/`bytes` a `var` length then
//! that many bytes. `kind` 1 is a batch of inserts, 2 a load report.
//! `flags`: bit 0 ([`FLAG_OBSERVED`]) says the message carries first-token
//! observations (below); bit 1 ([`FLAG_LOAD`], inserts only) that a batch
//! ends with a load report; any other bit is malformed.
//! Builds before that bit reject it as malformed, so a sender sets it only
//! on batches that carry one. `instance` is random per process: it
//! tells a replica's own messages apart (even a restarted one under the same
//! `replica` name), and keys the reference dictionary below.
//!
//! Inserts body: a string table (`n:var`, then `n` strs: the batch's models
//! and worker URLs, each once), `window:var` (the sender's reference
//! window, so a receiver keeps enough of its texts), `first_entry:var`,
//! `count:var`, then per
//! entry `model:var url:var back:var [base_len:var] suffix:bytes`. Entries
//! are numbered `first_entry + i`. `back` 0: the entry's text is `suffix`.
//! Otherwise the text is the first `base_len` bytes of the text of entry
//! `id - back` from the same instance, then `suffix`: long prompts repeat
//! what the same replica sent moments before (a conversation's earlier
//! turns, a shared system prompt), and the receiver keeps those texts (see
//! [`super::dict`]).
//!
//! With [`FLAG_OBSERVED`], each entry then ends with `seen:u8`: 0, or 1
//! followed by `queued_chars:var uncached_chars:var in_flight:var
//! ttft_us:var`: what the sender's cost model saw on the worker when it
//! decided, and the wait for the first token, which every receiver's fit
//! for that worker learns from too.
//!
//! Load body: `count:var`, then per worker `url:str in_flight:var
//! pending_prefill:var`; a report lists every worker the replica has load
//! on, so it replaces the previous one whole. With [`FLAG_OBSERVED`] (the
//! load lane's first tokens that no decision's batch took along) it then
//! has `n:var` and `n` times `model:str url:str queued_chars:var
//! uncached_chars:var in_flight:var ttft_us:var`.
//!
//! Limits checked while decoding: a payload over [`MAX_MESSAGE`], a count
//! larger than the bytes left could hold, an index outside the string
//! table, text that is not UTF-8, trailing bytes: all are
//! [`WireError`]s, counted by the receiver as malformed; so is a batch
//! whose entries would rebuild more than [`MAX_BATCH_TEXT`] bytes of text,
//! refused before any is copied. What a payload decodes to is at most a
//! few times its size: each string of a batch's table is held once, shared
//! by the entries that name it.

use radixgate_routing::{Observation, Work};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The first bytes of every message.
const MAGIC: &[u8; 2] = b"RG";
/// The format version this build writes and reads.
pub(crate) const VERSION: u8 = 1;
const KIND_INSERTS: u8 = 1;
const KIND_LOAD: u8 = 2;
/// Flag: the inserts' entries, or the load report, carry first-token
/// observations.
pub(crate) const FLAG_OBSERVED: u8 = 1;
/// Inserts: the batch ends with the sender's load report.
pub(crate) const FLAG_LOAD: u8 = 2;
/// The longest first-token wait an observation may state; a longer one is
/// malformed (a lying peer must not teach a fit absurd speeds).
pub(crate) const MAX_OBSERVED_TTFT_US: u64 = 600_000_000;
/// The largest payload decoded (NATS's own default limit is 1 MiB).
pub(crate) const MAX_MESSAGE: usize = 8 << 20;
/// The longest text a receiver rebuilds ([`super::dict::Incoming`]); a
/// longer one is malformed. A sender cuts each text to what one message
/// may carry (`publish::fit`, at most this), and a reference only shortens
/// what is sent: no sender makes a longer one.
pub(crate) const MAX_TEXT: usize = MAX_MESSAGE;
/// The most bytes of text an insert batch's entries rebuild together
/// (each its base's bytes and its suffix); a batch that states more is
/// malformed. A reference lets a 7-byte entry stand for a long text, so
/// without a bound a forged 1 MiB batch cost a receiver about 0.6 s of
/// copying (an 8 MiB one 30 s) on the runtime that serves requests. A
/// sender starts a new batch before its texts pass it (builds before it
/// did not: theirs is refused only past 64 MiB of texts in one batch, 256
/// decisions on one 256 KiB prompt within `batch_ms`).
pub(crate) const MAX_BATCH_TEXT: usize = 8 * MAX_TEXT;

/// Who sent a message, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// The sync cluster name.
    pub(crate) cluster: String,
    /// The replica's name (`--sync-replica-id`, or random).
    pub(crate) replica: String,
    /// Random per process.
    pub(crate) instance: u64,
    /// Per instance and kind, up by one per message.
    pub(crate) seq: u64,
    /// Wall-clock milliseconds since the Unix epoch at publishing.
    pub(crate) sent_ms: u64,
}

/// One routed text, as sent: maybe a reference into an earlier entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WireEntry {
    /// Shared by the batch's entries that name it: decoded, each string of
    /// the table is held once however many entries name it.
    pub(crate) model: Arc<str>,
    pub(crate) url: Arc<str>,
    /// `(entries back, bytes of that entry's text)`, or `None`.
    pub(crate) base: Option<(u64, u64)>,
    /// The text after the base's bytes (all of it without a base).
    pub(crate) suffix: Vec<u8>,
    /// The first token the sender's cost model learned from, if it did.
    pub(crate) observed: Option<Observed>,
}

/// A first-token observation, as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Observed {
    pub(crate) queued_chars: u64,
    pub(crate) uncached_chars: u64,
    pub(crate) in_flight: u64,
    pub(crate) ttft_us: u64,
}

/// What the cost model learned, as sent: the wait in whole microseconds,
/// at most [`MAX_OBSERVED_TTFT_US`].
impl From<Observation> for Observed {
    fn from(o: Observation) -> Self {
        Self {
            queued_chars: o.work.queued_chars as u64,
            uncached_chars: o.work.uncached_chars as u64,
            in_flight: o.work.in_flight as u64,
            ttft_us: u64::try_from(o.elapsed.as_micros())
                .unwrap_or(u64::MAX)
                .min(MAX_OBSERVED_TTFT_US),
        }
    }
}

/// A received observation, for this replica's cost model (counts past
/// `usize` saturate).
impl From<Observed> for Observation {
    fn from(o: Observed) -> Self {
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        Self {
            work: Work {
                queued_chars: size(o.queued_chars),
                uncached_chars: size(o.uncached_chars),
                in_flight: size(o.in_flight),
            },
            elapsed: Duration::from_micros(o.ttft_us),
        }
    }
}

/// A batch of inserts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Inserts {
    /// The sender's `reference_window_bytes`: references point at most this
    /// many bytes of texts back.
    pub(crate) window: u64,
    pub(crate) first_entry: u64,
    pub(crate) entries: Vec<WireEntry>,
    /// The sender's load report, when one goes out with the batch: its
    /// number in the sender's load reports (as a load message's header
    /// `seq`), and the loads.
    pub(crate) load: Option<(u64, Vec<WorkerLoad>)>,
}

/// One worker's load in a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WorkerLoad {
    pub(crate) url: String,
    pub(crate) in_flight: u32,
    pub(crate) pending_prefill: u64,
}

/// A decoded message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    Inserts(Inserts),
    /// A load report, and the first tokens that came with it.
    Load(Vec<WorkerLoad>, Vec<FirstToken>),
}

/// A first token on its own (in a load report): the worker it came from
/// and what the sender's cost model learned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FirstToken {
    pub(crate) model: String,
    pub(crate) url: String,
    pub(crate) observed: Observed,
}

/// Why a payload was not decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WireError {
    /// Not a radixgate message, or cut short, or inconsistent.
    Malformed(&'static str),
    /// A radixgate message of another format version.
    Version(u8),
}

impl WireError {
    /// The `reason` label it is counted under.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::Version(_) => "version",
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(what) => write!(f, "malformed sync message: {what}"),
            Self::Version(v) => write!(
                f,
                "sync message of format version {v}, this build reads {VERSION}"
            ),
        }
    }
}

fn put_var(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_var(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn put_header(out: &mut Vec<u8>, kind: u8, flags: u8, h: &Header) {
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[VERSION, kind, flags]);
    put_bytes(out, h.cluster.as_bytes());
    put_bytes(out, h.replica.as_bytes());
    out.extend_from_slice(&h.instance.to_le_bytes());
    put_var(out, h.seq);
    put_var(out, h.sent_ms);
}

/// The place of `s` in the batch's string table, added if new.
fn table_index<'a>(table: &mut Vec<&'a str>, s: &'a str) -> u64 {
    match table.iter().position(|t| *t == s) {
        Some(i) => i as u64,
        None => {
            table.push(s);
            (table.len() - 1) as u64
        }
    }
}

/// Encodes a batch of inserts.
/// At most what an insert batch takes beyond its entries: the header and
/// the batch's own numbers, and the load report if it carries `loads`.
/// Each string counts with its length and each number as a 10-byte varint,
/// its most.
pub(crate) fn inserts_frame_bound(h: &Header, loads: Option<&[WorkerLoad]>) -> usize {
    let header = 80 + h.cluster.len() + h.replica.len() + 20;
    header
        + loads.map_or(0, |loads| {
            20 + loads.iter().map(|l| l.url.len() + 30).sum::<usize>()
        })
}

/// At most what an entry's numbers take: its model's and URL's places in
/// the table, its reference, its suffix's length and its first token.
const ENTRY_NUMBERS: usize = 91;

/// At most what one entry adds to an insert batch: its numbers, its
/// suffix, and its model and URL if they are new to the batch's string
/// table.
pub(crate) fn entry_bound(suffix_len: usize, model: &str, url: &str) -> usize {
    name_bound(model) + name_bound(url) + suffix_len + ENTRY_NUMBERS
}

fn name_bound(s: &str) -> usize {
    s.len() + 10
}

pub(crate) fn encode_inserts(h: &Header, batch: &Inserts) -> Vec<u8> {
    let mut table: Vec<&str> = Vec::new();
    let mut refs = Vec::with_capacity(batch.entries.len());
    for e in &batch.entries {
        let m = table_index(&mut table, &e.model);
        let u = table_index(&mut table, &e.url);
        refs.push((m, u));
    }
    // Room for all of it: a batch of one long prompt that outgrew its
    // buffer was copied whole to a buffer twice the size.
    let frame = inserts_frame_bound(h, batch.load.as_ref().map(|(_, l)| l.as_slice()));
    let names: usize = table.iter().map(|s| name_bound(s)).sum();
    let entries: usize = batch
        .entries
        .iter()
        .map(|e| e.suffix.len() + ENTRY_NUMBERS)
        .sum();
    let mut out = Vec::with_capacity(frame + names + entries);
    #[cfg(test)]
    let reserved = out.capacity();
    let observed = batch.entries.iter().any(|e| e.observed.is_some());
    let flags =
        if observed { FLAG_OBSERVED } else { 0 } | if batch.load.is_some() { FLAG_LOAD } else { 0 };
    put_header(&mut out, KIND_INSERTS, flags, h);
    put_var(&mut out, table.len() as u64);
    for s in &table {
        put_bytes(&mut out, s.as_bytes());
    }
    put_var(&mut out, batch.window);
    put_var(&mut out, batch.first_entry);
    put_var(&mut out, batch.entries.len() as u64);
    for (e, (m, u)) in batch.entries.iter().zip(refs) {
        put_var(&mut out, m);
        put_var(&mut out, u);
        match e.base {
            Some((back, len)) => {
                put_var(&mut out, back.max(1));
                put_var(&mut out, len);
            }
            None => put_var(&mut out, 0),
        }
        put_bytes(&mut out, &e.suffix);
        if observed {
            match e.observed {
                Some(o) => {
                    out.push(1);
                    put_observed(&mut out, &o);
                }
                None => out.push(0),
            }
        }
    }
    if let Some((seq, loads)) = &batch.load {
        put_var(&mut out, *seq);
        put_loads(&mut out, loads);
    }
    #[cfg(test)]
    assert_eq!(out.capacity(), reserved, "the batch outgrew its buffer");
    out
}

fn put_observed(out: &mut Vec<u8>, o: &Observed) {
    put_var(out, o.queued_chars);
    put_var(out, o.uncached_chars);
    put_var(out, o.in_flight);
    put_var(out, o.ttft_us);
}

/// Encodes a load report, with the first tokens that go along (if any:
/// without, the flag is clear and builds before it read the report).
pub(crate) fn encode_load(h: &Header, loads: &[WorkerLoad], firsts: &[FirstToken]) -> Vec<u8> {
    let firsts_len: usize = firsts
        .iter()
        .map(|f| f.model.len() + f.url.len() + 60)
        .sum();
    let mut out = Vec::with_capacity(48 + loads.len() * 40 + firsts_len);
    let flags = if firsts.is_empty() { 0 } else { FLAG_OBSERVED };
    put_header(&mut out, KIND_LOAD, flags, h);
    put_loads(&mut out, loads);
    if !firsts.is_empty() {
        put_var(&mut out, firsts.len() as u64);
        for f in firsts {
            put_bytes(&mut out, f.model.as_bytes());
            put_bytes(&mut out, f.url.as_bytes());
            put_observed(&mut out, &f.observed);
        }
    }
    out
}

fn put_loads(out: &mut Vec<u8>, loads: &[WorkerLoad]) {
    put_var(out, loads.len() as u64);
    for l in loads {
        put_bytes(out, l.url.as_bytes());
        put_var(out, u64::from(l.in_flight));
        put_var(out, l.pending_prefill);
    }
}

/// A cursor over a payload; every read checks the bytes left.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        if n > self.rest.len() {
            return Err(WireError::Malformed(what));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn var(&mut self, what: &'static str) -> Result<u64, WireError> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let [byte] = self.take(1, what)? else {
                return Err(WireError::Malformed(what));
            };
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(WireError::Malformed(what));
            }
            v |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WireError::Malformed(what))
    }

    /// A count of items each at least `min_bytes` long: never more than the
    /// bytes left could hold, so a forged count cannot reserve memory.
    fn count(&mut self, min_bytes: usize, what: &'static str) -> Result<usize, WireError> {
        let n = self.var(what)?;
        if n > (self.rest.len() / min_bytes.max(1)) as u64 {
            return Err(WireError::Malformed(what));
        }
        Ok(n as usize)
    }

    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], WireError> {
        let n = self.var(what)?;
        let n = usize::try_from(n).map_err(|_| WireError::Malformed(what))?;
        self.take(n, what)
    }

    fn str(&mut self, what: &'static str) -> Result<&'a str, WireError> {
        std::str::from_utf8(self.bytes(what)?).map_err(|_| WireError::Malformed(what))
    }
}

/// Decodes a payload (the receivers screen the header first, see
/// [`decode_header`]).
#[cfg(test)]
pub(crate) fn decode(payload: &[u8]) -> Result<(Header, Body), WireError> {
    let (header, body) = decode_header(payload)?;
    Ok((header, body.decode()?))
}

/// What a message carries: each kind has a subject of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Inserts,
    Load,
}

/// A message's body, not decoded yet: a receiver screens the header first
/// and skips what is not for it (its own, another cluster's) without
/// decoding, and allocating, the entries.
pub(crate) struct RawBody<'a> {
    kind: u8,
    flags: u8,
    rest: &'a [u8],
}

impl RawBody<'_> {
    /// Its kind ([`decode_header`] refuses any other).
    pub(crate) fn kind(&self) -> Kind {
        match self.kind {
            KIND_LOAD => Kind::Load,
            _ => Kind::Inserts,
        }
    }

    /// Decodes the body; the whole payload must be used.
    pub(crate) fn decode(self) -> Result<Body, WireError> {
        let mut r = Reader { rest: self.rest };
        let body = match self.kind {
            KIND_INSERTS => Body::Inserts(decode_inserts(&mut r, self.flags)?),
            KIND_LOAD => {
                let loads = decode_load(&mut r)?;
                let firsts = if self.flags & FLAG_OBSERVED != 0 {
                    decode_first_tokens(&mut r)?
                } else {
                    Vec::new()
                };
                Body::Load(loads, firsts)
            }
            _ => return Err(WireError::Malformed("unknown kind")),
        };
        if !r.rest.is_empty() {
            return Err(WireError::Malformed("trailing bytes"));
        }
        Ok(body)
    }
}

/// Decodes a payload's header, leaving its body for [`RawBody::decode`].
pub(crate) fn decode_header(payload: &[u8]) -> Result<(Header, RawBody<'_>), WireError> {
    if payload.len() > MAX_MESSAGE {
        return Err(WireError::Malformed("larger than the largest message"));
    }
    let mut r = Reader { rest: payload };
    if r.take(2, "magic")? != MAGIC {
        return Err(WireError::Malformed("not a radixgate sync message"));
    }
    let [version, kind, flags] = r.take(3, "header")? else {
        return Err(WireError::Malformed("header"));
    };
    let (version, kind, flags) = (*version, *kind, *flags);
    if version != VERSION {
        return Err(WireError::Version(version));
    }
    if kind != KIND_INSERTS && kind != KIND_LOAD {
        return Err(WireError::Malformed("unknown kind"));
    }
    let known = if kind == KIND_INSERTS {
        FLAG_OBSERVED | FLAG_LOAD
    } else {
        FLAG_OBSERVED
    };
    if flags & !known != 0 {
        return Err(WireError::Malformed("unknown flags"));
    }
    let cluster = r.str("cluster")?.to_owned();
    let replica = r.str("replica")?.to_owned();
    let instance = r.take(8, "instance")?;
    let instance = u64::from_le_bytes(
        instance
            .try_into()
            .map_err(|_| WireError::Malformed("instance"))?,
    );
    let seq = r.var("seq")?;
    let sent_ms = r.var("sent time")?;
    let header = Header {
        cluster,
        replica,
        instance,
        seq,
        sent_ms,
    };
    Ok((
        header,
        RawBody {
            kind,
            flags,
            rest: r.rest,
        },
    ))
}

fn decode_inserts(r: &mut Reader<'_>, flags: u8) -> Result<Inserts, WireError> {
    let n = r.count(1, "string table")?;
    // Each string once, shared by the entries that name it: an entry is 4
    // bytes, so a copy each would let a 1 MiB batch naming one 512 KiB
    // string ask for about 137 GB.
    let mut table: Vec<Arc<str>> = Vec::with_capacity(n);
    for _ in 0..n {
        table.push(Arc::from(r.str("string")?));
    }
    let window = r.var("window")?;
    let first_entry = r.var("first entry")?;
    let count = r.count(4, "entry count")?;
    let mut entries = Vec::with_capacity(count);
    // The bytes of text the entries rebuild, as they state them.
    let mut texts: u64 = 0;
    let lookup = |i: u64| -> Result<Arc<str>, WireError> {
        usize::try_from(i)
            .ok()
            .and_then(|i| table.get(i).cloned())
            .ok_or(WireError::Malformed("string index"))
    };
    for _ in 0..count {
        let model = lookup(r.var("model")?)?;
        let url = lookup(r.var("url")?)?;
        let back = r.var("base")?;
        let base = match back {
            0 => None,
            back => Some((back, r.var("base length")?)),
        };
        let suffix = r.bytes("text")?.to_vec();
        texts = texts
            .saturating_add(base.map_or(0, |(_, len)| len))
            .saturating_add(suffix.len() as u64);
        if texts > MAX_BATCH_TEXT as u64 {
            return Err(WireError::Malformed("more text than a batch rebuilds"));
        }
        let observed = if flags & FLAG_OBSERVED != 0 {
            decode_observed(r)?
        } else {
            None
        };
        entries.push(WireEntry {
            model,
            url,
            base,
            suffix,
            observed,
        });
    }
    let load = if flags & FLAG_LOAD != 0 {
        Some((r.var("load seq")?, decode_load(r)?))
    } else {
        None
    };
    Ok(Inserts {
        window,
        first_entry,
        entries,
        load,
    })
}

fn decode_observed(r: &mut Reader<'_>) -> Result<Option<Observed>, WireError> {
    match r.take(1, "observation")? {
        [0] => Ok(None),
        [1] => observed_fields(r).map(Some),
        _ => Err(WireError::Malformed("observation")),
    }
}

fn observed_fields(r: &mut Reader<'_>) -> Result<Observed, WireError> {
    let o = Observed {
        queued_chars: r.var("queued chars")?,
        uncached_chars: r.var("uncached chars")?,
        in_flight: r.var("in flight")?,
        ttft_us: r.var("first token")?,
    };
    if o.ttft_us > MAX_OBSERVED_TTFT_US {
        return Err(WireError::Malformed("first token"));
    }
    Ok(o)
}

fn decode_first_tokens(r: &mut Reader<'_>) -> Result<Vec<FirstToken>, WireError> {
    // At least a byte per string and four per observation.
    let count = r.count(6, "first token count")?;
    let mut firsts = Vec::with_capacity(count);
    for _ in 0..count {
        let model = r.str("model")?.to_owned();
        let url = r.str("url")?.to_owned();
        let observed = observed_fields(r)?;
        firsts.push(FirstToken {
            model,
            url,
            observed,
        });
    }
    Ok(firsts)
}

fn decode_load(r: &mut Reader<'_>) -> Result<Vec<WorkerLoad>, WireError> {
    let count = r.count(3, "worker count")?;
    let mut loads = Vec::with_capacity(count);
    for _ in 0..count {
        let url = r.str("url")?.to_owned();
        let in_flight =
            u32::try_from(r.var("in flight")?).map_err(|_| WireError::Malformed("in flight"))?;
        let pending_prefill = r.var("pending prefill")?;
        loads.push(WorkerLoad {
            url,
            in_flight,
            pending_prefill,
        });
    }
    Ok(loads)
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
