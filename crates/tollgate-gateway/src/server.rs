//! The HTTP/1 servers: accept loops for the gateway and the admin endpoints, bounded
//! connections (in all and per client address), bounded request heads (header count, an exact
//! 64 KiB size, a header read timeout), and graceful shutdown: on a signal the listeners
//! close, in-flight requests finish for up to [`GRACE`], then the rest is dropped; a second
//! signal ends the wait at once.
//!
//! What a client can send that HTTP/1.1 forbids or that a proxy would pass on wrongly is
//! answered here before any policy or upstream sees it: a missing or doubled `Host`, `CONNECT`
//! and `OPTIONS *` (405), an HTTP/2 preface on this HTTP/1 port (505). The answers hyper
//! writes itself for heads it cannot parse (400, 414, 431) are counted like ours.

use crate::admin::Admin;
use crate::conn_limit::ConnLimits;
use crate::http_util::{status_response, BoxBody};
use crate::metrics::HttpMetrics;
use http::{HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Either};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tollgate_tower::PeerAddr;
use tower_service::Service;

/// How long in-flight requests may take to finish after a shutdown signal.
pub const GRACE: Duration = Duration::from_secs(30);
/// Most headers a request may have.
pub const MAX_HEADERS: usize = 100;
/// Most bytes of a request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long a client may take to send a request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the gateway on `listener` until `stop` changes, then drains for up to [`GRACE`]
/// (less if `force` fires).
pub(crate) async fn serve_gateway<S>(
    listener: TcpListener,
    service: S,
    metrics: Arc<HttpMetrics>,
    limits: Arc<ConnLimits>,
    mut stop: watch::Receiver<bool>,
    force: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()>
where
    S: Service<
            Request<Incoming>,
            Response = Response<tollgate_tower::RateLimitBody<BoxBody>>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                // Over a bound: closed at once (dropping the stream), before any read.
                let Some(slot) = limits.admit(peer.ip()) else {
                    tracing::debug!(%peer, "connection limit reached; closing");
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let svc = service.clone();
                let metrics = metrics.clone();
                let conn_metrics = metrics.clone();
                let hyper_svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(PeerAddr(peer));
                    let mut svc = svc.clone();
                    let metrics = metrics.clone();
                    async move {
                        let resp = match refusal(&req) {
                            Some(resp) => resp,
                            None => svc.call(req).await?.map(unify),
                        };
                        metrics.response(resp.status().as_u16());
                        Ok::<_, Infallible>(resp)
                    }
                });
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let _slot = slot;
                    if starts_with_h2_preface(&stream).await {
                        refuse_h2(stream).await;
                        conn_metrics.response(505);
                        return;
                    }
                    let conn = watcher.watch(builder().serve_connection(TokioIo::new(stream), hyper_svc));
                    if let Err(e) = conn.await {
                        if let Some(code) = parse_error_status(&e) {
                            conn_metrics.response(code);
                        }
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                });
            }
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(GRACE) => tracing::warn!("grace period over; dropping remaining connections"),
        _ = force => tracing::warn!("second signal; dropping remaining connections"),
    }
    Ok(())
}

/// The answer to a request refused before the rate limiter, if it is one.
fn refusal(req: &Request<Incoming>) -> Option<Response<BoxBody>> {
    let (status, text) = if req.method() == Method::CONNECT
        || (req.method() == Method::OPTIONS && req.uri() == "*")
    {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT and OPTIONS * are not served\n",
        )
    } else if !req.uri().path().starts_with('/') {
        // Asterisk and authority forms belong to OPTIONS and CONNECT only.
        (
            StatusCode::BAD_REQUEST,
            "the request target must be a path or an absolute URI\n",
        )
    } else if req.version() == Version::HTTP_11
        && req.headers().get_all(http::header::HOST).iter().count() != 1
    {
        (
            StatusCode::BAD_REQUEST,
            "an HTTP/1.1 request needs exactly one Host header\n",
        )
    } else if head_len(req) > MAX_HEAD_BYTES {
        (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "the request head is larger than 64 KiB\n",
        )
    } else {
        return None;
    };
    let mut resp = status_response(status, text);
    let h = resp.headers_mut();
    h.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        h.insert(
            http::header::ALLOW,
            HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
        );
    }
    Some(resp)
}

/// The size of a request head as written with one space after each colon. hyper bounds its
/// read buffer by [`MAX_HEAD_BYTES`], but a head that arrives in one large read can pass
/// that bound; this makes the limit exact.
fn head_len(req: &Request<Incoming>) -> usize {
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
fn parse_error_status(e: &hyper::Error) -> Option<u16> {
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

/// Whether the client opened with HTTP/2's prior-knowledge preface (`PRI * HTTP/2.0`).
/// Most connections decide on their first byte; a client trickling a prefix of the preface
/// is waited for up to the header read timeout.
async fn starts_with_h2_preface(stream: &TcpStream) -> bool {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0";
    let deadline = tokio::time::Instant::now() + HEADER_READ_TIMEOUT;
    let mut buf = [0u8; PREFACE.len()];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            _ => return false,
        };
        if n == 0 || buf[..n] != PREFACE[..n] {
            return false;
        }
        if n == PREFACE.len() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Answers an HTTP/2 prior-knowledge client with a plain 505 and closes.
async fn refuse_h2(mut stream: TcpStream) {
    const BODY: &str = "HTTP/2 is not served on this port; use HTTP/1.1\n";
    let head = format!(
        "HTTP/1.1 505 HTTP Version Not Supported\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        stream.write_all(head.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client already sent so the close is not a reset that discards the
        // answer before the client reads it.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// One body type for the connection: the layer's own bodies are boxed like upstream ones.
fn unify(body: tollgate_tower::RateLimitBody<BoxBody>) -> BoxBody {
    match body {
        Either::Left(b) => b,
        Either::Right(full) => full.map_err(|never| match never {}).boxed(),
    }
}

fn builder() -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_headers(MAX_HEADERS)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    b
}

/// Serves the admin endpoints until `stop` changes.
pub(crate) async fn serve_admin(
    listener: TcpListener,
    admin: Admin,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let admin = admin.clone();
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let admin = admin.clone();
                    async move { Ok::<_, Infallible>(admin.handle(req).await) }
                });
                let conn = graceful.watch(builder().serve_connection(TokioIo::new(stream), svc));
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
}

/// SIGTERM and SIGINT, listened to for the whole run: the first asks for a graceful
/// shutdown, a second one (during the grace period) for an immediate exit. One listener kept
/// from the start means a second signal arriving early is not lost.
pub(crate) struct ShutdownSignals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    /// Starts listening.
    pub(crate) fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self {
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Resolves on the next SIGTERM or SIGINT.
    pub(crate) async fn next(&mut self) {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                _ = recv(&mut self.term) => {}
                _ = recv(&mut self.int) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
