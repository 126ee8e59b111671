//! The upstream's response body on its way to the client. It carries the upstream
//! connection: polling the body does the connection's reads, so the response streams at the
//! pace the client takes it (nothing is read ahead of a slow client), and when the body ends
//! the connection goes back to the pool. A body dropped before its end (the client went away)
//! closes the connection, which is then in an unknown state.

use super::pool::{Conn, Pool, RequestBody};
use crate::http::util::BoxError;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A response body from the upstream, with the connection it arrives on.
pub(crate) struct UpstreamBody<B: RequestBody> {
    body: Incoming,
    /// `None` once given back (the body ended) or broken.
    conn: Option<Conn<B>>,
    pool: Arc<Pool<B>>,
}

impl<B: RequestBody> UpstreamBody<B> {
    pub(super) fn new(body: Incoming, conn: Conn<B>, pool: Arc<Pool<B>>) -> Self {
        Self {
            body,
            conn: Some(conn),
            pool,
        }
    }

    /// The body is over: the connection may serve another request.
    fn ended(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.put(conn);
        }
    }
}

impl<B: RequestBody> Body for UpstreamBody<B> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let mut drove = false;
        loop {
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if frame.is_trailers() || this.body.is_end_stream() {
                        this.ended();
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Some(Err(e))) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(None) => {
                    this.ended();
                    return Poll::Ready(None);
                }
                // Nothing buffered: read from the connection once, then look again.
                Poll::Pending if !drove => {
                    drove = true;
                    match &mut this.conn {
                        Some(conn) => {
                            conn.drive(cx);
                        }
                        None => return Poll::Pending,
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B: RequestBody> Drop for UpstreamBody<B> {
    fn drop(&mut self) {
        // hyper's server drops a body without polling it to `None` once it reports its end
        // (or has none, as for HEAD or a 204): that end counts too.
        if self.body.is_end_stream() {
            self.ended();
        }
    }
}
