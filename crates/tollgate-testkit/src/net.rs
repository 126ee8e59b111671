//! Connections to servers under test.

use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// How long after `since` the server closes `s` (end of stream or reset), reading and
/// dropping whatever it sends meanwhile; `None` when it is still open after `within`.
pub async fn closed_after(s: &mut TcpStream, since: Instant, within: Duration) -> Option<Duration> {
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    closed.ok().map(|()| since.elapsed())
}
