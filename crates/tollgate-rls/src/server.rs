//! The listener: each accepted connection ([`crate::incoming`]) served by hyper's HTTP/2
//! connection, its streams by [`crate::calls`]; on shutdown, no new connection and every
//! open one drained.
//!
//! The HTTP/2 settings are those the listener had under tonic: at most [`MAX_STREAMS`]
//! concurrent streams per connection, a keep-alive ping every 30 s answered within 10 s, and
//! hyper's defaults for the rest (windows, frame and header sizes, and h2's bounds on reset
//! streams). One setting differs: tonic switched off h2's bound on the streams a client can
//! make the server reset with protocol errors (1024 per connection; past it the connection
//! is closed with ENHANCE_YOUR_CALM), which is the defence against "MadeYouReset"
//! (CVE-2025-8671); hyper's default keeps it on. And answers carry no `date` header (hyper
//! adds one by default; tonic's did): gRPC has no use for it, and HPACK-encoding it cost
//! every answer about 1,200 instructions (callgrind, one descriptor a call: 50,928 to 49,737).
//!
//! Shutdown is graceful as it was: the listening socket is closed at once, each connection
//! is sent GOAWAY and lets its calls in progress finish, and [`run`] returns when every
//! connection has closed.

use crate::calls::{self, Services};
use crate::incoming::{self, Admit, PrefaceDeadline};
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::Future;
use std::net::IpAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The most concurrent calls on one HTTP/2 connection (a client that needs more opens
/// another connection, as Envoy's pool does when a server's SETTINGS say so).
pub const MAX_STREAMS: u32 = 256;
/// How often an HTTP/2 connection is pinged.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `services` on `listener` until `shutdown` resolves, then drains the connections.
pub(crate) async fn run(
    listener: TcpListener,
    services: Services,
    admit: Option<Admit>,
    shutdown: impl Future<Output = ()>,
) {
    let services = Arc::new(services);
    let http2 = Arc::new(settings());
    // Each connection holds a receiver; the sender says "close" and sees the last one go.
    let (closing, open) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            () = &mut shutdown => break,
            conn = incoming::accept(&listener, admit.as_ref()) => conn,
        };
        tokio::spawn(connection(
            Arc::clone(&http2),
            io,
            Arc::clone(&services),
            peer,
            open.clone(),
        ));
    }
    drop(listener);
    let _ = closing.send(());
    drop(open);
    closing.closed().await;
}

fn settings() -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .auto_date_header(false)
        .max_concurrent_streams(MAX_STREAMS)
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT);
    builder
}

/// One connection, until it closes, or until `closing` says so and its calls have finished.
async fn connection(
    http2: Arc<http2::Builder<TokioExecutor>>,
    io: PrefaceDeadline,
    services: Arc<Services>,
    peer: IpAddr,
    mut closing: watch::Receiver<()>,
) {
    let service = hyper::service::service_fn(move |request| {
        calls::answer(Arc::clone(&services), Some(peer), request)
    });
    let mut conn = pin!(http2.serve_connection(TokioIo::new(io), service));
    let mut draining = false;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "rls connection ended");
                }
                return;
            }
            // A closed sender (the server dropped mid-way) is a shutdown too.
            _ = closing.changed(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
