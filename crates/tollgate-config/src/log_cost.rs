//! A `sliding_window_log` policy keeps one record per admission instant in one Redis value, which
//! each of its requests reads and writes whole: its cost on Redis grows with the log. Measured on
//! Redis 7.0.15 (tollgate-redis's `log_cost` example: one client, its log filled by its own
//! admissions, INFO commandstats): 66 µs of Redis time a request at 1,000 records, 0.71 ms at
//! 10,000, 3.6 ms at 50,000 and 7.3 ms at 100,000, where a token bucket's plan costs Redis about 6
//! µs (docs/benchmarks.md, "Redis's floor per plan"). A client that sends at its limit keeps its
//! log full, so under a large limit one client can occupy a Redis core and every other request's
//! store call times out. Allowed (the core caps the limit at 100,000), but `check-config` and
//! `serve` warn above [`LOG_WARN_LIMIT`] on a Redis store.

use crate::{PolicyConfig, RlsSettings, StoreBackend};
use tollgate::quota::Limit;
use tollgate_core::Algorithm;
use tollgate_rls::config::RuleLimit;

/// The largest `sliding_window_log` limit without a warning on a Redis store: a full log of
/// this many records costs Redis about 140 µs a request, several times another algorithm.
pub(crate) const LOG_WARN_LIMIT: u64 = 2_000;

/// A warning for each `sliding_window_log` policy (or tier, or RLS descriptor) above
/// [`LOG_WARN_LIMIT`] on a Redis store.
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
        for (at, spec) in specs {
            if let Some(w) = warning(&spec.limit) {
                out.push(format!("warning: {file}: {at}: {w}"));
            }
        }
    }
    for rule in rls.iter().flat_map(|r| r.config.rules()) {
        if let RuleLimit::Limited { limit, .. } = &rule.limit {
            if let Some(w) = warning(limit) {
                out.push(format!(
                    "warning: {}: {}: {w}",
                    rule.source, rule.policy_name
                ));
            }
        }
    }
    out
}

/// What is wrong with `limit`, if it is a sliding log above [`LOG_WARN_LIMIT`].
fn warning(limit: &Limit) -> Option<String> {
    let n = limit.quota().limit();
    (limit.algorithm() == Algorithm::SlidingWindowLog && n > LOG_WARN_LIMIT).then(|| {
        format!(
            "sliding_window_log with a limit of {n}: Redis keeps up to one record per admission in one value that each request reads and writes whole (measured on Redis 7.0: 0.71 ms of Redis time a request at 10,000 records, 7.3 ms at 100,000), so one client sending at its limit can occupy Redis and time out everyone's calls; sliding_window_counter, gcra or token_bucket decide in constant time"
        )
    })
}
