//! Proxy mode against upstreams that misbehave in the ways real ones do: the real binary,
//! upstreams this test starts on loopback, and what the upstream saw (its connections) as
//! well as what the client got.

mod support;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_tower::ProblemKind;

const WAIT: Duration = Duration::from_secs(10);

/// Counts of an upstream's connections.
#[derive(Default)]
struct Counts {
    accepted: AtomicUsize,
    ended: AtomicUsize,
}

/// A loopback upstream; its accept loop stops on drop.
struct Up {
    addr: SocketAddr,
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Up {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Up {
    /// Serves every accepted connection with `conn`, counting connections.
    async fn start<F, Fut>(conn: F) -> Up
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                c.accepted.fetch_add(1, Ordering::SeqCst);
                let (c, served) = (c.clone(), conn(stream));
                tokio::spawn(async move {
                    served.await;
                    c.ended.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Up { addr, counts, task }
    }

    /// A hyper upstream: `/stream` answers with the request's own body as it arrives,
    /// `/hang` answers `late` after 2 s, anything else `fast`.
    async fn hyper() -> Up {
        Up::start(|stream| async move {
            let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                let path = req.uri().path().to_string();
                let body: BoxBody<Bytes, hyper::Error> = match path.as_str() {
                    "/stream" => req.into_body().boxed(),
                    "/hang" => {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        full("late")
                    }
                    _ => full("fast"),
                };
                Ok::<_, Infallible>(Response::new(body))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        })
        .await
    }

    fn accepted(&self) -> usize {
        self.counts.accepted.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until `n` connections have ended; returns how many have.
    async fn ended(&self, n: usize) -> usize {
        for _ in 0..500 {
            if self.counts.ended.load(Ordering::SeqCst) >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.counts.ended.load(Ordering::SeqCst)
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn full(text: &'static str) -> BoxBody<Bytes, hyper::Error> {
    Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never| match never {})
        .boxed()
}

/// Reads one request head from `stream` (requests here have no body); false at EOF.
async fn read_head(stream: &mut TcpStream) -> bool {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    true
}

fn proxy_to(up: &Up, server_extra: &str) -> Gateway {
    Gateway::start(&format!("upstream = \"{}\"\n{server_extra}", up.url()), "")
}

async fn metrics(gw: &Gateway) -> String {
    get(&client(), &gw.admin_url("/metrics"), &[]).await.text()
}

fn upstream_errors(m: &str, kind: &str) -> u64 {
    let key = format!("tollgate_http_upstream_errors_total{{kind=\"{kind}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(u64::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_reused_across_requests_and_client_connections() {
    let up = Up::hyper().await;
    let gw = proxy_to(&up, "");
    let c = client();
    for _ in 0..10 {
        let a = get(&c, &gw.url("/a"), &[]).await;
        assert_eq!((a.status, a.text().as_str()), (StatusCode::OK, "fast"));
        let a = send(&c, Method::HEAD, &gw.url("/a"), &[], Bytes::new()).await;
        assert_eq!((a.status, a.body.len()), (StatusCode::OK, 0));
        let a = send(
            &c,
            Method::POST,
            &gw.url("/stream"),
            &[],
            vec![b'x'; 70_000],
        )
        .await;
        assert_eq!((a.status, a.body.len()), (StatusCode::OK, 70_000));
    }
    // A new client connection for every request.
    for _ in 0..10 {
        let a = get(&client(), &gw.url("/a"), &[]).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    // Each response ended before the client had it, giving its connection back first.
    assert_eq!(up.accepted(), 1, "{}", gw.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_closing_idle_connections_between_requests_fails_no_request() {
    // Answers one request per connection and closes it, without `Connection: close`: what
    // an upstream's short keep-alive timeout looks like to a pooled connection.
    let up = Up::start(|mut s| async move {
        if read_head(&mut s).await {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await;
        }
    })
    .await;
    let gw = proxy_to(&up, "");
    let c = client();
    for i in 1..=5 {
        let a = get(&c, &gw.url("/"), &[]).await;
        assert_eq!((a.status, a.text().as_str()), (StatusCode::OK, "ok"), "{i}");
        assert_eq!(up.ended(i).await, i);
    }
    assert_eq!(up.accepted(), 5);
    let m = metrics(&gw).await;
    assert_eq!(upstream_errors(&m, "response"), 0, "{m}");
    assert_eq!(responses(&m, 502), 0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_hangs_up_or_answers_garbage_is_502() {
    let silent = Up::start(|mut s| async move {
        let _ = read_head(&mut s).await;
    })
    .await;
    let garbage = Up::start(|mut s| async move {
        if read_head(&mut s).await {
            let _ = s.write_all(b"this is not HTTP\r\n\r\n").await;
        }
    })
    .await;
    for up in [&silent, &garbage] {
        let gw = proxy_to(up, "");
        let a = get(&client(), &gw.url("/"), &[]).await;
        assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{}", a.text());
        assert_eq!(
            a.problem_type(),
            ProblemKind::UpstreamUnavailable.type_uri()
        );
        let m = metrics(&gw).await;
        assert_eq!(upstream_errors(&m, "response"), 1, "{m}");
        assert_eq!(upstream_errors(&m, "connect"), 0, "{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_by_the_upstream_is_cut_for_the_client_and_its_connection_not_reused() {
    let up = Up::start(|mut s| async move {
        if read_head(&mut s).await {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
                .await;
        }
    })
    .await;
    let gw = proxy_to(&up, "");
    for i in 1..=2 {
        // The head is committed, so the client sees the connection close before the body's
        // end (hyper's server may drop the part it had not flushed yet).
        let got = exchange(gw.port, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", WAIT).await;
        let body = got.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        assert!(
            got.is_empty() || (status_line(&got).starts_with("HTTP/1.1 200") && body.len() < 100),
            "{got}"
        );
        assert_eq!(up.accepted(), i, "a broken connection is never reused");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_upstream_request_is_504_and_its_late_answer_reaches_no_one() {
    let up = Up::hyper().await;
    let gw = proxy_to(&up, "upstream_timeout = \"300ms\"");
    let c = client();
    let a = get(&c, &gw.url("/hang"), &[]).await;
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(a.problem_type(), ProblemKind::UpstreamTimeout.type_uri());
    // Were the timed-out connection used again, the next answer on it would be `late`.
    for _ in 0..5 {
        let a = get(&c, &gw.url("/fast"), &[]).await;
        assert_eq!((a.status, a.text().as_str()), (StatusCode::OK, "fast"));
    }
    let m = metrics(&gw).await;
    assert_eq!(upstream_errors(&m, "timeout"), 1, "{m}");
}

/// Reads from `s` into `got` until it holds `want` (bounded); whether it does.
async fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, want: &[u8]) -> bool {
    let mut buf = [0u8; 4096];
    let found = |got: &[u8]| got.windows(want.len()).any(|w| w == want);
    let _ = tokio::time::timeout(WAIT, async {
        while !found(got) {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    found(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_response_bodies_stream_through_piece_by_piece() {
    // The upstream echoes the request body as it arrives; the client sends its next piece
    // only after the previous one came back. A proxy that waited for either whole body
    // would never answer.
    let up = Up::hyper().await;
    let gw = proxy_to(&up, "");
    let mut s = TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect");
    s.write_all(b"POST /stream HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .expect("head");
    let mut got = Vec::new();
    for piece in ["first-piece", "second-piece", "third-piece"] {
        let chunk = format!("{:x}\r\n{piece}\r\n", piece.len());
        s.write_all(chunk.as_bytes()).await.expect("chunk");
        assert!(
            read_until(&mut s, &mut got, piece.as_bytes()).await,
            "{piece} came back before the body ended: {}",
            String::from_utf8_lossy(&got)
        );
    }
    s.write_all(b"0\r\n\r\n").await.expect("last chunk");
    assert!(read_until(&mut s, &mut got, b"\r\n0\r\n\r\n").await);
    assert!(got.starts_with(b"HTTP/1.1 200"));
    assert_eq!(up.accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_request_without_host_reaches_the_upstream_with_its_authority() {
    let up = Upstream::start().await;
    let gw = Gateway::proxy(&up, "", "");
    let got = exchange(gw.port, b"GET /h HTTP/1.0\r\n\r\n", WAIT).await;
    assert!(status_line(&got).ends_with(" 200 OK"), "{got}");
    let want = format!("x-echo-host: {}\r\n", up.addr);
    assert!(got.contains(&want), "{want:?} in {got}");
}

/// An upstream written byte by byte: each request's answer is the raw response its path
/// names (see [`raw_answer`]); `/close` answers and closes.
async fn raw_upstream() -> Up {
    Up::start(|mut s| async move {
        let (mut got, mut buf) = (Vec::new(), [0u8; 1024]);
        loop {
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
                continue;
            };
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            got.drain(..end + 4);
            let path = head.split(' ').nth(1).unwrap_or("/").to_string();
            if s.write_all(&raw_answer(&path)).await.is_err() || path == "/close" {
                return;
            }
        }
    })
    .await
}

/// The response an upstream of [`raw_upstream`] writes for `path`.
fn raw_answer(path: &str) -> Vec<u8> {
    match path {
        "/chunked" => b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;ext=1\r\nhel\r\n2\r\nlo\r\n0\r\nx-trailer: 1\r\n\r\n".to_vec(),
        "/interim" => b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello".to_vec(),
        "/reason" => b"HTTP/1.1 200 Fine Indeed\r\ncontent-length: 5\r\n\r\nhello".to_vec(),
        "/close" => b"HTTP/1.1 200 OK\r\n\r\nhello".to_vec(),
        "/big-head" => {
            let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
            while head.len() < 600 * 1024 {
                head.extend_from_slice(format!("x-{}: {}\r\n", head.len(), "v".repeat(4000)).as_bytes());
            }
            head.extend_from_slice(b"content-length: 5\r\n\r\nhello");
            head
        }
        "/many-fields" => {
            let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
            for i in 0..101 {
                head.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
            }
            head.extend_from_slice(b"content-length: 5\r\n\r\nhello");
            head
        }
        "/bad-chunk" => b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n".to_vec(),
        "/two-lengths" => b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello".to_vec(),
        _ => b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello".to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_framing_an_upstream_may_use_reaches_the_client_and_only_framed_ones_are_reused() {
    let up = raw_upstream().await;
    let gw = proxy_to(&up, "");
    let c = client();
    // By length, chunked (extensions and trailers dropped from the data), after interim
    // answers: one connection serves them all.
    for path in ["/length", "/chunked", "/interim", "/length"] {
        let a = get(&c, &gw.url(path), &[]).await;
        assert_eq!(
            (a.status, a.text().as_str()),
            (StatusCode::OK, "hello"),
            "{path}"
        );
    }
    assert_eq!(up.accepted(), 1, "framed answers keep the connection");
    // A reason phrase of the upstream's own reaches the client as it was.
    let got = exchange(
        gw.port,
        b"GET /reason HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        WAIT,
    )
    .await;
    assert_eq!(status_line(&got), "HTTP/1.1 200 Fine Indeed", "{got}");
    // Up to the close: the whole body, and the connection is not used again.
    let a = get(&c, &gw.url("/close"), &[]).await;
    assert_eq!((a.status, a.text().as_str()), (StatusCode::OK, "hello"));
    let before = up.accepted();
    let a = get(&c, &gw.url("/length"), &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        up.accepted(),
        before + 1,
        "a connection ended by its close is not reused"
    );
    let m = metrics(&gw).await;
    assert_eq!(upstream_errors(&m, "response"), 0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_s_oversized_or_malformed_answer_is_502_or_cut_and_the_gateway_serves_on() {
    let up = raw_upstream().await;
    let gw = proxy_to(&up, "");
    let c = client();
    // Heads past hyper's client's bounds (bytes, fields) and lengths that disagree: 502,
    // counted as the upstream's fault.
    for (i, path) in ["/big-head", "/many-fields", "/two-lengths"]
        .into_iter()
        .enumerate()
    {
        let a = get(&c, &gw.url(path), &[]).await;
        assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{path}: {}", a.text());
        let m = metrics(&gw).await;
        assert_eq!(upstream_errors(&m, "response"), i as u64 + 1, "{path}: {m}");
    }
    // A chunked body whose framing breaks after its head: the client's answer is cut (the
    // head was sent), and that connection is never used again.
    let got = exchange(gw.port, b"GET /bad-chunk HTTP/1.1\r\nhost: x\r\n\r\n", WAIT).await;
    assert!(
        got.is_empty()
            || (status_line(&got) == "HTTP/1.1 200 OK" && !got.ends_with("\r\n0\r\n\r\n")),
        "{got}"
    );
    let before = up.accepted();
    for _ in 0..3 {
        let a = get(&c, &gw.url("/length"), &[]).await;
        assert_eq!((a.status, a.text().as_str()), (StatusCode::OK, "hello"));
    }
    assert!(
        up.accepted() <= before + 1,
        "a good connection is reused again"
    );
}
