//! The framed answer against prost's: the same bytes for any response.

use super::*;
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use proptest::prelude::*;

/// `response` as a [`Decided`], its statuses' names borrowed from it.
fn decided(response: &RateLimitResponse) -> Decided<'_> {
    Decided {
        overall_code: response.overall_code,
        statuses: response
            .statuses
            .iter()
            .map(|s| DescriptorAnswer {
                code: s.code,
                current: s.current_limit.as_ref().map(|c| Current {
                    name: &c.name,
                    requests_per_unit: c.requests_per_unit,
                    unit: c.unit,
                    written: &[],
                }),
                remaining: s.limit_remaining,
                reset: s.duration_until_reset,
            })
            .collect(),
        headers: added(&response.response_headers_to_add),
        rest: RateLimitResponse {
            overall_code: 0,
            statuses: Vec::new(),
            response_headers_to_add: Vec::new(),
            ..response.clone()
        },
    }
}

/// `headers` written as the service writes its own (none has a `raw_value`).
fn added(headers: &[HeaderValue]) -> AddedHeaders {
    let mut out = AddedHeaders::default();
    for h in headers {
        out.push(&h.key, |v| {
            v.extend_from_slice(h.value.as_bytes());
            true
        });
    }
    out
}

/// The answer written here is prost's framing of the same message, byte for byte, and gives
/// that message back.
fn same_as_prost(response: &RateLimitResponse) {
    let d = decided(response);
    let ours = d.encode().expect("small");
    let theirs = crate::wire::frame::encode(response).expect("small");
    assert_eq!(ours, theirs, "{response:?}");
    assert_eq!(&d.into_proto(), response);
}

fn status() -> impl Strategy<Value = DescriptorStatus> {
    let limit =
        (any::<u32>(), any::<i32>(), "\\PC{0,12}").prop_map(|(requests_per_unit, unit, name)| {
            RateLimit {
                name,
                requests_per_unit,
                unit,
            }
        });
    let duration = (any::<i64>(), any::<i32>())
        .prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos });
    (
        prop_oneof![Just(0), Just(1), Just(2), any::<i32>()],
        proptest::option::of(limit),
        prop_oneof![Just(0u32), 1u32..200, any::<u32>()],
        proptest::option::of(duration),
    )
        .prop_map(
            |(code, current_limit, limit_remaining, duration_until_reset)| DescriptorStatus {
                code,
                current_limit,
                limit_remaining,
                duration_until_reset,
            },
        )
}

fn response() -> impl Strategy<Value = RateLimitResponse> {
    let header = ("[a-z-]{0,12}", "\\PC{0,16}").prop_map(|(key, value)| HeaderValue {
        key,
        value,
        ..Default::default()
    });
    let metadata = proptest::collection::btree_map("[a-z]{1,6}", "\\PC{0,6}", 0..3).prop_map(|m| {
        prost_types::Struct {
            fields: m
                .into_iter()
                .map(|(k, v)| {
                    (
                        k,
                        prost_types::Value {
                            kind: Some(prost_types::value::Kind::StringValue(v)),
                        },
                    )
                })
                .collect(),
        }
    });
    (
        prop_oneof![Just(0), Just(1), Just(2), any::<i32>()],
        proptest::collection::vec(status(), 0..20),
        proptest::collection::vec(header.clone(), 0..3),
        proptest::collection::vec(header, 0..2),
        proptest::collection::vec(any::<u8>(), 0..4),
        proptest::option::of(metadata),
    )
        .prop_map(
            |(
                overall_code,
                statuses,
                response_headers_to_add,
                request_headers_to_add,
                raw_body,
                dynamic_metadata,
            )| {
                RateLimitResponse {
                    overall_code,
                    statuses,
                    response_headers_to_add,
                    request_headers_to_add,
                    raw_body,
                    dynamic_metadata,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn any_response_is_framed_as_prost_frames_it(r in response()) {
        same_as_prost(&r);
    }
}

/// The edges the generator reaches only by chance: empty messages kept (an empty limit, a zero
/// duration), negative enums (ten bytes), a name and a status long enough for two-byte lengths.
#[test]
fn the_edges_are_framed_as_prost_frames_them() {
    let long = "n".repeat(300);
    let statuses = vec![
        DescriptorStatus::default(),
        DescriptorStatus {
            code: -1,
            current_limit: Some(RateLimit::default()),
            limit_remaining: u32::MAX,
            duration_until_reset: Some(prost_types::Duration::default()),
        },
        DescriptorStatus {
            code: 2,
            current_limit: Some(RateLimit {
                name: long,
                requests_per_unit: 127,
                unit: 128,
            }),
            limit_remaining: 128,
            duration_until_reset: Some(prost_types::Duration {
                seconds: -1,
                nanos: i32::MIN,
            }),
        },
    ];
    same_as_prost(&RateLimitResponse::default());
    same_as_prost(&RateLimitResponse {
        overall_code: i32::MIN,
        statuses,
        ..Default::default()
    });
}

/// Every varint field the statuses hold, at every length's edges (one to ten bytes, negative
/// values sign-extended): each status measures what it writes, and the answer is prost's bytes.
#[test]
fn varints_are_prost_varints() {
    let mut values = vec![0u64, 1, u64::MAX, i32::MIN as u64, -1i64 as u64];
    for bits in 1..64 {
        values.extend([(1u64 << bits) - 1, 1u64 << bits, (1u64 << bits) + 1]);
    }
    let statuses: Vec<DescriptorStatus> = values
        .iter()
        .map(|&v| DescriptorStatus {
            code: v as i32,
            current_limit: Some(RateLimit {
                name: String::new(),
                requests_per_unit: v as u32,
                unit: v as i32,
            }),
            limit_remaining: v as u32,
            duration_until_reset: Some(prost_types::Duration {
                seconds: v as i64,
                nanos: v as i32,
            }),
        })
        .collect();
    let response = RateLimitResponse {
        overall_code: -1,
        statuses,
        ..Default::default()
    };
    for s in &decided(&response).statuses {
        // One byte more than measured: the status must stop exactly at its length.
        let mut out = vec![0u8; s.len() + 1];
        let mut w = Writer {
            buf: &mut out,
            at: 0,
        };
        s.write(&mut w);
        assert_eq!(w.at, s.len(), "{s:?}");
    }
    same_as_prost(&response);
}

/// A header whose writer says there is none adds nothing (not even what it wrote); long names
/// and values take two-byte lengths, as prost's do.
#[test]
fn headers_are_added_only_when_their_writer_says_so() {
    let mut h = AddedHeaders::default();
    h.push("ratelimit", |v| {
        v.extend_from_slice(b"half written");
        false
    });
    assert_eq!(h, AddedHeaders::default());
    let long = "v".repeat(200);
    let response = RateLimitResponse {
        response_headers_to_add: vec![
            HeaderValue {
                key: "k".repeat(130),
                value: long.clone(),
                ..Default::default()
            },
            HeaderValue {
                key: "retry-after".into(),
                value: String::new(),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    h.push(&"k".repeat(130), |v| {
        v.extend_from_slice(long.as_bytes());
        true
    });
    h.push("ratelimit-policy", |_| false);
    h.push("retry-after", |_| true);
    same_as_prost(&response);
    let empty = RateLimitResponse::default();
    let d = Decided {
        headers: h,
        ..decided(&empty)
    };
    assert_eq!(
        d.encode().expect("small"),
        crate::wire::frame::encode(&response).expect("small")
    );
}

/// The room taken for a request's policies holds their headers without growing: ten
/// policies of names of a few dozen bytes listed in `RateLimit-Policy`, then `RateLimit` and
/// `Retry-After`.
#[test]
fn the_room_for_a_requests_policies_holds_their_headers() {
    let mut h = AddedHeaders::default();
    h.reserve_for(10);
    let room = h.0.capacity();
    let policy = |n: usize| format!("\"domain_key{n}_value{n}\";q=1000;w=3600");
    h.push("ratelimit-policy", |v| {
        let all: Vec<String> = (0..10).map(policy).collect();
        v.extend_from_slice(all.join(", ").as_bytes());
        true
    });
    h.push("ratelimit", |v| {
        v.extend_from_slice(br#""domain_key0_value0";r=999;t=3600"#);
        true
    });
    h.push("retry-after", |v| {
        v.extend_from_slice(b"3600");
        true
    });
    assert_eq!(h.0.capacity(), room, "{} bytes written", h.0.len());
}

proptest! {
    /// A limit written once ([`Current::field`], as the service writes each configured
    /// rule's) frames the same answer as the limit written from its fields each time, and
    /// both are prost's.
    #[test]
    fn a_limit_written_once_frames_the_answer_it_frames_written_each_time(
        name in "\\PC{0,40}",
        requests_per_unit in any::<u32>(),
        unit in -1i32..8,
        remaining in any::<u32>(),
        code in 0i32..3,
    ) {
        let each = Current { name: &name, requests_per_unit, unit, written: &[] };
        let field = each.field();
        let once = Current { written: &field, ..each };
        let frame = |current| {
            Decided {
                overall_code: code,
                statuses: vec![DescriptorAnswer { code, current: Some(current), remaining, reset: None }],
                headers: AddedHeaders::default(),
                rest: RateLimitResponse::default(),
            }
            .encode()
            .expect("small")
        };
        prop_assert_eq!(frame(once), frame(each));
        let response = RateLimitResponse {
            overall_code: code,
            statuses: vec![DescriptorStatus {
                code,
                current_limit: Some(RateLimit { name: name.clone(), requests_per_unit, unit }),
                limit_remaining: remaining,
                duration_until_reset: None,
            }],
            ..Default::default()
        };
        prop_assert_eq!(frame(once), crate::wire::frame::encode(&response).expect("small"));
    }
}

/// A request of many descriptors takes no more room than `RateLimit-Policy` can list: a
/// client sending the most descriptors a request may carry does not make every answer
/// reserve a few hundred bytes a descriptor.
#[test]
fn the_room_taken_is_bounded_by_the_policies_listed() {
    let mut h = AddedHeaders::default();
    h.reserve_for(crate::request::MAX_DESCRIPTORS);
    let listed = tollgate::headers::MAX_ADVERTISED_POLICIES;
    assert!(
        h.0.capacity() <= OTHER_ROOM + tollgate::headers::ratelimit_policy_room(listed),
        "{} bytes",
        h.0.capacity()
    );
}
