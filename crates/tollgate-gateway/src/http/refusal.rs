//! What a client may not send, answered before any policy or upstream sees it: a request
//! HTTP/1.1 forbids or that a proxy would pass on wrongly (a missing or doubled `Host`, a
//! target that is not a path, `CONNECT` and `OPTIONS *`, a head over the exact 64 KiB), and an
//! HTTP/2 preface on this HTTP/1 port (a 505 rather than a bare close). Each is a problem
//! (see `tollgate_tower::problem`), like every other error answer. The answers hyper writes
//! itself for heads it cannot parse (400, 414, 431) are counted like ours; they have no body,
//! since hyper offers no hook to write one.

use crate::http::util::{problem_response, BoxBody};
use http::{HeaderValue, Method, Request, Response, Version};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_tower::{Problem, ProblemKind};

/// Most headers a request may have.
pub const MAX_HEADERS: usize = 100;
/// Most bytes of a request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long a client may take to send a request head.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The answer to a request refused before the rate limiter, if it is one.
pub(crate) fn refusal<B>(req: &Request<B>) -> Option<Response<BoxBody>> {
    let hosts = req.headers().get_all(http::header::HOST).iter().count();
    let (kind, detail) = refused(req, hosts, || head_len(req))?;
    let mut resp = problem_response(Problem::new(kind).detail(detail));
    let h = resp.headers_mut();
    h.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    if kind == ProblemKind::MethodNotAllowed {
        h.insert(
            http::header::ALLOW,
            HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
        );
    }
    Some(resp)
}

/// How many bytes more than as read a head may take as [`head_len`] writes it: per field a
/// space after the colon and a CR before the LF (a read field may have neither), and for the
/// request line a CR, the final CR and a `/` given to an absolute target with no path;
/// [`MAX_HEADERS`] fields at most. Rounded up.
pub(crate) const HEAD_SLACK: usize = 1024;

/// Whether [`refusal`] refuses `req`, whose head was read whole (`read` bytes) and has
/// `hosts` `Host` fields, as the plain-request loop counted them: it does not count them
/// again, nor measure the head as written when what was read is under the bound by more
/// than [`HEAD_SLACK`].
pub(crate) fn refuses_read<B>(req: &Request<B>, hosts: usize, read: usize) -> bool {
    let len = || {
        if read + HEAD_SLACK <= MAX_HEAD_BYTES {
            read
        } else {
            head_len(req)
        }
    };
    refused(req, hosts, len).is_some()
}

/// Why `req`, with `hosts` `Host` fields and a head of `len()` bytes as written, is refused.
fn refused<B>(
    req: &Request<B>,
    hosts: usize,
    len: impl FnOnce() -> usize,
) -> Option<(ProblemKind, &'static str)> {
    let (kind, detail) = if req.method() == Method::CONNECT
        || (req.method() == Method::OPTIONS && req.uri() == "*")
    {
        (
            ProblemKind::MethodNotAllowed,
            "CONNECT and OPTIONS * are not served",
        )
    } else if !req.uri().path().starts_with('/') {
        // Asterisk and authority forms belong to OPTIONS and CONNECT only.
        (
            ProblemKind::BadRequest,
            "the request target must be a path or an absolute URI",
        )
    } else if req.version() == Version::HTTP_11 && hosts != 1 {
        (
            ProblemKind::BadRequest,
            "an HTTP/1.1 request needs exactly one Host header",
        )
    } else if len() > MAX_HEAD_BYTES {
        (
            ProblemKind::HeadTooLarge,
            "the request head is larger than 64 KiB",
        )
    } else {
        return None;
    };
    Some((kind, detail))
}

/// The size of a request head as written with one space after each colon. hyper bounds its
/// read buffer by [`MAX_HEAD_BYTES`], but a head that arrives in one large read can pass
/// that bound; this makes the limit exact.
fn head_len<B>(req: &Request<B>) -> usize {
    let uri = req.uri();
    let target = uri.path_and_query().map_or(1, |p| p.as_str().len())
        + uri.scheme_str().map_or(0, |s| s.len() + 3)
        + uri.authority().map_or(0, |a| a.as_str().len());
    let line = req.method().as_str().len() + 1 + target + 1 + "HTTP/1.1\r\n".len();
    let fields: usize = req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + 2 + v.len() + 2)
        .sum();
    line + fields + 2
}

/// The status hyper wrote for a head it could not parse (`None` when it wrote nothing).
pub(crate) fn parse_error_status(e: &hyper::Error) -> Option<u16> {
    if !e.is_parse() || e.is_parse_status() || e.is_parse_version_h2() {
        return None;
    }
    if e.is_parse_too_large() {
        // hyper tells the two apart only in its message.
        return Some(if e.to_string().contains("URI") {
            414
        } else {
            431
        });
    }
    if e.to_string().contains("internal error") {
        return None;
    }
    Some(400)
}

/// How a client opened its connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Opening {
    /// Anything but the HTTP/2 preface: hyper reads it.
    Http1,
    /// HTTP/2's prior-knowledge preface (`PRI * HTTP/2.0`).
    Http2,
    /// Nothing within the header read timeout: the connection is closed.
    Silent,
}

/// How the client opened. Most connections decide on their first byte; a client trickling a
/// prefix of the preface is waited for up to the header read timeout, like a slow head.
pub(crate) async fn opening(stream: &TcpStream) -> Opening {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0";
    let deadline = tokio::time::Instant::now() + HEADER_READ_TIMEOUT;
    let mut buf = [0u8; PREFACE.len()];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) => return Opening::Http1,
            Err(_) => return Opening::Silent,
        };
        if n == 0 || buf[..n] != PREFACE[..n] {
            return Opening::Http1;
        }
        if n == PREFACE.len() {
            return Opening::Http2;
        }
        if tokio::time::Instant::now() >= deadline {
            return Opening::Silent;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Answers an HTTP/2 prior-knowledge client with a 505 in HTTP/1.1 (no HTTP/2 parser reads
/// the connection) and closes.
pub(crate) async fn refuse_h2(mut stream: TcpStream) {
    let answer = Problem::new(ProblemKind::HttpVersionNotSupported)
        .detail("HTTP/2 is not served on this port; use HTTP/1.1")
        .to_http1_close();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        stream.write_all(&answer).await?;
        stream.shutdown().await?;
        // Read what the client already sent so the close is not a reset that discards the
        // answer before the client reads it.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, target: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().method(method).uri(target);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("request")
    }

    #[test]
    fn head_len_counts_the_head_as_written() {
        let r = req("GET", "/a?b=1", &[("host", "x"), ("x-k", "vv")]);
        let written = "GET /a?b=1 HTTP/1.1\r\nhost: x\r\nx-k: vv\r\n\r\n";
        assert_eq!(head_len(&r), written.len());
    }

    #[test]
    fn refusals_are_problems_that_close_the_connection() {
        for (r, kind) in [
            (req("GET", "/", &[]), ProblemKind::BadRequest),
            (
                req("OPTIONS", "*", &[("host", "x")]),
                ProblemKind::MethodNotAllowed,
            ),
        ] {
            let resp = refusal(&r).expect("refused");
            assert_eq!(resp.status(), kind.status());
            let h = resp.headers();
            assert_eq!(h[http::header::CONTENT_TYPE], "application/problem+json");
            assert_eq!(h[http::header::CONNECTION], "close");
            assert_eq!(
                h.contains_key(http::header::ALLOW),
                kind == ProblemKind::MethodNotAllowed
            );
        }
    }

    #[test]
    fn forbidden_requests_are_refused_and_ordinary_ones_pass() {
        let status = |r: &Request<()>| refusal(r).map(|resp| resp.status().as_u16());
        assert_eq!(status(&req("GET", "/", &[("host", "x")])), None);
        assert_eq!(status(&req("GET", "/", &[])), Some(400));
        assert_eq!(
            status(&req("GET", "/", &[("host", "a"), ("host", "b")])),
            Some(400)
        );
        assert_eq!(status(&req("OPTIONS", "*", &[("host", "x")])), Some(405));
        assert_eq!(
            status(&req("CONNECT", "h:443", &[("host", "h:443")])),
            Some(405)
        );
        assert_eq!(status(&req("PRI", "*", &[("host", "x")])), Some(400));
        let big = "a".repeat(MAX_HEAD_BYTES);
        assert_eq!(
            status(&req("GET", "/", &[("host", "x"), ("x-big", &big)])),
            Some(431)
        );
    }
}
