//! The HTTP/1 servers: accept loops for the gateway and the admin endpoints, bounded request
//! heads (header count and size, a header read timeout), and graceful shutdown: on a signal
//! the listeners close, in-flight requests finish for up to [`GRACE`], then the rest is
//! dropped.

use crate::admin::Admin;
use crate::http_util::BoxBody;
use crate::metrics::HttpMetrics;
use http::{Request, Response};
use http_body_util::{BodyExt, Either};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_tower::PeerAddr;
use tower_service::Service;

/// How long in-flight requests may take to finish after a shutdown signal.
pub const GRACE: Duration = Duration::from_secs(30);
/// Most headers a request may have.
pub const MAX_HEADERS: usize = 100;
/// Most bytes of a request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Serves the gateway on `listener` until `stop` changes, then drains for up to [`GRACE`].
pub(crate) async fn serve_gateway<S>(
    listener: TcpListener,
    service: S,
    metrics: Arc<HttpMetrics>,
    mut stop: watch::Receiver<bool>,
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
                let _ = stream.set_nodelay(true);
                let svc = service.clone();
                let metrics = metrics.clone();
                let hyper_svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(PeerAddr(peer));
                    let mut svc = svc.clone();
                    let metrics = metrics.clone();
                    async move {
                        let resp = svc.call(req).await?;
                        metrics.response(resp.status().as_u16());
                        Ok::<_, Infallible>(resp.map(unify))
                    }
                });
                let conn = builder().serve_connection(TokioIo::new(stream), hyper_svc);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
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
    }
    Ok(())
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
        .header_read_timeout(Duration::from_secs(10))
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

/// Resolves on SIGTERM or SIGINT.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
