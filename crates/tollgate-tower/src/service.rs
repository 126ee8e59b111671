//! The service: decide first, then either answer (429 / 503) or call the inner service and
//! add the `RateLimit` headers to its response.

use crate::response::{add_headers, bad_request, too_many_requests, unauthorized, unavailable};
use crate::settle::{Pending, Settling};
use crate::shared::Shared;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tollgate::Action;
use tower_service::Service;

/// The response body: the inner service's (settling the request's reservation when it
/// ends, see [`Settling`]), or the layer's own 429 / 503 body.
pub type RateLimitBody<B> = Either<Settling<B>, Full<Bytes>>;

/// The boxed response future.
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send>>;

/// Rate-limits requests to `S`. Built by [`crate::RateLimitLayer`].
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: http_body::Body + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    /// Always ready: readiness of the inner service is awaited in `call`, after the
    /// decision, so a limited request never waits for capacity it will not use.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let peer = (self.shared.peer)(req.extensions());
        let target = match self.shared.resolve(
            req.method(),
            req.uri(),
            req.headers(),
            peer,
            req.extensions().get::<crate::TrustedPeer>(),
        ) {
            Ok(t) => t,
            Err(e) => return Box::pin(async move { Ok(bad_request(&e).map(Either::Right)) }),
        };
        if let Err(e) = self.shared.check_costs(&target, req.headers()) {
            return Box::pin(async move { Ok(bad_request(&e).map(Either::Right)) });
        }
        let shared = self.shared.clone();
        if let Some(result) = self
            .shared
            .denied_before_token(&target, req.headers(), peer)
        {
            if let Action::Limit { retry_after } = result.action {
                return Box::pin(async move {
                    Ok(too_many_requests(&result, retry_after).map(Either::Right))
                });
            }
        }
        let plan = match self.shared.plan(&target, req.headers(), peer) {
            Ok(plan) => plan,
            Err(u) => {
                return Box::pin(async move {
                    // The policies that can count it without the token charge it: a flood of
                    // forged tokens is limited (429) like any other traffic, else it is 401.
                    if let Some(rest) = &u.rest {
                        let result = shared.check(rest, req.headers()).await;
                        if let Action::Limit { retry_after } = result.action {
                            return Ok(too_many_requests(&result, retry_after).map(Either::Right));
                        }
                    }
                    Ok(unauthorized(&u.why).map(Either::Right))
                });
            }
        };
        Box::pin(async move {
            let Some(plan) = plan else {
                std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                return Ok(inner
                    .call(req)
                    .await?
                    .map(|b| Either::Left(Settling::plain(b))));
            };
            let (result, reservation) = if Shared::reserves(&plan) {
                shared.reserve(&plan, req.headers()).await
            } else {
                (shared.check(&plan, req.headers()).await, None)
            };
            match result.action {
                Action::Allow => {
                    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                    // (An inner error drops the reservation: estimates stand, holds go.)
                    let mut resp = inner.call(req).await?;
                    add_headers(resp.headers_mut(), &result);
                    let reservation = reservation.filter(|r| !r.is_empty());
                    Ok(match reservation {
                        None => resp.map(|b| Either::Left(Settling::plain(b))),
                        Some(reservation) => {
                            let head = settle_head(resp.headers(), &reservation, &shared);
                            let names = std::sync::Arc::clone(&shared.settle_headers);
                            resp.map(|b| {
                                Either::Left(Settling::with_pending(
                                    b,
                                    Box::new(Pending {
                                        reservation,
                                        head,
                                        names,
                                    }),
                                ))
                            })
                        }
                    })
                }
                Action::Limit { retry_after } => {
                    Ok(too_many_requests(&result, retry_after).map(Either::Right))
                }
                Action::Unavailable { retry_after } => {
                    Ok(unavailable(&result, retry_after).map(Either::Right))
                }
            }
        })
    }
}

/// The response head's real-cost headers (only those: the rest of the head is not kept).
fn settle_head(
    headers: &http::HeaderMap,
    reservation: &tollgate::Reservation,
    shared: &Shared,
) -> http::HeaderMap {
    let mut out = http::HeaderMap::new();
    let names = reservation
        .policies()
        .filter_map(|p| shared.settle_headers.get(&p.id()));
    for name in names {
        if out.contains_key(name) {
            continue;
        }
        for v in headers.get_all(name) {
            out.append(name.clone(), v.clone());
        }
    }
    out
}
