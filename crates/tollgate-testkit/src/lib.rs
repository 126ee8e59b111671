//! Real Redis processes for tests: a standalone `redis-server`, a Redis Cluster or a master with
//! a replica and three sentinels, each on free
//! loopback ports, started by the test that needs it and torn down when it is dropped.
//!
//! Why real processes and not a mock: the Redis store's guarantees (atomic scripts, NOSCRIPT
//! after a restart, MOVED after a failover) are properties of the server, and only a server
//! can show them. Why no fixed port: tests run in parallel processes (nextest), so every server
//! asks the kernel for a free port and retries when it loses a race for it.
//!
//! A missing `redis-server` is a test failure with a clear message, never a silent skip:
//! `scripts/test` installs it.
#![deny(missing_docs)]

mod cluster;
pub mod edge;
pub mod net;
mod process;
pub mod program;
mod sentinel;
mod server;

pub use cluster::RedisCluster;
pub use edge::{clear_of_window_end, start_clear_of_the_hour};
pub use program::{require, require_path, Found, Program, SKIP_VAR};
pub use sentinel::{RedisSentinels, DOWN_AFTER as SENTINEL_DOWN_AFTER};
pub use server::RedisServer;

/// Runs `redis-cli` against `127.0.0.1:port` with `args` and returns its standard output.
///
/// Panics with a clear message when `redis-cli` is not installed.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    process::cli(port, args)
}

/// [`redis_cli`] bounded by `limit`: past it `redis-cli` is killed and the error names the
/// command and what it had written ([`redis_cli`] and every server's `cli` use 60 s, and panic).
pub fn redis_cli_within(
    port: u16,
    args: &[&str],
    limit: std::time::Duration,
) -> Result<String, String> {
    process::cli_within(port, args, limit)
}
