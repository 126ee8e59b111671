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
//! - [`request::RlsRequest`]: a `RateLimitRequest` read in place, its strings borrowed from
//!   the message's bytes.
//! - [`serve`]: the gRPC listener (HTTP/2 cleartext): h2's HTTP/2 connection, a task per
//!   stream, and a hand-written unary gRPC layer (tonic's generated messages, not its server
//!   stack).
#![deny(missing_docs)]

mod budget;
mod calls;
mod codec;
pub mod config;
mod grpc;
mod health;
mod incoming;
mod live;
pub mod metrics;
pub mod proto;
pub mod request;
mod server;
mod service;
mod wire;
mod yaml;

pub use budget::{MAX_CALLS, MAX_CALLS_PER_ADDRESS};
pub use calls::{CALL_TIMEOUT, MAX_MESSAGE_BYTES};
pub use config::{RlsConfig, RlsConfigError, RlsConfigErrors};
pub use grpc::{serve, serve_bounded, serve_with, Bounds};
pub use health::{HealthService, READY_CACHE, SERVICE_NAME};
pub use incoming::{Admit, Admitted, Unvectored, ACCEPT_BACKOFF, PREFACE_TIMEOUT};
pub use live::LiveRls;
pub use request::{MAX_DESCRIPTORS, MAX_ENTRIES};
pub use server::{http2_settings, MAX_STREAMS};
pub use service::{RlsOptions, RlsService, UNLIMITED_REMAINING};
