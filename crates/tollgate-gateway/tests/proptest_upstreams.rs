//! Upstream answers made up by proptest, written over raw TCP to the real binary in proxy
//! mode (its upstream connections are the gateway's own, `proxy/h1.rs`): whatever an
//! upstream writes (heads of odd shapes, conflicting framing, broken chunks, bytes that are
//! not HTTP), the client gets the upstream's answer or the gateway's 502, never a 500, and the
//! gateway keeps serving the next request whole. `PROPTEST_CASES` sets the number of answers
//! (default 48); e.g. `PROPTEST_CASES=2000 cargo nextest run -p tollgate-gateway --test
//! proptest_upstreams`.

mod support;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn cases() -> u32 {
    proptest_cases(48)
}

fn answer_status() -> impl Strategy<Value = Vec<u8>> {
    let known: &[&[u8]] = &[
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 201 Made",
        b"HTTP/1.1 204 No Content",
        b"HTTP/1.1 304 Not Modified",
        b"HTTP/1.1 404 Not Found",
        b"HTTP/1.1 503 Busy",
        b"HTTP/1.0 200 OK",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK",
        b"HTTP/1.1 101 Switching Protocols",
        b"HTTP/1.1 999 Odd",
        b"HTTP/1.1 20 OK",
        b"HTTP/2 200",
        b"HTTP/1.1 200",
        b"SSH-2.0-OpenSSH",
    ];
    any_of(known)
}

fn field() -> impl Strategy<Value = Vec<u8>> {
    let known: &[&[u8]] = &[
        b"content-length: 5",
        b"content-length: 0",
        b"content-length: 5, 5",
        b"content-length: 5, 6",
        b"content-length: -1",
        b"content-length: 18446744073709551616",
        b"Content-Length:5",
        b"transfer-encoding: chunked",
        b"transfer-encoding: gzip",
        b"transfer-encoding: chunked, gzip",
        b"Transfer-Encoding: CHUNKED",
        b"connection: close",
        b"connection: keep-alive, x-secret",
        b"x-secret: 1",
        b"keep-alive: timeout=1",
        b"trailer: x-cost",
        b"upgrade: websocket",
        b"x-cost: 3",
        b"content-type: text/plain",
        b"x-a: \xff\xfe",
        b"bad name: 1",
        b": empty",
        b"x-folded: a\r\n b",
    ];
    prop_oneof![
        known.len() as u32 => any_of(known),
        1 => "[a-z-]{1,12}: [ -~]{0,20}".prop_map(String::into_bytes),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let known: &[&[u8]] = &[
        b"hello",
        b"",
        b"5\r\nhello\r\n0\r\n\r\n",
        b"5;ext=1\r\nhello\r\n0\r\nx-cost: 2\r\n\r\n",
        b"zz\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhelloXX0\r\n\r\n",
        b"ffffffffffffffffff\r\n",
        b"3\r\nhel",
        b"hello and more than the length says",
    ];
    prop_oneof![
        known.len() as u32 => any_of(known),
        1 => proptest::collection::vec(any::<u8>(), 0..40),
    ]
}

/// An upstream answer: a status line, fields and a body, or (sometimes) any bytes at all.
fn answer() -> impl Strategy<Value = Vec<u8>> {
    let framed = (
        answer_status(),
        proptest::collection::vec(field(), 0..6),
        body(),
    )
        .prop_map(|(status, fields, body)| {
            let mut a = status;
            a.extend_from_slice(b"\r\n");
            for f in fields {
                a.extend_from_slice(&f);
                a.extend_from_slice(b"\r\n");
            }
            a.extend_from_slice(b"\r\n");
            a.extend_from_slice(&body);
            a
        });
    prop_oneof![
        8 => framed,
        1 => proptest::collection::vec(any::<u8>(), 0..200),
    ]
}

/// An upstream that answers each request head with the answer set last and then closes the
/// connection (so that an answer framed by its close ends), counting connections it ended.
struct Upstream {
    port: u16,
    answer: Arc<Mutex<Vec<u8>>>,
    ended: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let answer = Arc::new(Mutex::new(Vec::new()));
    let ended = Arc::new(AtomicUsize::new(0));
    let (a, e) = (answer.clone(), ended.clone());
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (a, e) = (a.clone(), e.clone());
            tokio::spawn(async move {
                let (mut got, mut buf) = (Vec::new(), [0u8; 1024]);
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let bytes = a.lock().map(|a| a.clone()).unwrap_or_default();
                let _ = s.write_all(&bytes).await;
                let _ = s.shutdown().await;
                drop(s);
                e.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    Upstream {
        port,
        answer,
        ended,
        task,
    }
}

impl Upstream {
    fn set(&self, bytes: &[u8]) {
        if let Ok(mut a) = self.answer.lock() {
            *a = bytes.to_vec();
        }
    }

    /// Waits (bounded) until `n` connections have ended.
    async fn ended(&self, n: usize) {
        for _ in 0..300 {
            if self.ended.load(Ordering::SeqCst) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[test]
fn whatever_an_upstream_answers_the_client_gets_it_or_a_502_and_the_gateway_serves_on() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let up = rt.block_on(upstream());
    let gw = Gateway::start(
        &format!(
            "upstream = \"http://127.0.0.1:{}\"\nupstream_timeout = \"2s\"",
            up.port
        ),
        "",
    );
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let done = AtomicUsize::new(0);
    let result = runner.run(&answer(), |bytes| {
        rt.block_on(async {
            let n = done.fetch_add(1, Ordering::SeqCst);
            up.set(&bytes);
            let got = exchange(
                gw.port,
                b"GET /fuzz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
                Duration::from_secs(5),
            )
            .await;
            let status = status_line(&got).to_owned();
            let shown = String::from_utf8_lossy(&bytes).into_owned();
            prop_assert!(!status.contains(" 500 "), "a 500 for {shown:?}: {got}");
            // Each exchange is one upstream connection, closed by the upstream: wait for it so
            // the next request does not race its close.
            up.ended(2 * n + 1).await;
            up.set(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
            let next = exchange(
                gw.port,
                b"GET /ok HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
                Duration::from_secs(5),
            )
            .await;
            prop_assert!(
                status_line(&next) == "HTTP/1.1 200 OK" && next.ends_with("\r\n\r\nok"),
                "after {shown:?} (answered {status:?}) the next request got: {next}"
            );
            up.ended(2 * n + 2).await;
            Ok::<(), TestCaseError>(())
        })
    });
    if let Err(e) = result {
        panic!("{e}\n{}", gw.log_text());
    }
    // A panic in a connection's task ends only that connection: the log shows it.
    let log = gw.log_text();
    assert!(!log.contains("panicked"), "{log}");
}
