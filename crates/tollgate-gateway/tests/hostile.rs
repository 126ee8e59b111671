//! Hostile clients against the real binary over raw sockets (DESIGN.md, "Hostile clients and
//! careless configs"): each test is one way around a limit or one way to hold resources, and
//! shows it closed.

mod support;

use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_tower::ProblemKind;

const WAIT: Duration = Duration::from_secs(5);

/// A policy on `/api`, one request per hour per client address.
fn api_once(match_extra: &str) -> String {
    format!(
        "[identity]\nsources = [\"ip\"]\ntrusted_proxies = [\"127.0.0.1\"]\n\
         [[policy]]\nname = \"api\"\nmatch = {{ path_prefix = \"/api\"{match_extra} }}\n\
         algorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\n"
    )
}

async fn metrics(gw: &Gateway) -> String {
    get(&client(), &gw.admin_url("/metrics"), &[]).await.text()
}

fn request(path: &str, headers: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: x\r\n{headers}connection: close\r\n\r\n").into_bytes()
}

/// Sends `bytes`, checks the answer's status code and returns the answer.
async fn expect_raw(gw: &Gateway, bytes: &[u8], code: u16) -> String {
    let answer = exchange(gw.port, bytes, WAIT).await;
    let want = format!("HTTP/1.1 {code}");
    let sent = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]);
    assert!(
        status_line(&answer).starts_with(&want),
        "{sent:?}: {answer}"
    );
    answer
}

/// Sends `path` with `headers` (raw lines), checks the status code and returns the answer.
async fn expect_status(gw: &Gateway, path: &str, headers: &str, code: u16) -> String {
    expect_raw(gw, &request(path, headers), code).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_copy_of_another_uri_header_does_not_escape_an_nginx_style_config() {
    let gw = Gateway::start(
        "forward_auth = { method_header = \"x-forwarded-method\", uri_header = \"x-original-uri\" }",
        &api_once(""),
    );
    // nginx sets X-Original-URI and passes on the X-Forwarded-Uri the client made up.
    let escape = "x-original-uri: /api/n\r\nx-forwarded-uri: /public\r\n";
    let first = expect_status(&gw, "/auth", escape, 200).await;
    assert!(first.contains("ratelimit-policy: \"api\""), "{first}");
    for _ in 0..3 {
        expect_status(&gw, "/auth", escape, 429).await;
    }
    // A URL in the query is not the path.
    let query = "x-original-uri: /api/n?next=http://h/public\r\n";
    expect_status(&gw, "/auth", query, 429).await;
    // Configured, the URI header is required; invalid or doubled ones are refused.
    let bad: [&[u8]; 6] = [
        b"",
        b"x-original-uri: public\r\n",
        b"x-original-uri: /api/\xff\r\n",
        b"x-original-uri: /a\r\nx-original-uri: /b\r\n",
        b"x-original-uri: /p\r\nx-forwarded-method: G(T\r\n",
        b"x-original-uri: /api%2Fn\r\n",
    ];
    for headers in bad {
        let mut req = b"GET /auth HTTP/1.1\r\nhost: x\r\nconnection: close\r\n".to_vec();
        req.extend_from_slice(headers);
        req.extend_from_slice(b"\r\n");
        expect_raw(&gw, &req, 400).await;
    }
    // Another method named by the proxy is read (no fallback to the sub-request's).
    let other = expect_status(
        &gw,
        "/auth",
        "x-original-uri: /public\r\nx-forwarded-method: POST\r\n",
        200,
    )
    .await;
    assert!(!other.contains("ratelimit"), "{other}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_forward_auth_written_a_trusted_request_is_matched_on_its_own_path() {
    let gw = Gateway::start("", &api_once(""));
    let own = expect_status(&gw, "/api/x", "", 200).await;
    assert!(own.contains("ratelimit-policy: \"api\""), "{own}");
    // The defaults are X-Forwarded-Uri / X-Forwarded-Method; X-Original-URI is not read.
    let other = expect_status(&gw, "/auth", "x-original-uri: /api/x\r\n", 200).await;
    assert!(!other.contains("ratelimit"), "{other}");
    expect_status(&gw, "/auth", "x-forwarded-uri: /api/y\r\n", 429).await;
    // An invalid method is refused, with or without a URI header: no fallback.
    for headers in [
        "x-forwarded-method: G(T\r\n",
        "x-forwarded-method: G(T\r\nx-forwarded-uri: /public\r\n",
    ] {
        expect_status(&gw, "/auth", headers, 400).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_paths_are_400_and_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let gw = Gateway::proxy(&up, "", &api_once(", case_insensitive = true"));
    for path in [
        "/api%2Fx",
        "/api%2fx",
        "/api%5Cx",
        "/api;x=1",
        "/api%00",
        "/api%20",
        "/api.",
        "/api%2E",
        "/api%252Fx",
        "/api/..%2F..%2Fsecret",
    ] {
        expect_status(&gw, path, "", 400).await;
    }
    // A raw backslash is refused too (by hyper's parser or by the normaliser).
    expect_status(&gw, "/api\\x", "", 400).await;
    assert_eq!(up.hits(), 0, "no ambiguous path reached the upstream");
    // /API is /api for this policy (case_insensitive), so the next /api request is limited.
    let upper = expect_status(&gw, "/API", "", 200).await;
    assert!(upper.contains("ratelimit-policy: \"api\""), "{upper}");
    for path in ["/api/x", "/%61pi", "//api/./", "/api/x/..", "/Api/%7Ex"] {
        expect_status(&gw, path, "", 429).await;
    }
    // A space inside a segment is an ordinary, different path.
    expect_status(&gw, "/api%20docs", "", 200).await;
    assert_eq!(up.hits(), 2);
    let m = metrics(&gw).await;
    // The raw backslash may be hyper's own 400, counted when its connection ends.
    assert!(responses(&m, 400) >= 10, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_paths_allow_matches_them_normalised() {
    let up = Upstream::start().await;
    let gw = Gateway::proxy(&up, "ambiguous_paths = \"allow\"", &api_once(""));
    // Passed on as written, matched in their normalised form.
    let answer = expect_status(&gw, "/api//x;v=1", "", 200).await;
    assert!(answer.contains("x-echo-uri: /api//x;v=1\r\n"), "{answer}");
    assert!(answer.contains("ratelimit-policy: \"api\""), "{answer}");
    expect_status(&gw, "/./api/a%2Fb", "", 429).await;
    // Outside the prefix by segment, so not this policy's.
    expect_status(&gw, "/api%2Fx", "", 200).await;
    assert_eq!(up.hits(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_header_sent_twice_is_400() {
    let gw = Gateway::start(
        "",
        "[identity]\nsources = [\"header:x-api-key\", \"ip\"]\n\
         [[policy]]\nname = \"k\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\n\
         [[policy]]\nname = \"u\"\nidentity = [\"header:x-user\"]\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1h\"\n",
    );
    for twice in [
        "x-api-key: random\r\nx-api-key: real\r\n",
        "x-user: a\r\nx-user: b\r\nx-api-key: k\r\n",
    ] {
        let answer = expect_status(&gw, "/", twice, 400).await;
        assert!(answer.contains("present more than once"), "{answer}");
        assert_eq!(
            raw_problem_type(&answer),
            ProblemKind::BadRequest.type_uri()
        );
    }
    expect_status(&gw, "/", "x-api-key: real\r\n", 200).await;
    expect_status(&gw, "/", "x-api-key: real\r\n", 429).await;
}

/// Whether the gateway closed `s` (EOF or reset) within `WAIT`.
async fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(WAIT, s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// Whether `s` answers a request with 200.
async fn serves(s: &mut TcpStream) -> bool {
    if s.write_all(&request("/", "")).await.is_err() {
        return false;
    }
    let mut got = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut got)).await;
    got.starts_with(b"HTTP/1.1 200")
}

/// A new connection to the gateway's listener.
async fn connect(gw: &Gateway) -> TcpStream {
    TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect")
}

/// Opens `bound` connections, checks that one more is closed at once, and returns the held ones.
async fn fill_to_the_bound(gw: &Gateway, bound: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..bound {
        held.push(connect(gw).await);
    }
    let mut excess = connect(gw).await;
    assert!(
        closed(&mut excess).await,
        "connection {} of {bound} allowed is closed",
        bound + 1
    );
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_per_address_bound_are_closed_at_once() {
    let gw = Gateway::start(
        "max_connections = 100\nmax_connections_per_ip = 3",
        "[[policy]]\nname = \"p\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"1h\"\n",
    );
    let mut held = fill_to_the_bound(&gw, 3).await;
    let mut first = held.remove(0);
    assert!(serves(&mut first).await, "admitted connections are served");
    drop(first);
    // The place is freed once the gateway sees the close (bounded retries).
    let deadline = Instant::now() + WAIT;
    let mut admitted = false;
    while Instant::now() < deadline && !admitted {
        let mut s = connect(&gw).await;
        admitted = serves(&mut s).await;
        if !admitted {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(admitted, "a freed place admits a new connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_holds_a_bounded_number_of_connections() {
    let gw = Gateway::start("", "");
    // All from one address: its share of the admin port's connections (the defaults of
    // server.admin_max_connections_per_ip and server.admin_max_connections: 16 of 64).
    let bound = 16;
    let mut held = Vec::new();
    for _ in 0..bound {
        held.push(
            TcpStream::connect(("127.0.0.1", gw.admin_port))
                .await
                .expect("connect"),
        );
    }
    let mut excess = TcpStream::connect(("127.0.0.1", gw.admin_port))
        .await
        .expect("connect");
    assert!(
        closed(&mut excess).await,
        "connection {} is closed",
        bound + 1
    );
    drop(held);
    // Places free up once the server sees the closes (bounded retries).
    let deadline = Instant::now() + WAIT;
    let mut ok = false;
    while Instant::now() < deadline && !ok {
        ok = raw(
            gw.admin_port,
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await
        .starts_with("HTTP/1.1 200");
        if !ok {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(ok, "the admin port serves again");
}

/// A connection to `port` from the loopback address `127.0.0.<host>`, holding a request
/// head it never finishes (`None` when the server closed it at once).
async fn partial_request_from(host: u8, port: u16) -> Option<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, host], 0)))
        .expect("bind a loopback address");
    let mut s = socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        .await
        .ok()?;
    let mut buf = [0u8; 1];
    match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
        Err(_) => Some(s),
        Ok(_) => None,
    }
}

/// Opens, from each of `hosts`, as many idle partial requests as `port` takes (up to
/// `per_host` each), and returns them.
async fn hold_partial_requests(
    hosts: std::ops::RangeInclusive<u8>,
    per_host: usize,
    port: u16,
) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for host in hosts {
        for _ in 0..per_host {
            if let Some(s) = partial_request_from(host, port).await {
                held.push(s);
            }
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_on_four_addresses_cannot_keep_healthz_from_answering() {
    let gw = Gateway::start("", "");
    // 16 idle partial requests from each of 4 addresses: 64, the admin port's whole bound.
    let held = hold_partial_requests(2..=5, 16, gw.admin_port).await;
    assert_eq!(held.len(), 56, "the last eighth is kept for new addresses");
    for _ in 0..3 {
        let answer = raw(
            gw.admin_port,
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    }
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_port_keeps_a_reserve_for_new_addresses_and_its_bounds_are_settings() {
    let gw = Gateway::start(
        "max_connections = 16\nmax_connections_per_ip = 4\n\
         admin_max_connections = 8\nadmin_max_connections_per_ip = 2",
        "[[policy]]\nname = \"p\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"1h\"\n",
    );
    let held = hold_partial_requests(2..=5, 4, gw.port).await;
    assert_eq!(held.len(), 14, "16 places, 2 kept for new addresses");
    let mut newcomer = connect(&gw).await;
    assert!(serves(&mut newcomer).await, "a new address is served");
    // The admin port's settings apply: 2 per address, 8 in all with 1 kept.
    let admin = hold_partial_requests(2..=5, 4, gw.admin_port).await;
    assert_eq!(admin.len(), 7, "{} admin connections held", admin.len());
    let answer = raw(
        gw.admin_port,
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    drop((held, admin));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_proxies_pass_the_per_address_bound_but_not_the_total() {
    let gw = Gateway::start(
        "max_connections = 4\nmax_connections_per_ip = 1",
        "[identity]\ntrusted_proxies = [\"127.0.0.1\"]\n\
         [[policy]]\nname = \"p\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"1h\"\n",
    );
    let mut held = fill_to_the_bound(&gw, 4).await;
    for s in &mut held {
        assert!(
            serves(s).await,
            "all four from one trusted address are served"
        );
    }
}

/// Whether `got` holds an answer's head and as much body as its `content-length` says.
fn whole_answer(got: &[u8]) -> bool {
    let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    got.len() >= end + 4 + length
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_cut_at_body_timeout_and_is_not_an_upstream_error() {
    let up = Upstream::start().await;
    let gw = Gateway::proxy(&up, "body_timeout = \"1s\"", "");
    let s = connect(&gw).await;
    let (mut rd, mut wr) = s.into_split();
    // 100 bytes at 10 bytes a second: never silent for long, 10 s in all.
    let trickle = tokio::spawn(async move {
        let head = b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n";
        if wr.write_all(head).await.is_err() {
            return;
        }
        for _ in 0..100 {
            if wr.write_all(b"x").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(8), async {
        let mut buf = [0u8; 1024];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            if whole_answer(&got) {
                break;
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&got);
    assert!(status_line(&text).starts_with("HTTP/1.1 408"), "{text}");
    assert_eq!(
        raw_problem_type(&text),
        ProblemKind::RequestTimeout.type_uri()
    );
    assert!(!trickle.is_finished(), "cut before the trickle ended");
    trickle.abort();
    let m = metrics(&gw).await;
    assert!(
        m.contains("tollgate_http_upstream_errors_total{kind=\"response\"} 0"),
        "{m}"
    );
    assert!(
        m.contains("tollgate_http_upstream_errors_total{kind=\"timeout\"} 0"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_client_cannot_write_the_forwarding_headers_the_upstream_reads() {
    let up = Upstream::start().await;
    let gw = Gateway::proxy(&up, "", "");
    let spoof = "x-forwarded-for: 6.6.6.6\r\nx-forwarded-proto: https\r\nx-forwarded-host: evil.example\r\nforwarded: for=6.6.6.6\r\nx-real-ip: 6.6.6.6\r\n";
    let answer = expect_status(&gw, "/", spoof, 200).await;
    for want in [
        "x-echo-xff: 127.0.0.1\r\n",
        "x-echo-xfp: http\r\n",
        "x-echo-xfh: x\r\n",
        "x-echo-forwarded: for=127.0.0.1;proto=http;host=\"x\"\r\n",
        "x-echo-real-ip: 127.0.0.1\r\n",
    ] {
        assert!(answer.contains(want), "{want:?} in {answer}");
    }
    assert!(
        !answer.contains("6.6.6.6") && !answer.contains("evil"),
        "{answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_chunks_connect_and_options_star_are_client_errors_not_upstream_ones() {
    let up = Upstream::start().await;
    let gw = Gateway::proxy(&up, "", "");
    let chunked = b"POST /up HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nxx\r\n0\r\n\r\n";
    let answer = expect_raw(&gw, chunked, 400).await;
    assert_eq!(
        raw_problem_type(&answer),
        ProblemKind::BadRequest.type_uri()
    );
    // The asterisk form on another method names no path to forward.
    let answer = expect_raw(&gw, b"PRI * HTTP/1.1\r\nhost: x\r\n\r\n", 400).await;
    assert_eq!(
        raw_problem_type(&answer),
        ProblemKind::BadRequest.type_uri()
    );
    for req in [
        &b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n"[..],
        b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n",
    ] {
        let answer = expect_raw(&gw, req, 405).await;
        assert_eq!(raw_problem_type(&answer), "about:blank");
        assert!(
            answer.contains("\r\nallow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS\r\n"),
            "{answer}"
        );
    }
    let m = metrics(&gw).await;
    for kind in ["connect", "response", "timeout"] {
        let line = format!("tollgate_http_upstream_errors_total{{kind=\"{kind}\"}} 0");
        assert!(m.contains(&line), "{line} in {m}");
    }
    assert_eq!(responses(&m, 502), 0, "{m}");
    assert_eq!(responses(&m, 405), 2, "{m}");
    assert!(responses(&m, 400) >= 1, "{m}");
}

/// A request whose head is exactly `len` bytes (one padding header), connection: close.
fn head_of(len: usize) -> Vec<u8> {
    let start = b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-pad: ".to_vec();
    let fixed = start.len() + 4;
    let mut head = start;
    head.extend(std::iter::repeat_n(b'a', len - fixed));
    head.extend_from_slice(b"\r\n\r\n");
    assert_eq!(head.len(), len);
    head
}

/// A request with `n` headers (host and connection among them), connection: close.
fn with_headers(n: usize) -> Vec<u8> {
    let mut head = b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n".to_vec();
    for i in 2..n {
        head.extend_from_slice(format!("x-h{i}: v\r\n").as_bytes());
    }
    head.extend_from_slice(b"\r\n");
    head
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_max_headers_is_431() {
    let gw = Gateway::start("", "");
    let max = tollgate_gateway::http::MAX_HEADERS;
    expect_raw(&gw, &with_headers(max), 200).await;
    expect_raw(&gw, &with_headers(max + 1), 431).await;
    let m = metrics(&gw).await;
    assert_eq!(responses(&m, 431), 1, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_limit_is_exact_and_refusals_are_counted() {
    let gw = Gateway::start("", "");
    expect_raw(&gw, &head_of(64 * 1024), 200).await;
    expect_raw(&gw, &head_of(64 * 1024 + 1), 431).await;
    expect_raw(&gw, &head_of(100 * 1000), 431).await;
    // Host: missing or doubled on HTTP/1.1 is 400; HTTP/1.0 needs none.
    for req in [
        &b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\nconnection: close\r\n\r\n",
    ] {
        let answer = expect_raw(&gw, req, 400).await;
        assert_eq!(
            raw_problem_type(&answer),
            ProblemKind::BadRequest.type_uri()
        );
        assert!(answer.contains("exactly one Host header"), "{answer}");
    }
    let old = exchange(gw.port, b"GET / HTTP/1.0\r\n\r\n", WAIT).await;
    assert!(status_line(&old).contains(" 200 "), "{old}");
    // hyper's own answers to heads it cannot parse are counted too.
    expect_raw(&gw, b"GARBAGE\r\n\r\n", 400).await;
    let mut long_uri = b"GET /".to_vec();
    long_uri.extend(std::iter::repeat_n(b'u', 70_000));
    long_uri.extend_from_slice(b" HTTP/1.1\r\nhost: x\r\n\r\n");
    let uri = exchange(gw.port, &long_uri, WAIT).await;
    let uri_status: u16 = status_line(&uri)
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    assert!(uri_status == 414 || uri_status == 431, "{uri}");
    // The counters are updated after the answer is written: poll briefly.
    let deadline = Instant::now() + WAIT;
    let mut m = metrics(&gw).await;
    while Instant::now() < deadline
        && (responses(&m, 400) < 3 || responses(&m, 431) + responses(&m, 414) < 3)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
        m = metrics(&gw).await;
    }
    assert_eq!(responses(&m, 400), 3, "{m}");
    assert_eq!(responses(&m, 431) + responses(&m, 414), 3, "{m}");
    assert!(responses(&m, uri_status) >= 1, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_gets_a_clean_505() {
    let gw = Gateway::start("", "");
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    let answer = expect_raw(&gw, preface, 505).await;
    assert_eq!(raw_problem_type(&answer), "about:blank");
    assert!(answer.contains("use HTTP/1.1"), "{answer}");
    let m = metrics(&gw).await;
    assert_eq!(responses(&m, 505), 1, "{m}");
    // An ordinary request that starts like the preface is unaffected.
    expect_raw(
        &gw,
        b"PUT / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        200,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ratelimit_policy_lists_a_bounded_number_of_policies() {
    let mut body = String::new();
    for i in 0..1_000 {
        body.push_str(&format!(
            "[[policy]]\nname = \"p{i}\"\nalgorithm = \"fixed_window\"\nlimit = {}\nperiod = \"1h\"\n",
            1000 + i
        ));
    }
    let gw = Gateway::start("", &body);
    let answer = expect_status(&gw, "/", "", 200).await;
    let header = answer
        .lines()
        .find_map(|l| l.strip_prefix("ratelimit-policy: "))
        .expect("RateLimit-Policy");
    assert_eq!(header.matches(";q=").count(), 16, "{header}");
    assert!(
        header.starts_with("\"p0\";q=1000;"),
        "most constrained first: {header}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_during_the_grace_period_exits_at_once() {
    // An upstream that accepts and never answers: the in-flight request would hold the
    // graceful shutdown for its whole 30 s.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    let (reached_tx, reached) = tokio::sync::oneshot::channel::<()>();
    let hold = tokio::spawn(async move {
        let mut conns = Vec::new();
        let mut reached_tx = Some(reached_tx);
        while let Ok((s, _)) = silent.accept().await {
            conns.push(s);
            if let Some(tx) = reached_tx.take() {
                let _ = tx.send(());
            }
        }
    });
    let mut gw = Gateway::start(
        &format!("upstream = \"http://{silent_addr}\"\nupstream_timeout = \"60s\""),
        "",
    );
    let port = gw.port;
    let in_flight = tokio::spawn(async move { exchange(port, &request("/", ""), WAIT * 12).await });
    // The request is in flight once the gateway has connected upstream.
    tokio::time::timeout(WAIT, reached)
        .await
        .expect("the request reached the upstream")
        .expect("upstream task alive");
    gw.terminate();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        gw.child.try_wait().ok().flatten().is_none(),
        "the first signal waits"
    );
    gw.terminate();
    let status = gw.wait_exit(Duration::from_secs(10));
    assert!(
        status.is_some(),
        "exited after the second signal: {}",
        gw.log_text()
    );
    assert!(gw.log_text().contains("second signal"), "{}", gw.log_text());
    in_flight.abort();
    hold.abort();
}

/// Reads from `s` until `got` holds `n` whole answers (or `WAIT` passes).
async fn read_answers(s: &mut TcpStream, got: &mut Vec<u8>, n: usize) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut buf = [0u8; 4096];
    while got.windows(15).filter(|w| w == b"HTTP/1.1 200 OK").count() < n || !whole_tail(got) {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return false,
        }
    }
    true
}

/// Whether the last answer in `got` is whole.
fn whole_tail(got: &[u8]) -> bool {
    let last = got.windows(9).rposition(|w| w == b"HTTP/1.1 ").unwrap_or(0);
    whole_answer(&got[last..])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_not_read_within_ten_seconds_closes_its_connection_and_each_answer_restarts_the_wait(
) {
    const TIMEOUT: Duration = Duration::from_secs(10);
    // The wait is kept in whole seconds by a sweeper: closed within two more (and slack for a
    // loaded machine).
    const LATEST: Duration = Duration::from_secs(20);
    let gw = Gateway::start("", "");
    let start = Instant::now();
    let mut partial = connect(&gw).await;
    partial
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("write");
    let kept = async {
        let mut s = connect(&gw).await;
        let mut got = Vec::new();
        let once = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
        s.write_all(once).await.expect("write");
        assert!(read_answers(&mut s, &mut got, 1).await, "first answer");
        // Six seconds idle, then more than ten seconds after the connection opened: the
        // wait began again with the answer.
        tokio::time::sleep(Duration::from_secs(6)).await;
        s.write_all(once).await.expect("write");
        assert!(read_answers(&mut s, &mut got, 2).await, "second answer");
        let answered = Instant::now();
        tollgate_testkit::net::closed_after(&mut s, answered, LATEST).await
    };
    let (partial_at, kept_idle) = tokio::join!(
        tollgate_testkit::net::closed_after(&mut partial, start, LATEST),
        kept
    );
    let partial_at = partial_at.expect("a partial head's connection is closed");
    assert!(partial_at >= TIMEOUT, "closed after {partial_at:?}");
    let kept_idle = kept_idle.expect("an idle kept-alive connection is closed");
    assert!(
        kept_idle >= TIMEOUT,
        "closed {kept_idle:?} after its last answer"
    );
}

/// Writes `n` bytes of empty lines (`\r\n`) in pieces of 256 bytes, 1 ms apart, as a client
/// trickling them would; false when the gateway stopped taking them.
async fn empty_lines(s: &mut TcpStream, n: usize) -> bool {
    let piece = b"\r\n".repeat(128);
    let mut left = n;
    while left > 0 {
        let k = left.min(piece.len());
        if s.write_all(&piece[..k]).await.is_err() {
            return false;
        }
        left -= k;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_lines_before_a_head_are_skipped_up_to_8_kib_and_past_it_close_the_connection() {
    // Skipped again on every read, 64 KiB of them cost hyper's server one to two seconds of
    // CPU (docs/benchmarks.md); decision mode's own loop, hyper's connections (proxy mode)
    // and the admin port are held to one bound.
    const BOUND: usize = 8 * 1024;
    let once = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
    let health = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n";
    let up = Upstream::start().await;
    let decision = Gateway::start("", "");
    let proxy = Gateway::proxy(&up, "", "");
    let ports: [(&str, u16, &[u8]); 3] = [
        ("decision", decision.port, once),
        ("proxy", proxy.port, once),
        ("admin", decision.admin_port, health),
    ];
    for (mode, port, once) in ports {
        let connect = || TcpStream::connect(("127.0.0.1", port));
        // Up to the bound before each of two requests on one connection: both answered.
        let mut s = connect().await.expect("connect");
        let mut got = Vec::new();
        for i in 1..=2 {
            assert!(empty_lines(&mut s, BOUND).await, "{mode}: taken");
            s.write_all(once).await.expect("write");
            assert!(
                read_answers(&mut s, &mut got, i).await,
                "{mode}: answer {i}"
            );
        }
        // Past it: closed without an answer, long before the header read timeout (10 s).
        let start = Instant::now();
        let mut s = connect().await.expect("connect");
        let _ = empty_lines(&mut s, BOUND + 2).await;
        let _ = s.write_all(once).await;
        let mut got = Vec::new();
        let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut got)).await;
        assert!(got.is_empty(), "{mode}: {}", String::from_utf8_lossy(&got));
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{mode}: {:?}",
            start.elapsed()
        );
    }
    // Empty lines behind a request that decision mode's loop hands over to hyper (it has a
    // body), read with it: they count towards the next head's bound, as hyper's own reads'.
    let mut s = TcpStream::connect(("127.0.0.1", decision.port))
        .await
        .expect("connect");
    let mut first = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nok".to_vec();
    first.extend_from_slice(&vec![b'\n'; BOUND - 100]);
    s.write_all(&first).await.expect("write");
    let mut got = Vec::new();
    assert!(read_answers(&mut s, &mut got, 1).await, "the POST's answer");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = s.write_all(&[b'\n'; 200]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = s.write_all(once).await;
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut got)).await;
    assert!(
        got.windows(15).filter(|w| w == b"HTTP/1.1 200 OK").count() < 2,
        "past the bound with the handed-over run: {}",
        String::from_utf8_lossy(&got)
    );
    // A body of empty lines is read while its request is served: not counted, and the
    // connection serves on.
    let mut s = connect(&proxy).await;
    let body = b"\r\n".repeat(BOUND);
    let head = format!(
        "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write");
    for piece in body.chunks(256) {
        s.write_all(piece).await.expect("write");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut got = Vec::new();
    assert!(read_answers(&mut s, &mut got, 1).await, "the POST's answer");
    s.write_all(once).await.expect("write");
    assert!(
        read_answers(&mut s, &mut got, 2).await,
        "the next request's"
    );
    let m = metrics(&proxy).await;
    assert!(!m.contains("code=\"500\""), "{m}");
}
