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
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tonic::transport::server::TcpConnectInfo;

/// The most calls in progress from one address, over all its connections.
pub const MAX_CALLS_PER_ADDRESS: usize = 1024;
/// The most calls in progress on one listener.
pub const MAX_CALLS: usize = 16_384;

/// The bounds and what each address holds now.
#[derive(Debug)]
pub(crate) struct Budget {
    per_address: usize,
    total: usize,
    reserve: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// One call's place; dropping it frees the place.
#[derive(Debug)]
pub(crate) struct Place {
    budget: Arc<Budget>,
    address: Option<IpAddr>,
}

impl Budget {
    pub(crate) fn new(per_address: usize, total: usize) -> Arc<Self> {
        let total = total.max(1);
        Arc::new(Self {
            per_address: per_address.max(1),
            total,
            reserve: total / 8,
            held: Mutex::new(Held::default()),
        })
    }

    /// A place for a call from `address` (`None`: the peer's address is unknown, counted in
    /// the listener's bound only), or `None` past a bound.
    pub(crate) fn take(self: &Arc<Self>, address: Option<IpAddr>) -> Option<Place> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.total >= self.total {
            return None;
        }
        let in_reserve = held.total >= self.total - self.reserve;
        if let Some(ip) = address {
            let n = held.per_address.entry(ip).or_insert(0);
            if *n >= self.per_address || (in_reserve && *n > 0) {
                if *n == 0 {
                    held.per_address.remove(&ip);
                }
                return None;
            }
            *n += 1;
        }
        held.total += 1;
        Some(Place {
            budget: self.clone(),
            address,
        })
    }

    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        (held.total, held.per_address.len())
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.budget.held.lock().unwrap_or_else(|e| e.into_inner());
        held.total = held.total.saturating_sub(1);
        if let Some(ip) = self.address {
            if let Some(n) = held.per_address.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    held.per_address.remove(&ip);
                }
            }
        }
    }
}

/// The tower layer that makes every call take a place in a [`Budget`].
#[derive(Clone, Debug)]
pub(crate) struct BudgetLayer {
    budget: Arc<Budget>,
}

impl BudgetLayer {
    pub(crate) fn new(budget: Arc<Budget>) -> Self {
        Self { budget }
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
    budget: Arc<Budget>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_per_address_and_in_all_with_a_reserve_and_freed_on_drop() {
        let budget = Budget::new(3, 16);
        let a: IpAddr = "192.0.2.1".parse().expect("ip");
        let b: IpAddr = "192.0.2.2".parse().expect("ip");
        let a_places: Vec<_> = (0..3).filter_map(|_| budget.take(Some(a))).collect();
        assert_eq!(a_places.len(), 3);
        assert!(budget.take(Some(a)).is_none(), "a fourth from one address");
        let b1 = budget.take(Some(b)).expect("another address");
        assert_eq!(budget.held(), (4, 2));
        drop(a_places);
        assert!(budget.take(Some(a)).is_some(), "freed when dropped");
        drop(b1);
        assert_eq!(budget.held(), (0, 0), "nothing left behind");

        // Fill to the reserve (16 - 16/8 = 14) from many addresses holding 1 or 2.
        let mut kept = Vec::new();
        for i in 0..7u8 {
            let ip = IpAddr::from([198, 51, 100, i]);
            kept.push(budget.take(Some(ip)).expect("first"));
            kept.push(budget.take(Some(ip)).expect("second"));
        }
        let holder = IpAddr::from([198, 51, 100, 0]);
        assert!(
            budget.take(Some(holder)).is_none(),
            "in the reserve, an address holding places gets no more"
        );
        let newcomer = IpAddr::from([203, 0, 113, 9]);
        kept.push(budget.take(Some(newcomer)).expect("reserve for a newcomer"));
        kept.push(
            budget
                .take(None)
                .expect("unknown peer, listener bound only"),
        );
        assert!(budget.take(None).is_none(), "the listener's bound holds");
    }
}
