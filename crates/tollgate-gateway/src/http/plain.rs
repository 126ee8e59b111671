//! Decision mode's plain requests, answered without hyper.
//!
//! In decision mode nearly every request is a head without a body, answered by a small head
//! of the gateway's own. hyper serves such a request through its whole HTTP/1 machinery: a
//! state machine per connection, a request and a response with their maps, a body type on
//! each side, the response head encoded from its map. This loop reads heads itself, parses
//! them with httparse (hyper's own parser), decides each as the service does (the same
//! request type and the same decision), and writes the answer's bytes; what it does not
//! serve itself it hands to hyper, with every byte read so far, for the rest of the
//! connection.
//!
//! What it serves: an HTTP/1.1 request whose head is whole, parses, is not refused (see
//! `refusal.rs`), has no body (no `Transfer-Encoding`, no `Content-Length` but a single `0`),
//! no `Expect`, no `Upgrade` and no `Connection` but `keep-alive`, and whose method is not
//! `HEAD` (whose answer has no body) or `CONNECT`; and only while the service answers
//! requests itself (a reload may switch the gateway to proxy mode). Everything else, and a head past
//! [`MAX_HEAD_BYTES`] or [`MAX_HEADERS`] headers, goes to hyper, which answers it (or refuses
//! it) exactly as it answered every request before. An answer is written as hyper writes it:
//! the status line, the answer's headers in their order, `connection: close` when the
//! connection ends after it (a drain), `content-length` and `date` when the answer has none;
//! decision mode's common 200 is written whole without a map (`decision_head.rs`). Answers of
//! requests read together leave in one write. One request, its header map and its fields'
//! list are kept for the connection and cleared after each decision, which holds nothing of
//! them.
//!
//! The connection's header read timeout and drain are its [`HeadWatch`]'s, as under hyper: a
//! head read marks it serving, an answer handed over whole starts the wait for the next, a
//! write that proceeds restarts it and one the client does not take holds it; a drain closes
//! the connection while it waits for a head, and lets a request being served finish.

use crate::http::head_end::Progress;
use crate::http::head_timeout::HeadWatch;
use crate::http::metrics::HttpMetrics;
use crate::http::names::Names;
use crate::http::refusal::{refuses_read, MAX_HEADERS, MAX_HEAD_BYTES};
use crate::http::service::{unify, GatewayService, Written};
use crate::http::util::ConnBody;
use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, EXPECT, HOST, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body::Body as _;
use http_body_util::BodyExt as _;
use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, UNIX_EPOCH};
use tokio::net::TcpStream;
use tollgate_tower::TrustedPeer;

/// How a connection left this loop.
pub(crate) enum Served {
    /// Closed: the client closed, an error, a drain, the header read timeout, or an answer
    /// that closes.
    Closed,
    /// hyper serves the rest; these bytes were read and not answered.
    Handover(Bytes),
}

/// The read buffer's size, and the least room a read is given (hyper's own first size).
const READ_ROOM: usize = 8 * 1024;

/// The most answers (in bytes) kept unwritten while requests read together are decided: a
/// client that writes requests faster than it reads answers is held to this, not to as many
/// answers as its requests fit in a read (a 26-byte request can ask for a 450-byte 429).
const OUT_ROOM: usize = 16 * 1024;

/// Serves `stream`'s plain requests (see the module's doc) until it closes or one is not
/// plain.
pub(crate) async fn serve<S: GatewayService>(
    stream: &mut TcpStream,
    service: &mut S,
    peer: &TrustedPeer,
    metrics: &HttpMetrics,
    watch: &HeadWatch,
) -> Served {
    let mut buf = BytesMut::with_capacity(READ_ROOM);
    let mut out: Vec<u8> = Vec::with_capacity(512);
    // A head's fields as read, and its request, kept for the connection: the request's map
    // is cleared after each decision (which holds nothing of it), not made anew.
    let mut fields = Fields::default();
    let mut req = Request::new(());
    loop {
        if out.len() >= OUT_ROOM && !flush(stream, &mut out, watch).await {
            return Served::Closed;
        }
        // The buffer begins where a head may: its empty lines are taken off as they come,
        // a flood of them closes the connection, as hyper's do (see `EmptyLines`).
        if !fields.progress.take_empty_lines(&mut buf) {
            let _ = flush(stream, &mut out, watch).await;
            return Served::Closed;
        }
        let parsed = match parse(&buf, &mut fields) {
            Head::Plain(p) => p,
            Head::Partial if buf.len() < MAX_HEAD_BYTES => {
                // Answers of requests read together leave together, before the next read.
                if !flush(stream, &mut out, watch).await {
                    return Served::Closed;
                }
                if buf.capacity() - buf.len() < READ_ROOM / 2 {
                    buf.reserve(READ_ROOM);
                }
                match read(stream, &mut buf, watch).await {
                    Ok(n) if n > 0 => continue,
                    // The client closed (a head begun and not finished is not answered, as
                    // under hyper), the listener drains, the head took too long, an error.
                    _ => return Served::Closed,
                }
            }
            Head::Partial | Head::Other => {
                return handover(buf.freeze(), stream, &mut out, watch).await
            }
        };
        let (hosts, len) = (parsed.hosts, parsed.len);
        if !parsed.fill(&buf[..len], &mut fields, &mut req) || refuses_read(&req, hosts, len) {
            return handover(buf.freeze(), stream, &mut out, watch).await;
        }
        watch.serving();
        let decided = service.decide_head(&req, peer);
        forget(&mut req);
        let Some(mut decided) = decided else {
            // A reload switched to proxy mode: hyper serves this request and the rest.
            watch.waiting();
            return handover(buf.freeze(), stream, &mut out, watch).await;
        };
        // The request holds copies of the head's parts: the head is let go of here, and the
        // buffer takes its room back when it grows.
        buf.advance(len);
        let decision = match poll_once(&mut decided).await {
            Poll::Ready(decision) => decision,
            Poll::Pending => {
                // The decision waits (on a remote store): what is answered already leaves.
                if !flush(stream, &mut out, watch).await {
                    return Served::Closed;
                }
                decided.await
            }
        };
        // A drain closes the connection after this answer, which says so, as hyper's does.
        let closing = watch.draining();
        let answer = match S::write_answer(decision, &mut out, closing) {
            Written::Whole(status) => {
                metrics.response(status);
                // Handed over whole: the wait for the next head begins.
                watch.waiting();
                continue;
            }
            Written::Answer(answer) => answer,
        };
        let (parts, body) = answer.into_parts();
        let Some(body) = body_bytes(unify(body)).await else {
            return Served::Closed;
        };
        metrics.response(parts.status.as_u16());
        let closes = closing
            || parts
                .headers
                .get(CONNECTION)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        encode(&parts, &body, closing, &mut out);
        // Handed over whole: the wait for the next head begins.
        watch.waiting();
        if closes {
            let _ = flush(stream, &mut out, watch).await;
            return Served::Closed;
        }
    }
}

/// Lets go of what `req` holds of its head's bytes (its target and its values), keeping its
/// map's room for the next head.
fn forget(req: &mut Request<()>) {
    req.headers_mut().clear();
    *req.uri_mut() = Uri::from_static("/");
}

/// Polls `fut` once.
async fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *fut).poll(cx))).await
}

/// Writes what is answered, whole; false when the connection failed.
async fn flush(stream: &TcpStream, out: &mut Vec<u8>, watch: &HeadWatch) -> bool {
    let mut at = 0;
    while at < out.len() {
        match std::future::poll_fn(|cx| watch.poll_write_to(cx, stream, &out[at..])).await {
            Ok(n) if n > 0 => at += n,
            _ => return false,
        }
    }
    out.clear();
    true
}

/// Reads more of the connection into `buf`: the count (0: the client closed), or an error
/// (the header read timeout among them); a drain ends the wait as a close does.
async fn read(stream: &mut TcpStream, buf: &mut BytesMut, watch: &HeadWatch) -> io::Result<usize> {
    std::future::poll_fn(|cx| {
        if watch.draining() {
            return Poll::Ready(Ok(0));
        }
        match watch.poll_read_into(cx, &mut *stream, buf) {
            Poll::Pending if watch.draining() => Poll::Ready(Ok(0)),
            polled => polled,
        }
    })
    .await
}

/// Hands the connection to hyper: what is answered leaves first, then hyper reads `unread`.
async fn handover(
    unread: Bytes,
    stream: &TcpStream,
    out: &mut Vec<u8>,
    watch: &HeadWatch,
) -> Served {
    if !flush(stream, out, watch).await {
        return Served::Closed;
    }
    Served::Handover(unread)
}

/// The whole of an answer's body: the gateway's own at once; one that settles a
/// reservation at its end, read to its end. `None` when it failed.
async fn body_bytes(body: ConnBody) -> Option<Bytes> {
    match body {
        ConnBody::Own(mut full) => {
            // A whole body is ready at once: no waker is needed.
            let mut cx = Context::from_waker(Waker::noop());
            match Pin::new(&mut full).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(frame))) => Some(frame.into_data().unwrap_or_default()),
                _ => Some(Bytes::new()),
            }
        }
        ConnBody::Boxed(body) => body.collect().await.ok().map(|c| c.to_bytes()),
    }
}

/// What the bytes read so far begin with.
enum Head {
    /// A plain request's head, whole.
    Plain(Parsed),
    /// Not a whole head yet.
    Partial,
    /// A head this loop does not serve (or none that parses): hyper's.
    Other,
}

/// A header's name, and where its value is in the bytes it was read from.
type Field = (HeaderName, Range<usize>);

/// A connection's head fields as read, and the names its last heads had, by position.
#[derive(Default)]
struct Fields {
    /// The head's fields, in order, until [`Parsed::fill`] takes them.
    list: Vec<Field>,
    /// The names of the connection's earlier heads (see `names.rs`).
    names: Names,
    /// How far the head being read in pieces has come: it is parsed again only once its end
    /// has come, and its empty lines are taken off as they come (see `head_end.rs`).
    progress: Progress,
}

/// A plain request's head, read: where its parts are in the bytes it was read from (its
/// fields apart, see [`parse`]).
struct Parsed {
    method: Method,
    target: Range<usize>,
    /// The head's length.
    len: usize,
    /// How many `Host` fields it has.
    hosts: usize,
}

impl Parsed {
    /// Makes `req` this head's request, its target and `fields`' values copied from `head`
    /// (the bytes it was read from); false when the target is not a URI or a value not a
    /// header value.
    ///
    /// Copied, not sliced from a shared buffer: a slice of a `Bytes` is a locked instruction
    /// to take and another to drop, and the read buffer split to share the head one more of
    /// each. A copy of a few dozen bytes is an allocation of this thread's allocator (no
    /// locked instruction), and a target of `/` is the static one.
    fn fill(self, head: &[u8], fields: &mut Fields, req: &mut Request<()>) -> bool {
        let target = head.get(self.target).unwrap_or_default();
        let uri = if target == b"/" {
            Ok(Uri::from_static("/"))
        } else {
            Uri::try_from(target)
        };
        let Ok(uri) = uri else {
            return false;
        };
        *req.method_mut() = self.method;
        *req.uri_mut() = uri;
        let headers = req.headers_mut();
        // Empty as a rule: `forget` cleared it after the last head's decision, and clearing
        // an empty map again cost every request a pass over the map's index.
        if !headers.is_empty() {
            headers.clear();
        }
        for (name, at) in fields.list.drain(..) {
            // httparse checked the value's bytes, as HeaderValue does.
            // (A range outside the head, which httparse never gives, is refused, not read as
            // an empty value.)
            let Some(Ok(value)) = head.get(at).map(HeaderValue::from_bytes) else {
                return false;
            };
            headers.append(name, value);
        }
        true
    }
}

/// Reads the head at the start of `buf` (see [`Head`]), its fields into `fields`. A head
/// found not whole is parsed again only once its end has come (or at the bound, by the
/// caller), as hyper's server does: one that goes wrong after its first read is found so then,
/// not at its first bad byte.
fn parse(buf: &[u8], fields: &mut Fields) -> Head {
    if buf.is_empty() {
        return Head::Partial;
    }
    if !fields.progress.worth_parsing(buf) {
        return Head::Partial;
    }
    let mut slots = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            fields.progress.not_whole(buf);
            return Head::Partial;
        }
        Err(_) => return Head::Other,
    };
    fields.progress.whole();
    let (Some(1), Some(method), Some(target)) = (req.version, req.method, req.path) else {
        return Head::Other;
    };
    // A HEAD's answer has no body: hyper's.
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Head::Other;
    };
    if method == Method::HEAD || method == Method::CONNECT {
        return Head::Other;
    }
    let at = |s: &[u8]| {
        let start = s.as_ptr() as usize - buf.as_ptr() as usize;
        start..start + s.len()
    };
    fields.list.clear();
    let (mut length, mut hosts) = (false, 0);
    for (i, h) in req.headers.iter().enumerate() {
        let Some(name) = fields.names.name(i, h.name.as_bytes()) else {
            return Head::Other;
        };
        let plain = if name == HOST {
            hosts += 1;
            true
        } else if name == CONTENT_LENGTH {
            let first = !length;
            length = true;
            first && h.value == b"0"
        } else if name == CONNECTION {
            h.value.eq_ignore_ascii_case(b"keep-alive")
        } else {
            name != TRANSFER_ENCODING && name != EXPECT && name != UPGRADE
        };
        if !plain {
            return Head::Other;
        }
        fields.list.push((name, at(h.value)));
    }
    Head::Plain(Parsed {
        method,
        target: at(target.as_bytes()),
        len,
        hosts,
    })
}

/// Writes an answer's head and `body` as hyper writes an HTTP/1.1 answer: the status line,
/// the headers in their order, then `connection: close` when `closing` (the connection ends
/// after it) and it has no `connection`, then `content-length` and `date` unless it has them.
pub(crate) fn encode(head: &http::response::Parts, body: &[u8], closing: bool, out: &mut Vec<u8>) {
    let status = head.status;
    if status == StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let (mut length, mut date, mut connection) = (false, false, false);
    for (name, value) in &head.headers {
        length |= name == CONTENT_LENGTH;
        date |= name == DATE;
        connection |= name == CONNECTION;
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if closing && !connection {
        out.extend_from_slice(b"connection: close\r\n");
    }
    if !length {
        out.extend_from_slice(b"content-length: ");
        tollgate::headers::write_u64(out, body.len() as u64);
        out.extend_from_slice(b"\r\n");
    }
    if !date {
        out.extend_from_slice(b"date: ");
        write_date(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

thread_local! {
    /// The `date` value of the current second, and that second.
    static DATE_NOW: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

/// Writes the `date` value (IMF-fixdate) of now at the end of `out`, as hyper does (formatted
/// once a second on each thread).
pub(crate) fn write_date(out: &mut Vec<u8>) {
    let secs = unix_secs();
    DATE_NOW.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            let text = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs));
            if text.len() == 29 {
                cached.1.copy_from_slice(text.as_bytes());
                cached.0 = secs;
            }
        }
        out.extend_from_slice(&cached.1);
    });
}

/// The wall clock's seconds since the Unix epoch. On Linux from the kernel's coarse clock (the
/// time of its last tick, 4 ms behind at most here), which a date of whole seconds can use: a
/// read took 9-11 ns in a loop on this machine, the precise one (the vDSO's TSC read) 29-40
/// (`clock_gettime` in a C loop, 5 million reads), and about 47 a read under the gateway's
/// load (perf, docs/benchmarks.md).
#[cfg(target_os = "linux")]
fn unix_secs() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    u64::try_from(now.tv_sec).unwrap_or(0)
}

#[cfg(not(target_os = "linux"))]
fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `answer` (a head as written) with its `date` value, which changes by the second, blanked:
/// what the tests compare.
#[cfg(test)]
pub(crate) fn dateless(answer: &[u8]) -> String {
    let text = String::from_utf8_lossy(answer).into_owned();
    let lines = text.split("\r\n");
    let blanked = lines.map(|l| {
        if l.starts_with("date: ") {
            "date: -"
        } else {
            l
        }
    });
    blanked.collect::<Vec<_>>().join("\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head_end::MAX_EMPTY_LINES;
    use crate::http::names::{KEPT_NAME, KEPT_POSITIONS};
    use http::Response;
    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use std::convert::Infallible;
    use std::time::SystemTime;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn kind(head: &[u8]) -> &'static str {
        let mut fields = Fields::default();
        match parse(head, &mut fields) {
            Head::Plain(p) => {
                assert_eq!(p.len, head.len(), "the whole head is used");
                "plain"
            }
            Head::Partial => "partial",
            Head::Other => "other",
        }
    }

    #[test]
    fn only_whole_bodiless_http11_heads_are_plain() {
        let plain: &[&[u8]] = &[
            b"GET / HTTP/1.1\r\nhost: x\r\n\r\n",
            b"POST /a?b=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            b"GET /a HTTP/1.1\r\nhost: x\r\nconnection: Keep-Alive\r\nx-api-key: k\r\n\r\n",
            b"DELETE http://h/a HTTP/1.1\r\nhost: h\r\n\r\n",
        ];
        for head in plain {
            assert_eq!(kind(head), "plain", "{}", String::from_utf8_lossy(head));
        }
        let other: &[&[u8]] = &[
            b"GET / HTTP/1.0\r\nhost: x\r\n\r\n",
            b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n",
            b"CONNECT h:1 HTTP/1.1\r\nhost: h:1\r\n\r\n",
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello",
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\ncontent-length: 0\r\n\r\n",
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 00\r\n\r\n",
            b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\n\r\n",
            b"GET / HTTP/1.1\r\nbad header\r\n\r\n",
            b"G@T / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/2.0\r\n\r\n",
        ];
        for head in other {
            assert_eq!(kind(head), "other", "{}", String::from_utf8_lossy(head));
        }
        for head in [&b""[..], b"GET / HT", b"GET / HTTP/1.1\r\nhost: x\r\n"] {
            assert_eq!(kind(head), "partial", "{}", String::from_utf8_lossy(head));
        }
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(
            kind(&many),
            "other",
            "more than MAX_HEADERS headers are hyper's"
        );
    }

    /// Every prefix of `head` as one more byte read: the kinds `parse` gives, in order, the
    /// repeats of each run folded into one.
    fn kinds_trickled(head: &[u8]) -> Vec<&'static str> {
        let mut fields = Fields::default();
        let mut kinds: Vec<&'static str> = Vec::new();
        for n in 1..=head.len() {
            let kind = match parse(&head[..n], &mut fields) {
                Head::Plain(p) => {
                    assert_eq!(p.len, n, "a head is whole only at its end");
                    "plain"
                }
                Head::Partial => "partial",
                Head::Other => "other",
            };
            if kinds.last() != Some(&kind) {
                kinds.push(kind);
            }
        }
        kinds
    }

    #[test]
    fn a_head_trickled_a_byte_at_a_time_is_read_when_its_end_comes() {
        // Every line ending httparse takes, so that the end falls across two reads in every
        // way; and empty lines before the request line, which are not an end.
        for head in [
            &b"GET /a HTTP/1.1\r\nhost: x\r\nx-api-key: k\r\n\r\n"[..],
            b"GET /a HTTP/1.1\nhost: x\nx-api-key: k\n\n",
            b"GET /a HTTP/1.1\r\nhost: x\n\r\n",
            b"\r\n\nGET /a HTTP/1.1\r\nhost: x\r\n\r\n",
        ] {
            assert_eq!(
                kinds_trickled(head),
                ["partial", "plain"],
                "{}",
                String::from_utf8_lossy(head)
            );
        }
        // A head that goes wrong after its first read is found so at its end, as hyper's
        // server finds it; one wrong in its first read, at once.
        let late = b"GET /a HTTP/1.1\r\nhost: x\r\nbad header\r\nx-b: 1\r\n\r\n";
        assert_eq!(kinds_trickled(late), ["partial", "other"]);
        let mut fields = Fields::default();
        let at_end = parse(&late[..late.len() - 1], &mut fields);
        assert!(matches!(at_end, Head::Other), "parsed whole, it is wrong");
        assert!(matches!(
            parse(b"G@T / HT", &mut Fields::default()),
            Head::Other
        ));
    }

    #[test]
    fn empty_lines_before_a_head_take_no_room_up_to_their_bound() {
        let request = b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n";
        // Up to the bound before each of two heads on one connection, a byte a read: no
        // room taken but the request's own, and each head plain at its end.
        let (mut fields, mut buf) = (Fields::default(), BytesMut::new());
        let mut most = 0;
        for _ in 0..2 {
            let mut head = "\r\n\n".repeat(MAX_EMPTY_LINES / 3).into_bytes();
            head.extend_from_slice("\n".repeat(MAX_EMPTY_LINES % 3).as_bytes());
            head.extend_from_slice(request);
            for (i, &b) in head.iter().enumerate() {
                buf.extend_from_slice(&[b]);
                assert!(fields.progress.take_empty_lines(&mut buf), "closed at {i}");
                most = most.max(buf.len());
                match parse(&buf, &mut fields) {
                    Head::Partial => assert!(i + 1 < head.len(), "whole at its end"),
                    Head::Plain(p) => {
                        assert_eq!(i + 1, head.len(), "not before its end");
                        assert_eq!(p.len, buf.len());
                        buf.clear();
                    }
                    Head::Other => panic!("refused at {i}"),
                }
            }
        }
        assert_eq!(most, request.len());
        // One byte more: the connection is closed.
        let mut buf = BytesMut::from(&b"\n".repeat(MAX_EMPTY_LINES)[..]);
        let mut fields = Fields::default();
        assert!(fields.progress.take_empty_lines(&mut buf));
        buf.extend_from_slice(b"\n");
        assert!(!fields.progress.take_empty_lines(&mut buf));
        // A `\r` waits for what follows it: `\n` is an empty line, anything else an error.
        let mut buf = BytesMut::from(&b"\r"[..]);
        assert!(Progress::default().take_empty_lines(&mut buf));
        assert_eq!(&buf[..], b"\r");
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        assert!(matches!(parse(&buf, &mut Fields::default()), Head::Other));
    }

    /// What a fresh `parse` of `buf` says: the kind, and a whole head's length.
    fn fresh(buf: &[u8]) -> (&'static str, usize) {
        match parse(buf, &mut Fields::default()) {
            Head::Plain(p) => ("plain", p.len),
            Head::Partial => ("partial", 0),
            Head::Other => ("other", 0),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// A head read in pieces, cut anywhere, is what it is read whole: a plain head is
        /// plain (and as long) the read its end comes in, and no read sooner; one that does not
        /// parse is refused by the read its end comes in at the latest (or sooner, when it
        /// went wrong in the first read, as a fresh parse finds).
        #[test]
        fn a_head_read_in_pieces_is_what_it_is_read_whole(
            empty in proptest::sample::select(&["", "\r\n", "\n", "\r\n\n\r\n", "\r", "\rX"][..]),
            line in proptest::sample::select(&[
                "GET /a HTTP/1.1", "POST /b?c=1 HTTP/1.1", "GET / HTTP/1.0", "G@T / HTTP/1.1",
                "HEAD / HTTP/1.1",
            ][..]),
            fields in proptest::collection::vec(proptest::sample::select(&[
                "host: x", "Host: y", "x-api-key: k1", "content-length: 0", "content-length: 5",
                "connection: keep-alive", "bad header", "x-v: a\tb", "x-e:", "x-long: vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv",
            ][..]), 0..6),
            ends in proptest::collection::vec(proptest::sample::select(&["\r\n", "\n"][..]), 7),
            next in proptest::sample::select(&["", "GET /next HTTP/1.1\r\n"][..]),
            cuts in proptest::collection::vec(1usize..200, 0..8),
        ) {
            let mut head = format!("{empty}{line}{}", ends[0]);
            for (i, f) in fields.iter().enumerate() {
                head.push_str(f);
                head.push_str(ends[1 + i % 5]);
            }
            head.push_str(ends[6]);
            let whole = head.len();
            head.push_str(next);
            let bytes = head.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c < bytes.len()).collect();
            cuts.push(bytes.len());
            cuts.sort_unstable();
            cuts.dedup();
            // As `serve` reads: the bytes come into one buffer, its empty lines are taken
            // off its front, then it is parsed.
            let (mut fields, mut buf) = (Fields::default(), BytesMut::new());
            let (mut fed, mut skipped) = (0, 0);
            for cut in cuts {
                buf.extend_from_slice(&bytes[fed..cut]);
                fed = cut;
                let before = buf.len();
                proptest::prop_assert!(fields.progress.take_empty_lines(&mut buf));
                skipped += before - buf.len();
                let whole_parse = fields.progress.first_look();
                let (kind, len) = fresh(&bytes[..cut]);
                let read = match parse(&buf, &mut fields) {
                    Head::Plain(p) => ("plain", skipped + p.len),
                    Head::Partial => ("partial", 0),
                    Head::Other => ("other", 0),
                };
                if kind == "other" && cut < whole && !whole_parse {
                    // Wrong before its end: found now or when the end comes.
                    proptest::prop_assert!(read.0 != "plain", "{read:?} at {cut} of {head:?}");
                } else {
                    proptest::prop_assert_eq!(read, (kind, len), "at {} of {:?}", cut, head);
                }
                if read.0 != "partial" {
                    proptest::prop_assert!(cut >= whole || whole_parse, "at {} of {:?}", cut, head);
                    break;
                }
            }
        }
    }

    /// The header map `head` makes, read with `fields`.
    fn names_of(head: &[u8], fields: &mut Fields) -> Option<Vec<(String, String)>> {
        let bytes = Bytes::copy_from_slice(head);
        let Head::Plain(parsed) = parse(&bytes, fields) else {
            return None;
        };
        let mut req = Request::new(());
        assert!(parsed.fill(&bytes, fields, &mut req), "a request");
        let h = req.headers();
        Some(
            h.iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("?").to_owned()))
                .collect(),
        )
    }

    #[test]
    fn names_known_from_earlier_heads_read_as_a_new_connection_reads_them() {
        // One connection's heads, one after another: the same names, others at the same
        // places, other cases, names that only look alike, bad names, more names than before.
        // (An earlier head's "HOST" is not this one's "Host": parsed again, the same name.)
        let heads: &[&[u8]] = &[
            b"GET / HTTP/1.1\r\nHost: h\r\nx-api-key: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\nx-api-key: b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHOST: h\r\nX-Api-Key: c\r\n\r\n",
            b"GET / HTTP/1.1\r\nx-api-key: d\r\nhost: h\r\n\r\n",
            b"GET / HTTP/1.1\r\nx-api_key: e\r\nhost: h\r\n\r\n",
            b"GET / HTTP/1.1\r\nx-api-kez: f\r\nhost: h\r\nx-more: 1\r\nx-most: 2\r\n\r\n",
            b"GET / HTTP/1.1\r\nx-api-k\xc5\xb9: g\r\nhost: h\r\n\r\n",
            b"GET / HTTP/1.1\r\nx-api-kez: h\r\nhost: h\r\nx-more: 1\r\nX-MOST: 2\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost: h\r\n\r\n",
            b"GET / HTTP/1.1\r\nx-api-kez: i\r\nhost: h\r\nx-more: 1\r\nx-most: 2\r\n\r\n",
        ];
        let mut kept = Fields::default();
        for (i, head) in heads.iter().enumerate() {
            let fresh = names_of(head, &mut Fields::default());
            assert_eq!(
                names_of(head, &mut kept),
                fresh,
                "head {i}: {}",
                String::from_utf8_lossy(head)
            );
            assert!(kept.names.kept().len() <= 4);
        }
        assert!(
            names_of(heads[6], &mut kept).is_none(),
            "a bad name is not one"
        );
        let names = |kept: &Fields| kept.names.kept();
        assert_eq!(names(&kept), ["x-api-kez", "host", "x-more", "x-most"]);
        // A long name is read, not kept; the names after it are.
        let long = format!("x-{}", "l".repeat(KEPT_NAME - 1));
        let head = format!("GET / HTTP/1.1\r\nhost: h\r\n{long}: 1\r\nx-after: 2\r\n\r\n");
        for _ in 0..2 {
            let read = names_of(head.as_bytes(), &mut kept).expect("plain");
            assert_eq!(read[1].0, long);
            assert_eq!(names(&kept), ["host", "-", "x-after", "x-most"]);
        }
        // A flood of names is read whole; what is kept is held to KEPT_POSITIONS.
        for round in 0..3 {
            let mut many = b"GET / HTTP/1.1\r\n".to_vec();
            for i in 0..MAX_HEADERS {
                many.extend_from_slice(format!("x-{round}-{i}: v\r\n").as_bytes());
            }
            many.extend_from_slice(b"\r\n");
            let read = names_of(&many, &mut kept).expect("plain");
            assert_eq!(read.len(), MAX_HEADERS);
            assert_eq!(
                read[MAX_HEADERS - 1].0,
                format!("x-{round}-{}", MAX_HEADERS - 1)
            );
            assert_eq!(kept.names.kept().len(), KEPT_POSITIONS);
        }
        // What the connection holds for them, at most.
        let kept_bytes = kept.names.bytes_at_most();
        eprintln!("names kept by a connection: at most {kept_bytes} bytes");
        assert!(kept_bytes <= 4096, "{kept_bytes}");
    }

    /// Whether the loop's check refuses `head` (read whole), and whether hyper's path does.
    fn refused(head: &[u8]) -> (bool, bool) {
        let bytes = Bytes::copy_from_slice(head);
        let mut fields = Fields::default();
        let Head::Plain(parsed) = parse(&bytes, &mut fields) else {
            panic!(
                "plain: {}",
                String::from_utf8_lossy(&head[..head.len().min(80)])
            );
        };
        let (hosts, len) = (parsed.hosts, parsed.len);
        let mut req = Request::new(());
        assert!(parsed.fill(&bytes, &mut fields, &mut req), "a request");
        (
            refuses_read(&req, hosts, len),
            crate::http::refusal::refusal(&req).is_some(),
        )
    }

    #[test]
    fn the_loops_refusals_are_hypers_path_refusals() {
        for head in [
            &b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nx: y\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost: x\r\nHost: x\r\n\r\n",
            b"GET http://h HTTP/1.1\nHOST:h\n\n",
            b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n",
        ] {
            let (loop_, hyper_) = refused(head);
            assert_eq!(loop_, hyper_, "{}", String::from_utf8_lossy(head));
        }
        // Heads around the 64 KiB bound, written as tightly as a client may (bare LFs, no
        // space after a colon, empty values, an absolute target with no path): each grows
        // most when written out, and the loop skips measuring only far enough below it.
        let tight = |len: usize| {
            let mut h = b"GET http://h HTTP/1.1\nhost:h\n".to_vec();
            for _ in 0..MAX_HEADERS - 2 {
                h.extend_from_slice(b"x:\n");
            }
            let rest = len - h.len() - 4;
            h.extend_from_slice(b"y:");
            h.extend(std::iter::repeat_n(b'v', rest));
            h.extend_from_slice(b"\n\n");
            assert_eq!(h.len(), len);
            h
        };
        let mut refusals = 0;
        let near = MAX_HEAD_BYTES - crate::http::refusal::HEAD_SLACK;
        for len in (near - 4..near + 4).chain(MAX_HEAD_BYTES - 210..MAX_HEAD_BYTES + 4) {
            let (loop_, hyper_) = refused(&tight(len));
            assert_eq!(loop_, hyper_, "a tight head of {len} bytes");
            refusals += usize::from(loop_);
        }
        assert!(
            refusals > 0 && refusals < 218,
            "both sides of the bound: {refusals}"
        );
    }

    #[test]
    fn a_request_is_the_head_as_read_and_the_rest_is_left() {
        let bytes = Bytes::from(
            b"PUT /p?q=1 HTTP/1.1\r\nHost: h\r\nX-Api-Key: k1\r\nx-two: a\r\nX-Two: b\r\n\r\nGET /next"
                .to_vec(),
        );
        let mut fields = Fields::default();
        let Head::Plain(parsed) = parse(&bytes, &mut fields) else {
            panic!("plain");
        };
        assert_eq!(&bytes[parsed.len..], b"GET /next");
        let head = bytes.slice(..parsed.len);
        let mut req = Request::new(());
        req.headers_mut()
            .insert("x-earlier", HeaderValue::from_static("gone"));
        assert!(parsed.fill(&head, &mut fields, &mut req), "a request");
        assert_eq!(req.method(), Method::PUT);
        assert_eq!(req.uri(), "/p?q=1");
        assert_eq!(req.version(), http::Version::HTTP_11);
        let h = req.headers();
        assert_eq!(h.len(), 4);
        assert_eq!(h["host"], "h");
        assert_eq!(h["x-api-key"], "k1");
        let two: Vec<_> = h.get_all("x-two").iter().collect();
        assert_eq!(two, ["a", "b"]);
        assert!(fields.list.is_empty(), "the fields are taken");
        // The request holds copies of the head's parts, no slice of the bytes read (each
        // slice of a shared buffer a locked instruction to take and one to drop).
        drop(head);
        assert!(bytes.is_unique(), "no slice of the head is held");
        // Let go of after its decision: the map's room kept.
        let room = req.headers().capacity();
        forget(&mut req);
        assert!(req.headers().is_empty());
        assert_eq!(req.headers().capacity(), room);
        assert_eq!(req.uri(), "/");
    }

    #[test]
    fn a_field_outside_the_head_given_refuses_the_request_rather_than_reading_it_empty() {
        let bytes = b"GET /p HTTP/1.1\r\nHost: h\r\nX-Api-Key: k1\r\n\r\n";
        let mut fields = Fields::default();
        let Head::Plain(parsed) = parse(bytes, &mut fields) else {
            panic!("plain");
        };
        // The target is within the first 20 bytes; the fields' values are not.
        let mut req = Request::new(());
        assert!(!parsed.fill(&bytes[..20], &mut fields, &mut req));
        assert!(req.headers().get("x-api-key").is_none());
    }

    /// What hyper's server writes for `resp` (as the gateway's builder sets it up), read back
    /// raw; `closing`: hyper is to close the connection after it (as when it drains).
    async fn hyper_writes(resp: Response<Full<Bytes>>, closing: bool) -> Vec<u8> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let resp = std::sync::Mutex::new(Some(resp));
            let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                let r = resp.lock().expect("lock").take().expect("one request");
                async move { Ok::<_, Infallible>(r) }
            });
            let mut b = hyper::server::conn::http1::Builder::new();
            b.writev(false);
            let _ = b.serve_connection(TokioIo::new(stream), svc).await;
        });
        let mut c = TcpStream::connect(addr).await.expect("connect");
        // Kept alive unless `closing`, and the write side closed: hyper answers and closes.
        let request: &[u8] = if closing {
            b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        } else {
            b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
        };
        c.write_all(request).await.expect("write");
        c.shutdown().await.expect("shutdown");
        let mut got = Vec::new();
        c.read_to_end(&mut got).await.expect("read");
        server.await.expect("server");
        got
    }

    #[tokio::test]
    async fn answers_are_written_as_hyper_writes_them() {
        let answers = [
            (
                StatusCode::OK,
                vec![("content-type", "text/plain; charset=utf-8")],
                "",
            ),
            (
                StatusCode::TOO_MANY_REQUESTS,
                vec![
                    ("content-type", "application/problem+json"),
                    ("retry-after", "7"),
                    ("ratelimit", "\"a\";r=0;t=7"),
                ],
                "{\"status\":429}",
            ),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                vec![("retry-after", "1")],
                "down",
            ),
            (
                StatusCode::from_u16(599).expect("status"),
                vec![("x-a", "1"), ("x-a", "2")],
                "odd",
            ),
        ];
        for (status, headers, body) in answers {
            let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
            *resp.status_mut() = status;
            for (n, v) in &headers {
                resp.headers_mut().append(*n, HeaderValue::from_static(v));
            }
            let (parts, full) = resp.into_parts();
            for closing in [false, true] {
                let mut ours = Vec::new();
                encode(&parts, body.as_bytes(), closing, &mut ours);
                let answer = Response::from_parts(parts.clone(), full.clone());
                let theirs = hyper_writes(answer, closing).await;
                assert_eq!(
                    dateless(&ours),
                    dateless(&theirs),
                    "{status}, closing {closing}"
                );
                assert!(
                    dateless(&ours).contains("\r\ndate: -\r\n"),
                    "a date is written"
                );
            }
        }
    }

    #[test]
    fn the_date_is_an_imf_fixdate_of_now() {
        let mut out = b"x".to_vec();
        write_date(&mut out);
        let text = std::str::from_utf8(&out[1..]).expect("ascii");
        let when = httpdate::parse_http_date(text).expect("a date");
        let off = SystemTime::now()
            .duration_since(when)
            .unwrap_or_else(|e| e.duration());
        assert!(off < std::time::Duration::from_secs(5), "{text}");
        // The coarse clock's second is the precise clock's, or the one before just after a
        // second begins (or the one after, where the two reads straddle a second).
        let precise = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let coarse = unix_secs();
        assert!(
            coarse + 1 >= precise && coarse <= precise + 1,
            "{coarse} {precise}"
        );
    }
}
