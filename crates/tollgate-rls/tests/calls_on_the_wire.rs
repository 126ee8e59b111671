//! Calls over real connections from a plain HTTP/2 client (h2), which sees exactly what the
//! server sends: the shape of answers and refusals, bounds that hold while the client is
//! still sending, floods and resets of streams, deadlines, and a graceful shutdown.

mod support;

use bytes::Bytes;
use http::HeaderMap;
use prost::Message as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_rls::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_rls::{Bounds, CALL_TIMEOUT};

const YAML: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1000000\n";
const RLS: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn serve(bounds: Bounds) -> Server {
    let (service, listener, addr) = support::memory_service_on_loopback(YAML).await;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(tollgate_rls::serve_with(listener, service, bounds, async {
        let _ = stopped.await;
    }));
    Server {
        addr,
        stop: Some(stop),
        task,
    }
}

fn framed(value: &str) -> Bytes {
    let message = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec();
    let mut out = vec![0u8];
    out.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    out.extend_from_slice(&message);
    Bytes::from(out)
}

type Client = h2::client::SendRequest<Bytes>;

async fn connect(addr: SocketAddr) -> Client {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // Each answer's message is one small DATA frame; h2's client bounds how many of those it
    // buffers unread (32 KiB of "overhead" by default), which the flood test's 2000 tasks on
    // two threads can reach. That bound is the client's, not what these tests are about.
    let (client, conn) = h2::client::Builder::new()
        .data_frame_budget(1 << 24)
        .handshake(tcp)
        .await
        .expect("handshake");
    tokio::spawn(conn);
    client
}

/// Opens a call: its headers sent (with `headers` added), the body left open.
async fn open(
    client: &Client,
    addr: SocketAddr,
    path: &str,
    headers: &[(&'static str, &'static str)],
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut request = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let mut client = client.clone().ready().await.expect("ready");
    client
        .send_request(request.body(()).expect("request"), false)
        .expect("send")
}

/// A whole call: `body` sent, the answer read to its end.
async fn call(client: &Client, addr: SocketAddr, path: &str, body: Bytes) -> Answer {
    let (response, mut send) = open(client, addr, path, &[]).await;
    // An answer that needs no body (a refusal, an unknown path) may have closed the stream
    // already.
    let _ = send.send_data(body, true);
    read(response).await
}

struct Answer {
    headers: HeaderMap,
    ended_with_headers: bool,
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
}

impl Answer {
    fn grpc_status(&self) -> Option<&str> {
        self.trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| self.headers.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
    }
}

async fn read(response: h2::client::ResponseFuture) -> Answer {
    tokio::time::timeout(Duration::from_secs(10), async {
        let response = response
            .await
            .unwrap_or_else(|e| panic!("an answer: {e:?}"));
        assert_eq!(response.status(), http::StatusCode::OK);
        let (parts, mut body) = response.into_parts();
        let ended_with_headers = body.is_end_stream();
        let mut data = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("data");
            let _ = body.flow_control().release_capacity(chunk.len());
            data.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await.expect("trailers");
        Answer {
            headers: parts.headers,
            ended_with_headers,
            data,
            trailers,
        }
    })
    .await
    .expect("the whole answer within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_one_message_then_grpc_status_zero_in_the_trailers() {
    let s = serve(Bounds::default()).await;
    let client = connect(s.addr).await;
    let a = call(&client, s.addr, RLS, framed("192.0.2.1")).await;
    assert_eq!(a.headers["content-type"], "application/grpc");
    assert!(a.headers.get("content-length").is_none(), "as tonic: none");
    assert!(a.headers.get("grpc-status").is_none());
    // No `date` either: gRPC has no use for it, and HPACK-encoding it cost every answer
    // about 1,200 instructions (hyper adds it unless told not to).
    assert_eq!(a.headers.len(), 1, "content-type alone: {:?}", a.headers);
    assert_eq!(a.data[0], 0, "not compressed");
    let len = u32::from_be_bytes([a.data[1], a.data[2], a.data[3], a.data[4]]);
    assert_eq!(
        a.data.len(),
        5 + usize::try_from(len).expect("fits"),
        "one message"
    );
    let response = RateLimitResponse::decode(&a.data[5..]).expect("decodes");
    assert_eq!(response.overall_code, 1);
    let trailers = a.trailers.expect("trailers");
    assert_eq!(trailers.len(), 1);
    assert_eq!(trailers["grpc-status"], "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_is_a_trailers_only_answer() {
    let s = serve(Bounds::default()).await;
    let client = connect(s.addr).await;
    let a = call(&client, s.addr, "/no.Such/Method", framed("x")).await;
    assert!(a.ended_with_headers && a.data.is_empty() && a.trailers.is_none());
    assert_eq!(a.grpc_status(), Some("12"));
    assert_eq!(a.headers["content-type"], "application/grpc");

    let empty = RateLimitRequest::default().encode_to_vec();
    let mut body = vec![0, 0, 0, 0, u8::try_from(empty.len()).expect("small")];
    body.extend_from_slice(&empty);
    let a = call(&client, s.addr, RLS, Bytes::from(body)).await;
    assert!(a.ended_with_headers);
    assert_eq!(a.grpc_status(), Some("3"), "INVALID_ARGUMENT");
    assert!(a.headers.contains_key("grpc-message"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_length_is_refused_while_the_client_is_still_sending() {
    let s = serve(Bounds::default()).await;
    let client = connect(s.addr).await;
    let (response, mut send) = open(&client, s.addr, RLS, &[]).await;
    // A 1 GiB message announced, 16 KiB sent, the stream left open.
    let mut start = vec![0u8, 0x40, 0, 0, 0];
    start.resize(16 * 1024, 7);
    send.send_data(Bytes::from(start), false).expect("data");
    let a = tokio::time::timeout(Duration::from_secs(2), read(response))
        .await
        .expect("answered before the body ends");
    assert_eq!(a.grpc_status(), Some("11"), "OUT_OF_RANGE");
    assert!(a.ended_with_headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_calls_on_one_connection_is_answered_in_full() {
    let s = serve(Bounds::default()).await;
    let client = connect(s.addr).await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..2000 {
        let client = client.clone();
        let addr = s.addr;
        calls.spawn(async move {
            call(&client, addr, RLS, framed(&format!("c{}", i % 50)))
                .await
                .grpc_status()
                .map(str::to_owned)
        });
    }
    let mut ok = 0;
    while let Some(status) = calls.join_next().await {
        assert_eq!(status.expect("joined").as_deref(), Some("0"));
        ok += 1;
    }
    assert_eq!(ok, 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reset_by_the_client_give_their_places_back() {
    let s = serve(Bounds {
        calls_per_address: 8,
        ..Bounds::default()
    })
    .await;
    let client = connect(s.addr).await;
    // Eight calls waiting for their bodies hold the address's eight places.
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(open(&client, s.addr, RLS, &[]).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = call(&client, s.addr, RLS, framed("x")).await;
    assert_eq!(refused.grpc_status(), Some("8"), "RESOURCE_EXHAUSTED");
    for (_, send) in &mut held {
        send.send_reset(h2::Reason::CANCEL);
    }
    assert!(
        served_soon(&client, s.addr).await,
        "the reset calls' places came back"
    );

    // A rapid-reset flood: streams opened and reset at once, by the thousand.
    for _ in 0..2000 {
        let Ok(mut ready) = client.clone().ready().await else {
            break; // the server may close the connection (h2's bound on pending resets)
        };
        let request = http::Request::post(format!("http://{}{RLS}", s.addr))
            .body(())
            .expect("request");
        match ready.send_request(request, false) {
            Ok((_, mut send)) => send.send_reset(h2::Reason::CANCEL),
            Err(_) => break,
        }
    }
    let fresh = connect(s.addr).await;
    assert!(
        served_soon(&fresh, s.addr).await,
        "no place leaked, the server carries on"
    );
}

/// Whether a call from this address is served within 5 s (places come back as the server
/// processes the resets).
async fn served_soon(client: &Client, addr: SocketAddr) -> bool {
    for _ in 0..50 {
        if call(client, addr, RLS, framed("x")).await.grpc_status() == Some("0") {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_ends_is_cancelled_at_the_deadline() {
    let s = serve(Bounds::default()).await;
    let client = connect(s.addr).await;
    let started = Instant::now();
    let (response, _send) = open(&client, s.addr, RLS, &[("grpc-timeout", "200m")]).await;
    let a = read(response).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the client's 200 ms"
    );
    assert_eq!(a.grpc_status(), Some("1"), "CANCELLED, as tonic");
    assert_eq!(a.headers["grpc-message"], "Timeout%20expired");

    let started = Instant::now();
    let (response, _send) = open(&client, s.addr, RLS, &[]).await;
    let a = read(response).await;
    let took = started.elapsed();
    assert!(
        took >= CALL_TIMEOUT && took < CALL_TIMEOUT + Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(a.grpc_status(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_the_listener_and_lets_calls_in_progress_finish() {
    let mut s = serve(Bounds::default()).await;
    let client = connect(s.addr).await;
    let (response, mut send) = open(&client, s.addr, RLS, &[]).await;
    let body = framed("192.0.2.1");
    send.send_data(body.slice(..7), false).expect("half");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let _ = s.stop.take().map(|stop| stop.send(()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        tokio::net::TcpStream::connect(s.addr).await.is_err(),
        "the listening socket is closed"
    );
    assert!(!s.task.is_finished(), "draining");

    send.send_data(body.slice(7..), true).expect("the rest");
    let a = read(response).await;
    assert_eq!(a.grpc_status(), Some("0"), "the call in progress finished");
    let served = tokio::time::timeout(Duration::from_secs(5), &mut s.task)
        .await
        .expect("serve returns once the connection has closed");
    assert!(served.expect("joined").is_ok());
}
