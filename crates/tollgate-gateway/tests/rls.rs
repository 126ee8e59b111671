//! `tollgate serve` with `[rls]`: real processes, a real redis-server, a tonic client.
//! Several gateways answer one descriptor exactly; bad bytes on the gRPC port leave the
//! process up and answering; the HTTP gateway and the RLS share one limiter; check-config
//! reports YAML errors with the YAML's file, line and key.

mod support;

use http::StatusCode;
use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_rls::proto::grpc::health::v1::health_client::HealthClient;
use tollgate_rls::proto::grpc::health::v1::HealthCheckRequest;
use tollgate_testkit::RedisServer;
use tonic::transport::Channel;

const YAML: &str = "\
domain: edge
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 50
      algorithm: sliding_window_log
";

/// A gateway whose `[rls]` serves `YAML`; returns it with its gRPC port.
fn start_gateway(store: &str, policies: &str) -> (Gateway, u16) {
    start_gateway_with("", store, policies)
}

fn start_gateway_with(server_extra: &str, store: &str, policies: &str) -> (Gateway, u16) {
    let yaml = scratch("rls.yaml");
    std::fs::write(&yaml, YAML).expect("write yaml");
    let rls_port = free_port();
    let body = format!(
        "{store}\n[identity]\nsources = [\"header:x-api-key\"]\nsecret = \"rls-secret\"\n\
         [rls]\nlisten = \"127.0.0.1:{rls_port}\"\nconfig = \"{}\"\n{policies}",
        yaml.display()
    );
    (Gateway::start(server_extra, &body), rls_port)
}

async fn channel(port: u16) -> Channel {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let endpoint = Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("uri")
            .timeout(Duration::from_secs(10));
        match endpoint.connect().await {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => panic!("no gRPC listener on {port}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn tenant(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "tenant".into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_gateways_on_one_redis_answer_one_descriptor_exactly() {
    let redis = RedisServer::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\non_failure = \"closed\"",
        redis.url()
    );
    let gateways: Vec<(Gateway, u16)> = (0..4).map(|_| start_gateway(&store, "")).collect();
    let mut clients = Vec::new();
    for (_, port) in &gateways {
        clients.push(RateLimitServiceClient::new(channel(*port).await));
    }
    let mut tasks = Vec::new();
    for i in 0..200 {
        let mut c = clients[i % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            c.should_rate_limit(tenant("acme"))
                .await
                .map(|r| r.into_inner().overall_code)
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match Code::try_from(t.await.expect("task").expect("answered")) {
            Ok(Code::Ok) => ok += 1,
            Ok(Code::OverLimit) => {}
            other => panic!("unexpected code {other:?}"),
        }
    }
    assert_eq!(ok, 50, "exactly the limit over four processes");
    // Another value of the descriptor counts on its own; raw values never reach Redis.
    let r = clients[1]
        .should_rate_limit(tenant("globex"))
        .await
        .expect("answered");
    assert_eq!(r.into_inner().statuses[0].limit_remaining, 49);
    let keys = redis.cli(&["KEYS", "*"]);
    assert!(!keys.contains("acme") && !keys.contains("globex"), "{keys}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bytes_on_the_grpc_port_leave_the_process_up_and_answering() {
    let redis = RedisServer::start();
    let store = format!("[store]\nbackend = \"redis\"\nurl = \"{}\"", redis.url());
    let (mut gw, port) = start_gateway(&store, "");
    let mut client = RateLimitServiceClient::new(channel(port).await);
    assert!(client.should_rate_limit(tenant("a")).await.is_ok());

    // Garbage instead of HTTP/2.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(b"\x00\xff garbage GET / HTTP/1.1\r\n\r\n\x16\x03\x01")
        .await
        .expect("write");
    let mut buf = [0u8; 256];
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
    drop(s);
    // A preface cut short, left open while others are served.
    let mut half = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    half.write_all(b"PRI * HTTP/2.0\r\n\r\nS")
        .await
        .expect("write");
    // A message far above the limit.
    let mut big = tenant("b");
    big.descriptors[0].entries[0].value = "x".repeat(2 * 1024 * 1024);
    let err = client.should_rate_limit(big).await.expect_err("refused");
    assert!(
        matches!(
            err.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{err:?}"
    );

    assert!(
        gw.child.try_wait().expect("status").is_none(),
        "still running"
    );
    let mut fresh = RateLimitServiceClient::new(channel(port).await);
    let r = fresh.should_rate_limit(tenant("a")).await.expect("answers");
    assert_eq!(r.into_inner().statuses[0].limit_remaining, 48);
    let mut health = HealthClient::new(channel(port).await);
    let h = health
        .check(HealthCheckRequest::default())
        .await
        .expect("health");
    assert_eq!(h.into_inner().status, 1, "SERVING");
    drop(half);
    assert!(gw.wait_exit(Duration::from_millis(100)).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_gateway_and_the_rls_share_one_process_and_one_limiter() {
    let redis = RedisServer::start();
    let store = format!("[store]\nbackend = \"redis\"\nurl = \"{}\"", redis.url());
    let policy =
        "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\n";
    let (gw, port) = start_gateway(&store, policy);
    let c = client();
    for expected in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        let a = get(&c, &gw.url("/"), &[("x-api-key", b"k")]).await;
        assert_eq!(a.status, expected);
    }
    let mut rls = RateLimitServiceClient::new(channel(port).await);
    let r = rls
        .should_rate_limit(tenant("t"))
        .await
        .expect("answers")
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 49);
    let metrics = get(&c, &gw.admin_url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&metrics.body).to_string();
    assert!(
        text.contains("policy=\"api\",outcome=\"limited\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("policy=\"edge.tenant\",outcome=\"allowed\"} 1"),
        "{text}"
    );
}

/// `tollgate check-config TOML`, run to its end.
fn check_config(toml: &std::path::Path) -> std::process::Output {
    tollgate()
        .arg("check-config")
        .arg(toml)
        .output()
        .expect("run check-config")
}

#[test]
fn check_config_reports_yaml_errors_with_the_yaml_file_line_and_key() {
    let yaml = scratch("bad.yaml");
    std::fs::write(
        &yaml,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    )
    .expect("write yaml");
    let toml = scratch("with-rls.toml");
    std::fs::write(
        &toml,
        format!(
            "[rls]\nlisten = \"127.0.0.1:18081\"\nconfig = \"{}\"\n",
            yaml.display()
        ),
    )
    .expect("write toml");
    let out = check_config(&toml);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "error: {}:5:7: descriptors[0].rate_limit.unit:",
        yaml.display()
    );
    assert!(err.starts_with(&expected), "{err}");

    std::fs::write(
        &yaml,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .expect("write yaml");
    let out = check_config(&toml);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 descriptor rule"));
}

/// A descriptor's sliding log of 5,000 an hour on Redis costs Redis a read and a write of
/// up to 5,000 records a request: check-config says so, naming the YAML line (the
/// descriptor's `rate_limit`) and the rule; 100 an hour draws nothing.
#[test]
fn check_config_warns_of_a_long_sliding_log_in_the_yaml() {
    let yaml = scratch("long-log.yaml");
    let toml = scratch("long-log.toml");
    std::fs::write(
        &toml,
        format!(
            "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n\
             [rls]\nlisten = \"127.0.0.1:18082\"\nconfig = \"{}\"\n",
            yaml.display()
        ),
    )
    .expect("write toml");
    for (per_hour, warned) in [(5_000, true), (100, false)] {
        std::fs::write(
            &yaml,
            format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n\
                 \x20     requests_per_unit: {per_hour}\n      algorithm: sliding_window_log\n"
            ),
        )
        .expect("write yaml");
        let out = check_config(&toml);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        let expected = format!("warning: {}:5: d.k: ", yaml.display());
        let found = err.lines().any(|l| {
            l.starts_with(&expected) && l.contains("sliding_window_log with a limit of 5000")
        });
        assert_eq!(found, warned, "{per_hour} an hour: {err}");
        assert_eq!(err.contains("sliding_window_log"), warned, "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_rls_loads_the_grpc_service_and_checks_its_accounting() {
    let redis = RedisServer::start();
    // A store timeout far above a loaded machine's latency: the accounting is the point here,
    // and an answer failed open would be admitted past the limit.
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"",
        redis.url()
    );
    let (_gw, port) = start_gateway(&store, "");
    // Wait until the gRPC listener answers.
    let mut c = RateLimitServiceClient::new(channel(port).await);
    assert!(c.should_rate_limit(tenant("warm-up")).await.is_ok());
    let json = scratch("bench-rls.json");
    let output = tollgate()
        .args(["bench", "--rls", &format!("http://127.0.0.1:{port}")])
        .args(["--domain", "edge", "--descriptor", "tenant={client}"])
        .args([
            "--clients",
            "4",
            "--connections",
            "8",
            "--max-requests",
            "240",
        ])
        .args(["--duration", "30s", "--algorithm", "sliding_window_log"])
        .args(["--json", &json.display().to_string(), "--quiet"])
        .output()
        .expect("run tollgate bench");
    let report = bench_report(&output, &json);
    let u = |v: &serde_json::Value| v.as_u64().unwrap_or(u64::MAX);
    // 60 calls per client on a 50/hour limit: 50 OK and 10 OVER_LIMIT each.
    assert_eq!(u(&report["status"]["200"]), 200, "{}", report["status"]);
    assert_eq!(u(&report["status"]["429"]), 40, "{}", report["status"]);
    let accuracy = &report["accuracy"];
    assert_eq!(accuracy["source"], "header", "{accuracy}");
    assert_eq!(u(&accuracy["limits"][0]["limit"]), 50, "{accuracy}");
    assert_eq!(u(&accuracy["over_admission"]["total"]), 0, "{accuracy}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_rls_yaml_is_served_within_two_seconds_and_a_broken_one_is_refused() {
    let (gw, port) = start_gateway("", "");
    let mut rls = RateLimitServiceClient::new(channel(port).await);
    let limit_of = |r: &tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.statuses[0]
            .current_limit
            .as_ref()
            .map_or(0, |l| l.requests_per_unit)
    };
    let r = rls
        .should_rate_limit(tenant("a"))
        .await
        .expect("answers")
        .into_inner();
    assert_eq!(limit_of(&r), 50);
    assert_eq!(r.statuses[0].limit_remaining, 49);
    // The YAML file named in the gateway's config: rewrite it with another limit.
    let config = std::fs::read_to_string(&gw.config).expect("config");
    let path = config
        .lines()
        .find_map(|l| l.strip_prefix("config = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("rls config path")
        .to_string();
    std::fs::write(
        &path,
        YAML.replace("requests_per_unit: 50", "requests_per_unit: 80"),
    )
    .expect("rewrite yaml");
    let started = Instant::now();
    loop {
        let r = rls
            .should_rate_limit(tenant("a"))
            .await
            .expect("answers")
            .into_inner();
        if limit_of(&r) == 80 {
            // Same rule name, same key: the client's count carried over to the new quota.
            assert!(r.statuses[0].limit_remaining < 79, "{:?}", r.statuses[0]);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "not reloaded: {}",
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A broken YAML: refused, the old rules keep answering.
    std::fs::write(&path, "domain: edge\ndescriptors:\n  - key: [\n").expect("break yaml");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = rls
        .should_rate_limit(tenant("b"))
        .await
        .expect("answers")
        .into_inner();
    assert_eq!(limit_of(&r), 80);
    let metrics = get(&client(), &gw.admin_url("/metrics"), &[]).await.text();
    assert!(
        metrics.contains("tollgate_config_reloads_total{result=\"error\"} 1"),
        "{metrics}"
    );
    assert!(gw.log_text().contains("config reload refused"));
}

/// `[rls] merge_domains`, `quota_mode`, `dynamic_metadata` through `tollgate serve`: a domain
/// split across two files of a directory is served merged, every rule is in quota mode, the
/// answer carries dynamic metadata, and `/metrics` shows the detailed series. Without
/// `merge_domains`, check-config refuses the directory at the second file's `domain`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_merges_domains_in_quota_mode_with_dynamic_metadata_and_detailed_series() {
    let redis = RedisServer::start();
    let dir = scratch("rls-merged");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("a.yaml"),
        "domain: shop\ndescriptors:\n  - key: a\n    detailed_metric: true\n    metadata: {team: one}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .expect("a.yaml");
    std::fs::write(
        dir.join("b.yaml"),
        "domain: shop\ndescriptors:\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
    )
    .expect("b.yaml");
    let toml = scratch("rls-merged.toml");
    std::fs::write(
        &toml,
        format!(
            "[rls]\nlisten = \"127.0.0.1:18099\"\nconfig = \"{}\"\n",
            dir.display()
        ),
    )
    .expect("toml");
    let (ok, out) = run_check_config(&toml);
    assert!(!ok, "a split domain without merge_domains");
    assert!(
        out.contains(&format!("{}:1:", dir.join("b.yaml").display()))
            && out.contains(": domain:")
            && out.contains("merge_domains"),
        "{out}"
    );

    let rls_port = free_port();
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\n[identity]\nsecret = \"s\"\n\
         [rls]\nlisten = \"127.0.0.1:{rls_port}\"\nconfig = \"{}\"\nmerge_domains = true\n\
         quota_mode = true\ndynamic_metadata = true\n",
        redis.url(),
        dir.display()
    );
    let gw = Gateway::start("", &body);
    let mut client = RateLimitServiceClient::new(channel(rls_port).await);
    let d = |k: &str| RateLimitDescriptor {
        entries: vec![Entry {
            key: k.into(),
            value: "v".into(),
        }],
        ..Default::default()
    };
    let req = RateLimitRequest {
        domain: "shop".into(),
        descriptors: vec![d("a"), d("b")],
        hits_addend: 0,
    };
    let r = client
        .should_rate_limit(req.clone())
        .await
        .expect("answer")
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    let meta = r.dynamic_metadata.expect("dynamic_metadata");
    assert!(meta.fields.contains_key("metadata"), "{meta:?}");
    // `a` is now over, but both are quota descriptors and `b` is not: OK.
    let r = client
        .should_rate_limit(req)
        .await
        .expect("answer")
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[1].limit_remaining, 3);
    let http = support::client();
    let metrics = get(&http, &gw.admin_url("/metrics"), &[]).await.text();
    assert!(
        metrics.contains(
            "tollgate_rls_descriptor_decisions_total{key=\"shop.a_v\",outcome=\"limited\"} 1"
        ),
        "{metrics}"
    );
}

/// The gRPC port has the HTTP port's connection bounds: past `max_connections_per_ip` from
/// one address, a new connection is closed before a byte is read, another address is still
/// served, and a freed place is taken again (#26: the RLS listener had no bound at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_port_bounds_connections_per_address() {
    let redis = RedisServer::start();
    let store = format!("[store]\nbackend = \"redis\"\nurl = \"{}\"\n", redis.url());
    let (_gw, rls_port) = start_gateway_with("max_connections_per_ip = 4", &store, "");
    // Wait until the port answers gRPC, then hold the per-address places with idle
    // connections that sent the preface.
    drop(channel(rls_port).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", rls_port))
            .await
            .expect("connect");
        s.write_all(preface).await.expect("preface");
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A fifth from 127.0.0.1: closed at once (EOF, or a reset, before any answer).
    let mut fifth = tokio::net::TcpStream::connect(("127.0.0.1", rls_port))
        .await
        .expect("connect");
    let _ = fifth.write_all(preface).await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), fifth.read(&mut buf))
        .await
        .expect("the fifth is closed within 5 s");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed, not served: {read:?}"
    );
    // Another loopback address is its own: served.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.2:0".parse().expect("addr"))
        .expect("bind 127.0.0.2");
    let mut other = socket
        .connect(([127, 0, 0, 1], rls_port).into())
        .await
        .expect("connect from 127.0.0.2");
    other.write_all(preface).await.expect("preface");
    // The server's SETTINGS frame answers the preface.
    let n = tokio::time::timeout(Duration::from_secs(5), other.read(&mut buf))
        .await
        .expect("an answer within 5 s")
        .expect("read");
    assert!(n > 0, "127.0.0.2 is served");
    // A freed place is taken again: a gRPC call from 127.0.0.1 succeeds.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut client = RateLimitServiceClient::new(channel(rls_port).await);
    let r = client
        .should_rate_limit(tenant("t"))
        .await
        .expect("served again")
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
}

/// A connection to the gRPC port that sent the preface: `true` when the server answers it
/// (its SETTINGS frame), `false` when the connection is closed unanswered.
async fn preface_answered(port: u16) -> (bool, tokio::net::TcpStream) {
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let _ = s.write_all(preface).await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
    (matches!(read, Ok(Ok(n)) if n > 0), s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_port_follows_a_reloads_trusted_proxies() {
    let yaml = scratch("rls.yaml");
    std::fs::write(&yaml, YAML).expect("write yaml");
    let rls_port = free_port();
    let body = |trusted: &str| {
        format!(
            "[identity]\nsources = [\"header:x-api-key\"]\nsecret = \"rls-secret\"\n{trusted}\
             [rls]\nlisten = \"127.0.0.1:{rls_port}\"\nconfig = \"{}\"\n",
            yaml.display()
        )
    };
    let gw = Gateway::start("max_connections_per_ip = 2", &body(""));
    drop(channel(rls_port).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let (answered, s) = preface_answered(rls_port).await;
        assert!(answered, "within the per-address bound");
        held.push(s);
    }
    let (answered, _third) = preface_answered(rls_port).await;
    assert!(!answered, "a third from an untrusted address is closed");

    // 127.0.0.1 becomes a trusted proxy: exempt from the per-address bound from then on.
    gw.rewrite(&body("trusted_proxies = [\"127.0.0.1\"]\n"));
    gw.hangup();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (answered, s) = preface_answered(rls_port).await;
        if answered {
            held.push(s);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the reload's trusted proxies never reached the gRPC port; log:\n{}",
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (answered, _fourth) = preface_answered(rls_port).await;
    assert!(answered, "a trusted proxy keeps being admitted");
}
