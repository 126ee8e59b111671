//! The gRPC services on the wire and the listener that serves them (HTTP/2 cleartext, the way
//! Envoy calls a rate limit cluster).
//!
//! Bad input never takes the listener down: a connection that sends garbage or stops
//! half-way through the HTTP/2 preface is that connection's problem only (and is closed after
//! [`crate::PREFACE_TIMEOUT`]), a message larger than [`MAX_MESSAGE_BYTES`] is refused with
//! `OUT_OF_RANGE`, and each call has a deadline.

use crate::budget::BudgetLayer;
pub use crate::budget::{MAX_CALLS, MAX_CALLS_PER_ADDRESS};
use crate::incoming::Admit;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::grpc::health::v1::health_check_response::ServingStatus;
use crate::proto::grpc::health::v1::health_server::{Health, HealthServer};
use crate::proto::grpc::health::v1::{HealthCheckRequest, HealthCheckResponse};
use crate::service::RlsService;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tollgate::clock::{Clock, SystemClock};
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

/// The largest request message accepted (Envoy's are a few hundred bytes).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// The most concurrent calls on one HTTP/2 connection (a client that needs more opens
/// another connection, as Envoy's pool does when a server's SETTINGS say so).
pub const MAX_STREAMS: u32 = 256;
/// How long one call may take at most (the store call has its own, shorter, timeout).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a health answer is reused before the store is pinged again (health checks from
/// every Envoy would otherwise each cost a store round trip).
pub const READY_CACHE: Duration = Duration::from_secs(1);

/// The service name Envoy's gRPC health checks may ask for.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The rate limit service a listener serves, replaceable while it serves (a reload of the
/// rules): each call is decided whole by the service current when it started. Cheap to clone;
/// clones share the current service.
#[derive(Clone)]
pub struct LiveRls {
    current: Arc<arc_swap::ArcSwap<RlsService>>,
}

impl LiveRls {
    /// Serves `service` until it is replaced.
    pub fn new(service: RlsService) -> Self {
        Self {
            current: Arc::new(arc_swap::ArcSwap::from_pointee(service)),
        }
    }

    /// Serves `service` from the next call on; calls in flight finish with the old one.
    pub fn replace(&self, mut service: RlsService) {
        service.keep_metrics_of(&self.current.load());
        self.current.store(Arc::new(service));
    }

    /// The service serving now.
    pub fn current(&self) -> Arc<RlsService> {
        self.current.load_full()
    }
}

impl From<RlsService> for LiveRls {
    fn from(service: RlsService) -> Self {
        Self::new(service)
    }
}

#[tonic::async_trait]
impl RateLimitService for LiveRls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let service = self.current.load_full();
        // Envoy forwards the request's trace context as gRPC metadata.
        let span = tollgate::trace::decision_span(|| {
            request
                .metadata()
                .get("traceparent")
                .and_then(|v| v.to_str().ok())
        });
        service
            .decide(request.get_ref())
            .instrument(span)
            .await
            .map(Response::new)
    }
}

/// `grpc.health.v1.Health`: SERVING while the store answers ([`tollgate::Limiter::ready`]).
/// An answer is reused for [`READY_CACHE`], unless a store error has been counted since
/// (then the store is pinged again at once); concurrent checks share one ping.
#[derive(Clone)]
pub struct HealthService {
    limiter: tollgate::Limiter,
    clock: Arc<dyn Clock>,
    cache: Arc<tokio::sync::Mutex<Option<Ready>>>,
}

/// One health answer: when, what, and the store errors counted then.
#[derive(Clone, Copy)]
struct Ready {
    /// The clock's reading then (microseconds since the epoch).
    at: u64,
    ready: bool,
    errors: u64,
}

impl HealthService {
    /// Health of `limiter`'s store, on the system clock.
    pub fn new(limiter: tollgate::Limiter) -> Self {
        Self::with_clock(limiter, Arc::new(SystemClock))
    }

    /// Health of `limiter`'s store, with answers aged on `clock`.
    pub fn with_clock(limiter: tollgate::Limiter, clock: Arc<dyn Clock>) -> Self {
        Self {
            limiter,
            clock,
            cache: Arc::new(tokio::sync::Mutex::new(None)),
        }
    }

    /// Whether the store is ready, from the cache when fresh.
    pub async fn ready(&self) -> bool {
        let mut cache = self.cache.lock().await;
        let errors = self.store_errors();
        let now = self.clock.now();
        if let Some(c) = *cache {
            let age = now.saturating_sub(c.at);
            if c.errors == errors && now >= c.at && u128::from(age) < READY_CACHE.as_micros() {
                return c.ready;
            }
        }
        let ready = self.limiter.ready().await;
        *cache = Some(Ready {
            at: self.clock.now(),
            ready,
            // After the ping, in case it counted an error itself.
            errors: self.store_errors(),
        });
        ready
    }

    fn store_errors(&self) -> u64 {
        self.limiter
            .metrics()
            .store_errors_by_kind()
            .map(|(_, n)| n)
            .fold(0, u64::saturating_add)
    }
}

type WatchStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = request.get_ref().service.as_str();
        if !service.is_empty() && service != SERVICE_NAME {
            return Err(Status::not_found(format!("unknown service {service:?}")));
        }
        let status = if self.ready().await {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        Ok(Response::new(HealthCheckResponse {
            status: status.into(),
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("use Check"))
    }
}

/// Serves the rate limit and health services on `listener` until `shutdown` resolves, then
/// lets in-flight calls finish.
pub async fn serve(
    listener: TcpListener,
    service: impl Into<LiveRls>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
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
) -> Result<(), tonic::transport::Error> {
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
) -> Result<(), tonic::transport::Error> {
    let service = service.into();
    let health = HealthService::new(service.current().limiter().clone());
    let rls = RateLimitServiceServer::new(service).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let incoming = crate::incoming::accepted(listener, bounds.admit);
    tonic::transport::Server::builder()
        .timeout(CALL_TIMEOUT)
        .max_concurrent_streams(MAX_STREAMS)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .layer(BudgetLayer::new(bounds.calls_per_address, bounds.calls))
        .add_service(rls)
        .add_service(HealthServer::new(health))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
