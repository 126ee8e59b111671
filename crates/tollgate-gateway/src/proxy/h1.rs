//! HTTP/1.1 on the proxy's upstream connections, written and read here (the connections
//! themselves are `pool.rs`'s): a request head written from its map and its body framed, a
//! response head parsed with httparse (hyper's own parser) and its body unframed. The rules
//! are those of hyper's `client::conn::http1`, which the proxy used before:
//!
//! - **A request's body** goes as its `Content-Length` says when it has a valid one, else by
//!   the length the body knows (a `content-length` added), else chunked (a
//!   `transfer-encoding: chunked` added), except that a `GET`, `HEAD` or `CONNECT` of
//!   unknown length is sent with none. A body already at its end is sent with nothing added.
//!   A `Transfer-Encoding` the request has is replaced by chunked (the proxy removes every
//!   client's: it is hop-by-hop). Trailers of a request are not sent (hyper sent only those a
//!   `Trailer` field named, and the proxy removes that field too).
//! - **A response's body** (RFC 9112 section 6.3): none for a `HEAD`, a 1xx, 204 or 304, or a
//!   2xx to a `CONNECT`; chunked when `Transfer-Encoding` ends in `chunked`, else up to the
//!   close when it is present (an error in HTTP/1.0); as long as its `Content-Length` when all
//!   its values agree (an error when they do not); else up to the close. Interim (1xx)
//!   responses but 101 are skipped. A response head is bounded as hyper's client bounds it
//!   ([`MAX_HEAD`] bytes, [`MAX_FIELDS`] fields); a chunk's size line, its extensions and the
//!   trailers are bounded too.
//! - **The connection** serves another request when the response is HTTP/1.1 without
//!   `Connection: close`, or HTTP/1.0 with `Connection: keep-alive`, and its body was framed
//!   by a length or chunks (the pool also requires that the request's body was sent whole).
//!
//! Where this differs from hyper's client, on purpose: a response's hop-by-hop fields are
//! left out of its map (the proxy removed them after hyper); a `Content-Length` beside
//! chunked framing is left out too and the connection is not used again (hyper kept the
//! field, and the client was answered by the wrong length); empty lines before a head are
//! taken off as they come and bounded (hyper skips them all again on every read). A head or
//! a trailer section that comes in many reads is parsed again only once its end has come,
//! as hyper's `is_complete_fast` does for heads.

use super::headers::{is_hop_by_hop, names_another, strip_hop_by_hop};
use crate::http::head_end::Progress;
use crate::http::names::Names;
use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};
use std::mem::MaybeUninit;
use std::ops::Range;

/// The longest response head read: hyper's client's default bound.
pub(super) const MAX_HEAD: usize = 8192 + 4096 * 100;

/// The most fields a response head (or a chunked body's trailers) may have: hyper's default.
pub(super) const MAX_FIELDS: usize = 100;

/// The most bytes of chunk extensions a body may have in all (hyper's bound): they are read
/// and dropped.
const MAX_EXTENSIONS: usize = 16 * 1024;

/// The longest trailer section read (hyper's bound).
const MAX_TRAILERS: usize = 16 * 1024;

/// Why a response could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Malformed(pub(super) &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed upstream response: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// How a request's body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outgoing {
    /// No body is sent.
    None,
    /// This many bytes, as they come.
    Length(u64),
    /// Chunked, ended by a last chunk.
    Chunked,
}

static CHUNKED: HeaderValue = HeaderValue::from_static("chunked");

/// Decides how a request's body is framed (see the module's doc), adding or removing the
/// framing fields in `headers`. `ended`: the body is at its end already; `exact`: its length
/// when it knows it.
pub(super) fn frame_request(
    method: &Method,
    headers: &mut HeaderMap,
    ended: bool,
    exact: Option<u64>,
) -> Outgoing {
    let had_te = headers.remove(TRANSFER_ENCODING).is_some();
    if ended {
        return Outgoing::None;
    }
    if !had_te {
        match content_length(headers) {
            Ok(Some(n)) => return Outgoing::Length(n),
            Ok(None) => {
                if let Some(n) = exact {
                    headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
                    return Outgoing::Length(n);
                }
                if matches!(*method, Method::GET | Method::HEAD | Method::CONNECT) {
                    return Outgoing::None;
                }
            }
            Err(_) => {}
        }
    }
    headers.remove(CONTENT_LENGTH);
    headers.insert(TRANSFER_ENCODING, CHUNKED.clone());
    Outgoing::Chunked
}

/// Writes a request head: `method`, `target` (its path and query) and `headers` in their
/// order, as hyper's client writes them, then `fields` (whole header lines, written as they
/// are).
pub(super) fn write_request_head(
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    fields: &[u8],
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(fields);
    out.extend_from_slice(b"\r\n");
}

/// Writes one chunk of a chunked body (`data` not empty).
pub(super) fn write_chunk(data: &[u8], out: &mut Vec<u8>) {
    let mut size = [0u8; 16];
    let mut at = size.len();
    let mut n = data.len();
    loop {
        at -= 1;
        size[at] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&size[at..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The last chunk of a chunked body, with no trailers.
pub(super) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// A `Content-Length`'s value: `None` when there is none, an error when its values are not
/// one decimal number (several fields, or one with several comma-separated values, must
/// agree).
pub(super) fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Malformed> {
    let mut found = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        length_values(value.as_bytes(), &mut found)?;
    }
    Ok(found)
}

/// Takes one `Content-Length` field's values into `found` (the length of the fields before
/// it): an error when one is not a decimal number or differs.
fn length_values(value: &[u8], found: &mut Option<u64>) -> Result<(), Malformed> {
    for part in value.split(|&b| b == b',') {
        let n = decimal(part.trim_ascii()).ok_or(Malformed("a bad content-length"))?;
        if found.is_some_and(|f| f != n) {
            return Err(Malformed("content-length values that differ"));
        }
        *found = Some(n);
    }
    Ok(())
}

/// Digits only, at most 19 of them (no sign, no overflow).
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
    })
}

/// How a response's body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Incoming {
    /// It has none.
    Empty,
    /// This many bytes.
    Length(u64),
    /// Chunked.
    Chunked,
    /// Everything up to the close.
    Close,
}

/// A response head, read.
#[derive(Debug)]
pub(super) struct ResponseHead {
    pub(super) status: StatusCode,
    pub(super) version: Version,
    /// Its reason phrase when it is not the status's canonical one.
    pub(super) reason: Option<Bytes>,
    pub(super) headers: HeaderMap,
    pub(super) body: Incoming,
    /// Whether the connection may serve another request after this response.
    pub(super) keep_alive: bool,
}

/// What a read buffer begins with.
#[derive(Debug)]
pub(super) enum Read {
    /// Not a whole head yet: the map given, for the next try.
    Partial(HeaderMap),
    /// A response head (taken from the buffer).
    Head(Box<ResponseHead>),
}

/// A response head's fields as parsed, before the head is split off the buffer.
type Fields = Vec<(HeaderName, Range<usize>)>;

/// A connection's reader of response heads, with what it keeps between them.
#[derive(Default)]
pub(super) struct HeadReader {
    /// The header names of the upstream's earlier responses, by position.
    names: Names,
    /// The fields of the head being read.
    fields: Fields,
    /// How far the head being read has come: a head trickled in many reads is parsed again
    /// only once its end has come, and its empty lines are taken off as they come (see
    /// `head_end.rs`).
    progress: Progress,
}

/// What a response head's fields say of its framing, noted as they are read (no lookups in
/// its map afterwards).
struct Meta {
    /// `Content-Length`: its value (`None`: absent), or the error of values that are bad or
    /// differ.
    length: Result<Option<u64>, Malformed>,
    /// `Transfer-Encoding` is present; `chunked`: its last coding is `chunked`.
    te: bool,
    chunked: bool,
    /// `Connection` names `close`; `keep_alive`: it names `keep-alive`; `more`: it names a
    /// field beyond the fixed hop-by-hop ones, which is then hop-by-hop too.
    close: bool,
    keep_alive: bool,
    more: bool,
}

impl Meta {
    fn new() -> Self {
        Self {
            length: Ok(None),
            te: false,
            chunked: false,
            close: false,
            keep_alive: false,
            more: false,
        }
    }

    fn note(&mut self, name: &HeaderName, value: &[u8]) {
        if *name == CONTENT_LENGTH {
            if let Ok(found) = &mut self.length {
                if let Err(e) = length_values(value, found) {
                    self.length = Err(e);
                }
            }
        } else if *name == TRANSFER_ENCODING {
            // The last field's last coding is the last coding.
            self.te = true;
            self.chunked = value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if *name == CONNECTION {
            for token in value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                self.close |= token.eq_ignore_ascii_case(b"close");
                self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                self.more |= names_another(token);
            }
        }
    }
}

impl HeadReader {
    /// Takes the empty lines at the start of `buf` off it: an error past
    /// [`crate::http::head_end::MAX_EMPTY_LINES`] of them before one head.
    fn take_empty_lines(&mut self, buf: &mut BytesMut) -> Result<(), Malformed> {
        if self.progress.take_empty_lines(buf) {
            Ok(())
        } else {
            Err(Malformed("too many empty lines before a head"))
        }
    }

    /// Reads the response head at the start of `buf`, taking it (and any interim responses
    /// before it) from `buf`; `method`: the request's; `map` is a map to fill (its room is
    /// reused: the request's, written already), emptied first.
    ///
    /// The head's hop-by-hop fields are not in the response's map: the proxy never passes them
    /// on (`headers.rs`), and leaving them out costs less than removing them (a lookup each).
    pub(super) fn read(
        &mut self,
        buf: &mut BytesMut,
        method: &Method,
        mut map: HeaderMap,
    ) -> Result<Read, Malformed> {
        self.take_empty_lines(buf)?;
        if !self.progress.worth_parsing(buf) {
            if buf.len() >= MAX_HEAD {
                return Err(Malformed("a head too large"));
            }
            return Ok(Read::Partial(map));
        }
        loop {
            let (names, fields) = (&mut self.names, &mut self.fields);
            let (len, status, version, reason, meta) = {
                let mut slots =
                    [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
                let mut res = httparse::Response::new(&mut []);
                let bytes: &[u8] = buf;
                let parsed = httparse::ParserConfig::default()
                    .parse_response_with_uninit_headers(&mut res, bytes, &mut slots);
                let len = match parsed {
                    Ok(httparse::Status::Complete(len)) => len,
                    Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {
                        self.progress.not_whole(buf);
                        return Ok(Read::Partial(map));
                    }
                    Ok(httparse::Status::Partial) => return Err(Malformed("a head too large")),
                    Err(httparse::Error::TooManyHeaders) => {
                        return Err(Malformed("too many fields"))
                    }
                    Err(_) => return Err(Malformed("a head that does not parse")),
                };
                if len > MAX_HEAD {
                    return Err(Malformed("a head too large"));
                }
                let (Some(code), Some(minor)) = (res.code, res.version) else {
                    return Err(Malformed("a head that does not parse"));
                };
                let status = StatusCode::from_u16(code).map_err(|_| Malformed("a bad status"))?;
                let version = if minor == 1 {
                    Version::HTTP_11
                } else {
                    Version::HTTP_10
                };
                let at = |s: &[u8]| {
                    let start = s.as_ptr() as usize - bytes.as_ptr() as usize;
                    start..start + s.len()
                };
                let reason = res
                    .reason
                    .filter(|r| !r.is_empty() && Some(*r) != status.canonical_reason())
                    .map(|r| at(r.as_bytes()));
                fields.clear();
                let mut meta = Meta::new();
                for (i, h) in res.headers.iter().enumerate() {
                    let name = names
                        .name(i, h.name.as_bytes())
                        .ok_or(Malformed("a bad field name"))?;
                    meta.note(&name, h.value);
                    fields.push((name, at(h.value)));
                }
                (len, status, version, reason, meta)
            };
            // An interim response (100 Continue and the like) precedes the real one.
            if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
                buf.advance(len);
                self.progress.whole();
                self.take_empty_lines(buf)?;
                continue;
            }
            let head = buf.split_to(len).freeze();
            map.clear();
            for (name, at) in fields.drain(..) {
                if !meta.more && is_hop_by_hop(&name) {
                    continue;
                }
                // Chunked framing overrides a length, which must not reach the client (whose
                // answer is framed anew): RFC 9112 section 6.3.
                if meta.te && name == CONTENT_LENGTH {
                    continue;
                }
                let value = HeaderValue::from_maybe_shared(head.slice(at))
                    .map_err(|_| Malformed("a bad field value"))?;
                map.append(name, value);
            }
            // A `Connection` that names other fields: they go as the fixed ones do.
            if meta.more {
                strip_hop_by_hop(&mut map);
            }
            let headers = map;
            let reason = reason.map(|at| head.slice(at));
            let (body, framed) = framing(status, version, method, &meta)?;
            let keep_alive = framed
                && if version == Version::HTTP_11 {
                    !meta.close
                } else {
                    meta.keep_alive
                };
            self.progress.whole();
            return Ok(Read::Head(Box::new(ResponseHead {
                status,
                version,
                reason,
                headers,
                body,
                keep_alive,
            })));
        }
    }
}

/// How a response's body is read, and whether its end is known without a close.
fn framing(
    status: StatusCode,
    version: Version,
    method: &Method,
    meta: &Meta,
) -> Result<(Incoming, bool), Malformed> {
    match status.as_u16() {
        // Not proxied (the proxy removes `Upgrade`): the connection is not used again.
        101 => return Ok((Incoming::Empty, false)),
        204 | 304 => return Ok((Incoming::Empty, true)),
        _ => {}
    }
    if *method == Method::HEAD {
        return Ok((Incoming::Empty, true));
    }
    if *method == Method::CONNECT && status.is_success() {
        return Ok((Incoming::Empty, false));
    }
    if meta.te {
        if version == Version::HTTP_10 {
            return Err(Malformed("transfer-encoding in HTTP/1.0"));
        }
        // A length beside the coding may be an attempt at response splitting: the body is
        // read by its chunks, and the connection is not used again (RFC 9112 section 6.3).
        return Ok(if meta.chunked {
            (Incoming::Chunked, matches!(meta.length, Ok(None)))
        } else {
            (Incoming::Close, false)
        });
    }
    Ok(match meta.length.clone()? {
        Some(n) => (Incoming::Length(n), true),
        None => (Incoming::Close, false),
    })
}

/// What a chunked body gives next.
#[derive(Debug)]
pub(super) enum Step {
    /// Bytes of a chunk.
    Data(Bytes),
    /// The trailers; the body is over.
    Trailers(HeaderMap),
    /// The body is over, with no trailers.
    End,
    /// More bytes are needed.
    More,
}

/// A chunked body's decoder: where in its framing the bytes read so far end.
#[derive(Debug, Default)]
pub(super) struct Chunked {
    state: ChunkState,
    /// Extension bytes read so far (bounded by [`MAX_EXTENSIONS`]).
    extensions: usize,
    /// How far the trailer section has come (as [`HeadReader`]'s).
    trailers: Progress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// A size line's hex digits: the size so far, and whether it has a digit yet.
    Size(u64, bool),
    /// Spaces after the size (hyper takes them).
    SizeSpace(u64),
    /// A chunk extension, up to its line's end.
    Extension(u64),
    /// The size line's `\n`.
    SizeLf(u64),
    /// This many bytes of the chunk are still to come.
    Data(u64),
    /// The `\r` after a chunk's bytes.
    DataCr,
    /// The `\n` after a chunk's bytes.
    DataLf,
    /// After the last chunk: the trailer section.
    Trailers,
    /// Over.
    Done,
}

impl Default for ChunkState {
    fn default() -> Self {
        ChunkState::Size(0, false)
    }
}

impl Chunked {
    /// Whether the body is over.
    #[cfg(test)]
    pub(super) fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Decodes what `buf` holds, taking what it decodes from it.
    pub(super) fn step(&mut self, buf: &mut BytesMut) -> Result<Step, Malformed> {
        use ChunkState::*;
        loop {
            if let Data(left) = self.state {
                if buf.is_empty() {
                    return Ok(Step::More);
                }
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                let rest = left - n as u64;
                self.state = if rest == 0 { DataCr } else { Data(rest) };
                return Ok(Step::Data(buf.split_to(n).freeze()));
            }
            match self.state {
                Trailers => return self.trailers(buf),
                Done => return Ok(Step::End),
                _ => {}
            }
            let Some(&b) = buf.first() else {
                return Ok(Step::More);
            };
            buf.advance(1);
            self.state = match (self.state, b) {
                (Size(n, _), b) if b.is_ascii_hexdigit() => {
                    // A size past 64 bits is an error (leading zeros are not).
                    if n >> 60 != 0 {
                        return Err(Malformed("a chunk size too large"));
                    }
                    let d = (b as char).to_digit(16).unwrap_or(0);
                    Size(n << 4 | u64::from(d), true)
                }
                (Size(_, false), _) => return Err(Malformed("a chunk size line without a size")),
                (Size(n, _) | SizeSpace(n), b' ' | b'\t') => SizeSpace(n),
                (Size(n, _) | SizeSpace(n), b';') => Extension(n),
                (Size(n, _) | SizeSpace(n) | Extension(n), b'\r') => SizeLf(n),
                (Extension(_), b'\n') => return Err(Malformed("a bare LF in a chunk extension")),
                (Extension(n), _) => {
                    self.extensions += 1;
                    if self.extensions > MAX_EXTENSIONS {
                        return Err(Malformed("chunk extensions too long"));
                    }
                    Extension(n)
                }
                (SizeLf(0), b'\n') => Trailers,
                (SizeLf(n), b'\n') => Data(n),
                (DataCr, b'\r') => DataLf,
                (DataLf, b'\n') => Size(0, false),
                _ => return Err(Malformed("bad chunk framing")),
            };
        }
    }

    /// The trailer section after the last chunk: an empty line, or fields up to one.
    fn trailers(&mut self, buf: &mut BytesMut) -> Result<Step, Malformed> {
        if buf.starts_with(b"\r\n") {
            buf.advance(2);
            self.state = ChunkState::Done;
            return Ok(Step::End);
        }
        if !self.trailers.worth_parsing(buf) {
            if buf.len() >= MAX_TRAILERS {
                return Err(Malformed("trailers too large"));
            }
            return Ok(Step::More);
        }
        let mut slots = [httparse::EMPTY_HEADER; MAX_FIELDS];
        match httparse::parse_headers(buf, &mut slots) {
            Ok(httparse::Status::Complete((len, fields))) => {
                let mut trailers = HeaderMap::with_capacity(fields.len());
                for f in fields {
                    let name = HeaderName::from_bytes(f.name.as_bytes())
                        .map_err(|_| Malformed("a bad trailer name"))?;
                    let value = HeaderValue::from_bytes(f.value)
                        .map_err(|_| Malformed("a bad trailer value"))?;
                    trailers.append(name, value);
                }
                buf.advance(len);
                self.state = ChunkState::Done;
                Ok(Step::Trailers(trailers))
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_TRAILERS => {
                self.trailers.not_whole(buf);
                Ok(Step::More)
            }
            Ok(httparse::Status::Partial) => Err(Malformed("trailers too large")),
            Err(_) => Err(Malformed("trailers that do not parse")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head_end::MAX_EMPTY_LINES;
    use proptest::prelude::*;

    fn head(text: &[u8], method: &Method) -> Result<Read, Malformed> {
        let mut buf = BytesMut::from(text);
        HeadReader::default().read(&mut buf, method, HeaderMap::new())
    }

    fn whole(text: &[u8], method: &Method) -> ResponseHead {
        match head(text, method) {
            Ok(Read::Head(h)) => *h,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_response_s_body_is_framed_as_rfc_9112_says() {
        let get = Method::GET;
        let cases: &[(&[u8], &Method, Incoming, bool)] = &[
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
                &get,
                Incoming::Length(5),
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\nContent-Length: 5\r\n\r\n",
                &get,
                Incoming::Length(5),
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
                &get,
                Incoming::Chunked,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 9\r\n\r\n",
                &get,
                Incoming::Chunked,
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
                &get,
                Incoming::Close,
                false,
            ),
            (b"HTTP/1.1 200 OK\r\n\r\n", &get, Incoming::Close, false),
            (
                b"HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n",
                &get,
                Incoming::Empty,
                true,
            ),
            (
                b"HTTP/1.1 304 Not Modified\r\n\r\n",
                &get,
                Incoming::Empty,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n",
                &Method::HEAD,
                Incoming::Empty,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\n\r\n",
                &Method::CONNECT,
                Incoming::Empty,
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: Keep-Alive, CLOSE\r\n\r\n",
                &get,
                Incoming::Length(2),
                false,
            ),
            (
                b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n",
                &get,
                Incoming::Length(2),
                false,
            ),
            (
                b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\n",
                &get,
                Incoming::Length(2),
                true,
            ),
            (
                b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
                &get,
                Incoming::Empty,
                false,
            ),
        ];
        for (text, method, body, keep_alive) in cases {
            let h = whole(text, method);
            assert_eq!(
                (h.body, h.keep_alive),
                (*body, *keep_alive),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
        for bad in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
            b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            b"this is not HTTP\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n",
        ] {
            assert!(head(bad, &get).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_left_out_of_the_map() {
        let names = |text: &[u8]| -> Vec<String> {
            let mut names: Vec<String> = whole(text, &Method::GET)
                .headers
                .keys()
                .map(|n| n.as_str().to_owned())
                .collect();
            names.sort();
            names
        };
        assert_eq!(
            names(b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nx-a: 1\r\nTransfer-Encoding: chunked\r\nTrailer: x-t\r\nUpgrade: h2c\r\n\r\n"),
            ["x-a"]
        );
        assert_eq!(
            names(b"HTTP/1.1 200 OK\r\nconnection: close, X-Secret\r\nx-secret: 1\r\nx-a: 1\r\ncontent-length: 0\r\nproxy-connection: x\r\n\r\n"),
            ["content-length", "x-a"]
        );
        let h = whole(
            b"HTTP/1.1 200 OK\r\nconnection: close, X-Secret\r\ncontent-length: 0\r\n\r\n",
            &Method::GET,
        );
        assert!(
            !h.keep_alive,
            "what the connection said is read before it is left out"
        );
    }

    #[test]
    fn interim_responses_are_skipped_and_a_partial_head_waits() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\nHTTP/1.1 201 Made It\r\nx-a: 1\r\ncontent-length: 2\r\n\r\nokHTTP/1.1"[..],
        );
        let mut reader = HeadReader::default();
        let Ok(Read::Head(h)) = reader.read(&mut buf, &Method::POST, HeaderMap::new()) else {
            panic!("a head");
        };
        assert_eq!(h.status, StatusCode::CREATED);
        assert_eq!(
            h.reason.as_deref(),
            Some(&b"Made It"[..]),
            "not the canonical phrase"
        );
        assert_eq!(h.headers.get("x-a").map(|v| v.as_bytes()), Some(&b"1"[..]));
        assert_eq!(h.headers.len(), 2);
        assert_eq!(&buf[..], b"okHTTP/1.1", "the body and what follows stay");
        buf.advance(2);
        assert!(matches!(
            reader.read(&mut buf, &Method::GET, HeaderMap::new()),
            Ok(Read::Partial(_))
        ));
        let canonical = whole(b"HTTP/1.1 404 Not Found\r\n\r\n", &Method::GET);
        assert_eq!(canonical.reason, None);
    }

    #[test]
    fn a_head_or_trailers_trickled_a_byte_at_a_time_are_read_when_their_end_comes() {
        // Every line ending httparse takes, so that a head's end falls across two reads in
        // every way (`\n` | `\r\n`, `\r` | `\n`, ...).
        for head in [
            &b"HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\nx-a: 1\ncontent-length: 0\n\n",
            b"HTTP/1.1 200 OK\r\n\r\n",
        ] {
            let (mut reader, mut buf, mut map) = (HeadReader::default(), BytesMut::new(), None);
            for (i, &b) in head.iter().enumerate() {
                buf.extend_from_slice(&[b]);
                match reader.read(&mut buf, &Method::GET, map.take().unwrap_or_default()) {
                    Ok(Read::Partial(unused)) => {
                        assert!(i + 1 < head.len(), "{:?}", String::from_utf8_lossy(head));
                        map = Some(unused);
                    }
                    Ok(Read::Head(h)) => {
                        assert_eq!(i + 1, head.len(), "{:?}", String::from_utf8_lossy(head));
                        assert_eq!(h.status, StatusCode::OK);
                        assert!(buf.is_empty());
                    }
                    Err(e) => panic!("{e} at {i} of {:?}", String::from_utf8_lossy(head)),
                }
            }
        }
        let wire = b"3\r\nabc\r\n0\r\nx-cost: 7\r\nx-b: 1\r\n\r\n";
        let every: Vec<usize> = (1..wire.len()).collect();
        let (data, trailers, done, left) = decode(wire, &every).expect("decodes");
        assert_eq!(data, b"abc");
        assert_eq!(
            trailers
                .expect("trailers")
                .get("x-cost")
                .map(|v| v.as_bytes()),
            Some(&b"7"[..])
        );
        assert!(done && left.is_empty());
    }

    #[test]
    fn empty_lines_before_a_head_take_no_room_up_to_their_bound_then_are_an_error() {
        let head = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        for (lines, whole) in [
            (MAX_EMPTY_LINES / 2, true),
            (MAX_EMPTY_LINES / 2 + 1, false),
        ] {
            // Before the interim answer and again before the final one.
            let mut wire = b"\r\n".repeat(lines);
            wire.extend_from_slice(&head[..25]);
            wire.extend_from_slice(&b"\r\n".repeat(lines));
            wire.extend_from_slice(&head[25..]);
            let (mut reader, mut buf, mut map) = (HeadReader::default(), BytesMut::new(), None);
            let mut most = 0;
            let mut ended = None;
            for (i, &b) in wire.iter().enumerate() {
                buf.extend_from_slice(&[b]);
                match reader.read(&mut buf, &Method::GET, map.take().unwrap_or_default()) {
                    Ok(Read::Partial(unused)) => map = Some(unused),
                    Ok(Read::Head(h)) => {
                        assert_eq!(h.status, StatusCode::OK);
                        ended = Some(Ok(i));
                        break;
                    }
                    Err(e) => {
                        ended = Some(Err(e));
                        break;
                    }
                }
                most = most.max(buf.len());
            }
            if whole {
                assert_eq!(ended.map(|e| e.ok()), Some(Some(wire.len() - 1)), "{lines}");
                assert!(most < 64, "the buffer held {most} bytes");
            } else {
                assert!(matches!(ended, Some(Err(_))), "{lines}: {ended:?}");
            }
        }
    }

    #[test]
    fn a_head_past_the_bound_is_an_error_not_a_wait() {
        let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
        while big.len() <= MAX_HEAD {
            big.extend_from_slice(
                b"x-filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
            );
        }
        assert!(head(&big, &Method::GET).is_err());
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..=MAX_FIELDS {
            many.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(head(&many, &Method::GET).is_err());
    }

    #[test]
    fn a_request_body_is_framed_as_hyper_frames_it() {
        let framed = |method: Method, fields: &[(&str, &str)], ended, exact| {
            let mut h = HeaderMap::new();
            for (n, v) in fields {
                h.append(
                    HeaderName::from_bytes(n.as_bytes()).expect("name"),
                    HeaderValue::from_str(v).expect("value"),
                );
            }
            let o = frame_request(&method, &mut h, ended, exact);
            let mut names: Vec<String> = h
                .iter()
                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("?")))
                .collect();
            names.sort();
            (o, names)
        };
        assert_eq!(
            framed(Method::GET, &[("host", "x")], true, Some(0)),
            (Outgoing::None, vec!["host: x".into()])
        );
        assert_eq!(
            framed(
                Method::POST,
                &[("transfer-encoding", "chunked")],
                true,
                None
            ),
            (Outgoing::None, vec![])
        );
        assert_eq!(
            framed(Method::POST, &[("content-length", "7")], false, Some(7)),
            (Outgoing::Length(7), vec!["content-length: 7".into()])
        );
        assert_eq!(
            framed(Method::POST, &[], false, Some(3)),
            (Outgoing::Length(3), vec!["content-length: 3".into()])
        );
        assert_eq!(
            framed(Method::POST, &[("content-length", "x")], false, None),
            (Outgoing::Chunked, vec!["transfer-encoding: chunked".into()])
        );
        assert_eq!(
            framed(
                Method::PUT,
                &[("content-length", "4"), ("transfer-encoding", "gzip")],
                false,
                Some(4)
            ),
            (Outgoing::Chunked, vec!["transfer-encoding: chunked".into()])
        );
        assert_eq!(
            framed(Method::GET, &[], false, None),
            (Outgoing::None, vec![])
        );
    }

    /// What a chunked body decoded to: its data, its trailers, whether it ended, and the
    /// bytes left after its end.
    type Decoded = (Vec<u8>, Option<HeaderMap>, bool, Vec<u8>);

    /// Decodes `wire` fed in the pieces `cuts` makes of it.
    fn decode(wire: &[u8], cuts: &[usize]) -> Result<Decoded, Malformed> {
        let (mut c, mut buf, mut data, mut trailers) =
            (Chunked::default(), BytesMut::new(), Vec::new(), None);
        let mut fed = 0;
        let mut points: Vec<usize> = cuts.iter().map(|&x| x.min(wire.len())).collect();
        points.sort_unstable();
        points.push(wire.len());
        for p in points {
            buf.extend_from_slice(&wire[fed..p.max(fed)]);
            fed = p.max(fed);
            loop {
                match c.step(&mut buf)? {
                    Step::Data(d) => data.extend_from_slice(&d),
                    Step::Trailers(t) => trailers = Some(t),
                    Step::End | Step::More => break,
                }
                if c.is_done() {
                    break;
                }
            }
        }
        Ok((data, trailers, c.is_done(), buf.to_vec()))
    }

    #[test]
    fn a_chunked_body_decodes_with_extensions_spaces_and_trailers() {
        let wire = b"5;name=value\r\nhello\r\n6 \r\n world\r\nA\r\n0123456789\r\n0\r\nx-cost: 42\r\nx-b: 2\r\n\r\nNEXT";
        let (data, trailers, done, left) = decode(wire, &[]).expect("decodes");
        assert_eq!(data, b"hello world0123456789");
        let t = trailers.expect("trailers");
        assert_eq!(t.get("x-cost").map(|v| v.as_bytes()), Some(&b"42"[..]));
        assert!(done);
        assert_eq!(left, b"NEXT");
        let (_, none, done, left) = decode(b"0\r\n\r\n", &[]).expect("decodes");
        assert!(none.is_none() && done && left.is_empty());
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\nhello\r\n",
            b"5\r\nhelloX\r\n",
            b"11111111111111111\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"0\r\nbad name: 1\r\n\r\n",
        ] {
            assert!(
                decode(bad, &[]).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut long = b"1;".to_vec();
        long.resize(MAX_EXTENSIONS + 8, b'e');
        assert!(decode(&long, &[]).is_err(), "extensions are bounded");
        let mut big_trailers = b"0\r\n".to_vec();
        while big_trailers.len() <= MAX_TRAILERS {
            big_trailers.extend_from_slice(b"x-t: 0123456789012345678901234567890123456789\r\n");
        }
        assert!(decode(&big_trailers, &[]).is_err(), "trailers are bounded");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any body, chunked any way and read in any pieces, decodes to itself; any bytes at
        /// all end in an error, a wait or an end, never a panic.
        #[test]
        fn chunked_bodies_decode_to_what_was_encoded(
            pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..8),
            cuts in proptest::collection::vec(0usize..400, 0..6),
            noise in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut wire = Vec::new();
            for p in &pieces {
                write_chunk(p, &mut wire);
            }
            wire.extend_from_slice(LAST_CHUNK);
            let (data, trailers, done, left) = decode(&wire, &cuts).expect("decodes");
            prop_assert_eq!(data, pieces.concat());
            prop_assert!(trailers.is_none() && done && left.is_empty());
            let _ = decode(&noise, &cuts);
            let mut buf = BytesMut::from(&noise[..]);
            let _ = HeadReader::default().read(&mut buf, &Method::GET, HeaderMap::new());
        }
    }
}
