//! Sending a routed text as "the first N bytes of a text I sent before, then
//! this": both ends of the reference scheme of [`super::wire`].
//!
//! Prompts repeat: a conversation's next turn resends every earlier turn,
//! and many requests share one system prompt. The sender ([`Outgoing`])
//! hashes each text it publishes at every [`BLOCK`]-byte boundary (a chain:
//! each hash covers all bytes before it) and remembers, per hash, the
//! latest entry that had it. A new text whose leading blocks hash to a
//! remembered value is sent as a reference to that entry plus the rest.
//!
//! The receiver ([`Incoming`], one per sending process) keeps the texts it
//! received from that sender, the oldest first out, within twice the
//! sender's window (each batch states it; the receiver's own setting does
//! not matter): the sender only refers to entries within its last
//! `window` bytes of texts, so, with no message lost, every reference
//! resolves. Both ends count an entry as its text's bytes and
//! [`ENTRY_COST`], so entries of little or no text are bounded too. A lost
//! message (core NATS while disconnected, a stream that aged out, a
//! receiver that started later) makes some references unresolvable: those
//! entries are skipped and counted, never guessed. Since each reference
//! names the latest entry with the prefix, a prefix in steady use chains
//! every entry to the one text it was first sent whole with: a receiver
//! that never had that text would resolve none of them, for as long as the
//! prefix stays in use. So a reference only reaches an entry whose chain
//! goes back to a whole text sent at most `renew` ago
//! ([`renew_after`]); past that the text goes whole again, and a
//! receiver that missed the old one resolves the chain from there. A text longer than any sender sends
//! ([`MAX_TEXT`]) is refused, so what is held stays within `keep` and one
//! such text, whatever the references chain.
//!
//! Both are owned by one task each (the publisher, the receiver): no locks.

use super::wire::MAX_TEXT;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one entry costs to hold beside its text's bytes, at either end
/// (a receiver's: its place in the list and its `Arc<String>`, 56 bytes,
/// and what the allocator rounds up), counted against the window with
/// its text. Counted in text alone, an entry without text (a first
/// token's) cost nothing, and a forged stream of them, or of one-byte
/// texts, was held without bound.
pub(crate) const ENTRY_COST: usize = 64;

/// Bytes per hashed block: references cover whole blocks.
pub(crate) const BLOCK: usize = 256;

/// The longest a chain of references runs from the whole text it starts
/// at: see [`renew_after`].
pub(crate) const RENEW_AT_MOST: Duration = Duration::from_secs(60);

/// How long after a text went whole later texts may still refer back to
/// it, directly or through others, with the stream keeping `history`:
/// a quarter of it, and at most [`RENEW_AT_MOST`]. A replica that starts
/// (or comes back) then resolves a peer's chains from their next whole
/// text, within that long, and a replay of the history resolves all but
/// its first quarter's. What it costs: each prefix in use goes whole once
/// per that time.
pub(crate) fn renew_after(history: Duration) -> Duration {
    (history / 4).min(RENEW_AT_MOST)
}

/// The chain of block hashes of `text`: entry `k` covers `text[..(k+1)*BLOCK]`.
///
/// The hashes never leave the process, so any good 64-bit hash does, seeded
/// at random per publisher: `foldhash`'s, which on a 52 KB prompt takes a
/// fraction of the instructions SipHash (the standard library's) took, and
/// the index below is keyed by it too. A collision would make a peer
/// rebuild a wrong text for one entry (2^-64 a pair of blocks; an attacker
/// cannot aim at a seed it does not know).
fn block_hashes(state: &foldhash::quality::RandomState, text: &[u8]) -> Vec<u64> {
    let mut out = Vec::with_capacity(text.len() / BLOCK);
    let mut prev = 0u64;
    for block in text.chunks_exact(BLOCK) {
        let mut h = state.build_hasher();
        h.write_u64(prev);
        h.write(block);
        prev = h.finish();
        out.push(prev);
    }
    out
}

/// The sender's memory of what it published recently.
#[derive(Debug)]
pub(crate) struct Outgoing {
    window: usize,
    /// How long a chain of references may run (see [`renew_after`]).
    renew: Duration,
    next_id: u64,
    /// Seeds the block hashes.
    state: foldhash::quality::RandomState,
    /// Block hash → the latest entry whose text has it.
    index: foldhash::HashMap<u64, u64>,
    /// Entries still referable, oldest first.
    recent: VecDeque<Sent>,
    bytes: usize,
}

/// An entry the sender may still refer to.
#[derive(Debug)]
struct Sent {
    id: u64,
    /// Its text's bytes and [`ENTRY_COST`].
    cost: usize,
    hashes: Vec<u64>,
    /// When the whole text its chain of references starts at was sent
    /// (its own time, if it went whole).
    root: Instant,
}

/// How one text is to be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Encoded {
    /// The entry's id.
    pub(crate) id: u64,
    /// `(entries back, base bytes)` when a prefix is sent by reference.
    pub(crate) base: Option<(u64, u64)>,
}

impl Outgoing {
    /// Refers only to entries within the last `window` bytes of texts
    /// whose chains start at most `renew` back; a `window` of 0 turns
    /// references off.
    pub(crate) fn new(window: usize, renew: Duration) -> Self {
        Self {
            window,
            renew,
            next_id: 0,
            state: foldhash::quality::RandomState::default(),
            index: foldhash::HashMap::default(),
            recent: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Numbers `text`, sent at `now`, and finds the longest remembered
    /// prefix of it.
    pub(crate) fn encode(&mut self, text: &[u8], now: Instant) -> Encoded {
        let id = self.next_id;
        self.next_id += 1;
        if self.window == 0 {
            return Encoded { id, base: None };
        }
        let hashes = block_hashes(&self.state, text);
        let mut base = None;
        for (k, h) in hashes.iter().enumerate() {
            match self.index.get(h) {
                Some(&entry) => base = Some((id - entry, ((k + 1) * BLOCK) as u64)),
                None => break,
            }
        }
        // The chain it would join started too long ago: this text goes
        // whole, and starts the chain anew.
        let root = base
            .and_then(|(back, _)| self.root_of(id - back))
            .filter(|root| now.saturating_duration_since(*root) <= self.renew);
        if root.is_none() {
            base = None;
        }
        for h in &hashes {
            self.index.insert(*h, id);
        }
        // As a receiver counts it: a reference never reaches further back
        // than its receivers hold.
        let cost = text.len() + ENTRY_COST;
        self.bytes += cost;
        self.recent.push_back(Sent {
            id,
            cost,
            hashes,
            root: root.unwrap_or(now),
        });
        while self.bytes > self.window && self.recent.len() > 1 {
            let old = self.recent.pop_front().expect("not empty");
            self.bytes -= old.cost;
            for h in old.hashes {
                if self.index.get(&h) == Some(&old.id) {
                    self.index.remove(&h);
                }
            }
        }
        Encoded { id, base }
    }

    /// When the chain of the remembered entry `id` started.
    fn root_of(&self, id: u64) -> Option<Instant> {
        let at = self.recent.binary_search_by_key(&id, |s| s.id).ok()?;
        Some(self.recent[at].root)
    }

    /// The id the next text will get.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id
    }
}

/// Why an entry's text could not be rebuilt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unresolved {
    /// The referenced entry is not held (a lost or aged-out message).
    MissingBase,
    /// The reference is inconsistent (longer than its base, bad UTF-8), or
    /// the text longer than [`MAX_TEXT`].
    Malformed,
}

/// One sender's texts, as this receiver rebuilt them.
#[derive(Debug)]
pub(crate) struct Incoming {
    keep: usize,
    /// Each held once, shared with the caller: a `String` behind the
    /// `Arc`, so a rebuilt text is not copied again into an `Arc<str>`.
    texts: VecDeque<(u64, Arc<String>)>,
    bytes: usize,
}

impl Incoming {
    /// Keeps at least the last `keep` bytes of texts (twice the sender's
    /// window).
    pub(crate) fn new(keep: usize) -> Self {
        Self {
            keep,
            texts: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Follows the sender's window, as its latest batch states it.
    pub(crate) fn set_keep(&mut self, keep: usize) {
        self.keep = keep;
    }

    /// Rebuilds entry `id`'s text and remembers it.
    pub(crate) fn resolve(
        &mut self,
        id: u64,
        base: Option<(u64, u64)>,
        suffix: &[u8],
    ) -> Result<Arc<String>, Unresolved> {
        // Each entry may be "all of the one before, and more": unrefused,
        // one text would grow by a message's worth per message, held as
        // the newest whatever `keep` says. Only this entry is refused (and
        // those that refer to it, as `MissingBase`), as other inconsistent
        // references are: the entries before it in its batch are applied
        // already, and what a batch may copy in all is bounded when it is
        // decoded (`wire::MAX_BATCH_TEXT`).
        let stated = base.map_or(0, |(_, len)| len);
        if stated.saturating_add(suffix.len() as u64) > MAX_TEXT as u64 {
            return Err(Unresolved::Malformed);
        }
        let text = match base {
            None => Arc::new(
                std::str::from_utf8(suffix)
                    .map_err(|_| Unresolved::Malformed)?
                    .to_owned(),
            ),
            Some((back, len)) => {
                let base_id = id.checked_sub(back).ok_or(Unresolved::Malformed)?;
                let at = self
                    .texts
                    .binary_search_by_key(&base_id, |(i, _)| *i)
                    .map_err(|_| Unresolved::MissingBase)?;
                let base: &str = &self.texts[at].1;
                let len = usize::try_from(len).map_err(|_| Unresolved::Malformed)?;
                if len > base.len() {
                    return Err(Unresolved::Malformed);
                }
                // The base is text already, so only what follows the last
                // whole character of its head is checked (a cut may fall
                // inside a character that the suffix completes): on a long
                // prompt the head is most of it.
                let whole = base.floor_char_boundary(len);
                let mut text = String::with_capacity(len + suffix.len());
                text.push_str(&base[..whole]);
                if whole == len {
                    text.push_str(std::str::from_utf8(suffix).map_err(|_| Unresolved::Malformed)?);
                } else {
                    let mut rest = base.as_bytes()[whole..len].to_vec();
                    rest.extend_from_slice(suffix);
                    let rest = String::from_utf8(rest).map_err(|_| Unresolved::Malformed)?;
                    text.push_str(&rest);
                }
                Arc::new(text)
            }
        };
        // Out of order (a batch sent again after its sender reconnected,
        // a replay overlapping live traffic): into its place, so that
        // later entries can refer to it.
        match self.texts.binary_search_by_key(&id, |(i, _)| *i) {
            Ok(at) => {
                self.bytes -= self.texts[at].1.len();
                self.bytes += text.len();
                self.texts[at].1 = text.clone();
            }
            Err(at) => {
                self.bytes += text.len() + ENTRY_COST;
                self.texts.insert(at, (id, text.clone()));
            }
        }
        while self.bytes > self.keep && self.texts.len() > 1 {
            let (_, old) = self.texts.pop_front().expect("not empty");
            self.bytes -= old.len() + ENTRY_COST;
        }
        Ok(text)
    }

    /// Bytes of text held, and [`ENTRY_COST`] for each entry.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Entries held.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.texts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(turns: usize) -> String {
        let mut s = "<system>".to_owned() + &"Answer with care. ".repeat(40);
        for t in 0..turns {
            s += &format!(
                "<user>question {t} {}<assistant>answer {t}",
                "x".repeat(300)
            );
        }
        s
    }

    /// What a receiver rebuilds is what the sender sent, and a follow-up
    /// turn travels as a reference plus its new part.
    #[test]
    fn a_next_turn_is_sent_as_a_reference_and_rebuilt_exactly() {
        let mut out = Outgoing::new(1 << 20, RENEW_AT_MOST);
        let mut inc = Incoming::new(2 << 20);
        let now = Instant::now();
        let mut sent_bytes = 0;
        let mut total = 0;
        for turns in 1..8 {
            let text = prompt(turns);
            let e = out.encode(text.as_bytes(), now);
            let cut = e.base.map_or(0, |(_, len)| len as usize);
            if turns > 1 {
                assert!(cut >= text.len() - 400 - BLOCK, "turn {turns}: {cut}");
            }
            sent_bytes += text.len() - cut;
            total += text.len();
            let got = inc.resolve(e.id, e.base, &text.as_bytes()[cut..]).unwrap();
            assert_eq!(got.as_str(), text);
        }
        assert!(sent_bytes * 3 < total, "{sent_bytes} of {total}");
    }

    #[test]
    fn references_stay_within_the_window() {
        let mut out = Outgoing::new(3 * BLOCK, RENEW_AT_MOST);
        let a = "a".repeat(2 * BLOCK);
        let b = "b".repeat(2 * BLOCK);
        let now = Instant::now();
        assert_eq!(out.encode(a.as_bytes(), now).base, None);
        assert!(out.encode(a.as_bytes(), now).base.is_some());
        out.encode(b.as_bytes(), now);
        out.encode(b.as_bytes(), now);
        assert_eq!(
            out.encode(a.as_bytes(), now).base,
            None,
            "a left the window"
        );
        assert_eq!(out.next_id(), 5);
        let mut off = Outgoing::new(0, RENEW_AT_MOST);
        assert_eq!(off.encode(a.as_bytes(), now).base, None);
    }

    /// A prefix in steady use: each text refers to the one before, so
    /// without a bound every one of them hangs on the first, which a
    /// receiver that started later never had. Past `renew` from the whole
    /// text the chain starts at, the next goes whole, and the chain goes on
    /// from it.
    #[test]
    fn a_chain_of_references_starts_again_from_a_whole_text_after_renew() {
        let renew = Duration::from_secs(60);
        let mut out = Outgoing::new(1 << 20, renew);
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let turn = |n: u64| format!("{}{n}", prompt(1));
        assert_eq!(out.encode(turn(0).as_bytes(), at(0)).base, None);
        for s in 1..=60 {
            let e = out.encode(turn(s).as_bytes(), at(s));
            assert_eq!(e.base.map(|(back, _)| back), Some(1), "at {s} s");
        }
        // 61 s after the chain's whole text.
        let whole = out.encode(turn(61).as_bytes(), at(61));
        assert_eq!(whole.base, None);
        let next = out.encode(turn(62).as_bytes(), at(62));
        assert_eq!(next.base.map(|(back, _)| back), Some(1));
        // A receiver that has texts from the whole one on only resolves
        // what follows it.
        let mut inc = Incoming::new(2 << 20);
        inc.resolve(whole.id, None, turn(61).as_bytes()).unwrap();
        let cut = next.base.unwrap().1 as usize;
        let got = inc
            .resolve(next.id, next.base, &turn(62).as_bytes()[cut..])
            .unwrap();
        assert_eq!(got.as_str(), turn(62));
        assert_eq!(renew_after(Duration::from_secs(600)), renew);
        assert_eq!(
            renew_after(Duration::from_secs(1)),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn missing_or_inconsistent_bases_are_refused() {
        let mut inc = Incoming::new(1 << 20);
        assert_eq!(
            inc.resolve(5, Some((1, 3)), b"x"),
            Err(Unresolved::MissingBase)
        );
        inc.resolve(4, None, "héllo".as_bytes()).unwrap();
        assert_eq!(
            inc.resolve(5, Some((1, 99)), b"x"),
            Err(Unresolved::Malformed)
        );
        assert_eq!(
            inc.resolve(5, Some((9, 1)), b"x"),
            Err(Unresolved::Malformed)
        );
        // Cut inside `é`, and a suffix that does not complete it.
        assert_eq!(
            inc.resolve(5, Some((1, 2)), b"x"),
            Err(Unresolved::Malformed)
        );
        // A cut inside a character is fine when the suffix completes it.
        let got = inc.resolve(6, Some((2, 2)), b"\xa9llo").unwrap();
        assert_eq!(got.as_str(), "h\u{e9}llo");
        // A suffix that is not text after a whole head is refused too, and
        // so is one that completes the cut character wrongly.
        assert_eq!(
            inc.resolve(7, Some((1, 3)), b"\xff"),
            Err(Unresolved::Malformed)
        );
        assert_eq!(
            inc.resolve(7, Some((1, 2)), b"\x41"),
            Err(Unresolved::Malformed)
        );
        // A four-byte character cut after each of its bytes.
        inc.resolve(7, None, "a\u{1f600}b".as_bytes()).unwrap();
        for (id, cut) in [(8, 2), (9, 3), (10, 4)] {
            let got = inc
                .resolve(
                    id,
                    Some((id - 7, cut)),
                    &"a\u{1f600}b".as_bytes()[cut as usize..],
                )
                .unwrap();
            assert_eq!(got.as_str(), "a\u{1f600}b", "cut at {cut}");
        }
        assert!(inc.bytes() > 0);
    }

    /// Each entry "all of the one before, and more": the text that would
    /// grow past what a sender ever sends is refused, and what is held
    /// stays within `keep` and one longest text.
    #[test]
    fn a_text_longer_than_any_sender_sends_is_refused() {
        let keep = 1 << 20;
        let mut inc = Incoming::new(keep);
        let more = vec![b'a'; 1 << 20];
        let mut last = (0, inc.resolve(0, None, &more).unwrap().len());
        let mut refused = 0;
        for id in 1..20 {
            match inc.resolve(id, Some((id - last.0, last.1 as u64)), &more) {
                Ok(text) => last = (id, text.len()),
                Err(e) => {
                    assert_eq!(e, Unresolved::Malformed);
                    refused += 1;
                }
            }
            assert!(inc.bytes() <= keep + MAX_TEXT, "{} bytes held", inc.bytes());
        }
        assert_eq!(last.1, MAX_TEXT, "the longest text a sender sends");
        assert_eq!(refused, 12);
    }

    /// A batch that comes late (sent again after its sender reconnected)
    /// takes its place among the texts: the entries after it that refer
    /// to it resolve, and so do those that refer to what came before it.
    #[test]
    fn a_late_entry_is_kept_in_order_and_referred_to() {
        let mut inc = Incoming::new(1 << 20);
        inc.resolve(1, None, b"first").unwrap();
        inc.resolve(5, None, b"fifth").unwrap();
        // 2 comes after 5, and refers to 1.
        assert_eq!(
            inc.resolve(2, Some((1, 5)), b" and second")
                .unwrap()
                .as_str(),
            "first and second"
        );
        assert_eq!(
            inc.resolve(3, Some((1, 16)), b", third").unwrap().as_str(),
            "first and second, third"
        );
        assert_eq!(
            inc.resolve(6, Some((1, 5)), b", sixth").unwrap().as_str(),
            "fifth, sixth"
        );
        // The same entry again replaces itself.
        let before = inc.bytes();
        inc.resolve(2, Some((1, 5)), b" and second").unwrap();
        assert_eq!(inc.bytes(), before);
    }
}
