//! The floor under the gateway's CPU per request: the same HTTP/1 server (hyper with the
//! gateway's connection settings, the gateway's runtime) answering every request with the
//! decision-mode 200, with no limiter at all. `cargo xtask bench` (section gateway) runs it
//! pinned beside the gateways, so docs/benchmarks.md can say how much of a request is the
//! limiter and how much the server under it. Since 2026-12-03 the gateway keeps its header
//! read timeout with a sweeper of its own instead of hyper's timer per request
//! (`src/http/head_timeout.rs`); the floor has none at all (about 200 instructions a request
//! under the gateway's, by callgrind), so it stays a floor.
//!
//!     cargo run --release -p tollgate-gateway --example http_floor -- 127.0.0.1:8080

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::time::Duration;
use tokio::net::TcpListener;
use tollgate_gateway::http::util::status_response;

fn main() -> std::process::ExitCode {
    let Some(addr) = std::env::args().nth(1) else {
        eprintln!("usage: http_floor ADDRESS:PORT");
        return std::process::ExitCode::from(2);
    };
    let rt = match tollgate_gateway::runtime::build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(&addr)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(addr: &str) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let svc = hyper::service::service_fn(|_req: hyper::Request<Incoming>| async {
            Ok::<_, Infallible>(status_response(http::StatusCode::OK, ""))
        });
        let mut b = http1::Builder::new();
        b.timer(TokioTimer::new())
            // hyper's default with a timer is 30 s: off, explicitly.
            .header_read_timeout(None)
            .max_buf_size(64 * 1024)
            .keep_alive(true);
        let conn = b.serve_connection(TokioIo::new(stream), svc);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}
