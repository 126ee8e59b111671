//! The `tollgate` binary's library half: configuration, the gateway server (reverse proxy or
//! decision mode, built on `tollgate-tower`), the admin server (with the status page) and the `check-config`
//! command. The binary (`main.rs`) only parses arguments and dispatches.
#![deny(missing_docs)]

pub mod admin;
mod admin_api;
pub mod check_config;
pub mod client_body;
pub mod config;
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
pub mod telemetry;
