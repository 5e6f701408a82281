use super::*;
use proptest::prelude::*;

fn header() -> Header {
    Header {
        cluster: "prod".into(),
        replica: "r-1".into(),
        instance: 0xdead_beef_0123_4567,
        seq: 300,
        sent_ms: 1_700_000_000_123,
    }
}

fn entry(model: &str, url: &str, base: Option<(u64, u64)>, suffix: &str) -> WireEntry {
    WireEntry {
        observed: None,
        model: model.into(),
        url: url.into(),
        base,
        suffix: suffix.as_bytes().to_vec(),
    }
}

fn sample() -> Inserts {
    Inserts {
        window: 8 << 20,
        first_entry: 41,
        entries: vec![
            entry("m", "http://10.0.0.1:30000", None, "<user>hello"),
            entry("m", "http://10.0.0.2:30000", Some((1, 6)), "bye"),
            entry("*", "http://10.0.0.1:30000", None, "日本語"),
        ],
        load: None,
    }
}

#[test]
fn inserts_and_loads_round_trip() {
    let bytes = encode_inserts(&header(), &sample());
    assert_eq!(decode(&bytes).unwrap(), (header(), Body::Inserts(sample())));
    let loads = vec![WorkerLoad {
        url: "http://a:1".into(),
        in_flight: u32::MAX,
        pending_prefill: u64::MAX,
    }];
    let bytes = encode_load(&header(), &loads, &[]);
    // Without first tokens the flag is clear: builds before it read it.
    assert_eq!(bytes[4], 0);
    assert_eq!(
        decode(&bytes).unwrap(),
        (header(), Body::Load(loads.clone(), Vec::new()))
    );
    let firsts = first_tokens();
    let bytes = encode_load(&header(), &loads, &firsts);
    assert_eq!(bytes[4], FLAG_OBSERVED);
    assert_eq!(
        decode(&bytes).unwrap(),
        (header(), Body::Load(loads, firsts.clone()))
    );
    // A report of no load may carry first tokens alone.
    let bytes = encode_load(&header(), &[], &firsts);
    assert_eq!(
        decode(&bytes).unwrap(),
        (header(), Body::Load(Vec::new(), firsts))
    );
}

fn first_tokens() -> Vec<FirstToken> {
    vec![
        FirstToken {
            model: "m".into(),
            url: "http://10.0.0.1:30000".into(),
            observed: Observed {
                queued_chars: 0,
                uncached_chars: u64::MAX,
                in_flight: 3,
                ttft_us: MAX_OBSERVED_TTFT_US,
            },
        },
        FirstToken {
            model: "*".into(),
            url: "http://10.0.0.2:30000".into(),
            observed: Observed {
                queued_chars: 4096,
                uncached_chars: 17,
                in_flight: 0,
                ttft_us: 1,
            },
        },
    ]
}

#[test]
fn urls_and_models_are_sent_once_per_batch() {
    let one = Inserts {
        window: 0,
        first_entry: 0,
        entries: vec![entry("m", "http://10.0.0.1:30000", None, "x")],
        load: None,
    };
    let mut many = one.clone();
    many.entries = vec![one.entries[0].clone(); 10];
    let (a, b) = (
        encode_inserts(&header(), &one).len(),
        encode_inserts(&header(), &many).len(),
    );
    // Each further entry: model and url indexes, no base, a 1-byte text.
    assert_eq!(b - a, 9 * 5);
}

#[test]
fn wrong_magic_version_kind_and_flags_are_refused() {
    let good = encode_inserts(&header(), &sample());
    let mut bad = good.clone();
    bad[0] = b'X';
    assert_eq!(decode(&bad).unwrap_err().reason(), "malformed");
    let mut v2 = good.clone();
    v2[2] = 2;
    assert_eq!(decode(&v2).unwrap_err(), WireError::Version(2));
    let mut kind = good.clone();
    kind[3] = 9;
    assert_eq!(
        decode(&kind).unwrap_err(),
        WireError::Malformed("unknown kind")
    );
    let mut flags = good.clone();
    flags[4] = 4;
    assert_eq!(
        decode(&flags).unwrap_err(),
        WireError::Malformed("unknown flags")
    );
    // The load flag belongs to inserts only.
    let mut load = encode_load(&header(), &[], &[]);
    load[4] = FLAG_LOAD;
    assert_eq!(
        decode(&load).unwrap_err(),
        WireError::Malformed("unknown flags")
    );
    // The observation flag on a report says first tokens follow.
    load[4] = FLAG_OBSERVED;
    assert_eq!(
        decode(&load).unwrap_err(),
        WireError::Malformed("first token count")
    );
    // A first token's wait is bounded as in a batch.
    let mut long = first_tokens();
    long[0].observed.ttft_us = MAX_OBSERVED_TTFT_US + 1;
    assert_eq!(
        decode(&encode_load(&header(), &[], &long)).unwrap_err(),
        WireError::Malformed("first token")
    );
    let mut trailing = good;
    trailing.push(0);
    assert_eq!(
        decode(&trailing).unwrap_err(),
        WireError::Malformed("trailing bytes")
    );
}

fn observed(ttft_us: u64) -> Observed {
    Observed {
        queued_chars: 12_000,
        uncached_chars: 300,
        in_flight: 7,
        ttft_us,
    }
}

/// `sample()` with a first-token observation on its first entry.
fn sample_observed() -> Inserts {
    let mut batch = sample();
    batch.entries[0].observed = Some(observed(41_250));
    batch
}

#[test]
fn observations_round_trip_and_only_batches_with_one_are_flagged() {
    let bytes = encode_inserts(&header(), &sample_observed());
    assert_eq!(bytes[4], FLAG_OBSERVED);
    assert_eq!(
        decode(&bytes).unwrap(),
        (header(), Body::Inserts(sample_observed()))
    );
    // Without one, the batch is what builds before observations read.
    assert_eq!(encode_inserts(&header(), &sample())[4], 0);
    // Each entry pays one byte, and the one observed its four numbers.
    let plain = encode_inserts(&header(), &sample()).len();
    assert_eq!(bytes.len() - plain, 3 + 2 + 2 + 1 + 3);
}

/// `sample_observed()` carrying a load report.
fn sample_with_load() -> Inserts {
    let mut batch = sample_observed();
    batch.load = Some((
        17,
        vec![
            WorkerLoad {
                url: "http://10.0.0.1:30000".into(),
                in_flight: 3,
                pending_prefill: 9_000,
            },
            WorkerLoad {
                url: "http://10.0.0.2:30000".into(),
                in_flight: 0,
                pending_prefill: 0,
            },
        ],
    ));
    batch
}

#[test]
fn a_load_report_rides_on_a_batch_and_only_such_batches_are_flagged() {
    let bytes = encode_inserts(&header(), &sample_with_load());
    assert_eq!(bytes[4], FLAG_OBSERVED | FLAG_LOAD);
    assert_eq!(
        decode(&bytes).unwrap(),
        (header(), Body::Inserts(sample_with_load()))
    );
    // An empty report still says "nothing in flight", and a batch may
    // carry no entries: a report is never lost for want of a decision.
    let mut empty = sample();
    empty.entries.clear();
    empty.load = Some((1, Vec::new()));
    let bytes = encode_inserts(&header(), &empty);
    assert_eq!(bytes[4], FLAG_LOAD);
    assert_eq!(decode(&bytes).unwrap(), (header(), Body::Inserts(empty)));
    // Every cut of it is refused, never read short.
    let bytes = encode_inserts(&header(), &sample_with_load());
    for cut in 0..bytes.len() {
        assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn an_observation_converts_both_ways_and_a_long_wait_is_capped() {
    let seen = Observation {
        work: Work {
            queued_chars: 12_000,
            uncached_chars: 300,
            in_flight: 7,
        },
        elapsed: std::time::Duration::from_micros(41_250),
    };
    let sent = Observed::from(seen);
    assert_eq!(sent, observed(41_250));
    assert_eq!(Observation::from(sent), seen);
    let hour = Observation {
        elapsed: std::time::Duration::from_secs(3600),
        ..seen
    };
    assert_eq!(Observed::from(hour).ttft_us, MAX_OBSERVED_TTFT_US);
}

#[test]
fn bad_observations_are_refused() {
    let good = encode_inserts(&header(), &sample_observed());
    // The entry's `seen` byte comes right after its text ("<user>hello").
    let at = good.windows(11).position(|w| w == b"<user>hello").unwrap() + 11;
    assert_eq!(good[at], 1);
    let mut seen = good.clone();
    seen[at] = 2;
    assert_eq!(
        decode(&seen).unwrap_err(),
        WireError::Malformed("observation")
    );
    let mut slow = sample();
    slow.entries[2].observed = Some(observed(MAX_OBSERVED_TTFT_US + 1));
    assert_eq!(
        decode(&encode_inserts(&header(), &slow)).unwrap_err(),
        WireError::Malformed("first token")
    );
    slow.entries[2].observed = Some(observed(MAX_OBSERVED_TTFT_US));
    assert!(decode(&encode_inserts(&header(), &slow)).is_ok());
    for cut in 0..good.len() {
        assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let good = encode_inserts(&header(), &sample());
    for cut in 0..good.len() {
        assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
    }
    let load = encode_load(
        &header(),
        &[WorkerLoad {
            url: "http://a:1".into(),
            in_flight: 3,
            pending_prefill: 9,
        }],
        &first_tokens(),
    );
    for cut in 0..load.len() {
        assert!(decode(&load[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn huge_counts_and_lengths_are_refused_without_allocating() {
    let mut h = Vec::new();
    put_header(&mut h, KIND_INSERTS, 0, &header());
    let mut big_table = h.clone();
    put_var(&mut big_table, u64::MAX);
    assert_eq!(
        decode(&big_table).unwrap_err(),
        WireError::Malformed("string table")
    );
    let mut big_string = h.clone();
    put_var(&mut big_string, 1);
    put_var(&mut big_string, 1 << 40);
    assert!(decode(&big_string).is_err());
    let mut big_entries = h.clone();
    put_var(&mut big_entries, 0); // string table
    put_var(&mut big_entries, 0); // window
    put_var(&mut big_entries, 0); // first entry
    put_var(&mut big_entries, 1 << 30);
    assert_eq!(
        decode(&big_entries).unwrap_err(),
        WireError::Malformed("entry count")
    );
    let mut overlong_var = h;
    overlong_var.extend_from_slice(&[0xff; 11]);
    assert!(decode(&overlong_var).is_err());
    assert!(decode(&vec![0u8; MAX_MESSAGE + 1]).is_err());
}

/// Entries that all name one long table string share it: what a batch
/// decodes to grows with its bytes, not with its entries times its table
/// strings. (With a copy per entry, a forged 1 MiB batch of 4-byte entries
/// naming one 512 KiB string asked for about 137 GB.)
#[test]
fn entries_share_the_table_strings_they_name() {
    let long = "m".repeat(4096);
    let entries = 2000;
    let mut bytes = Vec::new();
    put_header(&mut bytes, KIND_INSERTS, 0, &header());
    put_var(&mut bytes, 1);
    put_bytes(&mut bytes, long.as_bytes());
    put_var(&mut bytes, 0); // window
    put_var(&mut bytes, 0); // first entry
    put_var(&mut bytes, entries);
    for _ in 0..entries {
        // Model 0, URL 0, no base, no text.
        bytes.extend_from_slice(&[0, 0, 0, 0]);
    }
    let Ok((_, Body::Inserts(batch))) = decode(&bytes) else {
        panic!("not decoded");
    };
    assert_eq!(batch.entries.len(), entries as usize);
    // The string bytes held, each place in memory once.
    let mut held = std::collections::HashMap::new();
    for e in &batch.entries {
        for s in [&*e.model, &*e.url] {
            assert_eq!(s, long);
            held.insert(s.as_ptr(), s.len());
        }
    }
    let held: usize = held.values().sum();
    assert!(
        held <= bytes.len(),
        "{held} bytes of strings from a message of {}",
        bytes.len()
    );
}

/// A batch whose entries, each "all of the one before", would rebuild
/// more text than a sender puts in one batch is refused whole, before
/// anything is copied: a forged 1 MiB batch of 7-byte entries naming a
/// 512 KiB text cost about 0.6 s of copying, an 8 MiB one about 30 s.
#[test]
fn a_batch_that_rebuilds_more_text_than_a_sender_sends_is_refused() {
    let text = 1 << 20;
    let batch = |entries: u64| {
        let mut bytes = Vec::new();
        put_header(&mut bytes, KIND_INSERTS, 0, &header());
        put_var(&mut bytes, 2);
        put_bytes(&mut bytes, b"m");
        put_bytes(&mut bytes, b"http://10.0.0.1:30000");
        put_var(&mut bytes, 0); // window
        put_var(&mut bytes, 0); // first entry
        put_var(&mut bytes, entries);
        bytes.extend_from_slice(&[0, 1, 0]);
        put_bytes(&mut bytes, &vec![b'a'; text]);
        for _ in 1..entries {
            // All of the entry before, and nothing more.
            bytes.extend_from_slice(&[0, 1, 1]);
            put_var(&mut bytes, text as u64);
            put_bytes(&mut bytes, b"");
        }
        bytes
    };
    let most = (MAX_BATCH_TEXT / text) as u64;
    assert!(decode(&batch(most)).is_ok());
    assert_eq!(
        decode(&batch(most + 1)).err(),
        Some(WireError::Malformed("more text than a batch rebuilds"))
    );
}

#[test]
fn bad_indexes_and_bad_utf8_are_refused() {
    let mut h = Vec::new();
    put_header(&mut h, KIND_INSERTS, 0, &header());
    let mut index = h.clone();
    put_var(&mut index, 1);
    put_bytes(&mut index, b"m");
    put_var(&mut index, 0); // window
    put_var(&mut index, 0); // first entry
    put_var(&mut index, 1);
    put_var(&mut index, 0);
    put_var(&mut index, 5); // url index outside the table
    put_var(&mut index, 0);
    put_bytes(&mut index, b"text");
    assert_eq!(
        decode(&index).unwrap_err(),
        WireError::Malformed("string index")
    );
    let mut utf8 = h;
    put_var(&mut utf8, 1);
    put_bytes(&mut utf8, &[0xff, 0xfe]);
    assert_eq!(decode(&utf8).unwrap_err(), WireError::Malformed("string"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any bytes at all: an answer, never a panic.
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
    }

    /// A valid message with bytes flipped: an answer, never a panic.
    #[test]
    fn mutations_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut bytes = encode_inserts(&header(), &sample_with_load());
        for (at, b) in flips {
            let i = at % bytes.len();
            bytes[i] = b;
        }
        let _ = decode(&bytes);
    }

    /// Whatever the texts and numbers, what is encoded decodes the same
    /// (a base as long as a text may be: a batch that states more text is
    /// refused).
    #[test]
    fn round_trips(texts in proptest::collection::vec(".{0,40}", 0..6), first in any::<u64>(), back in 0u64..1000, len in any::<u64>(), base_len in 0..=MAX_TEXT as u64, ttft in 0..=MAX_OBSERVED_TTFT_US) {
        let batch = Inserts {
            window: len / 3,
            first_entry: first,
            entries: texts
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let mut e = entry(&format!("m{}", i % 2), "http://a:1", (back > 0).then_some((back, base_len)), t);
                    e.observed = (i % 3 == 1).then_some(Observed { queued_chars: len, uncached_chars: back, in_flight: first, ttft_us: ttft });
                    e
                })
                .collect(),
            load: (back % 2 == 1).then(|| (first, vec![WorkerLoad { url: format!("http://w:{back}"), in_flight: (len % 1000) as u32, pending_prefill: len }])),
        };
        let bytes = encode_inserts(&header(), &batch);
        // The publisher sizes its batches by these bounds.
        let bound = inserts_frame_bound(&header(), batch.load.as_ref().map(|(_, l)| l.as_slice()))
            + batch.entries.iter().map(|e| entry_bound(e.suffix.len(), &e.model, &e.url)).sum::<usize>();
        prop_assert!(bytes.len() <= bound, "{} bytes over the bound {}", bytes.len(), bound);
        prop_assert_eq!(decode(&bytes).unwrap(), (header(), Body::Inserts(batch)));
    }
}
