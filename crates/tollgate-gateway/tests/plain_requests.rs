//! Decision mode's plain requests, answered without hyper (`src/http/plain.rs`), through the
//! real binary over raw TCP: requests of both kinds on one connection, written together, are
//! answered in order under one count; a head trickled a byte at a time is answered; a reload
//! to proxy mode reaches a connection kept alive since before it; a shutdown closes connections
//! waiting for their next head at once; and whatever head a client writes, followed by a plain
//! request, gets no 500 and leaves the gateway serving.

mod support;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Two requests an hour per `x-api-key`, by token bucket.
const TWO_AN_HOUR: &str = "[identity]\nsources = [\"header:x-api-key\"]\n\
     [[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 2\nperiod = \"1h\"\n";

/// The answers in `text`, each its status code and its head's lines, in order.
fn answers(text: &str) -> Vec<(u16, String)> {
    text.split("HTTP/1.1 ")
        .skip(1)
        .map(|a| {
            let code = a.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0);
            let head = a
                .split("\r\n\r\n")
                .next()
                .unwrap_or("")
                .to_ascii_lowercase();
            (code, head)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_written_together_are_answered_in_order_under_one_count() {
    let gw = Gateway::start("", TWO_AN_HOUR);
    // Plain, one with a body (hyper's from there on), plain again, a HEAD, and a last one that
    // closes: one key, so the first two are allowed and the rest refused, whoever answers.
    let k = "x-api-key: pipelined\r\nhost: x\r\n";
    let mut bytes = format!("GET /a HTTP/1.1\r\n{k}\r\n");
    // (A body that is no method: read as a head, it would be a 400.)
    bytes += &format!("POST /b HTTP/1.1\r\n{k}content-length: 7\r\n\r\n{{\"a\":1}}");
    bytes += &format!("GET /c HTTP/1.1\r\n{k}\r\n");
    bytes += &format!("HEAD /d HTTP/1.1\r\n{k}\r\n");
    bytes += &format!("GET /e HTTP/1.1\r\n{k}connection: close\r\n\r\n");
    let text = exchange(gw.port, bytes.as_bytes(), Duration::from_secs(10)).await;
    let got = answers(&text);
    let codes: Vec<u16> = got.iter().map(|a| a.0).collect();
    assert_eq!(codes, [200, 200, 429, 429, 429], "{text}");
    for (code, head) in &got {
        assert!(head.contains("\r\nratelimit: \"api\";r="), "{code}: {head}");
        assert!(head.contains("\r\ndate: "), "{code}: {head}");
        assert_eq!(*code == 429, head.contains("\r\nretry-after: "), "{head}");
    }
    assert!(got[0].1.contains("\"api\";r=1;"), "{}", got[0].1);
    assert!(got[1].1.contains("\"api\";r=0;"), "{}", got[1].1);
    assert!(got[4].1.contains("\r\nconnection: close"), "{}", got[4].1);
    let m = get(&client(), &gw.admin_url("/metrics"), &[]).await.text();
    assert_eq!(responses(&m, 200), 2, "{m}");
    assert_eq!(responses(&m, 429), 3, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_requests_written_at_once_get_every_answer_in_order() {
    let gw = Gateway::start("", TWO_AN_HOUR);
    // 3,000 small requests in one go (78 KB): more answers than the gateway keeps unwritten
    // (16 KiB), so they leave in several writes while the rest are still being decided.
    let one = "GET /p HTTP/1.1\r\nhost: x\r\nx-api-key: burst\r\n\r\n";
    let mut bytes = one.repeat(2_999);
    bytes += "GET /p HTTP/1.1\r\nhost: x\r\nx-api-key: burst\r\nconnection: close\r\n\r\n";
    let text = exchange(gw.port, bytes.as_bytes(), Duration::from_secs(30)).await;
    let codes: Vec<u16> = answers(&text).iter().map(|a| a.0).collect();
    assert_eq!(codes.len(), 3_000, "every request answered");
    assert_eq!(&codes[..2], [200, 200]);
    assert!(codes[2..].iter().all(|&c| c == 429), "then refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_trickled_a_byte_at_a_time_is_answered_and_the_connection_kept() {
    let gw = Gateway::start("", TWO_AN_HOUR);
    let mut s = TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let head = b"GET /slowly HTTP/1.1\r\nhost: x\r\nx-api-key: trickle\r\n\r\n";
    for b in head {
        s.write_all(&[*b]).await.expect("write");
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let first = read_answer(&mut s).await;
    assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{first}");
    assert!(first.contains("\"api\";r=1;"), "{first}");
    // The same connection serves the next one, whole at once.
    s.write_all(head).await.expect("write");
    let second = read_answer(&mut s).await;
    assert!(second.contains("\"api\";r=0;"), "{second}");
}

/// A new connection to `port` that has sent `request` and read its answer (see
/// [`read_answer`]): the connection, kept open, and the answer.
async fn asked(port: u16, request: &[u8]) -> (TcpStream, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(request).await.expect("write");
    let answer = read_answer(&mut s).await;
    (s, answer)
}

/// Reads one answer without a body (up to its blank line; at most 10 s).
async fn read_answer(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while !got.ends_with(b"\r\n\r\n") {
            match s.read(&mut byte).await {
                Ok(1) => got.push(byte[0]),
                _ => break,
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_proxy_mode_reaches_a_connection_kept_alive_from_before() {
    let up = Upstream::start().await;
    let body = "[identity]\nsources = [\"header:x-api-key\"]\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 100\nperiod = \"1h\"\n";
    let gw = Gateway::start("", body);
    let req = b"GET /kept HTTP/1.1\r\nhost: x\r\nx-api-key: kept\r\n\r\n";
    let (mut s, decided) = asked(gw.port, req).await;
    assert!(decided.starts_with("HTTP/1.1 200 OK\r\n"), "{decided}");
    assert!(!decided.contains("x-echo-method"), "{decided}");
    assert_eq!(up.hits(), 0);

    // The same file, now in front of the upstream.
    let text = format!("{}upstream = \"{}\"\n{body}", gw.head, up.url());
    std::fs::write(&gw.config, text).expect("rewrite");
    gw.hangup();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fresh = get(&client(), &gw.url("/probe"), &[("x-api-key", b"probe")]).await;
        if fresh.header("x-echo-method") == "GET" {
            break;
        }
        assert!(Instant::now() < deadline, "the reload was not applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = up.hits();
    s.write_all(req).await.expect("write");
    let mut proxied = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&proxied).contains("x-echo-method") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => proxied.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let proxied = String::from_utf8_lossy(&proxied).to_ascii_lowercase();
    assert!(proxied.starts_with("http/1.1 200 ok\r\n"), "{proxied}");
    assert!(proxied.contains("x-echo-uri: /kept"), "{proxied}");
    assert!(proxied.contains("ratelimit: \"api\";r="), "{proxied}");
    assert_eq!(up.hits(), before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_a_kept_alive_connection_waiting_for_its_next_head() {
    let mut gw = Gateway::start("", TWO_AN_HOUR);
    let one = b"GET /one HTTP/1.1\r\nhost: x\r\nx-api-key: idle\r\n\r\n";
    let (mut idle, answer) = asked(gw.port, one).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    // A second one, half sent: waiting for the rest of its head.
    let two = b"GET /two HTTP/1.1\r\nhost: x\r\nx-api-key: half\r\n\r\n";
    let (mut half, answer) = asked(gw.port, two).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    half.write_all(b"GET /three HTTP/1.1\r\nho")
        .await
        .expect("write");
    // Well before the header read timeout (10 s) could close either.
    gw.terminate_and_exit_within(Duration::from_secs(5));
    for s in [&mut idle, &mut half] {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "closed, not left open");
        assert!(rest.is_empty(), "nothing more written: {rest:?}");
    }
}

fn odd_head() -> impl Strategy<Value = Vec<u8>> {
    let method = proptest::sample::select(&["GET", "POST", "HEAD", "PUT", "G@T", "CONNECT"][..]);
    let target =
        proptest::sample::select(&["/", "/a?b=1", "*", "http://h/x", "%zz", "/\u{7f}"][..]);
    let version = proptest::sample::select(&["HTTP/1.1", "HTTP/1.0", "HTTP/2.0"][..]);
    let field = proptest::sample::select(
        &[
            "host: x",
            "host: y",
            "x-api-key: k",
            "x-api-key: k2",
            "content-length: 0",
            "content-length: 3",
            "content-length: -1",
            "transfer-encoding: chunked",
            "expect: 100-continue",
            "connection: keep-alive",
            "connection: close",
            "upgrade: h2c",
            "bad header",
            "x-bin: \u{1}",
        ][..],
    );
    let body = proptest::sample::select(&["", "abc", "0\r\n\r\n", "3\r\nabc\r\n0\r\n\r\n"][..]);
    (
        method,
        target,
        version,
        proptest::collection::vec(field, 0..6),
        body,
        any::<bool>(),
    )
        .prop_map(|(m, t, v, fields, body, whole)| {
            let mut out = format!("{m} {t} {v}\r\n");
            for f in fields {
                out += f;
                out += "\r\n";
            }
            out += "\r\n";
            out += body;
            let mut bytes = out.into_bytes();
            if !whole {
                // A head cut short: what follows completes it or makes it unparsable.
                bytes.truncate(bytes.len() / 2);
            }
            bytes
        })
}

#[test]
fn whatever_head_comes_first_no_answer_is_a_500_and_the_gateway_keeps_serving() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let gw = Gateway::start(
        "",
        "[identity]\nsources = [\"header:x-api-key\", \"ip\"]\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"gcra\"\nlimit = 1000000\nperiod = \"1s\"\n",
    );
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config::with_cases(cases));
    let result = runner.run(&odd_head(), |mut bytes| {
        // A plain request that closes follows, so every exchange ends.
        bytes.extend_from_slice(b"GET /last HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        let text = rt.block_on(exchange(gw.port, &bytes, Duration::from_secs(15)));
        let shown = String::from_utf8_lossy(&bytes).into_owned();
        for (code, head) in answers(&text) {
            if code >= 500 && code != 505 {
                return Err(TestCaseError::fail(format!("{code} {head} for {shown:?}")));
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}\n{}", gw.log_text());
    }
    let after = rt.block_on(get(
        &client(),
        &gw.url("/after"),
        &[("x-api-key", b"after")],
    ));
    assert_eq!(after.status, http::StatusCode::OK);
    let m = rt
        .block_on(get(&client(), &gw.admin_url("/metrics"), &[]))
        .text();
    assert_eq!(responses(&m, 500), 0, "{m}");
}
