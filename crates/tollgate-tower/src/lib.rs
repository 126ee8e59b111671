//! Rate limiting for any tower-based HTTP stack (hyper, axum, tonic) with a
//! [`tollgate::Limiter`].
//!
//! The layer decides before the inner service sees a request: policies are matched by path
//! prefix and method, the client is identified (API key header, user header, or client IP
//! through trusted proxies only) and hashed with a keyed hash, and every matched policy is
//! checked in one all-or-nothing limiter call. A limited request gets `429` with
//! `Retry-After` and a problem+json body; an allowed one goes on and its response carries
//! `RateLimit-Policy` and `RateLimit`. The service is always ready and never queues: load
//! shedding beats waiting for capacity that a limited client must not get. Every error
//! answer is a [`Problem`] (RFC 9457), so an application built on the layer can answer its
//! own errors in the same format.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::quota::{Algorithm, Limit, Quota};
//! use tollgate::{IdentityHasher, Limiter, LimiterConfig, PolicySpec};
//! use tollgate_tower::{RateLimitLayer, RoutedPolicy};
//! let limiter = Limiter::new(LimiterConfig::default());
//! let api = limiter.policy(PolicySpec::new(
//!     "api",
//!     Limit::new(Algorithm::TokenBucket, Quota::per_minute(100)?)?,
//! ))?;
//! let layer = RateLimitLayer::new(limiter, IdentityHasher::new(b"secret"))
//!     .policy(RoutedPolicy::new(api).path_prefix("/api"));
//! # let _ = layer; Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod forwarded;
pub mod identity;
pub mod jwt;
mod layer;
pub mod path;
pub mod problem;
pub mod response;
mod route;
mod service;
mod settle;
mod shared;
mod target;
pub mod template;
mod trust;

pub use forwarded::ForwardHeader;
pub use identity::{BadIdentitySource, IdentityConfig, IdentitySource};
pub use jwt::{InvalidToken, JwtVerifier};
pub use layer::{RateLimitLayer, Refused};
pub use path::{normalize_path, normalize_strict, AmbiguousPath};
pub use problem::{Problem, ProblemKind};
pub use route::{Costs, RoutedPolicy, TierSource};
pub use service::{
    Allowed, CallFrom, DecideFuture, Decided, Limited, RateLimit, RateLimitBody, ResponseFuture,
};
pub use settle::Settling;
pub use shared::{peer_addr, PeerAddr, PeerFn};
pub use target::{BadRequest, ForwardAuth};
pub use trust::{Trust, TrustedPeer};
