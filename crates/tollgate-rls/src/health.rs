//! `grpc.health.v1.Health/Check` for Envoy's health checks of the rate limit cluster:
//! SERVING while the store answers. Every Envoy checks every few seconds, so an answer is
//! reused for a while instead of costing a store round trip each.

use crate::proto::grpc::health::v1::health_check_response::ServingStatus;
use crate::proto::grpc::health::v1::{HealthCheckRequest, HealthCheckResponse};
use std::sync::Arc;
use std::time::Duration;
use tollgate::clock::{Clock, SystemClock};
use tonic::Status;

/// How long a health answer is reused before the store is pinged again (health checks from
/// every Envoy would otherwise each cost a store round trip).
pub const READY_CACHE: Duration = Duration::from_secs(1);

/// The service name Envoy's gRPC health checks may ask for.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

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

    /// The answer to `Check`: the server's health (an empty service name) or the rate limit
    /// service's; any other name is `NOT_FOUND`.
    pub(crate) async fn check(
        &self,
        request: &HealthCheckRequest,
    ) -> Result<HealthCheckResponse, Status> {
        let service = request.service.as_str();
        if !service.is_empty() && service != SERVICE_NAME {
            return Err(Status::not_found(format!("unknown service {service:?}")));
        }
        let status = if self.ready().await {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        Ok(HealthCheckResponse {
            status: status.into(),
        })
    }
}
