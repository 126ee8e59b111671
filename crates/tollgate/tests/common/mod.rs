//! Helpers shared by the limiter tests.
// Each test binary that includes this module uses some of its helpers, not all.
#![allow(dead_code)]

use tollgate::{LimitResult, Limiter, Outcome};

/// Checks that a plan of one policy (`one`, its verdict's decision inline) and the same policy
/// beside a shadow policy that never limits (`two`, a verdict of two decisions) were answered
/// alike: the action (its retry time with it), and the first policy's outcome, remaining count
/// and retry time, from a decision the store made. Returns whether that policy was over its
/// limit.
pub fn answered_alike(one: &LimitResult, two: &LimitResult, what: &str) -> bool {
    assert_eq!(one.action, two.action, "{what}");
    let first = |r: &LimitResult| {
        let p = &r.results[0];
        (p.outcome, p.decision.map(|d| (d.remaining, d.retry_after)))
    };
    assert_eq!(first(one), first(two), "{what}");
    assert!(first(one).1.is_some(), "{what}: the store decided");
    matches!(first(one).0, Outcome::Limited | Outcome::ShadowLimited)
}

/// The limiter's metrics in the Prometheus text format.
pub fn metrics_text(l: &Limiter) -> String {
    let mut s = String::new();
    l.render_metrics(&mut s);
    s
}

/// `tollgate_store_errors_total` for one error kind; panics (with the metrics) when absent.
pub fn store_errors(l: &Limiter, kind: &str) -> u64 {
    let s = metrics_text(l);
    let prefix = format!("tollgate_store_errors_total{{kind=\"{kind}\"}} ");
    s.lines()
        .find_map(|x| x.strip_prefix(&prefix))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{s}"))
}
