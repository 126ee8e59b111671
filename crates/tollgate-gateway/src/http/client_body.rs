//! A client's request body on its way upstream, with a deadline for the whole of it
//! (`body_timeout`): a body trickled at ten bytes a second is cut like a silent one, and the
//! connections it holds on both sides are freed.
//!
//! When the upstream request fails because of this body (malformed chunked encoding, a
//! client that stopped sending, the deadline), the failure is the client's: the proxy reads
//! [`BodyFault`] and answers 400 or 408 instead of a 502 counted as an upstream error (which
//! would let any client fake an outage alert).

use crate::http::util::BoxError;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use tokio::time::{Instant, Sleep};

/// What went wrong with a client's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFault {
    /// It did not arrive in full within `body_timeout`.
    Timeout,
    /// It was malformed or cut short.
    Broken,
}

/// Where a [`ClientBody`] records its fault for whoever sent it.
pub type FaultSlot = Arc<OnceLock<BodyFault>>;

/// The client's body, with a deadline.
pub struct ClientBody {
    inner: Incoming,
    deadline: Instant,
    /// The timer that wakes the body's reader at `deadline`, made the first time the body
    /// has to be waited for. Most proxied requests have no body (a `GET`), or one already
    /// read with the head: they never make one (a boxed `Sleep` with a handle on the
    /// runtime, made and dropped per request, and the timer wheel's work if it was polled).
    timer: Option<Pin<Box<Sleep>>>,
    fault: FaultSlot,
}

impl ClientBody {
    /// `inner`, which must arrive in full by `deadline`.
    pub fn new(inner: Incoming, deadline: Instant) -> (Self, FaultSlot) {
        let fault = FaultSlot::default();
        let body = Self {
            inner,
            deadline,
            timer: None,
            fault: fault.clone(),
        };
        (body, fault)
    }
}

/// The error a cut body ends with.
#[derive(Debug)]
struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive within body_timeout")
    }
}

impl std::error::Error for BodyTimedOut {}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let Some(Err(_)) = &frame {
                let _ = this.fault.set(BodyFault::Broken);
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        // Waiting for the client: from here on the deadline has a timer.
        let deadline = this.deadline;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.as_mut().poll(cx).is_ready() {
            let _ = this.fault.set(BodyFault::Timeout);
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
