//! Request heads made up by proptest, sent over raw TCP to the real binary in proxy mode
//! (in front of a healthy echo upstream): whatever a client writes, the answer is a status
//! it deserves (never a 500, never an upstream error blamed on a healthy upstream) and the
//! gateway keeps serving. `PROPTEST_CASES` sets the number of heads (default 64); e.g.
//! `PROPTEST_CASES=5000 cargo nextest run -p tollgate-gateway --test proptest_heads`.

mod support;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::time::Duration;
use support::*;

fn cases() -> u32 {
    proptest_cases(64)
}

fn method() -> impl Strategy<Value = Vec<u8>> {
    let known: &[&[u8]] = &[b"GET", b"POST", b"OPTIONS", b"CONNECT", b"PRI", b"HEAD"];
    prop_oneof![
        known.len() as u32 => any_of(known),
        1 => "[A-Z@(]{1,8}".prop_map(String::into_bytes),
    ]
}

fn target() -> impl Strategy<Value = Vec<u8>> {
    let known: &[&[u8]] = &[
        b"/",
        b"/api",
        b"..",
        b"%2F",
        b"%",
        b";x",
        b"\\",
        b"?q=1",
        b"*",
        b"http://h:1",
    ];
    let piece = prop_oneof![
        known.len() as u32 => any_of(known),
        1 => "[a-zA-Z0-9%._~-]{1,6}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 1..3),
    ];
    proptest::collection::vec(piece, 1..8).prop_map(|v| v.concat())
}

fn header() -> impl Strategy<Value = Vec<u8>> {
    let name = proptest::sample::select(
        &[
            "host",
            "x-api-key",
            "content-length",
            "transfer-encoding",
            "x-forwarded-for",
            "forwarded",
            "expect",
            "upgrade",
            "x-any",
        ][..],
    );
    let known: &[&[u8]] = &[b"chunked", b"0", b"5", b"-1", b"100-continue"];
    let value = prop_oneof![
        known.len() as u32 => any_of(known),
        1 => "[ -~]{0,20}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..12),
    ];
    (name, value).prop_map(|(n, v)| {
        let mut line = format!("{n}: ").into_bytes();
        line.extend(v);
        line.extend_from_slice(b"\r\n");
        line
    })
}

fn head() -> impl Strategy<Value = Vec<u8>> {
    let version = any_of(&[b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/9"]);
    let body = any_of(&[b"", b"hello", b"5\r\nhello\r\n0\r\n\r\n", b"zz\r\n"]);
    (
        method(),
        target(),
        version,
        proptest::collection::vec(header(), 0..6),
        body,
    )
        .prop_map(|(m, t, v, headers, body)| {
            let mut out = m;
            out.push(b' ');
            out.extend(t);
            out.push(b' ');
            out.extend(v);
            out.extend_from_slice(b"\r\nhost: x\r\n");
            for h in headers {
                out.extend(h);
            }
            out.extend_from_slice(b"connection: close\r\n\r\n");
            out.extend(body);
            out
        })
}

#[test]
fn no_request_head_gets_a_500_or_an_upstream_error() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let up = rt.block_on(Upstream::start());
    let gw = Gateway::proxy(
        &up,
        "body_timeout = \"1s\"\nupstream_timeout = \"5s\"",
        "[identity]\nsources = [\"header:x-api-key\", \"ip\"]\n\
         [[policy]]\nname = \"api\"\nmatch = { path_prefix = \"/api\" }\n\
         algorithm = \"gcra\"\nlimit = 1000000\nperiod = \"1s\"\n",
    );
    let mut runner = TestRunner::new(Config::with_cases(cases()));
    let result = runner.run(&head(), |bytes| {
        let answer = rt.block_on(exchange(gw.port, &bytes, Duration::from_secs(5)));
        let line = status_line(&answer).to_string();
        let code: u16 = line.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        let shown = String::from_utf8_lossy(&bytes).into_owned();
        if code >= 500 && code != 505 {
            return Err(TestCaseError::fail(format!("{line} for {shown:?}")));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}\n{}", gw.log_text());
    }
    let health = rt.block_on(get(&client(), &gw.admin_url("/healthz"), &[]));
    assert!(health.status.is_success());
    let m = rt
        .block_on(get(&client(), &gw.admin_url("/metrics"), &[]))
        .text();
    for kind in ["connect", "response", "timeout"] {
        let line = format!("tollgate_http_upstream_errors_total{{kind=\"{kind}\"}} 0");
        assert!(m.contains(&line), "{line} in {m}");
    }
    drop(gw);
    drop(up);
}
