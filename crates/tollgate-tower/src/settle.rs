//! The response body of a request that holds a [`Reservation`]: it settles the reservation
//! when the body ends (the real cost read from the response's trailers, else its head) and
//! drops it when the body is dropped before its end (the client went away, the upstream
//! failed): the estimates stand and the holds are released at once.

use crate::route::cost_value;
use bytes::Buf;
use http::{HeaderMap, HeaderName};
use http_body::{Body, Frame, SizeHint};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tollgate::metrics::SettleError;
use tollgate::Reservation;

pin_project_lite::pin_project! {
    /// A response body, settling the request's reservation (if any) when it ends.
    pub struct Settling<B> {
        #[pin]
        inner: B,
        // Boxed: a plain body (every request without a settling policy) carries one word.
        pending: Option<Box<Pending>>,
    }
}

impl<B> Settling<B> {
    /// A body that settles nothing.
    pub fn plain(inner: B) -> Self {
        Self {
            inner,
            pending: None,
        }
    }

    /// The same body, settling the same reservation, with its inner body changed by `f`
    /// (boxed, say).
    pub fn map<C>(self, f: impl FnOnce(B) -> C) -> Settling<C> {
        Settling {
            inner: f(self.inner),
            pending: self.pending,
        }
    }
}

impl<B: Body> Settling<B> {
    /// A body that settles `pending` when it ends. One that has nothing to send (a HEAD or
    /// 204 answer) has ended already: it settles now, as the server will not poll it.
    pub(crate) fn with_pending(inner: B, pending: Box<Pending>) -> Self {
        if inner.is_end_stream() {
            (*pending).settle(None);
            return Self::plain(inner);
        }
        Self {
            inner,
            pending: Some(pending),
        }
    }

    /// Whether this body settles a reservation when it ends.
    pub fn settles(&self) -> bool {
        self.pending.is_some()
    }

    /// The inner body of a body that settles nothing; the body itself when it settles
    /// (box it: it must be polled to its end).
    pub fn into_plain(self) -> Result<B, Self> {
        if self.pending.is_some() {
            return Err(self);
        }
        Ok(self.inner)
    }
}

/// A reservation waiting for its response's end.
pub(crate) struct Pending {
    pub(crate) reservation: Reservation,
    /// The response head's headers that name a real cost (copied: the head leaves first).
    pub(crate) head: HeaderMap,
    /// The real-cost header of each settling policy, by policy id.
    pub(crate) names: Arc<HashMap<u64, HeaderName>>,
}

impl Pending {
    /// Settles at the costs the trailers (first) or the head name.
    fn settle(self, trailers: Option<&HeaderMap>) {
        let Pending {
            reservation,
            head,
            names,
        } = self;
        reservation.settle_each(|p| {
            let Some(name) = names.get(&p.id()) else {
                return Ok(None);
            };
            let found = trailers
                .map(|t| cost_value(t, name))
                .filter(|v| !matches!(v, Ok(None)))
                .unwrap_or_else(|| cost_value(&head, name));
            match found {
                Ok(Some(n)) => Ok(Some(n)),
                Ok(None) => Err(SettleError::Missing),
                Err(()) => Err(SettleError::Invalid),
            }
        });
    }
}

impl<B: Body> Body for Settling<B>
where
    B::Data: Buf,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(trailers) = f.trailers_ref() {
                    if let Some(p) = this.pending.take() {
                        (*p).settle(Some(trailers));
                    }
                } else if this.inner.is_end_stream() {
                    if let Some(p) = this.pending.take() {
                        (*p).settle(None);
                    }
                }
            }
            // The body ended: settle at what the head says.
            None => {
                if let Some(p) = this.pending.take() {
                    (*p).settle(None);
                }
            }
            // The upstream failed mid-body: the estimate stands, holds go.
            Some(Err(_)) => {
                this.pending.take();
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
