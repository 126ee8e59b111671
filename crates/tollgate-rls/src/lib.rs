//! Envoy's global rate limit service over a tollgate [`tollgate::Limiter`]: a drop-in for
//! envoyproxy/ratelimit that reads its YAML descriptor files and answers its gRPC protocol
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, plus
//! `grpc.health.v1.Health/Check`), with what it cannot do: other algorithms, windows of N
//! units, denied requests that charge nothing (one request's descriptors are one plan,
//! decided all-or-nothing in one store call), failure policies and local fallback.
//!
//! - [`config`]: the YAML loader ([`config::load_dir_or_file`]) and the matching rules.
//! - [`RlsService`]: a request's descriptors -> one plan -> one [`tollgate::Limiter::check`]
//!   (descriptors with `is_negative_hits`: one [`tollgate::Limiter::give_back`] before it).
//! - [`serve`]: the gRPC listener (tonic, HTTP/2 cleartext).
#![deny(missing_docs)]

mod budget;
mod codec;
pub mod config;
mod grpc;
mod incoming;
pub mod metrics;
pub mod proto;
mod service;
mod yaml;

pub use config::{RlsConfig, RlsConfigError, RlsConfigErrors};
pub use grpc::{
    serve, serve_bounded, serve_with, Bounds, HealthService, LiveRls, CALL_TIMEOUT, MAX_CALLS,
    MAX_CALLS_PER_ADDRESS, MAX_MESSAGE_BYTES, MAX_STREAMS, READY_CACHE, SERVICE_NAME,
};
pub use incoming::{Admit, Admitted, ACCEPT_BACKOFF, PREFACE_TIMEOUT};
pub use service::{RlsOptions, RlsService, MAX_DESCRIPTORS, MAX_ENTRIES, UNLIMITED_REMAINING};
