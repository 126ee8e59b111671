//! The tracing layer that turns decision spans into OTLP spans: it keeps each open decision
//! span's fields, and when the span closes builds the OTLP span (ids from the request's
//! `traceparent` or new ones, the sampling decision) and offers it to the exporter's queue
//! without waiting.

use super::proto::{self, KeyValue};
use super::{TraceParent, SPANS};
use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The layer (filtered to the decision target by `install`).
pub(super) struct DecisionSpans {
    queue: mpsc::Sender<proto::Span>,
    sample_ratio: f64,
}

impl DecisionSpans {
    pub(super) fn new(queue: mpsc::Sender<proto::Span>, sample_ratio: f64) -> Self {
        Self {
            queue,
            sample_ratio,
        }
    }

    /// Parent-based sampling: the caller's `sampled` flag decides for its trace; a trace
    /// started here is sent with probability `sample_ratio`, decided from its random id.
    fn sampled(&self, parent: Option<&TraceParent>, trace_id: &[u8; 16]) -> bool {
        if let Some(p) = parent {
            return p.sampled();
        }
        if self.sample_ratio >= 1.0 {
            return true;
        }
        let mut low = [0; 8];
        low.copy_from_slice(&trace_id[8..]);
        // u64::MAX as f64 rounds up to 2^64; a ratio below 1 stays below it.
        (u64::from_be_bytes(low) as f64) < self.sample_ratio * u64::MAX as f64
    }
}

/// An open decision span: when it started and what was recorded on it so far.
#[derive(Default)]
struct Open {
    start_unix_nano: u64,
    traceparent: Option<String>,
    policy: Option<String>,
    outcome: Option<String>,
    outcomes: Option<String>,
    plan_size: Option<u64>,
    store_latency_us: Option<u64>,
    batch_size: Option<u64>,
    store_checks: Option<u64>,
}

impl Visit for Open {
    fn record_str(&mut self, field: &Field, value: &str) {
        let slot = match field.name() {
            "traceparent" => &mut self.traceparent,
            "policy" => &mut self.policy,
            "outcome" => &mut self.outcome,
            "outcomes" => &mut self.outcomes,
            _ => return,
        };
        *slot = Some(value.to_string());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        let slot = match field.name() {
            "plan_size" => &mut self.plan_size,
            "store_latency_us" => &mut self.store_latency_us,
            "batch_size" => &mut self.batch_size,
            "store_checks" => &mut self.store_checks,
            _ => return,
        };
        *slot = Some(value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if let Ok(v) = u64::try_from(value) {
            self.record_u64(field, v);
        }
    }

    /// Only the fields above are exported; anything else is not read.
    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

impl Open {
    /// The OTLP attributes: configured names and counts only.
    fn attributes(&self) -> Vec<KeyValue> {
        let mut a = Vec::with_capacity(7);
        let strings = [
            ("tollgate.policy", &self.policy),
            ("tollgate.outcome", &self.outcome),
            ("tollgate.outcomes", &self.outcomes),
        ];
        for (key, v) in strings {
            if let Some(v) = v {
                a.push(KeyValue::string(key, v.as_str()));
            }
        }
        let ints = [
            ("tollgate.plan_size", self.plan_size),
            ("tollgate.store.latency_us", self.store_latency_us),
            ("tollgate.store.batch_size", self.batch_size),
            ("tollgate.store.checks", self.store_checks),
        ];
        for (key, v) in ints {
            if let Some(v) = v {
                a.push(KeyValue::int(key, v));
            }
        }
        a
    }
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A random non-zero `u64` (xorshift64 per thread, seeded from the standard library's
/// per-process random hasher keys): trace and span ids need to be unique, not secret.
fn random_u64() -> u64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(seed());
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    })
}

fn seed() -> u64 {
    use std::hash::BuildHasher as _;
    let state = std::collections::hash_map::RandomState::new();
    state.hash_one((std::thread::current().id(), unix_nanos())) | 1
}

impl<S> tracing_subscriber::Layer<S> for DecisionSpans
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut open = Open {
            start_unix_nano: unix_nanos(),
            ..Open::default()
        };
        attrs.record(&mut open);
        span.extensions_mut().insert(open);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(open) = extensions.get_mut::<Open>() {
            values.record(open);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(open) = span.extensions_mut().remove::<Open>() else {
            return;
        };
        let parent = open.traceparent.as_deref().and_then(TraceParent::parse);
        let trace_id = match &parent {
            Some(p) => p.trace_id,
            None => {
                let mut t = [0; 16];
                t[..8].copy_from_slice(&random_u64().to_be_bytes());
                t[8..].copy_from_slice(&random_u64().to_be_bytes());
                t
            }
        };
        if !self.sampled(parent.as_ref(), &trace_id) {
            return;
        }
        let status = (open.outcome.as_deref() == Some("unavailable")).then(|| proto::Status {
            message: "the store did not answer and a policy fails closed".to_string(),
            code: proto::STATUS_CODE_ERROR,
        });
        let otlp = proto::Span {
            trace_id: trace_id.to_vec(),
            span_id: random_u64().to_be_bytes().to_vec(),
            trace_state: String::new(),
            parent_span_id: parent.map(|p| p.parent_id.to_vec()).unwrap_or_default(),
            name: span.name().to_string(),
            kind: proto::SPAN_KIND_INTERNAL,
            start_time_unix_nano: open.start_unix_nano,
            end_time_unix_nano: unix_nanos().max(open.start_unix_nano),
            attributes: open.attributes(),
            status,
            flags: 1,
        };
        if self.queue.try_send(otlp).is_err() {
            SPANS.add_dropped(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(ratio: f64) -> DecisionSpans {
        let (tx, _rx) = mpsc::channel(1);
        DecisionSpans::new(tx, ratio)
    }

    #[test]
    fn the_callers_flag_decides_and_otherwise_the_ratio_does() {
        let sampled = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let unsampled =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        let none = layer(0.0);
        assert!(none.sampled(sampled.as_ref(), &[1; 16]));
        assert!(!layer(1.0).sampled(unsampled.as_ref(), &[1; 16]));
        assert!(!none.sampled(None, &[0xff; 16]));
        assert!(layer(1.0).sampled(None, &[0xff; 16]));
        let half = layer(0.5);
        let mut low = [0; 16];
        low[8] = 0x10;
        let mut high = [0; 16];
        high[8] = 0xf0;
        assert!(half.sampled(None, &low));
        assert!(!half.sampled(None, &high));
    }

    /// A full queue drops the span and counts it; the request's thread never waits.
    #[test]
    fn spans_past_a_full_queue_are_dropped_and_counted() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let (tx, mut rx) = mpsc::channel(1);
        let subscriber = tracing_subscriber::registry().with(DecisionSpans::new(tx, 1.0));
        let before = SPANS.dropped();
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..3 {
                let span = tracing::trace_span!(
                    target: tollgate::trace::DECISION_TARGET,
                    "tollgate.decision",
                    outcome = tracing::field::Empty,
                    plan_size = 2_u64,
                );
                span.record("outcome", "limited");
            }
        });
        assert!(SPANS.dropped() >= before + 2);
        let kept = rx.try_recv().expect("the first span is queued");
        assert_eq!(kept.name, "tollgate.decision");
        assert!(kept
            .attributes
            .contains(&KeyValue::string("tollgate.outcome", "limited")));
        assert!(kept
            .attributes
            .contains(&KeyValue::int("tollgate.plan_size", 2)));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn ids_are_random_and_never_zero() {
        let ids: std::collections::HashSet<u64> = (0..1000).map(|_| random_u64()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(!ids.contains(&0));
    }
}
