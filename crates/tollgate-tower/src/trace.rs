//! The span of one decision, for a tracing subscriber that exports spans (the gateway's OTLP
//! exporter). Opened around the limiter call only, so its duration is the decision's and not
//! the upstream's. It carries configured names and counts, never an identity: the policies,
//! the outcome, the plan's size, and (recorded by the limiter) the store call's latency and
//! size; plus the request's W3C `traceparent`, so the span joins the caller's trace.
//!
//! Level TRACE under its own target: a log filter at any usual level never formats it, and
//! without a subscriber asking for the target the span costs one disabled-callsite check.

use http::HeaderMap;
use tollgate::{Action, LimitResult, Plan};
use tracing::field::Empty;
use tracing::Span;

/// The target of decision spans (what an exporter's filter selects).
pub const DECISION_TARGET: &str = "tollgate::decision";

/// The longest `traceparent` kept (version 00 is 55 characters; later versions may append).
const MAX_TRACEPARENT: usize = 256;

/// A span for deciding `plan`, with the request's `traceparent` when it has one.
pub(crate) fn decision_span(plan: &Plan, headers: &HeaderMap) -> Span {
    let span = tracing::trace_span!(
        target: DECISION_TARGET,
        "tollgate.decision",
        traceparent = Empty,
        policy = Empty,
        outcome = Empty,
        outcomes = Empty,
        plan_size = plan.len() as u64,
        store_latency_us = Empty,
        batch_size = Empty,
        store_checks = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(tp) = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= MAX_TRACEPARENT)
    {
        span.record("traceparent", tp);
    }
    span
}

/// Records what was decided on the decision span.
pub(crate) fn record_result(span: &Span, result: &LimitResult) {
    if span.is_disabled() {
        return;
    }
    let outcome = match result.action {
        Action::Allow => "allowed",
        Action::Limit { .. } => "limited",
        Action::Unavailable { .. } => "unavailable",
    };
    let violated: Vec<&str> = result.violated().collect();
    let policy = if violated.is_empty() {
        result
            .most_constrained()
            .or(result.results.first())
            .map(|r| r.policy.name().to_string())
            .unwrap_or_default()
    } else {
        violated.join(",")
    };
    let outcomes: Vec<String> = result
        .results
        .iter()
        .map(|r| format!("{}={}", r.policy.name(), r.outcome.as_str()))
        .collect();
    span.record("outcome", outcome);
    span.record("policy", policy.as_str());
    span.record("outcomes", outcomes.join(",").as_str());
}
