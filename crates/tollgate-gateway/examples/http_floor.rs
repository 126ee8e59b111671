//! The floor under the gateway's CPU per request: the same HTTP/1 server (hyper with the
//! gateway's connection settings, the gateway's runtime) answering every request with the
//! decision-mode 200, with no limiter at all. `cargo xtask bench` (section gateway) runs it
//! pinned beside the gateways, so docs/benchmarks.md can say how much of a request is the
//! limiter and how much the server under it. Since 2026-12-03 the gateway keeps its header
//! read timeout with a sweeper of its own instead of hyper's timer per request
//! (`src/http/head_timeout.rs`); the floor has none at all (about 200 instructions a request
//! under the gateway's, by callgrind), so it stays a floor.
//!
//! Given an upstream too, it is the floor under proxy mode: every request is forwarded as it
//! came (no header rewritten, no limiter) on one upstream connection per downstream
//! connection, made with hyper's `client::conn::http1` and driven from the downstream
//! connection's own task, and the response streams back as it arrives. That is the least a
//! proxy on hyper does: the gateway's proxy adds its pool (a connection is shared by the
//! downstream connections of a worker), its hop-by-hop and forwarding headers, its body
//! timeout and the limiter.
//!
//!     cargo run --release -p tollgate-gateway --example http_floor -- 127.0.0.1:8080
//!     cargo run --release -p tollgate-gateway --example http_floor -- 127.0.0.1:8080 127.0.0.1:8081
//!
//! `--busy-ns N` (first) makes it spin for N ns on every request before answering or
//! forwarding it: the floor slowed to another gateway's rate, so that the kernel's share of a
//! request can be compared at the same requests a second (`scripts/cpu-split`; on a shared
//! machine the cost of waking the load generator and the upstream depends on how often they
//! are idle, which depends on the rate).

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1 as client;
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tollgate_gateway::http::util::status_response;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The gateway's allocator, so that the floor differs from the gateway only in what the
/// gateway does (until 2026-12-03 the floor ran on glibc's malloc).
#[global_allocator]
static GLOBAL: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1).peekable();
    let busy = match args.next_if(|a| a == "--busy-ns").map(|_| args.next()) {
        None => Duration::ZERO,
        Some(n) => {
            let n = n.unwrap_or_default();
            match n.parse::<u64>() {
                Ok(ns) if ns <= 1_000_000 => Duration::from_nanos(ns),
                _ => {
                    eprintln!("error: --busy-ns takes nanoseconds, 0 to 1000000, not {n:?}");
                    return std::process::ExitCode::from(2);
                }
            }
        }
    };
    let Some(addr) = args.next() else {
        eprintln!("usage: http_floor [--busy-ns N] ADDRESS:PORT [UPSTREAM_ADDRESS:PORT]");
        return std::process::ExitCode::from(2);
    };
    let upstream = match args.next().map(|u| (u.parse::<SocketAddr>(), u)) {
        None => None,
        Some((Ok(up), _)) => Some(up),
        Some((Err(e), u)) => {
            eprintln!("error: the upstream {u:?} is not an IP address and port: {e}");
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
    match rt.block_on(serve(&addr, upstream, busy)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Spins for `busy` (`--busy-ns`; nothing when zero).
fn spin(busy: Duration) {
    if busy.is_zero() {
        return;
    }
    let started = std::time::Instant::now();
    while started.elapsed() < busy {
        std::hint::spin_loop();
    }
}

/// The gateway's server settings, with no header read timeout.
fn server() -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        // hyper's default with a timer is 30 s: off, explicitly.
        .header_read_timeout(None)
        .max_buf_size(64 * 1024)
        .keep_alive(true);
    b
}

/// Serves on `addr`, each request spinning `busy` first.
async fn serve(addr: &str, upstream: Option<SocketAddr>, busy: Duration) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(stream);
        match upstream {
            None => {
                let svc = hyper::service::service_fn(move |_req: Request<Incoming>| async move {
                    spin(busy);
                    Ok::<_, Infallible>(status_response(http::StatusCode::OK, ""))
                });
                let conn = server().serve_connection(io, svc);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            Some(up) => {
                let slot: Slot = Arc::default();
                let svc =
                    hyper::service::service_fn(move |req| forward(up, slot.clone(), req, busy));
                let conn = server().serve_connection(io, svc);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        }
    }
}

/// One upstream connection, boxed so that it moves as a pointer.
struct Upstream {
    sender: client::SendRequest<Incoming>,
    /// `None` once the connection is over.
    driver: Option<client::Connection<TokioIo<TcpStream>, Incoming>>,
}

impl Upstream {
    async fn open(up: SocketAddr) -> Result<Box<Self>, BoxError> {
        let stream = TcpStream::connect(up).await?;
        let _ = stream.set_nodelay(true);
        let (sender, driver) = client::handshake(TokioIo::new(stream)).await?;
        Ok(Box::new(Self {
            sender,
            driver: Some(driver),
        }))
    }

    /// Does the connection's pending reads and writes.
    fn drive(&mut self, cx: &mut Context<'_>) {
        drive(&mut self.driver, cx);
    }
}

/// Does a connection's pending reads and writes; `driver` is `None` once it is over.
fn drive(
    driver: &mut Option<client::Connection<TokioIo<TcpStream>, Incoming>>,
    cx: &mut Context<'_>,
) {
    if let Some(d) = driver {
        if Pin::new(d).poll(cx).is_ready() {
            *driver = None;
        }
    }
}

/// A downstream connection's upstream connection while no request uses it.
type Slot = Arc<Mutex<Option<Box<Upstream>>>>;

async fn forward(
    up: SocketAddr,
    slot: Slot,
    req: Request<Incoming>,
    busy: Duration,
) -> Result<Response<Relay>, BoxError> {
    spin(busy);
    let idle = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    let mut conn = match idle {
        Some(c) if c.driver.is_some() => c,
        _ => Upstream::open(up).await?,
    };
    poll_fn(|cx| {
        conn.drive(cx);
        conn.sender.poll_ready(cx)
    })
    .await?;
    let resp = {
        let Upstream { sender, driver } = &mut *conn;
        let mut answer = pin!(sender.send_request(req));
        poll_fn(|cx| {
            drive(driver, cx);
            answer.as_mut().poll(cx)
        })
        .await?
    };
    let (parts, body) = resp.into_parts();
    Ok(Response::from_parts(
        parts,
        Relay {
            body,
            conn: Some(conn),
            slot,
        },
    ))
}

/// The upstream's response body, read while its connection is driven; the connection goes
/// back to its slot once the body has ended.
struct Relay {
    body: Incoming,
    conn: Option<Box<Upstream>>,
    slot: Slot,
}

impl Body for Relay {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(c) = &mut this.conn {
            c.drive(cx);
        }
        Pin::new(&mut this.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.body.is_end_stream() {
            if let Some(c) = self.conn.take() {
                *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(c);
            }
        }
    }
}
