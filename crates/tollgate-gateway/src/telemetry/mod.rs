//! Logs and traces of `tollgate serve`.
//!
//! Logs go to stderr as text or as JSON lines (`--log-format`), filtered by `TOLLGATE_LOG`.
//! Traces: with `[telemetry] otlp_endpoint`, every decision span the tower layer opens (see
//! `tollgate::trace::DECISION_TARGET`) becomes one OpenTelemetry span sent over OTLP/gRPC.
//! The request path only builds the span and offers it to a bounded queue; a separate task
//! sends batches. When the collector is slow or gone the queue fills and further spans are
//! dropped and counted (`tollgate_trace_spans_total{result="dropped"}`), so a request never
//! waits on the collector. Without an endpoint no span layer is installed and the decision
//! span's callsite stays disabled.

mod export;
pub mod proto;
mod span;
mod traceparent;

pub use export::{Exporter, ExporterHandle};
pub use traceparent::TraceParent;

use crate::config::TelemetryConfig;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// `TIMESTAMP LEVEL TARGET: message key=value ...`.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the same
    /// fields as text, at the top level.
    Json,
}

/// Spans waiting for the exporter at most; past this, new spans are dropped (and counted).
pub const QUEUE_CAPACITY: usize = 4096;

/// Counts of decision spans, for `/metrics`. Process-wide like the subscriber they belong to.
#[derive(Debug, Default)]
pub struct SpanCounts {
    exported: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

/// The process's span counts.
pub static SPANS: SpanCounts = SpanCounts {
    exported: AtomicU64::new(0),
    dropped: AtomicU64::new(0),
    failed: AtomicU64::new(0),
};

impl SpanCounts {
    /// Spans the collector accepted.
    pub fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }

    /// Spans dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Spans in batches the collector did not take (unreachable, refused, timed out).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    pub(crate) fn add_exported(&self, n: u64) {
        self.exported.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_failed(&self, n: u64) {
        self.failed.fetch_add(n, Ordering::Relaxed);
    }
}

/// Appends `tollgate_trace_spans_total{result}` in the Prometheus text format.
pub fn render_metrics(out: &mut String) {
    out.push_str("# HELP tollgate_trace_spans_total Decision spans by result: exported, dropped (queue full), failed (the collector did not take them).\n");
    out.push_str("# TYPE tollgate_trace_spans_total counter\n");
    for (result, n) in [
        ("exported", SPANS.exported()),
        ("dropped", SPANS.dropped()),
        ("failed", SPANS.failed()),
    ] {
        let _ = writeln!(out, "tollgate_trace_spans_total{{result=\"{result}\"}} {n}");
    }
}

/// Installs the process's subscriber: logs in `format`, filtered by `TOLLGATE_LOG` (default
/// `info`), and, when `telemetry` names a collector, the decision span layer. Returns the
/// exporter to run on the runtime (see [`Exporter::spawn`]); `None` when nothing is sent.
pub fn install(format: LogFormat, telemetry: &TelemetryConfig) -> Option<Exporter> {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("TOLLGATE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let text = (format == LogFormat::Text).then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .with_filter(filter())
    });
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .with_filter(filter())
    });
    let (spans, exporter) = match &telemetry.otlp_endpoint {
        None => (None, None),
        Some(endpoint) => {
            let (tx, rx) = tokio::sync::mpsc::channel(QUEUE_CAPACITY);
            let layer = span::DecisionSpans::new(tx, telemetry.sample_ratio).with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(tollgate::trace::DECISION_TARGET, tracing::Level::TRACE),
            );
            let exporter = Exporter::new(rx, endpoint.clone(), &telemetry.service_name);
            (Some(layer), Some(exporter))
        }
    };
    let _ = tracing_subscriber::registry()
        .with(text)
        .with(json)
        .with(spans)
        .try_init();
    exporter
}
