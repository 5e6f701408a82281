//! The decoder on both payload shapes, malformed frames, truncations and
//! mutations of valid payloads, and the replay helpers.

mod common;

use common::*;
use proptest::prelude::*;
use radixgate_kv::wire::{
    MAX_PAYLOAD_VALUES, REPLAY_END, ReplayReply, count_values, decode_message, decode_payload,
    is_replay_end, replay_request, split_message, split_replay_reply,
};
use radixgate_kv::{BlockStored, EngineHash, KvEvent, WireError};
use rmpv::Value;

const TOKENS: [u32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

fn expected_stored(hashes: Vec<EngineHash>, parent: Option<EngineHash>) -> KvEvent {
    KvEvent::Stored(BlockStored {
        block_hashes: hashes,
        parent,
        token_ids: TOKENS.to_vec(),
        block_size: 4,
        lora_id: None,
        extra_keys: Vec::new(),
    })
}

#[test]
fn array_shape_with_int_hashes_and_nil_parent() {
    let payload = batch(
        vec![
            stored_array(vec![int(11), int(12)], Value::Nil, &TOKENS, 4, Value::Nil),
            removed_array(vec![int(11)], Value::Nil),
            cleared_array(),
        ],
        int(3),
    );
    let (seq, b) = decode_message(&frames(42, payload)).unwrap();
    assert_eq!(seq, 42);
    assert_eq!(b.data_parallel_rank, Some(3));
    assert_eq!(b.ts, 1_700_000_000.5);
    assert_eq!(
        b.events,
        vec![
            expected_stored(vec![EngineHash(11), EngineHash(12)], None),
            KvEvent::Removed(vec![EngineHash(11)]),
            KvEvent::Cleared,
        ]
    );
    assert_eq!(b.block_events(), 4);
}

#[test]
fn map_shape_with_bytes_hashes_and_a_parent() {
    let h1 = [7u8; 32];
    let h2 = [8u8; 5];
    let parent = [9u8; 32];
    let payload = batch(
        vec![
            stored_map(vec![bin(&h1), bin(&h2)], bin(&parent), &TOKENS, 4, s("GPU")),
            removed_map(vec![bin(&h1)], s("GPU")),
            cleared_map(),
        ],
        Value::Nil,
    );
    let b = decode_payload(&payload).unwrap();
    assert_eq!(b.data_parallel_rank, None);
    // Distinct byte hashes of one length are distinct handles.
    assert_ne!(EngineHash::from_bytes(&h1), EngineHash::from_bytes(&parent));
    assert_eq!(
        b.events,
        vec![
            expected_stored(
                vec![EngineHash::from_bytes(&h1), EngineHash::from_bytes(&h2)],
                Some(EngineHash::from_bytes(&parent)),
            ),
            KvEvent::Removed(vec![EngineHash::from_bytes(&h1)]),
            KvEvent::Cleared,
        ]
    );
}

#[test]
fn signed_and_unsigned_integer_hashes_keep_their_bits() {
    let payload = batch(
        vec![removed_array(
            vec![int(-1), uint(u64::MAX - 1), int(i64::MIN)],
            Value::Nil,
        )],
        Value::Nil,
    );
    let b = decode_payload(&payload).unwrap();
    assert_eq!(
        b.events,
        vec![KvEvent::Removed(vec![
            EngineHash(u64::MAX),
            EngineHash(u64::MAX - 1),
            EngineHash(1 << 63),
        ])]
    );
}

#[test]
fn non_gpu_media_are_skipped_in_both_shapes() {
    let events = vec![
        stored_array(vec![int(1), int(2)], Value::Nil, &TOKENS, 4, s("CPU")),
        stored_map(vec![int(1), int(2)], Value::Nil, &TOKENS, 4, s("cpu")),
        removed_array(vec![int(1)], s("STORAGE")),
        removed_map(vec![int(1)], s("CPU")),
        // Case does not matter for GPU; nil and missing mean GPU.
        removed_array(vec![int(5)], s("gpu")),
        removed_map(vec![int(6)], Value::Nil),
        Value::Array(vec![s("BlockRemoved"), Value::Array(vec![int(7)])]),
    ];
    let b = decode_payload(&batch(events, Value::Nil)).unwrap();
    assert_eq!(b.skipped.other_medium, 4);
    assert_eq!(
        b.events,
        vec![
            KvEvent::Removed(vec![EngineHash(5)]),
            KvEvent::Removed(vec![EngineHash(6)]),
            KvEvent::Removed(vec![EngineHash(7)]),
        ]
    );
}

#[test]
fn unknown_keys_extra_fields_and_unknown_tags_are_tolerated() {
    let Value::Array(mut stored) =
        stored_array(vec![int(1), int(2)], Value::Nil, &TOKENS, 4, Value::Nil)
    else {
        unreachable!()
    };
    // lora_name, extra_keys, group_idx, and more to come.
    stored.extend([
        Value::Nil,
        Value::Array(vec![Value::Nil, Value::Nil]),
        int(0),
        s("x"),
    ]);
    let Value::Map(mut map) = stored_map(vec![int(1), int(2)], Value::Nil, &TOKENS, 4, Value::Nil)
    else {
        unreachable!()
    };
    map.push((s("group_idx"), int(1)));
    map.push((s("kv_cache_spec_kind"), s("full")));
    map.push((int(5), s("a non-string key")));
    let events = vec![
        Value::Array(stored),
        Value::Map(map),
        Value::Array(vec![s("BlockPinned"), Value::Array(vec![int(1)])]),
        Value::Map(vec![(s("type"), s("SomethingNew")), (s("x"), int(1))]),
    ];
    // A batch may carry more trailing fields too.
    let payload = encode(&Value::Array(vec![
        Value::from(17),
        Value::Array(events),
        int(0),
        s("future"),
    ]));
    let b = decode_payload(&payload).unwrap();
    assert_eq!(b.ts, 17.0);
    assert_eq!(b.skipped.unknown_tag, 2);
    let want = expected_stored(vec![EngineHash(1), EngineHash(2)], None);
    assert_eq!(b.events, vec![want.clone(), want]);
}

/// Two blocks' `BlockStored`, GPU, as a map with `extra` after its fields.
fn stored_map_with(extra: Vec<(Value, Value)>) -> Value {
    let Value::Map(mut map) = stored_map(vec![int(1), int(2)], Value::Nil, &TOKENS, 4, s("GPU"))
    else {
        unreachable!()
    };
    map.extend(extra);
    Value::Map(map)
}

/// The same as an array, with `extra` after its fields.
fn stored_array_with(extra: Vec<Value>) -> Value {
    let Value::Array(mut array) =
        stored_array(vec![int(1), int(2)], Value::Nil, &TOKENS, 4, s("GPU"))
    else {
        unreachable!()
    };
    array.extend(extra);
    Value::Array(array)
}

/// vLLM's `extra_keys` (one entry per block, `None` or a tuple of what
/// else the block's hash was computed with) are read as a digest per
/// block in both shapes; two different entries give two digests.
#[test]
fn extra_keys_are_read_per_block() {
    let salted = |salt: &str| Value::Array(vec![s(salt)]);
    let keys = |entries: Vec<Value>| (s("extra_keys"), Value::Array(entries));
    let map = stored_map_with(vec![keys(vec![salted("salt-a"), Value::Nil])]);
    // lora_name, then extra_keys.
    let array = stored_array_with(vec![
        Value::Nil,
        Value::Array(vec![Value::Array(vec![]), salted("salt-b")]),
    ]);
    let payload = batch(vec![map, array], Value::Nil);
    let b = decode_payload(&payload).unwrap();
    let extra = |e: &KvEvent| match e {
        KvEvent::Stored(s) => s.extra_keys.clone(),
        _ => unreachable!(),
    };
    let (a, b) = (extra(&b.events[0]), extra(&b.events[1]));
    assert_eq!((a.len(), a[1], b.len(), b[0]), (2, 0, 2, 0));
    assert!(a[0] != 0 && b[1] != 0 && a[0] != b[1], "{a:?} {b:?}");

    // In an array, another field in its place is taken for none.
    let other = Value::Array(vec![salted("x"), Value::Nil]);
    let array = stored_array_with(vec![Value::Nil, int(1), other]);
    let b = decode_payload(&batch(vec![array], Value::Nil)).unwrap();
    assert_eq!(extra(&b.events[0]), Vec::<u64>::new());

    // Named, not one per block or not a list: the batch is refused.
    for bad in [Value::Array(vec![salted("x")]), s("salt")] {
        let map = stored_map_with(vec![(s("extra_keys"), bad)]);
        assert!(decode_payload(&batch(vec![map], Value::Nil)).is_err());
    }
}

#[test]
fn batch_as_a_map_and_batch_without_rank() {
    let events = Value::Array(vec![cleared_map()]);
    let map = encode(&Value::Map(vec![
        (s("ts"), Value::F32(2.5)),
        (s("events"), events.clone()),
        (s("data_parallel_rank"), int(1)),
    ]));
    let b = decode_payload(&map).unwrap();
    assert_eq!((b.ts, b.data_parallel_rank), (2.5, Some(1)));
    let short = encode(&Value::Array(vec![Value::F64(3.0), events]));
    let b = decode_payload(&short).unwrap();
    assert_eq!((b.events.len(), b.data_parallel_rank), (1, None));
}

#[test]
fn sequence_frame_with_a_stream_id() {
    let mut seq = 5u64.to_be_bytes().to_vec();
    seq.extend([0xab; 16]);
    let frames = vec![Vec::new(), seq, batch(vec![], Value::Nil)];
    let m = split_message(&frames).unwrap();
    assert_eq!(
        (m.seq, m.stream_id, m.topic),
        (5, Some([0xab; 16]), &b""[..])
    );
    assert!(m.decode().unwrap().events.is_empty());
}

fn err(frames: &[Vec<u8>]) -> WireError {
    decode_message(frames).expect_err("must not decode")
}

#[test]
fn malformed_frames_are_typed_errors() {
    let good = batch(vec![cleared_array()], Value::Nil);
    let f = frames(1, good.clone());
    assert!(matches!(err(&f[..2]), WireError::FrameCount(2)));
    let mut four = f.clone();
    four.push(Vec::new());
    assert!(matches!(err(&four), WireError::FrameCount(4)));
    assert!(matches!(err(&[]), WireError::FrameCount(0)));
    for len in [0, 7, 9, 23, 25] {
        let bad = vec![Vec::new(), vec![0; len], good.clone()];
        assert!(matches!(err(&bad), WireError::SequenceLength(n) if n == len));
    }
    let mut trailing = good.clone();
    trailing.push(0xc0);
    assert!(matches!(
        err(&frames(1, trailing)),
        WireError::TrailingBytes(1)
    ));
    // 0xc1 is a reserved msgpack marker; 0x92 announces two elements.
    assert!(decode_message(&frames(1, vec![0xc1])).is_err());
    assert!(matches!(
        err(&frames(1, vec![0x92, 0x01])),
        WireError::Msgpack(_)
    ));
    assert!(matches!(err(&frames(1, Vec::new())), WireError::Msgpack(_)));
}

#[test]
fn wrong_types_are_typed_errors() {
    let cases: Vec<(Value, &str)> = vec![
        (int(5), "payload"),
        (Value::Array(vec![s("x"), Value::Array(vec![])]), "ts"),
        (Value::Array(vec![Value::F64(1.0), int(3)]), "events"),
        (
            Value::Array(vec![Value::F64(1.0), Value::Array(vec![]), s("r")]),
            "data_parallel_rank",
        ),
        (
            Value::Array(vec![Value::F64(1.0), Value::Array(vec![int(1)])]),
            "event",
        ),
        (
            Value::Array(vec![
                Value::F64(1.0),
                Value::Array(vec![Value::Array(vec![])]),
            ]),
            "event",
        ),
        (
            Value::Array(vec![
                Value::F64(1.0),
                Value::Array(vec![Value::Array(vec![int(1)])]),
            ]),
            "event",
        ),
        (
            Value::Array(vec![
                Value::F64(1.0),
                Value::Array(vec![Value::Map(vec![])]),
            ]),
            "event",
        ),
    ];
    let events = |e: Value| Value::Array(vec![Value::F64(1.0), Value::Array(vec![e])]);
    let mut cases = cases;
    cases.extend([
        (
            events(stored_array(
                vec![s("h")],
                Value::Nil,
                &TOKENS,
                4,
                Value::Nil,
            )),
            "BlockStored",
        ),
        (
            events(stored_array(vec![int(1)], s("p"), &TOKENS, 4, Value::Nil)),
            "BlockStored",
        ),
        (
            events(stored_array(
                vec![int(1)],
                Value::Nil,
                &TOKENS,
                0,
                Value::Nil,
            )),
            "block_size",
        ),
        (
            events(stored_map(vec![int(1)], Value::Nil, &TOKENS, 4, int(3))),
            "medium",
        ),
        (
            events(removed_map(vec![Value::F64(1.0)], Value::Nil)),
            "BlockRemoved",
        ),
        (
            events(Value::Array(vec![s("BlockRemoved")])),
            "BlockRemoved",
        ),
        (
            events(Value::Array(vec![
                s("BlockStored"),
                Value::Array(vec![int(1)]),
            ])),
            "BlockStored",
        ),
        (
            events(Value::Array(vec![
                s("BlockStored"),
                Value::Array(vec![int(1)]),
                Value::Nil,
                Value::Array(vec![int(-1)]),
                int(1),
            ])),
            "token_ids",
        ),
        (
            events(Value::Array(vec![
                s("BlockStored"),
                Value::Array(vec![int(1)]),
                Value::Nil,
                Value::Array(vec![uint(1 << 32)]),
                int(1),
            ])),
            "token_ids",
        ),
    ]);
    for (value, at) in cases {
        match decode_payload(&encode(&value)) {
            Err(WireError::Shape { at: got, .. }) => assert_eq!(got, at, "{value}"),
            other => panic!("{value}: expected a shape error at {at}, got {other:?}"),
        }
    }
}

fn valid_payloads() -> Vec<Vec<u8>> {
    vec![
        batch(
            vec![
                stored_array(vec![int(1), uint(u64::MAX)], int(-3), &TOKENS, 4, s("GPU")),
                removed_array(vec![int(1)], Value::Nil),
                cleared_array(),
            ],
            int(2),
        ),
        batch(
            vec![
                stored_map(
                    vec![bin(&[1; 32]), bin(&[2; 32])],
                    bin(&[3; 32]),
                    &TOKENS,
                    4,
                    s("GPU"),
                ),
                removed_map(vec![bin(&[1; 32])], s("CPU")),
                cleared_map(),
            ],
            Value::Nil,
        ),
    ]
}

#[test]
fn every_truncation_of_a_valid_payload_is_an_error() {
    for payload in valid_payloads() {
        assert!(decode_payload(&payload).is_ok());
        for cut in 0..payload.len() {
            assert!(
                decode_payload(&payload[..cut]).is_err(),
                "a payload cut to {cut} of {} bytes decoded",
                payload.len()
            );
        }
    }
}

#[test]
fn hostile_nesting_and_lengths_are_errors() {
    // 100 000 nested one-element arrays.
    let deep = vec![0x91; 100_000];
    assert!(decode_payload(&deep).is_err());
    // An array header claiming 2^32-1 elements, with none following.
    assert!(decode_payload(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
    assert!(decode_payload(&[0xc6, 0xff, 0xff, 0xff, 0xff]).is_err());
}

#[test]
fn a_payload_of_too_many_values_is_refused_before_it_is_decoded() {
    let at_limit = removed_of_tiny_hashes(MAX_PAYLOAD_VALUES - 6);
    assert_eq!(
        count_values(&at_limit, MAX_PAYLOAD_VALUES),
        MAX_PAYLOAD_VALUES
    );
    let batch = decode_payload(&at_limit).expect("at the limit");
    assert_eq!(batch.block_events(), MAX_PAYLOAD_VALUES - 6);
    let over = removed_of_tiny_hashes(MAX_PAYLOAD_VALUES - 5);
    assert_eq!(
        count_values(&over, MAX_PAYLOAD_VALUES),
        MAX_PAYLOAD_VALUES + 1
    );
    assert!(matches!(
        decode_payload(&over),
        Err(WireError::TooManyValues {
            limit: MAX_PAYLOAD_VALUES
        })
    ));
}

/// Any msgpack value, every marker kind among them: fixed and 8/16-bit
/// lengths of strings, binaries, extensions, arrays and maps; floats of
/// both widths.
fn every_kind() -> impl Strategy<Value = Value> {
    let scalar = prop_oneof![
        leaf(),
        any::<f32>().prop_map(Value::F32),
        "[a-z]{0,300}".prop_map(Value::from),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Value::Binary),
        (any::<i8>(), proptest::collection::vec(any::<u8>(), 0..20))
            .prop_map(|(kind, data)| Value::Ext(kind, data)),
    ];
    scalar.prop_recursive(3, 64, 20, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..20).prop_map(Value::Array),
            proptest::collection::vec((inner.clone(), inner), 0..18).prop_map(Value::Map),
        ]
    })
}

proptest! {
    /// The count reads every kind of msgpack value as the decoder does.
    #[test]
    fn values_are_counted_as_decoded(value in every_kind()) {
        fn nodes(v: &Value) -> usize {
            1 + match v {
                Value::Array(items) => items.iter().map(nodes).sum(),
                Value::Map(entries) => entries.iter().map(|(k, v)| nodes(k) + nodes(v)).sum(),
                _ => 0,
            }
        }
        let bytes = encode(&value);
        prop_assert_eq!(count_values(&bytes, usize::MAX - 1), nodes(&value));
        let all = nodes(&value);
        prop_assert_eq!(count_values(&bytes, all - 1), all);
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
}

proptest! {
    /// Mutated payloads decode or fail; they never panic.
    #[test]
    fn mutated_payloads_never_panic(
        which in 0usize..2,
        mutations in proptest::collection::vec(
            prop_oneof![
                (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
                (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
                any::<usize>().prop_map(Mutation::Delete),
            ],
            1..6,
        ),
    ) {
        let mut p = valid_payloads().swap_remove(which);
        for m in mutations {
            match m {
                Mutation::Flip(i, b) if !p.is_empty() => { let n = p.len(); p[i % n] ^= b | 1; }
                Mutation::Insert(i, b) => { let n = p.len(); p.insert(i % (n + 1), b); }
                Mutation::Delete(i) if !p.is_empty() => { let n = p.len(); p.remove(i % n); }
                _ => {}
            }
        }
        let _ = decode_payload(&p);
        let _ = decode_message(&frames(0, p));
    }
}

/// Any msgpack scalar, biased to the ones the decoder looks at.
fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (0u64..300).prop_map(Value::from),
        prop::sample::select(vec![0i64, -1, 1 << 32, i64::MIN]).prop_map(Value::from),
        any::<f64>().prop_map(Value::F64),
        prop::sample::select(vec![
            "BlockStored",
            "BlockRemoved",
            "AllBlocksCleared",
            "GPU",
            "CPU",
            "type"
        ])
        .prop_map(Value::from),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Binary),
    ]
}

/// Any msgpack value, scalars most often.
fn any_value() -> impl Strategy<Value = Value> {
    let nested = leaf().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    });
    prop_oneof![3 => leaf(), 1 => nested]
}

/// Replaces the `n`th node (pre-order, wrapping) of a value tree.
fn replace_nth(v: &mut Value, n: &mut usize, with: &Value) -> bool {
    if *n == 0 {
        *v = with.clone();
        return true;
    }
    *n -= 1;
    match v {
        Value::Array(items) => items.iter_mut().any(|c| replace_nth(c, n, with)),
        Value::Map(entries) => entries
            .iter_mut()
            .any(|(k, c)| replace_nth(k, n, with) || replace_nth(c, n, with)),
        _ => false,
    }
}

fn valid_values() -> Vec<Value> {
    valid_payloads()
        .iter()
        .map(|p| rmpv::decode::read_value(&mut &p[..]).expect("valid"))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// A valid payload with any one node replaced by any value decodes or
    /// fails; it never panics.
    #[test]
    fn payloads_with_a_node_replaced_never_panic(
        which in 0usize..2,
        node in any::<usize>(),
        with in any_value(),
    ) {
        let mut v = valid_values().swap_remove(which);
        // Count nodes to pick one uniformly.
        let mut count = 0;
        fn nodes(v: &Value, c: &mut usize) {
            *c += 1;
            match v {
                Value::Array(items) => items.iter().for_each(|i| nodes(i, c)),
                Value::Map(e) => e.iter().for_each(|(k, i)| { nodes(k, c); nodes(i, c) }),
                _ => {}
            }
        }
        nodes(&v, &mut count);
        let mut n = node % count;
        prop_assert!(replace_nth(&mut v, &mut n, &with));
        let _ = decode_payload(&encode(&v));
    }
}

#[test]
fn replay_helpers() {
    assert_eq!(replay_request(258), [0, 0, 0, 0, 0, 0, 1, 2]);
    // The engines send -1 as a signed 64-bit big-endian integer.
    assert_eq!((-1i64).to_be_bytes(), REPLAY_END.to_be_bytes());
    assert!(is_replay_end(&(-1i64).to_be_bytes()));
    assert!(!is_replay_end(&(u64::MAX - 1).to_be_bytes()));
    assert!(!is_replay_end(&[0xff; 7]));

    let payload = batch(vec![cleared_array()], Value::Nil);
    let seq = 9u64.to_be_bytes().to_vec();
    // From a REQ socket, and from a DEALER (after an empty delimiter).
    let req = vec![seq.clone(), payload.clone()];
    let dealer = vec![Vec::new(), seq, payload.clone()];
    for frames in [req, dealer] {
        assert_eq!(
            split_replay_reply(&frames).unwrap(),
            ReplayReply::Batch {
                seq: 9,
                payload: &payload
            }
        );
    }
    let end = vec![Vec::new(), (-1i64).to_be_bytes().to_vec(), Vec::new()];
    assert_eq!(split_replay_reply(&end).unwrap(), ReplayReply::End);
    assert_eq!(split_replay_reply(&end[1..]).unwrap(), ReplayReply::End);
    assert!(matches!(
        split_replay_reply(&end[2..]),
        Err(WireError::ReplayFrameCount(1))
    ));
    let short_seq = vec![vec![0; 4], payload];
    assert!(matches!(
        split_replay_reply(&short_seq),
        Err(WireError::SequenceLength(4))
    ));
}
