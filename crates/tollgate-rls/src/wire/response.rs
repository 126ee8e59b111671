//! A `RateLimitResponse` framed with its statuses written here, the rest by prost.
//!
//! prost writes a message a varint at a time through its buffer, and measures every nested
//! message again at each level it is nested in: a ten-descriptor answer's encoding was about
//! four thousand instructions under callgrind. Its descriptor statuses are all but the whole
//! answer, so they are measured once each and written byte by byte into one exact-size
//! buffer; the fields after them (headers to add, raw body, dynamic metadata) are rare and go
//! through prost. The bytes are prost's, field for field (fields in tag order, proto3
//! defaults left out, enums and `int32`s sign-extended to ten bytes), which the tests hold it
//! to for any response.

use super::frame::PREFIX;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use crate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use bytes::Bytes;
use prost::Message;
use tonic::Status;

/// `response` framed (not compressed) in one buffer, the prefix first: what
/// [`super::frame::encode`] gives for it.
pub(crate) fn encode(mut response: RateLimitResponse) -> Result<Bytes, Status> {
    let code = std::mem::take(&mut response.overall_code);
    let statuses = std::mem::take(&mut response.statuses);
    // What is left holds only fields 3 and on: prost writes them after ours, in tag order.
    let rest = response.encoded_len();
    let lens: smallvec::SmallVec<[usize; 16]> = statuses.iter().map(status_len).collect();
    let len = int_len(code)
        + lens
            .iter()
            .map(|&l| 1 + varint_len(l as u64) + l)
            .sum::<usize>()
        + rest;
    let Ok(prefix) = u32::try_from(len) else {
        return Err(Status::resource_exhausted(format!(
            "Cannot return body with more than 4GB of data but got {len} bytes"
        )));
    };
    let mut out = Vec::with_capacity(PREFIX + len);
    out.push(0);
    out.extend_from_slice(&prefix.to_be_bytes());
    int(&mut out, 1, code);
    for (s, &l) in statuses.iter().zip(&lens) {
        key(&mut out, 2, DELIMITED);
        varint(&mut out, l as u64);
        status(&mut out, s);
    }
    if rest > 0 {
        response.encode_raw(&mut out);
    }
    debug_assert_eq!(out.len(), PREFIX + len);
    Ok(Bytes::from(out))
}

const VARINT: u8 = 0;
const DELIMITED: u8 = 2;

fn status_len(s: &DescriptorStatus) -> usize {
    int_len(s.code)
        + s.current_limit
            .as_ref()
            .map_or(0, |l| nested_len(limit_len(l)))
        + uint_len(u64::from(s.limit_remaining))
        + s.duration_until_reset
            .as_ref()
            .map_or(0, |d| nested_len(duration_len(d)))
}

fn status(out: &mut Vec<u8>, s: &DescriptorStatus) {
    int(out, 1, s.code);
    if let Some(l) = &s.current_limit {
        key(out, 2, DELIMITED);
        varint(out, limit_len(l) as u64);
        uint(out, 1, u64::from(l.requests_per_unit));
        int(out, 2, l.unit);
        if !l.name.is_empty() {
            key(out, 3, DELIMITED);
            varint(out, l.name.len() as u64);
            out.extend_from_slice(l.name.as_bytes());
        }
    }
    uint(out, 3, u64::from(s.limit_remaining));
    if let Some(d) = &s.duration_until_reset {
        key(out, 4, DELIMITED);
        varint(out, duration_len(d) as u64);
        // int64: two's complement, as prost casts it.
        uint(out, 1, d.seconds as u64);
        int(out, 2, d.nanos);
    }
}

fn limit_len(l: &RateLimit) -> usize {
    uint_len(u64::from(l.requests_per_unit))
        + int_len(l.unit)
        + if l.name.is_empty() {
            0
        } else {
            1 + varint_len(l.name.len() as u64) + l.name.len()
        }
}

fn duration_len(d: &prost_types::Duration) -> usize {
    uint_len(d.seconds as u64) + int_len(d.nanos)
}

/// A nested message's field (key, length, body) whose body is `len` bytes.
fn nested_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// A `uint32`/`uint64`/`int64` field, left out at 0 (every field here is numbered 1 to 15:
/// its key is one byte).
fn uint_len(v: u64) -> usize {
    if v == 0 {
        0
    } else {
        1 + varint_len(v)
    }
}

/// An enum or `int32` field: a negative value is sign-extended to ten bytes.
fn int_len(v: i32) -> usize {
    uint_len(i64::from(v) as u64)
}

fn uint(out: &mut Vec<u8>, field: u8, v: u64) {
    if v != 0 {
        key(out, field, VARINT);
        varint(out, v);
    }
}

fn int(out: &mut Vec<u8>, field: u8, v: i32) {
    uint(out, field, i64::from(v) as u64);
}

fn key(out: &mut Vec<u8>, field: u8, wire: u8) {
    out.push(field << 3 | wire);
}

fn varint_len(v: u64) -> usize {
    // Seven bits a byte; 0 still takes one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests;
