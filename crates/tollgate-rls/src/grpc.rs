//! The gRPC listener of the rate limit and health services (HTTP/2 cleartext, the way Envoy
//! calls a rate limit cluster), and what it bounds.
//!
//! Bad input never takes the listener down: a connection that sends garbage or stops
//! half-way through the HTTP/2 preface is that connection's problem only (and is closed after
//! [`crate::PREFACE_TIMEOUT`]), a message larger than [`crate::MAX_MESSAGE_BYTES`] is
//! refused with `OUT_OF_RANGE`, each call has a deadline, and the calls in progress are
//! bounded per address and in all.

use crate::budget::{self, MAX_CALLS, MAX_CALLS_PER_ADDRESS};
use crate::calls::Services;
use crate::health::HealthService;
use crate::incoming::Admit;
use crate::live::LiveRls;
use std::future::Future;
use tokio::net::TcpListener;

/// Serves the rate limit and health services on `listener` until `shutdown` resolves, then
/// lets in-flight calls finish. Returns once every connection has closed; no error comes
/// back today (a failed accept is retried, a failed connection is that connection's), the
/// `Result` is kept for callers that report one.
pub async fn serve(
    listener: TcpListener,
    service: impl Into<LiveRls>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    serve_bounded(listener, service, None, shutdown).await
}

/// [`serve`], each connection first admitted by `admit` (the caller's connection bounds, in
/// all and per address; `None`: unbounded), and calls in progress bounded per address and in
/// all ([`MAX_CALLS_PER_ADDRESS`], [`MAX_CALLS`]).
pub async fn serve_bounded(
    listener: TcpListener,
    service: impl Into<LiveRls>,
    admit: Option<Admit>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let bounds = Bounds {
        admit,
        ..Bounds::default()
    };
    serve_with(listener, service, bounds, shutdown).await
}

/// What a listener bounds: connections (through the caller's [`Admit`]) and calls in progress.
#[derive(Clone)]
pub struct Bounds {
    /// Admits or refuses each new connection by its address (`None`: every one admitted).
    pub admit: Option<Admit>,
    /// The most calls in progress from one address, over all its connections; a call holds
    /// its place until its answer has left or its stream is gone.
    pub calls_per_address: usize,
    /// The most calls in progress on the listener.
    pub calls: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            admit: None,
            calls_per_address: MAX_CALLS_PER_ADDRESS,
            calls: MAX_CALLS,
        }
    }
}

/// [`serve`] within `bounds`: a call past them is answered `RESOURCE_EXHAUSTED` at once.
pub async fn serve_with(
    listener: TcpListener,
    service: impl Into<LiveRls>,
    bounds: Bounds,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let rls = service.into();
    let health = HealthService::new(rls.current().limiter().clone());
    let services = Services {
        rls,
        health,
        budget: budget::places(bounds.calls_per_address, bounds.calls),
    };
    crate::server::run(listener, services, bounds.admit, shutdown).await;
    Ok(())
}
