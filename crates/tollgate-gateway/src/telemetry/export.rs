//! The task that sends queued decision spans to the collector: batches of up to [`BATCH`]
//! spans, one `TraceService/Export` call at a time, each bounded by [`EXPORT_TIMEOUT`]. A
//! failed batch is counted and not retried: the queue behind it keeps moving, and tracing
//! data is worth less than the memory and the delay a backlog would cost.

use super::proto::{
    ExportTraceServiceRequest, ExportTraceServiceResponse, InstrumentationScope, KeyValue,
    Resource, ResourceSpans, ScopeSpans, Span,
};
use super::SPANS;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::{Channel, Endpoint};

/// The most spans in one export call.
pub const BATCH: usize = 512;
/// How long a span may wait for companions before its batch is sent.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// The most one export call (connecting included) may take.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(3);
/// The gRPC method of OTLP trace export.
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The queue's receiving end and where its spans go; run it with [`Exporter::spawn`].
pub struct Exporter {
    queue: mpsc::Receiver<Span>,
    endpoint: String,
    resource: Resource,
}

/// A running exporter.
pub struct ExporterHandle {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl ExporterHandle {
    /// Sends what is queued (bounded by `EXPORT_TIMEOUT` per batch) and stops.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

impl Exporter {
    pub(super) fn new(queue: mpsc::Receiver<Span>, endpoint: String, service_name: &str) -> Self {
        Self {
            queue,
            endpoint,
            resource: Resource {
                attributes: vec![
                    KeyValue::string("service.name", service_name),
                    KeyValue::string("service.version", env!("CARGO_PKG_VERSION")),
                ],
            },
        }
    }

    /// Starts sending on the current runtime.
    pub fn spawn(self) -> ExporterHandle {
        let (stop, stopped) = oneshot::channel();
        ExporterHandle {
            stop,
            task: tokio::spawn(self.run(stopped)),
        }
    }

    async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        let channel = match Endpoint::from_shared(self.endpoint.clone()) {
            Ok(e) => e
                .connect_timeout(EXPORT_TIMEOUT)
                .timeout(EXPORT_TIMEOUT)
                .connect_lazy(),
            Err(e) => {
                tracing::error!(error = %e, "telemetry.otlp_endpoint cannot be used; no spans are sent");
                return;
            }
        };
        let mut client = Client::new(channel);
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            tokio::select! {
                span = self.queue.recv() => match span {
                    Some(s) => batch.push(s),
                    None => break,
                },
                _ = &mut stop => break,
            }
            let flush = tokio::time::sleep(FLUSH_EVERY);
            tokio::pin!(flush);
            while batch.len() < BATCH {
                tokio::select! {
                    span = self.queue.recv() => match span {
                        Some(s) => batch.push(s),
                        None => break,
                    },
                    _ = &mut flush => break,
                }
            }
            self.send(&mut client, &mut batch).await;
        }
        // Stopping: what is queued now goes out, in batches; nothing waits for more.
        while let Ok(s) = self.queue.try_recv() {
            batch.push(s);
            if batch.len() == BATCH {
                self.send(&mut client, &mut batch).await;
            }
        }
        if !batch.is_empty() {
            self.send(&mut client, &mut batch).await;
        }
    }

    /// One export call with the spans of `batch` (emptied).
    async fn send(&self, client: &mut Client, batch: &mut Vec<Span>) {
        let n = batch.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "tollgate".to_string(),
                        version: env!("CARGO_PKG_VERSION").to_string(),
                    }),
                    spans: std::mem::take(batch),
                }],
            }],
        };
        match tokio::time::timeout(EXPORT_TIMEOUT, client.export(request)).await {
            Ok(Ok(response)) => {
                let rejected = response
                    .partial_success
                    .map_or(0, |p| u64::try_from(p.rejected_spans).unwrap_or(0))
                    .min(n);
                SPANS.add_exported(n - rejected);
                SPANS.add_failed(rejected);
                client.succeeded();
            }
            Ok(Err(e)) => client.failed(n, &e),
            Err(_) => client.failed(n, &"no answer within the export timeout"),
        }
    }
}

/// The gRPC client, and whether the last call failed (a failure is logged when it starts and
/// when it ends, not once per batch).
struct Client {
    grpc: tonic::client::Grpc<Channel>,
    failing: bool,
}

impl Client {
    fn new(channel: Channel) -> Self {
        Self {
            grpc: tonic::client::Grpc::new(channel),
            failing: false,
        }
    }

    async fn export(
        &mut self,
        request: ExportTraceServiceRequest,
    ) -> Result<ExportTraceServiceResponse, tonic::Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::default();
        let path = http::uri::PathAndQuery::from_static(EXPORT_PATH);
        let response = self
            .grpc
            .unary(tonic::Request::new(request), path, codec)
            .await?;
        Ok(response.into_inner())
    }

    fn succeeded(&mut self) {
        if self.failing {
            tracing::info!("OTLP collector reachable again; spans are sent");
            self.failing = false;
        }
    }

    fn failed(&mut self, spans: u64, error: &dyn std::fmt::Display) {
        SPANS.add_failed(spans);
        if !self.failing {
            tracing::warn!(error = %error, spans, "OTLP export failed; spans are dropped (tollgate_trace_spans_total{{result=\"failed\"}}) until the collector answers");
            self.failing = true;
        }
    }
}
