//! Helpers shared by the Redis-backed limiter tests.

use tollgate::Limiter;

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
