//! The listener's HTTP/2 bounds seen from a client that writes frames by hand, as an
//! attacker would: the stream bound is advertised and enforced, a client that makes the
//! server reset stream after stream is disconnected, neither HTTP/1 nor garbage gets an
//! answer, and a peer that stops answering pings is let go. Other connections are served
//! meanwhile.

mod support;

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tollgate_rls::MAX_STREAMS;

const YAML: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1000000\n";
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

const SETTINGS: u8 = 0x4;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
const REFUSED_STREAM: u32 = 0x7;
const ENHANCE_YOUR_CALM: u32 = 0xb;

async fn serve() -> std::net::SocketAddr {
    let (service, listener, addr) = support::memory_service_on_loopback(YAML).await;
    tokio::spawn(tollgate_rls::serve(
        listener,
        service,
        std::future::pending(),
    ));
    addr
}

struct Frame {
    kind: u8,
    flags: u8,
    payload: Vec<u8>,
}

async fn write_frame(w: &mut OwnedWriteHalf, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("small").to_be_bytes();
    let mut frame = vec![len[1], len[2], len[3], kind, flags];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    w.write_all(&frame).await.expect("write");
}

/// The next frame, or `None` at the end of the connection.
async fn read_frame(r: &mut OwnedReadHalf) -> Option<Frame> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]);
    let mut payload = vec![0u8; usize::try_from(len).expect("fits")];
    r.read_exact(&mut payload).await.ok()?;
    Some(Frame {
        kind: head[3],
        flags: head[4],
        payload,
    })
}

fn code(payload: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([
        payload[at],
        payload[at + 1],
        payload[at + 2],
        payload[at + 3],
    ])
}

/// A connection past the preface, both SETTINGS exchanged and acknowledged; the server's
/// SETTINGS as (identifier, value) pairs.
async fn handshake(addr: std::net::SocketAddr) -> (OwnedReadHalf, OwnedWriteHalf, Vec<(u16, u32)>) {
    let (mut r, mut w) = TcpStream::connect(addr)
        .await
        .expect("connect")
        .into_split();
    w.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("preface");
    write_frame(&mut w, SETTINGS, 0, 0, &[]).await;
    let settings = loop {
        let f = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut r))
            .await
            .expect("the server's SETTINGS in time")
            .expect("a frame");
        if f.kind == SETTINGS && f.flags & ACK == 0 {
            break f
                .payload
                .chunks_exact(6)
                .map(|s| (u16::from_be_bytes([s[0], s[1]]), code(s, 2)))
                .collect();
        }
    };
    write_frame(&mut w, SETTINGS, ACK, 0, &[]).await;
    (r, w, settings)
}

/// HPACK: `:method: POST`, `:scheme: http`, `:path` (a literal, not indexed).
fn request_headers(path: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x86, 0x04, u8::try_from(path.len()).expect("short")];
    block.extend_from_slice(path.as_bytes());
    block
}

/// Frames until the connection ends or goes quiet for `idle`.
async fn drain(r: &mut OwnedReadHalf, idle: Duration) -> Vec<Frame> {
    let mut frames = Vec::new();
    while let Ok(Some(f)) = tokio::time::timeout(idle, read_frame(r)).await {
        frames.push(f);
    }
    frames
}

/// A well-behaved call on a fresh connection still gets its answer.
async fn others_are_served(addr: std::net::SocketAddr) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (client, conn) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(conn);
    let mut client = client.ready().await.expect("ready");
    let request = http::Request::post(format!("http://{addr}/no.Such/Method"))
        .body(())
        .expect("request");
    let (response, _) = client.send_request(request, true).expect("send");
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("in time")
        .expect("an answer");
    assert_eq!(response.headers()["grpc-status"], "12");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_advertises_its_stream_bound() {
    let addr = serve().await;
    let (_r, _w, settings) = handshake(addr).await;
    // SETTINGS_MAX_CONCURRENT_STREAMS
    assert!(settings.contains(&(0x3, MAX_STREAMS)), "{settings:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_past_the_bound_are_refused_and_the_rest_are_held_open() {
    let addr = serve().await;
    let (mut r, mut w, _) = handshake(addr).await;
    let opened: u32 = MAX_STREAMS + 44;
    for i in 0..opened {
        // Headers without END_STREAM: each call waits for a body that never comes.
        write_frame(
            &mut w,
            HEADERS,
            END_HEADERS,
            2 * i + 1,
            &request_headers(PATH),
        )
        .await;
    }
    let frames = drain(&mut r, Duration::from_secs(1)).await;
    let refused = frames
        .iter()
        .filter(|f| f.kind == RST_STREAM && code(&f.payload, 0) == REFUSED_STREAM)
        .count();
    assert_eq!(refused, 44, "the streams past {MAX_STREAMS} are refused");
    assert!(
        frames.iter().all(|f| f.kind != GOAWAY),
        "the connection stays up"
    );
    others_are_served(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_makes_the_server_reset_stream_after_stream_is_disconnected() {
    let addr = serve().await;
    let (mut r, mut w, _) = handshake(addr).await;
    let writer = tokio::spawn(async move {
        // A request without `:method` is malformed: the server resets its stream.
        for i in 0..1100u32 {
            write_frame(
                &mut w,
                HEADERS,
                END_HEADERS | END_STREAM,
                2 * i + 1,
                &[0x86, 0x84],
            )
            .await;
        }
        w
    });
    let frames = drain(&mut r, Duration::from_secs(5)).await;
    let resets = frames.iter().filter(|f| f.kind == RST_STREAM).count();
    let goaway = frames.iter().find(|f| f.kind == GOAWAY).expect("a GOAWAY");
    assert_eq!(code(&goaway.payload, 4), ENHANCE_YOUR_CALM);
    // h2's bound on the streams it resets for a client's errors: 1024 per connection (tonic
    // switched it off, so such a client could go on for ever).
    assert!(resets > 0 && resets <= 1024, "{resets} resets, then GOAWAY");
    drop(writer);
    others_are_served(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_and_garbage_get_no_answer_and_the_connection_is_closed() {
    let addr = serve().await;
    for bytes in [
        &b"POST /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        &[0xff; 64][..],
    ] {
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(bytes).await.expect("write");
        let mut got = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut got)).await;
        assert!(closed.is_ok(), "closed at once, not at the preface deadline");
        assert!(
            !String::from_utf8_lossy(&got).contains("HTTP/1.1"),
            "no HTTP/1 answer"
        );
    }
    others_are_served(addr).await;
}

/// Reads frames until a PING that is not an ACK, answering none; `None` if the connection
/// ends first.
async fn next_ping(r: &mut OwnedReadHalf) -> Option<Frame> {
    loop {
        let f = read_frame(r).await?;
        if f.kind == PING && f.flags & ACK == 0 {
            return Some(f);
        }
    }
}

// On a paused clock: the runtime skips ahead whenever it waits for a timer alone, so the
// keep-alive's 30 s and 10 s pass at once.
#[tokio::test(start_paused = true)]
async fn a_peer_that_stops_answering_pings_is_disconnected_and_one_that_answers_is_kept() {
    let addr = serve().await;
    // One that answers every ping: still connected after five intervals.
    let (mut r, mut w, _) = handshake(addr).await;
    let start = tokio::time::Instant::now();
    for round in 1..=5u32 {
        let ping = tokio::time::timeout(Duration::from_secs(60), next_ping(&mut r))
            .await
            .unwrap_or_else(|_| panic!("ping {round} within 60 s"))
            .unwrap_or_else(|| panic!("connection open at ping {round}"));
        assert_eq!(ping.payload.len(), 8);
        write_frame(&mut w, PING, ACK, 0, &ping.payload).await;
    }
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(5 * 30) && elapsed < Duration::from_secs(5 * 60),
        "five pings a keep-alive interval (30 s) apart: {elapsed:?}"
    );

    // One that never answers: closed 10 s after its first unanswered ping, not before.
    let (mut r, _w, _) = handshake(addr).await;
    let ping = tokio::time::timeout(Duration::from_secs(60), next_ping(&mut r))
        .await
        .expect("a ping within 60 s")
        .expect("open until its first ping");
    assert_eq!(ping.flags & ACK, 0);
    let pinged = tokio::time::Instant::now();
    let frames = tokio::time::timeout(Duration::from_secs(60), async {
        let mut frames = Vec::new();
        while let Some(f) = read_frame(&mut r).await {
            frames.push(f);
        }
        frames
    })
    .await
    .expect("disconnected within 60 s of its ping");
    let waited = pinged.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(30),
        "closed when the ping had gone unanswered for 10 s: {waited:?}"
    );
    assert!(
        frames.iter().all(|f| f.kind != PING || f.flags & ACK != 0),
        "no second ping while the first waits"
    );
    others_are_served(addr).await;
}
