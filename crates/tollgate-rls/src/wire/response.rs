//! A decided `RateLimitResponse`, framed with its descriptor statuses written here.
//!
//! prost's `encode` measures a nested message again at each level it is nested in, writes
//! every field's key through its varint writer (not inlined there), and needs each status's
//! limit name as an owned `String`: a ten-descriptor answer cost ten name copies (an
//! allocation each) and about 3,300 instructions in prost's varint writer under callgrind
//! (docs/benchmarks.md, eighteenth session). Here the statuses are [`DescriptorAnswer`]s whose
//! names borrow the configuration: each is measured once, its length kept for its prefix, and
//! written by the few lines below (one-byte keys, an inlined varint writer for the values)
//! into one buffer of the exact size. The headers for Envoy to add (field 3) are written here
//! too, as the decision makes them ([`AddedHeaders`]): each was a `HeaderValue` of two owned
//! strings in a vector, which prost measured and wrote and the answer then freed (747
//! instructions an answer of one descriptor under callgrind, 44,525 to 43,778 with the
//! descriptors that passed no longer collected without dynamic metadata; docs/benchmarks.md,
//! twenty-eighth session). The
//! rest of the response (its metadata, fields 4 and on) is still written by prost, after them,
//! in tag order as prost writes it. The bytes are prost's for any response, which the tests
//! hold it to, and [`Decided::into_proto`] gives the message itself to callers that want one.

use super::frame::prefixed;
use crate::proto::envoy::config::core::v3::HeaderValue;
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
    /// This limit as a status writes it ([`Current::field`]: `current_limit`'s key, length
    /// and fields), written once for a configured rule and copied into each answer; empty:
    /// written from the fields above for each answer (an override's, a blocked rule's).
    pub(crate) written: &'c [u8],
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

/// A decided request's answer: the overall code, the statuses and the headers to add written
/// here, the other fields as prost holds them (`rest`'s own `overall_code`, `statuses` and
/// `response_headers_to_add` are left empty).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decided<'c> {
    pub(crate) overall_code: i32,
    pub(crate) statuses: Vec<DescriptorAnswer<'c>>,
    pub(crate) headers: AddedHeaders,
    pub(crate) rest: RateLimitResponse,
}

impl Decided<'_> {
    /// The answer as prost's message.
    pub(crate) fn into_proto(self) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: self.overall_code,
            statuses: self.statuses.iter().map(DescriptorAnswer::proto).collect(),
            response_headers_to_add: self.headers.proto(),
            ..self.rest
        }
    }

    /// The answer framed (not compressed) in one buffer, the prefix first: what
    /// [`super::frame::encode`] gives for [`Decided::into_proto`].
    pub(crate) fn encode(&self) -> Result<Bytes, Status> {
        let lens: smallvec::SmallVec<[usize; 16]> =
            self.statuses.iter().map(DescriptorAnswer::len).collect();
        let own = varint_field_len(self.overall_code as u64)
            + lens.iter().map(|&l| nested_len(l)).sum::<usize>()
            + self.headers.0.len();
        let len = own + self.rest.encoded_len();
        let mut out = prefixed(len)?;
        // The fields written here, in place; prost's after them.
        let start = out.len();
        out.resize(start + own, 0);
        let mut w = Writer {
            buf: &mut out[start..],
            at: 0,
        };
        w.varint_field(1, self.overall_code as u64);
        for (s, &l) in self.statuses.iter().zip(&lens) {
            w.nested_head(2, l);
            s.write(&mut w);
        }
        w.bytes(&self.headers.0);
        debug_assert_eq!(w.at, own);
        self.rest.encode_raw(&mut out);
        debug_assert_eq!(out.len(), super::frame::PREFIX + len);
        Ok(Bytes::from(out))
    }
}

/// `response_headers_to_add` (field 3 of the answer) as its bytes on the wire, each header
/// written as it is added: its value straight from the decision (no string of its own), its
/// name a constant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AddedHeaders(Vec<u8>);

/// The room the headers take beside `RateLimit-Policy`'s list: the fields' heads and names,
/// `RateLimit` and `Retry-After` of a policy with a name of a few dozen bytes, and a blocked
/// rule's own item.
const OTHER_ROOM: usize = 144;

impl AddedHeaders {
    /// Room for the headers of a request of `policies` policies, taken at once (the list
    /// bounded as `RateLimit-Policy` bounds it, whatever a request's descriptors): with ten
    /// descriptors the buffer grew twice on the way, calls that counted 327 instructions an
    /// answer in callgrind's profile of ten descriptors at 60d2b3a.
    pub(crate) fn reserve_for(&mut self, policies: usize) {
        self.0
            .reserve(OTHER_ROOM + tollgate::headers::ratelimit_policy_room(policies));
    }

    /// Adds a header named `key` whose value `value` writes at the end of the buffer it is
    /// given (and writes nothing else there), when `value` says there is one (true). A header
    /// whose value comes out empty is kept, as prost keeps a `HeaderValue` with an empty
    /// value; with false, whatever `value` wrote is taken back and nothing is added. The room
    /// is taken beforehand ([`AddedHeaders::reserve_for`]); a header past it grows the buffer.
    pub(crate) fn push(&mut self, key: &str, value: impl FnOnce(&mut Vec<u8>) -> bool) {
        let at = self.0.len();
        if !value(&mut self.0) {
            self.0.truncate(at);
            return;
        }
        let value_len = self.0.len() - at;
        let entry = string_field_len(key.len()) + string_field_len(value_len);
        // The field's key and length, the name, and the value's key and length go before the
        // value, which moves up to make room (a few bytes: values are short).
        let value_head = if value_len > 0 {
            1 + encoded_len_varint(value_len as u64)
        } else {
            0
        };
        let head = 1 + encoded_len_varint(entry as u64) + string_field_len(key.len()) + value_head;
        self.0.resize(at + head + value_len, 0);
        self.0.copy_within(at..at + value_len, at + head);
        let mut w = Writer {
            buf: &mut self.0[at..at + head],
            at: 0,
        };
        w.nested_head(3, entry);
        if !key.is_empty() {
            w.nested_head(1, key.len());
            w.bytes(key.as_bytes());
        }
        if value_len > 0 {
            w.nested_head(2, value_len);
        }
        debug_assert_eq!(w.at, head);
    }

    /// The headers as prost's messages.
    fn proto(&self) -> Vec<HeaderValue> {
        RateLimitResponse::decode(self.0.as_slice())
            .map(|r| r.response_headers_to_add)
            .unwrap_or_default()
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
            + self.current.map_or(0, |c| c.field_len())
            + varint_field_len(u64::from(self.remaining))
            + self
                .reset
                .as_ref()
                .map_or(0, |d| nested_len(duration_len(d)))
    }

    /// The status's fields, in tag order; a limit or duration present is written even when
    /// empty, as prost writes a message field that is `Some`.
    fn write(&self, w: &mut Writer<'_>) {
        w.varint_field(1, self.code as u64);
        if let Some(c) = &self.current {
            if c.written.is_empty() {
                c.write_field(w);
            } else {
                w.bytes(c.written);
            }
        }
        w.varint_field(3, u64::from(self.remaining));
        if let Some(d) = &self.reset {
            w.nested_head(4, duration_len(d));
            w.varint_field(1, d.seconds as u64);
            w.varint_field(2, d.nanos as u64);
        }
    }
}

impl Current<'_> {
    /// This limit as `current_limit` (field 2 of a status), whole: what a status writes for
    /// it, for [`Current::written`].
    pub(crate) fn field(&self) -> Vec<u8> {
        let mut buf = vec![0; nested_len(self.len())];
        let mut w = Writer {
            buf: &mut buf,
            at: 0,
        };
        self.write_field(&mut w);
        debug_assert_eq!(w.at, buf.len());
        buf
    }

    /// The bytes of this limit as a status's field 2.
    fn field_len(&self) -> usize {
        if self.written.is_empty() {
            nested_len(self.len())
        } else {
            self.written.len()
        }
    }

    /// Writes this limit as a status's field 2, from its fields.
    fn write_field(&self, w: &mut Writer<'_>) {
        w.nested_head(2, self.len());
        w.varint_field(1, u64::from(self.requests_per_unit));
        w.varint_field(2, self.unit as u64);
        if !self.name.is_empty() {
            w.nested_head(3, self.name.len());
            w.bytes(self.name.as_bytes());
        }
    }

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
const fn key_byte(field: u8, wire: u8) -> u8 {
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

/// A length-delimited field of `len` bytes, its one-byte key and its length prefix counted.
fn nested_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// A string field of `len` bytes: none when empty, which proto3 leaves out.
fn string_field_len(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        nested_len(len)
    }
}

/// Writes the fields into a buffer measured beforehand (by the `len` functions above): a
/// byte is a store and a step of the cursor, where a `Vec`'s push checks its capacity and
/// writes its length back every time (a ten-descriptor answer 80,748 instructions under
/// callgrind with pushes, 80,248 with this). A length measured short is a bug, and panics at
/// the first byte past the end.
struct Writer<'b> {
    buf: &'b mut [u8],
    at: usize,
}

impl Writer<'_> {
    #[inline]
    fn byte(&mut self, b: u8) {
        self.buf[self.at] = b;
        self.at += 1;
    }

    fn bytes(&mut self, b: &[u8]) {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }

    /// `v` as a varint, as prost's `encode_varint` writes it (the tests hold the bytes to
    /// prost's). Ours because prost's is not inlined here: called for every value, it cost
    /// a ten-descriptor answer 1,190 instructions more under callgrind (87,681 against
    /// 86,491).
    #[inline]
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.byte(v as u8 | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    /// A varint field, left out when `v` is 0 (see [`varint_field_len`]).
    #[inline]
    fn varint_field(&mut self, field: u8, v: u64) {
        if v != 0 {
            self.byte(key_byte(field, VARINT));
            self.varint(v);
        }
    }

    /// A length-delimited field's key and length; its `len` bytes follow.
    #[inline]
    fn nested_head(&mut self, field: u8, len: usize) {
        self.byte(key_byte(field, LENGTH_DELIMITED));
        self.varint(len as u64);
    }
}

#[cfg(test)]
mod tests;
