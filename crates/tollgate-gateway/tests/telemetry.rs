//! What operators collect from `tollgate serve`: OTLP spans received by a real OTLP/gRPC
//! collector endpoint (the official protos' generated server), JSON log lines, and the config
//! found through `$TOLLGATE_CONFIG`.

mod support;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

/// An OTLP/gRPC trace collector endpoint that keeps every request it receives.
#[derive(Clone, Default)]
struct Collector {
    received: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.received
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// Serves on a free loopback port; returns the collector and its endpoint URL.
    async fn start() -> (Collector, String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind collector");
        let addr = listener.local_addr().expect("collector addr");
        let collector = Collector::default();
        let service = TraceServiceServer::new(collector.clone());
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await;
        });
        (collector, format!("http://{addr}"), task)
    }

    fn spans(&self) -> Vec<Span> {
        self.received
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| ss.spans.clone())
            .collect()
    }

    fn service_names(&self) -> Vec<String> {
        self.received
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .flat_map(|r| &r.resource_spans)
            .filter_map(|rs| rs.resource.as_ref())
            .filter_map(|r| string_attr(&r.attributes, "service.name"))
            .collect()
    }

    /// Waits (at most 20 s) until `n` spans arrived; returns them.
    async fn wait_for(&self, n: usize) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans = self.spans();
            if spans.len() >= n || Instant::now() > deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn string_attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    match attr(attrs, key) {
        Some(Value::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

fn int_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attrs, key) {
        Some(Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}

const POLICY: &str = r#"
[identity]
sources = ["header:x-api-key", "ip"]

[[policy]]
name = "api"
algorithm = "fixed_window"
limit = 2
period = "1h"
"#;

const API_KEY: &str = "k-8f2d-raw-identity";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_is_an_otlp_span_with_its_policy_outcome_and_the_callers_trace() {
    let (collector, endpoint, _task) = Collector::start().await;
    let gw = Gateway::start(
        "",
        &format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"edge-test\"\n{POLICY}"
        ),
    );
    let c = client();
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let first = get(
        &c,
        &gw.url("/a"),
        &[
            ("x-api-key", API_KEY.as_bytes()),
            ("traceparent", traceparent.as_bytes()),
        ],
    )
    .await;
    assert_eq!(first.status, 200);
    for expected in [200, 429] {
        let a = get(&c, &gw.url("/a"), &[("x-api-key", API_KEY.as_bytes())]).await;
        assert_eq!(a.status, expected);
    }
    let spans = collector.wait_for(3).await;
    assert_eq!(
        spans.len(),
        3,
        "spans received: {spans:?}\n{}",
        gw.log_text()
    );
    assert!(collector.service_names().iter().all(|n| n == "edge-test"));

    let mut outcomes: Vec<String> = Vec::new();
    for s in &spans {
        assert_eq!(s.name, "tollgate.decision");
        assert_eq!(s.trace_id.len(), 16);
        assert_eq!(s.span_id.len(), 8);
        assert!(s.end_time_unix_nano >= s.start_time_unix_nano);
        assert_eq!(
            string_attr(&s.attributes, "tollgate.policy").as_deref(),
            Some("api")
        );
        assert_eq!(int_attr(&s.attributes, "tollgate.plan_size"), Some(1));
        assert_eq!(
            int_attr(&s.attributes, "tollgate.store.batch_size"),
            Some(1)
        );
        assert!(int_attr(&s.attributes, "tollgate.store.latency_us").is_some_and(|us| us >= 0));
        outcomes.push(string_attr(&s.attributes, "tollgate.outcome").unwrap_or_default());
        // Configured names and counts only: the raw identity appears nowhere.
        for kv in &s.attributes {
            if let Some(Value::StringValue(v)) = kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                assert!(!v.contains(API_KEY), "{}: {v}", kv.key);
            }
        }
    }
    outcomes.sort();
    assert_eq!(outcomes, ["allowed", "allowed", "limited"]);

    let joined: Vec<&Span> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == TRACE_ID)
        .collect();
    assert_eq!(joined.len(), 1, "one span joins the caller's trace");
    assert_eq!(hex(&joined[0].parent_span_id), PARENT_ID);
    let own: Vec<&Span> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) != TRACE_ID)
        .collect();
    assert!(own.iter().all(|s| s.parent_span_id.is_empty()));
    assert_ne!(
        own[0].trace_id, own[1].trace_id,
        "each request starts its own trace"
    );

    // The exporter counts a batch once the collector's answer is back, just after it arrived.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut metrics = get(&c, &gw.admin_url("/metrics"), &[]).await.text();
    while !metrics.contains("tollgate_trace_spans_total{result=\"exported\"} 3\n")
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
        metrics = get(&c, &gw.admin_url("/metrics"), &[]).await.text();
    }
    assert!(
        metrics.contains("tollgate_trace_spans_total{result=\"exported\"} 3\n"),
        "{metrics}"
    );
    assert!(metrics.contains("tollgate_limit{policy=\"api\",kind=\"limit\"} 2\n"));
    assert!(
        metrics.contains("tollgate_limit{policy=\"api\",kind=\"period_seconds\"} 3600.000000\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_did_not_sample_its_trace_gets_no_span() {
    let (collector, endpoint, _task) = Collector::start().await;
    let gw = Gateway::start(
        "",
        &format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\n{POLICY}"),
    );
    let c = client();
    let unsampled = format!("00-{TRACE_ID}-{PARENT_ID}-00");
    let a = get(&c, &gw.url("/"), &[("traceparent", unsampled.as_bytes())]).await;
    assert_eq!(a.status, 200);
    let b = get(&c, &gw.url("/"), &[]).await;
    assert_eq!(b.status, 200);
    let spans = collector.wait_for(1).await;
    assert_eq!(spans.len(), 1);
    assert_ne!(hex(&spans[0].trace_id), TRACE_ID);
}

/// A collector that accepts connections and never answers: exports time out, requests do
/// not wait for them, and the lost spans are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_does_not_hold_requests_and_its_spans_are_counted() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", silent.local_addr().expect("addr"));
    let _held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            if open.len() < 64 {
                open.push(s);
            }
        }
    });
    let gw = Gateway::start(
        "",
        &format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\n{POLICY}"),
    );
    let c = client();
    let mut statuses = Vec::new();
    for i in 0..40 {
        let key = format!("client-{}", i % 20);
        statuses.push(
            get(&c, &gw.url("/"), &[("x-api-key", key.as_bytes())])
                .await
                .status,
        );
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut metrics = String::new();
    while Instant::now() < deadline {
        metrics = get(&c, &gw.admin_url("/metrics"), &[]).await.text();
        if !metrics.contains("tollgate_trace_spans_total{result=\"failed\"} 0\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failed = metric_value(&metrics, "tollgate_trace_spans_total{result=\"failed\"}");
    assert!(failed >= 1, "{metrics}");
    assert_eq!(
        metric_value(&metrics, "tollgate_trace_spans_total{result=\"exported\"}"),
        0
    );
    assert!(
        gw.log_text().contains("OTLP export failed"),
        "{}",
        gw.log_text()
    );
}

/// Envoy's rate limit calls are decisions too: the span carries the descriptor's rule name
/// (never the descriptor's value) and joins the trace Envoy sent as gRPC metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_rate_limit_call_is_a_span_in_envoys_trace() {
    use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitRequest;

    let (collector, endpoint, _task) = Collector::start().await;
    let yaml = scratch("rls.yaml");
    std::fs::write(
        &yaml,
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n",
    )
    .expect("write yaml");
    let rls_port = free_port();
    let gw = Gateway::start(
        "",
        &format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\n[rls]\nlisten = \"127.0.0.1:{rls_port}\"\nconfig = \"{}\"\n",
            yaml.display()
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let channel = loop {
        let e = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{rls_port}"))
            .expect("uri");
        match e.connect().await {
            Ok(c) => break c,
            Err(e) if Instant::now() > deadline => panic!("no RLS listener: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let mut rls = RateLimitServiceClient::new(channel);
    for _ in 0..2 {
        let mut req = tonic::Request::new(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "tenant".into(),
                    value: API_KEY.into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        });
        let tp = format!("00-{TRACE_ID}-{PARENT_ID}-01");
        req.metadata_mut()
            .insert("traceparent", tp.parse().expect("metadata value"));
        rls.should_rate_limit(req).await.expect("ShouldRateLimit");
    }
    let spans = collector.wait_for(2).await;
    assert_eq!(spans.len(), 2, "{}", gw.log_text());
    let mut outcomes = Vec::new();
    for s in &spans {
        assert_eq!(hex(&s.trace_id), TRACE_ID);
        assert_eq!(hex(&s.parent_span_id), PARENT_ID);
        assert_eq!(int_attr(&s.attributes, "tollgate.plan_size"), Some(1));
        let policy = string_attr(&s.attributes, "tollgate.policy").unwrap_or_default();
        assert!(policy.starts_with("edge."), "{policy}");
        for kv in &s.attributes {
            if let Some(Value::StringValue(v)) = kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                assert!(!v.contains(API_KEY), "{}: {v}", kv.key);
            }
        }
        outcomes.push(string_attr(&s.attributes, "tollgate.outcome").unwrap_or_default());
    }
    outcomes.sort();
    assert_eq!(outcomes, ["allowed", "limited"]);
}

fn metric_value(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `tollgate serve` with `args` and `env`, its stderr in a file; waits until /healthz answers.
fn serve(args: &[&str], env: &[(&str, &str)], admin_port: u16) -> (Child, std::path::PathBuf) {
    let log = scratch("serve.log");
    let mut cmd = tollgate();
    cmd.arg("serve")
        .args(args)
        .env_remove("TOLLGATE_CONFIG")
        .env_remove("TOLLGATE_LOG_FORMAT")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"));
    let mut child = cmd.spawn().expect("spawn tollgate serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "exited with {status}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if blocking_status_line(
            admin_port,
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .starts_with("HTTP/1.1 200")
        {
            return (child, log);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!(
        "not healthy: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

fn stop(mut child: Child) {
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn config_file(port: u16, admin_port: u16) -> std::path::PathBuf {
    let path = scratch("env.toml");
    std::fs::write(
        &path,
        format!("[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\n{POLICY}"),
    )
    .expect("write config");
    path
}

#[test]
fn every_json_log_line_is_one_object_with_the_fields_of_the_text_line() {
    let (port, admin_port) = (free_port(), free_port());
    let config = config_file(port, admin_port);
    let config = config.to_str().expect("utf-8 path");
    let (child, log) = serve(
        &["--config", config, "--log-format", "json"],
        &[],
        admin_port,
    );
    let _ = std::process::Command::new("kill")
        .arg("-HUP")
        .arg(child.id().to_string())
        .status();
    // The reload is logged; wait for it (bounded) so the file holds more than the start.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline
        && !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("reload")
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop(child);
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 3, "{text}");
    let mut started = None;
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(v.get(key).is_some(), "no {key}: {line}");
        }
        if v["message"] == "tollgate started" {
            started = Some(v);
        }
    }
    let started = started.expect("a start line");
    assert_eq!(started["listen"], format!("127.0.0.1:{port}"));
    assert_eq!(started["secret"], "<redacted>");

    // The text format carries the same fields.
    let (port, admin_port) = (free_port(), free_port());
    let config = config_file(port, admin_port);
    let (child, log) = serve(
        &[
            "--config",
            config.to_str().expect("utf-8 path"),
            "--log-format",
            "text",
        ],
        &[],
        admin_port,
    );
    stop(child);
    let text = std::fs::read_to_string(&log).expect("log");
    let line = text
        .lines()
        .find(|l| l.contains("tollgate started"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(&format!("listen=\"127.0.0.1:{port}\"")),
        "{line}"
    );
    assert!(line.contains("secret=\"<redacted>\""), "{line}");
}

#[test]
fn serve_without_config_reads_the_file_tollgate_config_names() {
    let (port, admin_port) = (free_port(), free_port());
    let config = config_file(port, admin_port);
    let config = config.to_str().expect("utf-8 path");
    let (child, _log) = serve(&[], &[("TOLLGATE_CONFIG", config)], admin_port);
    let line = blocking_status_line(
        port,
        b"GET / HTTP/1.1\r\nhost: x\r\nx-api-key: k\r\nconnection: close\r\n\r\n",
    );
    stop(child);
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");

    // --config wins over the variable.
    let (port2, admin_port2) = (free_port(), free_port());
    let flag = config_file(port2, admin_port2);
    let flag = flag.to_str().expect("utf-8 path");
    let (child, _log) = serve(
        &["--config", flag],
        &[("TOLLGATE_CONFIG", "/nonexistent/tollgate.toml")],
        admin_port2,
    );
    stop(child);

    // A variable naming a bad file is that file's error, exit 2.
    let out = tollgate()
        .arg("serve")
        .env("TOLLGATE_CONFIG", "/nonexistent/tollgate.toml")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("error: /nonexistent/tollgate.toml:1:1: (file): cannot read the file"));
}
