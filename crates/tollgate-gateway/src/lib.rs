//! The `tollgate` binary's library half: the composition root. Each module has one job and
//! none imports another in a circle; `serve` wires them.
//!
//! - [`http`]: the HTTP/1 server (accept loop, connection bounds, refusals before a request
//!   is parsed, body deadlines, the answers and counters of the HTTP layer);
//! - [`proxy`]: the reverse proxy to the upstream, and the decision-mode target;
//! - [`assemble`]: validated config -> limiter, rate-limit layer, RLS service;
//! - [`live`]: config generations, reloads (SIGHUP, file watch, the admin API's request);
//! - [`admin`]: the admin port (metrics, health, the `/v1` API, the status page);
//! - [`serve`] and [`check_config`]: the commands; the binary (`main.rs`) parses arguments.
#![deny(missing_docs)]

pub mod admin;
pub mod assemble;
pub mod check_config;
/// The configuration, from its own crate (re-exported: `tollgate_gateway::config`).
pub use tollgate_config as config;
pub mod http;
pub mod live;
pub mod proxy;
pub mod runtime;
pub mod serve;
pub mod telemetry;
