//! A `RateLimitResponse` framed with each descriptor status measured once.
//!
//! prost's `encode` measures a nested message again at each level it is nested in: the
//! response measures its statuses for its length, then each status again for its own length
//! prefix, and each status its limit and duration at both of those and once more when it
//! writes them. A ten-descriptor answer's encoding was about four thousand instructions under
//! callgrind. Here each status is measured once, its length kept for its prefix, and the
//! whole answer is written by prost's own pieces into one buffer of the exact size: the bytes
//! are prost's, which the tests hold it to for any response.

use super::frame::prefixed;
use crate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use bytes::Bytes;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, int32, key_len, WireType};
use prost::Message;
use tonic::Status;

/// `response` framed (not compressed) in one buffer, the prefix first: what
/// [`super::frame::encode`] gives for it.
pub(crate) fn encode(mut response: RateLimitResponse) -> Result<Bytes, Status> {
    // Fields 1 and 2 are written here, the rest (3 and on) by prost after them: in tag
    // order, as prost writes them.
    let code = std::mem::take(&mut response.overall_code);
    let statuses = std::mem::take(&mut response.statuses);
    let lens: smallvec::SmallVec<[usize; 16]> = statuses.iter().map(Message::encoded_len).collect();
    let code_len = if code == 0 {
        0
    } else {
        int32::encoded_len(1, &code)
    };
    let len = code_len
        + lens
            .iter()
            .map(|&l| key_len(2) + encoded_len_varint(l as u64) + l)
            .sum::<usize>()
        + response.encoded_len();
    let mut out = prefixed(len)?;
    if code != 0 {
        int32::encode(1, &code, &mut out);
    }
    for (s, &l) in statuses.iter().zip(&lens) {
        encode_key(2, WireType::LengthDelimited, &mut out);
        encode_varint(l as u64, &mut out);
        s.encode_raw(&mut out);
    }
    response.encode_raw(&mut out);
    debug_assert_eq!(out.len(), super::frame::PREFIX + len);
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests;
