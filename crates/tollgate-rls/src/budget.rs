//! A bound on the calls in progress, per peer address and in all, across every connection of
//! a listener.
//!
//! HTTP/2 bounds the streams of one connection (`max_concurrent_streams`), but a call's
//! memory lives until its answer has left, and a peer that advertises a zero flow-control
//! window never lets an answer's body leave: its streams stay open for as long as the
//! connection does. Each call therefore holds a place from the moment it arrives until its
//! response body is dropped (sent, reset, or the connection gone). A call past its address's
//! bound, or past the listener's, is answered at once with `RESOURCE_EXHAUSTED` in a
//! trailers-only response: headers only, which flow control does not hold back, so the
//! refusal costs no memory that outlives it. As with connections, the last eighth of the
//! listener's places are kept for addresses holding none, so one address (or a few) cannot
//! starve the others.

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tollgate::places::{Place, Places};
use tonic::transport::server::TcpConnectInfo;

/// The most calls in progress from one address, over all its connections.
pub const MAX_CALLS_PER_ADDRESS: usize = 1024;
/// The most calls in progress on one listener.
pub const MAX_CALLS: usize = 16_384;

/// The tower layer that makes every call take a place in a pool of [`Places`].
#[derive(Clone, Debug)]
pub(crate) struct BudgetLayer {
    budget: Arc<Places>,
}

impl BudgetLayer {
    /// Calls bounded to `per_address` from one address and `total` in all.
    pub(crate) fn new(per_address: usize, total: usize) -> Self {
        Self {
            budget: Places::new(total, per_address),
        }
    }
}

impl<S> tower_layer::Layer<S> for BudgetLayer {
    type Service = Budgeted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Budgeted {
            inner,
            budget: self.budget.clone(),
        }
    }
}

/// A service whose calls each hold a place until their response body is dropped.
#[derive(Clone, Debug)]
pub(crate) struct Budgeted<S> {
    inner: S,
    budget: Arc<Places>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower_service::Service<Request<B>> for Budgeted<S>
where
    S: tower_service::Service<Request<B>, Response = Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<PlacedBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let address = request
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(TcpConnectInfo::remote_addr)
            .map(|a| a.ip());
        let Some(place) = self.budget.take(address) else {
            let refusal = tonic::Status::resource_exhausted(
                "too many calls in progress from this address; retry when some have finished",
            )
            .into_http::<tonic::body::Body>();
            let (parts, body) = refusal.into_parts();
            let answer = Response::from_parts(parts, PlacedBody { body, _place: None });
            return Box::pin(std::future::ready(Ok(answer)));
        };
        let call = self.inner.call(request);
        Box::pin(async move {
            let (parts, body) = call.await?.into_parts();
            Ok(Response::from_parts(
                parts,
                PlacedBody {
                    body,
                    _place: Some(place),
                },
            ))
        })
    }
}

/// A response body holding its call's place until it is dropped.
#[derive(Debug)]
pub(crate) struct PlacedBody {
    body: tonic::body::Body,
    /// Held only to be dropped with the body.
    _place: Option<Place>,
}

impl Body for PlacedBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
