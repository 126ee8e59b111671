//! `tollgate serve` end to end: the real binary, an upstream this test starts, real sockets.

mod support;

use http::{Method, StatusCode};
use std::time::Duration;
use support::*;
use tollgate_tower::ProblemKind;

const API_POLICY: &str = r#"
[[policy]]
name = "api"
match = { path_prefix = "/api" }
algorithm = "fixed_window"
limit = 3
period = "1h"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_requests_reach_the_upstream_intact_and_limited_ones_do_not() {
    let up = Upstream::start().await;
    let gw = Gateway::proxy(&up, "", API_POLICY);
    let c = client();
    let body = vec![b'x'; 1 << 20];
    for r in (0..3).rev() {
        let a = send(
            &c,
            Method::POST,
            &gw.url("/api/echo?a=1&b=%20"),
            &[
                ("x-custom", b"kept"),
                ("connection", b"keep-alive, x-hop"),
                ("x-hop", b"must not pass"),
            ],
            body.clone(),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        assert_eq!(a.body.len(), body.len());
        assert!(a.body.iter().all(|b| *b == b'x'));
        assert_eq!(a.header("x-echo-method"), "POST");
        assert_eq!(a.header("x-echo-uri"), "/api/echo?a=1&b=%20");
        assert_eq!(a.header("x-echo-custom"), "kept");
        assert_eq!(a.header("x-echo-hop"), "");
        assert_eq!(a.header("x-echo-xff"), "127.0.0.1");
        assert_eq!(
            a.header("x-echo-forwarded"),
            format!("for=127.0.0.1;proto=http;host=\"127.0.0.1:{}\"", gw.port)
        );
        assert_eq!(a.header("ratelimit-policy"), "\"api\";q=3;w=3600");
        assert!(
            a.header("ratelimit")
                .starts_with(&format!("\"api\";r={r};t=")),
            "{}",
            a.header("ratelimit")
        );
    }
    assert_eq!(up.hits(), 3);
    // A rejected request's body is never read: the 429 goes out at once and the connection
    // closes. A client still pushing a large body may then see a reset instead of the answer
    // (large uploads should send `Expect: 100-continue`), so this one sends a small body.
    let a = send(&c, Method::POST, &gw.url("/api/echo"), &[], &b"small"[..]).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.header("content-type"), "application/problem+json");
    let retry: u64 = a
        .header("retry-after")
        .parse()
        .expect("Retry-After is an integer");
    assert!((1..=3600).contains(&retry));
    let text = a.text();
    assert!(text.contains("#quota-exceeded\""), "{text}");
    assert!(text.contains("\"status\":429"), "{text}");
    assert!(text.contains("\"violated-policies\":[\"api\"]"), "{text}");
    assert!(text.contains(&format!("\"retry_after\":{retry}")), "{text}");
    // The body README.md shows, byte for byte: the contract.
    assert_eq!(
        text,
        format!(
            "{{\"type\":\"https://tollgate.dev/problems#quota-exceeded\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"Rate limit exceeded; retry after the number of seconds in Retry-After.\",\"violated-policies\":[\"api\"],\"retry_after\":{retry}}}"
        )
    );
    assert_eq!(a.header("ratelimit-policy"), "\"api\";q=3;w=3600");
    assert!(a.header("ratelimit").starts_with("\"api\";r=0;t="));
    assert_eq!(
        up.hits(),
        3,
        "a limited request must not reach the upstream"
    );
    // Paths no policy matches pass untouched, without RateLimit headers.
    let a = get(&c, &gw.url("/free"), &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("ratelimit"), "");
    assert_eq!(a.header("ratelimit-policy"), "");
    assert_eq!(up.hits(), 4);
    // The admin server reports the decisions.
    let m = get(&c, &gw.admin_url("/metrics"), &[]).await.text();
    assert!(
        m.contains("tollgate_decisions_total{policy=\"api\",outcome=\"allowed\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("tollgate_decisions_total{policy=\"api\",outcome=\"limited\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("tollgate_http_responses_total{code=\"429\"} 1"),
        "{m}"
    );
    assert_eq!(
        get(&c, &gw.admin_url("/readyz"), &[]).await.status,
        StatusCode::OK
    );
    let log = gw.log_text();
    assert!(log.contains("tollgate started"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_502_and_a_slow_one_504() {
    let dead = free_port();
    let gw = Gateway::start(&format!("upstream = \"http://127.0.0.1:{dead}\""), "");
    let c = client();
    let a = get(&c, &gw.url("/x"), &[]).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        a.problem_type(),
        ProblemKind::UpstreamUnavailable.type_uri()
    );
    let up = Upstream::start().await;
    let gw = Gateway::proxy(&up, "upstream_timeout = \"300ms\"", "");
    let a = get(&c, &gw.url("/slow"), &[]).await;
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(a.problem_type(), ProblemKind::UpstreamTimeout.type_uri());
    let m = get(&c, &gw.admin_url("/metrics"), &[]).await.text();
    assert!(
        m.contains("tollgate_http_upstream_errors_total{kind=\"timeout\"} 1"),
        "{m}"
    );
}

fn ip_policy(trusted: &str, extra_identity: &str) -> String {
    format!(
        "[identity]\nsources = [\"header:x-api-key\", \"ip\"]\ntrusted_proxies = [{trusted}]\n{extra_identity}\n\
         [[policy]]\nname = \"one\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\n"
    )
}

/// Sends `GET /` once per step, each with its one header, and checks each answer's status in turn.
async fn expect_statuses(gw: &Gateway, steps: &[(&str, &[u8], StatusCode)]) {
    let c = client();
    for (i, (name, value, want)) in steps.iter().enumerate() {
        let a = get(&c, &gw.url("/"), &[(*name, *value)]).await;
        assert_eq!(
            a.status,
            *want,
            "step {i}: {name}: {}",
            String::from_utf8_lossy(value)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_from_an_untrusted_peer_cannot_change_the_identity() {
    let gw = Gateway::start("", &ip_policy("\"10.0.0.0/8\"", ""));
    expect_statuses(
        &gw,
        &[
            ("x-forwarded-for", b"1.1.1.1", StatusCode::OK),
            ("x-forwarded-for", b"2.2.2.2", StatusCode::TOO_MANY_REQUESTS),
            ("forwarded", b"for=3.3.3.3", StatusCode::TOO_MANY_REQUESTS),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_from_a_trusted_proxy_is_the_identity() {
    let gw = Gateway::start("", &ip_policy("\"127.0.0.1\"", ""));
    expect_statuses(
        &gw,
        &[
            ("x-forwarded-for", b"1.1.1.1", StatusCode::OK),
            ("x-forwarded-for", b"9.9.9.9, 2.2.2.2", StatusCode::OK),
            ("x-forwarded-for", b"1.1.1.1", StatusCode::TOO_MANY_REQUESTS),
            // IPv6 addresses in one /64 are one client; the next /64 is another.
            ("x-forwarded-for", b"2001:db8::1", StatusCode::OK),
            (
                "x-forwarded-for",
                b"2001:db8::abcd:2",
                StatusCode::TOO_MANY_REQUESTS,
            ),
            ("x-forwarded-for", b"2001:db8:0:1::1", StatusCode::OK),
            // Only the configured header is read: Forwarded is ignored here.
            ("forwarded", b"for=7.7.7.7", StatusCode::OK),
            ("forwarded", b"for=8.8.8.8", StatusCode::TOO_MANY_REQUESTS),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_api_keys_are_two_clients_whatever_their_bytes() {
    let gw = Gateway::start("", &ip_policy("", ""));
    let c = client();
    let huge = vec![b'k'; 16 * 1024];
    for key in [
        &b"key-one"[..],
        b"key-two",
        b"\xff\xfe invalid utf-8 \xc3",
        &huge,
    ] {
        let a = get(&c, &gw.url("/"), &[("x-api-key", key)]).await;
        assert_eq!(a.status, StatusCode::OK, "first request of a key");
        let a = get(&c, &gw.url("/"), &[("x-api-key", key)]).await;
        assert_eq!(
            a.status,
            StatusCode::TOO_MANY_REQUESTS,
            "second request of a key"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decision_mode_behind_forward_auth_matches_the_original_request() {
    let body = format!(
        "{}\n[[policy]]\nname = \"writes\"\nmatch = {{ path_prefix = \"/api\", methods = [\"POST\"] }}\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1h\"\n",
        "[identity]\ntrusted_proxies = [\"127.0.0.1\"]"
    );
    let gw = Gateway::start("", &body);
    let c = client();
    let fwd = |m: &'static [u8], uri: &'static [u8]| {
        [("x-forwarded-method", m), ("x-forwarded-uri", uri)]
    };
    let a = get(&c, &gw.url("/auth"), &fwd(b"GET", b"/api/items")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("ratelimit"), "", "GET is not matched");
    let a = get(&c, &gw.url("/auth"), &fwd(b"POST", b"/api/items?x=1")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("ratelimit-policy"), "\"writes\";q=1;w=3600");
    let a = get(&c, &gw.url("/auth"), &fwd(b"POST", b"/api/other")).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.problem_type(), ProblemKind::QuotaExceeded.type_uri());
    let a = get(&c, &gw.url("/auth"), &fwd(b"POST", b"/public")).await;
    assert_eq!(a.status, StatusCode::OK);
    // A forward-auth URI that is not a path: the same 400 problem as any ambiguous request.
    let a = get(&c, &gw.url("/auth"), &fwd(b"POST", b"api/items")).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
    assert_eq!(a.problem_type(), ProblemKind::BadRequest.type_uri());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_4xx_never_a_500_nor_a_crash() {
    let gw = Gateway::start("", &ip_policy("", ""));
    let mut key = b"GET / HTTP/1.1\r\nhost: x\r\nx-api-key: ".to_vec();
    key.extend(std::iter::repeat_n(b'a', 1 << 20));
    key.extend_from_slice(b"\r\n\r\n");
    let line = raw(gw.port, &key).await;
    // The gateway answers 431 once the head passes its bound and closes the connection; with
    // most of the megabyte still unread on its side the close can be a reset that discards
    // the answer before the client reads it. Either way: no 2xx, no 5xx, no crash.
    assert!(
        line.starts_with("HTTP/1.1 431") || line.starts_with("HTTP/1.1 400") || line.is_empty(),
        "{line:?}"
    );
    let line = raw(gw.port, b"GARBAGE\r\n\r\n").await;
    assert!(line.starts_with("HTTP/1.1 400"), "{line:?}");
    let line = raw(gw.port, b"GET / HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n").await;
    assert!(line.starts_with("HTTP/1.1 400"), "{line:?}");
    let mut many = b"GET / HTTP/1.1\r\nhost: x\r\n".to_vec();
    for i in 0..500 {
        many.extend_from_slice(format!("x-h{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let line = raw(gw.port, &many).await;
    assert!(
        line.starts_with("HTTP/1.1 431") || line.starts_with("HTTP/1.1 400"),
        "{line:?}"
    );
    let line = raw(
        gw.port,
        b"GET / HTTP/1.1\r\nhost: x\r\nx-api-key: \xff\xfe\x80\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(line.starts_with("HTTP/1.1 200"), "{line:?}");
    let line = raw(
        gw.port,
        b"GET /%zz/../..//?\xff HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(
        line.starts_with("HTTP/1.1 4") || line.starts_with("HTTP/1.1 200"),
        "{line:?}"
    );
    // Still serving.
    let a = get(&client(), &gw.url("/"), &[("x-api-key", b"after")]).await;
    assert_eq!(a.status, StatusCode::OK);
    let m = get(&client(), &gw.admin_url("/metrics"), &[]).await.text();
    assert!(!m.contains("code=\"500\""), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_requests_finish() {
    let up = Upstream::start().await;
    let mut gw = Gateway::proxy(&up, "", "");
    let c = client();
    let url = gw.url("/slow");
    let in_flight = tokio::spawn(async move { get(&c, &url, &[]).await.status });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while up.hits() == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.terminate();
    assert_eq!(in_flight.await.expect("task"), StatusCode::OK);
    let status = gw
        .wait_exit(Duration::from_secs(10))
        .expect("exits after draining");
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_connections_that_sent_nothing_yet_without_waiting_for_them() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Decision mode on the embedded store: nothing is in flight.
    let mut gw = Gateway::start("", API_POLICY);
    // Connections a load balancer opens ahead of need: silent, and one with half an HTTP/2
    // preface (the opening waits for the rest).
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect");
    let mut partial = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect");
    partial.write_all(b"PRI * HT").await.expect("write");
    // Answered on a third connection: the two before it were accepted.
    let answer = raw(
        gw.port,
        b"GET /api HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Well before the opening's own wait (the header read timeout, 10 s) could end.
    gw.terminate_and_exit_within(Duration::from_secs(5));
    for s in [&mut silent, &mut partial] {
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "closed without an answer: {read:?}"
        );
    }
}

fn check_config(text: &str) -> (i32, String) {
    let path = support::scratch("check.toml");
    std::fs::write(&path, text).expect("write config");
    let out = tollgate()
        .arg("check-config")
        .arg(&path)
        .output()
        .expect("run check-config");
    let stderr = String::from_utf8_lossy(&out.stderr).replace(&path.display().to_string(), "FILE");
    (out.status.code().unwrap_or(-1), stderr)
}

#[test]
fn check_config_names_file_line_and_key_and_exits_2() {
    let (code, err) = check_config("[[policy]]\nname = \"a\"\nalgoritm = \"gcra\"\n");
    assert_eq!(code, 2);
    assert!(
        err.starts_with("error: FILE:3:1: policy[0].algoritm: unknown field `algoritm`"),
        "{err}"
    );
    let (code, err) = check_config(
        "[[policy]]\nname = \"a\"\nalgorithm = \"token_bucket\"\nlimit = -1\nperiod = \"1m\"\n",
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("FILE:4:9: policy[0].limit: must be a positive integer"),
        "{err}"
    );
    let (code, err) = check_config(
        "[[policy]]\nname = \"a\"\nalgorithm = \"sliding_door\"\nlimit = 1\nperiod = \"1m\"\n",
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("FILE:3:13: policy[0].algorithm: is not an algorithm; expected one of"),
        "{err}"
    );
    let (code, _) = check_config(
        "[[policy]]\nname = \"a\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1m\"\n",
    );
    assert_eq!(code, 0);
    // serve refuses a bad config the same way, without starting.
    let path = support::scratch("bad.toml");
    std::fs::write(&path, "[server]\nlisten = \"nowhere\"\n").expect("write config");
    let out = tollgate()
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .expect("run serve");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(":2:10: server.listen:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_store_is_503_for_closed_policies_and_allowed_for_open_ones_never_500() {
    let dead = free_port();
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{dead}\"\ntimeout = \"200ms\"\n\
         [[policy]]\nname = \"login\"\nmatch = {{ path_prefix = \"/login\" }}\non_failure = \"closed\"\n\
         algorithm = \"gcra\"\nlimit = 5\nperiod = \"1m\"\n\
         [[policy]]\nname = \"reads\"\nmatch = {{ path_prefix = \"/read\" }}\non_failure = \"open\"\n\
         algorithm = \"gcra\"\nlimit = 5\nperiod = \"1m\"\n"
    );
    let gw = Gateway::start("", &body);
    let c = client();
    for _ in 0..8 {
        let a = get(&c, &gw.url("/login"), &[]).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", a.text());
        let retry: u64 = a.header("retry-after").parse().expect("Retry-After");
        assert!(retry >= 1);
        assert_eq!(a.problem_type(), ProblemKind::StoreUnavailable.type_uri());
        let a = get(&c, &gw.url("/read"), &[]).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    assert_eq!(
        get(&c, &gw.admin_url("/readyz"), &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let m = get(&c, &gw.admin_url("/metrics"), &[]).await.text();
    assert!(
        m.contains("tollgate_decisions_total{policy=\"login\",outcome=\"failed_closed\"} 8"),
        "{m}"
    );
    assert!(
        m.contains("tollgate_decisions_total{policy=\"reads\",outcome=\"failed_open\"} 8"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_policies_count_but_never_reject_and_cost_charges_units() {
    let body = "[[policy]]\nname = \"dry\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nshadow = true\n\
                [[policy]]\nname = \"heavy\"\nmatch = { path_prefix = \"/export\" }\nalgorithm = \"token_bucket\"\nlimit = 4\nperiod = \"1h\"\ncost = 2\n";
    let gw = Gateway::start("", body);
    let c = client();
    for _ in 0..3 {
        let a = get(&c, &gw.url("/"), &[]).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(
            a.header("ratelimit-policy"),
            "",
            "shadow policies are not advertised"
        );
    }
    for r in [2, 0] {
        let a = get(&c, &gw.url("/export"), &[]).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.header("ratelimit-policy"), "\"heavy\";q=4;w=3600");
        assert!(
            a.header("ratelimit")
                .starts_with(&format!("\"heavy\";r={r};")),
            "{}",
            a.header("ratelimit")
        );
    }
    let a = get(&c, &gw.url("/export"), &[]).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(a.text().contains("[\"heavy\"]"), "{}", a.text());
    let m = get(&c, &gw.admin_url("/metrics"), &[]).await.text();
    assert!(
        m.contains("tollgate_decisions_total{policy=\"dry\",outcome=\"shadow_limited\"} 5"),
        "{m}"
    );
}

/// The gateway turns transparent huge pages off for itself (main.rs says what they cost):
/// the kernel reports it per process, whatever the host's setting.
#[cfg(target_os = "linux")]
/// `TOKIO_WORKER_THREADS` sets how many worker threads serve (gateways sharing a machine each
/// take a few), and a value that is not a thread count is refused before anything is served.
#[test]
fn tokio_worker_threads_sets_the_workers_and_a_bad_value_is_refused() {
    let gw = Gateway::start_env("", API_POLICY, &[("TOKIO_WORKER_THREADS", "3")]);
    let tasks = std::fs::read_dir(format!("/proc/{}/task", gw.child.id())).expect("tasks");
    let workers = tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .filter(|comm| comm.starts_with("tokio-r"))
        .count();
    assert_eq!(workers, 3, "worker threads of tollgate serve");
    drop(gw);

    let config = support::scratch("workers.toml");
    let (port, admin) = (free_port(), free_port());
    let head =
        format!("[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n");
    std::fs::write(&config, format!("{head}{API_POLICY}")).expect("write");
    let out = support::tollgate()
        .args(["serve", "--config"])
        .arg(&config)
        .env("TOKIO_WORKER_THREADS", "0")
        .output()
        .expect("run tollgate serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with 0 workers: {err}");
    assert!(
        err.contains("TOKIO_WORKER_THREADS") && err.contains("1 to 1024"),
        "{err}"
    );
}

#[test]
fn serve_runs_without_transparent_huge_pages() {
    let gw = Gateway::start("", API_POLICY);
    let status = std::fs::read_to_string(format!("/proc/{}/status", gw.child.id()))
        .expect("read /proc/PID/status");
    let thp = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(str::trim);
    // Kernels before 5.0 have no THP_enabled line; every kernel that has one reports 0 here.
    if let Some(v) = thp {
        assert_eq!(v, "0", "THP left on for tollgate serve:\n{status}");
    } else {
        eprintln!("this kernel reports no THP_enabled; nothing to check");
    }
}
