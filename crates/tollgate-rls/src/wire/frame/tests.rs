use super::*;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use http_body::Frame;
use std::collections::VecDeque;
use std::task::{Context, Poll};

/// A request body played from a script, then `endless` chunks for ever (or its end).
struct Script {
    frames: VecDeque<Result<Frame<Bytes>, Status>>,
    endless: Option<Bytes>,
    polls: usize,
    /// Says it is at its end once its frames are given (as h2 says of a stream whose last
    /// DATA frame carried END_STREAM).
    says_end: bool,
    /// How often it was asked whether it is at its end.
    end_asked: std::cell::Cell<usize>,
}

impl Script {
    fn chunks<I: IntoIterator<Item = Bytes>>(chunks: I) -> Self {
        Self {
            frames: chunks.into_iter().map(|c| Ok(Frame::data(c))).collect(),
            endless: None,
            polls: 0,
            says_end: false,
            end_asked: std::cell::Cell::new(0),
        }
    }

    fn one(bytes: &[u8]) -> Self {
        Self::chunks([Bytes::copy_from_slice(bytes)])
    }
}

impl Body for Script {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.polls += 1;
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(frame));
        }
        Poll::Ready(self.endless.clone().map(|c| Ok(Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.end_asked.set(self.end_asked.get() + 1);
        self.says_end && self.frames.is_empty() && self.endless.is_none()
    }
}

const LIMIT: usize = 64 * 1024;

fn request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

fn framed(value: &str) -> Bytes {
    encode(&request(value)).expect("small")
}

fn prefix(flag: u8, len: u32) -> Vec<u8> {
    let mut p = vec![flag];
    p.extend_from_slice(&len.to_be_bytes());
    p
}

async fn unary(body: Script) -> Result<RateLimitRequest, Status> {
    read_unary::<RateLimitRequest, _>(body, LIMIT)
        .await
        .map(|(m, _)| m)
}

#[test]
fn an_answer_is_framed_with_a_zero_flag_and_its_big_endian_length() {
    let message = request("192.0.2.1");
    let bytes = encode(&message).expect("small");
    let len = message.encoded_len();
    assert_eq!(bytes[0], 0);
    assert_eq!(
        &bytes[1..5],
        &u32::try_from(len).expect("small").to_be_bytes()
    );
    assert_eq!(bytes.len(), PREFIX + len);
    assert_eq!(
        RateLimitRequest::decode(&bytes[PREFIX..]).expect("decodes"),
        message
    );
}

#[tokio::test]
async fn a_message_in_one_chunk_is_sliced_out_of_it_without_a_copy() {
    let chunk = framed("192.0.2.1");
    let range = chunk.as_ptr() as usize..chunk.as_ptr() as usize + chunk.len();
    let mut messages = Messages::new(Script::chunks([chunk.clone()]), LIMIT);
    let message = messages.next().await.expect("read").expect("a message");
    assert!(range.contains(&(message.as_ptr() as usize)), "a slice");
    assert_eq!(&message[..], &chunk[PREFIX..]);
    assert_eq!(messages.next().await.expect("end"), None);
}

#[tokio::test]
async fn a_message_sent_a_byte_at_a_time_is_gathered_whole() {
    let bytes = framed("192.0.2.1");
    let body = Script::chunks((0..bytes.len()).map(|i| bytes.slice(i..=i)));
    assert_eq!(unary(body).await.expect("decodes"), request("192.0.2.1"));
}

#[tokio::test]
async fn messages_split_anywhere_are_read_the_same() {
    let mut all = framed("a").to_vec();
    all.extend_from_slice(&framed("bb"));
    for cut in 0..=all.len() {
        for second in cut..=all.len() {
            let body = Script::chunks([
                Bytes::copy_from_slice(&all[..cut]),
                Bytes::copy_from_slice(&all[cut..second]),
                Bytes::copy_from_slice(&all[second..]),
            ]);
            let mut messages = Messages::new(body, LIMIT);
            let mut got = Vec::new();
            while let Some(m) = messages.next().await.expect("read") {
                got.push(RateLimitRequest::decode(m).expect("decodes"));
            }
            assert_eq!(
                got,
                vec![request("a"), request("bb")],
                "cut at {cut}, {second}"
            );
        }
    }
}

#[tokio::test]
async fn a_length_past_the_limit_is_refused_before_anything_more_is_read() {
    let mut body = Script::one(&prefix(0, u32::MAX));
    body.endless = Some(Bytes::from(vec![0u8; 16 * 1024]));
    let mut messages = Messages::new(body, LIMIT);
    let e = messages.next().await.expect_err("refused");
    assert_eq!(e.code(), Code::OutOfRange);
    assert_eq!(
        e.message(),
        "Error, decoded message length too large: found 4294967295 bytes, the limit is: 65536 bytes"
    );
    assert_eq!(messages.body.polls, 1, "nothing read past the prefix");
    assert_eq!(messages.gathered.capacity(), 0, "nothing buffered");

    // Also when the prefix itself came in pieces.
    let over = u32::try_from(LIMIT + 1).expect("small");
    let p = prefix(0, over);
    let mut body = Script::chunks([
        Bytes::copy_from_slice(&p[..2]),
        Bytes::copy_from_slice(&p[2..]),
    ]);
    body.endless = Some(Bytes::from(vec![0u8; 16 * 1024]));
    let mut messages = Messages::new(body, LIMIT);
    assert_eq!(
        messages.next().await.expect_err("refused").code(),
        Code::OutOfRange
    );
    assert_eq!(messages.body.polls, 2);
    assert!(
        messages.gathered.capacity() < 64,
        "only the prefix was gathered"
    );
}

#[tokio::test]
async fn a_message_at_the_limit_is_gathered_within_its_bound_and_no_further() {
    let len = u32::try_from(LIMIT).expect("small");
    let mut body = Script::one(&prefix(0, len));
    // Far more than the message: a client that keeps sending.
    body.endless = Some(Bytes::from(vec![0u8; 1000]));
    let mut messages = Messages::new(body, LIMIT);
    // Step by step, watching the buffer.
    let mut message = None;
    for _ in 0..200 {
        match messages.take().expect("within the limit") {
            Some(m) => {
                message = Some(m);
                break;
            }
            None => {
                assert!(messages.gathered.capacity() <= PREFIX + LIMIT);
                let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut messages.body)
                    .poll_frame(&mut Context::from_waker(std::task::Waker::noop()))
                else {
                    panic!("the script always has a chunk");
                };
                messages.chunk = frame.into_data().expect("data");
            }
        }
    }
    let message = message.expect("whole after 66 chunks");
    assert_eq!(message.len(), LIMIT);
    assert_eq!(
        messages.body.polls,
        1 + LIMIT.div_ceil(1000),
        "read no chunk past it"
    );
    // The rest of the last chunk waits as the next message's start.
    assert_eq!(messages.chunk.len(), 1000 - LIMIT % 1000);
}

#[tokio::test]
async fn one_byte_past_the_limit_is_refused() {
    let over = u32::try_from(LIMIT + 1).expect("small");
    let e = unary(Script::one(&prefix(0, over)))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), Code::OutOfRange);
    let at = u32::try_from(LIMIT).expect("small");
    let mut exact = prefix(0, at);
    exact.resize(PREFIX + LIMIT, 0);
    // 64 KiB of zeros: field number 0 is not protobuf, but the size was accepted.
    assert_eq!(
        unary(Script::one(&exact))
            .await
            .expect_err("not protobuf")
            .code(),
        Code::Internal
    );
}

#[tokio::test]
async fn a_length_prefix_longer_than_the_body_is_an_unexpected_eof() {
    let mut lying = prefix(0, 100);
    lying.extend_from_slice(&framed("x")[PREFIX..]);
    let e = unary(Script::one(&lying)).await.expect_err("truncated");
    assert_eq!(e.code(), Code::Internal);
    assert_eq!(e.message(), "Unexpected EOF decoding stream.");
    // A body that stops inside a prefix.
    let e = unary(Script::one(&[0, 0])).await.expect_err("truncated");
    assert_eq!(e.message(), "Unexpected EOF decoding stream.");
}

#[tokio::test]
async fn a_length_prefix_shorter_than_the_message_fails_the_call() {
    let bytes = framed("192.0.2.1");
    let mut lying = prefix(0, 3);
    lying.extend_from_slice(&bytes[PREFIX..]);
    let e = unary(Script::one(&lying)).await.expect_err("garbage after");
    assert_eq!(e.code(), Code::Internal, "{e:?}");
}

#[tokio::test]
async fn compressed_flags_are_refused_as_internal() {
    let mut compressed = prefix(1, 2);
    compressed.extend_from_slice(&[0, 0]);
    let e = unary(Script::one(&compressed))
        .await
        .expect_err("compressed");
    assert_eq!(e.code(), Code::Internal);
    assert_eq!(
        e.message(),
        "protocol error: received message with compressed-flag but no grpc-encoding was specified"
    );
    let e = unary(Script::one(&prefix(7, 0)))
        .await
        .expect_err("no such flag");
    assert_eq!(e.code(), Code::Internal);
    assert_eq!(
        e.message(),
        "protocol error: received message with invalid compression flag: 7 (valid flags are 0 and 1), while sending request"
    );
}

#[tokio::test]
async fn an_empty_body_is_a_missing_message() {
    let e = unary(Script::chunks([])).await.expect_err("empty");
    assert_eq!(e.code(), Code::Internal);
    assert_eq!(e.message(), "Missing request message.");
    // An empty message is a message: all defaults.
    assert_eq!(
        unary(Script::one(&prefix(0, 0)))
            .await
            .expect("empty message"),
        RateLimitRequest::default()
    );
}

#[tokio::test]
async fn further_messages_are_decoded_and_dropped_and_can_fail_the_call() {
    let mut two = framed("first").to_vec();
    two.extend_from_slice(&framed("second"));
    assert_eq!(
        unary(Script::one(&two)).await.expect("first"),
        request("first")
    );

    let mut bad = framed("first").to_vec();
    bad.extend_from_slice(&prefix(0, 2));
    bad.extend_from_slice(&[0xff, 0xff]);
    let e = unary(Script::one(&bad))
        .await
        .expect_err("second is garbage");
    assert_eq!(e.code(), Code::Internal);
    assert!(
        e.message().contains("failed to decode Protobuf message"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn trailers_end_the_messages_and_are_kept() {
    let mut trailers = HeaderMap::new();
    trailers.insert("traceparent", http::HeaderValue::from_static("00-ab-cd-01"));
    let mut body = Script::chunks([framed("x")]);
    // Half a prefix before the trailers: ignored, as tonic ignores it.
    body.frames
        .push_back(Ok(Frame::data(Bytes::from_static(&[0, 0]))));
    body.frames.push_back(Ok(Frame::trailers(trailers)));
    let (message, trailers) = read_unary::<RateLimitRequest, _>(body, LIMIT)
        .await
        .expect("read");
    assert_eq!(message, request("x"));
    assert_eq!(
        trailers.as_ref().and_then(|t| t.get("traceparent")),
        Some(&http::HeaderValue::from_static("00-ab-cd-01"))
    );
}

/// Reads `body` to its end, its one message required to be `request(value)`; the messages,
/// for what their body was asked.
async fn read_one(body: Script, value: &str) -> Messages<Script> {
    let mut messages = Messages::new(body, LIMIT);
    let first = messages.first().await.expect("a message");
    assert_eq!(
        RateLimitRequest::decode(first).expect("decodes"),
        request(value)
    );
    messages
        .rest(|m| RateLimitRequest::decode(m).map(drop))
        .await
        .expect("no more");
    messages
}

/// A body that says it ended with its data is not asked again (under h2 each question takes
/// the connection's lock); one that does not say so is asked until it ends. Either way what
/// is left of a message at the end is an unexpected EOF.
#[tokio::test]
async fn a_body_that_ends_with_its_data_is_not_polled_again() {
    for says_end in [true, false] {
        let mut body = Script::chunks([framed("x")]);
        body.says_end = says_end;
        let mut messages = read_one(body, "x").await;
        assert!(messages.take_trailers().is_none());
        let polls = if says_end { 1 } else { 2 };
        assert_eq!(messages.body.polls, polls, "says its end: {says_end}");

        let mut cut = framed("x").to_vec();
        cut.extend_from_slice(&[0, 0]);
        let mut body = Script::one(&cut);
        body.says_end = says_end;
        let e = unary(body).await.expect_err("truncated");
        assert_eq!(e.message(), "Unexpected EOF decoding stream.");
    }
}

/// A message trickled a byte a frame is read whole, and its body is asked whether it ended
/// once (at the data that begins the message), not once a frame: a hostile client's tiny
/// frames do not each cost a question to the stream.
#[tokio::test]
async fn a_trickled_body_is_asked_for_its_end_once_a_message() {
    let bytes = framed("192.0.2.1");
    let mut body = Script::chunks(bytes.iter().map(|&b| Bytes::copy_from_slice(&[b])));
    body.says_end = true;
    let messages = read_one(body, "192.0.2.1").await;
    assert_eq!(messages.body.end_asked.get(), 1);
    assert_eq!(
        messages.body.polls,
        bytes.len() + 1,
        "each byte, then its end"
    );
}

#[tokio::test]
async fn a_cancelled_body_ends_it_and_other_body_errors_fail_the_call() {
    let mut body = Script::chunks([framed("x")]);
    body.frames.push_back(Err(Status::cancelled("reset")));
    assert_eq!(unary(body).await.expect("as tonic"), request("x"));

    let mut body = Script::chunks([]);
    body.frames
        .push_back(Err(Status::internal("h2 protocol error")));
    assert_eq!(
        unary(body).await.expect_err("failed").code(),
        Code::Internal
    );
}

#[tokio::test]
async fn garbage_in_any_chunks_is_refused_and_never_panics() {
    // xorshift: the same cases on every run.
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let good = framed("192.0.2.1");
    for case in 0..3000 {
        let len = usize::try_from(next() % 64).expect("small");
        let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if case % 3 == 0 {
            // A plausible prefix before the garbage, lying about the length or not.
            let claimed = u32::try_from(next() % 80).expect("small");
            let mut p = prefix(u8::from(case % 9 == 0), claimed);
            p.extend_from_slice(&bytes);
            bytes = p;
        } else if case % 3 == 1 {
            // A good message with garbage spliced in.
            let mut g = good.to_vec();
            let at = usize::try_from(next()).expect("fits") % g.len();
            g.splice(at..at, bytes.iter().copied());
            bytes = g;
        }
        let mut chunks = Vec::new();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let n = 1 + usize::try_from(next()).expect("fits") % rest.len();
            chunks.push(Bytes::copy_from_slice(&rest[..n]));
            rest = &rest[n..];
        }
        let limit = usize::try_from(next() % 100).expect("small");
        match read_unary::<RateLimitRequest, _>(Script::chunks(chunks), limit).await {
            Ok(_) => {}
            Err(e) => assert!(
                matches!(e.code(), Code::Internal | Code::OutOfRange),
                "case {case}: {e:?}"
            ),
        }
    }
}

#[test]
fn identity_is_the_only_encoding_accepted() {
    let mut headers = HeaderMap::new();
    assert!(uncompressed(&headers).is_ok());
    headers.insert("grpc-encoding", http::HeaderValue::from_static("identity"));
    assert!(uncompressed(&headers).is_ok());

    headers.insert("grpc-encoding", http::HeaderValue::from_static("gzip"));
    let e = uncompressed(&headers).expect_err("gzip");
    assert_eq!(e.code(), Code::Unimplemented);
    assert_eq!(
        e.message(),
        "Content is compressed with `gzip` which isn't supported"
    );
    assert_eq!(
        e.metadata()
            .get("grpc-accept-encoding")
            .map(|v| v.to_str().ok()),
        Some(Some("identity"))
    );

    headers.insert(
        "grpc-encoding",
        http::HeaderValue::from_bytes(&[0xff, b'z']).expect("opaque bytes"),
    );
    let e = uncompressed(&headers).expect_err("not utf-8");
    assert_eq!(
        e.message(),
        "Content is compressed with `[255, 122]` which isn't supported"
    );
}
