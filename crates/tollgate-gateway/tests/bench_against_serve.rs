//! `tollgate bench` against the real `tollgate serve` (decision mode) on 127.0.0.1: the gateway
//! must admit no client more than its limit allows, the bench must learn the limit from the
//! gateway's `RateLimit-Policy` header by itself, and it must see a fleet that does not share
//! its state (one memory store per gateway) over-admit, while one sharing a Redis does not.

mod support;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;
use support::{scratch, Gateway};

use serde_json::Value;
use tollgate_testkit::RedisServer;

const MEMORY: &str = "backend = \"memory\"";
const FIVE_PER_HOUR: &str = "algorithm = \"token_bucket\"\nlimit = 5\nperiod = \"1h\"";

/// Starts `tollgate serve` with a `[store]` body and one policy (see `support::Gateway`).
fn start_gateway(store: &str, policy: &str) -> Gateway {
    Gateway::start(
        "",
        &format!(
            r#"
[store]
{store}

[identity]
sources = ["header:x-api-key", "ip"]
secret = "bench-test-secret"

[[policy]]
name = "api"
{policy}
"#
        ),
    )
}

/// Runs the bench against `gateways` with `args` (split on spaces); returns its JSON report.
fn bench(gateways: &[Gateway], args: &str) -> Value {
    let targets: Vec<String> = gateways.iter().map(|gateway| gateway.url("/")).collect();
    let json = scratch("bench.json");
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("bench")
        .arg("--target")
        .arg(targets.join(","))
        .args(["--json", &json.display().to_string(), "--quiet"])
        .args(args.split_whitespace())
        .output()
        .expect("run tollgate bench");
    support::bench_report(&output, &json)
}

/// Starts `size` gateways on `store` with `policy` and runs the bench against them all;
/// returns its JSON report and the fleet (still running, for its metrics).
fn bench_fleet(size: usize, store: &str, policy: &str, args: &str) -> (Value, Vec<Gateway>) {
    let fleet: Vec<Gateway> = (0..size).map(|_| start_gateway(store, policy)).collect();
    (bench(&fleet, args), fleet)
}

/// The gateway's decision and store-error counters, for failure messages.
fn decision_metrics(gateway: &Gateway) -> String {
    let admin = SocketAddr::from(([127, 0, 0, 1], gateway.admin_port));
    let Ok(mut stream) = TcpStream::connect_timeout(&admin, Duration::from_secs(2)) else {
        return "admin unreachable".into();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if std::io::Write::write_all(&mut stream, request.as_bytes()).is_err() {
        return "admin write failed".into();
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text.lines()
        .filter(|line| {
            line.starts_with("tollgate_decisions") || line.starts_with("tollgate_store_errors")
        })
        .filter(|line| !line.ends_with(" 0"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

#[test]
fn the_real_gateway_admits_each_client_exactly_its_limit() {
    let args = "--clients 5 --max-requests 100 --duration 1m --connections 4";
    let (report, _fleet) = bench_fleet(1, MEMORY, FIVE_PER_HOUR, args);

    let accuracy = &report["accuracy"];
    assert_eq!(accuracy["source"], "header", "{report}");
    assert_eq!(accuracy["limits"][0]["name"], "api");
    assert_eq!(u(&accuracy["limits"][0]["limit"]), 5);
    assert_eq!(u(&accuracy["limits"][0]["period_ms"]), 3_600_000);
    assert_eq!(u(&accuracy["clients"]), 5);
    assert_eq!(u(&accuracy["over_admission"]["total"]), 0, "{accuracy}");
    assert_eq!(u(&accuracy["under_admission"]["total"]), 0, "{accuracy}");
    assert_eq!(u(&report["status"]["200"]), 25, "{}", report["status"]);
    let sent = u(&report["requests"]["sent"]);
    let by_status: u64 = report["status"]
        .as_object()
        .map_or(0, |statuses| statuses.values().map(u).sum());
    assert_eq!(by_status, sent, "every request got an answer");
}

#[test]
fn the_real_gateway_never_over_admits_while_refilling() {
    // 10/s allowed against 30/s offered per client for about 2 s: the allowance grows while
    // the run lasts, and the gateway must stay under it.
    let policy = "algorithm = \"gcra\"\nlimit = 10\nperiod = \"1s\"\nburst = 3";
    let args = "--clients 2 --rate 60 --max-requests 120 --duration 1m \
                --algorithm gcra --limit 10 --period 1s --burst 3";
    let (report, _fleet) = bench_fleet(1, MEMORY, policy, args);

    let accuracy = &report["accuracy"];
    assert_eq!(accuracy["source"], "flags");
    assert_eq!(u(&accuracy["clients"]), 2);
    assert_eq!(u(&accuracy["over_admission"]["total"]), 0, "{accuracy}");
    for client in accuracy["per_client"].as_array().expect("per_client") {
        assert!(u(&client["admitted"]) >= 3, "the burst at least: {client}");
    }
}

#[test]
fn a_fleet_sharing_one_redis_admits_each_client_its_limit_once() {
    let redis = RedisServer::start();
    // A store error must not pass for a decision: fail closed (503, neither admitted nor
    // limited), with a timeout a loaded test machine meets. The default (20ms, open) admits
    // on a slow cold start, and the bench rightly reports that as over-admission.
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\non_failure = \"closed\"",
        redis.url()
    );
    let args = "--clients 4 --max-requests 80 --duration 1m";
    let (report, fleet) = bench_fleet(2, &store, FIVE_PER_HOUR, args);

    let accuracy = &report["accuracy"];
    let metrics: Vec<String> = fleet.iter().map(decision_metrics).collect();
    let metrics = metrics.join("\n");
    assert_eq!(
        u(&accuracy["over_admission"]["total"]),
        0,
        "{accuracy}\n{metrics}"
    );
    assert_eq!(u(&accuracy["under_admission"]["total"]), 0, "{accuracy}");
    assert_eq!(u(&report["status"]["200"]), 20, "{}", report["status"]);
}

#[test]
fn a_fleet_with_a_memory_store_each_over_admits_and_the_bench_says_by_how_much() {
    // Each client alternates between the gateways, and each gateway grants it 5 on its own.
    let args = "--clients 4 --max-requests 80 --duration 1m";
    let (report, _fleet) = bench_fleet(2, MEMORY, FIVE_PER_HOUR, args);

    let over = &report["accuracy"]["over_admission"];
    assert_eq!(u(&over["clients"]), 4, "{over}");
    assert_eq!(u(&over["max"]), 5);
    assert_eq!(u(&over["total"]), 20);
}
