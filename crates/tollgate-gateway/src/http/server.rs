//! The HTTP/1 servers: accept loops for the gateway and the admin endpoints, bounded
//! connections (in all and per client address), bounded request heads (header count, an exact
//! 64 KiB size, a header read timeout), and graceful shutdown: on a signal the listeners
//! close, in-flight requests finish for up to [`GRACE`], then the rest is dropped; a second
//! signal ends the wait at once.
//! Requests HTTP/1.1 forbids are refused before any policy sees them (see `refusal.rs`).

use crate::http::conn_limit::ConnLimits;
use crate::http::head_timeout::{
    for_hyper, until_drained, EmptyLines, HeadClock, HeadWatch, WaitAfter,
};
use crate::http::metrics::HttpMetrics;
use crate::http::plain::{self, Served};
use crate::http::refusal::{opening, parse_error_status, refusal, refuse_h2, Opening};
use crate::http::util::{BoxBody, ConnBody};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Either;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tollgate_tower::TrustedPeer;

/// How long in-flight requests may take to finish after a shutdown signal.
pub const GRACE: Duration = Duration::from_secs(30);
use crate::http::refusal::HEADER_READ_TIMEOUT;
pub use crate::http::refusal::{MAX_HEADERS, MAX_HEAD_BYTES};
use crate::http::service::{unify, GatewayService};

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
    S: GatewayService,
{
    // Keeps the connections' header read timeout and drains them at shutdown.
    let heads = HeadClock::gateway();
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
                let conn = connection(stream, peer, slot.peer.clone(), service.clone(), metrics.clone(), heads.watch());
                tokio::spawn(async move {
                    let _slot = slot;
                    conn.await;
                });
            }
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    heads.drain();
    tokio::select! {
        _ = heads.drained() => {}
        _ = tokio::time::sleep(GRACE) => tracing::warn!("grace period over; dropping remaining connections"),
        _ = force => tracing::warn!("second signal; dropping remaining connections"),
    }
    Ok(())
}

/// Serves one client connection: an HTTP/2 preface gets a 505, silence a close; otherwise
/// hyper serves it, under `watch`'s header read timeout and its listener's drain (see
/// `head_timeout.rs`), each request through [`refusal`] and then `service`. In decision mode
/// the connection's plain requests are answered first without hyper (`plain.rs`), which
/// serves the rest from the first request that is not.
fn connection<S>(
    stream: TcpStream,
    peer: SocketAddr,
    trusted: TrustedPeer,
    service: S,
    metrics: Arc<HttpMetrics>,
    watch: Arc<HeadWatch>,
) -> Pin<Box<dyn Future<Output = ()> + Send>>
where
    S: GatewayService,
{
    let conn_metrics = metrics.clone();
    // One extension per request: the trust decision, carrying the peer's address.
    let trusted = trusted.with_addr(peer);
    let small_answers = service.answers_itself();
    let mut plain_service = service.clone();
    let plain_peer = trusted.clone();
    let svc_watch = Arc::clone(&watch);
    let hyper_svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let metrics = metrics.clone();
        // A head was read: no wait for one until this answer's body is handed over whole.
        svc_watch.serving();
        let watch = Arc::clone(&svc_watch);
        // The service is called here, not in the future: hyper reads on before it polls
        // that future, and a request held until then keeps the connection's read buffer,
        // which then has to allocate another for every request.
        let answer = match refusal(&req) {
            Some(resp) => Either::Left(resp),
            None => Either::Right(service.clone().call_from(req, &trusted)),
        };
        async move {
            let resp = match answer {
                Either::Left(resp) => resp.map(ConnBody::Boxed),
                Either::Right(call) => call.await?.map(unify),
            };
            metrics.response(resp.status().as_u16());
            Ok::<_, Infallible>(resp.map(|body| WaitAfter::new(body, watch)))
        }
    });
    let mut stream = stream;
    Box::pin(async move {
        // A drain closes a connection still in its opening at once, as an idle one: the
        // opening's own wait (up to the header read timeout) would hold shutdown up.
        let opened = tokio::select! {
            biased;
            o = opening(&stream) => o,
            () = watch.drain_begun() => Opening::Silent,
        };
        match opened {
            Opening::Http1 => {}
            Opening::Http2 => {
                conn_metrics.response(505);
                refuse_h2(stream).await;
                return;
            }
            Opening::Silent => return,
        }
        // The wait for the first head starts now (the opening had its own).
        watch.waiting();
        let unread = if small_answers {
            let served = plain::serve(
                &mut stream,
                &mut plain_service,
                &plain_peer,
                &conn_metrics,
                &watch,
            );
            match served.await {
                Served::Closed => return,
                Served::Handover(unread) => unread,
            }
        } else {
            Bytes::new()
        };
        drop((plain_service, plain_peer));
        let io = for_hyper(stream, Arc::clone(&watch), unread);
        let conn = builder(Heads::Swept, small_answers).serve_connection(io, hyper_svc);
        let ended = until_drained(conn, watch, |c| c.graceful_shutdown()).await;
        if let Err(e) = ended {
            if let Some(code) = parse_error_status(&e) {
                conn_metrics.response(code);
            }
            tracing::debug!(error = %e, %peer, "connection ended with an error");
        }
    })
}

/// Who keeps a server's header read timeout.
#[derive(Clone, Copy)]
enum Heads {
    /// hyper, with a timer per request (the admin endpoints).
    Hyper,
    /// The connection's [`HeadWatch`] (the gateway: see `head_timeout.rs`).
    Swept,
}

/// The HTTP/1 connection settings. [`MAX_HEADERS`] is hyper's own default bound, left
/// unset on purpose: hyper parses into a fixed array of that size on the stack, and setting
/// the same bound explicitly makes it build a vector of that many entries for every request
/// (3 % of a decision-mode request's CPU, measured with perf). The test
/// `more_than_max_headers_is_431` in tests/hostile.rs holds hyper to it.
///
/// `small_answers`: the connection's answers are the gateway's own (a status line, a few
/// headers, a body of at most a few hundred bytes), so hyper copies each answer into one
/// buffer and writes it with `write` instead of queueing the head and the body for `writev`:
/// 270 fewer instructions a decision-mode request (callgrind). Proxied answers keep `writev`:
/// their bodies may be large, and are not copied.
fn builder(heads: Heads, small_answers: bool) -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(match heads {
            Heads::Hyper => Some(HEADER_READ_TIMEOUT),
            // hyper's default with a timer is 30 s: off, explicitly.
            Heads::Swept => None,
        })
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    if small_answers {
        b.writev(false);
    }
    b
}

/// Serves the admin endpoints (each request answered by `handle`) until `stop` changes.
/// `limits` bounds its connections (`server.admin_max_connections`, `..._per_ip`; no address
/// exempt), with the reserve that keeps `/healthz` reachable from a new address.
pub(crate) async fn serve_admin<H, F>(
    listener: TcpListener,
    handle: H,
    limits: Arc<ConnLimits>,
    mut stop: watch::Receiver<bool>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<BoxBody>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                // Past the bound: closed at once (dropping the stream), before any read.
                let Some(slot) = limits.admit(peer.ip()) else {
                    tracing::debug!("admin connection limit reached; closing");
                    continue;
                };
                let handle = handle.clone();
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let answer = handle(req);
                    async move { Ok::<_, Infallible>(answer.await) }
                });
                // Empty lines in a row bounded as on the gateway's port (see `EmptyLines`).
                let io = TokioIo::new(EmptyLines::unwatched(stream));
                let conn = graceful.watch(builder(Heads::Hyper, false).serve_connection(io, svc));
                tokio::spawn(async move {
                    let _slot = slot;
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
