//! The span of one decision, for a tracing subscriber that exports spans (the gateway's OTLP
//! exporter). Front ends (the tower layer, the Envoy RLS service) open it around their limiter
//! call, so its duration is the decision's and not the upstream's; the limiter records its
//! store call on it. It carries configured names and counts, never an identity: the policies,
//! the outcome, the plan's size, the store call's latency and size; plus the request's W3C
//! `traceparent`, so the span joins the caller's trace.
//!
//! Level TRACE under its own target: a log filter at any usual level never formats it, and
//! without a subscriber asking for the target the span costs one disabled-callsite check.

use crate::{Action, LimitResult, Plan};
use std::time::Instant;
use tracing::field::Empty;
use tracing::Span;

/// The target of decision spans (what an exporter's filter selects).
pub const DECISION_TARGET: &str = "tollgate::decision";

/// The longest `traceparent` kept (version 00 is 55 characters; later versions may append).
const MAX_TRACEPARENT: usize = 256;

/// A span for one decision; `traceparent` (the request's header, read only when the span is
/// recorded) links it to the caller's trace.
pub fn decision_span<'a>(traceparent: impl FnOnce() -> Option<&'a str>) -> Span {
    let span = tracing::trace_span!(
        target: DECISION_TARGET,
        "tollgate.decision",
        traceparent = Empty,
        policy = Empty,
        outcome = Empty,
        outcomes = Empty,
        plan_size = Empty,
        store_latency_us = Empty,
        batch_size = Empty,
        store_checks = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(tp) = traceparent().filter(|v| v.len() <= MAX_TRACEPARENT) {
        span.record("traceparent", tp);
    }
    span
}

/// Records what was decided for `plan` on its decision span.
pub fn record_decision(span: &Span, plan: &Plan, result: &LimitResult) {
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
    span.record("plan_size", plan.len() as u64);
    span.record("outcome", outcome);
    if !policy.is_empty() {
        span.record("policy", policy.as_str());
    }
    span.record("outcomes", outcomes.join(",").as_str());
}

/// Puts one store call on the decision span being recorded, when there is one: its latency
/// (from `started`) and what it carried (the plans in the call, one as each plan is its own
/// call, and the plan's checks). `started` is [`store_call_started`]'s: `None` without a
/// span that records, and then this does nothing (the clock is read only for such a span).
pub(crate) fn record_store_call(started: Option<Instant>, checks: usize) {
    let Some(started) = started else {
        return;
    };
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    span.record(
        "store_latency_us",
        u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
    );
    span.record("batch_size", 1_u64);
    span.record("store_checks", checks as u64);
}

/// When a store call starts: the instant, if a span is being recorded (see
/// [`record_store_call`]). Without a subscriber that records it this is one atomic load.
pub(crate) fn store_call_started() -> Option<Instant> {
    // Decision spans are TRACE: below that global level none is recorded, and an atomic
    // load answers without asking the subscriber for the current span (about 75
    // instructions a Redis call under callgrind).
    if !tracing::level_enabled!(tracing::Level::TRACE) {
        return None;
    }
    (!Span::current().is_disabled()).then(Instant::now)
}
