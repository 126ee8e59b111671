//! What the gateway's HTTP/1 server asks of the service it serves ([`GatewayService`]), for
//! requests read by hyper and for those read without it (`plain.rs`).

use crate::http::util::{Answer, BoxBody, ConnBody};
use http::Request;
use http_body_util::{BodyExt, Either};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::future::Future;
use tollgate_tower::TrustedPeer;
use tower_service::Service;

/// The rate-limited service the gateway runs for every request: cloned per connection and
/// per request, its futures sent to the runtime.
pub(crate) trait GatewayService:
    Clone
    + Send
    + 'static
    + Service<Request<Incoming>, Response = Answer, Error = Infallible, Future: Send + 'static>
{
    /// Calls the service for a request from `peer` (the connection's, as it was decided when
    /// the connection was accepted). The service hands `peer` on beside the request, to the
    /// layer and to the proxy (see `tollgate_tower::CallFrom`), rather than in the request's
    /// extensions: that saves the extensions' map and two allocations a request.
    fn call_from(&mut self, req: Request<Incoming>, peer: &TrustedPeer) -> Self::Future;

    /// Whether the service answers requests itself (decision mode) rather than forwarding
    /// them: its answers are small, so a connection accepted now writes each in one buffer
    /// (see `server.rs`, `builder`).
    fn answers_itself(&self) -> bool;

    /// A decision made from a request's head alone (see [`GatewayService::decide_head`]).
    type Decision: Future<Output: Send> + Send + Unpin;

    /// Decides a request that has no body from its head alone, as [`call_from`] answers it
    /// in decision mode (see `plain.rs`), holding nothing of `req` once it returns; `None`
    /// when the service does not answer requests itself now (a reload switched to proxy
    /// mode), the request unanswered.
    ///
    /// [`call_from`]: GatewayService::call_from
    fn decide_head(&mut self, req: &Request<()>, peer: &TrustedPeer) -> Option<Self::Decision>;

    /// The answer to `decided`: written whole at the end of `out` (its status returned) when
    /// it is decision mode's common 200 and the connection stays open (not `closing`), else
    /// the answer to write.
    fn write_answer(
        decided: <Self::Decision as Future>::Output,
        out: &mut Vec<u8>,
        closing: bool,
    ) -> Written;
}

/// How [`GatewayService::write_answer`] answered.
pub(crate) enum Written {
    /// Written whole, with this status.
    Whole(u16),
    /// Not written: this answer is to be.
    Answer(Answer),
}

/// One body type for the connection: the layer's own bodies as they are, others boxed.
pub(crate) fn unify(body: tollgate_tower::RateLimitBody<BoxBody>) -> ConnBody {
    match body {
        // Boxed again only when it settles a reservation at its end (costs known later).
        Either::Left(b) => ConnBody::Boxed(match b.into_plain() {
            Ok(plain) => plain,
            Err(settling) => settling.boxed(),
        }),
        Either::Right(full) => ConnBody::Own(full),
    }
}
