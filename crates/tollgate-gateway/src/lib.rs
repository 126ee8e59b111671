//! The `tollgate` binary's library half: configuration, the gateway server (reverse proxy or
//! decision mode, built on `tollgate-tower`), the admin server (with the status page) and the `check-config`
//! command. The binary (`main.rs`) only parses arguments and dispatches.
#![deny(missing_docs)]

pub mod admin;
mod admin_api;
pub mod assemble;
pub mod check_config;
pub mod client_body;
/// The configuration, from its own crate (re-exported: `tollgate_gateway::config`).
pub use tollgate_config as config;
mod conn_limit;
pub mod http_util;
pub mod live;
pub mod metrics;
pub mod proxy;
mod refusal;
pub mod runtime;
pub mod serve;
pub mod server;
pub mod status;
