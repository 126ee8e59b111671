//! The behaviour every tollgate store must show, written once and run by each store crate
//! (memory now, Redis and Redis Cluster when they land), as limitador does for its backends.
//!
//! A store crate implements [`ConformanceStore`] for a wrapper of its store and expands
//! [`conformance_suite!`] in one of its test files:
//!
//! ```ignore
//! struct Mem(MemoryStore);
//! impl ConformanceStore for Mem {
//!     async fn check(&self, checks: &[Check<'_>], now: Micros) -> Verdict {
//!         self.0.check(checks, now)
//!     }
//! }
//! tollgate_conformance::conformance_suite!(Mem(MemoryStore::default()));
//! ```
//!
//! The expression is evaluated inside each (async) test, so it may `.await` a connection. The
//! test crate needs `tokio` (macros, rt-multi-thread) as a dev-dependency.
//!
//! Time is synthetic: tests pass `now` explicitly and never sleep. Tests whose point is time
//! (retry, expiry) only run on stores that use the caller's clock; the others use periods of
//! 30 days, so they hold on a store that reads its own clock too. Clients are random per run,
//! so a persistent store (Redis) can run the suite again without cleaning up.
#![deny(missing_docs)]

mod suite;

use std::future::Future;
use tollgate_core::{Check, Micros, Verdict};

pub use suite::*;

/// What the suite needs from a store.
pub trait ConformanceStore: Send + Sync + 'static {
    /// Decides a plan (`checks`, of one or several clients) all-or-nothing at `now`. Store
    /// errors should panic: in a conformance test they are failures.
    fn check(&self, checks: &[Check<'_>], now: Micros) -> impl Future<Output = Verdict> + Send;

    /// Whether the store decides at the `now` it is given (false for a store that reads its
    /// own clock, such as Redis `TIME`): time-travelling tests are skipped when false.
    fn uses_local_clock(&self) -> bool {
        true
    }
}

/// Expands to one `#[tokio::test]` (multi-thread runtime) per suite function, each building a
/// fresh store with the given expression (which may `.await`).
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@each $make;
            concurrent_requests_on_one_key_admit_exactly_the_limit,
            concurrent_requests_with_a_cost_admit_whole_requests_only,
            several_rules_are_decided_all_or_nothing,
            concurrent_multi_rule_requests_charge_all_or_nothing,
            retry_after_is_the_exact_earliest_time,
            expiry_never_changes_a_decision,
            multi_rule_traces_match_tollgate_core,
            a_denial_under_one_identity_charges_no_other_identity,
            shadow_rules_never_deny_and_charge_only_what_they_allow,
            distinct_clients_and_rules_are_independent,
            zero_cost_is_a_pure_query,
            denied_requests_consume_nothing,
            cost_above_capacity_is_denied_without_retry
        );
    };
    (@each $make:expr; $($name:ident),+) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let store = $make;
                $crate::$name(store).await;
            }
        )+
    };
}
