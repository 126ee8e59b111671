//! The service: decide first, then either answer (429 / 503) or call the inner service and
//! add the `RateLimit` headers to its response.

use crate::response::{add_headers, bad_request, too_many_requests, unauthorized, unavailable};
use crate::settle::{Pending, Settling};
use crate::shared::{Shared, Unverified};
use crate::TrustedPeer;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tollgate::{Action, Plan};
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
        self.call_given(req, None, |inner, req| inner.call(req))
    }
}

/// A service that can be told a request's peer apart from the request: the server that
/// accepted the connection gives it, where [`Service::call`] reads it in the request's
/// extensions (see [`RateLimit::call_from`]).
pub trait CallFrom<Req>: Service<Req> {
    /// Calls the service for `req` from `peer`, answering as [`Service::call`] does for the
    /// same request with `peer` as its [`TrustedPeer`] extension.
    fn call_from(&mut self, req: Req, peer: &TrustedPeer) -> Self::Future;
}

impl<S> RateLimit<S> {
    /// [`Service::call`] for a request from `peer`, given apart from the request and handed
    /// on to the inner service the same way ([`CallFrom`]). A server that knows each
    /// connection's peer saves putting it in every request's extensions: a map and two
    /// allocations a request, and the lookups that read it back. The answer is the one
    /// `call` gives with `peer` as the request's [`TrustedPeer`] extension; the peer's
    /// address is `peer`'s when it carries one ([`TrustedPeer::with_addr`]), else what the
    /// layer reads from the extensions.
    pub fn call_from<ReqBody, ResBody>(
        &mut self,
        req: Request<ReqBody>,
        peer: &TrustedPeer,
    ) -> ResponseFuture<ResBody, S::Error>
    where
        S: CallFrom<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        ReqBody: Send + 'static,
        ResBody: http_body::Body + 'static,
    {
        let owned = peer.clone();
        self.call_given(req, Some(peer), move |inner, req| {
            inner.call_from(req, &owned)
        })
    }

    /// What `call` and `call_from` do: decide (with the peer `given`, else the one the
    /// extensions name), then answer, or call the inner service with `call_inner` once it
    /// is ready.
    fn call_given<ReqBody, ResBody, F>(
        &mut self,
        req: Request<ReqBody>,
        given: Option<&TrustedPeer>,
        call_inner: F,
    ) -> ResponseFuture<ResBody, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        ReqBody: Send + 'static,
        ResBody: http_body::Body + 'static,
        F: FnOnce(&mut S, Request<ReqBody>) -> S::Future + Send + 'static,
    {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = &self.shared;
        match shared.prepare(&req, given) {
            Prepared::Answer(resp) => Box::pin(async move { Ok(resp.map(Either::Right)) }),
            Prepared::Denied(result, retry_after) => {
                let resp = too_many_requests(&result, retry_after);
                Box::pin(async move { Ok(resp.map(Either::Right)) })
            }
            Prepared::Unmatched => Box::pin(async move {
                std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                Ok(call_inner(&mut inner, req)
                    .await?
                    .map(|b| Either::Left(Settling::plain(b))))
            }),
            Prepared::Unverified(u, span) => {
                drop(req);
                let shared = Arc::clone(shared);
                Box::pin(async move { Ok(shared.unverified(u, span).await.map(Either::Right)) })
            }
            Prepared::Plan(plan, span) => {
                // On the in-process store the decision is made here, and the future boxed is
                // the answer's alone: one that could also wait for a store holds that wait's
                // state (a Redis call's), and boxing a future copies all of it (callgrind:
                // about 120 instructions a proxied request fewer, most of them the
                // allocator's, for a smaller block).
                let reserves = Shared::reserves(&plan);
                let decided_now = (!reserves)
                    .then(|| shared.check_now(&plan, &span))
                    .flatten();
                if let Some(result) = decided_now {
                    return match shared.decided(result, None) {
                        Err(resp) => Box::pin(async move { Ok(resp.map(Either::Right)) }),
                        Ok(allowed) => Box::pin(pass(inner, call_inner, req, allowed)),
                    };
                }
                let shared = Arc::clone(shared);
                Box::pin(async move {
                    let (result, reservation) = shared.decide(&plan, reserves, span).await;
                    match shared.decided(result, reservation) {
                        Err(resp) => Ok(resp.map(Either::Right)),
                        // Not `pass(..).await`: its future would hold the request a second
                        // time beside this one's (a future keeps its arguments whole).
                        Ok(allowed) => {
                            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                            let resp = call_inner(&mut inner, req).await?;
                            Ok(allowed.respond(resp))
                        }
                    }
                })
            }
        }
    }
}

/// An allowed request passed to the inner service (`call_inner` once it is ready), its
/// answer finished by `allowed` (an inner error drops the reservation: estimates stand, holds
/// go).
async fn pass<S, ReqBody, ResBody, F>(
    mut inner: S,
    call_inner: F,
    req: Request<ReqBody>,
    allowed: Allowed,
) -> Result<Response<RateLimitBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: http_body::Body,
    F: FnOnce(&mut S, Request<ReqBody>) -> S::Future,
{
    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
    let resp = call_inner(&mut inner, req).await?;
    Ok(allowed.respond(resp))
}

impl<S> RateLimit<S> {
    /// Decides `req` exactly as [`Service::call`] does, without calling the inner service:
    /// for a front end that answers allowed requests itself (the gateway's decision mode, a
    /// forward-auth endpoint). Everything the decision reads is read before this returns, and
    /// the request is dropped then: a server's read buffer is free for the next request at
    /// once, where a future holding the request would make it allocate another.
    pub fn decide<B>(&self, req: Request<B>) -> DecideFuture {
        self.decide_with(&req, None, false)
    }

    /// [`RateLimit::decide`] for a request from `peer`, as the server that accepted its
    /// connection decided it, given here instead of in the request's extensions (a server
    /// that answers the request itself saves putting it there: a map and two allocations a
    /// request). The answer is the one `decide` gives with `peer` as the request's
    /// [`TrustedPeer`] extension; the peer's address is `peer`'s when it carries one
    /// ([`TrustedPeer::with_addr`]), else what the layer reads from the extensions.
    pub fn decide_from<B>(&self, req: Request<B>, peer: &TrustedPeer) -> DecideFuture {
        self.decide_with(&req, Some(peer), false)
    }

    /// [`RateLimit::decide_from`] for a request the caller keeps: the decision reads all it
    /// needs before this returns and holds nothing of `req`, so a server may reuse the
    /// request's header map for its next request (no map allocated and dropped a request).
    /// A request its policies refuse is [`Decided::Limited`], for the caller to answer (its
    /// 429 made only if asked for), where the others answer [`Decided::Answered`].
    pub fn decide_head<B>(&self, req: &Request<B>, peer: &TrustedPeer) -> DecideFuture {
        self.decide_with(req, Some(peer), true)
    }

    /// `limited`: a plan's refusal is [`Decided::Limited`] (else its 429, answered).
    fn decide_with<B>(
        &self,
        req: &Request<B>,
        given: Option<&TrustedPeer>,
        limited: bool,
    ) -> DecideFuture {
        // The shared state is cloned (a locked instruction, and another to drop it) only for
        // a decision that waits, whose future owns it.
        let shared = &self.shared;
        match shared.prepare(req, given) {
            Prepared::Answer(resp) => DecideFuture::ready(Decided::Answered(Box::new(resp))),
            Prepared::Denied(result, retry_after) if limited => {
                DecideFuture::ready(Decided::Limited(Limited {
                    result,
                    retry_after,
                }))
            }
            Prepared::Denied(result, retry_after) => DecideFuture::ready(Decided::Answered(
                Box::new(too_many_requests(&result, retry_after)),
            )),
            Prepared::Unmatched => DecideFuture::ready(Decided::Unmatched),
            Prepared::Unverified(u, span) => {
                let shared = Arc::clone(shared);
                DecideFuture::waiting(async move {
                    Decided::Answered(Box::new(shared.unverified(u, span).await))
                })
            }
            Prepared::Plan(plan, span) => {
                if Shared::reserves(&plan) {
                    let shared = Arc::clone(shared);
                    return DecideFuture::waiting(async move {
                        let (result, reservation) = shared.reserve_in(&plan, span).await;
                        into_decided(&shared, result, reservation, limited)
                    });
                }
                // On the in-process store the decision is made here: no future to box.
                if let Some(result) = shared.check_now(&plan, &span) {
                    return DecideFuture::ready(into_decided(shared, result, None, limited));
                }
                let shared = Arc::clone(shared);
                // A span not recorded (decision spans are TRACE) is neither entered on every
                // poll nor given a wrapper around the check's future (nor is the decision
                // recorded in it: `record_decision` skips it); the common case, one level of
                // future fewer per request.
                DecideFuture::waiting(async move {
                    let result = if span.is_disabled() {
                        shared.limiter.check(&plan).await
                    } else {
                        shared.check_in(&plan, span).await
                    };
                    into_decided(&shared, result, None, limited)
                })
            }
        }
    }
}

/// [`Shared::decided`] as [`RateLimit::decide`] tells it; a refusal left to the caller
/// ([`Decided::Limited`]) when `limited`.
fn into_decided(
    shared: &Arc<Shared>,
    result: tollgate::LimitResult,
    reservation: Option<tollgate::Reservation>,
    limited: bool,
) -> Decided {
    if let (true, Action::Limit { retry_after }) = (limited, result.action) {
        return Decided::Limited(Limited {
            result,
            retry_after,
        });
    }
    match shared.decided(result, reservation) {
        Ok(allowed) => Decided::Allowed(allowed),
        Err(resp) => Decided::Answered(resp),
    }
}

/// The future of [`RateLimit::decide`]: ready at once where the decision waited for nothing
/// (the in-process store, a request refused or matched by no policy), else a boxed future.
pub struct DecideFuture(Decide);

enum Decide {
    Ready(Option<Decided>),
    Waiting(Pin<Box<dyn Future<Output = Decided> + Send>>),
}

impl DecideFuture {
    fn ready(decided: Decided) -> Self {
        Self(Decide::Ready(Some(decided)))
    }

    fn waiting(decide: impl Future<Output = Decided> + Send + 'static) -> Self {
        Self(Decide::Waiting(Box::pin(decide)))
    }
}

impl Future for DecideFuture {
    type Output = Decided;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Decided> {
        match &mut self.get_mut().0 {
            Decide::Waiting(decide) => decide.as_mut().poll(cx),
            Decide::Ready(decided) => match decided.take() {
                Some(d) => std::task::Poll::Ready(d),
                // Polled again after it answered: a caller's bug, never an answer twice.
                None => std::task::Poll::Pending,
            },
        }
    }
}

/// What [`RateLimit::decide`] found.
pub enum Decided {
    /// No policy matched: the request passes, and its response gets no rate-limit headers.
    Unmatched,
    /// The request may pass: answer it, then let [`Allowed::respond`] finish the answer.
    Allowed(Allowed),
    /// The layer answers the request itself: 400, 401, 429 or 503. Boxed: a response is
    /// larger than every other outcome, and a decision is moved a few times on its way to the
    /// answer (unboxed, each move was a `memcpy` call of 144 bytes on every request).
    Answered(Box<Response<Full<Bytes>>>),
    /// The request's policies refuse it (a plan's decision, or a forged-token flood denied
    /// before its token is checked): its 429 is the caller's to write
    /// ([`Limited::into_response`], or [`Limited::write_http1`]). Only
    /// [`RateLimit::decide_head`] decides this; the others answer the 429
    /// ([`Decided::Answered`]).
    Limited(Limited),
}

/// A request its policies refuse (see [`Decided::Limited`]).
pub struct Limited {
    result: tollgate::LimitResult,
    retry_after: Option<std::time::Duration>,
}

impl Limited {
    /// The decision.
    pub fn result(&self) -> &tollgate::LimitResult {
        &self.result
    }

    /// The 429, as [`Decided::Answered`] carries it.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        too_many_requests(&self.result, self.retry_after)
    }

    /// [`Limited::into_response`]'s answer written whole at the end of `out` as an HTTP/1.1
    /// server writes it on a connection that stays open: the status line, its headers in
    /// order, `content-length`, the `date` line that `date` writes (its name, value and line
    /// end), the blank line and the body; no map made and nothing boxed. Only for the 429 of
    /// one advertised and violated policy with a retry time (the common one); otherwise
    /// false, `out` as it was.
    pub fn write_http1(&self, out: &mut Vec<u8>, date: impl FnOnce(&mut Vec<u8>)) -> bool {
        match self.retry_after {
            Some(wait) => crate::response::write_429(&self.result, wait, out, date),
            None => false,
        }
    }
}

/// An allowed request, waiting for its response.
pub struct Allowed {
    result: tollgate::LimitResult,
    /// A reservation to settle when the answer ends (never an empty one, which holds nothing
    /// and is dropped at once), with the shared state that reads the real cost from the
    /// answer: held only then, as a clone of the shared state is two locked instructions a
    /// request (taken and dropped).
    settle: Option<(tollgate::Reservation, Arc<Shared>)>,
}

impl Allowed {
    /// The decision.
    pub fn result(&self) -> &tollgate::LimitResult {
        &self.result
    }

    /// The decision, when the answer has nothing to settle at its end (no reservation is
    /// held): the caller writes the `RateLimit` headers itself ([`crate::response`]). Else
    /// the request back, for [`Allowed::respond`].
    pub fn into_result(self) -> Result<tollgate::LimitResult, Allowed> {
        if self.settle.is_some() {
            return Err(self);
        }
        Ok(self.result)
    }

    /// `resp` with the `RateLimit` headers, its body settling the request's reservation (if
    /// any) when it ends.
    pub fn respond<B: http_body::Body>(self, mut resp: Response<B>) -> Response<RateLimitBody<B>> {
        add_headers(resp.headers_mut(), &self.result);
        match self.settle {
            None => resp.map(|b| Either::Left(Settling::plain(b))),
            Some((reservation, shared)) => {
                let head = settle_head(resp.headers(), &reservation, &shared);
                let names = Arc::clone(&shared.settle_headers);
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
        }
    }
}

/// What a request is before the limiter decides it: read whole from the request, which is
/// not needed afterwards.
enum Prepared {
    /// Refused (400).
    Answer(Response<Full<Bytes>>),
    /// Denied before its token was checked (429): the decision, and how long to wait.
    Denied(tollgate::LimitResult, Option<std::time::Duration>),
    /// No policy matched.
    Unmatched,
    /// A token that does not verify.
    Unverified(Box<Unverified>, tracing::Span),
    /// The plan to decide, in its span.
    Plan(Plan, tracing::Span),
}

impl Shared {
    /// `given`: the peer as the server decided it, when it is given apart from the request
    /// (see [`RateLimit::decide_from`]); else the request's extensions say.
    fn prepare<B>(&self, req: &Request<B>, given: Option<&TrustedPeer>) -> Prepared {
        let peer = match given.and_then(TrustedPeer::addr) {
            Some(addr) => Some(addr.ip()),
            None => (self.peer)(req.extensions()),
        };
        let decided = given.or_else(|| req.extensions().get::<TrustedPeer>());
        let target = match self.resolve(req.method(), req.uri(), req.headers(), peer, decided) {
            Ok(t) => t,
            Err(e) => return Prepared::Answer(bad_request(&e)),
        };
        if let Err(e) = self.check_costs(&target, req.headers()) {
            return Prepared::Answer(bad_request(&e));
        }
        if let Some(result) = self.denied_before_token(&target, req.headers(), peer) {
            if let Action::Limit { retry_after } = result.action {
                return Prepared::Denied(result, retry_after);
            }
        }
        match self.plan(&target, req.headers(), peer) {
            Ok(Some(plan)) => Prepared::Plan(plan, Shared::span(req.headers())),
            Ok(None) => Prepared::Unmatched,
            Err(u) => Prepared::Unverified(u, Shared::span(req.headers())),
        }
    }

    /// A request whose token does not verify: the policies that can count it without the
    /// token charge it, so a flood of forged tokens is limited (429) like any other traffic;
    /// else it is 401.
    async fn unverified(&self, u: Box<Unverified>, span: tracing::Span) -> Response<Full<Bytes>> {
        if let Some(rest) = &u.rest {
            let result = self.check_in(rest, span).await;
            if let Action::Limit { retry_after } = result.action {
                return too_many_requests(&result, retry_after);
            }
        }
        unauthorized(&u.why)
    }

    /// Decides `plan`, reserving when a policy settles or holds (`reserves`, as
    /// [`Shared::reserves`] found it for this plan): allowed, or the layer's own answer (429,
    /// 503).
    async fn decide(
        &self,
        plan: &Plan,
        reserves: bool,
        span: tracing::Span,
    ) -> (tollgate::LimitResult, Option<tollgate::Reservation>) {
        if reserves {
            // Boxed: a reservation's future is large, and every decision's future would
            // otherwise carry its size (and move it, with the box around it, a request).
            Box::pin(self.reserve_in(plan, span)).await
        } else if span.is_disabled() {
            // As in `decide_with`: a span not recorded (decision spans are TRACE) gets no
            // wrapper around the check's future, which is then one level smaller and is not
            // entered on every poll.
            (self.limiter.check(plan).await, None)
        } else {
            (self.check_in(plan, span).await, None)
        }
    }

    /// What a decision makes of the request: allowed, or its 429 or 503 (boxed: an answer
    /// is large, and only a refused request pays for the box).
    fn decided(
        self: &Arc<Self>,
        result: tollgate::LimitResult,
        reservation: Option<tollgate::Reservation>,
    ) -> Result<Allowed, Box<Response<Full<Bytes>>>> {
        match result.action {
            Action::Allow => Ok(Allowed {
                result,
                settle: reservation
                    .filter(|r| !r.is_empty())
                    .map(|r| (r, Arc::clone(self))),
            }),
            Action::Limit { retry_after } => Err(Box::new(too_many_requests(&result, retry_after))),
            Action::Unavailable { retry_after } => Err(Box::new(unavailable(&result, retry_after))),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A decision is moved several times between the layer and the answer (the gateway's
    /// plain loop moves it four times). Unboxed, a response in `Answered` made it 144 bytes
    /// and each move a call to `memcpy`; at 88 bytes those calls are gone (callgrind,
    /// docs/benchmarks.md). 128 is the bound held here: a decision grown back past it is
    /// to be measured again.
    #[test]
    fn a_decision_is_small_enough_to_move_inline() {
        assert!(std::mem::size_of::<Decided>() <= 128);
        assert!(std::mem::size_of::<DecideFuture>() <= 128);
    }
}
