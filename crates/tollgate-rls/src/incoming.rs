//! Accepted connections with a deadline on the HTTP/2 preface: a peer that connects and then
//! sends nothing, or stops half-way through the 24-byte preface, is disconnected after
//! [`PREFACE_TIMEOUT`] instead of holding a connection (and its task) for ever. HTTP/2's own
//! keep-alive pings take over once the connection is established.
//!
//! Each accepted connection first asks the caller's [`Admit`] (the gateway's connection
//! bounds, in all and per address): refused, it is closed before a byte is read; admitted, it
//! holds what `admit` gave until it closes. A failed accept (the process out of file
//! descriptors) waits [`ACCEPT_BACKOFF`] before the next, instead of spinning.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// How long a new connection has to send the HTTP/2 connection preface.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(5);

/// The length of the client connection preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`).
const PREFACE_LEN: usize = 24;

/// How long a failed accept waits before the next.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// What an admitted connection holds until it closes (a place in the caller's bounds).
pub type Admitted = Box<dyn Send + Sync>;

/// Admits a connection from an address, or refuses it (`None`).
pub type Admit = Arc<dyn Fn(IpAddr) -> Option<Admitted> + Send + Sync>;

/// A TCP stream whose first [`PREFACE_LEN`] bytes must arrive before a deadline.
pub(crate) struct PrefaceDeadline {
    stream: Unvectored<TcpStream>,
    received: usize,
    deadline: Option<Pin<Box<Sleep>>>,
    /// The place the connection holds in the bounds, freed when it closes.
    _admitted: Option<Admitted>,
}

impl PrefaceDeadline {
    pub(crate) fn new(stream: TcpStream, timeout: Duration, admitted: Option<Admitted>) -> Self {
        Self {
            stream: Unvectored(stream),
            received: 0,
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
            _admitted: admitted,
        }
    }
}

/// The next accepted and admitted connection of `listener`, and its peer's address. A
/// refused connection is closed at once, before any read; a failed accept waits
/// [`ACCEPT_BACKOFF`]. Cancel-safe: dropped while waiting, it loses no connection.
pub(crate) async fn accept(
    listener: &tokio::net::TcpListener,
    admit: Option<&Admit>,
) -> (PrefaceDeadline, IpAddr) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let admitted = match admit {
            Some(admit) => match admit(peer.ip()) {
                Some(a) => Some(a),
                // Past a bound: closed at once, before any read.
                None => continue,
            },
            None => None,
        };
        let _ = stream.set_nodelay(true);
        return (
            PrefaceDeadline::new(stream, PREFACE_TIMEOUT, admitted),
            peer.ip(),
        );
    }
}

impl AsyncRead for PrefaceDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Some(deadline) = this.deadline.as_mut() {
            this.received += buf.filled().len() - before;
            if this.received >= PREFACE_LEN {
                this.deadline = None;
            } else if polled.is_pending() && deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 preface in time",
                )));
            }
        }
        polled
    }
}

impl AsyncWrite for PrefaceDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// A stream that tells its writer it takes one buffer a write (`is_write_vectored` false),
/// for h2's sake. Over a vectored stream h2 keeps every DATA frame of 256 bytes or more aside
/// for a `writev` and writes it out before it takes the next frame, so each answer (or
/// request) that long cost a system call of its own (every ten-descriptor answer did). Over this one h2 copies
/// frames of up to 1,024 bytes into its write buffer beside the other streams' frames, and
/// writes many at once (a larger frame is written after the buffer, in a call of its own).
/// The RLS listener's connections are these; so are `tollgate bench --rls`'s.
#[derive(Debug)]
pub struct Unvectored<T>(pub T);

impl<T: AsyncRead + Unpin> AsyncRead for Unvectored<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Unvectored<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn an_accepted_stream_is_not_vectored_and_writes_an_answer_whole() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let client = tokio::spawn(async move { TcpStream::connect(addr).await });
        let (mut io, peer) = accept(&listener, None).await;
        let mut client = client.await.expect("join").expect("connect");
        assert!(peer.is_loopback());
        // Vectored, h2 would write every answer of 256 bytes or more on its own.
        assert!(!io.is_write_vectored());
        let answer: Vec<u8> = (0..3000u32).map(|n| (n % 251) as u8).collect();
        io.write_all(&answer).await.expect("write");
        io.flush().await.expect("flush");
        let mut got = vec![0u8; answer.len()];
        client.read_exact(&mut got).await.expect("read");
        assert_eq!(got, answer);
    }
}
