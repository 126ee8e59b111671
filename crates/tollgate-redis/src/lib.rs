//! The Redis, Redis Cluster and Redis Sentinel store for tollgate.
//!
//! One request's plan (several rules, possibly of several clients) is decided by ONE script
//! call (one per slot on a Cluster, see [`RedisStore::check`]): the script validates its
//! arguments, reads every rule's key, decides each with the same integer arithmetic as
//! tollgate-core, and charges all of them or none. Why a script: the decision
//! branches on what it read, which MULTI/EXEC cannot do, and WATCH retry loops collapse under
//! the contention a rate limiter exists for (many gateways, one hot client).
//!
//! Keys are `<prefix>:{<client>}:<policy>`: the hash tag keeps one client's keys in one
//! Cluster slot, so a one-client script is valid on a cluster; a plan of several clients in
//! several slots is one call per slot with an exact give-back (docs/operations.md). Every write sets PX so a key
//! disappears when its state equals a fresh one; expiry never changes a decision.
//!
//! The scripts are generated per plan form (each rule's algorithm and mode; the quotas travel
//! as an argument) from `scripts/<algorithm>.lua` (one decision body per algorithm) by
//! `src/script.rs`, which documents the call and the one reply format;
//! `scripts/check.lua` is the generic fallback and `scripts/lease.lua` the lease driver. They
//! are loaded once (SCRIPT LOAD) and called with EVALSHA; a NOSCRIPT reply (a restarted
//! server, a FLUSH, a promoted replica) is answered by loading the script again and sending
//! the call once more, without failing the request. EVAL only as a last resort (a script lost
//! again between its load and its call, twice): Redis 7.4 and later evict the scripts EVAL
//! loaded (least recently used, past 500), not SCRIPT LOAD's.
//!
//! Coalesced calls (`RedisConfig::max_batch`, `lane.rs`): while a call is in flight on a
//! connection (a slot on a Cluster), the plans and lease calls that arrive queue and leave
//! together in the next call, one batch script (`batch_script.rs`) running each plan's own
//! logic in arrival order; a plan that finds the connection idle is sent at once with its own
//! script.
//!
//! Client library: redis-rs, with a `ConnectionManager` per standalone server (one
//! multiplexed connection that pipelines every concurrent call and reconnects by itself;
//! the coalesced calls of a standalone server go on a connection of the store's own, written
//! and read by the caller that leads the lane: `direct.rs`, `resp.rs`) and
//! `cluster-async` for Redis Cluster (slot map, refresh after a failover; built without retries,
//! a call is sent again only where its node did not run it: `resend.rs`); with Redis
//! Sentinel, one `ConnectionManager` to the master the sentinels name, looked up again after a
//! failover (see `sentinel.rs`). fred was
//! measured beside it on the same workload (EVALSHA of the GCRA script, 64 concurrent
//! callers, one client object each, one tokio worker): 43k-64k decisions/s for redis-rs
//! against 43k-56k for fred over three rounds on the shared 2-core machine, so the simpler
//! dependency won. Connect and response timeouts are set and reconnect retries disabled, so
//! a dead server fails calls at once instead of hanging them (the caller adds its own timeout
//! and circuit breaker).
#![deny(missing_docs)]

mod batch_script;
mod command;
mod config;
mod direct;
mod error;
mod eviction;
mod expiry;
mod keys;
mod lane;
mod lease;
mod reply;
mod resend;
mod resp;
mod script;
mod sentinel;
mod store;
mod watchdog;

#[doc(hidden)]
pub use batch_script::{
    batch_script_args, batch_script_args_each, batch_script_sha, batch_script_text,
    largest_batch_scripts, many_forms_batch_scripts, MANY_FORMS_SCRIPTS,
};
#[doc(hidden)]
pub use command::{push_bulk, push_header};
pub use config::{check_url, redact_url, RedisConfig, StoreClock, DEFAULT_MAX_BATCH, MAX_BATCH};
pub use error::{ErrorKind, RedisStoreError};
pub use lease::{Lease, LeaseRequest};
pub use script::{
    generic_script_sha, generic_script_text, plan_script_quotas, plan_script_sha, plan_script_text,
    RuleShape, IN_PLACE_LOG_LIMIT, MAX_INLINE_RULES,
};
pub use store::{CheckReply, GiveBackItem, PendingCheck, RedisStore, SettleItem};
