//! A decided `RateLimitResponse`, framed with its descriptor statuses written here.
//!
//! prost's `encode` measures a nested message again at each level it is nested in, writes
//! every field's key through its varint writer (not inlined there), and needs each status's
//! limit name as an owned `String`: a ten-descriptor answer cost ten name copies (an
//! allocation each) and about 3,300 instructions in prost's varint writer under callgrind
//! (docs/benchmarks.md, eighteenth session). Here the statuses are [`DescriptorAnswer`]s whose
//! names borrow the configuration: each is measured once, its length kept for its prefix, and
//! written by the few lines below (one-byte keys, an inlined varint writer for the values)
//! into one buffer of the exact size. The rest of the response (its headers
//! and metadata, fields 3 and on) is still written by prost, after them, in tag order as prost
//! writes it. The bytes are prost's for any response, which the tests hold it to, and
//! [`Decided::into_proto`] gives the message itself to callers that want one.

use super::frame::prefixed;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use crate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use bytes::Bytes;
use prost::encoding::encoded_len_varint;
use prost::Message;
use tonic::Status;

/// A descriptor's `current_limit` as the answer reports it, its name borrowed from the
/// configuration (written into the answer, never copied per request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Current<'c> {
    pub(crate) name: &'c str,
    pub(crate) requests_per_unit: u32,
    pub(crate) unit: i32,
}

/// A descriptor's `DescriptorStatus`, its limit's name borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DescriptorAnswer<'c> {
    /// `code` (1), a `RateLimitResponse.Code`.
    pub(crate) code: i32,
    /// `current_limit` (2).
    pub(crate) current: Option<Current<'c>>,
    /// `limit_remaining` (3).
    pub(crate) remaining: u32,
    /// `duration_until_reset` (4).
    pub(crate) reset: Option<prost_types::Duration>,
}

/// A decided request's answer: the overall code and the statuses written here, the other
/// fields as prost holds them (`rest`'s own `overall_code` and `statuses` are left empty).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decided<'c> {
    pub(crate) overall_code: i32,
    pub(crate) statuses: Vec<DescriptorAnswer<'c>>,
    pub(crate) rest: RateLimitResponse,
}

impl Decided<'_> {
    /// The answer as prost's message.
    pub(crate) fn into_proto(self) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: self.overall_code,
            statuses: self.statuses.iter().map(DescriptorAnswer::proto).collect(),
            ..self.rest
        }
    }

    /// The answer framed (not compressed) in one buffer, the prefix first: what
    /// [`super::frame::encode`] gives for [`Decided::into_proto`].
    pub(crate) fn encode(&self) -> Result<Bytes, Status> {
        let lens: smallvec::SmallVec<[usize; 16]> =
            self.statuses.iter().map(DescriptorAnswer::len).collect();
        let len = varint_field_len(self.overall_code as u64)
            + lens.iter().map(|&l| nested_len(l)).sum::<usize>()
            + self.rest.encoded_len();
        let mut out = prefixed(len)?;
        put_varint_field(&mut out, 1, self.overall_code as u64);
        for (s, &l) in self.statuses.iter().zip(&lens) {
            put_nested_head(&mut out, 2, l);
            s.write(&mut out);
        }
        self.rest.encode_raw(&mut out);
        debug_assert_eq!(out.len(), super::frame::PREFIX + len);
        Ok(Bytes::from(out))
    }
}

impl DescriptorAnswer<'_> {
    fn proto(&self) -> DescriptorStatus {
        DescriptorStatus {
            code: self.code,
            current_limit: self.current.map(|c| RateLimit {
                name: c.name.to_owned(),
                requests_per_unit: c.requests_per_unit,
                unit: c.unit,
            }),
            limit_remaining: self.remaining,
            duration_until_reset: self.reset,
        }
    }

    /// The encoded length of the status's fields (its own prefix not counted).
    fn len(&self) -> usize {
        varint_field_len(self.code as u64)
            + self.current.map_or(0, |c| nested_len(c.len()))
            + varint_field_len(u64::from(self.remaining))
            + self
                .reset
                .as_ref()
                .map_or(0, |d| nested_len(duration_len(d)))
    }

    /// The status's fields, in tag order; a limit or duration present is written even when
    /// empty, as prost writes a message field that is `Some`.
    fn write(&self, out: &mut Vec<u8>) {
        put_varint_field(out, 1, self.code as u64);
        if let Some(c) = &self.current {
            put_nested_head(out, 2, c.len());
            put_varint_field(out, 1, u64::from(c.requests_per_unit));
            put_varint_field(out, 2, c.unit as u64);
            if !c.name.is_empty() {
                put_nested_head(out, 3, c.name.len());
                out.extend_from_slice(c.name.as_bytes());
            }
        }
        put_varint_field(out, 3, u64::from(self.remaining));
        if let Some(d) = &self.reset {
            put_nested_head(out, 4, duration_len(d));
            put_varint_field(out, 1, d.seconds as u64);
            put_varint_field(out, 2, d.nanos as u64);
        }
    }
}

impl Current<'_> {
    /// The encoded length of a `RateLimit` of these fields.
    fn len(&self) -> usize {
        varint_field_len(u64::from(self.requests_per_unit))
            + varint_field_len(self.unit as u64)
            + if self.name.is_empty() {
                0
            } else {
                nested_len(self.name.len())
            }
    }
}

/// The encoded length of a `google.protobuf.Duration`.
fn duration_len(d: &prost_types::Duration) -> usize {
    varint_field_len(d.seconds as u64) + varint_field_len(d.nanos as u64)
}

const VARINT: u8 = 0;
const LENGTH_DELIMITED: u8 = 2;

/// A field's key, for the field numbers below 16 that every field written here has (one
/// byte, where prost writes each key through its varint writer).
const fn key(field: u8, wire: u8) -> u8 {
    field << 3 | wire
}

/// The bytes of a varint field of value `v` (signed fields passed as `value as u64`, which
/// sign-extends a negative one to ten bytes, as protobuf does): none when `v` is 0, which
/// proto3 leaves out.
fn varint_field_len(v: u64) -> usize {
    if v == 0 {
        0
    } else {
        1 + encoded_len_varint(v)
    }
}

/// A varint field, left out when `v` is 0 (see [`varint_field_len`]).
fn put_varint_field(out: &mut Vec<u8>, field: u8, v: u64) {
    if v != 0 {
        out.push(key(field, VARINT));
        put_varint(out, v);
    }
}

/// A length-delimited field of `len` bytes, its one-byte key and its length prefix counted.
fn nested_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// A length-delimited field's key and length; its `len` bytes follow.
fn put_nested_head(out: &mut Vec<u8>, field: u8, len: usize) {
    out.push(key(field, LENGTH_DELIMITED));
    put_varint(out, len as u64);
}

/// `v` as a varint, as prost's `encode_varint` writes it (the tests hold the bytes to
/// prost's). Ours because prost's is not inlined here: called for every value, it cost a
/// ten-descriptor answer 1,190 instructions more under callgrind (87,681 against 86,491).
#[inline]
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests;
