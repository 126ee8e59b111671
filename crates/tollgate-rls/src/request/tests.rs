//! The reader against prost's generated decoder: the same verdict (read or refused) for any
//! bytes, and the same request when both read it.

use super::*;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry as PEntry, RateLimitOverride,
};
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use proptest::prelude::*;
use prost::Message;

/// Both decoders on `bytes`: refused by both, or read by both as the same request.
fn agree(bytes: &[u8]) {
    let theirs = RateLimitRequest::decode(bytes);
    let ours = RlsRequest::decode(bytes);
    match (&theirs, &ours) {
        (Ok(m), Ok(v)) => assert_eq!(&RlsRequest::of(m), v, "bytes {bytes:02x?}"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "bytes {bytes:02x?}"),
        _ => panic!("prost {theirs:?}, ours {ours:?}, bytes {bytes:02x?}"),
    }
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(field: u64, wire: u64, out: &mut Vec<u8>) {
    varint(field << 3 | wire, out);
}

fn delimited(field: u64, body: &[u8], out: &mut Vec<u8>) {
    key(field, 2, out);
    varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

fn entry(k: &str, v: &str) -> Vec<u8> {
    let mut e = Vec::new();
    delimited(1, k.as_bytes(), &mut e);
    delimited(2, v.as_bytes(), &mut e);
    e
}

/// A field as the generator writes it: a number, a wire type (usually the one its value
/// has, sometimes another) and a value.
#[derive(Debug, Clone)]
enum Value {
    Varint(u64),
    /// A varint of `.0` padded with `.1` continuation bytes of zeros (overlong, and past ten
    /// bytes invalid).
    Padded(u64, u8),
    Fixed32(u32),
    Fixed64(u64),
    Bytes(Vec<u8>),
    Message(Vec<Field>),
    /// A group, ended by the end tag of field `.0` (usually its own).
    Group(u64, Vec<Field>),
    /// Bytes as they come: truncations, stray end tags.
    Raw(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Field {
    number: u64,
    /// `None`: the value's own wire type.
    wire: Option<u64>,
    value: Value,
}

fn encode(fields: &[Field], out: &mut Vec<u8>) {
    for f in fields {
        let own = match f.value {
            Value::Varint(_) | Value::Padded(..) => 0,
            Value::Fixed64(_) => 1,
            Value::Bytes(_) | Value::Message(_) => 2,
            Value::Group(..) => 3,
            Value::Fixed32(_) => 5,
            Value::Raw(_) => 2,
        };
        if !matches!(f.value, Value::Raw(_)) || f.wire.is_some() {
            key(f.number, f.wire.unwrap_or(own), out);
        }
        match &f.value {
            Value::Varint(v) => varint(*v, out),
            Value::Padded(v, pad) => {
                let mut b = Vec::new();
                varint(*v, &mut b);
                let last = b.len() - 1;
                b[last] |= 0x80;
                b.extend(std::iter::repeat_n(0x80, usize::from(*pad)));
                b.push(0);
                out.extend_from_slice(&b);
            }
            Value::Fixed32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::Fixed64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::Bytes(b) => {
                varint(b.len() as u64, out);
                out.extend_from_slice(b);
            }
            Value::Message(inner) => {
                let mut body = Vec::new();
                encode(inner, &mut body);
                varint(body.len() as u64, out);
                out.extend_from_slice(&body);
            }
            Value::Group(end, inner) => {
                encode(inner, out);
                key(*end, 4, out);
            }
            Value::Raw(b) => out.extend_from_slice(b),
        }
    }
}

fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 1u64..=4,
        1 => Just(0u64),
        1 => 5u64..=20,
        1 => Just(536_870_911u64),
        1 => Just(536_870_912u64),
    ]
}

fn text() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => "[a-z0-9_./*]{0,12}".prop_map(String::into_bytes),
        1 => "\\PC{0,6}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..8),
    ]
}

fn field() -> impl Strategy<Value = Field> {
    let leaf = prop_oneof![
        4 => any::<u64>().prop_map(Value::Varint),
        1 => (any::<u64>(), 0u8..12).prop_map(|(v, p)| Value::Padded(v, p)),
        1 => any::<u32>().prop_map(Value::Fixed32),
        1 => any::<u64>().prop_map(Value::Fixed64),
        4 => text().prop_map(Value::Bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..6).prop_map(Value::Raw),
    ];
    let value = leaf.prop_recursive(4, 48, 6, |inner| {
        let f = (number(), wire(), inner)
            .prop_map(|(number, wire, value)| Field {
                number,
                wire,
                value,
            })
            .boxed();
        prop_oneof![
            4 => proptest::collection::vec(f.clone(), 0..6).prop_map(Value::Message),
            1 => (number(), proptest::collection::vec(f, 0..4))
                .prop_map(|(end, fields)| Value::Group(end, fields)),
        ]
    });
    (number(), wire(), value).prop_map(|(number, wire, value)| Field {
        number,
        wire,
        value,
    })
}

fn wire() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![12 => Just(None), 1 => (0u64..8).prop_map(Some)]
}

fn request() -> impl Strategy<Value = RateLimitRequest> {
    let entry = ("[a-z]{0,6}", "\\PC{0,8}").prop_map(|(key, value)| PEntry { key, value });
    let descriptor = (
        proptest::collection::vec(entry, 0..4),
        proptest::option::of((any::<u32>(), any::<i32>())),
        proptest::option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_map(
            |(entries, limit, hits_addend, is_negative_hits)| RateLimitDescriptor {
                entries,
                limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                    requests_per_unit,
                    unit,
                }),
                hits_addend,
                is_negative_hits,
            },
        );
    (
        "\\PC{0,10}",
        proptest::collection::vec(descriptor, 0..12),
        any::<u32>(),
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Any request prost writes is read as prost reads it.
    #[test]
    fn every_request_prost_writes_reads_the_same(req in request()) {
        let bytes = req.encode_to_vec();
        let ours = RlsRequest::decode(&bytes).expect("a request prost wrote");
        prop_assert_eq!(ours, RlsRequest::of(&req));
    }

    /// Fields of any number, wire type and value, nested, grouped, padded and cut short: the
    /// two decoders agree on every one.
    #[test]
    fn any_fields_get_prost_s_verdict(fields in proptest::collection::vec(field(), 0..8)) {
        let mut bytes = Vec::new();
        encode(&fields, &mut bytes);
        agree(&bytes);
        // Every prefix too: a message cut anywhere.
        for cut in 0..bytes.len() {
            agree(&bytes[..cut]);
        }
    }

    /// A request prost wrote, then damaged: a byte changed, one removed, one added.
    #[test]
    fn a_damaged_request_gets_prost_s_verdict(
        req in request(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        how in 0u8..3,
    ) {
        let mut bytes = req.encode_to_vec();
        if bytes.is_empty() {
            bytes.push(byte);
        } else {
            let i = at.index(bytes.len());
            match how {
                0 => bytes[i] = byte,
                1 => {
                    bytes.remove(i);
                }
                _ => bytes.insert(i, byte),
            }
        }
        agree(&bytes);
    }

    /// Plain noise.
    #[test]
    fn random_bytes_get_prost_s_verdict(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        agree(&bytes);
    }
}

/// A message field given twice is merged, a scalar's last value wins, a repeated field
/// appends: read as prost reads it, and what that is, spelled out.
#[test]
fn fields_given_twice_merge_as_prost_merges_them() {
    let mut d = Vec::new();
    delimited(1, &entry("k", "a"), &mut d);
    let mut o = Vec::new();
    key(1, 0, &mut o);
    varint(7, &mut o);
    delimited(2, &o, &mut d);
    let mut o = Vec::new();
    key(2, 0, &mut o);
    varint(2, &mut o);
    delimited(2, &o, &mut d);
    delimited(3, &[8, 5], &mut d);
    delimited(3, &[], &mut d);
    delimited(1, &entry("k", "b"), &mut d);
    key(4, 0, &mut d);
    varint(1, &mut d);
    key(4, 0, &mut d);
    varint(0, &mut d);
    let mut bytes = Vec::new();
    delimited(1, b"first", &mut bytes);
    delimited(2, &d, &mut bytes);
    delimited(1, b"second", &mut bytes);
    key(3, 0, &mut bytes);
    // The low 32 bits of a larger varint.
    varint((1 << 32) | 9, &mut bytes);
    agree(&bytes);
    let r = RlsRequest::decode(&bytes).expect("valid");
    assert_eq!(r.domain, "second");
    assert_eq!(r.hits_addend, 9);
    assert_eq!(r.descriptors.len(), 1);
    let d = &r.descriptors[0];
    assert_eq!(d.pairs().collect::<Vec<_>>(), vec![("k", "a"), ("k", "b")]);
    assert_eq!(
        d.limit,
        Some(Override {
            requests_per_unit: 7,
            unit: 2
        })
    );
    assert_eq!(
        d.hits_addend,
        Some(5),
        "an empty second value keeps the first's"
    );
    assert!(!d.is_negative_hits, "the last value wins");
}

/// Groups nested as deep as prost's recursion limit allows are skipped; one deeper is
/// refused, by both, at the top level and inside a descriptor's entry.
#[test]
fn groups_are_skipped_down_to_prost_s_recursion_limit_and_no_deeper() {
    let groups = |n: usize| {
        let mut g = Vec::new();
        for _ in 0..n {
            key(9, 3, &mut g);
        }
        for _ in 0..n {
            key(9, 4, &mut g);
        }
        g
    };
    let mut verdicts = Vec::new();
    for n in 95..=102 {
        let top = groups(n);
        agree(&top);
        let mut e = entry("k", "v");
        e.extend_from_slice(&groups(n));
        let mut d = Vec::new();
        delimited(1, &e, &mut d);
        let mut inner = Vec::new();
        delimited(2, &d, &mut inner);
        agree(&inner);
        verdicts.push((
            n,
            RlsRequest::decode(&top).is_ok(),
            RlsRequest::decode(&inner).is_ok(),
        ));
    }
    // Both limits are inside the range tried: each verdict changes once.
    assert!(verdicts.iter().any(|v| v.1) && verdicts.iter().any(|v| !v.1));
    assert!(verdicts.iter().any(|v| v.2) && verdicts.iter().any(|v| !v.2));
}

/// What each refusal says: prost's words, under the status's usual prefix.
#[test]
fn a_refused_message_says_why() {
    let cases: [(&[u8], &str); 6] = [
        (&[0x0a, 0x02, 0xff, 0xfe], "not UTF-8"),
        (&[0x0a, 0x05, b'a'], "buffer underflow"),
        (&[0x08, 0x01], "invalid wire type"),
        (&[0x00], "invalid tag value: 0"),
        (&[0x0f], "invalid wire type value"),
        (
            &[
                0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
            ],
            "invalid varint",
        ),
    ];
    for (bytes, why) in cases {
        agree(bytes);
        let e = RlsRequest::decode(bytes).expect_err("refused").to_string();
        assert!(
            e.starts_with("failed to decode Protobuf message: ") && e.contains(why),
            "{bytes:02x?}: {e}"
        );
    }
}

/// Past one more than the service accepts, descriptors and entries are read and dropped:
/// what a request keeps is bounded whatever its size, the service still sees that there
/// were too many, and a message prost refuses is still refused.
#[test]
fn descriptors_and_entries_past_the_bounds_are_read_and_not_kept() {
    let mut d = Vec::new();
    for _ in 0..MAX_ENTRIES + 10 {
        delimited(1, &entry("k", "v"), &mut d);
    }
    let mut bytes = Vec::new();
    delimited(1, b"edge", &mut bytes);
    for _ in 0..MAX_DESCRIPTORS + 40 {
        delimited(2, &d, &mut bytes);
    }
    let r = RlsRequest::decode(&bytes).expect("valid");
    assert_eq!(r.descriptors.len(), MAX_DESCRIPTORS + 1);
    assert!(r
        .descriptors
        .iter()
        .all(|d| d.entries.len() == MAX_ENTRIES + 1));
    drop(r);
    // A message of nothing but empty descriptors (two bytes each) keeps 257 of them, not
    // thirty thousand.
    let mut bomb = Vec::new();
    delimited(1, b"edge", &mut bomb);
    bomb.extend([0x12, 0x00].repeat(30_000));
    let r = RlsRequest::decode(&bomb).expect("valid");
    assert_eq!(r.descriptors.len(), MAX_DESCRIPTORS + 1);
    assert!(r.descriptors.capacity() <= 2 * (MAX_DESCRIPTORS + 1));
    drop(r);
    // Damaged after the bound: refused as prost refuses it.
    bytes.extend_from_slice(&[0x12, 0x05, 0x0a]);
    agree(&bytes);
    assert!(RlsRequest::decode(&bytes).is_err());
}

/// Strings read as slices of a message that is UTF-8 as a whole get prost's verdict at the
/// edges: multi-byte characters kept whole, and a string whose last byte starts a character
/// that the next field's key completes (the message is UTF-8, the string is not).
#[test]
fn strings_of_a_message_that_is_utf8_as_a_whole_get_prost_s_verdict() {
    // Valid: multi-byte characters in the domain and in an entry, all lengths below 128.
    let mut ok = Vec::new();
    delimited(1, "dømain-€".as_bytes(), &mut ok);
    let mut d = Vec::new();
    delimited(1, &entry("clé", "välue-😀"), &mut d);
    delimited(2, &d, &mut ok);
    assert!(std::str::from_utf8(&ok).is_ok());
    agree(&ok);
    let read = RlsRequest::decode(&ok).expect("valid");
    assert_eq!(read.domain, "dømain-€");
    assert_eq!(read.descriptors[0].entries[0].value, "välue-😀");

    // The domain is the lone byte 0xC3; the next field's key is the varint A9 01 (field 21,
    // fixed64, unknown: skipped), so the message reads C3 A9 ("é") across the two fields.
    let mut cut = vec![0x0a, 0x01, 0xc3, 0xa9, 0x01];
    cut.extend_from_slice(b"12345678");
    assert!(std::str::from_utf8(&cut).is_ok(), "the message is UTF-8");
    agree(&cut);
    let err = RlsRequest::decode(&cut).expect_err("the domain is not UTF-8");
    assert!(err.to_string().contains("not UTF-8"), "{err}");

    // A string that begins inside a character: the domain's bytes are E2 82, the entry's
    // key completes nothing (an ASCII byte follows), so the whole message is not UTF-8 and
    // each string is checked alone.
    let mut partial = Vec::new();
    delimited(1, &[0xe2, 0x82], &mut partial);
    agree(&partial);
    assert!(RlsRequest::decode(&partial).is_err());
}
