//! The values of `RateLimit-Policy` and `RateLimit` (IETF httpapi draft syntax) for a
//! [`LimitResult`], written once for every front end that renders them: the HTTP layer's
//! response headers and the Envoy RLS `response_headers_to_add`.
//!
//! Shadow policies are never advertised. `r` is what remains after this request; `t` and `w`
//! are whole seconds (rounded up; a window is at least 1 s).

use crate::LimitResult;
use std::fmt::Write;
use tollgate_core::micros_to_secs_ceil;

/// Most policies `RateLimit-Policy` lists: the most constrained one first, then others in
/// configuration order. A request matched by thousands of policies must not get a header of
/// hundreds of kilobytes (which many clients and proxies refuse).
pub const MAX_ADVERTISED_POLICIES: usize = 16;

/// `"name";q=LIMIT;w=WINDOW_SECONDS` for the enforced policies of `result` (the most
/// constrained first, at most [`MAX_ADVERTISED_POLICIES`]), comma-separated; `None` when
/// every policy is a shadow one.
pub fn ratelimit_policy(result: &LimitResult) -> Option<String> {
    let mut out = String::new();
    let first = result.most_constrained();
    let others = result
        .results
        .iter()
        .filter(|r| !r.policy.is_shadow() && !first.is_some_and(|f| std::ptr::eq(*r, f)));
    for r in first
        .into_iter()
        .chain(others)
        .take(MAX_ADVERTISED_POLICIES)
    {
        if !out.is_empty() {
            out.push_str(", ");
        }
        let q = r.policy.limit().quota();
        let w = micros_to_secs_ceil(q.period_micros(), 1);
        let _ = write!(out, "\"{}\";q={};w={}", r.policy.name(), q.limit(), w);
    }
    (!out.is_empty()).then_some(out)
}

/// `"name";r=REMAINING;t=RESET_SECONDS` for the most constrained enforced policy with a
/// decision; `None` when there is none (shadow only, or the store failed open).
pub fn ratelimit(result: &LimitResult) -> Option<String> {
    let r = result.most_constrained()?;
    let d = r.decision?;
    let t = micros_to_secs_ceil(d.reset_after, 0);
    Some(format!("\"{}\";r={};t={}", r.policy.name(), d.remaining, t))
}
