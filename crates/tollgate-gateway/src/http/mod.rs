//! The gateway's HTTP/1 server and what bounds it: the accept loops of the gateway and admin
//! ports, connection limits per listener and per address, refusals written before a request
//! is parsed, request-body deadlines, and the HTTP counters. It knows nothing of policies,
//! configs or reloads: it serves whatever service it is handed.

pub mod client_body;
pub(crate) mod conn_limit;
pub(crate) mod head_end;
pub(crate) mod head_timeout;
pub mod metrics;
pub(crate) mod names;
pub(crate) mod plain;
pub(crate) mod refusal;
pub mod server;
pub(crate) mod service;
pub mod util;

pub use server::{MAX_HEADERS, MAX_HEAD_BYTES};
