//! The floor under the RLS's CPU per decision: the RLS listener's HTTP/2 server (the `h2`
//! crate's, with the listener's settings, a task spawned per stream as the listener spawns
//! it, on the gateway's runtime and allocator) answering every call with the
//! same `ShouldRateLimit` answer, encoded once at start, with no limiter at all. Each call's
//! request body is read to its end (as the listener reads it) and not decoded; the answer is
//! one gRPC message of `STATUSES` descriptor statuses (OK, a limit, what remains, the time to
//! reset: what a decided descriptor's status holds) then the trailers `grpc-status: 0`.
//! `cargo xtask bench` (section rls) runs it pinned where `tollgate serve` runs, with as many
//! statuses as the shape has descriptors, so docs/benchmarks.md can say how much of a decision
//! is the limiter and how much the HTTP/2 server under it (the HTTP decision mode's floor is
//! the example `http_floor`). It has no keep-alive timer: one per connection, not a cost of
//! an answer.
//!
//!     cargo run --release -p tollgate-gateway --example rls_floor -- 127.0.0.1:8081 10
//!
//! `--hyper` (first) serves the same answers on hyper's HTTP/2 server instead, a task spawned
//! per stream, as the listener ran until 2026-12-05: how much of the floor that layer was.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prost::Message;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitResponse;

/// The gateway's allocator, so that the floor differs from the gateway only in what the
/// gateway does.
#[global_allocator]
static GLOBAL: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;

/// The most statuses an answer may be given (the RLS's bound on descriptors a request).
const MAX_STATUSES: usize = 256;

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1).peekable();
    let on_hyper = args.next_if(|a| a == "--hyper").is_some();
    let Some(addr) = args.next() else {
        eprintln!("usage: rls_floor [--hyper] ADDRESS:PORT [STATUSES]");
        return std::process::ExitCode::from(2);
    };
    let statuses = match args.next().map(|n| (n.parse::<usize>(), n)) {
        None => 1,
        Some((Ok(n), _)) if (1..=MAX_STATUSES).contains(&n) => n,
        Some((_, n)) => {
            eprintln!("error: STATUSES is 1 to {MAX_STATUSES}, not {n:?}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tollgate_gateway::runtime::build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let served = if on_hyper {
        rt.block_on(serve_hyper(&addr, answer(statuses)))
    } else {
        rt.block_on(serve(&addr, answer(statuses)))
    };
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The framed answer: the five-byte gRPC prefix (not compressed, the length big-endian), then
/// a `RateLimitResponse` of `statuses` OK statuses.
fn answer(statuses: usize) -> Bytes {
    let status = DescriptorStatus {
        code: Code::Ok.into(),
        current_limit: Some(RateLimit {
            name: "bench.d0".into(),
            requests_per_unit: 1_000_000_000,
            unit: 3, // HOUR
        }),
        limit_remaining: 999_999_999,
        duration_until_reset: Some(prost_types::Duration {
            seconds: 3_599,
            nanos: 0,
        }),
    };
    let message = RateLimitResponse {
        overall_code: Code::Ok.into(),
        statuses: vec![status; statuses],
        ..Default::default()
    }
    .encode_to_vec();
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    framed.extend_from_slice(&message);
    Bytes::from(framed)
}

/// The RLS listener's HTTP/2 settings on hyper, as it had them until 2026-12-05: at most 256
/// concurrent streams a connection, a ping every 30 s answered within 10 s, no `date`
/// header, hyper's defaults otherwise.
fn hyper_settings() -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .auto_date_header(false)
        .max_concurrent_streams(tollgate_rls::MAX_STREAMS)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    builder
}

/// The next connection, its writes not delayed; an accept that fails is waited out.
async fn next_connection(listener: &TcpListener) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                return stream;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// A gRPC answer's head: `content-type: application/grpc`.
fn grpc_response<B>(body: B) -> Response<B> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The trailers of an answer that succeeded: `grpc-status: 0`.
fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers
}

/// The same answers on hyper's HTTP/2 server, a task spawned per stream by hyper.
async fn serve_hyper(addr: &str, answer: Bytes) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    let http2 = Arc::new(hyper_settings());
    loop {
        let stream = next_connection(&listener).await;
        let answer = answer.clone();
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let answer = answer.clone();
            async move {
                // The request read to its end, its frames dropped as they come.
                let mut body = req.into_body();
                while let Some(frame) = body.frame().await {
                    if frame.is_err() {
                        break;
                    }
                }
                Ok::<_, Infallible>(grpc_response(Answer::Message(answer)))
            }
        });
        let conn = http2.serve_connection(TokioIo::new(stream), svc);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

/// The same answers as the listener serves them: each connection one task, accepting its
/// streams, each call a task of its own.
async fn serve(addr: &str, answer: Bytes) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    let http2 = Arc::new(tollgate_rls::http2_settings());
    loop {
        let stream = next_connection(&listener).await;
        let answer = answer.clone();
        let http2 = Arc::clone(&http2);
        tokio::spawn(async move {
            // Not vectored, as the listener's connections (`tollgate_rls::Unvectored`).
            let stream = tollgate_rls::Unvectored(stream);
            let Ok(mut conn) = http2.handshake::<_, Bytes>(stream).await else {
                return;
            };
            while let Some(Ok((request, respond))) = conn.accept().await {
                // Boxed before it is spawned, as the listener boxes its calls.
                tokio::spawn(Box::pin(call(request, respond, answer.clone())));
            }
        });
    }
}

/// One call: its body read to its end (its window given back as it is read), then the
/// headers, the message (once the stream's window has room for it) and the trailers.
async fn call(
    request: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    mut answer: Bytes,
) {
    let mut body = request.into_body();
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else { return };
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let Ok(mut send) = respond.send_response(grpc_response(()), false) else {
        return;
    };
    while !answer.is_empty() {
        send.reserve_capacity(answer.len());
        let room = match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(room)) => room,
            _ => return,
        };
        let part = answer.split_to(room.min(answer.len()));
        if !part.is_empty() && send.send_data(part, false).is_err() {
            return;
        }
    }
    let _ = send.send_trailers(ok_trailers());
}

/// The answer's body: the framed message, then the trailers.
enum Answer {
    Message(Bytes),
    Trailers,
    Done,
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let frame = match std::mem::replace(this, Answer::Done) {
            Answer::Message(data) => {
                *this = Answer::Trailers;
                Frame::data(data)
            }
            Answer::Trailers => Frame::trailers(ok_trailers()),
            Answer::Done => return Poll::Ready(None),
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Answer::Done)
    }
}
