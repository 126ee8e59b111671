//! The load generator end to end, as `tollgate bench` runs it (arguments parsed by clap, then
//! [`tollgate_bench::run_async`]), against tiny limiters with a known, exact behaviour started
//! on 127.0.0.1 inside the test. The accuracy report must see exactly what the limiter did: no
//! over-admission from an exact one, the leak from a leaky one.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use clap::Parser;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;

/// A limiter that admits the first `admit` requests of each `x-api-key`, then answers 429.
struct CountingLimiter {
    admit: u64,
    policy_header: Option<String>,
    seen: Mutex<HashMap<String, u64>>,
    requests: AtomicU64,
}

impl CountingLimiter {
    fn decide(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let key = request
            .headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let admitted = {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let count = seen.entry(key).or_default();
            *count += 1;
            *count <= self.admit
        };
        let mut response = Response::builder().status(if admitted { 200 } else { 429 });
        if let Some(policy) = &self.policy_header {
            response = response.header("ratelimit-policy", policy.as_str());
        }
        response
            .body(Full::new(Bytes::from_static(b"ok")))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
    }
}

/// Serves `limiter` on an ephemeral loopback port until the test's runtime ends.
async fn serve(limiter: Arc<CountingLimiter>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let response = limiter.decide(&request);
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn limiter(admit: u64, policy_header: Option<&str>) -> Arc<CountingLimiter> {
    Arc::new(CountingLimiter {
        admit,
        policy_header: policy_header.map(str::to_owned),
        seen: Mutex::new(HashMap::new()),
        requests: AtomicU64::new(0),
    })
}

/// `tollgate bench`'s command line: the library's arguments under a parser of their own.
#[derive(Parser)]
#[command(name = "bench")]
struct Cli {
    #[command(flatten)]
    args: tollgate_bench::BenchArgs,
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A scratch file path unique to this process and call.
fn scratch(name: &str) -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("tollgate-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(format!("{n}-{name}"))
}

/// Parses `ARGS` as `tollgate bench ARGS` does and runs the load generator on this runtime
/// (its requests go to the test server, which keeps serving on the other worker).
async fn bench(args: Vec<String>) -> anyhow::Result<()> {
    let cli = Cli::try_parse_from(std::iter::once("bench".to_owned()).chain(args))?;
    tollgate_bench::run_async(cli.args).await
}

/// Runs the bench quietly with `args` (split on spaces) plus `extra`, and returns its JSON report,
/// failing with its output if it failed.
async fn bench_json(args: &str, extra: &[&str], json_name: &str) -> Value {
    let json = scratch(json_name);
    let mut args: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args.extend([
        "--json".to_owned(),
        json.display().to_string(),
        "--quiet".to_owned(),
    ]);
    if let Err(e) = bench(args).await {
        panic!("bench failed: {e:#}");
    }
    let text = std::fs::read_to_string(&json).expect("json written");
    serde_json::from_str(&text).expect("valid json")
}

/// Serves `server` and runs the bench against `http://ADDR{path}` with `args` (split on
/// spaces) plus `extra`; its JSON report.
async fn bench_against(
    server: &Arc<CountingLimiter>,
    path: &str,
    args: &str,
    extra: &[&str],
) -> Value {
    let addr = serve(Arc::clone(server)).await;
    let target = format!("http://{addr}{path}");
    let mut all = vec!["--target", target.as_str()];
    all.extend_from_slice(extra);
    bench_json(args, &all, "report.json").await
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

/// Every sent request is counted exactly once, by status or by error kind.
fn assert_counts_add_up(report: &Value) {
    let sum = |section: &Value| -> u64 {
        section
            .as_object()
            .map_or(0, |map| map.values().map(u).sum())
    };
    let sent = u(&report["requests"]["sent"]);
    assert_eq!(
        sum(&report["status"]) + sum(&report["errors"]),
        sent,
        "{report}"
    );
    assert_eq!(u(&report["requests"]["answered"]), sum(&report["status"]));
    assert_eq!(u(&report["latency"]["all"]["count"]), sent);
    let timeline: u64 = report["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .map(|s| u(&s["admitted"]) + u(&s["limited"]) + u(&s["other"]) + u(&s["errors"]))
        .sum();
    assert_eq!(timeline, sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_limiter_shows_zero_over_admission() {
    let server = limiter(5, None);
    let svg = scratch("exact.svg");
    let svg_arg = svg.display().to_string();
    let args = "--clients 5 --max-requests 200 --duration 1m --limit 5 --period 1h --connections 4";
    let report = bench_against(&server, "/", args, &["--svg", &svg_arg]).await;

    assert_counts_add_up(&report);
    assert_eq!(
        u(&report["requests"]["sent"]),
        server.requests.load(Ordering::Relaxed)
    );
    assert_eq!(u(&report["status"]["200"]), 25, "5 clients x limit 5");
    let accuracy = &report["accuracy"];
    assert_eq!(accuracy["source"], "flags");
    assert_eq!(u(&accuracy["clients"]), 5);
    assert_eq!(u(&accuracy["over_admission"]["total"]), 0, "{accuracy}");
    assert_eq!(u(&accuracy["over_admission"]["clients"]), 0);
    assert_eq!(u(&accuracy["under_admission"]["total"]), 0, "{accuracy}");
    for client in accuracy["per_client"].as_array().expect("per_client") {
        assert_eq!(u(&client["admitted"]), 5);
        assert_eq!(u(&client["allowed"]), 5);
    }
    let svg = std::fs::read_to_string(&svg).expect("svg written");
    assert!(
        svg.starts_with("<svg"),
        "not an svg: {}",
        &svg[..svg.len().min(80)]
    );
    assert!(svg.contains("throughput per second"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaky_limiter_is_reported_three_over_per_client() {
    // The target without a path.
    let args = "--clients 5 --max-requests 100 --duration 1m --limit 5 --period 1h";
    let report = bench_against(&limiter(5 + 3, None), "", args, &[]).await;

    assert_counts_add_up(&report);
    let over = &report["accuracy"]["over_admission"];
    assert_eq!(u(&over["clients"]), 5, "{over}");
    assert_eq!(u(&over["max"]), 3);
    assert_eq!(u(&over["total"]), 15);
    assert_eq!(u(&over["distribution"]["3"]), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_is_read_from_the_rate_limit_policy_header() {
    let server = limiter(4, Some(r#""exact";q=4;w=3600"#));
    let args = "--clients 3 --max-requests 60 --duration 1m";
    let report = bench_against(&server, "/", args, &[]).await;

    let accuracy = &report["accuracy"];
    assert_eq!(accuracy["source"], "header", "{report}");
    assert_eq!(accuracy["limits"][0]["name"], "exact");
    assert_eq!(u(&accuracy["limits"][0]["limit"]), 4);
    assert_eq!(u(&accuracy["limits"][0]["period_ms"]), 3_600_000);
    assert_eq!(u(&accuracy["over_admission"]["total"]), 0);
    assert_eq!(u(&report["status"]["200"]), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_known_limit_accuracy_is_null_and_says_why() {
    let args = "--max-requests 50 --duration 30s";
    let report = bench_against(&limiter(1_000_000, None), "/", args, &[]).await;

    assert!(report["accuracy"].is_null());
    assert!(report["accuracy_note"]
        .as_str()
        .is_some_and(|n| n.contains("--limit")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_requests_bounds_the_run_exactly() {
    let server = limiter(1_000, None);
    let args = "--max-requests 7 --duration 1m --limit 1000 --period 1h";
    let report = bench_against(&server, "/", args, &[]).await;

    assert_eq!(u(&report["requests"]["sent"]), 7);
    assert_eq!(server.requests.load(Ordering::Relaxed), 7);
    assert_counts_add_up(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_never_schedules_more_than_rate_times_duration() {
    let addr = serve(limiter(2, None)).await;
    let targets = format!("http://{addr}/a,http://{addr}/b");
    let report = bench_json(
        "--rate 100 --duration 1s --clients 4 --limit 2 --period 1h",
        &["--target", &targets],
        "open.json",
    )
    .await;

    let scheduled = u(&report["requests"]["sent"]) + u(&report["requests"]["missed"]);
    assert!(scheduled <= 100, "scheduled {scheduled}");
    assert_eq!(report["settings"]["mode"], "open");
    assert_counts_add_up(&report);
    assert_eq!(u(&report["accuracy"]["over_admission"]["total"]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_target_counts_connect_errors_and_fails() {
    // Bind and release a port so that nothing listens on it.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let target = format!("http://{closed}/");
    let json = scratch("closed.json");
    let output = bench(
        [
            "--max-requests",
            "3",
            "--duration",
            "10s",
            "--quiet",
            "--target",
            &target,
            "--json",
            &json.display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec(),
    )
    .await;
    // Nothing answered: the run fails (it measured nothing), and still writes its report.
    let err = output.expect_err("a run in which nothing answered fails");
    assert!(
        err.to_string().contains("no request got an answer"),
        "{err}"
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report written"))
            .expect("json report");

    assert_eq!(u(&report["requests"]["sent"]), 3);
    assert_eq!(u(&report["errors"]["connect"]), 3, "{report}");
    assert_counts_add_up(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_targets_are_refused_as_a_usage_error() {
    let Err(e) = Cli::try_parse_from(["bench", "--target", "https://127.0.0.1:1/"]) else {
        panic!("an https target was accepted");
    };
    // clap's usage errors exit with 2 in the binary.
    assert_eq!(e.exit_code(), 2, "a usage error");
    assert!(e.to_string().contains("https is not supported"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_report_fails_before_any_request_is_sent() {
    let server = limiter(5, None);
    let addr = serve(Arc::clone(&server)).await;
    let missing = scratch("no-such-dir").join("report.json");
    let result = bench(vec![
        "--target".into(),
        format!("http://{addr}/"),
        "--json".into(),
        missing.display().to_string(),
        "--max-requests".into(),
        "10".into(),
    ])
    .await;

    let Err(e) = result else {
        panic!("the run succeeded without its report file");
    };
    assert!(format!("{e:#}").contains("cannot create"), "{e:#}");
    assert_eq!(server.requests.load(Ordering::Relaxed), 0);
}
