//! A `sliding_window_log` policy keeps one record per admission instant in one Redis value (14
//! bytes a record, up to the limit's count). A check reads and writes a few records where they
//! lie (a log longer than tollgate-redis's `IN_PLACE_LOG_LIMIT`) and costs Redis about the same
//! at any length: 23 to 57 µs a request from 1,000 to 100,000 records, eight runs on a shared
//! machine (tollgate-redis's `log_cost` example, Redis 7.0.15). A settle is not so bounded: a
//! refund that removes a record rewrites the value (it cannot shrink in place), and a refund of
//! a request in the middle of the log rewrites the totals of the records on one side of it, a
//! loop per record. Measured at 100,000 records: 3.4 to 3.6 ms of Redis time a whole refund of
//! the newest record, 24 to 33 ms one in the middle (0.41 to 0.46 ms of the newest at 10,000).
//! A client whose charges are refunded, under a large limit, can so occupy a Redis core while
//! every other request's store call times out. Allowed (the core caps the limit at 100,000),
//! but `check-config` and `serve` warn above [`LOG_WARN_LIMIT`] on a Redis store: of a policy
//! (or tier) whose cost is settled after the response (`cost_from_response`), and of an RLS
//! descriptor (Envoy's negative hits give units back, emptying the newest records as a refund
//! does).

use crate::{PolicyConfig, RlsSettings, StoreBackend};
use tollgate::quota::Limit;
use tollgate_core::Algorithm;
use tollgate_rls::config::RuleLimit;

/// The largest `sliding_window_log` limit without a warning on a Redis store where its
/// charges may be settled: a full log of this many records cost Redis 0.12 to 0.16 ms a
/// whole refund of its newest record (`log_cost --marks 2000 --settle-newest`).
pub(crate) const LOG_WARN_LIMIT: u64 = 2_000;

/// A warning for each `sliding_window_log` policy or tier whose cost is settled, and each RLS
/// descriptor, above [`LOG_WARN_LIMIT`] on a Redis store.
pub(super) fn warnings(
    file: &str,
    policies: &[PolicyConfig],
    rls: Option<&RlsSettings>,
    backend: &StoreBackend,
) -> Vec<String> {
    if matches!(backend, StoreBackend::Memory { .. }) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, p) in policies.iter().enumerate() {
        let specs = std::iter::once((format!("policy[{i}]"), &p.spec)).chain(
            p.tiers
                .iter()
                .map(move |t| (format!("policy[{i}].tiers.{}", t.name), &t.spec)),
        );
        for (at, spec) in specs.filter(|(_, spec)| spec.settle) {
            if let Some(n) = long_log(&spec.limit) {
                out.push(format!(
                    "warning: {file}: {at}: sliding_window_log with a limit of {n} and its cost settled after the response (cost_from_response): {COST}"
                ));
            }
        }
    }
    for rule in rls.iter().flat_map(|r| r.config.rules()) {
        if let RuleLimit::Limited { limit, .. } = &rule.limit {
            if let Some(n) = long_log(limit) {
                out.push(format!(
                    "warning: {}: {}: sliding_window_log with a limit of {n}: Envoy's negative hits give units back as a refund does, and {COST}",
                    rule.source, rule.policy_name
                ));
            }
        }
    }
    out
}

/// What a long log's settles cost, and what decides in constant time instead.
const COST: &str = "a refund that removes a record, or one of a request in the middle of the log, rewrites up to the whole log in Redis (measured on Redis 7.0 at 100,000 records: 3.4 ms a refund of the newest record, 24 to 33 ms one in the middle), so one client whose charges are refunded can occupy Redis and time out everyone's calls; sliding_window_counter, gcra or token_bucket settle in constant time";

/// The limit of `limit`, if it is a sliding log above [`LOG_WARN_LIMIT`].
fn long_log(limit: &Limit) -> Option<u64> {
    let n = limit.quota().limit();
    (limit.algorithm() == Algorithm::SlidingWindowLog && n > LOG_WARN_LIMIT).then_some(n)
}
