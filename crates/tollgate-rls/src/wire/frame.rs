//! gRPC's message framing: each message is a 5-byte prefix (a compressed flag, then the
//! length as a big-endian `u32`) and the protobuf bytes.
//!
//! Reading is bounded before anything is buffered: a prefix is checked the moment its five
//! bytes are there, and a length past the limit is refused (`OUT_OF_RANGE`) without reading
//! on. A message that arrived in one chunk of the body (Envoy's always do) is sliced out of
//! that chunk without a copy; one spread over several chunks is gathered into a buffer that
//! never holds more than the prefix and the limit. What is refused, and with which status and
//! message, is what tonic's decoder answered without compression support, so a client sees no
//! difference:
//!
//! - a `grpc-encoding` other than `identity`: `UNIMPLEMENTED`, with `grpc-accept-encoding:
//!   identity`, before the body is read;
//! - a compressed flag of 1 (nothing is compressed without a `grpc-encoding`) or any flag
//!   other than 0 and 1: `INTERNAL`;
//! - a body that ends inside a prefix or a message (a length prefix that lies): `INTERNAL`;
//! - no message at all: `INTERNAL`; a message protobuf cannot decode: `INTERNAL`;
//! - several messages in a unary request: the first is the request, the others are decoded
//!   (and can fail the call) and dropped. Trailers end the messages.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName};
use http_body::Body;
use prost::Message;
use std::pin::Pin;
use tonic::{Code, Status};

/// The prefix of every message: the compressed flag and the length.
pub(crate) const PREFIX: usize = 5;

/// Names the encoding of the request's messages (a constant: no name parsed per call).
const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");

/// The messages of one request body, as each becomes whole.
pub(crate) struct Messages<B> {
    body: B,
    /// Received and not yet consumed: the rest of the body's latest chunk (its memory).
    chunk: Bytes,
    /// A message (prefix included) spread over chunks; never more than `PREFIX + limit`.
    gathered: BytesMut,
    /// The gathered message's whole length, once its prefix is in.
    expected: Option<usize>,
    limit: usize,
    /// Boxed: rare, and kept out of the call's future, which hyper and tokio move about.
    trailers: Option<Box<HeaderMap>>,
    ended: bool,
    /// The body said it was at its end when it gave its last data: it is not polled again.
    drained: bool,
}

impl<B> Messages<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// The messages of `body`, each at most `limit` bytes.
    pub(crate) fn new(body: B, limit: usize) -> Self {
        Self {
            body,
            chunk: Bytes::new(),
            gathered: BytesMut::new(),
            expected: None,
            limit,
            trailers: None,
            ended: false,
            drained: false,
        }
    }

    /// The next whole message's bytes (its prefix removed); `None` at the end of the body or
    /// at its trailers.
    pub(crate) async fn next(&mut self) -> Result<Option<Bytes>, Status> {
        loop {
            if let Some(message) = self.take()? {
                return Ok(Some(message));
            }
            if self.ended {
                return Ok(None);
            }
            // `take` consumed the whole chunk: read the next.
            let frame = if self.drained {
                None
            } else {
                std::future::poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await
            };
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        // A body whose end came with this data (END_STREAM on the DATA
                        // frame, as Envoy sends a call's one message) has nothing more to
                        // give, trailers included: it is not asked again (each question
                        // to an h2 stream takes its connection's lock). Asked only of data
                        // that begins a message: a body trickled in many frames pays for
                        // the question once a message, not once a frame.
                        if self.gathered.is_empty() {
                            self.drained = self.body.is_end_stream();
                        }
                        self.chunk = data;
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            match &mut self.trailers {
                                Some(have) => have.extend(trailers),
                                None => self.trailers = Some(Box::new(trailers)),
                            }
                        }
                        self.ended = true;
                    }
                },
                Some(Err(e)) => {
                    // The stream is reset (by the client, or by HTTP/2 for its errors): no
                    // answer reaches the client any more. A cancel ends the body, as in tonic.
                    let status = Status::from_error(e.into());
                    if status.code() != Code::Cancelled {
                        return Err(status);
                    }
                    self.ended = true;
                }
                None => {
                    self.ended = true;
                    if !self.gathered.is_empty() {
                        return Err(Status::internal("Unexpected EOF decoding stream."));
                    }
                }
            }
        }
    }

    /// A unary request's one message: the first, which must be there.
    pub(crate) async fn first(&mut self) -> Result<Bytes, Status> {
        self.next()
            .await?
            .ok_or_else(|| Status::internal("Missing request message."))
    }

    /// The rest of a unary request's body, after its first message: every further message is
    /// checked by `decode` (and can fail the call) and dropped, up to the body's end.
    pub(crate) async fn rest<E: std::fmt::Display>(
        &mut self,
        decode: impl Fn(Bytes) -> Result<(), E>,
    ) -> Result<(), Status> {
        while let Some(more) = self.next().await? {
            decode(more).map_err(decode_error)?;
        }
        Ok(())
    }

    /// The body's trailers, once [`Self::next`] has reached them.
    pub(crate) fn take_trailers(&mut self) -> Option<Box<HeaderMap>> {
        self.trailers.take()
    }

    /// A whole message from what has been received, if there is one. Returns `None` only
    /// with the chunk consumed.
    fn take(&mut self) -> Result<Option<Bytes>, Status> {
        if self.gathered.is_empty() {
            if self.chunk.len() < PREFIX {
                self.gathered.extend_from_slice(&self.chunk);
                self.chunk.clear();
                return Ok(None);
            }
            let end = PREFIX + self.length(&self.chunk[..PREFIX])?;
            if self.chunk.len() >= end {
                // The whole message in this chunk: a slice of it, no copy.
                let message = self.chunk.slice(PREFIX..end);
                self.chunk.advance(end);
                return Ok(Some(message));
            }
            self.gathered.reserve(end);
            self.gathered.extend_from_slice(&self.chunk);
            self.chunk.clear();
            self.expected = Some(end);
            return Ok(None);
        }
        let end = match self.expected {
            Some(end) => end,
            None => {
                let n = (PREFIX - self.gathered.len()).min(self.chunk.len());
                self.gathered.extend_from_slice(&self.chunk[..n]);
                self.chunk.advance(n);
                if self.gathered.len() < PREFIX {
                    return Ok(None);
                }
                let end = PREFIX + self.length(&self.gathered[..PREFIX])?;
                self.gathered.reserve(end - PREFIX);
                self.expected = Some(end);
                end
            }
        };
        let n = (end - self.gathered.len()).min(self.chunk.len());
        self.gathered.extend_from_slice(&self.chunk[..n]);
        self.chunk.advance(n);
        if self.gathered.len() < end {
            return Ok(None);
        }
        self.expected = None;
        Ok(Some(self.gathered.split().freeze().slice(PREFIX..)))
    }

    /// The length a prefix announces, refused when compressed or past the limit.
    fn length(&self, prefix: &[u8]) -> Result<usize, Status> {
        let mut p = [0u8; PREFIX];
        p.copy_from_slice(prefix);
        match p[0] {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                ))
            }
            f => {
                return Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while sending request"
                )))
            }
        }
        let len = u32::from_be_bytes([p[1], p[2], p[3], p[4]]);
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > self.limit {
            let limit = self.limit;
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {limit} bytes"
            )));
        }
        Ok(len)
    }
}

/// The one message of a unary request and the body's trailers. As tonic: the first message
/// is decoded the moment it is whole; then the body is read to its end, every further
/// message decoded and dropped.
pub(crate) async fn read_unary<M, B>(
    body: B,
    limit: usize,
) -> Result<(M, Option<Box<HeaderMap>>), Status>
where
    M: Message + Default,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut messages = Messages::new(body, limit);
    let message = M::decode(messages.first().await?).map_err(decode_error)?;
    messages.rest(|more| M::decode(more).map(drop)).await?;
    Ok((message, messages.take_trailers()))
}

/// A message that could not be decoded: `INTERNAL`, with the decoder's words.
pub(crate) fn decode_error(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// Refuses a compressed request (`grpc-encoding` other than `identity`): nothing here
/// decompresses.
pub(crate) fn uncompressed(headers: &HeaderMap) -> Result<(), Status> {
    let Some(encoding) = headers.get(GRPC_ENCODING) else {
        return Ok(());
    };
    let named = encoding.as_bytes();
    if named == b"identity" {
        return Ok(());
    }
    let named = match std::str::from_utf8(named) {
        Ok(s) => s.to_owned(),
        Err(_) => format!("{named:?}"),
    };
    let mut accepted = tonic::metadata::MetadataMap::new();
    accepted.insert(
        "grpc-accept-encoding",
        tonic::metadata::MetadataValue::from_static("identity"),
    );
    Err(Status::with_metadata(
        Code::Unimplemented,
        format!("Content is compressed with `{named}` which isn't supported"),
        accepted,
    ))
}

/// `message` framed (not compressed) in one buffer, the prefix first.
pub(crate) fn encode<M: Message>(message: &M) -> Result<Bytes, Status> {
    let mut buf = prefixed(message.encoded_len())?;
    message.encode_raw(&mut buf);
    Ok(Bytes::from(buf))
}

/// A buffer for a message of `len` bytes, its prefix written: exactly the frame's size, so
/// that `Bytes` takes it over without a copy.
pub(crate) fn prefixed(len: usize) -> Result<Vec<u8>, Status> {
    let Ok(prefix) = u32::try_from(len) else {
        return Err(Status::resource_exhausted(format!(
            "Cannot return body with more than 4GB of data but got {len} bytes"
        )));
    };
    let mut buf = Vec::with_capacity(PREFIX + len);
    buf.push(0);
    buf.extend_from_slice(&prefix.to_be_bytes());
    Ok(buf)
}

#[cfg(test)]
mod tests;
