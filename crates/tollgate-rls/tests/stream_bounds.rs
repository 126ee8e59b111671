//! A peer that opens streams and never lets their answers leave (a zero flow-control window)
//! holds at most its address's share of calls; the calls past it are refused at once with
//! RESOURCE_EXHAUSTED, other addresses are served, and closing the connection frees them.

mod support;

use bytes::Bytes;
use prost::Message as _;
use std::time::Duration;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_rls::Bounds;

const YAML: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1000000\n";

async fn serve(bounds: Bounds) -> std::net::SocketAddr {
    let (service, listener, addr) = support::memory_service_on_loopback(YAML).await;
    tokio::spawn(tollgate_rls::serve_with(
        listener,
        service,
        bounds,
        std::future::pending(),
    ));
    addr
}

fn grpc_body() -> Bytes {
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: "192.0.2.1".into(),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let message = request.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    framed.extend_from_slice(&message);
    Bytes::from(framed)
}

/// An HTTP/2 connection from `from` that advertises a zero window for every stream: no
/// answer's body can reach it.
async fn stalled_connection(
    from: [u8; 4],
    to: std::net::SocketAddr,
) -> h2::client::SendRequest<Bytes> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind((std::net::Ipv4Addr::from(from), 0).into())
        .expect("bind a loopback address");
    let tcp = socket.connect(to).await.expect("connect");
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .expect("handshake");
    tokio::spawn(connection);
    client
}

/// Opens a call.
async fn open_call(
    client: &mut h2::client::SendRequest<Bytes>,
    addr: std::net::SocketAddr,
) -> h2::client::ResponseFuture {
    let request = http::Request::post(format!(
        "http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .expect("request");
    let ready = client.clone().ready().await.expect("ready");
    *client = ready;
    let (response, mut send) = client.send_request(request, false).expect("send");
    // A call over the bound is answered (grpc-status 8, the stream ended) as soon as its
    // headers arrive: the listener may have ended the stream before its body is sent, and
    // h2 then refuses the data (`InactiveStreamId`). The answer is still read below.
    if let Err(e) = send.send_data(grpc_body(), true) {
        assert!(
            format!("{e:?}").contains("InactiveStreamId"),
            "only a stream already answered refuses its body: {e:?}"
        );
    }
    response
}

type Answer = http::Response<h2::RecvStream>;

/// The answer's headers and their grpc-status (`None`: headers without one, the body and
/// trailers held back by the zero window). Keep the answer to keep its stream open.
async fn status_of(response: h2::client::ResponseFuture) -> (Option<String>, Answer) {
    let answer = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("headers within 5 s")
        .expect("an answer");
    let status = answer
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (status, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_streams_are_bounded_per_address_and_freed_with_their_connection() {
    let addr = serve(Bounds {
        calls_per_address: 8,
        calls: 1000,
        ..Bounds::default()
    })
    .await;

    let mut stalled = stalled_connection([127, 0, 0, 1], addr).await;
    let mut opened = Vec::new();
    for _ in 0..20 {
        opened.push(open_call(&mut stalled, addr).await);
    }
    let mut statuses = Vec::new();
    let mut kept = Vec::new();
    for response in opened {
        let (status, answer) = status_of(response).await;
        statuses.push(status);
        kept.push(answer);
    }
    let refused = statuses
        .iter()
        .filter(|s| s.as_deref() == Some("8"))
        .count();
    let waiting = statuses.iter().filter(|s| s.is_none()).count();
    assert_eq!(
        (waiting, refused),
        (8, 12),
        "8 held with their bodies stalled, the rest RESOURCE_EXHAUSTED: {statuses:?}"
    );

    // Another address is not affected.
    let mut other = stalled_connection([127, 0, 0, 2], addr).await;
    let response = open_call(&mut other, addr).await;
    let (status, _other_answer) = status_of(response).await;
    assert_eq!(status, None, "127.0.0.2 has its own share");

    // While the stalled streams stay open, 127.0.0.1 is still refused.
    let mut second = stalled_connection([127, 0, 0, 1], addr).await;
    let response = open_call(&mut second, addr).await;
    assert_eq!(status_of(response).await.0.as_deref(), Some("8"));

    // Closing the stalled connection frees its places: a new call from 127.0.0.1 is served.
    drop(kept);
    drop(stalled);
    let mut served = false;
    for _ in 0..50 {
        let response = open_call(&mut second, addr).await;
        let (status, answer) = status_of(response).await;
        if status.is_none() {
            served = true;
            drop(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the closed connection's places came back");
}
