//! A decided `RateLimitResponse`, framed with its descriptor statuses written here.
//!
//! prost's `encode` measures a nested message again at each level it is nested in, writes
//! every varint a byte at a time through `BufMut`, and needs each status's limit name as an
//! owned `String`: a ten-descriptor answer cost ten name copies (an allocation each) and
//! about 3,300 instructions of prost's varint writer under callgrind (docs/benchmarks.md,
//! eighteenth session). Here the statuses are [`DescriptorAnswer`]s whose names borrow the
//! configuration: each is measured once, its length kept for its prefix, and written by the
//! few lines below into one buffer of the exact size. The rest of the response (its headers
//! and metadata, fields 3 and on) is still written by prost, after them, in tag order as prost
//! writes it. The bytes are prost's for any response, which the tests hold it to, and
//! [`Decided::into_proto`] gives the message itself to callers that want one.

use super::frame::prefixed;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use crate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use bytes::Bytes;
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
        let code_len = if self.overall_code == 0 {
            0
        } else {
            1 + varint_len(self.overall_code as u64)
        };
        let len =
            code_len + lens.iter().map(|&l| nested_len(l)).sum::<usize>() + self.rest.encoded_len();
        let mut out = prefixed(len)?;
        if self.overall_code != 0 {
            out.push(key(1, VARINT));
            put_varint(&mut out, self.overall_code as u64);
        }
        for (s, &l) in self.statuses.iter().zip(&lens) {
            out.push(key(2, LENGTH_DELIMITED));
            put_varint(&mut out, l as u64);
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
        let mut n = 0;
        if self.code != 0 {
            n += 1 + varint_len(self.code as u64);
        }
        if let Some(c) = &self.current {
            n += nested_len(c.len());
        }
        if self.remaining != 0 {
            n += 1 + varint_len(u64::from(self.remaining));
        }
        if let Some(d) = &self.reset {
            n += nested_len(duration_len(d));
        }
        n
    }

    /// The status's fields, in tag order; a limit or duration present is written even when
    /// empty, as prost writes a message field that is `Some`.
    fn write(&self, out: &mut Vec<u8>) {
        if self.code != 0 {
            out.push(key(1, VARINT));
            put_varint(out, self.code as u64);
        }
        if let Some(c) = &self.current {
            out.push(key(2, LENGTH_DELIMITED));
            put_varint(out, c.len() as u64);
            if c.requests_per_unit != 0 {
                out.push(key(1, VARINT));
                put_varint(out, u64::from(c.requests_per_unit));
            }
            if c.unit != 0 {
                out.push(key(2, VARINT));
                put_varint(out, c.unit as u64);
            }
            if !c.name.is_empty() {
                out.push(key(3, LENGTH_DELIMITED));
                put_varint(out, c.name.len() as u64);
                out.extend_from_slice(c.name.as_bytes());
            }
        }
        if self.remaining != 0 {
            out.push(key(3, VARINT));
            put_varint(out, u64::from(self.remaining));
        }
        if let Some(d) = &self.reset {
            out.push(key(4, LENGTH_DELIMITED));
            put_varint(out, duration_len(d) as u64);
            if d.seconds != 0 {
                out.push(key(1, VARINT));
                put_varint(out, d.seconds as u64);
            }
            if d.nanos != 0 {
                out.push(key(2, VARINT));
                put_varint(out, d.nanos as u64);
            }
        }
    }
}

impl Current<'_> {
    /// The encoded length of a `RateLimit` of these fields.
    fn len(&self) -> usize {
        let mut n = 0;
        if self.requests_per_unit != 0 {
            n += 1 + varint_len(u64::from(self.requests_per_unit));
        }
        if self.unit != 0 {
            n += 1 + varint_len(self.unit as u64);
        }
        if !self.name.is_empty() {
            n += 1 + varint_len(self.name.len() as u64) + self.name.len();
        }
        n
    }
}

/// The encoded length of a `google.protobuf.Duration`.
fn duration_len(d: &prost_types::Duration) -> usize {
    let mut n = 0;
    if d.seconds != 0 {
        n += 1 + varint_len(d.seconds as u64);
    }
    if d.nanos != 0 {
        n += 1 + varint_len(d.nanos as u64);
    }
    n
}

const VARINT: u8 = 0;
const LENGTH_DELIMITED: u8 = 2;

/// A field's key, for the field numbers below 16 that every field written here has (one
/// byte).
const fn key(field: u8, wire: u8) -> u8 {
    field << 3 | wire
}

/// A length-delimited field of `len` bytes, its one-byte key and its length prefix counted.
fn nested_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// The bytes of `v` as a varint. Signed fields (`int32`, `int64`, enums) are passed as
/// `value as u64`, which sign-extends a negative value to ten bytes, as protobuf does.
fn varint_len(v: u64) -> usize {
    // Seven bits a byte, at least one byte.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests;
